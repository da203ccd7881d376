/* Tensors in GPU memory. At the first collective with one, every rank opens the GPU plugin
 * (plugin_abi/device.h) and the ranks agree, over the host backend, on one mode for the job:
 * NCCL (one GPU per rank), or staged through pinned host memory and the host path (ranks that
 * share a GPU, NCCL missing somewhere, or [comm] backend = mpi). Never decided by one rank.
 *
 * NCCL: buckets in device memory packed with device-to-device copies (no kernels), weights
 * through NCCL's pre-multiplied sum, all on the plugin's communication stream, which first waits
 * for the program's work (the legacy default stream, or the stream dp_set_stream named).
 * Staged: chunks of [gpu] staging_mb go device -> pinned buffer -> host path (fusion, pieces,
 * compression, the same arithmetic as host tensors) -> device, the next chunk's copy running
 * while the current one is reduced.
 * Elastic mode on NCCL: each hook call's tensors are reduced in a kept device copy, so that a
 * collective given up at a loss leaves them as they were and the last result can be replayed;
 * the communicator is made anew among the survivors at the next GPU collective. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/backend.h"
#include "core/dtype.h"
#include "common.h"
#include "device.h"
#include "diag/diag.h"
#include "elastic.h"
#include "gpu/where.h"
#include "guard/guard.h"

enum { MODE_UNSET, MODE_NCCL, MODE_STAGED };

static struct {
    const dps_device_t *gpu;
    int mode;
    int dev;
    unsigned char *pinned[2];
    size_t pinned_bytes;
    dps_ready_t ready; /* gradients announced by dp_grad_ready: pending, and queued this step */
    /* the lists a hook call's tensors are split into (dps_device_split) */
    dp_tensor *host, *device;
    size_t cap_host, cap_device;
} dv = {.dev = -1};

/* dp_set_stream: per thread, as a framework's current stream is. */
static __thread void *user_stream;
static __thread int user_stream_set;

DPS_EXPORT int dp_set_stream(int32_t device, void *stream)
{
    if (device < 0) {
        DPS_ERROR("dp_set_stream: device %d is no CUDA ordinal; pass the stream's device (0, 1, ...)",
                  (int)device);
        return -1;
    }
    user_stream = stream, user_stream_set = stream != NULL;
    return 0;
}

int dps_device_split(const dp_tensor *t, size_t n, dp_tensor **host, size_t *nhost, dp_tensor **device,
                     size_t *ndevice)
{
    int driver = -1; /* asked once per call, and only when a DP_HOST tensor needs the answer */
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++) {
        if (t[i].device >= 0)
            first = i;
        else if (t[i].count && (driver < 0 ? (driver = dps_gpu_driver_loaded()) : driver) &&
                 dps_gpu_where(t[i].data) >= 0)
            first = i;
    }
    if (first == n) return 0; /* the common case: all on the host, nothing copied */
    if (dps_grow((void **)&dv.host, &dv.cap_host, n, sizeof *dv.host) ||
        dps_grow((void **)&dv.device, &dv.cap_device, n, sizeof *dv.device)) {
        DPS_ERROR("out of memory sorting %zu tensors into host and GPU ones", n);
        return -1;
    }
    size_t h = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        dp_tensor x = t[i];
        if (x.device < 0 && i >= first && x.count) x.device = dps_gpu_where(x.data);
        if (x.device >= 0)
            dv.device[d++] = x;
        else
            dv.host[h++] = x;
    }
    *host = dv.host, *nhost = h, *device = dv.device, *ndevice = d;
    return 1;
}

/* --- agreement ------------------------------------------------------------------------------ */

/* What each rank tells the others at set-up: all fixed-size text, gathered with one sum. */
typedef struct rank_info {
    char usable, nccl, from_peer; /* from_peer: unusable only because another rank failed */
    char shrink;                  /* its NCCL has ncclCommShrink (a lost rank's communicator shrinks) */
    char lossy;                   /* its NCCL init was given up at a loss (elastic mode) */
    char key[93];                 /* host hash and PCI bus id: equal keys are one GPU */
    char why[160];                /* why this rank cannot use its GPU */
} rank_info_t;

/* Every rank's `mine`, in rank order: a sum of zeros and each rank's own slot. In elastic mode a
 * loss found before it is taken in first, so that every survivor lays it out alike; one during
 * it (some ranks completed it, others ran it again with the slot of the lost rank empty) ends
 * the job, as a loss while the backend starts does. */
static rank_info_t *gather(const dps_backend_t *be, const rank_info_t *mine)
{
    dps_elastic_recover_pending(be, "GPU set-up");
    unsigned generation = dps_elastic_generation();
    size_t n = (size_t)dps_g.eff_size;
    rank_info_t *all = calloc(n, sizeof *all);
    if (!all) dps_fatal("GPU set-up: out of memory for %zu ranks' device information", n);
    all[dps_g.eff_rank] = *mine;
    dp_tensor t = {all, n * sizeof *all, DP_U8, DP_HOST, "device info"};
    dps_fused_host("GPU set-up", be, &t, 1, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, DPS_RED_SUM);
    if (dps_elastic_generation() != generation)
        dps_guard_failed(
            "a rank was lost while the GPU set-up (the first collective of GPU tensors) exchanged the "
            "ranks' devices: the survivors cannot go on");
    return all;
}

/* The rank to name when some cannot use their GPU: where it failed, not the ranks NCCL told
 * that a peer failed; -1 when every rank can. */
static int origin(const rank_info_t *all)
{
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < dps_g.eff_size; r++)
            if (!all[r].usable && (pass || !all[r].from_peer)) return r;
    return -1;
}

static void first_unusable(const rank_info_t *all, const char *what)
{
    int r = origin(all);
    if (r >= 0) dps_fatal("%s: rank %d cannot use its GPU: %s", what, r, all[r].why);
}

static int nccl_demanded(void)
{
    return DPS_POLICY_ENUM(&dps_g.policy, comm, backend) == DPS_V_comm_backend_nccl;
}

