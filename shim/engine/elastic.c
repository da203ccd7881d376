/* Elastic mode: a lost rank does not end the job ([elastic] lost_rank = continue, where the
 * launcher keeps the other ranks running). The guard finds the loss and carries the survivors'
 * agreement (guard/survivors.c); here the main thread's collectives stop, and go on among the
 * survivors:
 * - a collective another survivor completed is replayed from it (a collective completes only
 *   where every rank took part, so no survivor is more than one ahead of another);
 * - one that no survivor completed runs again among them; a gradient sum of the hook call under
 *   way (the step at the loss) is then weighted over the shares the survivors hold;
 * - from the next hook call on, the survivors are the job: dp_rank and dp_world_size, the
 *   batches' shares, the gradients' weights and the epochs' shards follow their number. Every
 *   survivor switches at the same collective: the first that was not complete anywhere at the
 *   loss. A survivor that completed the last one finds the loss only when the next starts, so one
 *   that had it replayed goes on answering the old job until then: in between the program cuts
 *   its next batch or shard, and all survivors must cut it alike;
 * - in scale mode, what a lost rank had not trained of its shard of the epoch under way is shared
 *   out among the survivors at the end of their own shards (dps_elastic_rest). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "elastic.h"
#include "diag/diag.h"
#include "files/files.h"
#include "output/output.h"
#include "guard/guard.h"
#include "shard.h"

static struct {
    int on, set_up;             /* set_up: dps_elastic_setup ran (the backend is open) */
    uint64_t done;              /* collectives of the main thread completed so far */
    int *survivors, nsurvivors; /* the ranks the collectives run among (ranks of the job's start) */
    unsigned generation;        /* recoveries so far: the survivors' sets */
    int *ranks, n;              /* the job as the program is told (dp_rank, shares): the survivors
                                   from the first collective the loss left incomplete on */
    unsigned told_generation;   /* the survivors' set ranks[] is */
    int *hook_ranks, hook_n;    /* the survivors as the hook call under way began, once it met a loss */
    int in_hook;                /* a hook call met a loss: hook_ranks holds its start */
    double fix;                 /* the weight's correction for the hook call's gradient sums */
    unsigned char *laggard;
    int *decided, *before;
    uint64_t *lost_in_step;    /* per rank of the job's start: the step it was lost in, 0: not lost */
    int *batch_ranks, batch_n; /* the ranks the last batch was split among (split mode) */
    unsigned batch_generation; /* the job told of as of the last batch */
    int last_on_device;        /* the last completed collective's result is the GPU path's to send */
    void *(*read_device_result)(size_t *bytes); /* the GPU path's last result, read back */
} el = {.fix = 1.0};

static int shard_auto_off; /* [optim] shard = auto was set off by dps_elastic_plan */

DPS_STARTUP void dps_elastic_plan(dps_state_t *s)
{
    if (!dps_job_may_go_on(s) || DPS_POLICY_ENUM(&s->policy, optim, shard) != DPS_V_optim_shard_auto) return;
    dps_error_t e;
    shard_auto_off =
        dps_policy_set_value(&s->policy, DPS_P_optim_shard, "off", 3, DPS_SRC_DEFAULT, 0, &e) == 0;
}

