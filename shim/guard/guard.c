/* The guard (see guard.h). The main thread only stores its position (a few relaxed atomic
 * stores per collective); everything else happens in the watchdog thread, which polls the side
 * channel every 200 ms, so a healthy job pays next to nothing (measured: ./dev.sh bench). */
#define _GNU_SOURCE
#include "guard.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "diag/diag.h"
#include "core/dtype.h"
#include "dpshim/hooks.h"

/* Where the main thread is; written by it, read by the watchdog and the crash handler. */
static struct {
    atomic_uint_fast64_t seq;      /* collectives entered so far (the current one's number) */
    atomic_int in_coll;            /* inside collective #seq */
    atomic_uint_fast64_t since_ns; /* when it entered, or when it last left one */
    atomic_uint_fast64_t step;
    _Atomic(const char *) hook; /* the current or last collective's hook */
    atomic_int coll, dtype;
    atomic_uint_fast64_t count;
    atomic_int leaving; /* the program is exiting */
} pos;

/* The zeroed state before configuration must check nothing. */
_Static_assert(DPS_V_guard_desync_off == 0, "[guard] desync must list off first");

static struct {
    int on, exit_barrier;
    dps_guard_desync_t desync;
    uint64_t drift_every;
    uint64_t fp; /* rolling fingerprint of this rank's collectives since the last step check */
    dp_tensor *params;
    size_t nparams;
    double timeout;
    int rank, size;
    const dps_backend_t *be;
    pthread_t thread;
    atomic_int running, stop;
} g;

/* The coarse clock: a few ms of resolution is plenty for timeouts of seconds, and reading it
 * costs next to nothing on the collective path. */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void dps_guard_configure(const dps_state_t *s)
{
    g.rank = s->rank, g.size = s->size;
    g.timeout = (double)dps_policy_num(&s->policy, DPS_P_guard_timeout);
    g.exit_barrier = DPS_POLICY_ENUM(&s->policy, guard, exit_barrier) == DPS_V_guard_exit_barrier_on;
    g.desync = DPS_POLICY_ENUM(&s->policy, guard, desync);
    g.drift_every = dps_policy_num(&s->policy, DPS_P_guard_drift_every);
    /* with neither a watchdog nor an exit barrier there is nothing for the thread to do */
    g.on = s->eff_size > 1 && (g.timeout > 0 || g.exit_barrier);
    atomic_store(&pos.since_ns, now_ns());
    atomic_store(&pos.hook, "start");
}

static void check_call(const char *hook, int collective, int32_t dtype, uint64_t count);

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* What a collective is, as a number every rank computes alike. */
static uint64_t describe_call(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = hook; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    return mix(mix(mix(h, (uint64_t)collective), (uint64_t)dtype), count);
}

void dps_guard_note(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    if (g.desync == DPS_V_guard_desync_full) check_call(hook, collective, dtype, count);
    g.fp = mix(g.fp, describe_call(hook, collective, dtype, count));
}

void dps_guard_enter(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    dps_guard_note(hook, collective, dtype, count);
    atomic_store_explicit(&pos.hook, hook, memory_order_relaxed);
    atomic_store_explicit(&pos.coll, collective, memory_order_relaxed);
    atomic_store_explicit(&pos.dtype, dtype, memory_order_relaxed);
    atomic_store_explicit(&pos.count, count, memory_order_relaxed);
    atomic_store_explicit(&pos.since_ns, now_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&pos.seq, 1, memory_order_relaxed);
    atomic_store_explicit(&pos.in_coll, 1, memory_order_release);
}

void dps_guard_leave(void)
{
    atomic_store_explicit(&pos.in_coll, 0, memory_order_relaxed);
    atomic_store_explicit(&pos.since_ns, now_ns(), memory_order_release);
}

static void check_step(uint64_t step);
static void check_drift(uint64_t step);

void dps_guard_step(uint64_t step)
{
    atomic_store_explicit(&pos.step, step, memory_order_relaxed);
    if (g.desync == DPS_V_guard_desync_step) check_step(step);
    if (g.drift_every && step % g.drift_every == 0) check_drift(step);
}

