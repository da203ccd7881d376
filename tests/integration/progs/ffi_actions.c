/* Declarative hooks whose actions communicate (policies/ffi_actions.conf): fa_reduce's vector is
 * summed over ranks before the call, fa_total's counts take their maximum, and fa_meet is a
 * barrier that ranks other than 0 reach STALL seconds late, so that rank 0 waits there for them.
 * Between the reductions and the barrier the program goes on with work of its own on the stack
 * the hooks' actions ran on, as any program does.
 *   ffi_actions STALL */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void fa_reduce(double *v, size_t n);
int64_t fa_total(int64_t *count, size_t n);
void fa_meet(void);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v ? atoi(v) : fallback;
}

static __attribute__((noinline)) unsigned other_work(void)
{
    volatile char scratch[64 << 10];
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof scratch; i++)
        scratch[i] = (char)('a' + i % 26), sum += (unsigned)scratch[i];
    return sum;
}

int main(int argc, char **argv)
{
    double stall = argc > 1 ? atof(argv[1]) : 0;
    int rank = env_int("OMPI_COMM_WORLD_RANK", 0), size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    int checks = 0, wrong = 0;
    for (int k = 1; k <= 3; k++, checks += 2) {
        double v[2] = {rank + 1, (double)k * (rank + 1)};
        fa_reduce(v, 2);
        /* the sum over ranks of rank + 1, then doubled by fa_reduce itself */
        double want = (double)size * (size + 1);
        wrong += v[0] != want || v[1] != k * want;
        int64_t count[1] = {rank + k};
        wrong += fa_total(count, 1) != size - 1 + k;
    }
    printf("rank %d: reduce: %d checks, %d wrong (work %u)\n", rank, checks, wrong, other_work());
    fflush(stdout);
    if (rank != 0) {
        struct timespec ts = {(time_t)stall, (long)((stall - (double)(time_t)stall) * 1e9)};
        nanosleep(&ts, NULL);
    }
    double t0 = now();
    fa_meet();
    if (rank == 0) printf("rank 0: waited %.2f s in fa_meet\n", now() - t0);
    return wrong ? 1 : 0;
}
