/* dpshim-bench gpu[:MiB]: one f32 buffer in GPU memory (64 MiB by default), side by side in one
 * run:
 *   copies    device -> host -> device through pageable memory and through pinned memory, the
 *             two kinds of host buffer staging can use;
 *   all-reduce dp_grads on the device buffer (NCCL or staged, as the ranks agreed: the shim's
 *             log says which), against dp_grads on the same data in host memory (the host
 *             path), against the same staging done by hand (cudaMemcpy to pinned memory,
 *             MPI_Allreduce, cudaMemcpy back) and, where NCCL starts, against ncclAllReduce
 *             called directly on a communicator of the benchmark's own;
 *   NCCL      a blocking communicator against a non-blocking one polled as the shim's plugin
 *             polls it (the plugin's choice: NCCL from 2.23 launches each collective of a
 *             non-blocking communicator on a thread of its own), on the whole buffer and on
 *             loops of 4 KiB calls, where the latency shows.
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
    float *src;      /* this rank's values, on the host */
    void *dev;       /* the device buffer */
    float *host;     /* pageable or pinned host buffer */
    size_t n, bytes;
    dps_ncclComm_t comm;
    int nonblocking; /* comm was made with blocking = 0: its calls are polled */
    size_t count;    /* elements per NCCL call: n, or the small calls' */
    int calls;       /* NCCL calls per timed run */
    dps_cudaStream_t stream;
    int failed;
} run_t;

static void put(run_t *r) { r->failed |= cu.Memcpy(r->dev, r->src, r->bytes, DPS_cudaMemcpyHostToDevice) != 0; }

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

/* A call on a non-blocking communicator, polled to its end as the shim's plugin polls (sleeps
 * from 2 us doubling to 500 us). */
static void nccl_poll(run_t *r, dps_ncclResult_t rc)
{
    for (long us = 2; rc == DPS_ncclInProgress; us = us < 500 ? us * 2 : 500) {
        nanosleep(&(struct timespec){0, us * 1000}, NULL);
        if (nc.CommGetAsyncError(r->comm, &rc) != DPS_ncclSuccess) rc = -1;
    }
    r->failed |= rc != DPS_ncclSuccess;
}

