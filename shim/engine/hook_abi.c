/* The hook ABI (hooks/include/dpshim/hooks.h): what a framework's calls do in a job. At world
 * size 1 every hook returns before touching data. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "common.h"
#include "device.h"
#include "diag/diag.h"
#include "elastic.h"
#include "guard/guard.h"
#include "progress.h"
#include "shard.h"

DPS_EXPORT int dp_abi_version(void)
{
    return DPSHIM_HOOK_ABI_VERSION;
}
/* After a lost rank (elastic mode) the survivors are the job, renumbered in order. */
DPS_EXPORT int dp_rank(void)
{
    return DPS_UNLIKELY(dps_elastic_shrunk()) ? dps_g.eff_rank : dps_g.rank;
}
DPS_EXPORT int dp_world_size(void)
{
    return DPS_UNLIKELY(dps_elastic_shrunk()) ? dps_g.eff_size : dps_g.size;
}
DPS_EXPORT int dp_local_rank(void)
{
    return dps_g.local_rank;
}

/* The hooks' own lists could not grow: say so, since this rank now misses a collective the
 * others enter (the guard then names it). */
static int no_memory(const char *hook, size_t n)
{
    DPS_ERROR("%s: out of memory tracking %zu gradient tensors; this rank cannot take part in the reduction",
              hook, n);
    return -1;
}

/* A NULL list with elements: the framework's bug, named before it becomes a SIGSEGV. */
static int null_list(const char *hook, const void *p, size_t n)
{
    if (DPS_LIKELY(p || !n)) return 0;
    DPS_ERROR("%s: called with a NULL pointer for %zu element(s); nothing was reduced", hook, n);
    return -1;
}

/* A collective of the hooks on t[0..n): where every tensor is in host memory (the common case,
 * known at a glance) the host path, else the host's tensors then the GPU's, the same order on
 * every rank; every tensor is checked before the first collective, GPU ones too. */
static int collective(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n,
                      dps_fuse_t kind, dps_weight_t w, dps_redop_t op)
{
    dp_tensor *host, *device;
    size_t nhost, ndevice;
    int split = dps_device_split(t, n, &host, &nhost, &device, &ndevice);
    if (DPS_LIKELY(split == 0)) return dps_fused_host(hook, be, t, n, kind, w, op);
    if (split < 0 || dps_check_tensors(hook, t, n, 1)) return -1;
    dps_guard_tensors(t, n);
    int rc = nhost ? dps_fused_host(hook, be, host, nhost, kind, w, op) : 0;
    return rc ? rc : dps_device_fused(hook, be, device, ndevice, kind, w, op); /* rc: -1, or stopped */
}

static int params_(dp_tensor *t, size_t n)
{
    if (null_list("dp_params", t, n)) return -1;
    dps_guard_params(t, n);
    const dps_backend_t *be = dps_comm("dp_params");
    return be ? collective("dp_params", be, t, n, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM) : 0;
}

/* Each owner's tensors as broadcasts from it, owners in rank order: every rank walks the same
 * owner[] alike, so the collective sequence is the same everywhere. */
static int from_owners_(dp_tensor *t, size_t n, const int32_t *owner)
{
    static dp_tensor *group;
    static size_t cap;
    if (null_list("dp_from_owners", t, n) || null_list("dp_from_owners", owner, n)) return -1;
    /* owners are ranks as dp_rank numbers them: after a lost rank, the survivors' */
    int size = dp_world_size();
    for (size_t i = 0; i < n; i++)
        if (owner[i] < 0 || owner[i] >= size) {
            DPS_ERROR("dp_from_owners: tensor %zu (%s) names owner %d, outside the job's ranks 0..%d%s; "
                      "nothing was sent",
                      i, dps_tensor_name(&t[i]), owner[i], size - 1,
                      size < dps_g.size ? " (the survivors of a lost rank, as dp_world_size() says now)"
                                        : "");
            return -1;
        }
    const dps_backend_t *be = dps_comm("dp_from_owners");
    if (!be) return 0;
    if (dps_grow((void **)&group, &cap, n, sizeof *group)) return no_memory("dp_from_owners", n);
    unsigned losses = dps_elastic_generation();
    for (int r = 0; r < size; r++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (owner[i] == r) group[m++] = t[i];
        if (!m) continue;
        dps_e.bcast_root = r, dps_e.stop_at_loss = 1;
        int rc = collective("dp_from_owners", be, group, m, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM);
        dps_e.bcast_root = 0, dps_e.stop_at_loss = 0;
        if (rc < 0) return rc;
        if (rc == 0 && dps_elastic_generation() == losses) continue;
        /* owners name ranks as they were numbered: after a loss (the survivors renumbered) the
         * rest would come from other ranks, and a lost owner's tensors cannot come at all. Every
         * survivor ends the call after the same collective, which completed before the loss:
         * this one where its result was replayed here (rc 0), the one before where this one
         * stopped. Where nothing is left to send the call is whole. */
        int first_missing = rc == DPS_STOPPED_AT_LOSS ? r : r + 1;
        for (size_t i = 0; i < n; i++)
            if (owner[i] >= first_missing) {
                dps_elastic_tell(); /* as the survivors that stopped at the next one were */
                DPS_ERROR(
                    "dp_from_owners: a rank was lost during the call and the survivors are numbered "
                    "anew (dp_world_size() is %d now): the tensors of owner %d and after were not sent; "
                    "call it again with owners among the survivors",
                    dp_world_size(), first_missing);
                return -1;
            }
        return 0;
    }
    return 0;
}

