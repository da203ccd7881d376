/* Internal interface of the GPU test double (README.md): what runtime.c (configuration, devices,
 * tracing), memory.c (device memory and its table), streams.c (streams, events, ordering) and
 * nccl.c/reduce.c (communicators, collectives) share. No CUDA or NCCL header is included: the
 * double declares the few C types it needs itself, so it builds on any machine. */
#ifndef DPS_GPU_DOUBLE_H
#define DPS_GPU_DOUBLE_H

#include <stddef.h>
#include <stdint.h>

/* The library is built with hidden visibility: only the CUDA and NCCL names are exported. */
#define DPS_DBL_API __attribute__((visibility("default")))

/* cudaError_t values the double returns (driver_types.h). */
enum {
    DPS_DBL_SUCCESS = 0,
    DPS_DBL_EINVAL = 1,         /* cudaErrorInvalidValue */
    DPS_DBL_ENOMEM = 2,         /* cudaErrorMemoryAllocation */
    DPS_DBL_EINIT = 3,          /* cudaErrorInitializationError: a child forked after CUDA use */
    DPS_DBL_EUNLOADING = 4,     /* cudaErrorCudartUnloading: after the runtime's exit handler */
    DPS_DBL_EDIRECTION = 21,    /* cudaErrorInvalidMemcpyDirection */
    DPS_DBL_ESTUB = 34,         /* cudaErrorStubLibrary (and CUDA_ERROR_STUB_LIBRARY) */
    DPS_DBL_ENODRIVER = 35,     /* cudaErrorInsufficientDriver */
    DPS_DBL_EUNAVAILABLE = 46,  /* cudaErrorDevicesUnavailable: GPU_DOUBLE_ONE_DEVICE's refusal */
    DPS_DBL_ENODEV = 100,       /* cudaErrorNoDevice */
    DPS_DBL_EDEVICE = 101,      /* cudaErrorInvalidDevice */
    DPS_DBL_EHANDLE = 400,      /* cudaErrorInvalidResourceHandle */
    DPS_DBL_ESTATE = 401,       /* cudaErrorIllegalState */
    DPS_DBL_ENOTREADY = 600,    /* cudaErrorNotReady */
    DPS_DBL_ECAPTURE = 900,     /* cudaErrorStreamCaptureUnsupported */
    DPS_DBL_ECAPINVALID = 901,  /* cudaErrorStreamCaptureInvalidated */
    DPS_DBL_ECAPIMPLICIT = 906, /* cudaErrorStreamCaptureImplicit */
};

/* ---- runtime.c: configuration, devices, tracing, errors ---- */

/* Every switch, read once from the environment at first use: name, variable, default. */
#define DPS_DBL_ENV(X)                                                                                       \
    X(devices, "GPU_DOUBLE_DEVICES", 1)                                                                      \
    X(no_driver, "GPU_DOUBLE_NO_DRIVER", 0)                                                                  \
    X(delay_ms, "GPU_DOUBLE_DELAY_MS", 0)                                                                    \
    X(stall_rank, "GPU_DOUBLE_STALL_RANK", -1)                                                               \
    X(stall_at, "GPU_DOUBLE_STALL_AT", 1)                                                                    \
    X(stall_comm, "GPU_DOUBLE_STALL_COMM", 0)                                                                \
    X(async_error_rank, "GPU_DOUBLE_ASYNC_ERROR_RANK", -1)                                                   \
    X(async_error_at, "GPU_DOUBLE_ASYNC_ERROR_AT", 1)                                                        \
    X(async_error_late, "GPU_DOUBLE_ASYNC_ERROR_LATE", 0)                                                    \
    X(init_fail_rank, "GPU_DOUBLE_INIT_FAIL_RANK", -1)                                                       \
    X(abort_ms, "GPU_DOUBLE_ABORT_MS", 0)                                                                    \
    X(one_device, "GPU_DOUBLE_ONE_DEVICE", 0)                                                                \
    X(slow_rank, "GPU_DOUBLE_SLOW_RANK", -1)                                                                 \
    X(slow_ms, "GPU_DOUBLE_SLOW_MS", 0)                                                                      \
    X(die_rank, "GPU_DOUBLE_DIE_RANK", -1)                                                                   \
    X(die_at, "GPU_DOUBLE_DIE_AT", 1)                                                                        \
    X(die_in_shrink, "GPU_DOUBLE_DIE_IN_SHRINK", -1)                                                         \
    X(die_in_init, "GPU_DOUBLE_DIE_IN_INIT", -1)                                                             \
    X(call_us, "GPU_DOUBLE_CALL_US", 100)

typedef struct dps_dbl_conf {
#define DPS_DBL_FIELD(name, var, def) long name;
    DPS_DBL_ENV(DPS_DBL_FIELD)
#undef DPS_DBL_FIELD
} dps_dbl_conf_t;

/* The configuration (loaded on first call; a forked child reads its own environment again). */
const dps_dbl_conf_t *dps_dbl_conf(void);

