/* The cost of a declarative hook without actions: ft_2 (libffi_targets.so) called through the
 * program's GOT, which dpshim points at its libffi closure, against the same function called
 * through a pointer from dlsym, in one run. Run under the shim with
 * tests/bench/bench_ffi.conf (./dev.sh bench does). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

double ft_2(double a, int64_t b);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    double (*direct)(double, int64_t) = (double (*)(double, int64_t))dlsym(RTLD_DEFAULT, "ft_2");
    enum { CALLS = 2000000, ROUNDS = 7 };
    double hooked[ROUNDS], plain[ROUNDS], sink = 0;
    for (int r = 0; r < ROUNDS; r++) {
        double t = now();
        for (int i = 0; i < CALLS; i++)
            sink += ft_2(sink * 1e-9, i);
        hooked[r] = (now() - t) / CALLS * 1e9;
        t = now();
        for (int i = 0; i < CALLS; i++)
            sink += direct(sink * 1e-9, i);
        plain[r] = (now() - t) / CALLS * 1e9;
    }
    qsort(hooked, ROUNDS, sizeof *hooked, cmp);
    qsort(plain, ROUNDS, sizeof *plain, cmp);
    printf("hooked call without actions %.1f ns, direct call %.1f ns: %.1f ns added per call, ratio %.2f "
           "(median of %d alternating rounds of %d calls; checksum %g)\n",
           hooked[ROUNDS / 2], plain[ROUNDS / 2], hooked[ROUNDS / 2] - plain[ROUNDS / 2],
           hooked[ROUNDS / 2] / plain[ROUNDS / 2], ROUNDS, CALLS, sink);
    return 0;
}