void dps_guard_params(const dp_tensor *t, size_t n)
{
    dp_tensor *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!copy) return;
    memcpy(copy, t, n * sizeof *t);
    free(g.params);
    g.params = copy, g.nparams = n;
}

uint64_t dps_guard_seq(void) { return atomic_load_explicit(&pos.seq, memory_order_relaxed); }

void dps_guard_where(char *buf, size_t len)
{
    snprintf(buf, len, "collective #%llu after step %llu", (unsigned long long)atomic_load(&pos.seq),
             (unsigned long long)atomic_load(&pos.step));
}

/* --- messages between the ranks' guards --- */

enum { MSG_STATUS = 1, MSG_LEAVING = 2 };
enum { WHY_TIMEOUT = 1, WHY_PEER_LEFT = 2, WHY_ANSWER = 3 };

typedef struct guard_msg {
    int32_t kind, why, rank, in_coll, leaving, coll, dtype, left_rank;
    uint64_t seq, step, count, left_step, left_seq;
    double seconds; /* waiting in the collective, or since the last one */
    char hook[32];
} guard_msg_t;

static guard_msg_t snapshot(int why)
{
    guard_msg_t m = {.kind = MSG_STATUS, .why = why, .rank = g.rank, .left_rank = -1};
    m.in_coll = atomic_load(&pos.in_coll);
    m.leaving = atomic_load(&pos.leaving);
    m.seq = atomic_load(&pos.seq);
    m.step = atomic_load(&pos.step);
    m.coll = atomic_load(&pos.coll);
    m.dtype = atomic_load(&pos.dtype);
    m.count = atomic_load(&pos.count);
    m.seconds = (double)(now_ns() - atomic_load(&pos.since_ns)) * 1e-9;
    snprintf(m.hook, sizeof m.hook, "%s", atomic_load(&pos.hook));
    return m;
}

static void send_all(const guard_msg_t *m)
{
    for (int r = 0; r < g.size; r++)
        if (r != g.rank) g.be->guard_send(m, sizeof *m, r);
}

/* What the watchdog knows of the others. */
static struct {
    guard_msg_t status[4096];
    int have[4096];
    int left[4096];
    uint64_t left_seq[4096], left_step[4096];
    atomic_int nleft;
    int reporting;
    uint64_t deadline;
    guard_msg_t first; /* what started the report */
} w;

static int known(int r) { return r >= 0 && r < g.size && r < 4096; }

static void describe(const guard_msg_t *m, char *buf, size_t len)
{
    if (m->leaving)
        snprintf(buf, len, "left the program (exit) after step %llu and collective #%llu",
                 (unsigned long long)m->step, (unsigned long long)m->seq);
    else if (m->in_coll && m->coll < 0)
        snprintf(buf, len, "in the guard's %s after collective #%llu and step %llu, waiting %.1f s", m->hook,
                 (unsigned long long)m->seq, (unsigned long long)m->step, m->seconds);
    else if (m->in_coll)
        snprintf(buf, len, "in %s (%s %s x %llu), collective #%llu after step %llu, waiting %.1f s", m->hook,
                 dps_coll_name(m->coll), dps_dtype_name(m->dtype),
                 (unsigned long long)m->count, (unsigned long long)m->seq, (unsigned long long)m->step,
                 m->seconds);
    else
        snprintf(buf, len, "in the program's own code for %.1f s, since %s collective #%llu after step %llu",
                 m->seconds, m->hook, (unsigned long long)m->seq, (unsigned long long)m->step);
}

/* The most common (in_coll, seq) among the answers: the place the job is stuck in. */
static void majority(int *in_coll, uint64_t *seq)
{
    int best = -1;
    for (int r = 0; known(r); r++) {
        if (!w.have[r]) continue;
        int votes = 0;
        for (int q = 0; known(q); q++)
            votes += w.have[q] && w.status[q].in_coll == w.status[r].in_coll && w.status[q].seq == w.status[r].seq;
        if (votes > best) best = votes, *in_coll = w.status[r].in_coll, *seq = w.status[r].seq;
    }
}

