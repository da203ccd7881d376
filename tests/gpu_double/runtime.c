/* The double's configuration, device model and error texts, with the runtime and driver calls
 * that need nothing else: versions, devices, bus ids, error names, the last error. */
#define _GNU_SOURCE
#include "double.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_DEVICES = 64 };

static pthread_mutex_t conf_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int conf_loaded;
static dps_dbl_conf_t conf;
static atomic_int trace_fd = -1;
/* The visible devices, in CUDA ordinal order: their physical index. */
static int visible[MAX_DEVICES];
static int nvisible;
/* The runtime was used in this process; a child forked after that cannot use it (as CUDA). */
static atomic_int context_made, context_lost;
/* The runtime's exit handler ran: every later runtime call returns cudaErrorCudartUnloading. */
static atomic_int unloading;
static __thread int current_device;
static __thread int last_error;

static long env_long(const char *var, long def)
{
    const char *v = getenv(var);
    if (!v || !*v) return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    return errno || *end ? def : x;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* CUDA_VISIBLE_DEVICES as CUDA reads it: indices or GPU-<uuid> entries, and the list ends at
 * the first entry that names no device (or one named before); set but empty hides them all. */
static void parse_visible(long ndev)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    nvisible = 0;
    if (!cvd) {
        for (long p = 0; p < ndev && p < MAX_DEVICES; p++)
            visible[nvisible++] = (int)p;
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", cvd);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && nvisible < MAX_DEVICES;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        size_t len = strlen(tok);
        while (len && (tok[len - 1] == ' ' || tok[len - 1] == '\t'))
            tok[--len] = '\0';
        long p = -1;
        if (!strncmp(tok, "GPU-", 4) && tok[4]) {
            p = ndev > 0 ? (long)(fnv1a(tok) % (uint64_t)ndev) : -1;
        } else if (len && strspn(tok, "0123456789") == len) {
            errno = 0;
            p = strtol(tok, NULL, 10);
            if (errno || p >= ndev) p = -1;
        }
        for (int i = 0; p >= 0 && i < nvisible; i++)
            if (visible[i] == p) p = -1;
        if (p < 0) break;
        visible[nvisible++] = (int)p;
    }
}

/* A child starts over with its own environment (tests set switches between fork and first use);
 * if the parent had used the runtime, the child cannot, as with CUDA. */
static void on_fork_child(void)
{
    pthread_mutex_init(&conf_lock, NULL);
    atomic_store(&conf_loaded, 0);
    if (atomic_load(&context_made)) atomic_store(&context_lost, 1);
}