/* One line per API call to $GPU_DOUBLE_TRACE, prefixed with the pid; free when unset. */
void dps_dbl_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Start of every runtime call that needs a context (it binds the thread's current device's):
 * 0, or the error the call must return
 * (no driver; a child forked after the parent used CUDA, which CUDA does not support; the
 * runtime's exit handler already ran). The first call registers that handler. */
int dps_dbl_rt_begin(void);
/* 1 once the runtime's exit handler ran (NCCL's CUDA calls then fail too). */
int dps_dbl_runtime_gone(void);
/* End of every runtime call: records a failure as the thread's last error, returns err. */
int dps_dbl_rt_end(int err);

/* The calling thread's current device (a visible ordinal), or a CUDA error. */
int dps_dbl_current_device(int *dev_p);
/* The PCI bus id of a visible device, "00000000:11:00.0"; 0 or cudaErrorInvalidDevice. */
int dps_dbl_bus_id(int dev, char *buf, size_t len);
const char *dps_dbl_cuda_error_string(int err);

/* Start of every driver call: 0, or its error (the stub's answer without a driver). */
int dps_dbl_driver_begin(void);

/* The prologue of a runtime call: its trace line, then the error it must return at once (no
 * driver, a forked child). Declares `err` for the rest of the call. */
#define DPS_DBL_RT_ENTER(...)                                                                                \
    dps_dbl_trace(__VA_ARGS__);                                                                              \
    int err = dps_dbl_rt_begin();                                                                            \
    if (err) return dps_dbl_rt_end(err)

/* A detached thread with every signal blocked: it never keeps the process alive or takes the
 * program's signals, and one stuck in a stalled collective cannot hold up exit. 0 or errno. */
int dps_dbl_start_thread(void *(*fn)(void *), void *arg);

/* Sleeps us microseconds (the per-operation delay, polls). */
void dps_dbl_sleep_us(long us);

/* ---- memory.c: device memory and the pointer table ---- */

enum { DPS_DBL_MEM_NONE = 0, DPS_DBL_MEM_HOST = 1, DPS_DBL_MEM_DEVICE = 2 };

/* What [p, p+bytes) is: DPS_DBL_MEM_DEVICE (all inside one cudaMalloc allocation, *rw_p the
 * double's read-write view of p), DPS_DBL_MEM_HOST (inside one cudaHostAlloc allocation, *rw_p
 * = p), or DPS_DBL_MEM_NONE (pageable host memory, or a range that leaves its allocation).
 * *dev_p: the owning device. rw_p and dev_p may be NULL. */
int dps_dbl_lookup(const void *p, size_t bytes, void **rw_p, int *dev_p);

/* ---- streams.c: streams, events, ordering ---- */

/* One operation as the stream's worker runs it. The enqueuer fills it; the stream owns a copy. */
typedef struct dps_dbl_work {
    void (*run)(struct dps_dbl_work *w);  /* on the worker; NULL: a marker */
    void (*fini)(struct dps_dbl_work *w); /* exactly once: after it ran, or when it will not */
    /* Under the scheduler's lock when the work is accepted (not discarded by a capture), with
     * the stream and the work's position in it: what must be decided in enqueue order. */
    void (*accepted)(struct dps_dbl_work *w, void *stream, uint64_t seq);
    int delayed; /* sleeps GPU_DOUBLE_DELAY_MS before it runs */
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    void *ctx;
} dps_dbl_work_t;

/* Enqueues w on stream (NULL, 0x1 and 0x2 are the legacy stream) with CUDA's ordering rules.
 * wait: returns only when it has run. *captured_p (may be NULL): set when a capture discarded
 * it. Returns 0 or a CUDA error (invalid handle, legacy stream use during a capture). */
int dps_dbl_enqueue(void *stream, const dps_dbl_work_t *w, int wait, int *captured_p);
/* The device a stream belongs to (the legacy stream: the caller's current device), or -1. */
int dps_dbl_stream_device(void *stream);
/* Waits until every stream's work enqueued so far has run (cudaFree synchronizes so). */
void dps_dbl_drain_all(void);

/* ---- reduce.c: datatypes and arithmetic of the collectives ---- */

enum { DPS_DBL_NTYPES = 10, DPS_DBL_F16 = 6, DPS_DBL_BF16 = 9 };
enum { DPS_DBL_SUM = 0, DPS_DBL_PROD = 1, DPS_DBL_MAX = 2, DPS_DBL_MIN = 3, DPS_DBL_AVG = 4 };

size_t dps_dbl_dtype_size(int dtype); /* 0 for an invalid datatype */
const char *dps_dbl_dtype_name(int dtype);
/* Reduces n elements of every rank's input, in rank order, into out (which may alias in[r]
 * only where out's element i is written after every in[r]'s element i was read, which holds).
 * scale[r]: rank r's premultiplier as raw bytes of the datatype, or NULL (ignored unless op is
 * DPS_DBL_SUM). */
void dps_dbl_reduce(int dtype, int op, int nranks, const void *const *in, const void *const *scale, void *out,
                    size_t n);

#endif
