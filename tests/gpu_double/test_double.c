/* unit.gpu_double: the GPU test double checked on its own, opened with dlopen by path as the
 * plugin opens a CUDA runtime. Each case runs in forked children (one per rank), so every case
 * gets fresh state and its own environment switches; a child reports through its exit status. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

typedef struct nccl_id {
    char internal[128];
} nccl_id_t;

/* The start of ncclConfig_t, as the double reads it. */
typedef struct nccl_config {
    size_t size;
    unsigned magic, version;
    int blocking;
    int rest[16];
} nccl_config_t;

enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3, DEFAULT = 4 };
enum { NCCL_INT32 = 2, NCCL_INT64 = 4, NCCL_F16 = 6, NCCL_F32 = 7, NCCL_F64 = 8, NCCL_BF16 = 9 };
enum { SUM = 0, PROD = 1, MAX = 2, MIN = 3, AVG = 4 };
#define LEGACY ((void *)0x1)

/* Every function the double exports, declared as the plugin declares them. */
#define DOUBLE_API(X)                                                                                        \
    X(int, cudaGetDeviceCount, (int *))                                                                      \
    X(int, cudaSetDevice, (int))                                                                             \
    X(int, cudaGetDevice, (int *))                                                                           \
    X(int, cudaDeviceGetPCIBusId, (char *, int, int))                                                        \
    X(int, cudaRuntimeGetVersion, (int *))                                                                   \
    X(int, cudaDriverGetVersion, (int *))                                                                    \
    X(const char *, cudaGetErrorString, (int))                                                               \
    X(const char *, cudaGetErrorName, (int))                                                                 \
    X(int, cudaGetLastError, (void))                                                                         \
    X(int, cudaPeekAtLastError, (void))                                                                      \
    X(int, cudaMalloc, (void **, size_t))                                                                    \
    X(int, cudaFree, (void *))                                                                               \
    X(int, cudaHostAlloc, (void **, size_t, unsigned))                                                       \
    X(int, cudaMallocHost, (void **, size_t))                                                                \
    X(int, cudaFreeHost, (void *))                                                                           \
    X(int, cudaMemcpy, (void *, const void *, size_t, int))                                                  \
    X(int, cudaMemcpyAsync, (void *, const void *, size_t, int, void *))                                     \
    X(int, cudaMemset, (void *, int, size_t))                                                                \
    X(int, cudaMemsetAsync, (void *, int, size_t, void *))                                                   \
    X(int, cudaStreamCreate, (void **))                                                                      \
    X(int, cudaStreamCreateWithFlags, (void **, unsigned))                                                   \
    X(int, cudaStreamDestroy, (void *))                                                                      \
    X(int, cudaStreamSynchronize, (void *))                                                                  \
    X(int, cudaStreamQuery, (void *))                                                                        \
    X(int, cudaStreamWaitEvent, (void *, void *, unsigned))                                                  \
    X(int, cudaStreamBeginCapture, (void *, int))                                                            \
    X(int, cudaStreamEndCapture, (void *, void **))                                                          \
    X(int, cudaStreamIsCapturing, (void *, int *))                                                           \
    X(int, cudaGraphDestroy, (void *))                                                                       \
    X(int, cudaEventCreate, (void **))                                                                       \
    X(int, cudaEventCreateWithFlags, (void **, unsigned))                                                    \
    X(int, cudaEventDestroy, (void *))                                                                       \
    X(int, cudaEventRecord, (void *, void *))                                                                \
    X(int, cudaEventQuery, (void *))                                                                         \
    X(int, cudaEventSynchronize, (void *))                                                                   \
    X(int, cudaDeviceSynchronize, (void))                                                                    \
    X(int, cuInit, (unsigned))                                                                               \
    X(int, cuDriverGetVersion, (int *))                                                                      \
    X(int, cuPointerGetAttribute, (void *, int, unsigned long long))                                         \
    X(int, cuPointerGetAttributes, (unsigned, int *, void **, unsigned long long))                           \
    X(int, ncclGetVersion, (int *))                                                                          \
    X(const char *, ncclGetErrorString, (int))                                                               \
    X(const char *, ncclGetLastError, (void *))                                                              \
    X(int, ncclGetUniqueId, (nccl_id_t *))                                                                   \
    X(int, ncclCommInitRank, (void **, int, nccl_id_t, int))                                                 \
    X(int, ncclCommInitRankConfig, (void **, int, nccl_id_t, int, void *))                                   \
    X(int, ncclCommGetAsyncError, (void *, int *))                                                           \
    X(int, ncclCommAbort, (void *))                                                                          \
    X(int, ncclCommShrink, (void *, int *, int, void **, void *, int))                                       \
    X(int, ncclCommDestroy, (void *))                                                                        \
    X(int, ncclCommFinalize, (void *))                                                                       \
    X(int, ncclCommCount, (void *, int *))                                                                   \
    X(int, ncclCommUserRank, (void *, int *))                                                                \
    X(int, ncclCommCuDevice, (void *, int *))                                                                \
    X(int, ncclAllReduce, (const void *, void *, size_t, int, int, void *, void *))                          \
    X(int, ncclBroadcast, (const void *, void *, size_t, int, int, void *, void *))                          \
    X(int, ncclBcast, (void *, size_t, int, int, void *, void *))                                            \
    X(int, ncclRedOpCreatePreMulSum, (int *, void *, int, int, void *))                                      \
    X(int, ncclRedOpDestroy, (int, void *))                                                                  \
    X(int, ncclGroupStart, (void))                                                                           \
    X(int, ncclGroupEnd, (void))

#define DECLARE(ret, name, args) static ret(*name) args;
DOUBLE_API(DECLARE)

static void *lib;

static int load(void)
{
    lib = dlopen(DPS_DOUBLE_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot open %s: %s\n", DPS_DOUBLE_PATH, dlerror());
        return -1;
    }
    int missing = 0;
#define RESOLVE(ret, name, args)                                                                             \
    if (!(*(void **)&name = dlsym(lib, #name))) fprintf(stderr, "missing %s\n", #name), missing++;
    DOUBLE_API(RESOLVE)
    return missing ? -1 : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- running cases in children ---- */

static nccl_id_t the_id;
/* A page all children share, for cases whose ranks must take turns. */
static volatile int *shared;

typedef void (*case_fn)(int rank, int nranks);

/* Runs fn in nranks children (setenv in them first: pairs of "NAME=value", "%d" stands for the
 * rank). expect_signal: the children must die of it. */
static void run_ranks(const char *name, int nranks, const char *const *env, case_fn fn, int expect_signal)
{
    double t0 = now_s();
    CHECK(ncclGetUniqueId(&the_id) == 0, "%s: ncclGetUniqueId", name);
    pid_t pids[8];
    memset((void *)shared, 0, 4096);
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(30);          /* a hang fails the case instead of the whole test's timeout */
            check_failures = 0; /* the parent's count is not this case's */
            for (const char *const *e = env; e && *e; e++) {
                char buf[256];
                snprintf(buf, sizeof buf, *e, r);
                char *eq = strchr(buf, '=');
                *eq = '\0';
                setenv(buf, eq + 1, 1);
            }
            fn(r, nranks);
            /* exit, not _exit: the double's threads must not keep a process alive or hang it */
            exit(check_failures ? 1 : 0);
        }
    }
    for (int r = 0; r < nranks; r++) {
        int st = 0;
        while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {
        }
        if (expect_signal)
            CHECK(WIFSIGNALED(st) && WTERMSIG(st) == expect_signal,
                  "%s rank %d: status 0x%x, wanted signal %d", name, r, st, expect_signal);
        else
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s rank %d: status 0x%x", name, r, st);
    }
    printf("  %-22s %d rank(s) %6.2f s\n", name, nranks, now_s() - t0);
    fflush(stdout);
}

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, n) == 0 && p, "cudaMalloc(%zu)", n);
    return p;
}

