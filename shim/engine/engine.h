/* The data-parallel engine: backend choice and lazy opening, fused collectives on tensor lists,
 * and the per-step state the hooks share (batch share, scopes, pending gradients). */
#ifndef DPS_ENGINE_H
#define DPS_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "core/dps.h"
#include "dpshim/hooks.h"

typedef struct dps_engine {
    const dps_backend_t *be; /* NULL until first use; &dps_backend_self at world size 1 */
    const char *be_name;
    int released; /* the program called MPI_Finalize */
    int scope_depth;
    const char *scope_name;
    uint64_t batch_share, batch_n; /* last dp_batch: this rank's share of a global batch */
    int have_batch;
    uint64_t step;
    /* a hook shared out work across ranks: a gradient averaged, a batch or an epoch split */
    int shared_work;
    uint64_t whole_batches; /* batches every rank took whole: an evaluation pass (dpshim_batch_whole) */
    /* the script distributes itself; the Python adapter stepped aside (dpshim_step_aside) */
    int aside;
    char aside_why[160]; /* what the adapter found: "a DistributedSampler", ... */
    /* the rank broadcasts come from: 0, except inside dp_from_owners (one thread at a time) */
    int bcast_root;
    /* inside dp_from_owners (elastic mode): a loss ends the call at the collective where every
     * survivor finds it, instead of running the rest under the survivors' new numbering */
    int stop_at_loss;
} dps_engine_t;

/* A collective that dps_e.stop_at_loss gave up at a loss: every survivor has completed the same
 * collectives before it (what a laggard missed is replayed to it) and none runs it. */
#define DPS_STOPPED_AT_LOSS 1

extern dps_engine_t dps_e;
extern const dps_backend_t dps_backend_self;

int dps_engine_configure(dps_state_t *s, char *err, size_t errlen);
void dps_engine_shutdown(void);
/* At exit of a rank process that never opened the backend: opens it for the exit barrier. */
void dps_engine_join_at_exit(void);
void dps_engine_before_mpi_finalize(void);
int dps_engine_owns_mpi_init(void);

/* When the backend opens (agree.c): every rank has the same job-wide policy (keys of scope JOB,
 * [hook] declarations, this library's version), or every rank ends with an error naming the
 * keys, ranks and values; decisions left to "auto" are taken for the job; every rank's host is
 * gathered, and clocks are compared with rank 0's where diagnostics are on. `hook` opened it. */
void dps_engine_agree(const dps_backend_t *be, const char *hook);

/* The backend for a collective of `hook`, or NULL when it acts as world size 1 (a single rank,
 * a rank-0 scope, a child process). Opens the backend on first use; fatal if that fails. */
const dps_backend_t *dps_comm(const char *hook);

/* A tensor this large goes to the backend in place: its own reduction already runs at full
 * speed (in pieces), while packing it would cost two copies. Smaller ones are packed, since
 * for them each call's latency is what counts. */
#define DPS_INPLACE_MIN_BYTES (256u << 10)

/* The weight of each rank's elements in a sum. On the host path one every rank shares multiplies
 * the reduced sum, once, piece by piece while each piece is in cache (as Horovod's postscale): no
 * pass over the input, and one rounding. A rank's own weight (split mode's unequal shares of a
 * batch) must multiply its elements before the reduction. NCCL applies either kind before (its
 * pre-multiplied sum): the last bit may differ from the host path's at 3 ranks or more. Integers
 * are summed as they are. */
typedef struct dps_weight {
    double scale;
    int per_rank;
} dps_weight_t;
#define DPS_UNWEIGHTED ((dps_weight_t){1.0, 0})

/* GRADS: an all-reduce that [comm] compress may send in half precision. BARRIER: no data. */
typedef enum { DPS_FUSE_ALLREDUCE, DPS_FUSE_GRADS, DPS_FUSE_BCAST, DPS_FUSE_BARRIER } dps_fuse_t;
/* A tensor's name for messages. */
static inline const char *dps_tensor_name(const dp_tensor *t)
{
    return t->name ? t->name : "unnamed";
}

/* The elements of t[0..n) (for the guard's fingerprints). */
static inline uint64_t dps_total_count(const dp_tensor *t, size_t n)
{
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += t[i].count;
    return c;
}

/* The host path (fusion.c): reduce (float elements weighted by w; scale 0 gives exact zeros) or
 * broadcast from rank 0 the tensors t[0..n), all in host memory, in place, packed into buckets of
 * [comm] bucket_mb; tensors of a bucket's size or more go to the backend in place. Returns 0, -1
 * after logging, or DPS_STOPPED_AT_LOSS (dps_e.stop_at_loss). The hook ABI (hook_abi.c) decides
 * what goes here and what to the GPU path (device.c), which stages through here where it must. */
int dps_fused_host(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n, dps_fuse_t kind,
                   dps_weight_t w, dps_redop_t op);

/* The same for gradients on the backend's background channel, from the progress thread only:
 * no guard position (the main thread waiting in dp_grads is the guarded one), and a failure is
 * described in err and returned rather than ending the process. */
int dps_fused_background(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n,
                         dps_weight_t w, char *err, size_t errlen);

/* A barrier of the main thread, watched by the guard like any collective. 0, or fatal. */
int dps_barrier(const char *hook, const dps_backend_t *be);

/* A declarative hook's allreduce action: t in place with op DP_SUM, DP_MEAN, DP_MIN or DP_MAX.
 * `where` names the hook in reports and traces, which keep the pointer: it must outlive the job. */
int dps_hook_allreduce(const char *where, dp_tensor *t, int op);
/* A declarative hook's barrier action (the same rule for `where`). */
int dps_hook_barrier(const char *where);

#endif