static void go_staged(const char *why)
{
    dv.mode = MODE_STAGED;
    if (dps_g.eff_rank == 0) DPS_WARN("GPU tensors go through host memory and MPI (staged): %s", why);
}

static void staging_buffers(const char *hook)
{
    dv.pinned_bytes = (size_t)dps_policy_num(&dps_g.policy, DPS_P_gpu_staging_mb) << 20;
    int prev = dv.gpu->use(dv.dev);
    for (int i = 0; i < 2; i++)
        if (!dv.pinned[i] && !(dv.pinned[i] = dv.gpu->pinned(dv.pinned_bytes)))
            dps_fatal("%s: GPU staging: %s; lower [gpu] staging_mb", hook, dv.gpu->last_error());
    dv.gpu->restore(prev);
}

/* NCCL's id (128 bytes and a byte saying it exists) from rank 0 to every rank: the root is
 * rank 0 whatever the hook's broadcast root (dp_from_owners's owner) is. */
static void share_id(const dps_backend_t *be, unsigned char *id129)
{
    int root = dps_e.bcast_root;
    dps_e.bcast_root = 0;
    dp_tensor t = {id129, 129, DP_U8, DP_HOST, "NCCL id"};
    dps_fused_host("GPU set-up", be, &t, 1, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM);
    dps_e.bcast_root = root;
}

/* --- elastic mode on NCCL: the kept copy ------------------------------------------------------ */

/* Survivors: ranks of the job as it started, in order, and the generation they are of. */
typedef struct survivors {
    unsigned generation;
    int *ranks, n;
} survivors_t;

static void survivors_set(survivors_t *s, const int *ranks, int n, unsigned generation)
{
    int *r = realloc(s->ranks, (size_t)(n ? n : 1) * sizeof *r);
    if (!r) dps_fatal("GPU set-up: out of memory for %d ranks", n);
    memcpy(r, ranks, (size_t)n * sizeof *r);
    s->ranks = r, s->n = n, s->generation = generation;
}

static struct {
    unsigned char *buf[2]; /* the call under way's copy, and the last completed one's result */
    size_t cap[2], last_bytes;
    int next, last; /* last: -1 none yet */
    uint64_t *off;  /* each tensor's place in the copy */
    size_t off_cap;
    survivors_t comm; /* those the communicator was made for, in its order */
    int shrink_all;   /* every rank's NCCL has ncclCommShrink */
} kept = {.last = -1};

/* The survivors a communicator is being made for, as this rank saw them when it agreed to make
 * it. A survivor may see a loss one collective later than another (the one that completed a
 * collective goes on until its next; the one that gave it up gets the result replayed), so
 * between two agreements the ranks branch only on what they agreed, and an NCCL call made for
 * a plan that no longer holds is given up (plan_stale). */
static survivors_t plan;

static void *last_result(size_t *bytes);

static void plan_now(void)
{
    int n;
    const int *ranks = dps_elastic_ranks(&n);
    survivors_set(&plan, ranks, n, dps_elastic_generation());
}

/* A loss is pending, or this rank went on among fewer since the plan. */
static int plan_stale(void)
{
    return dps_guard_lost_pending() || dps_elastic_generation() != plan.generation;
}

/* The communicator was made for the plan's survivors. */
static void kept_comm_made(void)
{
    if (!dps_elastic_on()) return;
    dps_elastic_set_result_reader(last_result);
    dv.gpu->give_up_with(dps_guard_lost_pending);
    survivors_set(&kept.comm, plan.ranks, plan.n, plan.generation);
}

/* What the survivors agreed: yes on every rank; a loss met by any (lossy: its plan no longer
 * holds); every rank's plan for one generation (same). */
typedef struct agreed {
    int yes, lossy, same;
} agreed_t;

static agreed_t agree(const dps_backend_t *be, int yes, int lossy)
{
    int32_t g = (int32_t)plan.generation;
    int32_t v[4] = {g, -g, yes ? 1 : 0, lossy || plan_stale() ? -1 : 0};
    dp_tensor t = {v, 4, DP_I32, DP_HOST, "GPU agreement"};
    dps_fused_host("GPU set-up", be, &t, 1, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, DPS_RED_MIN);
    return (agreed_t){v[2] == 1, v[3] < 0, v[0] == -v[1]};
}

/* The plan's communicator from a new id: 0, -1 failed (why says it), -2 the plan went stale. */
static int comm_from_id(const dps_backend_t *be, double limit, char *why, size_t len)
{
    unsigned char id[129] = {0};
    if (dps_g.eff_rank == 0 && !plan_stale() && !(id[128] = dv.gpu->nccl_id(id) == 0))
        snprintf(why, len, "ncclGetUniqueId: %s", dv.gpu->last_error());
    share_id(be, id);
    if (plan_stale()) return -2;
    if (!id[128]) {
        if (!why[0]) snprintf(why, len, "rank 0 has no NCCL id");
        return -1;
    }
    int rc = dv.gpu->nccl_init(id, dps_g.eff_rank, dps_g.eff_size, limit, plan_stale);
    if (rc == -1) snprintf(why, len, "%s", dv.gpu->last_error());
    return rc;
}

/* The positions in the communicator of its ranks not among the plan's survivors. */
static int excluded(int *exclude)
{
    int ne = 0;
    for (int i = 0; i < kept.comm.n; i++) {
        int in = 0;
        for (int j = 0; j < plan.n; j++)
            in |= plan.ranks[j] == kept.comm.ranks[i];
        if (!in) exclude[ne++] = i;
    }
    return ne;
}

/* After a loss, before the next GPU collective (every survivor at the same one): the
 * communicator among the survivors, shrunk where NCCL can on every rank and every old one is
 * intact, else made from a new id. Each round: an agreement on the plan, the NCCL call, an
 * agreement on its outcome. A loss meanwhile means another round; where NCCL fails for a reason
 * of its own, GPU tensors go staged. */