static int seed_(uint64_t *seed)
{
    if (null_list("dp_seed", seed, 1)) return -1;
    const dps_backend_t *be = dps_comm("dp_seed");
    if (!be) return 0;
    dp_tensor t = {seed, 1, DP_I64, DP_HOST, "seed"};
    return collective("dp_seed", be, &t, 1, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM);
}

/* This rank's share of a global batch of n in split mode (all of it in scale mode), noted for the
 * weights of the gradients that follow; where the share starts goes to start_p. */
static uint64_t note_batch(uint64_t n, uint64_t *start_p)
{
    uint64_t start = 0, share = n;
    if (dps_g.split_mode && dps_g.eff_size > 1)
        dps_split_range(n, dps_g.eff_rank, dps_g.eff_size, &start, &share);
    dps_e.batch_share = share, dps_e.batch_n = n, dps_e.have_batch = 1;
    dps_elastic_note_batch();
    *start_p = start;
    return share;
}

static size_t batch_(uint64_t *idx, size_t n)
{
    uint64_t start, share = note_batch(n, &start);
    if (start) memmove(idx, idx + start, share * sizeof *idx);
    dps_elastic_epoch_batch(n); /* in scale mode: what a lost rank trained is counted in batches */
    dps_e.shared_work |= dps_g.eff_size > 1;
    return share;
}

/* A batch of n that every rank takes whole (an evaluation pass of the PyTorch adapter): weighed as
 * a share of the N copies, as dp_batch of n * N would, but no work was shared out by it, so a job
 * that only evaluates is told that nothing was distributed. */
static size_t whole_batch_(uint64_t n)
{
    uint64_t start;
    dps_e.whole_batches++;
    return note_batch(n * (uint64_t)dps_g.eff_size, &start);
}

_Static_assert(
    (int)DPS_UNEVEN_PAD == (int)DPS_V_data_uneven_pad &&
        (int)DPS_UNEVEN_DROP == (int)DPS_V_data_uneven_drop &&
        (int)DPS_UNEVEN_JOIN == (int)DPS_V_data_uneven_join,
    "[data] uneven must list its values in dps_uneven_t's order: dps_g.uneven is passed on as it is");

static size_t epoch_(uint64_t *idx, size_t n)
{
    if (dps_g.split_mode) return n;
    dps_elastic_note_epoch(idx, n); /* for the shards of ranks lost in it (one survivor too) */
    if (dps_g.eff_size == 1) return n;
    dps_e.shared_work = 1;
    size_t head = n < (size_t)dps_g.eff_size ? n : (size_t)dps_g.eff_size;
    uint64_t *scratch = malloc((head ? head : 1) * sizeof *scratch); /* once per epoch */
    if (!scratch) {
        DPS_ERROR("dp_epoch: out of memory");
        return n;
    }
    size_t keep =
        dps_epoch_shard(idx, n, dps_g.eff_rank, dps_g.eff_size, (dps_uneven_t)dps_g.uneven, scratch);
    free(scratch);
    return keep;
}