static void h2d(void *d, const void *h, size_t n)
{
    CHECK(cudaMemcpy(d, h, n, H2D) == 0, "H2D copy");
}
static void d2h(void *h, const void *d, size_t n)
{
    CHECK(cudaMemcpy(h, d, n, D2H) == 0, "D2H copy");
}

/* ---- memory and devices ---- */

static void case_memory(int rank, int nranks)
{
    (void)rank, (void)nranks;
    int n = -1, v = 0;
    CHECK(cudaGetDeviceCount(&n) == 0 && n == 1, "device count %d", n);
    CHECK(cudaRuntimeGetVersion(&v) == 0 && v == 13000, "runtime version %d", v);
    CHECK(cudaFree(NULL) == 0, "cudaFree(NULL)");
    enum { N = 1000 };
    int host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = i * 3 + 1;
    char *d = dev_alloc(sizeof host), *d2 = dev_alloc(sizeof host);
    h2d(d, host, sizeof host);
    CHECK(cudaMemcpy(d2, d, sizeof host, D2D) == 0, "D2D copy");
    memset(back, 0, sizeof back);
    d2h(back, d2, sizeof back);
    CHECK(!memcmp(host, back, sizeof host), "round trip through device memory");
    /* wrong kinds and ranges are refused when enqueued */
    CHECK(cudaMemcpy(d, host, sizeof host, D2H) == 1, "D2H into device memory");
    CHECK(cudaMemcpy(back, host, sizeof host, H2D) == 1, "H2D into host memory");
    CHECK(cudaMemcpy(back, d, sizeof host, H2H) == 1, "H2H from device memory");
    CHECK(cudaMemcpy(d + 8, host, sizeof host, H2D) == 1, "H2D past the allocation's end");
    CHECK(cudaMemcpy(d, host, 4, 7) == 21, "invalid kind");
    CHECK(cudaGetLastError() == 21 && cudaGetLastError() == 0, "the last error is kept, then reset");
    /* interior pointers, the default kind, memset */
    CHECK(cudaMemcpy(d + 40, host, 8, DEFAULT) == 0, "H2D to an interior pointer, kind inferred");
    d2h(back, d, sizeof back);
    CHECK(back[10] == host[0] && back[11] == host[1] && back[12] == host[12], "interior copy landed");
    CHECK(cudaMemset(d + 4, 0xab, 4) == 0, "memset");
    d2h(back, d, 12);
    CHECK((unsigned)back[1] == 0xababababu && back[0] == host[0] && back[2] == host[2], "memset landed");
    /* what a pointer is */
    unsigned type = 99;
    int ord = 99;
    CHECK(cuInit(0) == 0, "cuInit");
    CHECK(cuPointerGetAttribute(&type, 2, (uintptr_t)d) == 0 && type == 2, "device memory type %u", type);
    CHECK(cuPointerGetAttribute(&type, 2, (uintptr_t)(d + 3999)) == 0 && type == 2, "interior pointer type");
    CHECK(cuPointerGetAttribute(&ord, 9, (uintptr_t)(d + 17)) == 0 && ord == 0, "device ordinal %d", ord);
    type = 99;
    CHECK(cuPointerGetAttribute(&type, 2, (uintptr_t)host) == 1 && type == 99, "pageable memory: an error");
    CHECK(cuPointerGetAttribute(&type, 2, (uintptr_t)(d + 4000)) == 1, "one past the end: an error");
    void *pinned = NULL;
    CHECK(cudaHostAlloc(&pinned, 4096, 0) == 0 && pinned, "cudaHostAlloc");
    CHECK(cuPointerGetAttribute(&type, 2, (uintptr_t)pinned) == 0 && type == 1, "pinned memory type %u",
          type);
    CHECK(cudaMemcpy(pinned, d, 64, D2H) == 0 && !memcmp(pinned, back, 4), "D2H into pinned memory");
    int attrs[2] = {2, 9};
    unsigned t2 = 99;
    int o2 = 99;
    void *data[2] = {&t2, &o2};
    CHECK(cuPointerGetAttributes(2, attrs, data, (uintptr_t)host) == 0 && t2 == 0,
          "attributes of pageable: 0");
    CHECK(cuPointerGetAttributes(2, attrs, data, (uintptr_t)(d + 8)) == 0 && t2 == 2 && o2 == 0,
          "attributes");
    CHECK(cudaFree(d + 8) == 1, "cudaFree of an interior pointer");
    CHECK(cudaFree(host) == 1, "cudaFree of host memory");
    CHECK(cudaFreeHost(pinned) == 0 && cudaFreeHost(pinned) == 1, "cudaFreeHost, twice");
    CHECK(cudaFree(d) == 0 && cudaFree(d2) == 0, "cudaFree");
    CHECK(cuPointerGetAttribute(&type, 2, (uintptr_t)d) == 1, "freed memory is unknown");
    void *z = (void *)1;
    CHECK(cudaMalloc(&z, 0) == 0 && !z, "zero bytes: NULL");
    CHECK(!strcmp(cudaGetErrorName(600), "cudaErrorNotReady") &&
              !strcmp(cudaGetErrorName(12345), "unknown error"),
          "error names");
    /* a child of a process that used CUDA cannot use it */
    pid_t pid = fork();
    if (pid == 0) {
        int c = 0;
        _exit(cudaGetDeviceCount(&c) == 3 ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "forked child: cudaErrorInitializationError");
}

static void case_segv(int rank, int nranks)
{
    (void)rank, (void)nranks;
    volatile char *d = dev_alloc(64);
    signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would turn the fault into an exit */
    char c = d[0];            /* the host touching device memory: must fault */
    fprintf(stderr, "read %d from device memory\n", c);
}

static void case_devices(int rank, int nranks)
{
    (void)rank, (void)nranks;
    int n = -1;
    char bus[32] = "";
    /* GPU_DOUBLE_DEVICES=4 CUDA_VISIBLE_DEVICES=2,0,7,1: 7 ends the list */
    CHECK(cudaGetDeviceCount(&n) == 0 && n == 2, "visible count %d", n);
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0) == 0 && !strcmp(bus, "00000000:12:00.0"), "bus of 0: %s",
          bus);
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 1) == 0 && !strcmp(bus, "00000000:10:00.0"), "bus of 1: %s",
          bus);
    CHECK(cudaSetDevice(2) == 101 && cudaSetDevice(1) == 0, "cudaSetDevice");
    int dev = -1;
    CHECK(cudaGetDevice(&dev) == 0 && dev == 1, "cudaGetDevice %d", dev);
    unsigned ord = 9;
    void *d = dev_alloc(16);
    CHECK(cuPointerGetAttribute(&ord, 9, (uintptr_t)d) == 0 && ord == 1, "allocated on device 1: %u", ord);
}