static void remake_comm(const char *hook, const dps_backend_t *be)
{
    double limit = (double)dps_policy_num(&dps_g.policy, DPS_P_guard_timeout);
    int may_shrink = 1; /* agreed: no shrink failed but through a loss */
    while (dv.mode == MODE_NCCL && kept.comm.generation != dps_elastic_generation()) {
        dps_elastic_recover_pending(be, hook);
        plan_now();
        int *exclude = malloc((size_t)(kept.comm.n ? kept.comm.n : 1) * sizeof *exclude);
        if (!exclude) dps_fatal("%s: out of memory remaking the NCCL communicator", hook);
        int ne = excluded(exclude);
        agreed_t a = agree(be, may_shrink && kept.shrink_all && ne > 0 && dv.gpu->intact(), 0);
        int shrink = a.yes, rc = -2;
        char why[300] = "";
        if (!a.same || a.lossy) {
            /* a loss since some rank's plan: nothing is made this round */
        } else if (shrink) {
            if (!plan_stale()) rc = dv.gpu->shrink(exclude, ne, limit, plan_stale);
            if (rc == -1) snprintf(why, sizeof why, "%s", dv.gpu->last_error());
        } else {
            dv.gpu->drop(); /* ends what the old one still held on the stream */
            rc = comm_from_id(be, limit, why, sizeof why);
        }
        free(exclude);
        agreed_t b = agree(be, rc == 0, rc == -2);
        if (b.yes) { /* every rank made it, for the plan's survivors */
            kept_comm_made();
            if (dps_g.eff_rank == 0)
                DPS_INFO(
                    "elastic: GPU tensors go on through NCCL among the %d survivors (the communicator %s)",
                    plan.n, shrink ? "shrunk" : "made anew");
            continue; /* a loss since: another round */
        }
        if (rc == 0) dv.gpu->drop(); /* not every rank has it */
        if (!a.same || a.lossy || b.lossy) continue;
        if (shrink) {
            if (dps_g.eff_rank == 0)
                DPS_WARN("elastic: ncclCommShrink %s; the communicator is made from a new id",
                         rc == -1 ? why : "failed on another rank");
            may_shrink = 0;
            continue;
        }
        char text[400];
        snprintf(text, sizeof text, "NCCL could not be brought up among the survivors (%s)",
                 why[0] ? why : "it failed on another rank");
        dv.gpu->drop();
        go_staged(text);
        staging_buffers(hook);
        return;
    }
}

static unsigned char *kept_buffer(const char *hook, int k, size_t bytes)
{
    if (!kept.buf[k] || kept.cap[k] < bytes) {
        dv.gpu->free(kept.buf[k]);
        kept.cap[k] = bytes > 256 ? bytes : 256;
        if (!(kept.buf[k] = dv.gpu->alloc(kept.cap[k])))
            dps_fatal("%s: no GPU memory for the kept copy of %zu bytes ([elastic] lost_rank = continue): %s",
                      hook, bytes, dv.gpu->last_error());
    }
    return kept.buf[k];
}

/* Each tensor's place in the copy: runs of one dtype packed, each run 256-byte aligned. */
static size_t kept_layout(const char *hook, const dp_tensor *t, size_t n)
{
    if (dps_grow((void **)&kept.off, &kept.off_cap, n, sizeof *kept.off))
        dps_fatal("%s: out of memory placing %zu GPU tensors", hook, n);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || t[i].dtype != t[i - 1].dtype) at = (at + 255) & ~(size_t)255;
        kept.off[i] = at;
        at += t[i].count * dps_dtype_size(t[i].dtype);
    }
    return at;
}

/* The copy <-> the tensors, on the communication stream. */
static void kept_copies(const char *hook, unsigned char *k, const dp_tensor *t, size_t n, int to_tensors);

/* The result of the last GPU collective completed, read back into host memory (malloc'ed,
 * *bytes long) for a replay; NULL where there is none or it cannot be read. */
static void *last_result(size_t *bytes)
{
    *bytes = kept.last_bytes;
    if (kept.last < 0 || !dv.gpu) return NULL;
    void *h = malloc(kept.last_bytes ? kept.last_bytes : 1);
    int prev = h ? dv.gpu->use(dv.dev) : -1;
    if (prev < 0 || dv.gpu->read(h, kept.buf[kept.last], kept.last_bytes)) {
        if (h) DPS_ERROR("elastic: reading the last GPU result back: %s", dv.gpu->last_error());
        free(h);
        h = NULL;
    }
    if (prev >= 0) dv.gpu->restore(prev);
    return h;
}

/* NCCL's communicator on every rank, or staging when it cannot come up everywhere. */
static void bring_up_nccl(const char *hook, const dps_backend_t *be)
{
    /* the id, and a last byte saying whether rank 0 could make one: no rank waits for an id
     * that does not exist */
    unsigned char id[129] = {0};
    rank_info_t mine = {.usable = 1, .nccl = 1};
    if (dps_elastic_on()) {
        dps_elastic_recover_pending(be, hook);
        plan_now(); /* the survivors the communicator is for */
    }
    if (dps_g.eff_rank == 0) {
        id[128] = dv.gpu->nccl_id(id) == 0;
        if (!id[128])
            snprintf(mine.why, sizeof mine.why, "ncclGetUniqueId: %s", dv.gpu->last_error()), mine.usable = 0;
    }
    share_id(be, id);
    double limit = (double)dps_policy_num(&dps_g.policy, DPS_P_guard_timeout);
    /* NCCL makes the communicator on the current device: the tensors', not whatever the
     * program left current */
    int prev = dv.gpu->use(dv.dev);
    int rc = 0;
    if (dps_elastic_on() && plan_stale()) /* a loss since the plan: made again among the survivors */
        snprintf(mine.why, sizeof mine.why, "a rank was lost"), mine.usable = 0, mine.lossy = 1;
    else if (!id[128] && dps_g.eff_rank != 0)
        snprintf(mine.why, sizeof mine.why, "rank 0 has no NCCL id for the job"), mine.usable = 0;
    else if (prev < 0)
        snprintf(mine.why, sizeof mine.why, "%s", dv.gpu->last_error()), mine.usable = 0;
    else if (mine.usable && (rc = dv.gpu->nccl_init(id, dps_g.eff_rank, dps_g.eff_size, limit,
                                                    dps_elastic_on() ? plan_stale : NULL)))
        snprintf(mine.why, sizeof mine.why, "%s", dv.gpu->last_error()),
            mine.usable = 0, mine.lossy = rc == -2, mine.from_peer = (char)dv.gpu->peer_failed();
    if (prev >= 0) dv.gpu->restore(prev);
    rank_info_t *all = gather(be, &mine);
    int bad = origin(all), lossy = 0;
    for (int r = 0; r < dps_g.eff_size; r++)
        lossy |= all[r].lossy;
    if (bad < 0 || lossy) {
        /* with a loss during it, the communicator is made among the survivors before the first
         * GPU collective (remake_comm: the plan is older than the survivors) */
        if (lossy) dv.gpu->drop();
        dv.mode = MODE_NCCL;
        if (dps_g.eff_rank == 0) DPS_INFO("%s: GPU tensors go through NCCL (%s)", hook, dv.gpu->versions());
    } else if (nccl_demanded()) {
        first_unusable(all, "[comm] backend = nccl: NCCL cannot start");
    } else {
        dv.gpu->drop();
        char why[256];
        snprintf(why, sizeof why, "NCCL could not start on rank %d (%s)", bad, all[bad].why);
        go_staged(why);
    }
    free(all);
}

