/* The hook ABI v1 (hooks/include/dpshim/hooks.h): what a framework's calls do in a job. At world
 * size 1 every hook returns before touching data. */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "engine.h"
#include "device.h"
#include "diag/diag.h"
#include "guard/guard.h"
#include "progress.h"
#include "shard.h"

DPS_EXPORT int dp_rank(void) { return dps_g.rank; }
DPS_EXPORT int dp_world_size(void) { return dps_g.size; }
DPS_EXPORT int dp_local_rank(void) { return dps_g.local_rank; }

/* The hooks' own lists could not grow: say so, since this rank now misses a collective the
 * others enter (the guard then names it). */
static int no_memory(const char *hook, size_t n)
{
    DPS_ERROR("%s: out of memory tracking %zu gradient tensors; this rank cannot take part in the reduction", hook, n);
    return -1;
}

/* A NULL list with elements: the framework's bug, named before it becomes a SIGSEGV. */
static int null_list(const char *hook, const void *p, size_t n)
{
    if (DPS_LIKELY(p || !n)) return 0;
    DPS_ERROR("%s: called with a NULL pointer for %zu element(s); nothing was reduced", hook, n);
    return -1;
}

DPS_EXPORT int dp_params(dp_tensor *t, size_t n)
{
    if (null_list("dp_params", t, n)) return -1;
    dps_guard_params(t, n);
    const dps_backend_t *be = dps_comm("dp_params");
    return be ? dps_fused("dp_params", be, t, n, DPS_FUSE_BCAST, 1.0, DPS_RED_SUM) : 0;
}

DPS_EXPORT int dp_seed(uint64_t *seed)
{
    if (null_list("dp_seed", seed, 1)) return -1;
    const dps_backend_t *be = dps_comm("dp_seed");
    if (!be) return 0;
    dp_tensor t = {seed, 1, DP_I64, DP_HOST, "seed"};
    return dps_fused("dp_seed", be, &t, 1, DPS_FUSE_BCAST, 1.0, DPS_RED_SUM);
}

DPS_EXPORT size_t dp_batch(uint64_t *idx, size_t n)
{
    uint64_t start = 0, share = n;
    if (dps_g.split_mode && dps_g.eff_size > 1) {
        dps_split_range(n, dps_g.eff_rank, dps_g.eff_size, &start, &share);
        if (start) memmove(idx, idx + start, share * sizeof *idx);
    }
    dps_e.batch_share = share, dps_e.batch_n = n, dps_e.have_batch = 1;
    return share;
}

_Static_assert((int)DPS_UNEVEN_PAD == (int)DPS_V_data_uneven_pad && (int)DPS_UNEVEN_DROP == (int)DPS_V_data_uneven_drop &&
                   (int)DPS_UNEVEN_JOIN == (int)DPS_V_data_uneven_join,
               "[data] uneven must list its values in dps_uneven_t's order: dps_g.uneven is passed on as it is");

DPS_EXPORT size_t dp_epoch(uint64_t *idx, size_t n)
{
    if (dps_g.split_mode || dps_g.eff_size == 1) return n;
    size_t head = n < (size_t)dps_g.eff_size ? n : (size_t)dps_g.eff_size;
    uint64_t *scratch = malloc((head ? head : 1) * sizeof *scratch); /* once per epoch */
    if (!scratch) {
        DPS_ERROR("dp_epoch: out of memory");
        return n;
    }
    size_t keep = dps_epoch_shard(idx, n, dps_g.eff_rank, dps_g.eff_size, (dps_uneven_t)dps_g.uneven, scratch);
    free(scratch);
    return keep;
}

/* Weight of this rank's gradient in the reduced one. */
static double grad_scale(void)
{
    if (dps_g.reduce_sum) return 1.0;
    if (dps_g.split_mode && dps_e.have_batch) return dps_split_weight(dps_e.batch_share, dps_e.batch_n);
    return 1.0 / dps_g.eff_size;
}

/* Gradients announced by dp_grad_ready in this step: pending (not yet reduced) and done. Grown
 * to the model's size in the first steps, then reused. */
static struct {
    dp_tensor *pending;
    size_t npending, cap_pending, pending_bytes;
    const void **done;
    size_t ndone, cap_done;
    dp_tensor *rest;
    size_t cap_rest;
    int submitted; /* [comm] overlap: groups handed to the progress thread in this step */
    uint64_t submitted_count; /* and their elements */
} ready;