static void case_no_devices(int rank, int nranks)
{
    (void)rank, (void)nranks;
    int n = -1;
    CHECK(cudaGetDeviceCount(&n) == 100 && n == 0, "CUDA_VISIBLE_DEVICES='': %d devices", n);
}

static void case_no_driver(int rank, int nranks)
{
    (void)rank, (void)nranks;
    int n = -1, v = -1;
    void *p = NULL;
    CHECK(cudaGetDeviceCount(&n) == 35 && n == 0, "no driver: count %d", n);
    CHECK(cudaMalloc(&p, 16) == 35, "no driver: cudaMalloc");
    CHECK(cudaRuntimeGetVersion(&v) == 0 && v == 13000, "no driver: runtime version");
    CHECK(cudaDriverGetVersion(&v) == 0 && v == 0, "no driver: driver version %d", v);
    nccl_id_t id;
    void *comm;
    CHECK(ncclGetUniqueId(&id) == 0, "no driver: ncclGetUniqueId works");
    CHECK(ncclCommInitRank(&comm, 1, id, 0) == 1, "no driver: init is an unhandled CUDA error");
}

/* ---- streams, events, capture ---- */

/* With GPU_DOUBLE_DELAY_MS=40, the legacy stream is busy for 4 delayed operations while a
 * non-blocking stream's copy runs after one: without a wait it reads the old data. */
static void stale_or_fresh(int wait_event, int *out)
{
    enum { N = 256 };
    int fresh[N], zeros[N] = {0};
    for (int i = 0; i < N; i++)
        fresh[i] = i + 1;
    int *d = dev_alloc(sizeof fresh), *pinned;
    CHECK(cudaMallocHost((void **)&pinned, sizeof fresh) == 0, "cudaMallocHost");
    h2d(d, zeros, sizeof zeros);
    void *nb = NULL, *ev = NULL;
    CHECK(cudaStreamCreateWithFlags(&nb, 1) == 0 && cudaEventCreateWithFlags(&ev, 2) == 0, "stream, event");
    CHECK(cudaMemsetAsync(d, 0, sizeof zeros, NULL) == 0, "memset on legacy");
    CHECK(cudaMemsetAsync(d, 0, sizeof zeros, LEGACY) == 0, "memset on legacy");
    CHECK(cudaMemsetAsync(d, 0, sizeof zeros, (void *)0x2) == 0, "memset on per-thread (legacy here)");
    CHECK(cudaMemcpyAsync(d, fresh, sizeof fresh, H2D, NULL) == 0, "H2D on legacy");
    CHECK(cudaEventRecord(ev, NULL) == 0, "record on legacy");
    CHECK(cudaEventQuery(ev) == 600, "the event is not ready yet");
    if (wait_event) CHECK(cudaStreamWaitEvent(nb, ev, 0) == 0, "wait event");
    CHECK(cudaMemcpyAsync(pinned, d, sizeof fresh, D2H, nb) == 0, "D2H on the non-blocking stream");
    CHECK(cudaStreamSynchronize(nb) == 0, "sync");
    memcpy(out, pinned, sizeof fresh);
    CHECK(cudaEventSynchronize(ev) == 0 && cudaEventQuery(ev) == 0, "event done");
    CHECK(cudaStreamDestroy(nb) == 0 && cudaEventDestroy(ev) == 0, "destroy");
    CHECK(cudaStreamDestroy(nb) == 400 && cudaEventQuery(ev) == 400, "destroyed handles are invalid");
    CHECK(cudaFreeHost(pinned) == 0 && cudaFree(d) == 0, "free");
}

static void case_ordering(int rank, int nranks)
{
    (void)rank, (void)nranks;
    int out[256];
#ifndef __SANITIZE_THREAD__
    /* Two streams without a wait race by design, as on a GPU: ThreadSanitizer rightly reports it,
     * so its build (-DDPSHIM_SANITIZE=thread) checks only the ordered half. */
    stale_or_fresh(0, out);
    CHECK(out[0] == 0 && out[255] == 0, "no wait: stale data expected, got %d", out[0]);
#endif
    stale_or_fresh(1, out);
    CHECK(out[0] == 1 && out[255] == 256, "cudaStreamWaitEvent: fresh data expected, got %d", out[0]);

    /* The legacy stream waits for a blocking stream's earlier work, and the other way round. */
    enum { N = 64 };
    int fresh[N], back[N];
    for (int i = 0; i < N; i++)
        fresh[i] = 100 + i;
    int *d = dev_alloc(sizeof fresh);
    void *blk;
    CHECK(cudaStreamCreate(&blk) == 0, "blocking stream");
    CHECK(cudaMemsetAsync(d, 0, sizeof fresh, blk) == 0, "memset on blocking");
    CHECK(cudaMemcpyAsync(d, fresh, sizeof fresh, H2D, blk) == 0, "H2D on blocking");
    CHECK(cudaStreamQuery(blk) == 600 && cudaStreamQuery(NULL) == 600, "busy streams");
    d2h(back, d, sizeof back); /* cudaMemcpy: the legacy stream */
    CHECK(back[0] == 100 && back[N - 1] == 100 + N - 1, "legacy waited for the blocking stream: %d", back[0]);
    int *pinned;
    CHECK(cudaMallocHost((void **)&pinned, sizeof fresh) == 0, "pinned");
    CHECK(cudaMemsetAsync(d, 0x01, sizeof fresh, NULL) == 0, "memset on legacy");
    CHECK(cudaMemcpyAsync(pinned, d, sizeof fresh, D2H, blk) == 0, "D2H on blocking");
    CHECK(cudaStreamSynchronize(blk) == 0, "sync blocking");
    CHECK(pinned[0] == 0x01010101, "the blocking stream waited for legacy: 0x%x", (unsigned)pinned[0]);
    /* a stream destroyed with work queued still runs it */
    CHECK(cudaMemcpyAsync(d, fresh, sizeof fresh, H2D, blk) == 0 && cudaStreamDestroy(blk) == 0,
          "destroy busy");
    CHECK(cudaDeviceSynchronize() == 0, "device sync");
    CHECK(cudaFreeHost(pinned) == 0 && cudaFree(d) == 0, "free");
}

