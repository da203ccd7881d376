/* dpshim-bench gpu[:MiB], gpu-sweep[:MiB,...] and gpu-overlap: buffers in GPU memory.
 *
 * gpu[:MiB]: one f32 buffer (64 MiB by default), side by side in one run:
 *   copies    device -> host -> device through pageable memory and through pinned memory, the
 *             two kinds of host buffer staging can use;
 *   all-reduce dp_grads on the device buffer (NCCL or staged, as the ranks agreed: the shim's
 *             log says which), against dp_grads on the same data in host memory (the host
 *             path), against the same staging done by hand (cudaMemcpy to pinned memory,
 *             MPI_Allreduce, cudaMemcpy back) and, where NCCL starts, against ncclAllReduce
 *             called directly on a communicator of the benchmark's own;
 *   NCCL      called directly four ways: on a non-blocking communicator (the plugin's) and on a
 *             blocking one, each waited for as the plugin waits (an event polled with short
 *             sleeps) and with cudaStreamSynchronize (which spin-waits under CUDA's default
 *             scheduling and so takes the waiting thread's core from NCCL's own threads); and
 *             loops of 4 KiB calls on both communicators, where the launch latency shows.
 *             dp_grads is compared with the first way: both measured the same way.
 * gpu-sweep[:MiB,...]: dp_grads on one device buffer against ncclAllReduce called directly (the
 *             plugin's kind of communicator, waited for as the plugin waits) for each size
 *             (1, 4, 16, 64 and 256 MiB by default), median of alternating rounds.
 * gpu-overlap: ResNet-50's 161 tensors in GPU memory announced one by one by a simulated backward
 *             pass (sleeps, as a CPU waiting for GPU kernels), with dp_grad_ready per tensor
 *             (its buckets are queued on the GPU at once) against dp_grads at the end only: the
 *             share of the reduction hidden behind backward. The GPU computes nothing meanwhile,
 *             so this is the most overlap can hide; a real backward shares the GPU with it.
 * Every result is checked bitwise against the host path (integer-valued floats). The CUDA
 * runtime and NCCL are opened with dlopen, as the shim's plugin opens them ($DPSHIM_CUDART_LIB and
 * $DPSHIM_NCCL_LIB first): this program builds without the toolkit and runs against the real
 * libraries or the test double. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

#include "bench.h"
#include "cuda_api.h"

static struct {
    dps_cudaError_t (*GetDeviceCount)(int *);
    dps_cudaError_t (*GetDevice)(int *);
    dps_cudaError_t (*Malloc)(void **, size_t);
    dps_cudaError_t (*Free)(void *);
    dps_cudaError_t (*HostAlloc)(void **, size_t, unsigned);
    dps_cudaError_t (*FreeHost)(void *);
    dps_cudaError_t (*Memcpy)(void *, const void *, size_t, int);
    dps_cudaError_t (*StreamCreateWithFlags)(dps_cudaStream_t *, unsigned);
    dps_cudaError_t (*StreamSynchronize)(dps_cudaStream_t);
    dps_cudaError_t (*EventCreateWithFlags)(dps_cudaEvent_t *, unsigned);
    dps_cudaError_t (*EventRecord)(dps_cudaEvent_t, dps_cudaStream_t);
    dps_cudaError_t (*EventQuery)(dps_cudaEvent_t);
} cu;

static struct {
    dps_ncclResult_t (*GetUniqueId)(dps_ncclUniqueId *);
    dps_ncclResult_t (*CommInitRankConfig)(dps_ncclComm_t *, int, dps_ncclUniqueId, int, dps_ncclConfig_t *);
    dps_ncclResult_t (*CommGetAsyncError)(dps_ncclComm_t, dps_ncclResult_t *);
    dps_ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, dps_ncclComm_t, dps_cudaStream_t);
    dps_ncclResult_t (*CommDestroy)(dps_ncclComm_t);
} nc;

/* Every symbol of `want` from $env's library, else the first of `names` that has them all: 1,
 * or 0. */
