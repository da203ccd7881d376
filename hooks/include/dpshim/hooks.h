/* dpshim hook ABI, version 5: the points where a framework lets dpshim make it data-parallel.
 * A framework declares these weak (define DPSHIM_HOOKS_WEAK before including) and calls them
 * when non-NULL; without libdpshim.so preloaded every pointer is NULL and it runs alone.
 * Later versions add functions; the meaning of these never changes. */
#ifndef DPSHIM_HOOKS_H
#define DPSHIM_HOOKS_H

#include <stddef.h>
#include <stdint.h>

#define DPSHIM_HOOK_ABI_VERSION 5

#ifdef __cplusplus
extern "C" {
#endif

/* dtype codes */
enum { DP_F32 = 0, DP_F64 = 1, DP_F16 = 2, DP_BF16 = 3, DP_I32 = 4, DP_I64 = 5, DP_U8 = 6 };
/* device: DP_HOST or a CUDA ordinal (0, 1, ...) */
#define DP_HOST (-1)
/* dp_metric operations */
enum { DP_SUM = 0, DP_MEAN = 1, DP_MIN = 2, DP_MAX = 3 };

typedef struct dp_tensor {
    void *data;
    uint64_t count;   /* elements, not bytes */
    int32_t dtype;    /* DP_F32 ... */
    int32_t device;   /* DP_HOST or CUDA ordinal */
    const char *name; /* optional, for diagnostics */
} dp_tensor;

#if defined(DPSHIM_HOOKS_WEAK) && defined(__GNUC__)
#define DPSHIM_HOOK_DECL __attribute__((weak))
#else
#define DPSHIM_HOOK_DECL
#endif

/* Identity. Without a launcher: rank 0 of 1. */
DPSHIM_HOOK_DECL int dp_rank(void);
DPSHIM_HOOK_DECL int dp_world_size(void);
DPSHIM_HOOK_DECL int dp_local_rank(void);

/* After the model is built or loaded: root's values overwrite every rank's. Give the parameters'
 * own memory: the drift check ([guard] drift_every) reads these tensors again at later step ends
 * (a tensor given again replaces itself). Hooks are called by one thread at a time. */
DPSHIM_HOOK_DECL int dp_params(dp_tensor *t, size_t n);
/* Before a shuffle or an init draw: root's seed to all ranks. */
DPSHIM_HOOK_DECL int dp_seed(uint64_t *seed);
/* split mode: the global batch in, this rank's contiguous share kept at idx[0..ret).
 * scale mode: returns n unchanged; the next dp_step_end counts the batch as trained (what a rank
 * lost in the epoch had trained, for dp_epoch_rest): a batch only evaluated in the middle of an
 * epoch must not be given. */
DPSHIM_HOOK_DECL size_t dp_batch(uint64_t *idx, size_t n);
/* scale mode: the epoch permutation in, this rank's shard kept at idx[0..ret).
 * split mode: returns n unchanged. */
DPSHIM_HOOK_DECL size_t dp_epoch(uint64_t *idx, size_t n);
/* Optional, during backward: t's gradient is final for this step and may be reduced now. */
DPSHIM_HOOK_DECL int dp_grad_ready(const dp_tensor *t);
/* Before the optimizer update: gradients averaged in place across ranks, each rank weighted by
 * its share of the global batch (split mode) or equally (scale mode). */
DPSHIM_HOOK_DECL int dp_grads(dp_tensor *t, size_t n);
/* Per-channel sums and a sample count, summed in place over ranks (when [bn] sync = on). */
DPSHIM_HOOK_DECL int dp_bn_stats(dp_tensor *sum, dp_tensor *sumsq, uint64_t *count);
/* v[0..n) reduced with op (DP_SUM, DP_MEAN, DP_MIN, DP_MAX); result on every rank. */
DPSHIM_HOOK_DECL int dp_metric(double *v, size_t n, int op);
/* Rank-0-only region: returns 1 on rank 0 (collectives inside act as world size 1), 0 elsewhere
 * (skip the body). Every begin is closed by dp_scope_end on every rank. */
DPSHIM_HOOK_DECL int dp_scope_begin(const char *name);
DPSHIM_HOOK_DECL int dp_scope_end(void);
/* After each optimizer step. */
DPSHIM_HOOK_DECL int dp_step_end(uint64_t step);

/* Version 4. After an update that each rank ran on its own share of the tensors (a sharded
 * optimizer step): t[i] takes rank owner[i]'s values on every rank. owner[] must be the same on
 * every rank; each owner's tensors travel as its broadcasts, in rank order, fused in buckets.
 * Owners are ranks as dp_rank numbers them (after a lost rank, the survivors'). Returns 0, or -1
 * (an owner outside 0..world size-1, NULL lists, a rank lost during the call). */
DPSHIM_HOOK_DECL int dp_from_owners(dp_tensor *t, size_t n, const int32_t *owner);

/* Version 5. Scale mode, after this rank's dp_epoch shard of an epoch is trained, on every rank
 * at the same place: the samples that ranks lost during the epoch had not trained (a job that goes
 * on without a lost rank), this rank's share of them. Returns their count and keeps the first
 * min(count, cap) at idx; asked again right after with a larger idx (or after a NULL idx), it
 * returns the same share (so give it room for the count: a buffer as short again repeats it). 0
 * where nothing was lost (or not scale mode). Train the share as the epoch's last batches, then
 * ask again: ranks lost meanwhile leave more, until it returns 0. */
DPSHIM_HOOK_DECL size_t dp_epoch_rest(uint64_t *idx, size_t cap);

/* Version 3. The hook ABI version of the loaded libdpshim.so (its DPSHIM_HOOK_ABI_VERSION): a
 * framework built against a newer header calls a newer hook only where this is at least that
 * hook's version. Absent (NULL, with weak declarations) before version 3. */
DPSHIM_HOOK_DECL int dp_abi_version(void);

/* Version 2. The CUDA stream (a cudaStream_t) on `device` that the calling thread's framework
 * runs its work on, or NULL to go back to the default. Default: a hook with device tensors
 * starts after all work queued on the legacy default stream and returns when the result is in
 * place, like every hook. With a stream named, the collective starts after the work queued on
 * that stream so far, and the hook returns once it is queued: the stream's later work waits for
 * the result. Returns 0, or -1 (device < 0). */
DPSHIM_HOOK_DECL int dp_set_stream(int32_t device, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* DPSHIM_HOOKS_H */