static void case_capture(int rank, int nranks)
{
    (void)rank, (void)nranks;
    int *d = dev_alloc(64), back[16], st = -1;
    void *blk = NULL, *nb = NULL, *graph = NULL;
    CHECK(cudaMemset(d, 0, 64) == 0 && cudaDeviceSynchronize() == 0, "memset (legacy stream), then sync");
    CHECK(cudaStreamCreate(&blk) == 0 && cudaStreamCreateWithFlags(&nb, 1) == 0, "streams");
    CHECK(cudaStreamBeginCapture(blk, 0) == 0, "begin capture");
    CHECK(cudaStreamIsCapturing(blk, &st) == 0 && st == 1, "capturing %d", st);
    CHECK(cudaMemsetAsync(d, 0x7f, 64, blk) == 0, "captured memset");
    CHECK(cudaStreamIsCapturing(NULL, &st) == 906, "legacy stream during a blocking capture");
    CHECK(cudaMemsetAsync(d, 1, 64, NULL) == 906, "legacy work during a blocking capture");
    CHECK(cudaStreamIsCapturing(blk, &st) == 0 && st == 2, "that invalidated the capture: %d", st);
    CHECK(cudaStreamEndCapture(blk, &graph) == 901 && !graph, "end of an invalidated capture");
    CHECK(cudaStreamBeginCapture(nb, 0) == 0, "capture on a non-blocking stream");
    CHECK(cudaStreamIsCapturing(NULL, &st) == 0 && st == 0, "the legacy stream is free");
    CHECK(cudaMemsetAsync(d, 0x7f, 64, nb) == 0, "captured memset");
    CHECK(cudaStreamEndCapture(nb, &graph) == 0 && graph, "end capture");
    CHECK(cudaGraphDestroy(graph) == 0, "graph destroy");
    CHECK(cudaStreamEndCapture(nb, &graph) == 401, "end without capture");
    d2h(back, d, sizeof back);
    CHECK(back[0] == 0 && back[15] == 0, "captured work did not run: 0x%x", (unsigned)back[0]);
}

/* ---- NCCL ---- */

