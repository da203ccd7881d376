/* The guard's watchdog thread: every 200 ms it reads this rank's position and the other ranks'
 * messages, ends a stuck job with a table of where every rank is (this rank alone without a side
 * channel), and holds a leaving rank at the exit barrier until the others have left too. */
#define _GNU_SOURCE
#include "guard_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "diag/diag.h"
#include "core/sys.h"
#include "survivors.h"

/* --- messages between the ranks' watchdogs --- */

/* MSG_WHERE asks a rank where it is; its MSG_HERE answers with its status, and starts no report.
 * MSG_LOST tells a rank that the others found it stalled and go on without it (elastic mode);
 * MSG_ENDING tells the other survivors that this rank ends rank left_rank, and why (LOST_* in
 * why): its process is gone soon after, for that reason and not a crash. */
enum { MSG_STATUS = 1, MSG_LEAVING = 2, MSG_WHERE = 3, MSG_HERE = 4, MSG_LOST = 5, MSG_ENDING = 6 };
/* WHY_PEER_GONE: a rank of this host whose process ended without leaving the program (liveness.c). */
enum { WHY_TIMEOUT = 1, WHY_PEER_LEFT = 2, WHY_ANSWER = 3, WHY_FAILED = 4, WHY_PEER_GONE = 5 };

typedef struct guard_msg {
    int32_t kind, why, rank, in_coll, leaving, coll, dtype, left_rank, files_wait;
    uint64_t seq, step, count, left_step, left_seq;
    uint64_t call;  /* the collective's fingerprint: which call, sizes and dtypes */
    double seconds; /* waiting in the collective, or since the last one */
    char hook[DPS_GUARD_HOOK_NAME];
    char failure[256];      /* WHY_FAILED: the backend's error */
    dps_diag_tally_t tally; /* MSG_LEAVING: what the rank counted, for rank 0's exit summary */
} guard_msg_t;

_Static_assert(sizeof(guard_msg_t) <= DPS_GUARD_MSG_MAX, "a guard message must fit the side channel's slots");
_Static_assert(sizeof(dps_surv_msg_t) <= DPS_GUARD_MSG_MAX, "an agreement message must fit them too");

/* Either kind off the side channel: the first word tells them apart. */
typedef union any_msg {
    int32_t kind;
    guard_msg_t guard;
    dps_surv_msg_t surv;
} any_msg_t;

/* Elastic mode ([elastic] lost_rank = continue under a launcher that keeps the survivors): a
 * rank found lost goes to the survivors' agreement (survivors.c) instead of ending the job. The
 * agreement is the watchdog's and the main thread's: under the lock. */
static struct {
    atomic_int on;
    atomic_int pending; /* a loss the main thread has not yet recovered from */
    int min_ranks;
    int members; /* the ranks of the last decision (at first the job's) */
    /* their lowest: rank 0 of the job as it is, which leads the gated files' protocol */
    atomic_int lowest;
    /* the watchdog's: the collective the main thread was in at the last loss, and when */
    uint64_t loss_seq, loss_ns;
    /* this rank ends without knowing whether the others go on (no quorum here, no decision) */
    atomic_int others_may_go_on;
    /* the main thread's word to the watchdog: rank + 1 never answered the agreement */
    atomic_int silent_in_agreement;
    pthread_mutex_t lock;
    dps_survivors_t *agreement;
    unsigned char *went_on_without; /* a byte per rank: the job went on without it */
} elastic = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* What the watchdog knows of one other rank. */
typedef struct peer {
    guard_msg_t status; /* its answer, valid when have */
    uint64_t left_seq, left_step;
    dps_diag_tally_t tally; /* what it counted, as it left */
    unsigned char have, left;
    unsigned char gone; /* its process ended without leaving the program: it will never answer */
    _Atomic unsigned char lost_cause; /* elastic mode: why it was lost (LOST_*), 0: not lost */
} peer_t;

/* Why a rank was lost in elastic mode, as this rank learned it. */
enum { LOST_GONE = 1, LOST_STALLED = 2, LOST_SILENT = 3, LOST_TOLD = 4 };

/* What a report's answers say of a rank: LOST_SILENT (no answer), LOST_STALLED (in the program's
 * own code, not leaving it), or 0 (in a collective, or leaving). */
static int stall_of(const peer_t *p)
{
    if (!p->have) return LOST_SILENT;
    return !p->status.in_coll && !p->status.leaving ? LOST_STALLED : 0;
}

/* The watchdog's own state: the thread, and what it knows of the job, one entry per rank
 * (allocated for the job's size when the watchdog starts). */
static struct {
    pthread_t thread;
    atomic_int running, stop;
    atomic_int alone;   /* no side channel (yet): this rank's position is all there is */
    atomic_int opening; /* the backend is starting up, for the hook in opened_by */
    const char *opened_by;
    peer_t *peers;
    atomic_int nleft;     /* ranks that announced they left the program */
    atomic_int ngone;     /* ranks whose process ended without leaving it (kept after the table goes) */
    atomic_int reporting; /* read by dps_guard_end_job on any thread */
    uint64_t deadline;
    guard_msg_t first; /* what started the report */
    /* this rank's wait for rank 0's file operation: when rank 0 was last asked, and how many of
     * its answers in a row found it in the same collective this rank has not entered */
    uint64_t asked_ns, wait_since, rank0_seq; /* rank0_seq: rank 0's place (place()) at the last hit */
    int rank0_hits;
    int gone_at_report; /* ngone as the report started */
} watch;

static guard_msg_t snapshot(int why)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    guard_msg_t m = {.kind = MSG_STATUS, .why = why, .rank = dps_guard_conf.rank, .left_rank = -1};
    m.in_coll = atomic_load(&pos->in_coll);
    m.files_wait = atomic_load(&pos->files_wait);
    m.leaving = atomic_load(&pos->leaving);
    m.seq = atomic_load(&pos->seq);
    m.step = atomic_load(&pos->step);
    m.coll = atomic_load(&pos->coll);
    m.dtype = atomic_load(&pos->dtype);
    m.count = atomic_load(&pos->count);
    m.call = atomic_load(&pos->call);
    m.seconds = (double)(dps_guard_now_ns() - atomic_load(&pos->since_ns)) * 1e-9;
    snprintf(m.hook, sizeof m.hook, "%s", atomic_load(&pos->hook));
    return m;
}

/* To every other rank whose process is not known to have ended (a message to one would only
 * wait for ever, and on TCP try to connect to it again) */