static int load(const char *env, const char *const *names, const dps_sym_row_t *want, size_t n)
{
    char missing[64];
    const char *user = getenv(env);
    if (user && *user) {
        void *h = dlopen(user, RTLD_NOW | RTLD_LOCAL);
        return h && dps_bind_syms(h, want, n, missing, sizeof missing) == 0;
    }
    for (; *names; names++) {
        void *h = dlopen(*names, RTLD_NOW | RTLD_LOCAL);
        if (h && dps_bind_syms(h, want, n, missing, sizeof missing) == 0) return 1;
    }
    return 0;
}

static int rank, size;

/* The CUDA runtime, and whether every rank has a GPU: 1, or 0 (rank 0 says so). */
static int open_cuda(void)
{
    static const char *const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
    const dps_sym_row_t want[] = {{"cudaGetDeviceCount", (void **)&cu.GetDeviceCount},
                                  {"cudaGetDevice", (void **)&cu.GetDevice},
                                  {"cudaMalloc", (void **)&cu.Malloc},
                                  {"cudaFree", (void **)&cu.Free},
                                  {"cudaHostAlloc", (void **)&cu.HostAlloc},
                                  {"cudaFreeHost", (void **)&cu.FreeHost},
                                  {"cudaMemcpy", (void **)&cu.Memcpy},
                                  {"cudaStreamCreateWithFlags", (void **)&cu.StreamCreateWithFlags},
                                  {"cudaStreamSynchronize", (void **)&cu.StreamSynchronize},
                                  {"cudaEventCreateWithFlags", (void **)&cu.EventCreateWithFlags},
                                  {"cudaEventRecord", (void **)&cu.EventRecord},
                                  {"cudaEventQuery", (void **)&cu.EventQuery}};
    int gpus = 0;
    int ok = load("DPSHIM_CUDART_LIB", libs, want, sizeof want / sizeof *want) &&
             cu.GetDeviceCount(&gpus) == 0 && gpus > 0,
        all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all && !rank) printf("gpu: no GPU (or no CUDA runtime) on some rank: device buffers not measured\n");
    return all;
}

/* The slowest rank's time of the fastest of 5 runs of fn. */
static double best_of_5(void (*fn)(void *), void *arg)
{
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        fn(arg);
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (t < best) best = t;
    }
    return best;
}

typedef struct {
    float *src;  /* this rank's values, on the host */
    void *dev;   /* the device buffer */
    float *host; /* pageable or pinned host buffer */
    size_t n, bytes;
    dps_ncclComm_t comm;
    int nonblocking; /* comm was made with blocking = 0: its calls are polled */
    size_t count;    /* elements per NCCL call: n, or the small calls' */
    int calls;       /* NCCL calls per timed run */
    int spin;        /* wait for the stream with cudaStreamSynchronize, not as the plugin waits */
    dps_cudaStream_t stream;
    dps_cudaEvent_t done; /* recorded after the direct calls, polled */
    int failed;
} run_t;

/* This rank's values into the device buffer. From pageable memory cudaMemcpy may return before
 * the copy lands, and the NCCL calls' stream does not wait for the legacy stream: wait here. */
static void put(run_t *r)
{
    r->failed |= cu.Memcpy(r->dev, r->src, r->bytes, DPS_cudaMemcpyHostToDevice) != 0 ||
                 cu.StreamSynchronize(DPS_cudaStreamLegacy) != 0;
}

static void copy_round_trip(void *a)
{
    run_t *r = a;
    r->failed |= cu.Memcpy(r->host, r->dev, r->bytes, DPS_cudaMemcpyDeviceToHost) != 0;
    r->failed |= cu.Memcpy(r->dev, r->host, r->bytes, DPS_cudaMemcpyHostToDevice) != 0;
}

static void shim_device(void *a)
{
    run_t *r = a;
    int dev = 0;
    cu.GetDevice(&dev);
    dp_tensor t = {r->dev, r->n, DP_F32, dev, "bench"};
    r->failed |= dp_grads(&t, 1) != 0;
}