/* Half precision: the compiler's _Float16 where it has one, an independent reference. */
#ifdef __FLT16_MAX__
static uint16_t f2h(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static float h2f(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}
#else
#include <math.h>
static float h2f(uint16_t u)
{
    int e = (u >> 10) & 0x1f, m = u & 0x3ff;
    float v = e ? ldexpf((float)(m | 0x400), e - 25) : ldexpf((float)m, -24);
    return u & 0x8000 ? -v : v;
}

static uint16_t f2h(float f) /* normal range only, which the tests stay in */
{
    int e;
    float m = frexpf(fabsf(f), &e);      /* f = m * 2^e, m in [0.5, 1) */
    float q = nearbyintf(ldexpf(m, 11)); /* 11 significant bits, rounded to even */
    if (q >= 2048.0f) q /= 2, e++;
    return (uint16_t)((f < 0 ? 0x8000 : 0) | (unsigned)(e + 14) << 10 | ((unsigned)q & 0x3ff));
}
#endif

/* A call on a non-blocking comm may return ncclInProgress (its init, and every collective as NCCL
 * from 2.23 on launches them on a thread of its own): done once ncclCommGetAsyncError no longer
 * says so, within 10 s. Its state then, or -1 where the poll itself failed. */
static int launched(int rc, void *comm)
{
    for (double t0 = now_s(); rc == 7 && now_s() - t0 < 10; usleep(1000))
        if (ncclCommGetAsyncError(comm, &rc)) return -1;
    return rc;
}

static int comm_blocking; /* how this process's last comm_init made its comm */

static void *comm_init(int rank, int nranks, int blocking)
{
    comm_blocking = blocking;
    void *comm = NULL;
    nccl_config_t cfg = {sizeof cfg, 0xcafebeef, 22809, blocking, {0}};
    int rc = ncclCommInitRankConfig(&comm, nranks, the_id, rank, &cfg);
    if (!blocking) {
        CHECK(rc == 7, "non-blocking init returns ncclInProgress: %d", rc);
        rc = launched(rc, comm);
    }
    CHECK(rc == 0, "rank %d init: %d (%s)", rank, rc, ncclGetLastError(comm));
    return comm;
}

static float in_f32(int r, size_t i)
{
    return (float)((i * 2654435761u + (size_t)r * 40503u) % 2000) / 7.0f - 100.0f;
}

/* One all-reduce on every rank: mine in, want out (bit for bit). */
static void allreduce_check(const char *what, void *comm, void *stream, int dtype, int op, size_t count,
                            size_t esz, const void *mine, const void *want, int in_place)
{
    size_t bytes = count * esz;
    void *ds = dev_alloc(bytes), *dr = in_place ? ds : dev_alloc(bytes);
    h2d(ds, mine, bytes);
    int rc = ncclAllReduce(ds, dr, count, dtype, op, comm, stream), blocking = comm_blocking;
    CHECK(blocking ? rc == 0 : rc == 7, "%s: enqueue %d on a %sblocking comm", what, rc,
          blocking ? "" : "non-");
    if (rc == 7)
        CHECK(ncclAllReduce(ds, dr, count, dtype, op, comm, stream) == 4 && ncclRedOpDestroy(op, comm) == 4,
              "%s: calls while one is in progress are refused", what);
    CHECK(launched(rc, comm) == 0, "%s: launched", what);
    CHECK(cudaStreamSynchronize(stream) == 0, "%s: sync", what);
    int st = -1;
    CHECK(ncclCommGetAsyncError(comm, &st) == 0 && st == 0, "%s: async error %d (%s)", what, st,
          ncclGetLastError(comm));
    unsigned char *out = malloc(bytes);
    d2h(out, dr, bytes);
    size_t bad = 0;
    while (bad < bytes && out[bad] == ((const unsigned char *)want)[bad])
        bad++;
    CHECK(bad == bytes, "%s: result differs at element %zu", what, bad / esz);
    free(out);
    cudaFree(ds);
    if (!in_place) cudaFree(dr);
}

static void case_allreduce(int rank, int nranks)
{
    CHECK(cudaSetDevice(rank) == 0, "set device");
    void *comm = comm_init(rank, nranks, rank % 2), *stream = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0, "stream");
    int n = 0;
    CHECK(ncclCommCount(comm, &n) == 0 && n == nranks && ncclCommUserRank(comm, &n) == 0 && n == rank &&
              ncclCommCuDevice(comm, &n) == 0 && n == rank,
          "comm queries");
    /* float32 sum, spanning two 4 MiB slots, and in place */
    size_t count = (4u << 20) / 4 + 1003;
    float *mine = malloc(count * 4), *want = malloc(count * 4);
    for (size_t i = 0; i < count; i++) {
        mine[i] = in_f32(rank, i);
        float acc = in_f32(0, i);
        for (int r = 1; r < nranks; r++)
            acc = acc + in_f32(r, i);
        want[i] = acc;
    }
    allreduce_check("f32 sum", comm, stream, NCCL_F32, SUM, count, 4, mine, want, 0);
    allreduce_check("f32 sum in place", comm, stream, NCCL_F32, SUM, 1000, 4, mine, want, 1);
    /* float32 premultiplied sum: each rank its own scalar */
    int op = -1;
    float scalar = 0.5f + (float)rank * 0.75f;
    CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, NCCL_F32, 1, comm) == 0 && op >= 5, "premulsum op %d", op);
    scalar = 99; /* read at creation (host immediate) */
    for (size_t i = 0; i < 1000; i++) {
        float acc = in_f32(0, i) * 0.5f;
        for (int r = 1; r < nranks; r++) {
            float term = in_f32(r, i) * (0.5f + (float)r * 0.75f);
            acc = acc + term;
        }
        want[i] = acc;
    }
    allreduce_check("f32 premulsum", comm, stream, NCCL_F32, op, 1000, 4, mine, want, 0);
    CHECK(ncclRedOpDestroy(op, comm) == 0 && ncclRedOpDestroy(op, comm) == 4, "op destroy, twice");
    /* float32 max and min */
    for (size_t i = 0; i < 1000; i++) {
        float mx = in_f32(0, i), mn = mx;
        for (int r = 1; r < nranks; r++) {
            mx = in_f32(r, i) > mx ? in_f32(r, i) : mx;
            mn = in_f32(r, i) < mn ? in_f32(r, i) : mn;
        }
        want[i] = mx, want[1000 + i] = mn;
    }
    allreduce_check("f32 max", comm, stream, NCCL_F32, MAX, 1000, 4, mine, want, 0);
    allreduce_check("f32 min", comm, stream, NCCL_F32, MIN, 1000, 4, mine, want + 1000, 0);
    /* float16: sum in float in rank order, rounded once; and a premultiplied sum */
    uint16_t hm[512], hw[512];
    for (int i = 0; i < 512; i++) {
        hm[i] = f2h(in_f32(rank, (size_t)i) / 16.0f);
        float acc = h2f(f2h(in_f32(0, (size_t)i) / 16.0f));
        for (int r = 1; r < nranks; r++)
            acc = acc + h2f(f2h(in_f32(r, (size_t)i) / 16.0f));
        hw[i] = f2h(acc);
    }
    allreduce_check("f16 sum", comm, stream, NCCL_F16, SUM, 512, 2, hm, hw, 0);
    uint16_t hscale = f2h(0.1f * (float)(rank + 1));
    CHECK(ncclRedOpCreatePreMulSum(&op, &hscale, NCCL_F16, 1, comm) == 0, "f16 premulsum op");
    for (int i = 0; i < 512; i++) {
        float acc = 0;
        for (int r = 0; r < nranks; r++) {
            float term = h2f(f2h(in_f32(r, (size_t)i) / 16.0f)) * h2f(f2h(0.1f * (float)(r + 1)));
            acc = r ? acc + term : term;
        }
        hw[i] = f2h(acc);
    }
    allreduce_check("f16 premulsum", comm, stream, NCCL_F16, op, 512, 2, hm, hw, 0);
    /* bfloat16 of small integers: exact sums */
    for (int i = 0; i < 512; i++) {
        float x = (float)((i + rank) % 50), sum = 0;
        uint32_t bits;
        memcpy(&bits, &x, 4);
        hm[i] = (uint16_t)(bits >> 16);
        for (int r = 0; r < nranks; r++)
            sum += (float)((i + r) % 50);
        memcpy(&bits, &sum, 4);
        hw[i] = (uint16_t)(bits >> 16);
    }
    allreduce_check("bf16 sum", comm, stream, NCCL_BF16, SUM, 512, 2, hm, hw, 0);
    /* int64 sums wrap; int32 average truncates */
    int64_t lm[300], lw[300];
    for (int i = 0; i < 300; i++) {
        lm[i] = (int64_t)((uint64_t)INT64_MAX - (uint64_t)i + (uint64_t)rank * 1000003u);
        uint64_t acc = 0;
        for (int r = 0; r < nranks; r++)
            acc += (uint64_t)INT64_MAX - (uint64_t)i + (uint64_t)r * 1000003u;
        lw[i] = (int64_t)acc;
    }
    allreduce_check("int64 sum", comm, stream, NCCL_INT64, SUM, 300, 8, lm, lw, 0);
    int32_t im[300], iw[300];
    for (int i = 0; i < 300; i++) {
        im[i] = i * 7 - 1000 + rank * 5;
        int32_t s = 0;
        for (int r = 0; r < nranks; r++)
            s += i * 7 - 1000 + r * 5;
        iw[i] = s / nranks;
    }
    allreduce_check("int32 avg", comm, stream, NCCL_INT32, AVG, 300, 4, im, iw, 0);
    /* float64 premultiplied sum, the scalar in device memory (read when the collective runs) */
    double dm[200], dw[200], dscale = 0.1 * (rank + 1);
    double *dscale_dev = dev_alloc(sizeof dscale);
    h2d(dscale_dev, &dscale, sizeof dscale);
    CHECK(ncclRedOpCreatePreMulSum(&op, dscale_dev, NCCL_F64, 0, comm) == 0, "device scalar op");
    for (int i = 0; i < 200; i++) {
        dm[i] = (double)in_f32(rank, (size_t)i) * 1.001;
        double acc = 0;
        for (int r = 0; r < nranks; r++) {
            double term = (double)in_f32(r, (size_t)i) * 1.001 * (0.1 * (r + 1));
            acc = r ? acc + term : term;
        }
        dw[i] = acc;
    }
    allreduce_check("f64 premulsum (device scalar)", comm, stream, NCCL_F64, op, 200, 8, dm, dw, 0);
    /* broadcast from the last rank, out of place and in place */
    int root = nranks - 1;
    int32_t *bd = dev_alloc(300 * 4), *br = dev_alloc(300 * 4);
    for (int i = 0; i < 300; i++)
        im[i] = rank == root ? i * 11 : -1, iw[i] = i * 11;
    h2d(bd, im, sizeof im);
    CHECK(launched(ncclBroadcast(bd, br, 300, NCCL_INT32, root, comm, stream), comm) == 0, "broadcast");
    CHECK(launched(ncclBcast(bd, 300, NCCL_INT32, root, comm, stream), comm) == 0, "bcast");
    CHECK(cudaStreamSynchronize(stream) == 0, "sync");
    d2h(im, br, sizeof im);
    CHECK(!memcmp(im, iw, sizeof im), "broadcast result");
    d2h(im, bd, sizeof im);
    CHECK(!memcmp(im, iw, sizeof im), "bcast result");
    /* argument errors come back at once */
    CHECK(ncclAllReduce(mine, br, 10, NCCL_INT32, SUM, comm, stream) == 4, "host send buffer");
    CHECK(ncclAllReduce(bd, br, 301, NCCL_INT32, SUM, comm, stream) == 4, "buffers too small");
    CHECK(ncclAllReduce(bd, br, 10, 42, SUM, comm, stream) == 4, "bad datatype");
    CHECK(ncclBroadcast(bd, br, 10, NCCL_INT32, nranks, comm, stream) == 4, "bad root");
    CHECK(ncclCommDestroy(comm) == 0, "destroy");
    /* its memory is gone, as in NCCL: a later use crashes (in a child, to see it) */
    pid_t child = fork();
    if (child == 0) {
        ncclCommCount(comm, &n);
        _exit(0);
    }
    int ws = 0;
    CHECK(child > 0 && waitpid(child, &ws, 0) == child && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT,
          "a destroyed comm's use crashes (status 0x%x)", ws);
    free(mine);
    free(want);
}