static void send_all(const guard_msg_t *m)
{
    for (int r = 0; r < dps_guard_conf.size; r++)
        if (r != dps_guard_conf.rank && !(watch.peers && watch.peers[r].gone))
            dps_guard_conf.be->guard_send(m, sizeof *m, r);
}

static int known(int r)
{
    return r >= 0 && r < dps_guard_conf.size;
}

static void describe(const guard_msg_t *m, char *buf, size_t len)
{
    if (m->leaving)
        snprintf(buf, len, "left the program (exit) after step %llu and collective #%llu",
                 (unsigned long long)m->step, (unsigned long long)m->seq);
    else if (m->in_coll && m->coll < 0)
        snprintf(buf, len, "in the shim's %s after collective #%llu and step %llu, waiting %.1f s", m->hook,
                 (unsigned long long)m->seq, (unsigned long long)m->step, m->seconds);
    else if (m->in_coll)
        snprintf(buf, len, "in %s (%s %s x %llu), collective #%llu after step %llu, waiting %.1f s", m->hook,
                 dps_coll_name(m->coll), dps_dtype_name(m->dtype), (unsigned long long)m->count,
                 (unsigned long long)m->seq, (unsigned long long)m->step, m->seconds);
    else
        snprintf(buf, len, "in the program's own code for %.1f s, since %s collective #%llu after step %llu",
                 m->seconds, m->hook, (unsigned long long)m->seq, (unsigned long long)m->step);
}

/* The place the job is stuck in, as one number: the collective, whether a rank is inside it, and
 * then which call with which sizes (so a rank that called the same collective with another size
 * stands out). */
static uint64_t place(const guard_msg_t *m)
{
    uint64_t p = m->seq << 1 | (m->in_coll != 0);
    if (!m->in_coll) return p;
    p = dps_guard_mix(p, m->call);
    /* the shim's own waits (a desync check, a wait for rank 0's file operation) keep the last
     * collective's fingerprint: what they are tells them apart */
    return m->coll < 0 ? dps_guard_mix(p, dps_fnv1a(DPS_FNV_SEED, m->hook, strnlen(m->hook, sizeof m->hook)))
                       : p;
}

/* The most common place among the answers (the lowest such rank's on a tie); -1 when memory
 * is short. */
static int majority(uint64_t *place_p)
{
    int n = dps_guard_conf.size, answered = 0;
    uint64_t *places = malloc((size_t)n * sizeof *places);
    int *votes = malloc((size_t)n * sizeof *votes);
    int rc = places && votes ? 0 : -1;
    for (int r = 0; rc == 0 && r < n; r++)
        if (watch.peers[r].have) places[answered++] = place(&watch.peers[r].status);
    if (rc == 0) rc = dps_guard_votes(places, answered, votes);
    for (int i = 0, best = 0; rc == 0 && i < answered; i++)
        if (votes[i] > best) best = votes[i], *place_p = places[i];
    free(places), free(votes);
    return rc;
}

/* This rank is ending the job: its watchdog starts no report of its own meanwhile (another rank
 * ending the job first is the cause, not news). */
static atomic_int ending;

_Noreturn void dps_guard_end_job(int printed)
{
    atomic_store(&ending, 1);
    /* the ranks' report decided it: every rank that can end does so now */
    if (watch.reporting && !atomic_load(&elastic.others_may_go_on)) dps_exit_status_ends_job();
    dps_run_before_fatal_exit();
    if (!printed) {
        struct timespec pause_ = {2, 0};
        nanosleep(&pause_, NULL);
    }
    dps_exit_now(DPS_EXIT_GUARD);
}

void dps_guard_diag_fail(const char *why)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    int in = atomic_load(&pos->in_coll) && atomic_load(&pos->coll) >= 0;
    dps_diag_fail(why, atomic_load(&pos->hook), in ? atomic_load(&pos->seq) : 0,
                  dps_guard_now_ns() - atomic_load(&pos->since_ns), atomic_load(&pos->step));
}

/* What went wrong, for the diagnostics files. */
static void reason(const guard_msg_t *f, char *buf, size_t len)
{
    if (f->why == WHY_FAILED)
        snprintf(buf, len, "guard: %s collective #%llu after step %llu failed on rank %d: %s", f->hook,
                 (unsigned long long)f->seq, (unsigned long long)f->step, f->rank, f->failure);
    else if (f->why == WHY_PEER_LEFT)
        snprintf(buf, len, "guard: rank %d left the program after step %llu; the job was ended", f->left_rank,
                 (unsigned long long)f->left_step);
    else if (f->why == WHY_PEER_GONE)
        snprintf(buf, len,
                 "guard: rank %d's process ended while the job ran (killed, crashed or _exit); the job "
                 "was ended",
                 f->left_rank);
    else
        snprintf(buf, len,
                 "guard: %s collective #%llu after step %llu waited longer than the timeout on rank %d",
                 f->hook, (unsigned long long)f->seq, (unsigned long long)f->step, f->rank);
}

/* The report's first line. */
static void headline(const guard_msg_t *f)
{
    if (f->why == WHY_FAILED)
        DPS_ERROR("guard: %s collective #%llu (after step %llu) failed on rank %d (%s): %s", f->hook,
                  (unsigned long long)f->seq, (unsigned long long)f->step, f->rank, dps_guard_host(f->rank),
                  f->failure);
    else if (f->why == WHY_PEER_LEFT)
        DPS_ERROR(
            "guard: rank %d left the program after step %llu (its last collective #%llu), while rank %d "
            "waits in %s collective #%llu (after step %llu): that collective can never complete",
            f->left_rank, (unsigned long long)f->left_step, (unsigned long long)f->left_seq, f->rank, f->hook,
            (unsigned long long)f->seq, (unsigned long long)f->step);
    else if (f->why == WHY_PEER_GONE)
        DPS_ERROR(
            "guard: rank %d (%s, process %u) is gone: its process ended without leaving the program "
            "(killed by a signal or the OOM killer, crashed, or left with _exit), while rank %d waits in %s "
            "collective #%llu (after step %llu): that collective can never complete",
            f->left_rank, dps_guard_host(f->left_rank), (unsigned)f->left_seq, f->rank, f->hook,
            (unsigned long long)f->seq, (unsigned long long)f->step);
    else
        DPS_ERROR(
            "guard: %s collective #%llu (after step %llu) has waited %.1f s on rank %d, more than [guard] "
            "timeout = %.0f s: the job is stuck",
            f->hook, (unsigned long long)f->seq, (unsigned long long)f->step, f->seconds, f->rank,
            dps_guard_conf.timeout);
}