/* Hands t[0..n) to the progress thread as one group. */
static int submit(const dp_tensor *t, size_t n)
{
    uint64_t count = dps_total_count(t, n);
    dps_guard_note("dp_grad_ready", DPS_COLL_ALLREDUCE, t[0].dtype, count);
    ready.submitted++, ready.submitted_count += count;
    return dps_progress_submit(t, n, grad_scale());
}

static int flush_pending(const dps_backend_t *be, int background)
{
    if (!ready.npending) return 0;
    if (dps_grow((void **)&ready.done, &ready.cap_done, ready.ndone + ready.npending, sizeof *ready.done))
        return no_memory("dp_grad_ready", ready.ndone + ready.npending);
    int rc = background ? submit(ready.pending, ready.npending)
                        : dps_fused_host("dp_grad_ready", be, ready.pending, ready.npending, DPS_FUSE_GRADS,
                                         grad_scale(), DPS_RED_SUM);
    if (rc) return rc; /* a bucket that failed stays pending: dp_grads reduces (or reports) it */
    for (size_t i = 0; i < ready.npending; i++) ready.done[ready.ndone++] = ready.pending[i].data;
    ready.npending = ready.pending_bytes = 0;
    return 0;
}

DPS_EXPORT int dp_grad_ready(const dp_tensor *t)
{
    if (null_list("dp_grad_ready", t, 1)) return -1;
    const dps_backend_t *be = dps_comm("dp_grad_ready");
    if (!be) return 0;
    dp_tensor *host, *device;
    size_t nhost, ndevice;
    int split = dps_device_split(t, 1, &host, &nhost, &device, &ndevice);
    if (split) return split < 0 ? -1 : dps_device_grad_ready(be, device, grad_scale());
    if (dps_grow((void **)&ready.pending, &ready.cap_pending, ready.npending + 1, sizeof *ready.pending))
        return no_memory("dp_grad_ready", ready.npending + 1);
    ready.pending[ready.npending++] = *t;
    size_t bytes = t->count * dps_dtype_size(dps_reduce_dtype(t->dtype));
    ready.pending_bytes += bytes;
    /* A full bucket is reduced now (in the background with [comm] overlap), and so is a tensor
     * large enough to travel alone; the rest waits for dp_grads. */
    int background = dps_progress_available(be);
    if (ready.pending_bytes >= dps_g.bucket_bytes || (background && bytes >= DPS_INPLACE_MIN_BYTES))
        return flush_pending(be, background);
    return 0;
}

static int announced(const void *data)
{
    for (size_t i = 0; i < ready.ndone; i++)
        if (ready.done[i] == data) return 1;
    for (size_t i = 0; i < ready.npending; i++)
        if (ready.pending[i].data == data) return 1;
    return 0;
}

DPS_EXPORT int dp_grads(dp_tensor *t, size_t n)
{
    if (null_list("dp_grads", t, n)) return -1;
    const dps_backend_t *be = dps_comm("dp_grads");
    if (!be) return 0;
    if (dps_grow((void **)&ready.rest, &ready.cap_rest, ready.npending + n, sizeof *ready.rest))
        return no_memory("dp_grads", ready.npending + n);
    /* GPU gradients first (queued on the GPU), then the host's */
    dp_tensor *host, *device;
    size_t nhost, ndevice;
    int split = dps_device_split(t, n, &host, &nhost, &device, &ndevice);
    if (split < 0) return -1;
    if (split || dps_device_outstanding()) {
        if (dps_device_grads(be, split ? device : NULL, split ? ndevice : 0, grad_scale())) return -1;
        if (split) t = host, n = nhost;
    }
    size_t m = 0;
    for (size_t i = 0; i < ready.npending; i++) ready.rest[m++] = ready.pending[i];
    for (size_t i = 0; i < n; i++)
        if (!(ready.ndone + ready.npending) || !announced(t[i].data)) ready.rest[m++] = t[i];
    ready.npending = ready.pending_bytes = ready.ndone = 0;
    if (!ready.submitted) return dps_fused_host("dp_grads", be, ready.rest, m, DPS_FUSE_GRADS, grad_scale(), DPS_RED_SUM);
    /* [comm] overlap: the rest joins the queue, and the wait is what the guard watches */
    if (m && submit(ready.rest, m)) return -1;
    dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, m ? ready.rest[0].dtype : DP_F32, ready.submitted_count);
    ready.submitted = 0, ready.submitted_count = 0;
    uint64_t t0 = dps_diag_on ? dps_diag_now() : 0;
    char err[1024];
    int rc = dps_progress_wait(err, sizeof err);
    if (dps_diag_on) dps_diag_collective("dp_grads", 0, t0, dps_diag_now(), dps_guard_seq(), dps_e.step);
    dps_guard_leave();
    if (rc) {
        char where[96];
        dps_guard_where(where, sizeof where);
        dps_fatal("dp_grads (%s): %s", where, err);
    }
    return 0;
}