static int probe(char *what, size_t len, double *age_s);

/* The drift check's reader (dps_guard_set_reader): a device tensor's bytes, after the work the
 * program queued (its optimizer's update). */
static int read_to_host(const dp_tensor *t, void *out)
{
    int dev = t->device >= 0 ? t->device : dps_gpu_where(t->data);
    if (dev < 0) return 0;
    int prev = dv.gpu->use(dev);
    if (prev < 0) return -1;
    void *m = NULL;
    int rc = dv.gpu->after(user_stream) ||
                     dv.gpu->copy(out, t->data, t->count * dps_dtype_size(t->dtype), DPS_COPY_D2H) ||
                     !(m = dv.gpu->mark()) || dv.gpu->wait(m)
                 ? -1
                 : 1;
    dv.gpu->restore(prev);
    if (rc < 0)
        DPS_ERROR("drift check: cannot read GPU tensor '%s': %s", dps_tensor_name(t), dv.gpu->last_error());
    return rc;
}

static void abort_at_fatal_exit(void)
{
    if (dv.gpu) dv.gpu->abort(5.0);
}

static void gpu_at_exit(void);

/* The first collective with device tensors, on every rank at the same call. */
static void setup(const char *hook, const dps_backend_t *be, int dev)
{
    char err[1024] = "";
    rank_info_t mine = {0};
    dv.gpu = dps_device_open(err, sizeof err);
    if (dv.gpu && dv.gpu->notice() && dps_g.eff_rank == 0) DPS_WARN("%s: %s", hook, dv.gpu->notice());
    int prev = dv.gpu ? dv.gpu->use(dev) : -1;
    if (dv.gpu && prev < 0) snprintf(err, sizeof err, "%s", dv.gpu->last_error());
    if (prev >= 0 && dv.gpu->key(mine.key, sizeof mine.key) != 0)
        snprintf(err, sizeof err, "%s", dv.gpu->last_error());
    if (dv.gpu && prev >= 0) dv.gpu->restore(prev);
    mine.usable = !err[0];
    mine.nccl = mine.usable && dv.gpu->has_nccl();
    mine.shrink = (char)(mine.nccl && dv.gpu->has_shrink());
    snprintf(mine.why, sizeof mine.why, "%s", err);
    rank_info_t *all = gather(be, &mine);
    first_unusable(all, hook);
    dv.dev = dev;
    __atomic_store_n(&dps_before_fatal_exit, abort_at_fatal_exit, __ATOMIC_RELEASE);
    dps_guard_set_probe(probe);
    dps_guard_set_reader(read_to_host);
    /* the decision, from the same table on every rank */
    char why[256] = "";
    int a = -1, b = -1;
    for (int i = 0; i < dps_g.eff_size && a < 0; i++)
        for (int j = i + 1; j < dps_g.eff_size && a < 0; j++)
            if (!strcmp(all[i].key, all[j].key)) a = i, b = j;
    if (a >= 0)
        snprintf(why, sizeof why, "ranks %d and %d share the GPU %s on one host", a, b,
                 strchr(all[a].key, ' ') + 1);
    for (int r = 0; r < dps_g.eff_size && !why[0]; r++)
        if (!all[r].nccl) snprintf(why, sizeof why, "rank %d has no NCCL", r);
    kept.shrink_all = 1;
    for (int r = 0; r < dps_g.eff_size; r++)
        kept.shrink_all &= all[r].shrink;
    if (DPS_POLICY_ENUM(&dps_g.policy, comm, backend) == DPS_V_comm_backend_mpi)
        go_staged("[comm] backend = mpi");
    else if (why[0] && nccl_demanded())
        dps_fatal(
            "%s: [comm] backend = nccl, but %s: NCCL cannot run two ranks on one GPU; start one rank per "
            "GPU (and keep [gpu] bind = auto), or set [comm] backend = auto to reduce through host memory",
            hook, why);
    else if (why[0])
        go_staged(why);
    else
        bring_up_nccl(hook, be);
    free(all);
    if (dv.mode == MODE_STAGED) staging_buffers(hook);
    if (dv.mode == MODE_NCCL) kept_comm_made();
    /* The CUDA runtime (and NCCL's own) registered their teardown with atexit when they started,
     * after the shim's constructor registered its exit work: handlers run last-registered-first,
     * so the GPU part is registered now, after both are up, to run while they still work. */
    atexit(gpu_at_exit);
}

/* --- the collectives ------------------------------------------------------------------------ */

/* How long a rank that NCCL told of a peer's failure waits before ending the job, so the rank
 * where it happened reports first (the launcher stops the others at the first exit). */
#define PEER_REPORT_GRACE_S 2
/* How long queued GPU work gets to finish at exit. */
#define FINISH_LIMIT_S 10