void dps_elastic_setup(const dps_backend_t *be)
{
    int size = dps_g.size;
    el.set_up = 1;
    if (!dps_job_may_go_on(&dps_g)) return;
    const char *why =
        dps_policy_num(&dps_g.policy, DPS_P_guard_timeout) == 0
            ? "[guard] timeout = 0: a stalled rank, or one on a lost host, could not be found"
        : DPS_POLICY_ENUM(&dps_g.policy, optim, shard) == DPS_V_optim_shard_on
            ? "[optim] shard = on keeps each rank's share of the optimizer's state on that rank "
              "alone, and a lost rank would take it with it"
        : !be->set_abandon       ? "the backend cannot give up a collective (MPI below MPI_THREAD_MULTIPLE)"
        : dps_g.eff_size != size ? "the job's ranks are not all in its collectives"
                                 : NULL;
    el.ranks = malloc((size_t)size * sizeof *el.ranks);
    el.survivors = malloc((size_t)size * sizeof *el.survivors);
    el.hook_ranks = malloc((size_t)size * sizeof *el.hook_ranks);
    el.decided = malloc((size_t)size * sizeof *el.decided);
    el.laggard = malloc((size_t)size);
    el.before = malloc((size_t)size * sizeof *el.before);
    el.lost_in_step = calloc((size_t)size, sizeof *el.lost_in_step);
    el.batch_ranks = malloc((size_t)size * sizeof *el.batch_ranks);
    if (!why && (!el.ranks || !el.survivors || !el.hook_ranks || !el.decided || !el.laggard || !el.before ||
                 !el.lost_in_step || !el.batch_ranks))
        why = "no memory for its tables";
    uint64_t min_ranks = dps_policy_num(&dps_g.policy, DPS_P_elastic_min_ranks);
    if (!why && dps_guard_elastic_start((int)(min_ranks < (uint64_t)size ? min_ranks : (uint64_t)size)) != 0)
        why = "the guard has no watchdog thread or no side channel (MPI below MPI_THREAD_MULTIPLE)";
    if (why) {
        if (dps_g.eff_rank == 0)
            DPS_WARN("[elastic] lost_rank = continue: off, as %s; a lost rank ends the job", why);
        return;
    }
    for (int r = 0; r < size; r++)
        el.ranks[r] = el.survivors[r] = el.batch_ranks[r] = r;
    el.n = el.nsurvivors = el.batch_n = size, el.on = 1;
    be->set_abandon(dps_guard_lost_pending);
    if (dps_g.overlap) {
        dps_g.overlap = 0; /* the background reductions cannot be given up yet: every rank alike */
        if (dps_g.eff_rank == 0) DPS_INFO("[elastic] lost_rank = continue: [comm] overlap is off");
    }
    if (dps_g.eff_rank == 0)
        DPS_INFO(
            "[elastic] lost_rank = continue: the launcher keeps the other ranks when one is lost, and the "
            "job goes on without it (the desync and drift checks are off%s)",
            shard_auto_off ? "; [optim] shard = auto is off: every rank keeps the whole optimizer state"
                           : "");
}

int dps_elastic_on(void)
{
    return el.on;
}

void dps_elastic_hook_begin(void)
{
    el.in_hook = 0, el.fix = 1.0;
}

double dps_elastic_fix(void)
{
    return el.fix;
}

int dps_elastic_shrunk(void)
{
    return el.on && el.nsurvivors < dps_g.size;
}

static int among(int r, const int *ranks, int n)
{
    for (int i = 0; i < n; i++)
        if (ranks[i] == r) return 1;
    return 0;
}

/* The samples of the last batch that ranks[0..n) hold: in split mode each one's share of it as it
 * was split (among the ranks of that time); else one each. */
static uint64_t held(const int *ranks, int n)
{
    if (!dps_g.split_mode || !dps_e.have_batch) return (uint64_t)n;
    uint64_t sum = 0;
    for (int j = 0; j < el.batch_n; j++) {
        uint64_t start, share;
        dps_split_range(dps_e.batch_n, j, el.batch_n, &start, &share);
        if (among(el.batch_ranks[j], ranks, n)) sum += share;
    }
    return sum;
}

/* What the survivors hold of what the ranks at the hook call's start held. */
static double survivors_fraction(void)
{
    uint64_t kept = held(el.ranks, el.n), total = held(el.hook_ranks, el.hook_n);
    return kept && total ? (double)kept / (double)total : 1.0;
}

void dps_elastic_note_batch(void)
{
    if (!el.on || el.batch_generation == el.told_generation) return;
    memcpy(el.batch_ranks, el.ranks, (size_t)el.n * sizeof *el.ranks);
    el.batch_n = el.n, el.batch_generation = el.told_generation;
}