/* A rank that did not answer: gone (crashed, killed, _exit) or frozen (SIGSTOP), or out of reach
 * when no rank of its host answered while it is another host than this one (a cut link, a node
 * down). */
static void no_answer(int r, char *d, size_t len)
{
    const char *host = dps_guard_host(r);
    int reachable = !host[0] || strcmp(host, dps_guard_host(dps_guard_conf.rank)) == 0;
    for (int q = 0; !reachable && known(q); q++)
        reachable = watch.peers[q].have && strcmp(dps_guard_host(q), host) == 0;
    if (reachable)
        snprintf(d, len, "no answer (crashed, killed, stopped, or left with _exit)  <-- culprit");
    else
        snprintf(d, len,
                 "no answer: unreachable (no rank on %s answered: the network or the node is down)  "
                 "<-- culprit",
                 host);
}

/* The job went on without rank r (dps_guard_went_on), so it is no culprit of what stops the
 * job now; a rank whose loss ended the job (too few left, no quorum) is. */
static int went_on_without(int r)
{
    if (!atomic_load(&elastic.on)) return 0;
    pthread_mutex_lock(&elastic.lock);
    int without = elastic.went_on_without && elastic.went_on_without[r];
    pthread_mutex_unlock(&elastic.lock);
    return without;
}

void dps_guard_went_on(const int *ranks, int n)
{
    int size = dps_guard_conf.size;
    pthread_mutex_lock(&elastic.lock);
    if (!elastic.went_on_without) elastic.went_on_without = calloc((size_t)size, 1);
    if (elastic.went_on_without) {
        memset(elastic.went_on_without, 1, (size_t)size);
        for (int i = 0; i < n; i++)
            if (ranks[i] >= 0 && ranks[i] < size) elastic.went_on_without[ranks[i]] = 0;
    }
    pthread_mutex_unlock(&elastic.lock);
}

static _Noreturn void finish_report(void)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    peer_t *peers = watch.peers;
    for (int r = 0; !watch.first.kind && known(r); r++) /* the report that started it all */
        if (peers[r].have && peers[r].status.why != WHY_ANSWER) watch.first = peers[r].status;
    char why[DPS_GUARD_HOOK_NAME + 512];
    reason(&watch.first, why, sizeof why);
    dps_guard_diag_fail(why);
    int printer = conf->rank; /* the lowest rank that saw something wrong */
    for (int r = 0; known(r); r++)
        if (peers[r].have && peers[r].status.why != WHY_ANSWER) {
            printer = r;
            break;
        }
    if (printer != conf->rank) {
        DPS_ERROR("guard: ending the job (exit status %d); rank %d prints where every rank is",
                  DPS_EXIT_GUARD, printer);
        dps_guard_end_job(0);
    }
    headline(&watch.first);
    /* a rank that left is the one to blame; else the ranks away from where most of them are */
    int left = watch.first.why == WHY_PEER_LEFT || watch.first.why == WHY_PEER_GONE;
    uint64_t stuck = 0;
    int marks = !left && majority(&stuck) == 0;
    DPS_ERROR("guard: where every rank is:");
    for (int r = 0; known(r); r++) {
        char d[DPS_GUARD_HOOK_NAME + 256], who[DPS_GUARD_HOST + 32];
        if (!peers[r].have && went_on_without(r)) {
            snprintf(d, sizeof d, "lost earlier: the job went on without it");
        } else if (!peers[r].have && (peers[r].gone || dps_guard_peer_gone(r))) {
            snprintf(d, sizeof d,
                     "gone: its process has ended (killed, crashed, or left with _exit)  <-- culprit");
        } else if (!peers[r].have) {
            no_answer(r, d, sizeof d);
        } else {
            describe(&peers[r].status, d, sizeof d);
            if (left ? peers[r].status.leaving : marks && place(&peers[r].status) != stuck)
                strncat(d, "  <-- culprit", sizeof d - strlen(d) - 1);
        }
        DPS_ERROR("guard:   %s: %s", dps_guard_who(r, who, sizeof who), d);
    }
    /* a rank gone, or ranks stalled or silent (not rank 0): what recovery mode would go on without */
    int lost_kind = watch.first.why == WHY_PEER_GONE && watch.first.left_rank != 0;
    for (int r = 1; watch.first.why == WHY_TIMEOUT && known(r); r++)
        lost_kind |= stall_of(&peers[r]) != 0;
    if (stall_of(&peers[0])) lost_kind = 0;
    if (dps_guard_conf.recovery_hint && lost_kind)
        DPS_ERROR("guard: to let the other ranks go on without a lost or stalled rank, launch under the "
                  "launcher's recovery mode: dpshim-run --enable-recovery (mpirun --enable-recovery); "
                  "under Slurm, mpirun --enable-recovery inside the allocation (srun --mpi=pmix ends the "
                  "whole step when a task dies, --no-kill or not)");
    DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
    dps_guard_end_job(1);
}

/* A collective of the main thread failed (dps_guard_failed): what the backend said. */
static char failure[256];
static atomic_int failed;

static void start_report(int why, int left_rank)
{
    if (watch.reporting) return;
    watch.reporting = 1;
    guard_msg_t m = snapshot(why);
    if (why == WHY_FAILED) snprintf(m.failure, sizeof m.failure, "%s", failure);
    if (left_rank >= 0) {
        m.left_rank = left_rank;
        m.left_step = watch.peers[left_rank].left_step;
        /* a rank gone without leaving has no last collective: its process id names it */
        m.left_seq = why == WHY_PEER_GONE ? dps_guard_pid(left_rank) : watch.peers[left_rank].left_seq;
    }
    if (why != WHY_ANSWER && !watch.first.kind) watch.first = m; /* answers do not say what went wrong */
    watch.gone_at_report = atomic_load(&watch.ngone);
    watch.peers[dps_guard_conf.rank].status = m, watch.peers[dps_guard_conf.rank].have = 1;
    send_all(&m);
    watch.deadline = dps_guard_now_ns() + 3000000000u; /* time for every reachable rank to answer */
}

static void rank0_answered(const guard_msg_t *m);

static void send_agreement(void);
static void lost_elastic(int r, int cause);
static void end_lost_rank(int r, int kind);
static void note_lost_cause(peer_t *p, int cause, int beats_gone);

static int going_on_after_loss(void)
{
    return atomic_load(&elastic.on);
}

/* The other ranks found this rank stalled (`by` said so) and go on without it: it ends, as a
 * killed rank would, without a status of its own (dpshim-run counts it lost). */