DPS_EXPORT int dp_bn_stats(dp_tensor *sum, dp_tensor *sumsq, uint64_t *count)
{
    if (null_list("dp_bn_stats", sum, 1) || null_list("dp_bn_stats", sumsq, 1) || null_list("dp_bn_stats", count, 1))
        return -1;
    if (!dps_g.bn_sync) return 0;
    const dps_backend_t *be = dps_comm("dp_bn_stats");
    if (!be) return 0;
    if (sum->dtype == DP_F64 && sumsq->dtype == DP_F64) {
        /* one bucket: the count rides along as a double (exact below 2^53) */
        double c = (double)*count;
        dp_tensor t[3] = {*sum, *sumsq, {&c, 1, DP_F64, DP_HOST, "count"}};
        int rc = dps_fused("dp_bn_stats", be, t, 3, DPS_FUSE_ALLREDUCE, 1.0, DPS_RED_SUM);
        *count = (uint64_t)c;
        return rc;
    }
    dp_tensor t[3] = {*sum, *sumsq, {count, 1, DP_I64, DP_HOST, "count"}};
    return dps_fused("dp_bn_stats", be, t, 3, DPS_FUSE_ALLREDUCE, 1.0, DPS_RED_SUM);
}

static dps_redop_t redop_of(int op)
{
    return op == DP_MIN ? DPS_RED_MIN : op == DP_MAX ? DPS_RED_MAX : DPS_RED_SUM;
}

DPS_EXPORT int dp_metric(double *v, size_t n, int op)
{
    if (op < DP_SUM || op > DP_MAX) {
        DPS_ERROR("dp_metric: unknown op %d; use DP_SUM, DP_MEAN, DP_MIN or DP_MAX", op);
        return -1;
    }
    if (null_list("dp_metric", v, n)) return -1;
    const dps_backend_t *be = dps_comm("dp_metric");
    if (!be) return 0;
    dp_tensor t = {v, n, DP_F64, DP_HOST, "metric"};
    int rc = dps_fused("dp_metric", be, &t, 1, DPS_FUSE_ALLREDUCE, 1.0, redop_of(op));
    if (rc == 0 && op == DP_MEAN)
        for (size_t i = 0; i < n; i++) v[i] /= dps_g.eff_size;
    return rc;
}

int dps_hook_allreduce(const char *where, dp_tensor *t, int op)
{
    const dps_backend_t *be = dps_comm(where);
    if (!be) return 0;
    return dps_fused(where, be, t, 1, DPS_FUSE_ALLREDUCE, op == DP_MEAN ? 1.0 / dps_g.eff_size : 1.0,
                     redop_of(op));
}

int dps_hook_barrier(const char *where)
{
    const dps_backend_t *be = dps_comm(where);
    return be ? dps_barrier(where, be) : 0;
}

DPS_EXPORT int dp_scope_begin(const char *name)
{
    dps_e.scope_depth++;
    dps_e.scope_name = name;
    return dps_g.eff_rank == 0;
}

DPS_EXPORT int dp_scope_end(void)
{
    if (dps_e.scope_depth == 0) {
        DPS_WARN("dp_scope_end without a matching dp_scope_begin");
        return -1;
    }
    dps_e.scope_depth--;
    return 0;
}

DPS_EXPORT int dp_step_end(uint64_t step)
{
    dps_e.step = step;
    dps_guard_step(step, dps_e.scope_depth > 0);
    dps_diag_step(step);
    if (ready.npending || dps_device_outstanding())
        DPS_WARN_ONCE("step %llu ended with gradients announced by dp_grad_ready but never reduced "
                      "by dp_grads", (unsigned long long)step);
    return 0;
}