/* How many samples of an epoch of n dp_epoch keeps on this rank now, without drawing one. */
static size_t epoch_count_(size_t n)
{
    if (dps_g.split_mode || dps_g.eff_size == 1) return n;
    return dps_epoch_count(n, dps_g.eff_rank, dps_g.eff_size, (dps_uneven_t)dps_g.uneven);
}

/* Scale mode, at the end of this rank's shard of an epoch (elastic mode): this rank's share of what
 * ranks lost in it had not trained, the lowest survivor's list for every survivor (one list, one
 * truth: each cut alike), into idx[0..cap); its length (0: none, or not elastic). Called again
 * once that share is trained, the same for what ranks lost meanwhile had not trained of their
 * work (their shards, then their shares). Every survivor calls it at the same place (shards of
 * one length: [data] uneven = pad or drop) and makes the same broadcasts, whether it met a loss
 * or not: the count, then the list where there is one. A call after one that could not hold the
 * whole share (idx NULL, or cap short) returns that share again. */
static size_t epoch_rest_(uint64_t *idx, size_t cap)
{
    uint64_t n = 0;
    const uint64_t *mine = NULL;
    if (dps_elastic_rest_due()) {
        const dps_backend_t *be = dps_comm("dp_epoch_rest");
        uint64_t count, have;
        dps_elastic_rest(&count);
        dp_tensor t = {&count, 1, DP_I64, DP_HOST, "epoch rest count"};
        if (!be || collective("dp_epoch_rest", be, &t, 1, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM))
            return 0;
        uint64_t *all = calloc(count ? count : 1, sizeof *all);
        if (!all) /* every rank makes the next broadcast, or the job ends */
            dps_fatal("dp_epoch_rest: out of memory for %llu samples", (unsigned long long)count);
        /* after the broadcast: a loss inside it may add. Every rank fills the list (each holds the
         * same): where rank 0 is lost in the next broadcast, the one that takes its place sends it */
        const uint64_t *rest = dps_elastic_rest(&have);
        if (count) memcpy(all, rest, (have < count ? have : count) * sizeof *all);
        t = (dp_tensor){all, count, DP_I64, DP_HOST, "epoch rest"};
        int rc =
            count ? collective("dp_epoch_rest", be, &t, 1, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM) : 0;
        if (!rc) mine = dps_elastic_rest_share(all, count, idx ? cap : 0, &n);
        free(all);
        if (rc) return 0;
        if (dps_g.eff_rank == 0 && count)
            DPS_WARN("elastic: the %llu samples of this epoch the lost rank(s) had not trained are trained "
                     "now, %llu by each survivor ([data] uneven applies)",
                     (unsigned long long)count, (unsigned long long)n);
    } else {
        mine = dps_elastic_rest_share(NULL, 0, idx ? cap : 0, &n);
    }
    if (idx && mine) memcpy(idx, mine, (n < cap ? n : cap) * sizeof *idx);
    return n;
}

/* Weight of this rank's gradient in the reduced one. Every rank shares it unless split mode cut
 * the batch into unequal shares; each rank knows that from the batch size alone, so all take the
 * same side (a shared weight goes on the reduced sum, a rank's own on what it sends). */
static dps_weight_t grad_weight(void)
{
    if (dps_g.reduce_sum) return DPS_UNWEIGHTED;
    dps_weight_t w;
    if (dps_g.split_mode && DPS_UNLIKELY(dps_elastic_batch_weight(dps_e.batch_share, &w))) return w;
    if (dps_g.split_mode && dps_e.have_batch)
        return (dps_weight_t){dps_split_weight(dps_e.batch_share, dps_e.batch_n),
                              dps_e.batch_n % (uint64_t)dps_g.eff_size != 0};
    return (dps_weight_t){1.0 / dps_g.eff_size, 0};
}

/* Gradients in host memory announced by dp_grad_ready in this step (the GPU's are device.c's).
 * Grown to the model's size in the first steps, then reused. */
static dps_ready_t ready;
static struct {
    int submitted;            /* [comm] overlap: groups handed to the progress thread in this step */
    uint64_t submitted_count; /* and their elements */
} overlap;

/* Hands t[0..n) to the progress thread as one group. */
static int submit(const dp_tensor *t, size_t n)
{
    uint64_t count = dps_total_count(t, n);
    dps_guard_tensors(t, n);
    dps_guard_note("dp_grad_ready", DPS_COLL_ALLREDUCE, t[0].dtype, count);
    overlap.submitted++, overlap.submitted_count += count;
    return dps_progress_submit(t, n, grad_weight());
}