static _Noreturn void ended_as_stalled(int by)
{
    atomic_store(&ending, 1);
    guard_msg_t me = snapshot(WHY_ANSWER);
    char d[DPS_GUARD_HOOK_NAME + 256], who[DPS_GUARD_HOST + 32];
    describe(&me, d, sizeof d);
    char found[48] = "";
    if (by != me.rank) snprintf(found, sizeof found, " (rank %d found it so)", by);
    DPS_ERROR("guard: %s is %s, while the other ranks wait for it in a collective: stalled past [guard] "
              "timeout = %.0f s%s. They go on without it ([elastic] lost_rank = continue): ending this "
              "process",
              dps_guard_who(me.rank, who, sizeof who), d, dps_guard_conf.timeout, found);
    dps_sys_flush_all();
    _exit(DPS_EXIT_GUARD);
}

static void forget_report(void)
{
    watch.reporting = 0;
    memset(&watch.first, 0, sizeof watch.first);
    for (int r = 0; known(r); r++)
        watch.peers[r].have = 0;
}

/* Elastic mode: a finished report of a timeout does not end the job where ranks stalled in the
 * program's own code (or silent) explain it, while every other rank waits in one collective (or
 * two in a row). The stalled ranks are lost and ended (at once where they run on this host; told
 * to end otherwise), and the others go on. Every rank holds the same answers (each rank sends its
 * one to all), so every rank that finishes the report finds the same ranks stalled; one that finds
 * itself among them ends. A report that a loss already explains is dropped. Rank 0 stalled (where
 * it may not be lost), a rank in other calls, or one that left the program: the job ends as
 * without elastic mode. Returns 1 where the report was settled so. */
static int settle_by_loss(void)
{
    if (!going_on_after_loss()) return 0;
    for (int r = 0; !watch.first.kind && known(r); r++) /* what started the report */
        if (watch.peers[r].have && watch.peers[r].status.why != WHY_ANSWER)
            watch.first = watch.peers[r].status;
    if (watch.first.why != WHY_TIMEOUT) return 0; /* a failure, a rank that left: no stall */
    const int me = dps_guard_conf.rank;
    int nstalled = 0, nwaiting = 0;
    /* the waiting ranks' collectives: one, or two in a row (a ring a lost rank broke off may have
     * completed on some ranks: the survivors' agreement replays it to the others), each at one
     * place */
    uint64_t seq = 0, low = UINT64_MAX, at[2] = {0, 0};
    int seen[2] = {0, 0};
    for (int r = 0; known(r); r++) {
        const peer_t *p = &watch.peers[r];
        if (p->gone) continue;
        if (p->left || (p->have && p->status.leaving)) return 0; /* left the program: no stall */
        if (stall_of(p)) {
            nstalled++;
        } else {
            nwaiting++;
            if (p->status.seq > seq) seq = p->status.seq;
            if (p->status.seq < low) low = p->status.seq;
        }
    }
    for (int r = 0; nwaiting && known(r); r++) {
        const peer_t *p = &watch.peers[r];
        if (p->gone || stall_of(p)) continue;
        if (seq - low > 1) return 0; /* further apart: not a stall */
        int i = p->status.seq == seq;
        if (seen[i]++ && place(&p->status) != at[i]) return 0; /* other calls: a desync */
        at[i] = place(&p->status);
    }
    if (!nwaiting) return 0;
    if (!nstalled) {
        /* all in one collective: a loss found meanwhile, or just before in the same collective,
         * explains the wait (the main thread gives that collective up); nothing else does */
        int explained = atomic_load(&watch.ngone) > watch.gone_at_report ||
                        (seq <= elastic.loss_seq &&
                         (double)(dps_guard_now_ns() - elastic.loss_ns) * 1e-9 < dps_guard_conf.timeout);
        if (!explained) return 0;
        forget_report();
        return 1;
    }
    if (stall_of(&watch.peers[me])) ended_as_stalled(me);
    for (int r = 0; known(r); r++) {
        int kind = stall_of(&watch.peers[r]);
        if (watch.peers[r].gone || !kind) continue;
        end_lost_rank(r, kind);
    }
    forget_report();
    return 1;
}

/* Rank r, stalled or silent (kind), is lost: the others hear why, the agreement goes on without
 * it, and its process is ended (on this host; elsewhere it ends itself on MSG_LOST, if it can). */
static void end_lost_rank(int r, int kind)
{
    int me = dps_guard_conf.rank;
    /* before the agreement's messages and the kill: a survivor that sees the process gone
     * first still names the cause found here (the side channel keeps each pair's order) */
    guard_msg_t ends = {.kind = MSG_ENDING, .rank = me, .left_rank = r, .why = kind};
    for (int q = 0; known(q); q++)
        if (q != me && q != r && !watch.peers[q].gone) dps_guard_conf.be->guard_send(&ends, sizeof ends, q);
    lost_elastic(r, kind);
    dps_guard_end_peer(r);
    guard_msg_t end = {.kind = MSG_LOST, .rank = me, .left_rank = -1};
    dps_guard_conf.be->guard_send(&end, sizeof end, r);
}

static void receive(void)
{
    any_msg_t any;
    int src;
    while (dps_guard_conf.be->guard_poll(&any, sizeof any, &src) == 1 && known(src)) {
        if (any.kind == DPS_SURV_VIEW || any.kind == DPS_SURV_DECIDE) {
            if (!atomic_load(&elastic.on)) continue;
            pthread_mutex_lock(&elastic.lock);
            int before = dps_surv_nlost(elastic.agreement);
            dps_surv_receive(elastic.agreement, src, &any.surv);
            int after = dps_surv_nlost(elastic.agreement);
            pthread_mutex_unlock(&elastic.lock);
            for (int r = 0; before != after && known(r); r++)
                if (dps_surv_is_lost(elastic.agreement, r)) lost_elastic(r, LOST_TOLD);
            continue;
        }
        const guard_msg_t m = any.guard;
        peer_t *p = &watch.peers[src];
        if (m.kind == MSG_WHERE) {
            guard_msg_t here = snapshot(WHY_ANSWER);
            here.kind = MSG_HERE;
            dps_guard_conf.be->guard_send(&here, sizeof here, src);
        } else if (m.kind == MSG_HERE) {
            if (src == atomic_load(&elastic.lowest)) rank0_answered(&m);
        } else if (m.kind == MSG_LEAVING) {
            if (!p->left) p->left = 1, atomic_fetch_add(&watch.nleft, 1);
            p->left_seq = m.seq, p->left_step = m.step, p->tally = m.tally;
        } else if (m.kind == MSG_LOST) {
            ended_as_stalled(src);
        } else if (m.kind == MSG_ENDING && known(m.left_rank) && m.left_rank != dps_guard_conf.rank &&
                   atomic_load(&elastic.on) && (m.why == LOST_STALLED || m.why == LOST_SILENT)) {
            /* its process ending is that rank's doing: the found cause beats "its process ended" */
            note_lost_cause(&watch.peers[m.left_rank], m.why, 1);
            lost_elastic(m.left_rank, m.why);
        } else if (m.kind == MSG_STATUS) {
            p->status = m, p->have = 1;
            if (m.why != WHY_ANSWER && !watch.first.kind) watch.first = m;
            start_report(WHY_ANSWER, -1);
        }
    }
}