int dps_elastic_batch_weight(uint64_t share, dps_weight_t *w)
{
    if (!el.on || el.batch_generation == el.told_generation || !dps_e.have_batch) return 0;
    /* a rank was lost between the batch's split and its gradients: each survivor's share of what
     * the survivors hold */
    uint64_t kept = held(el.ranks, el.n);
    *w = (dps_weight_t){kept ? (double)share / (double)kept : 1.0, 1};
    return 1;
}

/* --- scale mode: the shards of the ranks lost in an epoch ------------------------------------ */

/* A list of samples shared out among the survivors (dp_epoch_rest), and the ranks it was cut
 * among (ranks of the job's start, in the order of their shares). */
typedef struct shared_list {
    uint64_t *list, n;
    int *ranks, size;
} shared_list_t;

static struct {
    uint64_t *order, n;    /* the epoch's order, as every rank drew it (dp_epoch) */
    int *ranks, size;      /* the ranks it was cut among (by their ranks at the job's start) */
    uint64_t trained;      /* samples of it this rank trained: the batches of the steps ended */
    uint64_t stepping;     /* the samples of the batches given since the last step ended */
    uint64_t worked;       /* this rank's work in it so far: its shard, then its shares */
    uint64_t *rest, nrest; /* what the ranks lost in it had not trained, in the order found */
    uint64_t given;        /* of it, what was shared out so far */
    shared_list_t *lists;  /* those lists, in turn: a rank's work is its shard, then its share */
    int nlists;            /*   of each list it was there for */
    uint64_t *mine, nmine; /* this rank's share of the last list */
    int again;             /* the last call could not hold it all: the next returns it again */
} ep;

void dps_elastic_note_epoch(const uint64_t *order, uint64_t n)
{
    /* also before the first collective, which opens the backend and turns elastic mode on: a
     * program may draw its first epoch before it (every rank of the job cuts it then) */
    if (dps_g.split_mode || !(el.on || (!el.set_up && dps_job_may_go_on(&dps_g)))) return;
    int size = el.on ? el.n : dps_g.size;
    uint64_t *o = realloc(ep.order, (n ? n : 1) * sizeof *o);
    if (o) ep.order = o;
    int *r = realloc(ep.ranks, (size_t)size * sizeof *r);
    if (r) ep.ranks = r;
    for (int i = 0; i < ep.nlists; i++)
        free(ep.lists[i].list), free(ep.lists[i].ranks);
    ep.n = 0, ep.nrest = 0, ep.given = 0, ep.nlists = 0, ep.nmine = 0, ep.again = 0;
    /* every rank keeps it, or the job ends: a rank without it would skip the rest's sums */
    if (!o || !r)
        dps_fatal("dp_epoch: out of memory keeping the epoch's %llu samples ([elastic])",
                  (unsigned long long)n);
    memcpy(ep.order, order, n * sizeof *order);
    int me = 0;
    for (int i = 0; i < size; i++) {
        ep.ranks[i] = el.on ? el.ranks[i] : i;
        if (ep.ranks[i] == dps_g.rank) me = i;
    }
    ep.n = n, ep.size = size, ep.trained = 0, ep.stepping = 0;
    ep.worked = dps_epoch_count(n, me, size, (dps_uneven_t)dps_g.uneven);
}

void dps_elastic_epoch_batch(uint64_t n)
{
    if (ep.n) ep.stepping += n;
}

/* Counted by the batches, not the steps: a step may train several (gradient accumulation), and
 * a batch several steps (a GAN's two optimizers), or none yet (a loss inside the step). */
void dps_elastic_step_end(void)
{
    ep.trained += ep.stepping, ep.stepping = 0;
}

/* Rank k's share of g's list, cut as dps_epoch_shard cuts an epoch: malloc'ed, its length at *m.
 * Out of memory the job ends: every survivor must hold the same lists. */
static uint64_t *share_of(const shared_list_t *g, int k, uint64_t *m)
{
    uint64_t *share = malloc((g->n ? g->n : 1) * sizeof *share),
             *scratch = malloc((size_t)g->size * sizeof *scratch);
    if (!share || !scratch)
        dps_fatal("elastic: out of memory cutting a list of %llu samples", (unsigned long long)g->n);
    memcpy(share, g->list, g->n * sizeof *share);
    *m = dps_epoch_shard(share, g->n, k, g->size, (dps_uneven_t)dps_g.uneven, scratch);
    free(scratch);
    return share;
}

