/* dpshim-bench (also `dpshim-diag bench`): all-reduce through the shim's path (dp_grads, as the
 * policy says: by default the average) against the backend called directly (one MPI_Allreduce per
 * buffer), side by side in one run, alternating, with a bitwise check of every result: the plain
 * sums, weighted as the shim weights them (integer-valued floats, so any summation order is exact).
 *   mpirun -np N env LD_PRELOAD=libdpshim.so dpshim-bench [--init WORLD] [SET]
 * WORLD: who initializes MPI, as in the programs users run: `program` (MPI_Init, as an MPI program
 * does: MPI_THREAD_SINGLE), `program-mt` (MPI_Init_thread with MPI_THREAD_MULTIPLE), `shim` (the
 * default: the program never calls MPI, the shim initializes it at the first hook). The same code
 * runs inside a Python process with torch loaded (libdpshim-bench.so, tools/bench_torch.py), where
 * the shim has initialized MPI before.
 * SET: sweep (default: one buffer of 4 B, 16 B, ... 256 MiB), a size in MiB (one buffer),
 * resnet50 (its 161 parameter tensors, 25.6M floats), small (161 tensors of 1 KiB), or overlap:
 * ResNet-50's tensors announced one by one by a simulated backward pass (last layer first;
 * per tensor a sleep in proportion to its size, as a CPU waiting for GPU kernels, in all as long
 * as their synchronous reduction), once with dp_grad_ready per tensor (the reduction overlaps;
 * needs [comm] overlap = on) and once with dp_grads at the end only.
 * gpu[:MiB]: a buffer in GPU memory (bench_gpu.c): pinned vs pageable copies, and dp_grads on it
 * against the host path, staging by hand and NCCL called directly; gpu-sweep[:MiB,...]: dp_grads
 * on device buffers of 1 to 256 MiB against NCCL called directly; gpu-overlap: the overlap set
 * with its tensors in GPU memory.
 * Prints time, algbw and busbw (nccl-tests definitions: algbw = bytes / time, busbw = algbw *
 * 2(n-1)/n) and, for reference, this machine's single-core memcpy bandwidth. */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

#include "bench.h"

/* the shim's policy lookup (libdpshim.so); absent without the shim */
extern const char *dpshim_policy_value(const char *section, const char *key) __attribute__((weak));

static void fill(float *b, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (float)((i + (size_t)rank) % 7);
}

/* ResNet-50's parameter tensors (torchvision layout): conv1 and its BatchNorm, four stages of
 * bottleneck blocks (3, 4, 6, 3) with a downsampling branch in each first block, and fc. */
size_t bench_resnet50(size_t *sz)
{
    size_t n = 0, in = 64;
    sz[n++] = 64 * 3 * 7 * 7, sz[n++] = 64, sz[n++] = 64;
    const size_t blocks[4] = {3, 4, 6, 3}, width[4] = {64, 128, 256, 512};
    for (int st = 0; st < 4; st++)
        for (size_t b = 0; b < blocks[st]; b++) {
            size_t w = width[st];
            sz[n++] = w * in, sz[n++] = w, sz[n++] = w;
            sz[n++] = w * w * 9, sz[n++] = w, sz[n++] = w;
            sz[n++] = 4 * w * w, sz[n++] = 4 * w, sz[n++] = 4 * w;
            if (b == 0) sz[n++] = 4 * w * in, sz[n++] = 4 * w, sz[n++] = 4 * w;
            in = 4 * w;
        }
    sz[n++] = 1000 * 2048, sz[n++] = 1000;
    return n;
}

static int rank, size;
static const char *world = "shim"; /* who initialized MPI (--init) */

/* What dp_grads makes of a sum: the average unless [comm] reduce = sum. The shim weights a sum
 * with 1/N after reducing it (dps_scale_in_place's arithmetic: x * w in double, rounded once). */
static double grads_weight(void)
{
    const char *reduce = dpshim_policy_value ? dpshim_policy_value("comm", "reduce") : NULL;
    return reduce && !strcmp(reduce, "sum") ? 1.0 : 1.0 / dp_world_size();
}

static void weigh(float *x, size_t n, double w)
{
    for (size_t i = 0; w != 1.0 && i < n; i++)
        x[i] = (float)((double)x[i] * w);
}

