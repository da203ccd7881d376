/* All-reduce through the shim's path (dp_grads, [comm] reduce = sum) against the backend
 * called directly (one MPI_Allreduce per buffer), side by side in one run, with a bitwise check
 * that both gave the same sums (integer-valued floats, so any summation order is exact).
 *   mpirun -np N env DPSHIM_COMM_REDUCE=sum LD_PRELOAD=libdpshim.so bench_allreduce [MiB]
 * Prints time, algbw and busbw (nccl-tests definitions: algbw = bytes / time, busbw = algbw *
 * 2(n-1)/n) and, for reference, this machine's single-core memcpy bandwidth. */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

static void fill(float *b, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) b[i] = (float)((i + (size_t)rank) % 7);
}

int main(int argc, char **argv)
{
    int provided, rank, size; /* as the shim itself would: the guard needs MPI_THREAD_MULTIPLE */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!dp_grads) {
        if (!rank) fprintf(stderr, "bench_allreduce: run it with LD_PRELOAD=libdpshim.so\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64, n = (mib << 20) / sizeof(float);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *src = malloc(n * sizeof *src);
    fill(src, n, rank);
    dp_tensor t = {b, n, DP_F32, DP_HOST, "bench"};
    memcpy(b, src, n * sizeof *b);
    dp_grads(&t, 1); /* first use: opens the backend and measures the piece size */
    double plain = 1e30, shim = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        memcpy(a, src, n * sizeof *a);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t1 = MPI_Wtime() - t0;
        memcpy(b, src, n * sizeof *b);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        dp_grads(&t, 1);
        double t2 = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t1, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &t2, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (t1 < plain) plain = t1;
        if (t2 < shim) shim = t2;
    }
    int same = memcmp(a, b, n * sizeof *a) == 0, all_same;
    MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    double mc = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = MPI_Wtime();
        memcpy(a, src, n * sizeof *a);
        t0 = MPI_Wtime() - t0;
        if (t0 < mc) mc = t0;
    }
    if (!rank) {
        double bytes = (double)n * sizeof(float), f = 2.0 * (size - 1) / size;
        printf("%zu MiB all-reduce, np=%d, best of 5:\n", mib, size);
        printf("  plain MPI_Allreduce  %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n", plain * 1e3, bytes / plain / 1e9,
               f * bytes / plain / 1e9);
        printf("  dpshim dp_grads      %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n", shim * 1e3, bytes / shim / 1e9,
               f * bytes / shim / 1e9);
        printf("  speedup plain/shim   %8.2f x   results bitwise equal: %s\n", plain / shim, all_same ? "yes" : "NO");
        printf("  memcpy, one core     %8.2f GB/s  (shim busbw is %.0f%% of it)\n", bytes / mc / 1e9,
               100 * (f * bytes / shim) / (bytes / mc));
    }
    free(a), free(b), free(src);
    MPI_Finalize();
    return all_same ? 0 : 1;
}