/* Rank r was lost: what it had not trained of its work in the epoch joins the rest. Its work is
 * its shard, then its share of each list shared out while it was there; every rank steps alike,
 * so it trained as many samples of it as this rank in the steps that ended, and those of the step
 * under way are lost with it. */
static void note_rest(int r)
{
    if (!ep.n) return;
    const shared_list_t shard = {ep.order, ep.n, ep.ranks, ep.size};
    uint64_t done = ep.trained;
    for (int l = -1; l < ep.nlists; l++) {
        const shared_list_t *g = l < 0 ? &shard : &ep.lists[l];
        int k = 0;
        while (k < g->size && g->ranks[k] != r)
            k++;
        if (k == g->size) continue; /* it was lost before this list */
        uint64_t m, *share = share_of(g, k, &m);
        if (done < m) {
            uint64_t *rest = realloc(ep.rest, (ep.nrest + m - done) * sizeof *rest);
            if (!rest) dps_fatal("elastic: out of memory listing the samples rank %d had not trained", r);
            ep.rest = rest;
            memcpy(ep.rest + ep.nrest, share + done, (m - done) * sizeof *share);
            ep.nrest += m - done;
        }
        free(share);
        done = done > m ? done - m : 0;
    }
}

int dps_elastic_rest_due(void)
{
    /* with [data] uneven = join the shards differ in length: the survivors would not meet there */
    if (!el.on || dps_g.split_mode || dps_g.uneven == DPS_UNEVEN_JOIN || !ep.n || ep.again) return 0;
    /* asked once the work so far is done: what of it was not trained (a short last batch the
     * program dropped) counts as done, on every rank alike, so that a rank lost later is known
     * to have trained all of it; but the batches given to a step still under way (gradient
     * accumulation) count when that step ends */
    if (ep.trained + ep.stepping < ep.worked) ep.trained = ep.worked - ep.stepping;
    return 1;
}

const uint64_t *dps_elastic_rest(uint64_t *n)
{
    *n = ep.nrest - ep.given;
    return ep.rest + ep.given;
}

const uint64_t *dps_elastic_rest_share(const uint64_t *rest, uint64_t n, uint64_t cap, uint64_t *count)
{
    if (rest) {
        shared_list_t g = {(uint64_t *)rest, n, el.ranks, dps_g.eff_size}; /* el.ranks: eff_rank's order */
        uint64_t keep;
        free(ep.mine);
        ep.mine = share_of(&g, dps_g.eff_rank, &keep);
        if (n) { /* kept, with the ranks it was cut among, for the ranks lost later */
            shared_list_t *lists = realloc(ep.lists, (size_t)(ep.nlists + 1) * sizeof *lists);
            uint64_t *list = malloc(n * sizeof *list);
            int *ranks = malloc((size_t)g.size * sizeof *ranks);
            if (lists) ep.lists = lists;
            if (!lists || !list || !ranks)
                dps_fatal("dp_epoch_rest: out of memory for a list of %llu samples", (unsigned long long)n);
            memcpy(list, rest, n * sizeof *list);
            memcpy(ranks, g.ranks, (size_t)g.size * sizeof *ranks);
            ep.lists[ep.nlists++] = (shared_list_t){list, n, ranks, g.size};
        }
        ep.nmine = keep, ep.given += n, ep.worked += keep;
    }
    ep.again = ep.nmine > cap;
    *count = ep.nmine;
    return ep.mine;
}

/* Rank 0 was lost, and this rank is rank 0 now: its output is the job's. */
static void take_over_rank0(void)
{
    if (DPS_POLICY_ENUM(&dps_g.policy, output, stdout) != DPS_V_output_stdout_rank0) return;
    if (dps_output_take_over() != 0)
        DPS_WARN(
            "elastic: rank 0 was lost and this rank took its place, but its stdout stays silent ([output] "
            "stdout = rank0): %s",
            errno == EBADF || errno == 0 ? "the rank process replaced itself (exec) after dpshim silenced it"
                                         : strerror(errno));
}