static int flush_pending(const dps_backend_t *be, int background)
{
    if (!ready.npending) return 0;
    if (dps_ready_reserve(&ready)) return no_memory("dp_grad_ready", ready.nhanded + ready.npending);
    int rc = background ? submit(ready.pending, ready.npending)
                        : dps_fused_host("dp_grad_ready", be, ready.pending, ready.npending, DPS_FUSE_GRADS,
                                         grad_weight(), DPS_RED_SUM);
    if (rc) return rc; /* a bucket that failed stays pending: dp_grads reduces (or reports) it */
    dps_ready_handed_on(&ready);
    return 0;
}

static int grad_ready_(const dp_tensor *t)
{
    if (null_list("dp_grad_ready", t, 1)) return -1;
    const dps_backend_t *be = dps_comm("dp_grad_ready");
    if (!be) return 0;
    dps_e.shared_work |= dps_g.eff_size > 1;
    dp_tensor *host, *device;
    size_t nhost, ndevice;
    int split = dps_device_split(t, 1, &host, &nhost, &device, &ndevice);
    if (split) return split < 0 ? -1 : dps_device_grad_ready(be, device, grad_weight());
    size_t bytes = t->count * dps_dtype_size(dps_reduce_dtype(t->dtype));
    if (dps_ready_add(&ready, t, bytes)) return no_memory("dp_grad_ready", ready.npending + 1);
    /* A full bucket is reduced now (in the background with [comm] overlap), and so is a tensor
     * large enough to travel alone; the rest waits for dp_grads. */
    int background = dps_progress_available(be);
    if (ready.pending_bytes >= dps_g.bucket_bytes || (background && bytes >= DPS_INPLACE_MIN_BYTES))
        return flush_pending(be, background);
    return 0;
}

/* dp_grads with the weight w, under the name hook: the average, or the plain sum of a step whose
 * loss is a sum over the batch (dpshim_grads_summed). */
static int grads_weighted(const char *hook, dp_tensor *t, size_t n, dps_weight_t w)
{
    if (null_list(hook, t, n)) return -1;
    const dps_backend_t *be = dps_comm(hook);
    if (!be) return 0;
    dps_e.shared_work |= dps_g.eff_size > 1;
    /* room for the host's list before any collective: a rank that runs short must not leave the
     * others in the GPU's */
    if (dps_ready_make_room(&ready, n)) return no_memory(hook, ready.npending + n);
    /* GPU gradients first (queued on the GPU), then the host's */
    dp_tensor *host, *device;
    size_t nhost, ndevice;
    int split = dps_device_split(t, n, &host, &nhost, &device, &ndevice);
    if (split < 0) return -1;
    if (split || dps_device_outstanding()) {
        if (dps_device_grads(be, split ? device : NULL, split ? ndevice : 0, w)) return -1;
        if (split) t = host, n = nhost;
    }
    size_t m;
    dps_ready_complete(&ready, t, n, &m); /* the room is made */
    if (!overlap.submitted) return dps_fused_host(hook, be, ready.rest, m, DPS_FUSE_GRADS, w, DPS_RED_SUM);
    /* [comm] overlap: the rest joins the queue, and the wait is what the guard watches */
    if (m && submit(ready.rest, m)) return -1;
    dps_guard_enter(hook, DPS_COLL_ALLREDUCE, m ? ready.rest[0].dtype : DP_F32, overlap.submitted_count);
    overlap.submitted = 0, overlap.submitted_count = 0;
    uint64_t t0 = dps_diag_now();
    char err[1024];
    int rc = dps_progress_wait(err, sizeof err);
    dps_diag_collective(hook, 0, t0, dps_diag_now(), dps_guard_seq(), dps_e.step);
    dps_guard_leave();
    if (rc) {
        char where[96];
        dps_guard_where(where, sizeof where);
        dps_fatal("%s (%s): %s", hook, where, err);
    }
    return 0;
}

static int grads_(dp_tensor *t, size_t n)
{
    return grads_weighted("dp_grads", t, n, grad_weight());
}

/* The adapter's, for a step whose loss sums over the batch (reduction='sum'): each rank's
 * gradient is a sum over its share, so the global one is their plain sum, whatever [comm] reduce
 * says. Its own name in the collective record, so the desync check sees a rank that averages
 * where another sums. */