/* A wait for rank 0's file operation that no waiting can end: rank 0 (the lowest survivor, after
 * its loss) left or was lost, or is inside a collective this rank has not entered (a decision only
 * one rank has: a time budget, a rank-dependent branch, a file touched on some ranks only). Said
 * at once, naming both places. */
static _Noreturn void file_deadlock(const guard_msg_t *rank0)
{
    char mine[DPS_GUARD_HOOK_NAME + 256], theirs[DPS_GUARD_HOOK_NAME + 256],
        why[2 * DPS_GUARD_HOOK_NAME + 1024];
    guard_msg_t me = snapshot(WHY_TIMEOUT);
    int lead = atomic_load(&elastic.lowest);
    int lost = !rank0 && atomic_load(&watch.peers[lead].lost_cause);
    describe(&me, mine, sizeof mine);
    if (rank0)
        describe(rank0, theirs, sizeof theirs);
    else if (lost)
        snprintf(theirs, sizeof theirs, "lost (%s)", dps_guard_lost_cause(lead));
    else
        snprintf(theirs, sizeof theirs, "left the program");
    snprintf(why, sizeof why,
             "guard: rank %d is %s, while rank %d is %s%s: neither can go on, since only rank %d's file "
             "operation ends this rank's wait",
             me.rank, mine, lead, theirs, rank0 ? ", which this rank has not entered" : "", lead);
    dps_guard_diag_fail(why);
    DPS_ERROR("%s", why);
    if (!lost) /* a lost one: the loss ends the job for its own reason, said where it was found */
        DPS_ERROR("guard: a decision only one rank has leads here (a time budget, a rank-dependent branch, a "
                  "rank0_only file touched on some ranks only): take it on rank 0 and share it (dp_metric, "
                  "a broadcast), or make the same file calls on every rank");
    DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
    dps_guard_end_job(1);
}

/* Whether rank 0's answer shows it where only this rank can let it go on: inside a collective
 * beyond this rank's last one, or inside one of the shim's own checks (every rank takes part, and
 * this rank is not in it). Rank 0's wait for the others' file acks is no proof: another rank's may
 * be the one missing. */
static int rank0_needs_me(const guard_msg_t *m)
{
    if (m->leaving || !m->in_coll || m->files_wait) return 0;
    return m->coll < 0 || m->seq > atomic_load(&dps_guard_pos.seq);
}

/* Two answers in a row, a second apart, that find rank 0 at the same such place while this rank
 * still makes the same wait: no timing explains that. */
static void rank0_answered(const guard_msg_t *m)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    int waiting =
        atomic_load(&pos->files_wait) == FILES_WAIT_RANK0 && atomic_load(&pos->since_ns) == watch.wait_since;
    if (!waiting || !rank0_needs_me(m)) {
        watch.rank0_hits = 0;
        return;
    }
    uint64_t at = place(m);
    watch.rank0_hits = watch.rank0_hits && at == watch.rank0_seq ? watch.rank0_hits + 1 : 1;
    watch.rank0_seq = at;
    if (watch.rank0_hits >= 2) file_deadlock(m);
}

int dps_guard_rank_lost(int r)
{
    if (!atomic_load(&elastic.on) || !watch.peers || !known(r)) return 0;
    return atomic_load(&watch.peers[r].lost_cause) != 0;
}

int dps_guard_leader_lost(void)
{
    return dps_guard_rank_lost(atomic_load(&elastic.lowest));
}

/* This rank waits for rank 0's file operation: rank 0 (the lowest survivor, after its loss) is
 * asked where it is once a second, from the first second of the wait on. */
static void look_at_file_wait(void)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    int lead = atomic_load(&elastic.lowest);
    if (atomic_load(&pos->files_wait) != FILES_WAIT_RANK0 || dps_guard_conf.rank == lead) {
        watch.rank0_hits = 0;
        return;
    }
    uint64_t since = atomic_load(&pos->since_ns), now = dps_guard_now_ns();
    if (since != watch.wait_since) watch.wait_since = since, watch.rank0_hits = 0, watch.asked_ns = 0;
    if (now - since < 1000000000u) return;
    /* a lost leader, where the job goes on: the main thread leaves its wait for the agreement */
    if (watch.peers[lead].left && !dps_guard_leader_lost()) file_deadlock(NULL);
    if (now - watch.asked_ns < 1000000000u) return;
    watch.asked_ns = now;
    guard_msg_t ask = {.kind = MSG_WHERE, .rank = dps_guard_conf.rank, .left_rank = -1};
    dps_guard_conf.be->guard_send(&ask, sizeof ask, lead);
}

/* The processes of this host's other ranks, while this rank needs them: inside a collective (one
 * that waits for a rank whose process is gone can never complete), or at the exit barrier (which
 * counts a gone rank as left). A rank that left the program is not looked at. */
static void look_at_processes(void)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    int in_coll = atomic_load_explicit(&pos->in_coll, memory_order_acquire);
    int leaving = atomic_load(&pos->leaving);
    int going_on = atomic_load(&elastic.on);
    if (!in_coll && !leaving && !going_on) return; /* elastic: the survivors hear of a loss at once */
    for (int r = 0; known(r); r++) {
        peer_t *p = &watch.peers[r];
        if (r == dps_guard_conf.rank || p->left || p->gone || !dps_guard_peer_gone(r)) continue;
        if (going_on && !leaving) {
            lost_elastic(r, LOST_GONE);
            continue;
        }
        p->gone = 1, atomic_fetch_add(&watch.ngone, 1);
        if (leaving) {
            char who[DPS_GUARD_HOST + 32];
            DPS_WARN("guard: %s's process ended without leaving the program (killed, crashed, or _exit)",
                     dps_guard_who(r, who, sizeof who));
            p->left = 1, atomic_fetch_add(&watch.nleft, 1);
        } else {
            start_report(WHY_PEER_GONE, r);
            return;
        }
    }
}