/* Notes the loss, and says it once, from the lowest survivor. */
static void say_loss(const int *before, int nbefore)
{
    char names[512];
    size_t o = 0;
    int lost = 0;
    for (int j = 0; j < nbefore; j++) {
        int r = before[j], kept = 0;
        for (int i = 0; i < el.n; i++)
            kept |= el.ranks[i] == r;
        if (kept) continue;
        lost++;
        el.lost_in_step[r] = dps_e.step + 1;
        note_rest(r);
        char what[160];
        snprintf(what, sizeof what, "rank %d in step %llu (%s)", r, (unsigned long long)dps_e.step + 1,
                 dps_guard_lost_cause(r));
        dps_diag_lost(what);
        if (o < sizeof names)
            o += (size_t)snprintf(names + o, sizeof names - o, "%srank %d (%s, process %u: %s)",
                                  lost > 1 ? ", " : "", r, dps_guard_host(r), dps_guard_pid(r),
                                  dps_guard_lost_cause(r));
    }
    if (dps_g.eff_rank != 0 || !lost) return;
    /* said now, not at exit: dpshim-run then knows a rank's end was a loss the job went on from */
    for (int r = 0; r < dps_g.size; r++)
        if (el.lost_in_step[r]) dps_exit_status_lost(r);
    /* what of the step the lost ranks held: it is missing from the sums not complete at the loss
     * (a sum some survivor completed holds it) */
    char missing[160];
    uint64_t gone_share = held(before, nbefore) - held(el.ranks, el.n);
    if (dps_g.split_mode && dps_e.have_batch)
        snprintf(missing, sizeof missing, "; the step's lost share (%llu of %llu samples)",
                 (unsigned long long)gone_share, (unsigned long long)dps_e.batch_n);
    else
        snprintf(missing, sizeof missing, "; the lost batch of the step");
    DPS_WARN(
        "elastic: lost %s during step %llu%s is missing from the gradient sums not complete at the loss; "
        "%d rank(s) go on%s",
        names, (unsigned long long)dps_e.step + 1, missing, el.n,
        dps_g.split_mode ? ", each global batch split among them" : ", each with its batch");
}

/* The program is told of the survivors (dps_elastic_tell): renumbered, and the step at the loss
 * weighted over what they hold. */
static void tell(void)
{
    if (el.told_generation == el.generation) return;
    if (!el.in_hook) memcpy(el.hook_ranks, el.ranks, (size_t)el.n * sizeof *el.ranks), el.hook_n = el.n;
    el.in_hook = 1;
    int nbefore = el.n;
    memcpy(el.before, el.ranks, (size_t)nbefore * sizeof *el.before);
    memcpy(el.ranks, el.survivors, (size_t)el.nsurvivors * sizeof *el.ranks);
    el.n = el.nsurvivors, el.told_generation = el.generation;
    int me = 0;
    for (int i = 0; i < el.n; i++)
        if (el.ranks[i] == dps_g.rank) me = i;
    int was_rank0 = dps_g.eff_rank == 0;
    dps_g.eff_rank = me, dps_g.eff_size = el.n;
    if (me == 0 && !was_rank0) take_over_rank0();
    el.fix = 1.0 / survivors_fraction();
    say_loss(el.before, nbefore);
}

void dps_elastic_tell(void)
{
    if (el.on) tell();
}