/* Ends this rank after a report. The launcher ends the job at the first non-zero exit, so a
 * rank that did not print the report gives the one that did time to finish first. */
static _Noreturn void end_job(int printed)
{
    if (!printed) {
        struct timespec pause_ = {2, 0};
        nanosleep(&pause_, NULL);
    }
    fflush(NULL);
    _exit(DPS_EXIT_GUARD);
}

/* The diagnostics files, with the collective this rank is stuck in (if it is). */
static void diag_fail(const char *why)
{
    int in = atomic_load(&pos.in_coll) && atomic_load(&pos.coll) >= 0;
    dps_diag_fail(why, atomic_load(&pos.hook), in ? atomic_load(&pos.seq) : 0,
                  now_ns() - atomic_load(&pos.since_ns), atomic_load(&pos.step));
}

static _Noreturn void finish_report(void)
{
    for (int r = 0; !w.first.kind && known(r); r++) /* the report that started it all */
        if (w.have[r] && w.status[r].why != WHY_ANSWER) w.first = w.status[r];
    char why[256];
    if (w.first.why == WHY_PEER_LEFT)
        snprintf(why, sizeof why, "guard: rank %d left the program after step %llu; the job was ended", w.first.left_rank,
                 (unsigned long long)w.first.left_step);
    else
        snprintf(why, sizeof why, "guard: %s collective #%llu after step %llu waited longer than the timeout on rank %d",
                 w.first.hook, (unsigned long long)w.first.seq, (unsigned long long)w.first.step, w.first.rank);
    diag_fail(why);
    int printer = g.rank;
    for (int r = 0; known(r); r++)
        if (w.have[r] && w.status[r].why != WHY_ANSWER) {
            printer = r;
            break;
        }
    if (printer == g.rank) {
        const guard_msg_t *f = &w.first;
        if (f->why == WHY_PEER_LEFT)
            DPS_ERROR("guard: rank %d left the program after step %llu (its last collective #%llu), while rank %d "
                      "waits in %s collective #%llu (after step %llu): that collective can never complete",
                      f->left_rank, (unsigned long long)f->left_step, (unsigned long long)f->left_seq, f->rank,
                      f->hook, (unsigned long long)f->seq, (unsigned long long)f->step);
        else
            DPS_ERROR("guard: %s collective #%llu (after step %llu) has waited %.1f s on rank %d, more than [guard] "
                      "timeout = %.0f s: the job is stuck", f->hook, (unsigned long long)f->seq,
                      (unsigned long long)f->step, f->seconds, f->rank, g.timeout);
        int maj_in = 0;
        uint64_t maj_seq = 0;
        majority(&maj_in, &maj_seq);
        DPS_ERROR("guard: where every rank is:");
        for (int r = 0; known(r); r++) {
            char d[256];
            if (!w.have[r]) {
                snprintf(d, sizeof d, "no answer (crashed, killed, or left with _exit)  <-- culprit");
            } else {
                describe(&w.status[r], d, sizeof d);
                if (w.status[r].in_coll != maj_in || w.status[r].seq != maj_seq)
                    strncat(d, "  <-- culprit", sizeof d - strlen(d) - 1);
            }
            DPS_ERROR("guard:   rank %d: %s", r, d);
        }
        DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
    } else {
        DPS_ERROR("guard: ending the job (exit status %d); rank %d prints where every rank is", DPS_EXIT_GUARD, printer);
    }
    end_job(printer == g.rank);
}

static void start_report(int why, int left_rank)
{
    if (w.reporting) return;
    w.reporting = 1;
    guard_msg_t m = snapshot(why);
    if (left_rank >= 0) {
        m.left_rank = left_rank;
        m.left_step = w.left_step[left_rank];
        m.left_seq = w.left_seq[left_rank];
    }
    if (why != WHY_ANSWER && !w.first.kind) w.first = m; /* answers do not say what went wrong */
    w.status[g.rank] = m, w.have[g.rank] = 1;
    send_all(&m);
    w.deadline = now_ns() + 3000000000u; /* time for every reachable rank to answer */
}

