/* libdpshim-nccl.so: the CUDA runtime and NCCL behind dps_device_t (plugin_abi/device.h). Both
 * are opened with dlopen, the program's own copies first (RTLD_NOLOAD), so the plugin builds
 * without the CUDA toolkit and a framework's libraries are shared, not loaded twice. One device
 * per process: a communication stream (non-blocking: it never waits for the legacy stream by
 * itself), the fusion bucket, a pool of events, and one NCCL communicator. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plugin_abi/device.h"
#include "core/dtype.h"
#include "cuda_api.h"
#include "dpshim/hooks.h"

#define EXPORT __attribute__((visibility("default")))

/* One row per function: its name and where the pointer goes. The runtime's are required;
 * NCCL's are all-or-nothing (has_nccl). */
static struct {
    dps_cudaError_t (*RuntimeGetVersion)(int *);
    dps_cudaError_t (*DriverGetVersion)(int *);
    const char *(*GetErrorString)(dps_cudaError_t);
    dps_cudaError_t (*GetDeviceCount)(int *);
    dps_cudaError_t (*GetDevice)(int *);
    dps_cudaError_t (*SetDevice)(int);
    dps_cudaError_t (*DeviceGetPCIBusId)(char *, int, int);
    dps_cudaError_t (*Malloc)(void **, size_t);
    dps_cudaError_t (*Free)(void *);
    dps_cudaError_t (*Memcpy)(void *, const void *, size_t, int);
    dps_cudaError_t (*HostAlloc)(void **, size_t, unsigned);
    dps_cudaError_t (*StreamCreateWithFlags)(dps_cudaStream_t *, unsigned);
    dps_cudaError_t (*StreamWaitEvent)(dps_cudaStream_t, dps_cudaEvent_t, unsigned);
    dps_cudaError_t (*StreamIsCapturing)(dps_cudaStream_t, int *);
    dps_cudaError_t (*ThreadExchangeStreamCaptureMode)(int *);
    dps_cudaError_t (*EventCreateWithFlags)(dps_cudaEvent_t *, unsigned);
    dps_cudaError_t (*EventRecord)(dps_cudaEvent_t, dps_cudaStream_t);
    dps_cudaError_t (*EventQuery)(dps_cudaEvent_t);
    dps_cudaError_t (*MemcpyAsync)(void *, const void *, size_t, int, dps_cudaStream_t);
    dps_cudaError_t (*MemsetAsync)(void *, int, size_t, dps_cudaStream_t);
} cu;

static struct {
    dps_ncclResult_t (*GetVersion)(int *);
    const char *(*GetErrorString)(dps_ncclResult_t);
    const char *(*GetLastError)(dps_ncclComm_t);
    dps_ncclResult_t (*GetUniqueId)(dps_ncclUniqueId *);
    dps_ncclResult_t (*CommInitRankConfig)(dps_ncclComm_t *, int, dps_ncclUniqueId, int, dps_ncclConfig_t *);
    dps_ncclResult_t (*CommGetAsyncError)(dps_ncclComm_t, dps_ncclResult_t *);
    dps_ncclResult_t (*CommAbort)(dps_ncclComm_t);
    dps_ncclResult_t (*CommFinalize)(dps_ncclComm_t);
    dps_ncclResult_t (*CommDestroy)(dps_ncclComm_t);
    dps_ncclResult_t (*AllReduce)(const void *, void *, size_t, dps_ncclDataType_t, dps_ncclRedOp_t,
                                  dps_ncclComm_t, dps_cudaStream_t);
    dps_ncclResult_t (*Broadcast)(const void *, void *, size_t, dps_ncclDataType_t, int, dps_ncclComm_t,
                                  dps_cudaStream_t);
    dps_ncclResult_t (*RedOpCreatePreMulSum)(dps_ncclRedOp_t *, void *, dps_ncclDataType_t, int,
                                             dps_ncclComm_t);
    dps_ncclResult_t (*RedOpDestroy)(dps_ncclRedOp_t, dps_ncclComm_t);
    /* NCCL 2.27+, optional: the communicator of the ranks left after a loss */
    dps_ncclResult_t (*CommShrink)(dps_ncclComm_t, int *, int, dps_ncclComm_t *, dps_ncclConfig_t *, int);
} nc;

static const dps_sym_row_t cuda_syms[] = {
    {"cudaRuntimeGetVersion", (void **)&cu.RuntimeGetVersion},
    {"cudaDriverGetVersion", (void **)&cu.DriverGetVersion},
    {"cudaGetErrorString", (void **)&cu.GetErrorString},
    {"cudaGetDeviceCount", (void **)&cu.GetDeviceCount},
    {"cudaGetDevice", (void **)&cu.GetDevice},
    {"cudaSetDevice", (void **)&cu.SetDevice},
    {"cudaDeviceGetPCIBusId", (void **)&cu.DeviceGetPCIBusId},
    {"cudaMalloc", (void **)&cu.Malloc},
    {"cudaFree", (void **)&cu.Free},
    {"cudaMemcpy", (void **)&cu.Memcpy},
    {"cudaHostAlloc", (void **)&cu.HostAlloc},
    {"cudaStreamCreateWithFlags", (void **)&cu.StreamCreateWithFlags},
    {"cudaStreamWaitEvent", (void **)&cu.StreamWaitEvent},
    {"cudaStreamIsCapturing", (void **)&cu.StreamIsCapturing},
    {"cudaThreadExchangeStreamCaptureMode", (void **)&cu.ThreadExchangeStreamCaptureMode},
    {"cudaEventCreateWithFlags", (void **)&cu.EventCreateWithFlags},
    {"cudaEventRecord", (void **)&cu.EventRecord},
    {"cudaEventQuery", (void **)&cu.EventQuery},
    {"cudaMemcpyAsync", (void **)&cu.MemcpyAsync},
    {"cudaMemsetAsync", (void **)&cu.MemsetAsync},
};