/* After the plugin's last failure on this thread: where NCCL said a peer failed, that rank gets
 * the time to report first. */
static void let_the_failed_peer_report(void)
{
    if (dv.gpu->peer_failed()) sleep(PEER_REPORT_GRACE_S);
}

static _Noreturn void failed(const char *hook)
{
    char where[96];
    dps_guard_where(where, sizeof where);
    let_the_failed_peer_report();
    dps_fatal("%s (%s, GPU): %s", hook, where, dv.gpu->last_error());
}

/* One NCCL collective on buf (in the bucket or a tensor in place). */
static void enqueue(const char *hook, void *buf, size_t count, int32_t dtype, dps_fuse_t kind, dps_weight_t w,
                    dps_redop_t op)
{
    /* the plugin weighs floats only: integers are summed as they are, as on the host. Whether
     * to weigh is the job's (a shared weight, or split mode's per-rank shares), never this
     * rank's own weight alone: a share of 1 or 0 is still weighted, so every rank issues the
     * same NCCL operation */
    int weighted = w.per_rank || w.scale != 1.0;
    int rc = kind == DPS_FUSE_BCAST ? dv.gpu->bcast(buf, count * dps_dtype_size(dtype), dps_e.bcast_root)
                                    : dv.gpu->allreduce(buf, count, dtype, op, w.scale, weighted);
    if (rc) failed(hook);
}

static void copy(const char *hook, void *dst, const void *src, size_t bytes, dps_copy_t kind)
{
    if (bytes && dv.gpu->copy(dst, src, bytes, kind)) failed(hook);
}

/* t[0..n) through NCCL: large tensors in place, the others packed into the device bucket in
 * runs of one dtype. Everything is queued on the communication stream. */
static void nccl_fused(const char *hook, const dp_tensor *t, size_t n, dps_fuse_t kind, dps_weight_t w,
                       dps_redop_t op)
{
    if (kind == DPS_FUSE_GRADS && dps_g.compress_dtype >= 0 && dps_g.eff_rank == 0)
        DPS_WARN_ONCE(
            "[comm] compress is not applied to GPU tensors on NCCL: they travel in their own dtype");
    size_t cap = dps_g.bucket_bytes;
    unsigned char *bucket = dv.gpu->bucket(cap);
    if (!bucket) failed(hook);
    for (size_t i = 0; i < n;) {
        size_t es = dps_dtype_size(t[i].dtype), room = cap / es;
        if (!t[i].count) {
            i++;
            continue;
        }
        if (t[i].count >= room / 2 || t[i].count * es >= DPS_INPLACE_MIN_BYTES) {
            enqueue(hook, t[i].data, t[i].count, t[i].dtype, kind, w, op);
            i++;
            continue;
        }
        size_t first = i, used = 0;
        while (i < n && (!t[i].count || (t[i].dtype == t[first].dtype && used + t[i].count <= room &&
                                         t[i].count * es < DPS_INPLACE_MIN_BYTES && t[i].count < room / 2))) {
            copy(hook, bucket + used * es, t[i].data, t[i].count * es, DPS_COPY_D2D);
            used += t[i].count, i++;
        }
        enqueue(hook, bucket, used, t[first].dtype, kind, w, op);
        for (size_t j = first, off = 0; j < i; off += t[j].count, j++)
            copy(hook, t[j].data, bucket + off * es, t[j].count * es, DPS_COPY_D2D);
    }
}

static void kept_copies(const char *hook, unsigned char *k, const dp_tensor *t, size_t n, int to_tensors)
{
    for (size_t i = 0; i < n; i++) {
        size_t bytes = t[i].count * dps_dtype_size(t[i].dtype);
        if (to_tensors)
            copy(hook, t[i].data, k + kept.off[i], bytes, DPS_COPY_D2D);
        else
            copy(hook, k + kept.off[i], t[i].data, bytes, DPS_COPY_D2D);
    }
}

/* The collectives of t[0..n) on their kept copy k: one per run of a dtype. A broadcast is the
 * bytes' maximum, every copy but the root's zeros (run_kept): like every collective here it
 * then completes only where every rank took part (an NCCL broadcast may complete on its root
 * first), so no survivor is more than one collective ahead of another. */
static int kept_collectives(unsigned char *k, const dp_tensor *t, size_t n, dps_fuse_t kind, dps_weight_t w,
                            dps_redop_t op)
{
    int weighted = w.per_rank || w.scale != 1.0; /* the job's choice, as in enqueue() */
    for (size_t i = 0; i < n;) {
        size_t first = i;
        uint64_t count = 0;
        while (i < n && t[i].dtype == t[first].dtype)
            count += t[i++].count;
        if (!count) continue;
        unsigned char *at = k + kept.off[first];
        int rc = kind == DPS_FUSE_BCAST ? dv.gpu->allreduce(at, count * dps_dtype_size(t[first].dtype), DP_U8,
                                                            DPS_RED_MAX, 1.0, 0)
                                        : dv.gpu->allreduce(at, count, t[first].dtype, op, w.scale, weighted);
        if (rc) return -1;
    }
    return 0;
}

static int staged_fused(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n,
                        dps_fuse_t kind, dps_weight_t w, dps_redop_t op);

/* How long a failed NCCL call in elastic mode waits for the guard to find a loss: a peer that
 * gave up its side (its abort) or whose link went can fail a collective before its loss shows. */
#define LOSS_GRACE_MS 10000

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000};
    nanosleep(&ts, NULL);
}

static int loss_found(void)
{
    for (long ms = 0; ms < LOSS_GRACE_MS && !dps_guard_lost_pending(); ms += 10)
        pause_ms(10);
    return dps_guard_lost_pending();
}

/* 1 done, 0 given up (a loss is pending), -1 failed. */
static int settle_kept(void *m)
{
    for (long us = 2;; us = us < 500 ? us * 2 : 500) {
        int q = dv.gpu->query(m);
        if (q) return q;
        if (dps_guard_lost_pending()) return 0;
        struct timespec ts = {0, us * 1000};
        nanosleep(&ts, NULL);
    }
}