static void shim_host(void *a)
{
    run_t *r = a;
    dp_tensor t = {r->host, r->n, DP_F32, DP_HOST, "bench"};
    r->failed |= dp_grads(&t, 1) != 0;
}

static void by_hand(void *a)
{
    run_t *r = a;
    r->failed |= cu.Memcpy(r->host, r->dev, r->bytes, DPS_cudaMemcpyDeviceToHost) != 0;
    MPI_Allreduce(MPI_IN_PLACE, r->host, (int)r->n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    r->failed |= cu.Memcpy(r->dev, r->host, r->bytes, DPS_cudaMemcpyHostToDevice) != 0;
}

static void pause_us(long us)
{
    nanosleep(&(struct timespec){0, us * 1000}, NULL);
}

/* A call on a non-blocking communicator, polled to its end as the shim's plugin polls (sleeps
 * from 2 us doubling to 500 us). */
static void nccl_poll(run_t *r, dps_ncclResult_t rc)
{
    for (long us = 2; rc == DPS_ncclInProgress; us = us < 500 ? us * 2 : 500) {
        pause_us(us);
        if (nc.CommGetAsyncError(r->comm, &rc) != DPS_ncclSuccess) rc = -1;
    }
    r->failed |= rc != DPS_ncclSuccess;
}

/* The end of the work queued on the stream, waited for as the plugin waits for its own (an
 * event polled with sleeps from 2 us doubling to 500 us: the thread leaves its core to others,
 * NCCL's proxy thread among them, which moves the data over sockets between ranks that NCCL
 * takes for separate hosts), or with cudaStreamSynchronize, which spin-waits under CUDA's
 * default scheduling (cudaDeviceScheduleAuto spins while the process has fewer contexts than
 * the machine has cores, whatever the process's affinity mask holds). */
static void settle(run_t *r)
{
    if (r->spin) {
        r->failed |= cu.StreamSynchronize(r->stream) != 0;
        return;
    }
    dps_cudaError_t e = cu.EventRecord(r->done, r->stream);
    if (!e)
        for (long us = 2; (e = cu.EventQuery(r->done)) == DPS_cudaErrorNotReady; us = us < 500 ? us * 2 : 500)
            pause_us(us);
    r->failed |= e != DPS_cudaSuccess;
}

static void nccl_direct(void *a)
{
    run_t *r = a;
    for (int i = 0; i < r->calls; i++)
        nccl_poll(r,
                  nc.AllReduce(r->dev, r->dev, r->count, DPS_ncclFloat32, DPS_ncclSum, r->comm, r->stream));
    settle(r);
}

/* The device buffer's contents equal `want` on every rank. */
static int device_equals(run_t *r, const float *want, float *scratch)
{
    int same = cu.Memcpy(scratch, r->dev, r->bytes, DPS_cudaMemcpyDeviceToHost) == 0 &&
               memcmp(scratch, want, r->bytes) == 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return same;
}

/* The benchmark's own NCCL communicator (blocking, or non-blocking and polled to its end), or
 * NULL where NCCL does not start (two ranks on one GPU without their own NCCL_HOSTID, say):
 * every rank learns whether all of them have one. Made as the plugin makes its own (the same
 * configuration but for `blocking`, the same library and environment), so the two use the same
 * transport and channels. */
static dps_ncclComm_t own_comm(run_t *r, int blocking)
{
    static const char *const libs[] = {"libnccl.so.2", "libnccl.so", NULL};
    const dps_sym_row_t want[] = {{"ncclGetUniqueId", (void **)&nc.GetUniqueId},
                                  {"ncclCommInitRankConfig", (void **)&nc.CommInitRankConfig},
                                  {"ncclCommGetAsyncError", (void **)&nc.CommGetAsyncError},
                                  {"ncclAllReduce", (void **)&nc.AllReduce},
                                  {"ncclCommDestroy", (void **)&nc.CommDestroy}};
    int ok = load("DPSHIM_NCCL_LIB", libs, want, sizeof want / sizeof *want), all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) return NULL;
    dps_ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0 && nc.GetUniqueId(&id) != 0) memset(&id, 0, sizeof id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    dps_ncclConfig_t cfg = {sizeof cfg,
                            DPS_NCCL_CONFIG_MAGIC,
                            DPS_NCCL_CONFIG_VERSION,
                            blocking,
                            DPS_NCCL_CONFIG_UNDEF_INT,
                            DPS_NCCL_CONFIG_UNDEF_INT,
                            DPS_NCCL_CONFIG_UNDEF_INT,
                            (const char *)(uintptr_t)0};
    r->comm = NULL;
    r->nonblocking = !blocking;
    r->failed = 0;
    nccl_poll(r, nc.CommInitRankConfig(&r->comm, size, id, rank, &cfg));
    ok = r->comm && !r->failed;
    r->failed = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all) return r->comm;
    /* a failed communicator is left alone: destroying it can wait for a peer that is gone */
    return r->comm = NULL;
}