static void case_duplicate(int rank, int nranks)
{
    void *comm = NULL;
    int rc = ncclCommInitRank(&comm, nranks, the_id, rank);
    char want[128];
    snprintf(want, sizeof want, "Duplicate GPU detected : rank %d and rank %d both on CUDA device 10000",
             rank, 1 - rank);
    CHECK(rc == 5, "duplicate GPU: %d", rc);
    CHECK(!strcmp(ncclGetLastError(comm), want), "message: %s", ncclGetLastError(comm));
    CHECK(ncclCommAbort(comm) == 0, "abort");
}

static void case_hostid(int rank, int nranks)
{
    /* two ranks on one GPU, told apart by NCCL_HOSTID (as NCCL's duplicate check allows) */
    void *comm = comm_init(rank, nranks, 1), *stream = NULL;
    CHECK(cudaStreamCreate(&stream) == 0, "stream");
    float v = (float)rank + 1, *d = dev_alloc(4);
    h2d(d, &v, 4);
    CHECK(launched(ncclAllReduce(d, d, 1, NCCL_F32, SUM, comm, stream), comm) == 0, "all-reduce");
    CHECK(cudaStreamSynchronize(stream) == 0, "sync");
    d2h(&v, d, 4);
    CHECK(v == 3.0f, "sum %g", v);
    CHECK(ncclCommDestroy(comm) == 0, "destroy");
}

static void case_nonblocking(int rank, int nranks)
{
    CHECK(cudaSetDevice(rank) == 0, "set device");
    if (rank == 1) usleep(200 * 1000); /* rank 0 sees its init in progress meanwhile */
    void *comm = NULL, *stream = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0, "stream");
    nccl_config_t cfg = {sizeof cfg, 0xcafebeef, 22809, 0, {0}};
    CHECK(ncclCommInitRankConfig(&comm, nranks, the_id, rank, &cfg) == 7, "ncclInProgress");
    int st = -1;
    float *d = dev_alloc(64);
    if (rank == 0) {
        CHECK(ncclCommGetAsyncError(comm, &st) == 0 && st == 7, "still in progress: %d", st);
        CHECK(ncclAllReduce(d, d, 4, NCCL_F32, SUM, comm, stream) == 4, "collective before init completes");
    }
    for (double t0 = now_s(); st != 0 && now_s() - t0 < 5; usleep(1000))
        ncclCommGetAsyncError(comm, &st);
    CHECK(st == 0, "init completed: %d", st);
    CHECK(launched(ncclAllReduce(d, d, 4, NCCL_F32, SUM, comm, stream), comm) == 0 &&
              cudaStreamSynchronize(stream) == 0,
          "works");
    CHECK(ncclCommDestroy(comm) == 0, "destroy");
}

static void case_stall(int rank, int nranks)
{
    /* GPU_DOUBLE_STALL_RANK=1 GPU_DOUBLE_STALL_AT=2: rank 1's second collective hangs */
    CHECK(cudaSetDevice(rank) == 0, "set device");
    void *comm = comm_init(rank, nranks, 1), *stream = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0, "stream");
    float *d = dev_alloc(64);
    CHECK(cudaMemset(d, 0, 64) == 0 && cudaDeviceSynchronize() == 0, "memset (legacy stream), then sync");
    CHECK(launched(ncclAllReduce(d, d, 16, NCCL_F32, SUM, comm, stream), comm) == 0 &&
              cudaStreamSynchronize(stream) == 0,
          "first");
    CHECK(launched(ncclAllReduce(d, d, 16, NCCL_F32, SUM, comm, stream), comm) == 0,
          "second: enqueued, the host is free");
    usleep(100 * 1000);
    CHECK(cudaStreamQuery(stream) == 600, "rank %d: the second collective hangs", rank);
    int st = -1;
    if (rank == 1) {
        /* abort only once rank 0 has seen its collective hang too */
        for (double t0 = now_s(); !shared[0] && now_s() - t0 < 10; usleep(1000)) {
        }
        CHECK(ncclCommGetAsyncError(comm, &st) == 0 && st == 0, "no error seen while stalled: %d", st);
        double t0 = now_s();
        CHECK(ncclCommAbort(comm) == 0, "abort");
        CHECK(cudaStreamSynchronize(stream) == 0, "the stalled operation ended");
        CHECK(now_s() - t0 < 2, "abort and the stream's end took %.2f s", now_s() - t0);
    } else {
        shared[0] = 1;
        for (double t0 = now_s(); st != 6 && now_s() - t0 < 5; usleep(2000))
            ncclCommGetAsyncError(comm, &st);
        CHECK(st == 6, "the peer of an aborted rank sees ncclRemoteError: %d", st);
        CHECK(cudaStreamSynchronize(stream) == 0, "its collective ended");
        CHECK(ncclCommAbort(comm) == 0, "abort");
    }
}