/* A hook call's GPU collective in elastic mode: on a kept copy, so that at a loss the tensors
 * stay as they were (run again among the survivors) or get the result another survivor
 * completed (replayed through host memory). The tensors get the result only once the host saw
 * the collective complete: behind a collective stuck on a lost rank nothing else is queued.
 * Returns 0, or DPS_STOPPED_AT_LOSS (dps_e.stop_at_loss). */
static int run_kept(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n, dps_fuse_t kind,
                    dps_weight_t w, dps_redop_t op)
{
    size_t bytes = kept_layout(hook, t, n);
    /* a loss found before this one starts */
    int stop = dps_elastic_recover_pending(be, hook) && dps_e.stop_at_loss;
    for (;;) {
        remake_comm(hook, be); /* which ends a collective given up on the stream */
        if (stop) return DPS_STOPPED_AT_LOSS;
        if (dv.mode == MODE_STAGED) /* NCCL could not be made anew */
            return staged_fused(hook, be, t, n, kind, w, op);
        dps_weight_t fixed = w;
        if (kind == DPS_FUSE_GRADS) fixed.scale *= dps_elastic_fix(); /* over the survivors' shares */
        unsigned char *k = kept_buffer(hook, kept.next, bytes);
        if (kind == DPS_FUSE_BCAST && dps_g.eff_rank != dps_e.bcast_root) { /* only the root's bytes */
            if (dv.gpu->zero(k, bytes)) failed(hook);
        } else {
            kept_copies(hook, k, t, n, 0);
        }
        void *m = kept_collectives(k, t, n, kind, fixed, op) ? NULL : dv.gpu->mark();
        int state = m ? settle_kept(m) : -1;
        if (m) dv.gpu->release(m);
        if (state == 1) {
            kept_copies(hook, k, t, n, 1);
            kept.last = kept.next, kept.next ^= 1, kept.last_bytes = bytes;
            dps_elastic_completed_on_device();
            return 0;
        }
        if (state < 0 && !loss_found()) failed(hook);
        unsigned char *host = malloc(bytes ? bytes : 1);
        if (!host) dps_fatal("%s: out of memory for %zu bytes after a lost rank", hook, bytes);
        if (dps_elastic_recover(be, hook, 1, host, bytes) == DPS_ELASTIC_REPLAYED) {
            /* another survivor completed it: its result, through host memory. What this rank
             * gave up is ended first, alone (the communicator is then made from a new id) */
            dv.gpu->drop();
            copy(hook, k, host, bytes, DPS_COPY_H2D);
            kept_copies(hook, k, t, n, 1);
            void *done = dv.gpu->mark();
            if (!done || dv.gpu->wait_stream(done)) failed(hook); /* host is read by then */
            kept.last = kept.next, kept.next ^= 1, kept.last_bytes = bytes;
            dps_elastic_result_on_device();
            free(host);
            return 0;
        }
        free(host);
        stop = dps_e.stop_at_loss; /* not completed anywhere: as the host path's (fusion.c) */
    }
}

/* One staged chunk: slices of device tensors, and the host tensors over the pinned buffer. */
typedef struct chunk {
    dp_tensor *host; /* host[k] covers device tensor src[k]'s elements [off[k], off[k]+count) */
    size_t *src;
    uint64_t *off;
    size_t n, cap;
} chunk_t;

/* The next chunk from position (*i, *off): whole tensors or parts of one, up to the buffer. */
static void next_chunk(chunk_t *c, const dp_tensor *t, size_t n, size_t *i, uint64_t *off, unsigned char *buf)
{
    c->n = 0;
    size_t used = 0;
    while (*i < n && used < dv.pinned_bytes) {
        const dp_tensor *x = &t[*i];
        size_t es = dps_dtype_size(x->dtype);
        uint64_t left = x->count - *off, fit = (dv.pinned_bytes - used) / es, k = left < fit ? left : fit;
        if (left && !k) break; /* not one more element of this dtype fits */
        if (k) {               /* room for it: chunk_room gave one slice per tensor */
            c->host[c->n] = (dp_tensor){buf + used, k, x->dtype, DP_HOST, x->name};
            c->src[c->n] = *i;
            c->off[c->n] = *off;
            c->n++;
            used += k * es;
        }
        *off += k;
        if (*off == x->count) (*i)++, *off = 0;
    }
}

static int chunk_room(chunk_t *c, size_t n)
{
    if (c->cap >= n) return 0;
    free(c->host), free(c->src), free(c->off);
    c->host = malloc(n * sizeof *c->host), c->src = malloc(n * sizeof *c->src),
    c->off = malloc(n * sizeof *c->off);
    c->cap = n;
    return c->host && c->src && c->off ? 0 : -1;
}

static void chunk_copies(const char *hook, const chunk_t *c, const dp_tensor *t, dps_copy_t kind)
{
    for (size_t k = 0; k < c->n; k++) {
        const dp_tensor *x = &t[c->src[k]];
        size_t es = dps_dtype_size(x->dtype);
        unsigned char *dev = (unsigned char *)x->data + c->off[k] * es;
        if (kind == DPS_COPY_D2H)
            copy(hook, c->host[k].data, dev, c->host[k].count * es, kind);
        else
            copy(hook, dev, c->host[k].data, c->host[k].count * es, kind);
    }
}

/* Device -> pinned -> host path -> device, two chunks in flight. Returns 0, or
 * DPS_STOPPED_AT_LOSS: a chunk's collective stopped at a loss (dps_e.stop_at_loss), the later
 * chunks not sent. */