static void receive(void)
{
    guard_msg_t m;
    int src;
    while (g.be->guard_poll(&m, sizeof m, &src) == 1 && known(src)) {
        if (m.kind == MSG_LEAVING) {
            if (!w.left[src]) w.left[src] = 1, w.nleft++;
            w.left_seq[src] = m.seq, w.left_step[src] = m.step;
        } else if (m.kind == MSG_STATUS) {
            w.status[src] = m, w.have[src] = 1;
            if (m.why != WHY_ANSWER && !w.first.kind) w.first = m;
            start_report(WHY_ANSWER, -1);
        }
    }
}

/* One look: messages, a collective that cannot complete, a collective that waits too long. */
static void tick(void)
{
    receive();
    if (!w.reporting && atomic_load_explicit(&pos.in_coll, memory_order_acquire)) {
        uint64_t seq = atomic_load(&pos.seq);
        for (int r = 0; known(r); r++)
            if (w.left[r] && w.left_seq[r] < seq) {
                start_report(WHY_PEER_LEFT, r);
                break;
            }
        double waited = (double)(now_ns() - atomic_load(&pos.since_ns)) * 1e-9;
        if (!w.reporting && g.timeout > 0 && waited > g.timeout) start_report(WHY_TIMEOUT, -1);
    }
    if (w.reporting) {
        int all = 1;
        for (int r = 0; known(r); r++) all &= w.have[r];
        if (all || now_ns() > w.deadline) finish_report();
    }
}

static void *watchdog(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the program's, not ours */
    struct timespec tick_len = {0, 200 * 1000000};
    while (!atomic_load(&g.stop)) {
        tick();
        nanosleep(&tick_len, NULL);
    }
    return NULL;
}

void dps_guard_start(const dps_backend_t *be)
{
    if (!g.on || !be->guard_send || atomic_load(&g.running) || g.size > 4096) {
        if (g.on && !be->guard_send)
            DPS_INFO("guard: no side channel (MPI without MPI_THREAD_MULTIPLE): hangs are not diagnosed");
        return;
    }
    g.be = be;
    if (pthread_create(&g.thread, NULL, watchdog, NULL) == 0) atomic_store(&g.running, 1);
}

void dps_guard_exit(void)
{
    if (!atomic_load(&g.running)) return;
    atomic_store(&pos.leaving, 1);
    if (g.exit_barrier) {
        /* announce, then wait (bounded) until every rank has left too: our last collective is
         * then complete everywhere, and a rank that is still stuck gets diagnosed meanwhile */
        guard_msg_t m = snapshot(WHY_ANSWER);
        m.kind = MSG_LEAVING;
        send_all(&m);
        uint64_t deadline = g.timeout > 0 ? now_ns() + (uint64_t)(g.timeout * 1e9) : UINT64_MAX;
        struct timespec nap = {0, 2 * 1000000};
        while (w.nleft < g.size - 1 && now_ns() < deadline) nanosleep(&nap, NULL);
        /* Others still busy (rank 0 saving or evaluating alone, say) is no error: leave anyway.
         * A rank that later needs us in a collective learns that we left and ends the job. */
        if (w.nleft < g.size - 1)
            DPS_WARN("guard: rank %d finished; %d rank(s) still running after [guard] timeout = %.0f s, leaving "
                     "without them", g.rank, g.size - 1 - w.nleft, g.timeout);
    }
    atomic_store(&g.stop, 1);
    pthread_join(g.thread, NULL);
    atomic_store(&g.running, 0);
}

/* --- consistency checks: collectives of the main thread on the side channel --- */

static int checks_possible(void) { return g.be && g.be->guard_min_u64 && !atomic_load(&pos.leaving); }

/* Marks the main thread as inside a check, so the watchdog covers it, without counting it as
 * one of the program's collectives. */