static void line(const char *what, double s, double bytes, double ref_s, const char *ref)
{
    double f = 2.0 * (size - 1) / size;
    printf("  %-56s %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s", what, s * 1e3, bytes / s / 1e9,
           f * bytes / s / 1e9);
    if (ref) printf("  %.2fx %s", ref_s / s, ref);
    putchar('\n');
}

/* The device buffer, this rank's values, host buffers of the same size (those asked for) and
 * the stream for `bytes`: 0, or -1 after a message. */
static int alloc_run(run_t *r, size_t bytes, float **want_sum, float **pageable, float **pinned)
{
    r->n = bytes / sizeof(float), r->bytes = r->n * sizeof(float);
    *want_sum = malloc(r->bytes), r->src = malloc(r->bytes);
    if (pageable) *pageable = malloc(r->bytes);
    if (!*want_sum || (pageable && !*pageable) || !r->src || cu.Malloc(&r->dev, r->bytes) ||
        (pinned && cu.HostAlloc((void **)pinned, r->bytes, 0)) ||
        cu.StreamCreateWithFlags(&r->stream, DPS_cudaStreamNonBlocking) ||
        cu.EventCreateWithFlags(&r->done, DPS_cudaEventDisableTiming)) {
        fprintf(stderr, "dpshim-bench gpu: rank %d cannot allocate %zu MiB on the host and the GPU\n", rank,
                r->bytes >> 20);
        return -1;
    }
    for (size_t i = 0; i < r->n; i++)
        r->src[i] = (float)((i + (size_t)rank) % 7);
    return 0;
}