static int by_time(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define ROUNDS 7

/* One set of tensors: returns 1 when both paths gave bitwise the same results. With `row`, one
 * line of the sweep table instead of the long form. Times are the medians of ROUNDS alternating
 * rounds, each the slowest rank's time per call. */
/* The shim's time of the last run_set, for the sweep's alpha-beta fit. */
static double last_shim_s;

static int run_set(const char *set, size_t *sz, size_t nt, int row)
{
    size_t n = 0;
    for (size_t i = 0; i < nt; i++)
        n += sz[i];
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *src = malloc(n * sizeof *src);
    fill(src, n, rank);
    dp_tensor t[200];
    for (size_t i = 0, off = 0; i < nt; off += sz[i++])
        t[i] = (dp_tensor){b + off, sz[i], DP_F32, DP_HOST, "bench"};
    memcpy(b, src, n * sizeof *b);
    dp_grads(t, nt); /* first use: opens the backend and measures the piece size */
    /* the check: one call each on the same data */
    memcpy(a, src, n * sizeof *a), memcpy(b, src, n * sizeof *b);
    for (size_t i = 0, off = 0; i < nt; off += sz[i++])
        MPI_Allreduce(MPI_IN_PLACE, a + off, (int)sz[i], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    dp_grads(t, nt);
    double w = grads_weight();
    weigh(a, n, w);
    int same = memcmp(a, b, n * sizeof *a) == 0, all_same;
    MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    /* the timing: small sets as loops of calls that last about a millisecond, so that one call's
     * time is not lost in the clock's and the barrier's jitter (the data just goes on evolving) */
    int calls = n * sizeof(float) >= (1u << 20) ? 1 : (int)((1u << 20) / (n * sizeof(float)));
    if (calls > 1000) calls = 1000;
    double plain[ROUNDS], shim[ROUNDS];
    for (int rep = 0; rep < ROUNDS; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int c = 0; c < calls; c++)
            for (size_t i = 0, off = 0; i < nt; off += sz[i++])
                MPI_Allreduce(MPI_IN_PLACE, a + off, (int)sz[i], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        plain[rep] = (MPI_Wtime() - t0) / calls;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int c = 0; c < calls; c++)
            dp_grads(t, nt);
        shim[rep] = (MPI_Wtime() - t0) / calls;
        MPI_Allreduce(MPI_IN_PLACE, &plain[rep], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &shim[rep], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    qsort(plain, ROUNDS, sizeof *plain, by_time);
    qsort(shim, ROUNDS, sizeof *shim, by_time);
    double tp = plain[ROUNDS / 2], ts = shim[ROUNDS / 2];
    last_shim_s = ts;
    double mc = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = MPI_Wtime();
        memcpy(a, src, n * sizeof *a);
        t0 = MPI_Wtime() - t0;
        if (t0 < mc) mc = t0;
    }
    double bytes = (double)n * sizeof(float), f = 2.0 * (size - 1) / size;
    if (!rank && row) {
        printf("%12.0f %10.3f %9.3f %9.3f %10.3f %9.3f %9.3f %7.2f %6s\n", bytes, tp * 1e3, bytes / tp / 1e9,
               f * bytes / tp / 1e9, ts * 1e3, bytes / ts / 1e9, f * bytes / ts / 1e9, tp / ts,
               all_same ? "yes" : "NO");
    } else if (!rank) {
        printf("%s: %zu tensor(s), %.1f MiB, np=%d, MPI initialized by the %s, median of %d alternating "
               "rounds:\n",
               set, nt, bytes / (1 << 20), size, world, ROUNDS);
        printf("  plain, one MPI_Allreduce per tensor %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n",
               tp * 1e3, bytes / tp / 1e9, f * bytes / tp / 1e9);
        printf("  dpshim dp_grads (%s)%*s %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n",
               w == 1.0 ? "sum" : "mean", w == 1.0 ? 12 : 11, "", ts * 1e3, bytes / ts / 1e9,
               f * bytes / ts / 1e9);
        printf("  speedup plain/shim %.2fx, results bitwise equal: %s; memcpy on one core %.2f GB/s (plain "
               "busbw %.0f%%, "
               "shim busbw %.0f%% of it)\n",
               tp / ts, all_same ? "yes" : "NO", bytes / mc / 1e9, 100 * (f * bytes / tp) / (bytes / mc),
               100 * (f * bytes / ts) / (bytes / mc));
    }
    free(a), free(b), free(src);
    return all_same;
}

/* Sleeps until `start` + ns: deadlines from one start, so no sleep's lateness adds up. */
static void sleep_until(const struct timespec *start, double ns)
{
    struct timespec d = *start;
    long long at = (long long)d.tv_nsec + (long long)ns;
    d.tv_sec += (time_t)(at / 1000000000), d.tv_nsec = (long)(at % 1000000000);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &d, NULL) != 0) {
    }
}

