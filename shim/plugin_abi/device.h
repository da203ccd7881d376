/* The GPU plugin's ABI (libdpshim-nccl.so, shim/backends/nccl/): the CUDA runtime and NCCL,
 * opened with dlopen, behind a few calls on plain pointers. The plugin holds this process's CUDA
 * and NCCL state (one device, one communication stream, one communicator); the engine
 * (engine/device.c) decides what to call, so the logic is the same whether the calls reach a
 * GPU or the test double (tests/gpu_double/). Plain C, nothing of the shim. */
#ifndef DPS_PLUGIN_ABI_DEVICE_H
#define DPS_PLUGIN_ABI_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef enum { DPS_COPY_D2D, DPS_COPY_D2H, DPS_COPY_H2D } dps_copy_t;

typedef struct dps_device {
    /* "CUDA runtime 13.0, driver 13.0, NCCL 2.28.9" (parts it could not load say so). */
    const char *(*versions)(void);
    /* A warning about the libraries chosen (a DPSHIM_*_LIB not followed, and why), or NULL. */
    const char *(*notice)(void);
    /* The failure of the last call that returned -1 (per thread). */
    const char *(*last_error)(void);
    /* 1 when that failure was NCCL's report that another rank failed (ncclRemoteError): the
     * cause is elsewhere, and that rank reports it. */
    int (*peer_failed)(void);
    /* 1 when NCCL was loaded, so the NCCL calls below can work. */
    int (*has_nccl)(void);
    /* The GPUs this process sees (0 without a driver or a device). */
    int (*count)(void);
    /* Make `dev` the calling thread's current device for the plugin's work (streams and the
     * bucket are made on first use); returns the device that was current before, for restore(),
     * or -1. The plugin serves one device per process: another one is an error. */
    int (*use)(int dev);
    void (*restore)(int prev);
    /* The duplicate-GPU key of the device in use, as NCCL compares: host hash and PCI bus id. */
    int (*key)(char *out, size_t len);
    /* Device memory of the bucket (made once, [comm] bucket_mb) and pinned host memory. */
    void *(*bucket)(size_t bytes);
    void *(*pinned)(size_t bytes);
    /* Device memory of the caller's (free() waits for the device's work, as cudaFree does), and
     * a synchronous copy of device memory to the host outside the communication stream. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *dev);
    int (*read)(void *host, const void *dev, size_t bytes);

    /* Ordering. The communication stream waits for the work queued so far on `stream` (NULL:
     * the legacy default stream, which waits for every blocking stream). 1 from capturing():
     * `stream` (or the legacy stream) is being captured into a CUDA graph. */
    int (*after)(void *stream);
    int (*capturing)(void *stream);
    /* `stream` waits for the communication stream's work so far. */
    int (*before)(void *stream);

    /* Work queued on the communication stream, in order. */
    int (*copy)(void *dst, const void *src, size_t bytes, dps_copy_t kind);
    int (*zero)(void *dst, size_t bytes);
    /* NCCL, in place. `weighted` (floats and sums only): each rank's values times its own
     * `scale` (0: exact zeros) through NCCL's pre-multiplied sum. Every rank of the job passes
     * the same `weighted` for a collective, whatever its own scale (1 or 0 included): NCCL picks
     * its algorithm from the operation, so ranks issuing a sum and a PreMulSum could hang. */
    int (*allreduce)(void *buf, size_t count, int dtype, dps_redop_t op, double scale, int weighted);
    int (*bcast)(void *buf, size_t bytes, int root);
    /* A marker after the work queued so far; wait() polls it (and NCCL's asynchronous errors)
     * and frees it: 0, or -1 on a CUDA or NCCL error or after abort(). query(): 1 done, 0 not
     * yet, -1 error, without freeing. */
    void *(*mark)(void);
    int (*query)(void *marker);
    int (*wait)(void *marker);
    /* wait() on the stream alone, NCCL's errors not asked: 0, or -1 on a CUDA error. */
    int (*wait_stream)(void *marker);
    /* query() from a thread of the shim's own (the watchdog): CUDA on the rank's device, in
     * thread-local capture mode, and -2 instead of waiting when another thread is in a call on
     * the communicator (look again later). release(): frees a marker found done. */
    int (*peek)(void *marker);
    void (*release)(void *marker);

    /* The communicator: rank 0's id (128 bytes) to every rank, then init on all; blocks up to
     * timeout_s (0: no limit), polling NCCL's non-blocking init so it can be abandoned. NCCL makes
     * the communicator on the current device: the caller makes the tensors' device current. */
    int (*nccl_id)(void *id128);
    /* give_up (may be NULL): polled meanwhile; where it says 1, the init is abandoned: -2. */
    int (*nccl_init)(const void *id128, int rank, int size, double timeout_s, int (*give_up)(void));
    /* Abort the communicator from any thread; returns within limit_s even when NCCL does not,
     * and every later or pending wait() returns -1. */
    void (*abort)(double limit_s);
    /* The communicator given up for good (abort, bounded) while the stream goes on: the
     * staged fallback when NCCL could not start on every rank. */
    void (*drop)(void);
    /* After a lost rank. has_shrink: NCCL has ncclCommShrink (2.27+). intact: the communicator
     * exists and NCCL reports no error on it. shrink: the communicator of the ranks not in
     * exclude[] (ranks of the current one, renumbered in order), made with NCCL_SHRINK_ABORT,
     * which first ends a collective stuck on a lost rank; the old one is aborted after. 0; -1
     * (no communicator is left then); -2 given up as nccl_init. Every rank of the new
     * communicator must call it, or none. */
    int (*has_shrink)(void);
    int (*intact)(void);
    int (*shrink)(const int *exclude, int n, double timeout_s, int (*give_up)(void));
    /* From now on, allreduce() and bcast() poll give_up (NULL: none) while NCCL answers a launch
     * with ncclInProgress (a connection to a peer lost meanwhile): 1 abandons it, -2. */
    void (*give_up_with)(int (*give_up)(void));
    /* At exit: the queued work gets limit_s to finish, then the communicator is finalized (what
     * peers still need from this rank is flushed, for limit_s at most) and destroyed; it is
     * aborted only where that failed or timed out, or the work did not finish. 1: all of it
     * finished; 0: not within limit_s; -1: it failed (last_error says why); -2: the CUDA runtime
     * was already torn down by its own exit handler, so nothing could be asked. */
    int (*finish)(double limit_s);
} dps_device_t;

#define DPS_DEVICE_OPEN_SYMBOL "dps_device_open_v1"
typedef int (*dps_device_open_fn)(dps_device_t *out, char *err, size_t errlen);

#endif