typedef struct check_mark {
    const char *hook;
    int coll;
} check_mark_t;

static check_mark_t check_begin(const char *what)
{
    check_mark_t prev = {atomic_load(&pos.hook), atomic_load(&pos.coll)};
    atomic_store(&pos.hook, what);
    atomic_store(&pos.coll, -1); /* not one of the program's collectives */
    atomic_store(&pos.since_ns, now_ns());
    atomic_store(&pos.in_coll, 1);
    return prev;
}

/* Back to where the program was: its last collective stays the one reports name. */
static void check_end(check_mark_t prev)
{
    atomic_store(&pos.hook, prev.hook);
    atomic_store(&pos.coll, prev.coll);
    dps_guard_leave();
}

/* 1 when x is the same on every rank. */
static int same_everywhere(uint64_t x)
{
    uint64_t v[2] = {x, ~x};
    if (g.be->guard_min_u64(v, 2) != 0) return 1; /* a failed check must not end a healthy job */
    return v[0] == ~v[1];
}

typedef struct call_info {
    uint64_t key, seq, step, count;
    int32_t coll, dtype;
    char hook[32];
} call_info_t;

static _Noreturn void report_mismatch(const char *headline, const call_info_t *mine)
{
    char why[256];
    snprintf(why, sizeof why, "guard: %s", headline);
    diag_fail(why);
    call_info_t *all = calloc((size_t)g.size, sizeof *all);
    if (all && g.be->guard_allgather(mine, all, sizeof *mine) == 0 && g.rank == 0) {
        DPS_ERROR("guard: %s; each rank's call:", headline);
        for (int r = 0; r < g.size; r++) {
            int votes = 0;
            for (int q = 0; q < g.size; q++) votes += all[q].key == all[r].key;
            DPS_ERROR("guard:   rank %d: %s (%s %s x %llu), collective #%llu after step %llu%s", r, all[r].hook,
                      dps_coll_name(all[r].coll), dps_dtype_name(all[r].dtype),
                      (unsigned long long)all[r].count, (unsigned long long)all[r].seq,
                      (unsigned long long)all[r].step, 2 * votes <= g.size ? "  <-- culprit" : "");
        }
        DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
        end_job(1);
    }
    DPS_ERROR("guard: %s; ending the job (exit status %d), rank 0 prints every rank's call", headline, DPS_EXIT_GUARD);
    end_job(0);
}

static call_info_t last_call(uint64_t key)
{
    call_info_t c = {.key = key, .seq = atomic_load(&pos.seq), .step = atomic_load(&pos.step),
                     .count = atomic_load(&pos.count), .coll = atomic_load(&pos.coll), .dtype = atomic_load(&pos.dtype)};
    snprintf(c.hook, sizeof c.hook, "%s", atomic_load(&pos.hook));
    return c;
}

/* [guard] desync = full: every rank is about to make the same call, or the job ends naming the
 * first call that differs. */
static void check_call(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    if (!checks_possible()) return;
    uint64_t key = mix(describe_call(hook, collective, dtype, count), atomic_load(&pos.seq) + 1);
    check_mark_t mark = check_begin("desync check");
    int same = same_everywhere(key);
    check_end(mark);
    if (same) return;
    call_info_t c = {.key = key, .seq = atomic_load(&pos.seq) + 1, .step = atomic_load(&pos.step),
                     .count = count, .coll = collective, .dtype = dtype};
    snprintf(c.hook, sizeof c.hook, "%s", hook);
    report_mismatch("desync: the ranks are about to make different collective calls", &c);
}

/* [guard] desync = step: the same sequence of collectives in the step on every rank. */
static void check_step(uint64_t step)
{
    if (!checks_possible()) return;
    uint64_t key = mix(g.fp, atomic_load(&pos.seq));
    call_info_t mine = last_call(key); /* before the check marks the position */
    check_mark_t mark = check_begin("desync check (step end)");
    int same = same_everywhere(key);
    check_end(mark);
    if (!same) {
        char head[160];
        snprintf(head, sizeof head, "desync in step %llu: the ranks made different collective calls (last calls shown)",
                 (unsigned long long)step);
        report_mismatch(head, &mine);
    }
    g.fp = 0;
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0x84222325cbf29ce4ull ^ n, v;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) memcpy(&v, b + i, 8), h = mix(h, v);
    for (; i < n; i++) h = mix(h, b[i]);
    return h;
}