static void case_exit_stalled(int rank, int nranks)
{
    /* GPU_DOUBLE_STALL_RANK=0: the process exits with its stream stuck in a collective */
    void *comm = comm_init(rank, nranks, 1), *stream = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0, "stream");
    float *d = dev_alloc(64);
    CHECK(launched(ncclAllReduce(d, d, 16, NCCL_F32, SUM, comm, stream), comm) == 0, "enqueue");
    CHECK(launched(ncclAllReduce(d, d, 16, NCCL_F32, SUM, comm, stream), comm) == 0,
          "and one queued behind it");
    usleep(50 * 1000);
    CHECK(cudaStreamQuery(stream) == 600, "stalled");
    pid_t pid = fork();
    if (pid == 0) {
        void *c2 = NULL;
        _exit(ncclCommCount(comm, &(int){0}) == 4 && ncclAllReduce(d, d, 16, NCCL_F32, SUM, comm, c2) == 4
                  ? 0
                  : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a forked child cannot use its parent's communicator");
}

static void case_async_error(int rank, int nranks)
{
    /* GPU_DOUBLE_ASYNC_ERROR_RANK=0 GPU_DOUBLE_ASYNC_ERROR_AT=2 */
    CHECK(cudaSetDevice(rank) == 0, "set device");
    void *comm = comm_init(rank, nranks, 0), *stream = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0, "stream");
    float one[4] = {1, 1, 1, 1}, back[4];
    float *d = dev_alloc(16), *r = dev_alloc(16);
    h2d(d, one, 16);
    CHECK(cudaMemset(r, 0, 16) == 0 && cudaDeviceSynchronize() == 0, "memset (legacy stream), then sync");
    CHECK(launched(ncclAllReduce(d, r, 4, NCCL_F32, SUM, comm, stream), comm) == 0 &&
              cudaStreamSynchronize(stream) == 0,
          "first");
    CHECK(cudaMemset(r, 0, 16) == 0 && cudaDeviceSynchronize() == 0, "memset (legacy stream), then sync");
    /* in progress on this non-blocking comm; its failure may already show at the first poll */
    CHECK(ncclAllReduce(d, r, 4, NCCL_F32, SUM, comm, stream) == 7, "second: in progress");
    int st = -1;
    for (double t0 = now_s(); (st == 0 || st == -1 || st == 7) && now_s() - t0 < 5; usleep(2000))
        ncclCommGetAsyncError(comm, &st);
    CHECK(cudaStreamSynchronize(stream) == 0, "the failed collective's operation completes");
    CHECK(st == (rank == 0 ? 2 : 6), "rank %d: async error %d", rank, st);
    if (rank == 0)
        CHECK(!strcmp(ncclGetLastError(comm), "test double: injected asynchronous failure in collective #2"),
              "message: %s", ncclGetLastError(comm));
    d2h(back, r, 16);
    CHECK(back[0] == 0, "no result written: %g", back[0]);
    CHECK(ncclAllReduce(d, r, 4, NCCL_F32, SUM, comm, stream) == st, "a failed comm refuses collectives");
    CHECK(ncclCommAbort(comm) == 0, "abort");
}

static void case_init_fail(int rank, int nranks)
{
    /* GPU_DOUBLE_INIT_FAIL_RANK=1 */
    CHECK(cudaSetDevice(rank) == 0, "set device");
    void *comm = NULL;
    int rc = ncclCommInitRank(&comm, nranks, the_id, rank);
    CHECK(rc == (rank == 1 ? 2 : 6), "rank %d: init %d", rank, rc);
    if (rank == 1)
        CHECK(!strcmp(ncclGetLastError(comm), "test double: injected init failure"), "%s",
              ncclGetLastError(comm));
    CHECK(ncclCommAbort(comm) == 0, "abort");
}

static void case_mismatch(int rank, int nranks)
{
    CHECK(cudaSetDevice(rank) == 0, "set device");
    void *comm = comm_init(rank, nranks, 1), *stream = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0, "stream");
    float *d = dev_alloc(64);
    CHECK(cudaMemset(d, 0, 64) == 0 && cudaDeviceSynchronize() == 0, "memset (legacy stream), then sync");
    CHECK(launched(ncclAllReduce(d, d, rank ? 12 : 10, NCCL_F32, SUM, comm, stream), comm) == 0, "enqueue");
    CHECK(cudaStreamSynchronize(stream) == 0, "sync");
    int st = -1;
    CHECK(ncclCommGetAsyncError(comm, &st) == 0 && st == 5, "mismatch: %d", st);
    const char *msg = ncclGetLastError(comm);
    CHECK(strstr(msg, "AllReduce(count=10, float32, sum)") &&
              strstr(msg, "AllReduce(count=12, float32, sum)"),
          "message names both: %s", msg);
    CHECK(ncclCommAbort(comm) == 0, "abort");
    /* a pre-multiplied sum on one rank meets a plain sum on the other: NCCL picks algorithms
     * from the operation, so this too is a disagreement (a new id: one id serves one comm) */
    the_id.internal[0] ^= 1;
    comm = comm_init(rank, nranks, 1);
    int op = SUM;
    float scale = 0.5f;
    CHECK(rank == 0 || ncclRedOpCreatePreMulSum(&op, &scale, NCCL_F32, 1, comm) == 0, "premulsum op");
    CHECK(launched(ncclAllReduce(d, d, 10, NCCL_F32, op, comm, stream), comm) == 0, "enqueue");
    CHECK(cudaStreamSynchronize(stream) == 0, "sync");
    CHECK(ncclCommGetAsyncError(comm, &st) == 0 && st == 5, "sum against premulsum: %d", st);
    msg = ncclGetLastError(comm);
    CHECK(strstr(msg, "float32, sum)") && strstr(msg, "float32, premulsum)"), "message names both: %s", msg);
    CHECK(ncclCommAbort(comm) == 0, "abort");
}

static void case_lost_peer_shrink(int rank, int nranks)
{
    /* 3 ranks, rank 2's process ends after the first collective: the others' second one never
     * completes, until a shrink with NCCL_SHRINK_ABORT ends it and makes the comm of the two */
    CHECK(cudaSetDevice(rank) == 0, "set device");
    void *comm = comm_init(rank, nranks, 0), *stream = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0, "stream");
    float v = (float)(rank + 1), back = 0, *d = dev_alloc(4);
    h2d(d, &v, 4);
    CHECK(launched(ncclAllReduce(d, d, 1, NCCL_F32, SUM, comm, stream), comm) == 0 &&
              cudaStreamSynchronize(stream) == 0,
          "first");
    if (rank == 2) _exit(0); /* gone without a word, as a killed process */
    CHECK(launched(ncclAllReduce(d, d, 1, NCCL_F32, SUM, comm, stream), comm) == 0, "second: launched");
    usleep(300 * 1000);
    int st = -1;
    CHECK(cudaStreamQuery(stream) == 600 && ncclCommGetAsyncError(comm, &st) == 0 && st == 0,
          "rank %d: the second hangs, and NCCL reports nothing: %d", rank, st);
    void *child = NULL;
    int lost[1] = {2}, self[1] = {rank};
    CHECK(ncclCommShrink(comm, self, 1, &child, NULL, 1) == 4, "excluding itself is refused");
    CHECK(ncclCommShrink(comm, lost, 1, &child, NULL, 0) == 5 && strstr(ncclGetLastError(comm), "#2"),
          "without NCCL_SHRINK_ABORT, the stuck collective is named: %s", ncclGetLastError(comm));
    CHECK(ncclCommShrink(comm, lost, 1, &child, NULL, 1) == 7, "with it: in progress (non-blocking parent)");
    CHECK(cudaStreamSynchronize(stream) == 0, "the stuck collective ended");
    /* as NCCL: the parent's state says when the child is done, and only then is its handle set */
    CHECK(launched(7, comm) == 0 && child != NULL, "the child's init completed: %p", child);
    CHECK(launched(7, child) == 0, "the child is ready");
    int n = 0, me = -1;
    CHECK(ncclCommCount(child, &n) == 0 && n == 2 && ncclCommUserRank(child, &me) == 0 && me == rank,
          "2 ranks, renumbered: %d, %d", n, me);
    v = 10.0f * (float)(rank + 1);
    h2d(d, &v, 4);
    CHECK(launched(ncclAllReduce(d, d, 1, NCCL_F32, SUM, child, stream), child) == 0 &&
              cudaStreamSynchronize(stream) == 0,
          "a collective of the two");
    d2h(&back, d, 4);
    CHECK(back == 30.0f, "rank %d: the two ranks' sum %g", rank, back);
    CHECK(ncclCommAbort(comm) == 0 && ncclCommDestroy(child) == 0, "abort the parent, destroy the child");
}