static const dps_sym_row_t nccl_syms[] = {
    {"ncclGetVersion", (void **)&nc.GetVersion},
    {"ncclGetErrorString", (void **)&nc.GetErrorString},
    {"ncclGetLastError", (void **)&nc.GetLastError},
    {"ncclGetUniqueId", (void **)&nc.GetUniqueId},
    {"ncclCommInitRankConfig", (void **)&nc.CommInitRankConfig},
    {"ncclCommGetAsyncError", (void **)&nc.CommGetAsyncError},
    {"ncclCommAbort", (void **)&nc.CommAbort},
    {"ncclCommFinalize", (void **)&nc.CommFinalize},
    {"ncclCommDestroy", (void **)&nc.CommDestroy},
    {"ncclAllReduce", (void **)&nc.AllReduce},
    {"ncclBroadcast", (void **)&nc.Broadcast},
    {"ncclRedOpCreatePreMulSum", (void **)&nc.RedOpCreatePreMulSum},
    {"ncclRedOpDestroy", (void **)&nc.RedOpDestroy},
};

/* The process's device state. `dev` and the stream are set once, under `lock`; work is queued
 * by the main thread only (the hooks' contract), while the guard's watchdog looks at it (peek)
 * and abort() may come from the guard. `comm` is read and used under comm_mu only. */
static struct {
    pthread_mutex_t lock;
    int dev; /* -1 until use() */
    dps_cudaStream_t stream;
    void *bucket;
    size_t bucket_bytes;
    dps_ncclComm_t comm;
    atomic_int aborted;
    char nccl_path[512];
} st = {.lock = PTHREAD_MUTEX_INITIALIZER, .dev = -1};

/* One call at a time on the communicator, as ProcessGroupNCCL does: NCCL's is not thread-safe
 * (2.28's ncclCommGetAsyncError joins and frees the pending launch job, src/init.cc), and abort
 * frees it, so the handle is cleared under the same lock. The watchdog only tries it. */
static pthread_mutex_t comm_mu = PTHREAD_MUTEX_INITIALIZER;
#define COMM_GONE (-1) /* what a call on the communicator "returns" once abort took it away */
#define ON_COMM(r, call)                                                                                     \
    do {                                                                                                     \
        pthread_mutex_lock(&comm_mu);                                                                        \
        (r) = st.comm ? (call) : COMM_GONE;                                                                  \
        pthread_mutex_unlock(&comm_mu);                                                                      \
    } while (0)

static __thread char err_text[512];
static __thread int err_from_peer; /* the last failure was NCCL saying a peer failed */
static __thread int err_unloading; /* the last failure was the CUDA runtime already torn down */

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_text, sizeof err_text, fmt, ap);
    va_end(ap);
    err_from_peer = err_unloading = 0;
    return -1;
}

static int cuda_ok(dps_cudaError_t e, const char *what)
{
    if (e == DPS_cudaSuccess) return 0;
    fail("%s: CUDA error %d (%s)", what, e, cu.GetErrorString ? cu.GetErrorString(e) : "?");
    err_unloading = e == DPS_cudaErrorCudartUnloading;
    return -1;
}

/* NCCL's error r on comm, with NCCL's own last words about it: -1. */
static int nccl_failed(dps_ncclComm_t comm, dps_ncclResult_t r, const char *what)
{
    const char *detail = comm && nc.GetLastError ? nc.GetLastError(comm) : "";
    fail("%s: NCCL error %d (%s)%s%s", what, r, nc.GetErrorString ? nc.GetErrorString(r) : "?",
         detail && detail[0] ? ": " : "", detail ? detail : "");
    err_from_peer = r == DPS_ncclRemoteError;
    return -1;
}

static int nccl_ok(dps_ncclResult_t r, const char *what)
{
    return r == DPS_ncclSuccess ? 0 : nccl_failed(st.comm, r, what);
}

static char notice_text[1024]; /* what the user is told about how a library was chosen */

/* The file a handle was loaded from. */
static const char *loaded_from(void *h)
{
    struct link_map *lm = NULL;
    return dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0] ? lm->l_name : "?";
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The program's copy first, then ours: `names` in order, or the user's path alone. A program
 * that already holds NCCL (`one_copy`) keeps it even against the user's path: NCCL's API
 * functions are weak default-visible symbols that NCCL calls itself (ncclCommEnsureReady calls
 * ncclCommGetAsyncError before every collective), so a second copy reaches the first copy's code
 * with its own communicator, and every collective fails with "invalid argument". */