/* One simulated step: backward announces tensors last to first, dp_grads ends it. */
double bench_backward_step(dp_tensor *t, size_t nt, size_t total, double compute_ns, int announce)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime(), done = 0;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (size_t i = nt; i-- > 0;) {
        done += compute_ns * (double)t[i].count / (double)total;
        if (compute_ns > 0) sleep_until(&start, done);
        if (announce) dp_grad_ready(&t[i]);
    }
    dp_grads(t, nt);
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return dt;
}

static int run_overlap(void)
{
    size_t sz[200], nt = bench_resnet50(sz), n = 0;
    for (size_t i = 0; i < nt; i++)
        n += sz[i];
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *src = malloc(n * sizeof *src);
    fill(src, n, rank);
    dp_tensor ta[200], tb[200];
    for (size_t i = 0, off = 0; i < nt; off += sz[i++]) {
        ta[i] = (dp_tensor){a + off, sz[i], DP_F32, DP_HOST, "bench"};
        tb[i] = (dp_tensor){b + off, sz[i], DP_F32, DP_HOST, "bench"};
    }
    prctl(PR_SET_TIMERSLACK, 1UL); /* sleeps end on time */
    memcpy(a, src, n * sizeof *a);
    double comm = bench_backward_step(ta, nt, n, 0, 0); /* warm-up, then the reduction alone */
    for (int rep = 0; rep < 3; rep++) {
        memcpy(a, src, n * sizeof *a);
        double c = bench_backward_step(ta, nt, n, 0, 0);
        if (c < comm) comm = c;
    }
    double compute = comm * 1e9, off = 1e30, on = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        memcpy(a, src, n * sizeof *a);
        double x = bench_backward_step(ta, nt, n, compute, 0);
        memcpy(b, src, n * sizeof *b);
        double y = bench_backward_step(tb, nt, n, compute, 1);
        if (x < off) off = x;
        if (y < on) on = y;
    }
    int same = memcmp(a, b, n * sizeof *a) == 0, all_same;
    MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!rank) {
        printf("overlap: ResNet-50's 161 tensors (%.1f MiB), np=%d, simulated backward of %.2f ms (sleeps, "
               "as a CPU "
               "waiting for GPU kernels), best of 5:\n",
               (double)n * sizeof(float) / (1 << 20), size, comm * 1e3);
        printf("  reduction alone                        %8.2f ms\n", comm * 1e3);
        printf("  backward, then dp_grads                %8.2f ms\n", off * 1e3);
        printf("  backward with dp_grad_ready per tensor %8.2f ms  (bound: %.2f ms, the longer of the two)\n",
               on * 1e3, comm * 1e3);
        printf("  speedup from overlap %.2fx (at most %.2fx), results bitwise equal: %s\n", off / on,
               off / comm, all_same ? "yes" : "NO");
    }
    free(a), free(b), free(src);
    return all_same;
}

/* Who initializes MPI: `world` is --init's value; returns 1 when the bench itself did (so it
 * finalizes), 0 when the shim did, -1 on a bad value. */
static int start_mpi(int *argc, char ***argv)
{
    int init = 0, provided = 0;
    MPI_Initialized(&init);
    if (!strcmp(world, "program")) {
        if (!init) MPI_Init(argc, argv);
        return !init;
    }
    if (!strcmp(world, "program-mt")) {
        if (!init) MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        return !init;
    }
    if (strcmp(world, "shim") && strcmp(world, "python")) return -1;
    uint64_t seed = 0;
    dp_seed(&seed); /* the first hook: the shim opens its backend, and MPI with it */
    MPI_Initialized(&init);
    if (init) return 0;
    MPI_Init(argc, argv); /* world size 1: the shim needs no MPI */
    return 1;
}