int bench_gpu(const char *arg, int my_rank, int world)
{
    rank = my_rank, size = world;
    if (!open_cuda()) return 1;
    size_t mib = arg && *arg ? strtoul(arg, NULL, 10) : 64;
    run_t r = {0};
    float *want_sum, *pageable, *pinned = NULL;
    if (alloc_run(&r, (mib ? mib : 64) << 20, &want_sum, &pageable, &pinned)) MPI_Abort(MPI_COMM_WORLD, 1);
    double bytes = (double)r.bytes;
    const char *be = getenv("DPSHIM_COMM_BACKEND");
    if (!rank)
        printf("gpu: one f32 buffer of %zu MiB in GPU memory, np=%d, [comm] backend = %s, best of 5\n",
               r.bytes >> 20, size, be ? be : "auto");

    /* copies: pageable vs pinned host memory */
    put(&r);
    r.host = pageable;
    double pageable_s = best_of_5(copy_round_trip, &r);
    r.host = pinned;
    double pinned_s = best_of_5(copy_round_trip, &r);
    if (!rank) {
        printf("  device -> host -> device, pageable memory %8.2f ms  %6.2f GB/s each way\n",
               pageable_s * 1e3, 2 * bytes / pageable_s / 1e9);
        printf("  device -> host -> device, pinned memory   %8.2f ms  %6.2f GB/s each way  %.2fx pageable\n",
               pinned_s * 1e3, 2 * bytes / pinned_s / 1e9, pageable_s / pinned_s);
    }

    /* the reference: the host path on the same values */
    r.host = want_sum;
    memcpy(want_sum, r.src, r.bytes);
    shim_host(&r);
    r.host = pageable; /* pageable, as a program's own host tensors are */
    double host_s = best_of_5(shim_host, &r);

    /* dp_grads on the device buffer; the check runs once more from this rank's values */
    double dev_s = best_of_5(shim_device, &r);
    put(&r);
    shim_device(&r);
    int same_dev = device_equals(&r, want_sum, pageable);

    r.host = pinned;
    double hand_s = best_of_5(by_hand, &r);
    put(&r);
    by_hand(&r);
    int same_hand = device_equals(&r, want_sum, pageable);

    /* NCCL called directly: a non-blocking communicator (the plugin's kind), then a blocking
     * one; the whole buffer waited for both ways, and 200 calls of 4 KiB (latency). The first
     * call, checked, also makes NCCL's connections (it does that at a communicator's first
     * collective), so no timed run includes them. */
    int failed = r.failed, same_nccl = 0, have_nccl = 0;
    double nccl_s[2][2] = {{0, 0}, {0, 0}}, small_s[2] = {0, 0}; /* [blocking][spin] */
    for (int blocking = 0; blocking <= 1; blocking++) {
        if (!own_comm(&r, blocking)) break;
        have_nccl++;
        r.count = r.n, r.calls = 1, r.spin = 0;
        put(&r);
        nccl_direct(&r);
        same_nccl += device_equals(&r, want_sum, pageable);
        for (r.spin = 0; r.spin <= 1; r.spin++)
            nccl_s[blocking][r.spin] = best_of_5(nccl_direct, &r);
        r.spin = 0, r.count = 1024, r.calls = 200;
        small_s[blocking] = best_of_5(nccl_direct, &r) / r.calls;
        failed |= r.failed;
        nc.CommDestroy(r.comm);
        r.failed = 0;
    }
    r.comm = NULL;
    failed |= r.failed;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!rank) {
        line("dp_grads, host buffer (the host path)", host_s, bytes, 0, NULL);
        line("by hand: copy to pinned, MPI_Allreduce, back", hand_s, bytes, 0, NULL);
        if (have_nccl) {
            line("ncclAllReduce directly: non-blocking comm, polled wait", nccl_s[0][0], bytes, 0, NULL);
            line("  the same, waited by cudaStreamSynchronize", nccl_s[0][1], bytes, nccl_s[0][0],
                 "the polled wait");
        } else {
            printf("  ncclAllReduce called directly: NCCL did not start on every rank (not measured)\n");
        }
        if (have_nccl == 2) {
            line("  blocking communicator, polled wait", nccl_s[1][0], bytes, nccl_s[0][0],
                 "the non-blocking one");
            line("  blocking communicator, cudaStreamSynchronize", nccl_s[1][1], bytes, nccl_s[0][0],
                 "the non-blocking one polled");
            printf("  4 KiB ncclAllReduce: blocking communicator %.1f us per call, non-blocking and polled "
                   "%.1f us (%.2fx)\n",
                   small_s[1] * 1e6, small_s[0] * 1e6, small_s[1] / small_s[0]);
        }
        line("dp_grads, device buffer", dev_s, bytes, host_s, "the host path");
        printf("  dp_grads on the device buffer vs by hand %.2fx", hand_s / dev_s);
        if (have_nccl)
            printf(", vs NCCL called directly (non-blocking, polled: as the plugin) %.2fx",
                   nccl_s[0][0] / dev_s);
        printf("\n  results bitwise equal to the host path: dp_grads %s, by hand %s", same_dev ? "yes" : "NO",
               same_hand ? "yes" : "NO");
        if (have_nccl) printf(", NCCL %s", same_nccl == have_nccl ? "yes" : "NO");
        printf("%s\n", failed ? "; a CUDA or NCCL call FAILED" : "");
    }
    cu.Free(r.dev), cu.FreeHost(pinned);
    free(want_sum), free(pageable), free(r.src);
    return same_dev && same_hand && same_nccl == have_nccl && !failed;
}