static void *open_lib(const char *env, const char *const *names, int one_copy, char *which, size_t len)
{
    const char *user = getenv(env);
    int named = user && user[0];
    void *program = NULL;
    for (const char *const *n = names; *n && !program && (one_copy || !named); n++)
        program = dlopen(*n, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (named && !program) {
        snprintf(which, len, "%s", user);
        return dlopen(user, RTLD_NOW | RTLD_GLOBAL);
    }
    if (program) {
        const char *path = loaded_from(program);
        snprintf(which, len, "%s, the program's", path);
        if (named && !same_file(user, path))
            snprintf(notice_text, sizeof notice_text,
                     "%s names %s, but the program already has NCCL loaded (%s): that one is used, as two "
                     "copies of NCCL in one process call into each other and fail; unset %s, or point it "
                     "to the program's",
                     env, user, path, env);
        return program;
    }
    for (const char *const *n = names; *n; n++) {
        void *h = dlopen(*n, RTLD_NOW | RTLD_GLOBAL);
        if (h) {
            snprintf(which, len, "%s", *n);
            return h;
        }
    }
    snprintf(which, len, "%s", names[0]);
    return NULL;
}

static const char *notice(void)
{
    return notice_text[0] ? notice_text : NULL;
}

static char versions_text[1536];

static void append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void append(const char *fmt, ...)
{
    size_t len = strlen(versions_text);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(versions_text + len, sizeof versions_text - len, fmt, ap);
    va_end(ap);
}

static const char *versions(void)
{
    return versions_text;
}
static const char *last_error(void)
{
    return err_text;
}
static int peer_failed(void)
{
    return err_from_peer;
}
static int has_nccl(void)
{
    return nc.AllReduce != NULL;
}
static int ngpus;
static int count(void)
{
    return ngpus;
}

static int use(int dev)
{
    int prev = -1;
    if (cuda_ok(cu.GetDevice(&prev), "cudaGetDevice")) return -1;
    pthread_mutex_lock(&st.lock);
    int rc = 0;
    if (st.dev >= 0 && st.dev != dev)
        rc = fail("a tensor on CUDA device %d, while this process reduces on device %d: dpshim serves one "
                  "device per rank (start one rank per GPU)",
                  dev, st.dev);
    if (!rc && prev != dev) rc = cuda_ok(cu.SetDevice(dev), "cudaSetDevice");
    if (!rc && !st.stream) {
        /* non-blocking: the stream never waits for the legacy stream by itself, only where
         * after() says so, and the legacy stream's users never wait for it */
        rc = cuda_ok(cu.StreamCreateWithFlags(&st.stream, DPS_cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags");
        if (!rc) st.dev = dev;
    }
    pthread_mutex_unlock(&st.lock);
    return rc ? -1 : prev;
}

static void restore(int prev)
{
    int cur = -1;
    if (prev >= 0 && cu.GetDevice(&cur) == DPS_cudaSuccess && cur != prev) cu.SetDevice(prev);
}

/* NCCL's host hash: NCCL_HOSTID when set, else the host name and the boot id. */
static unsigned long long host_hash(void)
{
    char text[512] = "";
    const char *id = getenv("NCCL_HOSTID");
    if (id && id[0])
        snprintf(text, sizeof text, "%s", id);
    else {
        gethostname(text, 256);
        text[255] = 0;
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        size_t n = strlen(text);
        if (f) {
            if (fgets(text + n, (int)(sizeof text - n), f)) text[strcspn(text, "\n")] = 0;
            fclose(f);
        }
    }
    unsigned long long h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = text; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

static int key(char *out, size_t len)
{
    char bus[64];
    if (cuda_ok(cu.DeviceGetPCIBusId(bus, sizeof bus, st.dev), "cudaDeviceGetPCIBusId")) return -1;
    snprintf(out, len, "%016llx %s", host_hash(), bus);
    return 0;
}

static void *bucket(size_t bytes)
{
    if (st.bucket && st.bucket_bytes >= bytes) return st.bucket;
    void *p = NULL;
    if (cuda_ok(cu.Malloc(&p, bytes), "cudaMalloc of the fusion bucket")) return NULL;
    st.bucket = p, st.bucket_bytes = bytes; /* made once per job: bucket_mb does not change */
    return p;
}

static void *alloc(size_t bytes)
{
    void *p = NULL;
    return cuda_ok(cu.Malloc(&p, bytes), "cudaMalloc") ? NULL : p;
}

static void release_memory(void *p)
{
    if (p) cu.Free(p);
}

/* Synchronous, on the legacy stream: not behind the communication stream's work (which may hold
 * a collective stuck on a lost rank). */
static int read_back(void *host, const void *dev, size_t bytes)
{
    return cuda_ok(cu.Memcpy(host, dev, bytes, DPS_cudaMemcpyDeviceToHost), "cudaMemcpy");
}

static void *pinned(size_t bytes)
{
    void *p = NULL;
    return cuda_ok(cu.HostAlloc(&p, bytes, DPS_cudaHostAllocDefault), "cudaHostAlloc") ? NULL : p;
}

/* Events, reused: markers are freed by wait(). */
typedef struct ev_node {
    dps_cudaEvent_t ev;
    struct ev_node *next;
} ev_node_t;
static ev_node_t *free_events;
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;

static ev_node_t *event_get(void)
{
    pthread_mutex_lock(&ev_lock);
    ev_node_t *n = free_events;
    if (n) free_events = n->next;
    pthread_mutex_unlock(&ev_lock);
    if (n) return n;
    if (!(n = calloc(1, sizeof *n))) return fail("out of memory for a CUDA event"), NULL;
    if (cuda_ok(cu.EventCreateWithFlags(&n->ev, DPS_cudaEventDisableTiming), "cudaEventCreateWithFlags")) {
        free(n);
        return NULL;
    }
    return n;
}

static void event_put(ev_node_t *n)
{
    pthread_mutex_lock(&ev_lock);
    n->next = free_events, free_events = n;
    pthread_mutex_unlock(&ev_lock);
}

/* `waiter` waits for the work queued on `producer` so far. */
static int order(dps_cudaStream_t producer, dps_cudaStream_t waiter, const char *what)
{
    ev_node_t *n = event_get();
    if (!n) return -1;
    int rc =
        cuda_ok(cu.EventRecord(n->ev, producer), what) || cuda_ok(cu.StreamWaitEvent(waiter, n->ev, 0), what);
    event_put(n); /* a recorded event may be recorded again: a wait already queued keeps its marker */
    return rc ? -1 : 0;
}

static dps_cudaStream_t user_stream(void *s)
{
    return s ? (dps_cudaStream_t)s : DPS_cudaStreamLegacy;
}

static int after(void *stream)
{
    return order(user_stream(stream), st.stream, "ordering after the program's GPU work");
}

static int before(void *stream)
{
    return order(st.stream, user_stream(stream), "ordering the program's GPU work after the collective");
}

static int capturing(void *stream)
{
    int status = DPS_cudaStreamCaptureStatusNone;
    if (cu.StreamIsCapturing(user_stream(stream), &status) != DPS_cudaSuccess)
        return 1; /* illegal now: as capturing */
    return status != DPS_cudaStreamCaptureStatusNone;
}

static int copy(void *dst, const void *src, size_t bytes, dps_copy_t kind)
{
    static const int kinds[] = {[DPS_COPY_D2D] = DPS_cudaMemcpyDeviceToDevice,
                                [DPS_COPY_D2H] = DPS_cudaMemcpyDeviceToHost,
                                [DPS_COPY_H2D] = DPS_cudaMemcpyHostToDevice};
    return cuda_ok(cu.MemcpyAsync(dst, src, bytes, kinds[kind], st.stream), "cudaMemcpyAsync");
}

static int zero(void *dst, size_t bytes)
{
    return cuda_ok(cu.MemsetAsync(dst, 0, bytes, st.stream), "cudaMemsetAsync");
}

static dps_ncclDataType_t nccl_type(int dtype)
{
    static const dps_ncclDataType_t map[] = {
        [DP_F32] = DPS_ncclFloat32,   [DP_F64] = DPS_ncclFloat64, [DP_F16] = DPS_ncclFloat16,
        [DP_BF16] = DPS_ncclBfloat16, [DP_I32] = DPS_ncclInt32,   [DP_I64] = DPS_ncclInt64,
        [DP_U8] = DPS_ncclUint8};
    return map[dtype];
}

/* A float's scale in the tensor's own type, as ncclRedOpCreatePreMulSum reads it. */
static void scalar_of(int dtype, double scale, unsigned char *out)
{
    float f = (float)scale;
    uint16_t h = dtype == DP_F16 ? dps_f32_to_f16(f) : dps_f32_to_bf16(f);
    if (dtype == DP_F64)
        memcpy(out, &scale, 8);
    else if (dtype == DP_F32)
        memcpy(out, &f, 4);
    else
        memcpy(out, &h, 2);
}

static void pause_us(long us);
static _Atomic(pthread_t) aborter; /* the thread that set st.aborted */

/* Aborted by another thread while this one waits: the job is being ended by that thread (the
 * guard, or a fatal error), which reports and exits; a second report from here would name the
 * abort as the failure, with another exit status. So this thread waits for the end. -1 with the
 * message only on the aborting thread itself, else 0. */
static int waited_out_abort(void)
{
    while (atomic_load(&st.aborted) && !pthread_equal(pthread_self(), aborter))
        pause_us(1000);
    return atomic_load(&st.aborted) ? fail("the NCCL communicator was aborted") : 0;
}

/* Polled while a call is in progress, where set (give_up_with): 1 abandons the call. */
static int (*launch_give_up)(void);

static void give_up_with(int (*give_up)(void))
{
    launch_give_up = give_up;
}

/* A call on the communicator (non-blocking, as it is made) may answer ncclInProgress: NCCL goes
 * on in a thread of its own (every collective from NCCL 2.23 on), and nothing else may be
 * called on the communicator, nor a marker recorded after it, until its state says done. A
 * launch that connects to a peer lost meanwhile stays in progress: launch_give_up ends the wait
 * (-2), and the communicator is then the caller's to abort. */
static int nccl_done(dps_ncclResult_t r, const char *what)
{
    for (long us = 2; r == DPS_ncclInProgress; us = us < 500 ? us * 2 : 500) {
        if (waited_out_abort()) return -1;
        if (launch_give_up && launch_give_up()) {
            fail("%s given up: another rank was lost meanwhile", what);
            return -2;
        }
        pause_us(us);
        dps_ncclResult_t got;
        ON_COMM(got, nc.CommGetAsyncError(st.comm, &r));
        if (got == COMM_GONE)
            r = COMM_GONE;
        else if (got != DPS_ncclSuccess)
            return fail("ncclCommGetAsyncError failed");
    }
    if (r == COMM_GONE) return waited_out_abort() ? -1 : fail("the NCCL communicator was aborted");
    return nccl_ok(r, what);
}

static int allreduce(void *buf, size_t count, int dtype, dps_redop_t op, double scale, int weighted)
{
    if (!st.comm) return fail("NCCL all-reduce before the communicator exists");
    dps_ncclResult_t r;
    dps_ncclRedOp_t nop = op == DPS_RED_MIN ? DPS_ncclMin : op == DPS_RED_MAX ? DPS_ncclMax : DPS_ncclSum;
    int floating = dtype == DP_F32 || dtype == DP_F64 || dtype == DP_F16 || dtype == DP_BF16;
    weighted = weighted && op == DPS_RED_SUM && floating;
    /* an empty share: exact zeros, never 0 x NaN; still the pre-multiplied sum the others issue */
    if (weighted && scale == 0.0 && zero(buf, count * dps_dtype_size(dtype))) return -1;
    if (weighted) {
        unsigned char s[8];
        scalar_of(dtype, scale, s);
        ON_COMM(r, nc.RedOpCreatePreMulSum(&nop, s, nccl_type(dtype), DPS_ncclScalarHostImmediate, st.comm));
        if (nccl_done(r, "ncclRedOpCreatePreMulSum")) return -1;
    }
    ON_COMM(r, nc.AllReduce(buf, buf, count, nccl_type(dtype), nop, st.comm, st.stream));
    int rc = nccl_done(r, "ncclAllReduce");
    /* an operator may go as soon as the call that uses it is done */
    if (weighted && !rc) {
        ON_COMM(r, nc.RedOpDestroy(nop, st.comm));
        rc = nccl_done(r, "ncclRedOpDestroy");
    }
    return rc;
}

static int bcast(void *buf, size_t bytes, int root)
{
    if (!st.comm) return fail("NCCL broadcast before the communicator exists");
    dps_ncclResult_t r;
    ON_COMM(r, nc.Broadcast(buf, buf, bytes, DPS_ncclUint8, root, st.comm, st.stream));
    return nccl_done(r, "ncclBroadcast");
}

static void *mark(void)
{
    ev_node_t *n = event_get();
    if (!n) return NULL;
    if (cuda_ok(cu.EventRecord(n->ev, st.stream), "cudaEventRecord")) {
        event_put(n);
        return NULL;
    }
    return n;
}

/* NCCL's asynchronous error: -1 with the message; 0 none; with try_only, -2 when another
 * thread is in a call on the communicator. */
static int comm_failed(int try_only)
{
    if (!try_only && waited_out_abort()) return -1;
    if (atomic_load(&st.aborted)) return try_only ? -2 : fail("the NCCL communicator was aborted");
    if (try_only ? pthread_mutex_trylock(&comm_mu) : pthread_mutex_lock(&comm_mu)) return -2;
    dps_ncclResult_t async = DPS_ncclSuccess,
                     r = st.comm ? nc.CommGetAsyncError(st.comm, &async) : DPS_ncclSuccess;
    /* NCCL's message about the error under the lock too: the abort helper may free the
     * communicator as soon as it is released (a race ThreadSanitizer found) */
    int rc = r != DPS_ncclSuccess ? fail("ncclCommGetAsyncError failed")
             : async == DPS_ncclSuccess || async == DPS_ncclInProgress
                 ? 0
                 : nccl_failed(st.comm, async, "NCCL reported an asynchronous error");
    pthread_mutex_unlock(&comm_mu);
    return rc;
}

/* A collective that failed still lets the stream go on, so a finished marker alone does not
 * mean the results are there: the communicator's error decides. The marker is read first: an
 * error raised before it passed is then seen by the check after it (read the other way round,
 * a collective failing between the two reads looked like a success). */
static int marker_state(void *m, int try_only)
{
    dps_cudaError_t e = cu.EventQuery(((ev_node_t *)m)->ev);
    int c = comm_failed(try_only);
    if (c) return c;
    if (e == DPS_cudaSuccess) return 1;
    return e == DPS_cudaErrorNotReady ? 0 : cuda_ok(e, "cudaEventQuery");
}

static int query(void *m)
{
    return marker_state(m, 0);
}

/* A thread of the shim's own (the watchdog, the abort helper) calls CUDA on the rank's device:
 * a thread starts on device 0, where its first call would bind a second context (memory on a
 * GPU the rank does not use). The device stays set, since the thread is the shim's and setting
 * device 0 back would bind that context after all. Its calls run in thread-local capture mode,
 * restored after: in global mode a query from another thread breaks the program's global-mode
 * CUDA graph capture (torch.cuda.graph's default). Returns the mode to restore. */
static int shim_thread_begin(void)
{
    int mode = DPS_cudaStreamCaptureModeThreadLocal, cur = -1;
    cu.ThreadExchangeStreamCaptureMode(&mode);
    if (st.dev >= 0 && cu.GetDevice(&cur) == DPS_cudaSuccess && cur != st.dev) cu.SetDevice(st.dev);
    return mode;
}

static void shim_thread_end(int mode)
{
    cu.ThreadExchangeStreamCaptureMode(&mode);
}

static int peek(void *m)
{
    int mode = shim_thread_begin();
    int rc = marker_state(m, 1);
    shim_thread_end(mode);
    return rc;
}

static void release(void *m)
{
    event_put(m);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* A marker's state on the stream alone, NCCL's errors not asked: 1 done, 0 not yet, -1. */
static int stream_state(void *m)
{
    dps_cudaError_t e = cu.EventQuery(((ev_node_t *)m)->ev);
    return e == DPS_cudaSuccess ? 1 : e == DPS_cudaErrorNotReady ? 0 : cuda_ok(e, "cudaEventQuery");
}

/* Polls a marker's state (query: with NCCL's asynchronous errors) until it is done, failed, or
 * limit_s passed (0: no limit): 1, -1, or 0. Polling rather than cudaEventSynchronize: an NCCL
 * error or an abort must end the wait, and a short sleep keeps a core free for the framework. */
static int settle(void *m, double limit_s, int (*state)(void *))
{
    double t0 = limit_s > 0 ? now_s() : 0;
    int rc;
    for (long us = 2; !(rc = state(m)) && !(limit_s > 0 && now_s() - t0 >= limit_s);
         us = us < 500 ? us * 2 : 500)
        pause_us(us);
    return rc;
}

static int wait(void *m)
{
    if (!m) return -1;
    int rc = settle(m, 0, query);
    event_put(m);
    return rc < 0 ? -1 : 0;
}

/* The stream's work up to m done, whatever NCCL reports since: copies queued after a collective
 * that completed are there even where a peer failed later. */
static int wait_stream(void *m)
{
    if (!m) return -1;
    int rc = settle(m, 0, stream_state);
    event_put(m);
    return rc < 0 ? -1 : 0;
}

static int nccl_id(void *id128)
{
    if (!has_nccl()) return fail("NCCL is not loaded");
    return nccl_ok(nc.GetUniqueId((dps_ncclUniqueId *)id128), "ncclGetUniqueId");
}

/* Polls comm's state (under comm_mu where it is the shared st.comm) until it leaves "in
 * progress": 0 on success; -1 on NCCL's error or past timeout_s (0: none); -2 once give_up()
 * says so. Aborts nothing: the caller knows which communicators go. */
static int await_state(dps_ncclComm_t comm, int shared, double timeout_s, int (*give_up)(void),
                       const char *what)
{
    double t0 = now_s();
    for (long us = 50;; us = us < 2000 ? us * 2 : 2000) {
        dps_ncclResult_t state = DPS_ncclInProgress, got;
        if (shared)
            ON_COMM(got, nc.CommGetAsyncError(st.comm, &state));
        else
            got = nc.CommGetAsyncError(comm, &state);
        if (got != DPS_ncclSuccess && shared) state = got;
        if (state == DPS_ncclSuccess) return 0;
        if (state != DPS_ncclInProgress) return nccl_failed(comm, state, what);
        if (give_up && give_up()) {
            fail("%s given up: another rank was lost meanwhile", what);
            return -2;
        }
        if (timeout_s > 0 && now_s() - t0 > timeout_s)
            return fail("%s did not complete within %.0f s ([guard] timeout)", what, timeout_s);
        pause_us(us);
    }
}

/* How long a caller waits for an abort (NCCL's can itself wait for a stuck peer). */
#define ABORT_LIMIT_S 2.0
static void abort_within(dps_ncclComm_t comm, double limit_s);

/* A non-blocking init of comm, polled until done: 0; otherwise comm is aborted: -1, or -2 given
 * up. */
static int settle_init(dps_ncclComm_t comm, double timeout_s, int (*give_up)(void), const char *what)
{
    int rc = await_state(comm, 0, timeout_s, give_up, what);
    if (rc) abort_within(comm, ABORT_LIMIT_S);
    return rc;
}

static int nccl_init(const void *id128, int rank, int size, double timeout_s, int (*give_up)(void))
{
    if (!has_nccl()) return fail("NCCL is not loaded");
    dps_ncclUniqueId id;
    memcpy(&id, id128, sizeof id);
    /* non-blocking: polled, so a peer that never arrives cannot hold this rank forever */
    dps_ncclConfig_t cfg = {sizeof cfg,
                            DPS_NCCL_CONFIG_MAGIC,
                            DPS_NCCL_CONFIG_VERSION,
                            0,
                            DPS_NCCL_CONFIG_UNDEF_INT,
                            DPS_NCCL_CONFIG_UNDEF_INT,
                            DPS_NCCL_CONFIG_UNDEF_INT,
                            (const char *)(uintptr_t)0};
    dps_ncclComm_t comm = NULL;
    dps_ncclResult_t r = nc.CommInitRankConfig(&comm, size, id, rank, &cfg);
    if (r != DPS_ncclSuccess && r != DPS_ncclInProgress) {
        if (comm) nc.CommAbort(comm);
        return nccl_ok(r, "ncclCommInitRankConfig");
    }
    int rc = settle_init(comm, timeout_s, give_up, "ncclCommInitRankConfig");
    if (rc) return rc;
    pthread_mutex_lock(&comm_mu);
    st.comm = comm;
    pthread_mutex_unlock(&comm_mu);
    return 0;
}

/* ncclCommAbort can itself wait for a stuck peer: it runs on a thread of its own, and the
 * caller waits at most limit_s for it. Each abort has its number: one that outlived its caller's
 * limit does not count as a later one's end. */
static pthread_mutex_t abort_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t abort_done = PTHREAD_COND_INITIALIZER;
static unsigned aborts_started, aborts_finished;

typedef struct abort_job {
    unsigned number;
    dps_ncclComm_t comm; /* NULL: the shared one, st.comm */
} abort_job_t;

static void *abort_main(void *arg)
{
    abort_job_t job = *(abort_job_t *)arg;
    free(arg);
    int mode = shim_thread_begin();
    if (job.comm) {
        nc.CommAbort(job.comm);
    } else {
        pthread_mutex_lock(&comm_mu); /* a call under way on another thread ends first */
        if (st.comm) nc.CommAbort(st.comm);
        st.comm = NULL;
        pthread_mutex_unlock(&comm_mu);
    }
    shim_thread_end(mode);
    pthread_mutex_lock(&abort_lock);
    if (job.number > aborts_finished) aborts_finished = job.number;
    pthread_cond_broadcast(&abort_done);
    pthread_mutex_unlock(&abort_lock);
    return NULL;
}

/* Aborts comm (NULL: st.comm) on a thread of its own, waiting for it at most limit_s. */
static void abort_within(dps_ncclComm_t comm, double limit_s)
{
    abort_job_t *job = malloc(sizeof *job);
    pthread_t t;
    if (job) {
        pthread_mutex_lock(&abort_lock);
        job->number = ++aborts_started, job->comm = comm;
        pthread_mutex_unlock(&abort_lock);
    }
    unsigned number = job ? job->number : 0;
    if (!job || pthread_create(&t, NULL, abort_main, job) != 0) {
        free(job);
        if (comm) nc.CommAbort(comm); /* no thread: here, unbounded, rather than never */
        return;
    }
    pthread_detach(t);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)limit_s;
    until.tv_nsec += (long)((limit_s - (double)(time_t)limit_s) * 1e9);
    if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
    pthread_mutex_lock(&abort_lock);
    while (aborts_finished < number && pthread_cond_timedwait(&abort_done, &abort_lock, &until) == 0) {
    }
    pthread_mutex_unlock(&abort_lock);
}

static void abort_comm(double limit_s)
{
    if (!st.comm || atomic_exchange(&st.aborted, 1)) return; /* staged: nothing of NCCL's to abort */
    aborter = pthread_self();
    abort_within(NULL, limit_s);
}

static void drop(void)
{
    abort_comm(ABORT_LIMIT_S);
    atomic_store(&st.aborted, 0); /* staged work on the stream has nothing to do with NCCL */
}

static int has_shrink(void)
{
    return nc.CommShrink != NULL;
}

static int comm_intact(void)
{
    dps_ncclResult_t async = DPS_ncclRemoteError, r;
    ON_COMM(r, nc.CommGetAsyncError(st.comm, &async));
    return r == DPS_ncclSuccess && async == DPS_ncclSuccess;
}

/* Where NCCL writes a non-blocking shrink's child: only once the child's init is done, from
 * NCCL's own thread (static: a shrink given up may still write it later). */
static dps_ncclComm_t shrink_child;

/* After a loss: the communicator of the ranks not in exclude[] (ranks of the current one), by
 * ncclCommShrink with NCCL_SHRINK_ABORT (which first ends a collective stuck on the lost rank);
 * the old one is aborted after. Non-blocking, as NCCL documents it: the parent's state says
 * when the child is done, and only then is the child's handle there. On a failure neither is
 * left. */
static int shrink(const int *exclude, int n, double timeout_s, int (*give_up)(void))
{
    if (!nc.CommShrink || !st.comm)
        return fail("ncclCommShrink: %s", st.comm ? "not in this NCCL" : "no communicator");
    int *list = malloc((size_t)(n > 0 ? n : 1) * sizeof *list);
    if (!list) return fail("ncclCommShrink: out of memory");
    memcpy(list, exclude, (size_t)n * sizeof *list);
    __atomic_store_n(&shrink_child, NULL, __ATOMIC_RELEASE);
    dps_ncclResult_t r;
    ON_COMM(r, nc.CommShrink(st.comm, list, n, &shrink_child, NULL, DPS_NCCL_SHRINK_ABORT));
    free(list);
    int rc = r == DPS_ncclInProgress ? await_state(st.comm, 1, timeout_s, give_up, "ncclCommShrink")
             : r != DPS_ncclSuccess  ? nccl_failed(st.comm, r, "ncclCommShrink")
                                     : 0;
    dps_ncclComm_t child = __atomic_load_n(&shrink_child, __ATOMIC_ACQUIRE);
    if (!rc && !child) rc = fail("ncclCommShrink: done, but no communicator came back");
    if (!rc) {
        dps_ncclResult_t state = DPS_ncclInProgress;
        nc.CommGetAsyncError(child, &state);
        if (state != DPS_ncclSuccess) rc = nccl_failed(child, state, "ncclCommShrink (the new communicator)");
    }
    drop(); /* the old communicator, first: NCCL's order where a shrink is given up */
    if (rc) {
        child = __atomic_load_n(&shrink_child, __ATOMIC_ACQUIRE);
        if (child) abort_within(child, ABORT_LIMIT_S);
        return rc;
    }
    pthread_mutex_lock(&comm_mu);
    st.comm = child;
    pthread_mutex_unlock(&comm_mu);
    return 0;
}

/* The end of a healthy communicator: ncclCommFinalize flushes what peers still need from this
 * rank (with the socket transport a peer's last collective can still be reading from this rank's
 * proxy; an abort would break it), polled up to limit_s, then ncclCommDestroy frees it. -1 when
 * finalize failed or did not finish. */
static int finalize_comm(double limit_s)
{
    dps_ncclResult_t r, got;
    ON_COMM(r, nc.CommFinalize(st.comm));
    double t0 = now_s();
    for (long us = 2; r == DPS_ncclInProgress && now_s() - t0 < limit_s; us = us < 500 ? us * 2 : 500) {
        pause_us(us);
        ON_COMM(got, nc.CommGetAsyncError(st.comm, &r));
        if (got != DPS_ncclSuccess) return fail("ncclCommGetAsyncError failed while finalizing");
    }
    if (r == DPS_ncclInProgress)
        return fail(
            "ncclCommFinalize did not complete within %.0f s (a peer has not taken this rank's last data)",
            limit_s);
    if (nccl_ok(r, "ncclCommFinalize")) return -1;
    pthread_mutex_lock(&comm_mu);
    r = nc.CommDestroy(
        st.comm); /* on a non-blocking communicator NCCL may finish freeing it in its own thread */
    st.comm = NULL;
    pthread_mutex_unlock(&comm_mu);
    return r == DPS_ncclSuccess || r == DPS_ncclInProgress ? 0 : nccl_failed(NULL, r, "ncclCommDestroy");
}

static int finish(double limit_s)
{
    if (!st.stream) return 1;
    void *m = mark();
    int done = m ? settle(m, limit_s, query) : -1;
    if (done < 0 && err_unloading) return -2; /* nothing of CUDA's left to ask, or to abort with */
    if (done == 1 && st.comm && finalize_comm(limit_s)) done = -1;
    if (st.comm) abort_comm(done == 1 ? limit_s : 1.0); /* only past a limit or on a failure */
    return done;
}

EXPORT int dps_device_open_v1(dps_device_t *out, char *err, size_t errlen)
{
    static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12", NULL};
    static const char *const nccl_names[] = {"libnccl.so.2", NULL};
    char which[512], missing[64];
    void *h = open_lib("DPSHIM_CUDART_LIB", cudart_names, 0, which, sizeof which);
    if (!h) {
        snprintf(err, errlen, "cannot load the CUDA runtime (%s): %s; set DPSHIM_CUDART_LIB to its path",
                 which, dlerror());
        return -1;
    }
    if (dps_bind_syms(h, cuda_syms, sizeof cuda_syms / sizeof *cuda_syms, missing, sizeof missing)) {
        snprintf(err, errlen, "%s lacks %s: a CUDA runtime of version 12 or 13 is needed", which, missing);
        return -1;
    }
    int rt = 0, drv = 0, n = 0;
    cu.RuntimeGetVersion(&rt);
    cu.DriverGetVersion(&drv);
    dps_cudaError_t e = cu.GetDeviceCount(&n);
    append("CUDA runtime %d.%d (%s)", rt / 1000, rt % 1000 / 10, which);
    if (drv)
        append(", driver %d.%d", drv / 1000, drv % 1000 / 10);
    else
        append(", no driver");
    /* no GPU is not an error here: dpshim-diag env reports it, and use() refuses */
    if (e != DPS_cudaSuccess || n == 0)
        append(", no usable GPU (%s)", e != DPS_cudaSuccess ? cu.GetErrorString(e) : "0 devices");
    else
        append(", %d GPU(s)", ngpus = n);
    void *hn = open_lib("DPSHIM_NCCL_LIB", nccl_names, 1, st.nccl_path, sizeof st.nccl_path);
    int v = 0;
    if (hn &&
        dps_bind_syms(hn, nccl_syms, sizeof nccl_syms / sizeof *nccl_syms, missing, sizeof missing) == 0 &&
        nc.GetVersion(&v) == DPS_ncclSuccess)
        append(", NCCL %d.%d.%d (%s)", v / 10000, v / 100 % 100, v % 100, st.nccl_path),
            *(void **)&nc.CommShrink = dlsym(hn, "ncclCommShrink");
    else {
        memset(&nc, 0, sizeof nc);
        append(", no NCCL (%s: %s)", st.nccl_path, hn ? "too old" : "not found");
    }
    *out = (dps_device_t){.versions = versions,
                          .notice = notice,
                          .last_error = last_error,
                          .peer_failed = peer_failed,
                          .has_nccl = has_nccl,
                          .count = count,
                          .use = use,
                          .restore = restore,
                          .key = key,
                          .bucket = bucket,
                          .pinned = pinned,
                          .alloc = alloc,
                          .free = release_memory,
                          .read = read_back,
                          .after = after,
                          .capturing = capturing,
                          .before = before,
                          .copy = copy,
                          .zero = zero,
                          .allreduce = allreduce,
                          .bcast = bcast,
                          .mark = mark,
                          .query = query,
                          .peek = peek,
                          .release = release,
                          .wait = wait,
                          .wait_stream = wait_stream,
                          .nccl_id = nccl_id,
                          .nccl_init = nccl_init,
                          .abort = abort_comm,
                          .drop = drop,
                          .has_shrink = has_shrink,
                          .intact = comm_intact,
                          .shrink = shrink,
                          .give_up_with = give_up_with,
                          .finish = finish};
    return 0;
}