static char trace_path[64];

static void case_trace(int rank, int nranks)
{
    /* one rank, GPU_DOUBLE_TRACE set: the order of calls is visible */
    void *comm = comm_init(rank, nranks, 1), *stream = NULL, *ev = NULL;
    CHECK(cudaStreamCreateWithFlags(&stream, 1) == 0 && cudaEventCreate(&ev) == 0, "stream, event");
    float v = 2.5f, *d = dev_alloc(4);
    h2d(d, &v, 4);
    CHECK(cudaEventRecord(ev, NULL) == 0 && cudaStreamWaitEvent(stream, ev, 0) == 0, "record, wait");
    CHECK(launched(ncclAllReduce(d, d, 1, NCCL_F32, SUM, comm, stream), comm) == 0 &&
              cudaStreamSynchronize(stream) == 0,
          "one rank");
    d2h(&v, d, 4);
    CHECK(v == 2.5f, "one rank's sum %g", v);
    CHECK(ncclCommDestroy(comm) == 0, "destroy");
    FILE *f = fopen(trace_path, "r");
    char line[600];
    int wait_at = -1, reduce_at = -1, n = 0, pid_ok = 1;
    char pid[16];
    snprintf(pid, sizeof pid, "%d ", (int)getpid());
    while (f && fgets(line, sizeof line, f)) {
        pid_ok &= !strncmp(line, pid, strlen(pid));
        if (strstr(line, " cudaStreamWaitEvent ") && wait_at < 0) wait_at = n;
        if (strstr(line, " ncclAllReduce ") && reduce_at < 0) reduce_at = n;
        n++;
    }
    if (f) fclose(f);
    CHECK(wait_at >= 0 && reduce_at > wait_at, "trace order: wait at line %d, all-reduce at %d", wait_at,
          reduce_at);
    CHECK(pid_ok, "every line starts with the pid");
}

int main(void)
{
    if (load()) return 1;
    shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* one object whichever soname is opened */
    char path[512];
    snprintf(path, sizeof path, "%s", DPS_DOUBLE_PATH);
    char *slash = strrchr(path, '/');
    for (const char *const *so =
             (const char *const[]){"libcudart.so.13", "libcuda.so.1", "libnccl.so.2", NULL};
         *so; so++) {
        snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "%s", *so);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        CHECK(h == lib, "%s is the same object", *so);
        if (h) dlclose(h);
    }
    CHECK(!dlsym(lib, "dps_dbl_conf") && !dlsym(lib, "dps_dbl_reduce"), "internal symbols are hidden");
    int v = 0;
    CHECK(ncclGetVersion(&v) == 0 && v == 22809, "NCCL version %d", v);

    run_ranks("memory", 1, NULL, case_memory, 0);
    run_ranks("segv", 1, NULL, case_segv, SIGSEGV);
    run_ranks("devices", 1,
              (const char *const[]){"GPU_DOUBLE_DEVICES=4", "CUDA_VISIBLE_DEVICES=2, 0,7,1", NULL},
              case_devices, 0);
    run_ranks("no devices", 1, (const char *const[]){"CUDA_VISIBLE_DEVICES=", NULL}, case_no_devices, 0);
    run_ranks("no driver", 1, (const char *const[]){"GPU_DOUBLE_NO_DRIVER=1", NULL}, case_no_driver, 0);
    run_ranks("ordering", 1, (const char *const[]){"GPU_DOUBLE_DELAY_MS=40", NULL}, case_ordering, 0);
    run_ranks("capture", 1, NULL, case_capture, 0);
    const char *const four[] = {"GPU_DOUBLE_DEVICES=4", NULL};
    run_ranks("all-reduce", 2, four, case_allreduce, 0);
    run_ranks("all-reduce", 3, four, case_allreduce, 0);
    run_ranks("duplicate GPU", 2, NULL, case_duplicate, 0);
    run_ranks("NCCL_HOSTID", 2, (const char *const[]){"NCCL_HOSTID=host%d", NULL}, case_hostid, 0);
    run_ranks("non-blocking init", 2, four, case_nonblocking, 0);
    run_ranks("stall and abort", 2,
              (const char *const[]){"GPU_DOUBLE_DEVICES=4", "GPU_DOUBLE_STALL_RANK=1",
                                    "GPU_DOUBLE_STALL_AT=2", NULL},
              case_stall, 0);
    double t0 = now_s();
    run_ranks("exit while stalled", 1, (const char *const[]){"GPU_DOUBLE_STALL_RANK=0", NULL},
              case_exit_stalled, 0);
    CHECK(now_s() - t0 < 2, "exit while stalled took %.2f s", now_s() - t0);
    run_ranks("async error", 3,
              (const char *const[]){"GPU_DOUBLE_DEVICES=4", "GPU_DOUBLE_ASYNC_ERROR_RANK=0",
                                    "GPU_DOUBLE_ASYNC_ERROR_AT=2", NULL},
              case_async_error, 0);
    run_ranks("init failure", 2,
              (const char *const[]){"GPU_DOUBLE_DEVICES=4", "GPU_DOUBLE_INIT_FAIL_RANK=1", NULL},
              case_init_fail, 0);
    run_ranks("shape mismatch", 2, four, case_mismatch, 0);
    run_ranks("lost peer, shrink", 3, four, case_lost_peer_shrink, 0);
    snprintf(trace_path, sizeof trace_path, "/tmp/dpshim-double-trace-%d", (int)getpid());
    char trace_env[96];
    snprintf(trace_env, sizeof trace_env, "GPU_DOUBLE_TRACE=%s", trace_path);
    run_ranks("trace", 1, (const char *const[]){trace_env, NULL}, case_trace, 0);
    unlink(trace_path);
    return check_report("test_gpu_double");
}