/* p's cause of loss, where none is known yet or only another rank's word (or, beats_gone: that
 * its process ended, which the rank that ended it explains). */
static void note_lost_cause(peer_t *p, int cause, int beats_gone)
{
    unsigned char was = atomic_load(&p->lost_cause);
    while ((was == 0 || was == LOST_TOLD || (beats_gone && was == LOST_GONE)) &&
           !atomic_compare_exchange_weak(&p->lost_cause, &was, (unsigned char)cause))
        ;
}

/* Rank r is lost, and the job goes on without it: the agreement holds it lost, the main thread
 * gives up its collective, the exit barrier waits no more for r, and the agreement's messages go
 * out. */
static void lost_elastic(int r, int cause)
{
    peer_t *p = &watch.peers[r];
    /* told by another rank: what this rank saw of r says why, where it saw anything */
    if (cause == LOST_TOLD && dps_guard_peer_gone(r)) cause = LOST_GONE;
    if (cause == LOST_TOLD && watch.reporting && stall_of(p)) cause = stall_of(p);
    note_lost_cause(p, cause, 0);      /* a cause seen here beats another rank's word */
    pthread_mutex_lock(&elastic.lock); /* a no-op where the agreement told this rank */
    dps_surv_lost(elastic.agreement, r);
    pthread_mutex_unlock(&elastic.lock);
    if (!p->gone) {
        p->gone = 1, atomic_fetch_add(&watch.ngone, 1);
        atomic_store(&elastic.pending, 1);
        if (!p->left) p->left = 1, atomic_fetch_add(&watch.nleft, 1);
        elastic.loss_seq = atomic_load(&dps_guard_pos.seq), elastic.loss_ns = dps_guard_now_ns();
        DPS_DEBUG("elastic: rank %d is lost", r);
    }
    send_agreement();
}

static void send_agreement(void)
{
    int dest;
    dps_surv_msg_t m;
    pthread_mutex_lock(&elastic.lock);
    while (dps_surv_next(elastic.agreement, &dest, &m)) {
        pthread_mutex_unlock(&elastic.lock);
        dps_guard_conf.be->guard_send(&m, sizeof m, dest);
        pthread_mutex_lock(&elastic.lock);
    }
    pthread_mutex_unlock(&elastic.lock);
}

int dps_guard_elastic_start(int min_ranks)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    if (!conf->be || !conf->be->guard_send || !atomic_load(&watch.running) || atomic_load(&watch.alone))
        return -1; /* no watchdog, or no side channel: nobody could tell the survivors */
    dps_survivors_t *a = dps_surv_new(conf->size, conf->rank);
    if (!a) return -1;
    elastic.agreement = a, elastic.min_ranks = min_ranks;
    elastic.members = conf->size;
    atomic_store(&elastic.lowest, 0);
    /* the desync and drift checks are collectives of every rank on the side channel, which a
     * lost rank would never join */
    dps_guard_conf.desync = DPS_V_guard_desync_off, dps_guard_conf.drift_every = 0;
    atomic_store(&elastic.on, 1);
    return 0;
}

int dps_guard_ranks_gone(void)
{
    return atomic_load(&watch.ngone);
}

const char *dps_guard_lost_cause(int r)
{
    switch (known(r) && watch.peers ? atomic_load(&watch.peers[r].lost_cause) : 0) {
    case LOST_GONE:
        return "its process ended";
    case LOST_STALLED:
        return "stalled in the program's own code past [guard] timeout; ended";
    case LOST_SILENT:
        return "no answer past [guard] timeout: stopped, or its host or link is down";
    case LOST_TOLD:
        return "found lost by another rank";
    default:
        return "";
    }
}

int dps_guard_lost_pending(void)
{
    return atomic_load_explicit(&elastic.pending, memory_order_relaxed);
}

/* Whether the decided survivors may go on (0), as dps_guard_survivors says; -1 with out->why. */
static int quorum(dps_guard_decision_t *out)
{
    int has_lowest = 0;
    for (int i = 0; i < out->n; i++)
        has_lowest |= out->ranks[i] == atomic_load(&elastic.lowest);
    /* not a quorum: the ranks this one no longer reaches may be one, and go on */
    int minority = 2 * out->n < elastic.members || (2 * out->n == elastic.members && !has_lowest);
    if (minority) atomic_store(&elastic.others_may_go_on, 1);
    if (out->n < elastic.min_ranks) {
        snprintf(out->why, sizeof out->why, "%d rank(s) are left, fewer than [elastic] min_ranks = %d",
                 out->n, elastic.min_ranks);
        return -1;
    }
    if (minority) {
        snprintf(
            out->why, sizeof out->why,
            "the %d rank(s) this rank still reaches are not a quorum of the %d before (more than half, or "
            "half with rank %d): the others may go on, so these end (a cut link?)",
            out->n, elastic.members, atomic_load(&elastic.lowest));
        return -1;
    }
    elastic.members = out->n;
    atomic_store(&elastic.lowest, out->ranks[0]);
    return 0;
}