static int staged_fused(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n,
                        dps_fuse_t kind, dps_weight_t w, dps_redop_t op)
{
    static chunk_t chunks[2];
    size_t i = 0;
    uint64_t off = 0;
    /* a chunk holds at most one slice per tensor */
    if (chunk_room(&chunks[0], n) || chunk_room(&chunks[1], n))
        dps_fatal("%s: out of memory for the staging of %zu GPU tensors", hook, n);
    next_chunk(&chunks[0], t, n, &i, &off, dv.pinned[0]);
    chunk_copies(hook, &chunks[0], t, DPS_COPY_D2H);
    void *ready = dv.gpu->mark();
    for (int cur = 0; chunks[cur].n; cur ^= 1) {
        chunk_t *c = &chunks[cur], *next = &chunks[cur ^ 1];
        /* the other buffer's copy back was queued before this: the stream keeps them in order */
        next_chunk(next, t, n, &i, &off, dv.pinned[cur ^ 1]);
        chunk_copies(hook, next, t, DPS_COPY_D2H);
        void *next_ready = next->n ? dv.gpu->mark() : NULL;
        if (!ready || dv.gpu->wait(ready)) failed(hook);
        int rc = dps_fused_host(hook, be, c->host, c->n, kind, w, op);
        if (rc == DPS_STOPPED_AT_LOSS) {
            if (next_ready && dv.gpu->wait(next_ready)) failed(hook); /* nothing left on its way */
            return rc;
        }
        if (rc) dps_fatal("%s: GPU staging failed (see above)", hook);
        chunk_copies(hook, c, t, DPS_COPY_H2D);
        ready = next_ready;
    }
    return 0;
}

/* Before work on the communication stream: the plugin's device is current, and the stream waits
 * for the program's work. Returns the device that was current. */
static int begin(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (t[i].device != t[0].device)
            dps_fatal(
                "%s: tensor %zu (%s) is on CUDA device %d and tensor 0 (%s) on device %d: dpshim serves one "
                "GPU per rank",
                hook, i, dps_tensor_name(&t[i]), t[i].device, dps_tensor_name(&t[0]), t[0].device);
    if (!dv.mode) setup(hook, be, t[0].device);
    int prev = dv.gpu->use(t[0].device);
    if (prev < 0) failed(hook);
    if (dv.gpu->capturing(user_stream))
        dps_fatal(
            "%s: called while the CUDA stream is being captured into a CUDA graph; a collective cannot be "
            "captured: call the hook outside the captured region",
            hook);
    if (dv.gpu->after(user_stream)) failed(hook);
    return prev;
}

/* --- queued work nobody waits for: watched by the guard ------------------------------------ */

#define QUEUED_MAX 256
typedef struct queued_work {
    void *marker;
    const char *hook;
    uint64_t seq, since_ns;
} queued_work_t;
static struct {
    pthread_mutex_t lock;
    queued_work_t q[QUEUED_MAX];
    size_t head, n;
} queued = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Drops finished entries from the front; the oldest's state: 1 unfinished, -1 failed, 0 none
 * (or, for the watchdog, nothing known now: the communicator was busy in another thread, and
 * the next round looks again). */
static int queued_front(int watchdog)
{
    while (queued.n) {
        void *m = queued.q[queued.head].marker;
        int q = watchdog ? dv.gpu->peek(m) : dv.gpu->query(m);
        if (q == -2) return 0;
        if (q <= 0) return q < 0 ? -1 : 1;
        dv.gpu->release(m);
        queued.head = (queued.head + 1) % QUEUED_MAX, queued.n--;
    }
    return 0;
}

/* The guard's look (dps_guard_set_probe), from the watchdog thread. */
static int probe(char *what, size_t len, double *age_s)
{
    pthread_mutex_lock(&queued.lock);
    int state = queued_front(1);
    if (state) {
        const queued_work_t *e = &queued.q[queued.head];
        *age_s = (double)(now_ns() - e->since_ns) * 1e-9;
        snprintf(what, len, "collective #%llu (%s)%s%s", (unsigned long long)e->seq, e->hook,
                 state < 0 ? ": " : "", state < 0 ? dv.gpu->last_error() : "");
    }
    pthread_mutex_unlock(&queued.lock);
    if (state < 0) let_the_failed_peer_report();
    return state;
}

/* A marker after the work just queued, for the guard; at most QUEUED_MAX outstanding, as NCCL
 * itself bounds how far a program may run ahead of its GPU. */
static void track(const char *hook)
{
    void *m = dv.gpu->mark();
    if (!m) failed(hook);
    pthread_mutex_lock(&queued.lock);
    queued_front(0);
    if (queued.n == QUEUED_MAX) {
        void *oldest = queued.q[queued.head].marker;
        queued.head = (queued.head + 1) % QUEUED_MAX, queued.n--;
        pthread_mutex_unlock(&queued.lock);
        if (dv.gpu->wait(oldest)) failed(hook);
        pthread_mutex_lock(&queued.lock);
    }
    size_t at = (queued.head + queued.n) % QUEUED_MAX;
    queued.q[at].marker = m, queued.q[at].hook = hook;
    queued.q[at].seq = dps_guard_seq(), queued.q[at].since_ns = now_ns();
    queued.n++;
    pthread_mutex_unlock(&queued.lock);
}

/* The hook's result is needed: by the caller (wait), or by the named stream's later work. */
static void end(const char *hook, int prev, int wait)
{
    if (wait && user_stream_set) {
        if (dv.gpu->before(user_stream)) failed(hook);
        track(hook);
    } else if (wait) {
        void *m = dv.gpu->mark();
        if (!m || dv.gpu->wait(m)) failed(hook);
        pthread_mutex_lock(&queued.lock);
        queued_front(0); /* all done now */
        pthread_mutex_unlock(&queued.lock);
    } else {
        track(hook);
    }
    dv.gpu->restore(prev);
}