static int by_time(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define SWEEP_ROUNDS 5
#define SWEEP_MAX 16

/* One timed call of fn from this rank's values (put outside the time): the slowest rank's. */
static double timed_from_src(void (*fn)(void *), run_t *r)
{
    put(r);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    fn(r);
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

int bench_gpu_sweep(const char *list, int my_rank, int world)
{
    rank = my_rank, size = world;
    size_t mib[SWEEP_MAX], nsz = 0, top = 0;
    const char *p = list && *list ? list : "1,4,16,64,256";
    for (char *end; *p && nsz < SWEEP_MAX; p = *end ? end + 1 : end) {
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || (*end && *end != ',') || !v || v > 4096) {
            if (!rank)
                fprintf(stderr,
                        "dpshim-bench: gpu-sweep:%s: say sizes in MiB (1..4096) separated by commas\n", list);
            return 0;
        }
        mib[nsz++] = v;
        if (v > top) top = v;
    }
    if (!open_cuda()) return 1;
    run_t r = {0};
    float *want_sum, *scratch;
    if (alloc_run(&r, top << 20, &want_sum, &scratch, NULL)) MPI_Abort(MPI_COMM_WORLD, 1);
    size_t full = r.n;
    /* the plugin's communicator is made at the first dp_grads on a device buffer, the
     * benchmark's own here: both exist through every round, as they are alike */
    r.n = 1, r.bytes = sizeof(float);
    shim_device(&r);
    int have_nccl = own_comm(&r, 0) != NULL, all_same = 1, failed = 0;
    if (!rank) {
        printf(
            "gpu-sweep: dp_grads on one f32 buffer in GPU memory against ncclAllReduce called directly on a "
            "communicator made as the plugin makes its own (non-blocking) and waited for as the plugin "
            "waits; np=%d, "
            "median of %d alternating rounds%s\n",
            size, SWEEP_ROUNDS, have_nccl ? "" : " (NCCL did not start on every rank: dp_grads alone)");
        printf("%10s %11s %9s %11s %9s %8s %6s\n", "MiB", "dpshim ms", "busbw", "direct ms", "busbw", "ratio",
               "same");
    }
    double f = 2.0 * (size - 1) / size;
    for (size_t k = 0; k < nsz; k++) {
        r.n = (mib[k] << 20) / sizeof(float), r.bytes = r.n * sizeof(float);
        r.count = r.n, r.calls = 1, r.spin = 0;
        /* the check, which is also each side's first call at this size */
        r.host = want_sum;
        memcpy(want_sum, r.src, r.bytes);
        shim_host(&r);
        put(&r);
        shim_device(&r);
        int same = device_equals(&r, want_sum, scratch);
        if (have_nccl) {
            put(&r);
            nccl_direct(&r);
            same &= device_equals(&r, want_sum, scratch);
        }
        double shim_s[SWEEP_ROUNDS], direct_s[SWEEP_ROUNDS];
        for (int rep = 0; rep < SWEEP_ROUNDS; rep++) {
            shim_s[rep] = timed_from_src(shim_device, &r);
            direct_s[rep] = have_nccl ? timed_from_src(nccl_direct, &r) : 0;
        }
        qsort(shim_s, SWEEP_ROUNDS, sizeof *shim_s, by_time);
        qsort(direct_s, SWEEP_ROUNDS, sizeof *direct_s, by_time);
        double ts = shim_s[SWEEP_ROUNDS / 2], td = direct_s[SWEEP_ROUNDS / 2], bytes = (double)r.bytes;
        failed |= r.failed;
        all_same &= same;
        if (!rank && have_nccl)
            printf("%10zu %11.2f %9.2f %11.2f %9.2f %8.2f %6s\n", mib[k], ts * 1e3, f * bytes / ts / 1e9,
                   td * 1e3, f * bytes / td / 1e9, td / ts, same ? "yes" : "NO");
        else if (!rank)
            printf("%10zu %11.2f %9.2f %11s %9s %8s %6s\n", mib[k], ts * 1e3, f * bytes / ts / 1e9, "-", "-",
                   "-", same ? "yes" : "NO");
    }
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!rank)
        printf(
            "  ratio = direct time / dpshim time (1.00: no cost; above 1: dpshim faster); busbw in GB/s%s\n",
            failed ? "; a CUDA or NCCL call FAILED" : "");
    if (have_nccl) nc.CommDestroy(r.comm);
    r.n = full;
    cu.Free(r.dev);
    free(want_sum), free(scratch), free(r.src);
    return all_same && !failed;
}