/* The main thread, which has completed `done` collectives: waits for the survivors' decision. */
int dps_guard_survivors(uint64_t done, dps_guard_decision_t *out)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    pthread_mutex_lock(&elastic.lock);
    dps_surv_ready(elastic.agreement, done);
    pthread_mutex_unlock(&elastic.lock);
    send_agreement();
    uint64_t start = dps_guard_now_ns();
    struct timespec nap = {0, 1000000};
    for (;;) {
        pthread_mutex_lock(&elastic.lock);
        const dps_surv_decision_t *d = dps_surv_current(elastic.agreement);
        int broken = dps_surv_broken(elastic.agreement);
        if (d) {
            out->n = 0, out->cut = d->cut, out->generation = d->lost;
            for (int r = 0; r < conf->size; r++) {
                if (d->is_lost[r / 8] >> (r % 8) & 1) continue;
                if (r == d->root) out->root = out->n;
                out->laggard[out->n] = d->laggard[r / 8] >> (r % 8) & 1;
                out->ranks[out->n++] = r;
            }
            dps_surv_resume(elastic.agreement);
            atomic_store(&elastic.pending, 0);
        }
        pthread_mutex_unlock(&elastic.lock);
        send_agreement();
        /* the wait for a decision is the agreement's to time: the guard's timeout starts anew
         * for the rest of the recovery */
        if (d) {
            atomic_store(&dps_guard_pos.since_ns, dps_guard_now_ns());
            return quorum(out);
        }
        if (broken) {
            snprintf(out->why, sizeof out->why,
                     "their counts of completed collectives are more than one apart");
            return -1;
        }
        /* the coordinator waits [guard] timeout for the others' views; the others wait twice as
         * long for its decision, so that it can first find a silent one */
        int coordinator, missing;
        pthread_mutex_lock(&elastic.lock);
        dps_surv_waiting(elastic.agreement, &coordinator, &missing);
        int silent = coordinator != conf->rank ? coordinator : missing,
            known_lost = silent >= 0 && dps_surv_is_lost(elastic.agreement, silent);
        pthread_mutex_unlock(&elastic.lock);
        double patience = conf->timeout * (coordinator == conf->rank ? 1 : 2);
        int waited_out = conf->timeout > 0 && (double)(dps_guard_now_ns() - start) * 1e-9 > patience;
        if (waited_out && silent >= 0 && !known_lost && !atomic_load(&elastic.silent_in_agreement)) {
            /* silent past the guard's timeout, as a report would find it: lost, and the
             * agreement goes on without it (a cut link: only a quorum goes on) */
            atomic_store(&elastic.silent_in_agreement, silent + 1);
            start = dps_guard_now_ns();
            continue;
        }
        if (waited_out) {
            if (coordinator != conf->rank)
                snprintf(
                    out->why, sizeof out->why,
                    "no decision came within %.0f s (twice [guard] timeout) from the coordinator, rank %d",
                    patience, coordinator);
            else
                snprintf(
                    out->why, sizeof out->why,
                    "no decision within [guard] timeout = %.0f s: this rank coordinates, and rank %d's view "
                    "(ready, and the same as its own) has not come",
                    conf->timeout, missing);
            atomic_store(&elastic.others_may_go_on, 1);
            return -1;
        }
        nanosleep(&nap, NULL);
    }
}

/* One look: messages, a collective that cannot complete, a collective that waits too long. */
static void tick(void)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    receive();
    int silent = atomic_exchange(&elastic.silent_in_agreement, 0);
    if (silent && !watch.peers[silent - 1].gone) end_lost_rank(silent - 1, LOST_SILENT);
    if (!watch.reporting) look_at_file_wait();
    if (!watch.reporting && atomic_load(&failed)) start_report(WHY_FAILED, -1);
    if (!watch.reporting) look_at_processes();
    if (!watch.reporting && atomic_load_explicit(&pos->in_coll, memory_order_acquire)) {
        uint64_t seq = atomic_load(&pos->seq) + (uint64_t)atomic_load(&pos->before_next);
        for (int r = 0; known(r); r++)
            if (watch.peers[r].left && !watch.peers[r].gone && watch.peers[r].left_seq < seq) {
                start_report(WHY_PEER_LEFT, r);
                break;
            }
        double waited = (double)(dps_guard_now_ns() - atomic_load(&pos->since_ns)) * 1e-9;
        if (!watch.reporting && dps_guard_conf.timeout > 0 && waited > dps_guard_conf.timeout &&
            !atomic_load(&elastic.pending)) /* a loss is what it waits for: the main thread gives up */
            start_report(WHY_TIMEOUT, -1);
    }
    if (watch.reporting) {
        int all = 1;
        for (int r = 0; all && known(r); r++)
            all = watch.peers[r].have || watch.peers[r].gone;
        if ((all || dps_guard_now_ns() > watch.deadline) && !settle_by_loss()) finish_report();
    }
}

static _Atomic(dps_guard_probe_fn) probe;

void dps_guard_set_probe(dps_guard_probe_fn fn)
{
    atomic_store(&probe, fn);
}

/* Queued work that nobody waits for (see dps_guard_set_probe): this rank alone can tell, so it
 * reports and ends the job; the others then see a peer that left. */
static void look_at_queued_work(void)
{
    dps_guard_probe_fn fn = atomic_load(&probe);
    char what[DPS_GUARD_HOOK_NAME + 512];
    double age = 0;
    int r = fn ? fn(what, sizeof what, &age) : 0;
    if (r == 0 || (r > 0 && (dps_guard_conf.timeout <= 0 || age <= dps_guard_conf.timeout))) return;
    char why[sizeof what + 256];
    if (r > 0)
        snprintf(why, sizeof why,
                 "GPU %s queued %.0f s ago has not finished ([guard] timeout = %.0f s): a peer "
                 "never joined it, or the GPU is stuck",
                 what, age, dps_guard_conf.timeout);
    else
        snprintf(why, sizeof why, "GPU %s failed", what);
    dps_guard_diag_fail(why);
    DPS_ERROR("guard: rank %d: %s", dps_guard_conf.rank, why);
    DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
    dps_guard_end_job(1);
}

/* The backend's start-up waits for every rank (MPI_Init), and no side channel exists yet: a rank
 * that never reaches its first collective (stuck before it, or gone without one) keeps the others
 * here. Each waiting rank says so and ends the job. */
static _Noreturn void stuck_in_start_up(const guard_msg_t *m)
{
    char why[DPS_GUARD_HOOK_NAME + 512];
    snprintf(why, sizeof why,
             "guard: the backend's start-up (opened by %s) has waited %.1f s on rank %d, more than [guard] "
             "timeout "
             "= %.0f s",
             watch.opened_by, m->seconds, m->rank, dps_guard_conf.timeout);
    dps_guard_diag_fail(why);
    DPS_ERROR(
        "%s: some rank has not reached its first collective (it is stuck before it, or it left the program "
        "without one through _exit or a signal the launcher did not report); this rank (%s) waits for it",
        why, dps_guard_host(m->rank));
    DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
    dps_guard_end_job(1);
}

/* One look without a side channel: only this rank's own position, and no way to ask the others
 * where they are, so a rank stuck too long reports itself and ends the job. */
static void tick_alone(void)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    if (!atomic_load_explicit(&pos->in_coll, memory_order_acquire)) return;
    guard_msg_t m = snapshot(WHY_TIMEOUT);
    if (!m.in_coll || m.seconds <= dps_guard_conf.timeout) return;
    if (atomic_load(&watch.opening)) stuck_in_start_up(&m);
    char why[DPS_GUARD_HOOK_NAME + 512], d[DPS_GUARD_HOOK_NAME + 256], who[DPS_GUARD_HOST + 32];
    reason(&m, why, sizeof why);
    dps_guard_diag_fail(why);
    headline(&m);
    describe(&m, d, sizeof d);
    DPS_ERROR("guard:   %s: %s", dps_guard_who(m.rank, who, sizeof who), d);
    DPS_ERROR(
        "guard: where the other ranks are is unknown: MPI runs without MPI_THREAD_MULTIPLE (as the program "
        "initialized it, or as this MPI provides it), so this rank cannot ask them; MPI_Init_thread with "
        "MPI_THREAD_MULTIPLE gives "
        "the table of every rank");
    DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
    dps_guard_end_job(1);
}