/* Queues t[0..n) and, with `wait`, returns when they are done (or queued for a named stream). */
static int run(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n, dps_fuse_t kind,
               dps_weight_t w, dps_redop_t op, int wait)
{
    int prev = begin(hook, be, t, n);
    dps_guard_tensors(t, n);
    if (dv.mode == MODE_NCCL && dps_elastic_on()) { /* always waited for: dp_grad_ready holds them */
        int coll = kind == DPS_FUSE_BCAST ? DPS_COLL_BCAST : DPS_COLL_ALLREDUCE;
        uint64_t count = dps_total_count(t, n);
        dps_guard_enter(hook, coll, t[0].dtype, count);
        uint64_t t0 = dps_diag_now();
        int rc = run_kept(hook, be, t, n, kind, w, op);
        /* the copies back, done: NCCL's errors since (a peer lost after the collective
         * completed) are the next collective's to meet */
        void *m = dv.gpu->mark();
        if (!m || dv.gpu->wait_stream(m)) failed(hook);
        dv.gpu->restore(prev);
        dps_diag_collective(hook, count * dps_dtype_size(t[0].dtype), t0, dps_diag_now(), dps_guard_seq(),
                            dps_e.step);
        dps_guard_leave();
        return rc;
    }
    if (dv.mode == MODE_STAGED) {
        int rc = staged_fused(hook, be, t, n, kind, w, op);
        end(hook, prev, wait);
        return rc;
    }
    int coll = kind == DPS_FUSE_BCAST ? DPS_COLL_BCAST : DPS_COLL_ALLREDUCE;
    uint64_t count = dps_total_count(t, n);
    if (!wait) {
        /* queued now, waited for in dp_grads: compared across ranks like the main thread's own */
        dps_guard_note(hook, coll, t[0].dtype, count);
        nccl_fused(hook, t, n, kind, w, op);
        end(hook, prev, 0);
        return 0;
    }
    dps_guard_enter(hook, coll, t[0].dtype, count);
    uint64_t t0 = dps_diag_now();
    nccl_fused(hook, t, n, kind, w, op);
    end(hook, prev, 1);
    dps_diag_collective(hook, count * dps_dtype_size(t[0].dtype), t0, dps_diag_now(), dps_guard_seq(),
                        dps_e.step);
    dps_guard_leave();
    return 0;
}

int dps_device_fused(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n, dps_fuse_t kind,
                     dps_weight_t w, dps_redop_t op)
{
    return n ? run(hook, be, t, n, kind, w, op, 1) : 0;
}

/* --- gradients announced during backward ------------------------------------------------------ */

static void flush_pending(const dps_backend_t *be, dps_weight_t w)
{
    if (!dv.ready.npending) return;
    if (dps_ready_reserve(&dv.ready))
        dps_fatal("dp_grad_ready: out of memory tracking %zu GPU gradients",
                  dv.ready.nhanded + dv.ready.npending);
    run("dp_grad_ready", be, dv.ready.pending, dv.ready.npending, DPS_FUSE_GRADS, w, DPS_RED_SUM,
        dv.mode == MODE_STAGED);
    dps_ready_handed_on(&dv.ready);
}

int dps_device_grad_ready(const dps_backend_t *be, const dp_tensor *t, dps_weight_t w)
{
    if (dps_check_tensors("dp_grad_ready", t, 1, 1)) return -1;
    size_t bytes = t->count * dps_dtype_size(t->dtype);
    if (dps_ready_add(&dv.ready, t, bytes)) {
        DPS_ERROR("dp_grad_ready: out of memory tracking %zu GPU gradients", dv.ready.npending + 1);
        return -1;
    }
    /* a full bucket, or a tensor that travels alone, is queued now: the GPU reduces it while the
     * framework's backward goes on (not in elastic mode: a collective queued and not waited for
     * could not be given up at a loss, so all go in dp_grads) */
    if ((dv.ready.pending_bytes >= dps_g.bucket_bytes || bytes >= DPS_INPLACE_MIN_BYTES) && !dps_elastic_on())
        flush_pending(be, w);
    return 0;
}

int dps_device_grads(const dps_backend_t *be, const dp_tensor *t, size_t n, dps_weight_t w)
{
    if (dps_check_tensors("dp_grads", t, n, 1)) return -1;
    int any_queued = dv.ready.nhanded > 0;
    size_t m;
    if (dps_ready_complete(&dv.ready, t, n, &m))
        dps_fatal("dp_grads: out of memory for %zu GPU gradients", dv.ready.npending + n);
    if (m)
        run("dp_grads", be, dv.ready.rest, m, DPS_FUSE_GRADS, w, DPS_RED_SUM, 1);
    else if (any_queued) {
        /* everything went during backward: wait for it here, as the guard's collective */
        int prev = dv.gpu->use(dv.dev);
        dps_guard_enter("dp_grads", DPS_COLL_ALLREDUCE, t && n ? t[0].dtype : DP_F32, 0);
        end("dp_grads", prev, 1);
        dps_guard_leave();
    }
    return 0;
}

int dps_device_outstanding(void)
{
    return dps_ready_outstanding(&dv.ready);
}

static void gpu_at_exit(void)
{
    if (atomic_load(&dps_g.forked) || dps_g.role != DPS_ROLE_RANK) return;
    dps_device_shutdown();
}

/* At exit, GPU work queued on a stream nobody waited for (dp_set_stream, dp_grad_ready) may
 * still fail or hang: the program's last results would then not be the job's, so the rank says
 * so and ends with a failure rather than 0. */
void dps_device_shutdown(void)
{
    static int done_once;
    if (!dv.gpu || !dv.mode || done_once++) return;
    /* the watchdog stops looking at queued work before it is finished and freed: a probe under
     * way holds the lock, and finds nothing after it */
    dps_guard_set_probe(NULL);
    pthread_mutex_lock(&queued.lock);
    queued.n = 0;
    pthread_mutex_unlock(&queued.lock);
    /* a communicator of ranks since lost: finalizing it would wait for them, and it may hold a
     * collective given up at the loss */
    if (dv.mode == MODE_NCCL && dps_elastic_on() && kept.comm.generation != dps_elastic_generation())
        dv.gpu->drop();
    int done = dv.gpu->finish(FINISH_LIMIT_S);
    if (done == -2) {
        DPS_WARN(
            "at exit: the CUDA runtime had already shut down (its exit handler ran before the shim's), so "
            "GPU work queued earlier could not be checked");
        return;
    }
    if (done < 0) dps_fatal("at exit: GPU work queued earlier failed: %s", dv.gpu->last_error());
    if (done == 0)
        dps_fatal(
            "at exit: GPU work queued earlier did not finish within %d s (a peer gone, or the GPU stuck)",
            FINISH_LIMIT_S);
}