int dps_elastic_recover(const dps_backend_t *be, const char *hook, int abandoned, void *buf, size_t bytes)
{
    dps_guard_mark_t mark = dps_guard_own_begin("the survivors' agreement");
    for (;;) {
        dps_guard_decision_t d = {.ranks = el.decided, .laggard = el.laggard};
        if (dps_guard_survivors(el.done, &d) != 0) {
            char what[300];
            snprintf(what, sizeof what, "the survivors of a lost rank cannot go on: %s", d.why);
            dps_guard_failed(what);
        }
        if (be->set_survivors(d.ranks, d.n, d.generation) != 0) {
            char what[600];
            snprintf(what, sizeof what, "%s: going on among the survivors: %s", hook, be->last_error());
            dps_guard_failed(what);
        }
        memcpy(el.survivors, d.ranks, (size_t)d.n * sizeof *el.survivors);
        el.nsurvivors = d.n, el.generation++;
        dps_guard_went_on(d.ranks, d.n);
        if (dps_files_new_leader(d.ranks, d.n)) dps_files_lead_handles(); /* rank 0 lost: this rank leads */
        int me = 0, lag = 0;
        for (int i = 0; i < d.n; i++) {
            if (d.ranks[i] == dps_g.rank) me = i;
            lag |= d.laggard[i];
        }
        int replayed = 0;
        if (lag) {
            /* a root whose last collective went through NCCL sends that one's result */
            size_t result_bytes = 0;
            void *result = d.root == me && el.last_on_device && el.read_device_result
                               ? el.read_device_result(&result_bytes)
                               : NULL;
            if (d.root == me && el.last_on_device && !result)
                dps_guard_failed("the replay among the survivors: the last GPU result cannot be read back");
            int rc = be->replay(buf, bytes, d.root, d.laggard, result, result_bytes);
            free(result);
            if (rc == DPS_BACKEND_ABANDONED) continue; /* another rank lost meanwhile */
            if (rc != 0) {
                char what[600];
                snprintf(what, sizeof what, "%s: the replay among the survivors: %s", hook, be->last_error());
                dps_guard_failed(what);
            }
            replayed = d.laggard[me];
        }
        if (replayed) el.done++, el.last_on_device = 0;
        /* a collective given up and completed nowhere runs again among the survivors: the first
         * the loss left incomplete, where every survivor is told. One completed elsewhere ends as
         * it did there, and the survivors are told at the next (dps_elastic_recover_pending), as
         * they are after a loss found outside a collective (a file wait) */
        if (abandoned && !replayed) tell();
        DPS_DEBUG(
            "elastic: %s: done %llu, cut %llu, root %d, laggard %d, abandoned %d, replayed %d, fix %.17g",
            hook, (unsigned long long)el.done, (unsigned long long)d.cut, d.root, d.laggard[me], abandoned,
            replayed, el.fix);
        dps_guard_own_end(mark);
        return replayed ? DPS_ELASTIC_REPLAYED : DPS_ELASTIC_AGAIN;
    }
}

int dps_elastic_recover_pending(const dps_backend_t *be, const char *hook)
{
    if (!el.on) return 0;
    int went = dps_guard_lost_pending();
    if (went) dps_elastic_recover(be, hook, 0, NULL, 0);
    if (el.told_generation == el.generation) return went;
    tell(); /* now, where every survivor finds the loss */
    return 1;
}

void dps_elastic_completed(void)
{
    el.done++, el.last_on_device = 0;
}

void dps_elastic_completed_on_device(void)
{
    el.done++, el.last_on_device = 1;
}

void dps_elastic_set_result_reader(void *(*read)(size_t *bytes))
{
    el.read_device_result = read;
}

void dps_elastic_result_on_device(void)
{
    el.last_on_device = 1;
}

unsigned dps_elastic_generation(void)
{
    return el.generation;
}

const int *dps_elastic_ranks(int *n)
{
    *n = el.nsurvivors;
    return el.survivors;
}

void dps_elastic_at_exit(void)
{
    if (el.on) tell(); /* a loss in the last collective, replayed here: the job's account */
    if (!dps_elastic_shrunk() || dps_g.eff_rank != 0) return;
    char names[512];
    size_t o = 0;
    int lost = 0;
    for (int r = 0; r < dps_g.size; r++) {
        if (!el.lost_in_step[r]) continue;
        lost++;
        if (o < sizeof names)
            o += (size_t)snprintf(names + o, sizeof names - o, "%srank %d in step %llu", lost > 1 ? ", " : "",
                                  r, (unsigned long long)el.lost_in_step[r]);
    }
    DPS_WARN("elastic: the job lost %s and went on with %d of its %d ranks", names, el.n, dps_g.size);
}