static void *watchdog(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the program's, not ours */
    struct timespec tick_len = {0, 200 * 1000000};
    while (!atomic_load(&watch.stop)) {
        int on_its_way_out = atomic_load(&ending);
        if (!on_its_way_out && atomic_load(&watch.alone)) tick_alone();
        if (!on_its_way_out && !atomic_load(&watch.alone)) tick();
        if (!on_its_way_out) look_at_queued_work();
        nanosleep(&tick_len, NULL);
    }
    return NULL;
}

/* Said once, on rank 0: what a program that initialized MPI itself below MPI_THREAD_MULTIPLE
 * loses, and how to get it back. */
static void warn_no_side_channel(const dps_backend_t *be)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    int asked = conf->on || conf->desync != DPS_V_guard_desync_off || conf->drift_every;
    if (conf->rank != 0 || !asked) return;
    char watchdog_does[192];
    if (conf->timeout > 0)
        snprintf(
            watchdog_does, sizeof watchdog_does,
            "a collective waiting longer than [guard] timeout = %.0f s still ends the job, but each rank can "
            "report only its own position",
            conf->timeout);
    else
        snprintf(watchdog_does, sizeof watchdog_does, "no watchdog either ([guard] timeout = 0)");
    DPS_WARN("guard: the %s backend has no side channel (MPI was initialized without MPI_THREAD_MULTIPLE, by "
             "the program): %s; the exit barrier and the desync and drift checks are off. Calling "
             "MPI_Init_thread with MPI_THREAD_MULTIPLE (instead of MPI_Init) restores the full guard",
             be->name, watchdog_does);
}

static void start_thread(void)
{
    atomic_store(&watch.stop, 0);
    if (pthread_create(&watch.thread, NULL, watchdog, NULL) != 0) {
        DPS_WARN("guard: cannot start the watchdog thread: hangs are not diagnosed");
        return;
    }
    atomic_store(&watch.running, 1);
}

dps_guard_mark_t dps_guard_opening(const char *hook)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    dps_guard_mark_t mark = dps_guard_own_begin("backend start-up");
    dps_guard_note_host(); /* before the watchdog thread, which may report it */
    watch.opened_by = hook;
    atomic_store(&watch.opening, 1);
    atomic_store(&watch.alone, 1);
    if (conf->on && conf->timeout > 0 && !atomic_load(&watch.running)) start_thread();
    return mark;
}

void dps_guard_start(const dps_backend_t *be)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    dps_guard_conf.be = be; /* the checks use the side channel whether a watchdog runs or not */
    int alone = !be->guard_send;
    if (alone) warn_no_side_channel(be);
    if (!alone && conf->on && !watch.peers &&
        !(watch.peers = calloc((size_t)conf->size, sizeof *watch.peers))) {
        DPS_WARN("guard: no memory for the watchdog's table of %d ranks: each rank reports only itself",
                 conf->size);
        alone = 1;
    }
    /* a watchdog that covered the start-up goes on with the side channel */
    atomic_store(&watch.alone, alone);
    atomic_store(&watch.opening, 0);
    if (atomic_load(&watch.running) || !conf->on || (alone && conf->timeout <= 0)) return;
    start_thread();
}

_Noreturn void dps_guard_failed(const char *what)
{
    if (atomic_load(&watch.running) && !watch.alone) {
        snprintf(failure, sizeof failure, "%s", what);
        atomic_store(&failed, 1);
        struct timespec nap = {0, 100 * 1000000};
        for (int i = 0; i < 300; i++) /* the watchdog ends the job meanwhile, after its report */
            nanosleep(&nap, NULL);
    }
    dps_fatal("%s", what);
}

/* Rank 0's record of every rank's figures at exit (size entries; wall_ns 0: not heard from). */
static dps_diag_tally_t *exit_tallies;

const dps_diag_tally_t *dps_guard_exit_tallies(void)
{
    return exit_tallies;
}

void dps_guard_exit(void)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    atomic_store(&dps_guard_pos.leaving, 1);
    if (!atomic_load(&watch.running)) return;
    if (conf->exit_barrier && !atomic_load(&watch.alone)) {
        /* announce, then wait (bounded) until every rank has left too: our last collective is
         * then complete everywhere, and a rank that is still stuck gets diagnosed meanwhile */
        guard_msg_t m = snapshot(WHY_ANSWER);
        m.kind = MSG_LEAVING;
        dps_diag_tally(&m.tally);
        int collector = 0; /* the lowest rank still in the job (rank 0, unless it was lost) */
        while (collector < conf->rank && watch.peers[collector].gone)
            collector++;
        if (conf->rank == collector && conf->size > 0 && !exit_tallies &&
            (exit_tallies = calloc((size_t)conf->size, sizeof *exit_tallies)))
            exit_tallies[collector] = m.tally;
        send_all(&m);
        uint64_t deadline =
            conf->timeout > 0 ? dps_guard_now_ns() + (uint64_t)(conf->timeout * 1e9) : UINT64_MAX;
        struct timespec nap = {0, 2 * 1000000};
        while (atomic_load(&watch.nleft) < conf->size - 1 && dps_guard_now_ns() < deadline)
            nanosleep(&nap, NULL);
        /* Others still busy (rank 0 saving or evaluating alone, say) is no error: leave anyway.
         * A rank that later needs us in a collective learns that we left and ends the job. */
        int nleft = atomic_load(&watch.nleft);
        if (nleft < conf->size - 1)
            DPS_WARN(
                "guard: rank %d finished; %d rank(s) still running after [guard] timeout = %.0f s, leaving "
                "without them",
                conf->rank, conf->size - 1 - nleft, conf->timeout);
    }
    atomic_store(&watch.stop, 1);
    pthread_join(watch.thread, NULL);
    atomic_store(&watch.running, 0);
    for (int r = 0; exit_tallies && r < conf->size; r++)
        if (r != conf->rank && watch.peers[r].left && !watch.peers[r].gone)
            exit_tallies[r] = watch.peers[r].tally;
    free(watch.peers), watch.peers = NULL;
}