static int grads_summed_(dp_tensor *t, size_t n)
{
    return grads_weighted("dp_grads(sum)", t, n, DPS_UNWEIGHTED);
}

static int bn_stats_(dp_tensor *sum, dp_tensor *sumsq, uint64_t *count)
{
    if (null_list("dp_bn_stats", sum, 1) || null_list("dp_bn_stats", sumsq, 1) ||
        null_list("dp_bn_stats", count, 1))
        return -1;
    if (!dps_g.bn_sync) return 0;
    const dps_backend_t *be = dps_comm("dp_bn_stats");
    if (!be) return 0;
    if (sum->dtype == DP_F64 && sumsq->dtype == DP_F64) {
        /* one bucket: the count rides along as a double (exact below 2^53) */
        double c = (double)*count;
        dp_tensor t[3] = {*sum, *sumsq, {&c, 1, DP_F64, DP_HOST, "count"}};
        int rc = collective("dp_bn_stats", be, t, 3, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, DPS_RED_SUM);
        *count = (uint64_t)c;
        return rc;
    }
    dp_tensor t[3] = {*sum, *sumsq, {count, 1, DP_I64, DP_HOST, "count"}};
    return collective("dp_bn_stats", be, t, 3, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, DPS_RED_SUM);
}

static dps_redop_t redop_of(int op)
{
    return op == DP_MIN ? DPS_RED_MIN : op == DP_MAX ? DPS_RED_MAX : DPS_RED_SUM;
}

static int metric_(double *v, size_t n, int op)
{
    if (op < DP_SUM || op > DP_MAX) {
        DPS_ERROR("dp_metric: unknown op %d; use DP_SUM, DP_MEAN, DP_MIN or DP_MAX", op);
        return -1;
    }
    if (null_list("dp_metric", v, n)) return -1;
    const dps_backend_t *be = dps_comm("dp_metric");
    if (!be) return 0;
    dp_tensor t = {v, n, DP_F64, DP_HOST, "metric"};
    int rc = collective("dp_metric", be, &t, 1, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, redop_of(op));
    if (rc == 0 && op == DP_MEAN)
        for (size_t i = 0; i < n; i++)
            v[i] /= dps_g.eff_size;
    return rc;
}

static int hook_allreduce_(const char *where, dp_tensor *t, int op)
{
    const dps_backend_t *be = dps_comm(where);
    if (!be) return 0;
    return collective(where, be, t, 1, DPS_FUSE_ALLREDUCE,
                      (dps_weight_t){op == DP_MEAN ? 1.0 / dps_g.eff_size : 1.0, 0}, redop_of(op));
}

static int hook_barrier_(const char *where)
{
    const dps_backend_t *be = dps_comm(where);
    return be ? dps_barrier(where, be) : 0;
}

static int scope_begin_(const char *name)
{
    dps_e.scope_depth++;
    dps_e.scope_name = name;
    return dps_g.eff_rank == 0;
}

static int scope_end_(void)
{
    if (dps_e.scope_depth == 0) {
        DPS_WARN("dp_scope_end without a matching dp_scope_begin");
        return -1;
    }
    dps_e.scope_depth--;
    return 0;
}

static int step_end_(uint64_t step)
{
    dps_e.step = step;
    dps_elastic_step_end();
    dps_guard_step(step, dps_e.scope_depth > 0);
    dps_diag_step(step);
    if (dps_ready_outstanding(&ready) || dps_device_outstanding())
        DPS_WARN_ONCE("step %llu ended with gradients announced by dp_grad_ready but never reduced "
                      "by dp_grads",
                      (unsigned long long)step);
    return 0;
}

/* --- one thread at a time ---------------------------------------------------------------------
 * The hooks share the fusion buckets and the step's lists: two threads inside at once would mix
 * their tensors and give wrong results silently, and a hook re-entered from inside one (a signal
 * handler, a callback) would nest collectives. Either ends the rank with a message that names the
 * hooks and the threads. The cost: one compare-and-swap per call. */

static __thread char thread_marker; /* its address tells the threads apart */
static __thread int thread_id;
static _Atomic(void *) inside_thread;
static _Atomic(const char *) inside_hook;
static atomic_int inside_tid;

static int my_tid(void)
{
    if (!thread_id) thread_id = (int)gettid();
    return thread_id;
}