/* dpshim-bench's main, and the entry point tools/bench_torch.py calls in a Python process. */
__attribute__((visibility("default"))) int dpshim_bench_main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--init")) {
        if (argc < 3) {
            fprintf(stderr, "dpshim-bench: --init needs a value: program, program-mt, shim or python\n");
            return 2;
        }
        world = argv[2], argc -= 2, argv += 2;
    }
    if (!dp_grads) {
        fprintf(stderr, "dpshim-bench: run it under mpirun with LD_PRELOAD=libdpshim.so\n");
        return 2;
    }
    int ours = start_mpi(&argc, &argv);
    if (ours < 0) {
        fprintf(stderr, "dpshim-bench: --init %s: say program, program-mt, shim or python\n", world);
        return 2;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!strcmp(world, "program"))
        world = "program (MPI_Init)";
    else if (!strcmp(world, "program-mt"))
        world = "program (MPI_Init_thread, MPI_THREAD_MULTIPLE)";
    else if (!strcmp(world, "shim"))
        world = "shim (at the first hook)";
    else
        world = "shim, in a Python process with torch";
    const char *set = argc > 1 ? argv[1] : "sweep";
    size_t sz[200], nt = 0;
    int ok = 1;
    if (!strcmp(set, "overlap")) {
        ok = run_overlap();
    } else if (!strncmp(set, "gpu", 3) && (!set[3] || set[3] == ':')) {
        ok = bench_gpu(set[3] ? set + 4 : NULL, rank, size);
    } else if (!strncmp(set, "gpu-sweep", 9) && (!set[9] || set[9] == ':')) {
        ok = bench_gpu_sweep(set[9] ? set + 10 : NULL, rank, size);
    } else if (!strcmp(set, "gpu-overlap")) {
        ok = bench_gpu_overlap(rank, size);
    } else if (!strcmp(set, "sweep")) {
        if (!rank)
            printf("all-reduce of one f32 buffer, np=%d, MPI initialized by the %s, median of %d alternating "
                   "rounds "
                   "(GB/s: algbw = bytes/time, busbw = algbw*2(n-1)/n)\n"
                   "%12s %10s %9s %9s %10s %9s %9s %7s %6s\n",
                   size, world, ROUNDS, "bytes", "plain ms", "algbw", "busbw", "dpshim ms", "algbw", "busbw",
                   "ratio", "same");
        double t_small = 0, t_large = 0, n_large = 0;
        for (size_t bytes = 4; bytes <= (256u << 20); bytes *= 4) {
            sz[0] = bytes / sizeof(float), nt = 1;
            ok &= run_set("sweep", sz, nt, 1);
            if (bytes == 4) t_small = last_shim_s;
            t_large = last_shim_s, n_large = (double)bytes;
        }
        /* The ring model t(n) = 2(p-1) alpha + 2(p-1)/p n / B: alpha from the smallest buffer,
         * B from the largest once the latency part is taken off (dpshim-diag model reads this). */
        if (!rank && size > 1) {
            double alpha = t_small / (2.0 * (size - 1)), f = 2.0 * (size - 1) / size;
            double bw = f * n_large / (t_large - 2.0 * (size - 1) * alpha);
            printf("model inputs (ring fit of the dpshim column): --alpha-us %.3f --bw-gbs %.3f\n",
                   alpha * 1e6, bw / 1e9);
        }
    } else {
        if (!strcmp(set, "resnet50"))
            nt = bench_resnet50(sz);
        else if (!strcmp(set, "small"))
            for (nt = 0; nt < 161; nt++)
                sz[nt] = 256;
        else {
            char *end;
            unsigned long mib = strtoul(set, &end, 10);
            if (*end || !mib || mib > 4096) {
                if (!rank)
                    fprintf(stderr,
                            "dpshim-bench: %s: say sweep, resnet50, small, overlap, gpu[:MiB], "
                            "gpu-sweep[:MiB,...], gpu-overlap or a size in MiB (1..4096)\n",
                            set);
                if (ours) MPI_Finalize();
                return 2;
            }
            sz[0] = (mib << 20) / sizeof(float), nt = 1;
        }
        ok = run_set(set, sz, nt, 0);
    }
    if (ours) MPI_Finalize(); /* else the shim finalizes what it initialized, at exit */
    return ok ? 0 : 1;
}