static void nccl_direct(void *a)
{
    run_t *r = a;
    for (int i = 0; i < r->calls; i++)
        nccl_poll(r, nc.AllReduce(r->dev, r->dev, r->count, DPS_ncclFloat32, DPS_ncclSum, r->comm, r->stream));
    r->failed |= cu.StreamSynchronize(r->stream) != 0;
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
 * every rank learns whether all of them have one. */
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
    dps_ncclConfig_t cfg = {sizeof cfg, DPS_NCCL_CONFIG_MAGIC, DPS_NCCL_CONFIG_VERSION, blocking,
                            DPS_NCCL_CONFIG_UNDEF_INT, DPS_NCCL_CONFIG_UNDEF_INT, DPS_NCCL_CONFIG_UNDEF_INT,
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
    printf("  %-44s %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s", what, s * 1e3, bytes / s / 1e9, f * bytes / s / 1e9);
    if (ref) printf("  %.2fx %s", ref_s / s, ref);
    putchar('\n');
}

int bench_gpu(const char *arg, int my_rank, int world)
{
    rank = my_rank, size = world;
    static const char *const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
    const dps_sym_row_t want[] = {{"cudaGetDeviceCount", (void **)&cu.GetDeviceCount},
                          {"cudaGetDevice", (void **)&cu.GetDevice},
                          {"cudaMalloc", (void **)&cu.Malloc},
                          {"cudaFree", (void **)&cu.Free},
                          {"cudaHostAlloc", (void **)&cu.HostAlloc},
                          {"cudaFreeHost", (void **)&cu.FreeHost},
                          {"cudaMemcpy", (void **)&cu.Memcpy},
                          {"cudaStreamCreateWithFlags", (void **)&cu.StreamCreateWithFlags},
                          {"cudaStreamSynchronize", (void **)&cu.StreamSynchronize}};
    int gpus = 0;
    int ok = load("DPSHIM_CUDART_LIB", libs, want, sizeof want / sizeof *want) && cu.GetDeviceCount(&gpus) == 0 &&
             gpus > 0,
        all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (!rank) printf("gpu: no GPU (or no CUDA runtime) on some rank: device buffers not measured\n");
        return 1;
    }
    size_t mib = arg && *arg ? strtoul(arg, NULL, 10) : 64;
    run_t r = {.n = (mib ? mib : 64) << 18};
    r.bytes = r.n * sizeof(float);
    float *want_sum = malloc(r.bytes), *pageable = malloc(r.bytes), *pinned = NULL;
    r.src = malloc(r.bytes);
    if (!want_sum || !pageable || !r.src || cu.Malloc(&r.dev, r.bytes) || cu.HostAlloc((void **)&pinned, r.bytes, 0) ||
        cu.StreamCreateWithFlags(&r.stream, DPS_cudaStreamNonBlocking)) {
        fprintf(stderr, "dpshim-bench gpu: rank %d cannot allocate %zu MiB on the host and the GPU\n", rank, r.bytes >> 20);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < r.n; i++) r.src[i] = (float)((i + (size_t)rank) % 7);
    double bytes = (double)r.bytes;
    const char *be = getenv("DPSHIM_COMM_BACKEND");
    if (!rank)
        printf("gpu: one f32 buffer of %zu MiB in GPU memory, np=%d, [comm] backend = %s, best of 5\n", r.bytes >> 20, size,
               be ? be : "auto");

    /* copies: pageable vs pinned host memory */
    put(&r);
    r.host = pageable;
    double pageable_s = best_of_5(copy_round_trip, &r);
    r.host = pinned;
    double pinned_s = best_of_5(copy_round_trip, &r);
    if (!rank) {
        printf("  device -> host -> device, pageable memory %8.2f ms  %6.2f GB/s each way\n", pageable_s * 1e3,
               2 * bytes / pageable_s / 1e9);
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

    /* NCCL called directly: a blocking communicator, then a non-blocking one polled as the
     * plugin polls; the whole buffer once, and 200 calls of 4 KiB (latency) */
    int failed = r.failed, same_nccl = 0, have_nccl = 0;
    double nccl_s[2] = {0, 0}, small_s[2] = {0, 0};
    for (int blocking = 1; blocking >= 0; blocking--) {
        if (!own_comm(&r, blocking)) break;
        have_nccl++;
        r.count = r.n, r.calls = 1;
        nccl_s[blocking] = best_of_5(nccl_direct, &r);
        put(&r);
        nccl_direct(&r);
        same_nccl += device_equals(&r, want_sum, pageable);
        r.count = 1024, r.calls = 200;
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
        if (have_nccl) line("ncclAllReduce called directly", nccl_s[1], bytes, 0, NULL);
        else printf("  ncclAllReduce called directly: NCCL did not start on every rank (not measured)\n");
        if (have_nccl == 2) {
            line("the same, non-blocking communicator, polled", nccl_s[0], bytes, nccl_s[1], "the blocking one");
            printf("  4 KiB ncclAllReduce: blocking communicator %.1f us per call, non-blocking and polled %.1f us (%.2fx)\n",
                   small_s[1] * 1e6, small_s[0] * 1e6, small_s[1] / small_s[0]);
        }
        line("dp_grads, device buffer", dev_s, bytes, host_s, "the host path");
        printf("  dp_grads on the device buffer vs by hand %.2fx", hand_s / dev_s);
        if (have_nccl) printf(", vs NCCL called directly %.2fx", nccl_s[1] / dev_s);
        printf("\n  results bitwise equal to the host path: dp_grads %s, by hand %s", same_dev ? "yes" : "NO",
               same_hand ? "yes" : "NO");
        if (have_nccl) printf(", NCCL %s", same_nccl == have_nccl ? "yes" : "NO");
        printf("%s\n", failed ? "; a CUDA or NCCL call FAILED" : "");
    }
    cu.Free(r.dev), cu.FreeHost(pinned);
    free(want_sum), free(pageable), free(r.src);
    return same_dev && same_hand && same_nccl == have_nccl && !failed;
}