int bench_gpu_overlap(int my_rank, int world)
{
    rank = my_rank, size = world;
    if (!open_cuda()) return 1;
    size_t sz[200], nt = bench_resnet50(sz), n = 0;
    for (size_t i = 0; i < nt; i++)
        n += sz[i];
    run_t ra = {0}, rb = {0};
    float *want_a, *want_b;
    if (alloc_run(&ra, n * sizeof(float), &want_a, NULL, NULL) ||
        alloc_run(&rb, n * sizeof(float), &want_b, NULL, NULL))
        MPI_Abort(MPI_COMM_WORLD, 1);
    int dev = 0;
    cu.GetDevice(&dev);
    dp_tensor ta[200], tb[200];
    for (size_t i = 0, off = 0; i < nt; off += sz[i++]) {
        ta[i] = (dp_tensor){(float *)ra.dev + off, sz[i], DP_F32, dev, "bench"};
        tb[i] = (dp_tensor){(float *)rb.dev + off, sz[i], DP_F32, dev, "bench"};
    }
    prctl(PR_SET_TIMERSLACK, 1UL); /* sleeps end on time */
    put(&ra);
    double comm = bench_backward_step(ta, nt, n, 0, 0); /* warm-up, then the reduction alone */
    for (int rep = 0; rep < 3; rep++) {
        put(&ra);
        double c = bench_backward_step(ta, nt, n, 0, 0);
        if (c < comm) comm = c;
    }
    double compute = comm * 1e9, off = 1e30, on = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        put(&ra);
        double x = bench_backward_step(ta, nt, n, compute, 0);
        put(&rb);
        double y = bench_backward_step(tb, nt, n, compute, 1);
        if (x < off) off = x;
        if (y < on) on = y;
    }
    /* the last step of each from the same values: the same bits */
    int same = cu.Memcpy(want_a, ra.dev, ra.bytes, DPS_cudaMemcpyDeviceToHost) == 0 &&
               cu.Memcpy(want_b, rb.dev, rb.bytes, DPS_cudaMemcpyDeviceToHost) == 0 &&
               memcmp(want_a, want_b, ra.bytes) == 0 && !ra.failed && !rb.failed,
        all_same;
    MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!rank) {
        double hidden = (off - on) / comm;
        printf("gpu-overlap: ResNet-50's 161 tensors (%.1f MiB) in GPU memory, np=%d, simulated backward of "
               "%.2f ms "
               "(sleeps: the GPU computes nothing meanwhile), best of 5:\n",
               (double)n * sizeof(float) / (1 << 20), size, comm * 1e3);
        printf("  reduction alone                        %8.2f ms\n", comm * 1e3);
        printf("  backward, then dp_grads                %8.2f ms\n", off * 1e3);
        printf("  backward with dp_grad_ready per tensor %8.2f ms  (bound: %.2f ms, the longer of the two)\n",
               on * 1e3, comm * 1e3);
        printf("  hidden behind backward: %.0f%% of the reduction ((off - on) / reduction alone), speedup "
               "%.2fx; "
               "results bitwise equal: %s\n",
               100 * (hidden < 0   ? 0
                      : hidden > 1 ? 1
                                   : hidden),
               off / on, all_same ? "yes" : "NO");
    }
    cu.Free(ra.dev), cu.Free(rb.dev);
    free(want_a), free(want_b), free(ra.src), free(rb.src);
    return all_same;
}
