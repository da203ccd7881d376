/* A rank that waits for a late peer in the small sums (the shared-memory path): rank 1 sleeps
 * 100 ms before each of its sums; rank 0 prints how much of its wait was spent on a core.
 * Checks the sums too. Prints `waited W s, on a core C s` on rank 0 and `sums ok` or a failure. */
#define _GNU_SOURCE
#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int main(void)
{
    if (!dp_metric) {
        fprintf(stderr, "late_peer: run under LD_PRELOAD=libdpshim.so\n");
        return 2;
    }
    int rank = dp_rank(), size = dp_world_size(), bad = 0;
    double v[8] = {0};
    dp_metric(v, 8, DP_SUM); /* connected before the timing */
    double w0 = wall_s(), c0 = cpu_s();
    for (int i = 0; i < 10; i++) {
        if (rank == 1) nanosleep(&(struct timespec){0, 100000000}, NULL);
        for (int k = 0; k < 8; k++)
            v[k] = rank + k + i;
        if (dp_metric(v, 8, DP_SUM) != 0) bad++;
        for (int k = 0; k < 8; k++)
            bad += v[k] != size * (k + i) + size * (size - 1) / 2.0;
    }
    if (rank == 0) printf("waited %.3f s, on a core %.3f s\n", wall_s() - w0, cpu_s() - c0);
    printf("rank %d: %s\n", rank, bad ? "sums WRONG" : "sums ok");
    return bad != 0;
}