const dps_dbl_conf_t *dps_dbl_conf(void)
{
    if (atomic_load_explicit(&conf_loaded, memory_order_acquire)) return &conf;
    pthread_mutex_lock(&conf_lock);
    if (!atomic_load(&conf_loaded)) {
        static int atfork_done;
        if (!atfork_done) atfork_done = !pthread_atfork(NULL, NULL, on_fork_child);
#define DPS_DBL_READ(name, var, def) conf.name = env_long(var, def);
        DPS_DBL_ENV(DPS_DBL_READ)
#undef DPS_DBL_READ
        if (conf.devices < 0) conf.devices = 0;
        parse_visible(conf.devices);
        int old = atomic_exchange(&trace_fd, -1);
        if (old >= 0) close(old);
        const char *path = getenv("GPU_DOUBLE_TRACE");
        if (path && *path)
            atomic_store(&trace_fd, open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
        atomic_store_explicit(&conf_loaded, 1, memory_order_release);
    }
    pthread_mutex_unlock(&conf_lock);
    return &conf;
}

void dps_dbl_trace(const char *fmt, ...)
{
    dps_dbl_conf();
    int fd = atomic_load_explicit(&trace_fd, memory_order_relaxed);
    if (fd < 0) return;
    char line[512];
    int n = snprintf(line, sizeof line, "%d ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    n = m < 0 ? n : n + m > (int)sizeof line - 2 ? (int)sizeof line - 2 : n + m;
    line[n++] = '\n';
    /* One write per line: appends from several ranks stay whole lines. */
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
}

/* As CUDA's runtime: it registers its teardown with atexit when it starts (at the first call
 * that needs it), so handlers registered before that (a preloaded library's constructor) run
 * after it, and find the runtime gone. */
static void runtime_teardown(void)
{
    atomic_store(&unloading, 1);
    dps_dbl_trace("runtime teardown (exit handler)");
}

int dps_dbl_runtime_gone(void)
{
    return atomic_load(&unloading);
}

/* The runtime's own checks, for calls that need no context (device count and choice, bus ids). */
static int rt_begin_noctx(void)
{
    const dps_dbl_conf_t *c = dps_dbl_conf();
    if (c->no_driver) return DPS_DBL_ENODRIVER;
    if (atomic_load(&context_lost)) return DPS_DBL_EINIT;
    if (atomic_load(&unloading)) return DPS_DBL_EUNLOADING;
    if (!atomic_exchange(&context_made, 1)) atexit(runtime_teardown);
    return DPS_DBL_SUCCESS;
}

/* Physical GPUs with a context in this process, and the first one's index (-1: none yet). */
static atomic_int has_context[MAX_DEVICES];
static atomic_int first_context = -1;

/* The calling thread's current device gets its primary context, as CUDA's runtime binds one at a
 * thread's first call that needs it: a thread that never chose a device works on device 0. With
 * GPU_DOUBLE_ONE_DEVICE, a context on a second GPU is an error: a rank serves one GPU, and a
 * context elsewhere (a helper thread left on device 0) costs that GPU memory on a real machine. */
static int context_here(void)
{
    if (!nvisible) return DPS_DBL_ENODEV;
    int dev = current_device < nvisible ? current_device : 0, phys = visible[dev];
    int none = -1;
    atomic_compare_exchange_strong(&first_context, &none, phys);
    int first = atomic_load(&first_context);
    if (conf.one_device && phys != first && !atomic_load(&has_context[phys])) {
        char msg[256];
        int n =
            snprintf(msg, sizeof msg,
                     "gpu double: a CUDA call on device %d (physical %d) would make a second context in a "
                     "process that works on physical GPU %d (GPU_DOUBLE_ONE_DEVICE)\n",
                     dev, phys, first);
        ssize_t w = write(2, msg, (size_t)n);
        (void)w;
        dps_dbl_trace("second context refused: device %d (physical %d), first %d", dev, phys, first);
        return DPS_DBL_EUNAVAILABLE;
    }
    atomic_store(&has_context[phys], 1);
    return DPS_DBL_SUCCESS;
}

int dps_dbl_rt_begin(void)
{
    int err = rt_begin_noctx();
    return err ? err : context_here();
}

int dps_dbl_rt_end(int err)
{
    /* Not ready is an answer, not an error: CUDA does not record it either. */
    if (err && err != DPS_DBL_ENOTREADY) last_error = err;
    return err;
}

int dps_dbl_current_device(int *dev_p)
{
    int err = rt_begin_noctx();
    if (err) return err;
    if (!nvisible) return DPS_DBL_ENODEV;
    *dev_p = current_device < nvisible ? current_device : 0;
    return DPS_DBL_SUCCESS;
}

int dps_dbl_bus_id(int dev, char *buf, size_t len)
{
    if (dev < 0 || dev >= nvisible) return DPS_DBL_EDEVICE;
    snprintf(buf, len, "00000000:%02X:00.0", 0x10 + visible[dev]);
    return DPS_DBL_SUCCESS;
}

int dps_dbl_start_thread(void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int rc = pthread_create(&t, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}

void dps_dbl_sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* The runtime's names and texts for the codes the double returns. */
#define DPS_DBL_ERRORS(X)                                                                                    \
    X(0, cudaSuccess, "no error")                                                                            \
    X(1, cudaErrorInvalidValue, "invalid argument")                                                          \
    X(2, cudaErrorMemoryAllocation, "out of memory")                                                         \
    X(3, cudaErrorInitializationError, "initialization error")                                               \
    X(4, cudaErrorCudartUnloading, "driver shutting down")                                                   \
    X(21, cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                              \
    X(34, cudaErrorStubLibrary, "CUDA driver is a stub library")                                             \
    X(46, cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable")                  \
    X(35, cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version")       \
    X(100, cudaErrorNoDevice, "no CUDA-capable device is detected")                                          \
    X(101, cudaErrorInvalidDevice, "invalid device ordinal")                                                 \
    X(400, cudaErrorInvalidResourceHandle, "invalid resource handle")                                        \
    X(401, cudaErrorIllegalState, "the operation cannot be performed in the present state")                  \
    X(600, cudaErrorNotReady, "device not ready")                                                            \
    X(900, cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")            \
    X(901, cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture")     \
    X(906, cudaErrorStreamCaptureImplicit,                                                                   \
      "operation would make the legacy stream depend on a capturing blocking stream")                        \
    X(999, cudaErrorUnknown, "unknown error")

static const struct {
    int code;
    const char *name, *text;
} cuda_errors[] = {
#define DPS_DBL_ERR(code, name, text) {code, #name, text},
    DPS_DBL_ERRORS(DPS_DBL_ERR)
#undef DPS_DBL_ERR
};

const char *dps_dbl_cuda_error_string(int err)
{
    for (size_t i = 0; i < sizeof cuda_errors / sizeof *cuda_errors; i++)
        if (cuda_errors[i].code == err) return cuda_errors[i].text;
    return "unknown error";
}

DPS_DBL_API const char *cudaGetErrorString(int err)
{
    return dps_dbl_cuda_error_string(err);
}

DPS_DBL_API const char *cudaGetErrorName(int err)
{
    for (size_t i = 0; i < sizeof cuda_errors / sizeof *cuda_errors; i++)
        if (cuda_errors[i].code == err) return cuda_errors[i].name;
    return "unknown error";
}

DPS_DBL_API int cudaGetLastError(void)
{
    int err = last_error;
    last_error = 0;
    return err;
}

DPS_DBL_API int cudaPeekAtLastError(void)
{
    return last_error;
}

DPS_DBL_API int cudaRuntimeGetVersion(int *v)
{
    dps_dbl_trace("cudaRuntimeGetVersion");
    if (!v) return dps_dbl_rt_end(DPS_DBL_EINVAL);
    *v = 13000;
    return DPS_DBL_SUCCESS;
}

DPS_DBL_API int cudaDriverGetVersion(int *v)
{
    dps_dbl_trace("cudaDriverGetVersion");
    if (!v) return dps_dbl_rt_end(DPS_DBL_EINVAL);
    /* Without a driver CUDA answers 0, successfully. */
    *v = dps_dbl_conf()->no_driver ? 0 : 13000;
    return DPS_DBL_SUCCESS;
}

DPS_DBL_API int cudaGetDeviceCount(int *count)
{
    dps_dbl_trace("cudaGetDeviceCount");
    if (!count) return dps_dbl_rt_end(DPS_DBL_EINVAL);
    *count = 0;
    int err = rt_begin_noctx();
    if (!err && !nvisible) err = DPS_DBL_ENODEV;
    if (!err) *count = nvisible;
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaSetDevice(int dev)
{
    dps_dbl_trace("cudaSetDevice dev=%d", dev);
    int err = rt_begin_noctx();
    if (!err && !nvisible) err = DPS_DBL_ENODEV;
    if (!err && (dev < 0 || dev >= nvisible)) err = DPS_DBL_EDEVICE;
    int was = current_device;
    if (!err) current_device = dev;
    /* since CUDA 12 it also makes the device's primary context current */
    if (!err && (err = context_here())) current_device = was;
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaGetDevice(int *dev)
{
    dps_dbl_trace("cudaGetDevice");
    if (!dev) return dps_dbl_rt_end(DPS_DBL_EINVAL);
    return dps_dbl_rt_end(dps_dbl_current_device(dev));
}

DPS_DBL_API int cudaDeviceGetPCIBusId(char *buf, int len, int dev)
{
    dps_dbl_trace("cudaDeviceGetPCIBusId dev=%d", dev);
    int err = rt_begin_noctx();
    if (!err && (!buf || len <= 0)) err = DPS_DBL_EINVAL;
    if (!err) err = nvisible ? dps_dbl_bus_id(dev, buf, (size_t)len) : DPS_DBL_ENODEV;
    return dps_dbl_rt_end(err);
}

/* Driver API (libcuda.so.1's names). Without a driver they answer as this machine's stub does. */
int dps_dbl_driver_begin(void)
{
    if (dps_dbl_conf()->no_driver) return DPS_DBL_ESTUB;
    return atomic_load(&context_lost) ? DPS_DBL_EINIT : 0;
}

DPS_DBL_API int cuInit(unsigned flags)
{
    dps_dbl_trace("cuInit flags=%u", flags);
    return dps_dbl_driver_begin();
}

DPS_DBL_API int cuDriverGetVersion(int *v)
{
    dps_dbl_trace("cuDriverGetVersion");
    int err = dps_dbl_driver_begin();
    if (err) return err;
    if (!v) return DPS_DBL_EINVAL;
    *v = 13000;
    return 0;
}