/* [guard] drift_every: the parameters dp_params last saw are bitwise the same on every rank. */
static void check_drift(uint64_t step)
{
    if (!checks_possible() || !g.nparams) return;
    size_t n = g.nparams;
    uint64_t *v = malloc(2 * n * sizeof *v), *mine = malloc(n * sizeof *mine);
    if (!v || !mine) return free(v), free(mine);
    for (size_t i = 0; i < n; i++) {
        mine[i] = hash_bytes(g.params[i].data, g.params[i].count * dps_dtype_size(g.params[i].dtype));
        v[i] = mine[i], v[n + i] = ~mine[i];
    }
    check_mark_t mark = check_begin("drift check");
    int ok = g.be->guard_min_u64(v, 2 * n) != 0;
    size_t bad = n;
    for (size_t i = 0; !ok && i < n; i++)
        if (v[i] != ~v[n + i]) {
            bad = i;
            break;
        }
    if (bad == n) {
        check_end(mark);
        free(v), free(mine);
        return;
    }
    uint64_t *all = calloc((size_t)g.size, sizeof *all);
    int gathered = all && g.be->guard_allgather(&mine[bad], all, sizeof *all) == 0;
    const char *name = g.params[bad].name ? g.params[bad].name : "unnamed";
    char why[256];
    snprintf(why, sizeof why, "guard: drift after step %llu in parameter tensor '%s'", (unsigned long long)step, name);
    diag_fail(why);
    if (g.rank == 0) {
        DPS_ERROR("guard: drift after step %llu: parameter tensor %zu '%s' is not the same on every rank",
                  (unsigned long long)step, bad, name);
        for (int r = 0; gathered && r < g.size; r++) {
            int votes = 0;
            for (int q = 0; q < g.size; q++) votes += all[q] == all[r];
            DPS_ERROR("guard:   rank %d: checksum %016llx%s", r, (unsigned long long)all[r],
                      2 * votes <= g.size ? "  <-- differs" : "");
        }
        DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
        end_job(1);
    }
    DPS_ERROR("guard: drift after step %llu in tensor '%s'; ending the job (exit status %d), rank 0 prints every "
              "rank's checksum", (unsigned long long)step, name, DPS_EXIT_GUARD);
    end_job(0);
}

/* --- crashes: say where, then die as the signal wants --- */

static struct sigaction old_actions[32];
static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

static void on_crash(int sig)
{
    char buf[512];
    const char *hook = atomic_load(&pos.hook);
    int n = snprintf(buf, sizeof buf,
                     "[dpshim r%d/%d] ERROR guard: rank %d crashed with signal %d (%s) after step %llu, %s %s "
                     "collective #%llu; the launcher ends the job\n",
                     g.rank, g.size, g.rank, sig, strsignal(sig), (unsigned long long)atomic_load(&pos.step),
                     atomic_load(&pos.in_coll) ? "inside" : "after", hook ? hook : "",
                     (unsigned long long)atomic_load(&pos.seq));
    if (n > 0) {
        ssize_t w_ = write(STDERR_FILENO, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf);
        (void)w_;
    }
    sigaction(sig, &old_actions[sig], NULL); /* the program's own handler, or the default */
    raise(sig);
}

void dps_guard_install_crash_handlers(void)
{
    for (size_t i = 0; i < sizeof crash_signals / sizeof *crash_signals; i++) {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_crash;
        sa.sa_flags = SA_RESETHAND | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        /* leave signals the program (or its runtime) already handles alone */
        if (sigaction(crash_signals[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL)
            sigaction(crash_signals[i], &sa, &old_actions[crash_signals[i]]);
    }
}