static _Noreturn void two_at_once(const char *hook, void *other)
{
    const char *busy = atomic_load(&inside_hook);
    if (other == &thread_marker)
        dps_fatal(
            "%s was called from inside %s on the same thread (%d): a hook must not be re-entered (from a "
            "signal handler, or a callback run inside a hook); nothing was reduced",
            hook, busy ? busy : "another hook", my_tid());
    dps_fatal(
        "%s was called by thread %d while thread %d is inside %s: the hooks must be called by one thread "
        "at a time (the training thread); two at once would mix their tensors and give wrong results",
        hook, my_tid(), atomic_load(&inside_tid), busy ? busy : "another hook");
}

static void enter(const char *hook)
{
    void *none = NULL;
    while (DPS_UNLIKELY(!atomic_compare_exchange_strong_explicit(
        &inside_thread, &none, &thread_marker, memory_order_acquire, memory_order_relaxed))) {
        /* a fork child inherits the parent's state, whoever was inside then: it starts afresh */
        if (atomic_load_explicit(&dps_g.forked, memory_order_relaxed) && none != &thread_marker) {
            atomic_store(&inside_thread, &thread_marker);
            break;
        }
        if (none) two_at_once(hook, none);
    }
    atomic_store_explicit(&inside_hook, hook, memory_order_relaxed);
    atomic_store_explicit(&inside_tid, my_tid(), memory_order_relaxed);
}

static void leave(void)
{
    atomic_store_explicit(&inside_thread, NULL, memory_order_release);
}


/* The exported hooks (and the declarative hooks' actions): each body above, entered by one
 * thread at a time. A declarative hook is named by its `where`. */
#define ONE_AT_A_TIME(ret, hook, name, body, params, args)                                                   \
    ret hook params                                                                                          \
    {                                                                                                        \
        enter(name);                                                                                         \
        ret r = body args;                                                                                   \
        leave();                                                                                             \
        return r;                                                                                            \
    }
DPS_EXPORT ONE_AT_A_TIME(int, dp_params, "dp_params", params_, (dp_tensor * t, size_t n), (t, n)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_from_owners, "dp_from_owners", from_owners_,
                  (dp_tensor * t, size_t n, const int32_t *owner), (t, n, owner)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_seed, "dp_seed", seed_, (uint64_t * seed), (seed)) DPS_EXPORT
    ONE_AT_A_TIME(size_t, dp_batch, "dp_batch", batch_, (uint64_t * idx, size_t n), (idx, n)) DPS_EXPORT
    ONE_AT_A_TIME(size_t, dpshim_batch_whole, "dp_batch", whole_batch_, (uint64_t n), (n)) DPS_EXPORT
    ONE_AT_A_TIME(size_t, dpshim_epoch_count, "dp_epoch", epoch_count_, (size_t n), (n)) DPS_EXPORT
    ONE_AT_A_TIME(size_t, dp_epoch_rest, "dp_epoch_rest", epoch_rest_, (uint64_t * idx, size_t cap),
                  (idx, cap)) DPS_EXPORT
    ONE_AT_A_TIME(size_t, dp_epoch, "dp_epoch", epoch_, (uint64_t * idx, size_t n), (idx, n)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_grad_ready, "dp_grad_ready", grad_ready_, (const dp_tensor *t), (t)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_grads, "dp_grads", grads_, (dp_tensor * t, size_t n), (t, n)) DPS_EXPORT
    ONE_AT_A_TIME(int, dpshim_grads_summed, "dp_grads(sum)", grads_summed_, (dp_tensor * t, size_t n),
                  (t, n)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_bn_stats, "dp_bn_stats", bn_stats_,
                  (dp_tensor * sum, dp_tensor *sumsq, uint64_t *count), (sum, sumsq, count)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_metric, "dp_metric", metric_, (double *v, size_t n, int op), (v, n, op)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_scope_begin, "dp_scope_begin", scope_begin_, (const char *name), (name)) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_scope_end, "dp_scope_end", scope_end_, (void), ()) DPS_EXPORT
    ONE_AT_A_TIME(int, dp_step_end, "dp_step_end", step_end_, (uint64_t step), (step))
        ONE_AT_A_TIME(int, dps_hook_allreduce, where, hook_allreduce_,
                      (const char *where, dp_tensor *t, int op), (where, t, op))
            ONE_AT_A_TIME(int, dps_hook_barrier, where, hook_barrier_, (const char *where), (where))
