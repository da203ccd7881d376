/* The guard's consistency checks: desync (the ranks make the same collective calls, compared at
 * each step end or before every call) and drift (the parameters stay bitwise the same). They are
 * collectives of the main thread on the backend's side channel, so the watchdog covers them. */
#define _GNU_SOURCE
#include "guard_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

/* Main thread only: the rolling fingerprint of this rank's collectives since the last step
 * check, and the parameters dp_params last saw (what the drift check compares). */
static uint64_t calls_fingerprint;
static dp_tensor *drift_params;
static size_t drift_nparams;

void dps_guard_params(const dp_tensor *t, size_t n)
{
    dp_tensor *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!copy) return;
    memcpy(copy, t, n * sizeof *t);
    free(drift_params);
    drift_params = copy, drift_nparams = n;
}

/* What a collective is, as a number every rank computes alike. */
static uint64_t describe_call(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = hook; *c; c++)
        h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    return dps_guard_mix(dps_guard_mix(dps_guard_mix(h, (uint64_t)collective), (uint64_t)dtype), count);
}

/* Without a side channel (MPI below MPI_THREAD_MULTIPLE) there is nothing to compare on; after
 * the exit barrier began, the other ranks may be gone; a child of the rank process (a forked
 * DataLoader worker calling the hooks) is no member of the job. */
static int checks_possible(void)
{
    const dps_backend_t *be = dps_guard_conf.be;
    return be && be->guard_min_u64 && !atomic_load(&dps_guard_pos.leaving) && dps_g.role == DPS_ROLE_RANK &&
           !atomic_load_explicit(&dps_g.forked, memory_order_relaxed);
}

/* Marks the main thread as inside a check, so the watchdog covers it, without counting it as
 * one of the program's collectives. */
typedef struct check_mark {
    const char *hook;
    int coll;
} check_mark_t;

static check_mark_t check_begin(const char *what)
{
    dps_guard_pos_t *pos = &dps_guard_pos;
    check_mark_t prev = {atomic_load(&pos->hook), atomic_load(&pos->coll)};
    atomic_store(&pos->hook, what);
    atomic_store(&pos->coll, -1); /* not one of the program's collectives */
    atomic_store(&pos->since_ns, dps_guard_now_ns());
    atomic_store(&pos->in_coll, 1);
    return prev;
}

/* Back to where the program was: its last collective stays the one reports name. */
static void check_end(check_mark_t prev)
{
    atomic_store(&dps_guard_pos.hook, prev.hook);
    atomic_store(&dps_guard_pos.coll, prev.coll);
    dps_guard_leave();
}

/* 1 when x is the same on every rank. */
static int same_everywhere(uint64_t x)
{
    uint64_t v[2] = {x, ~x};
    if (dps_guard_conf.be->guard_min_u64(v, 2) != 0) return 1; /* a failed check must not end a healthy job */
    return v[0] == ~v[1];
}

typedef struct call_info {
    uint64_t key, seq, step, count;
    int32_t coll, dtype;
    char hook[DPS_GUARD_HOOK_NAME];
} call_info_t;

/* For each of the n values gathered from the ranks, how many ranks have it; NULL when memory is
 * short (the report then marks no rank). */
static int *tally(const uint64_t *values, int n)
{
    int *votes = malloc((size_t)(n > 0 ? n : 1) * sizeof *votes);
    if (votes && dps_guard_votes(values, n, votes) != 0) free(votes), votes = NULL;
    return votes;
}

static _Noreturn void report_mismatch(const char *headline, const call_info_t *mine)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    char why[DPS_GUARD_HOOK_NAME + 256];
    snprintf(why, sizeof why, "guard: %s", headline);
    dps_guard_diag_fail(why);
    call_info_t *all = calloc((size_t)conf->size, sizeof *all);
    if (all && conf->be->guard_allgather(mine, all, sizeof *mine) == 0 && conf->rank == 0) {
        uint64_t *keys = malloc((size_t)conf->size * sizeof *keys);
        for (int r = 0; keys && r < conf->size; r++)
            keys[r] = all[r].key;
        int *votes = keys ? tally(keys, conf->size) : NULL;
        DPS_ERROR("guard: %s; each rank's call:", headline);
        for (int r = 0; r < conf->size; r++)
            DPS_ERROR("guard:   rank %d: %s (%s %s x %llu), collective #%llu after step %llu%s", r,
                      all[r].hook, dps_coll_name(all[r].coll), dps_dtype_name(all[r].dtype),
                      (unsigned long long)all[r].count, (unsigned long long)all[r].seq,
                      (unsigned long long)all[r].step,
                      votes && 2 * votes[r] <= conf->size ? "  <-- culprit" : "");
        DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
        dps_guard_end_job(1);
    }
    DPS_ERROR("guard: %s; ending the job (exit status %d), rank 0 prints every rank's call", headline,
              DPS_EXIT_GUARD);
    dps_guard_end_job(0);
}

static call_info_t last_call(uint64_t key)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    call_info_t c = {.key = key,
                     .seq = atomic_load(&pos->seq),
                     .step = atomic_load(&pos->step),
                     .count = atomic_load(&pos->count),
                     .coll = atomic_load(&pos->coll),
                     .dtype = atomic_load(&pos->dtype)};
    snprintf(c.hook, sizeof c.hook, "%s", atomic_load(&pos->hook));
    return c;
}

/* [guard] desync = full: every rank is about to make the same call, or the job ends naming the
 * first call that differs. */
static void check_call(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    if (!checks_possible()) return;
    uint64_t key =
        dps_guard_mix(describe_call(hook, collective, dtype, count), atomic_load(&dps_guard_pos.seq) + 1);
    check_mark_t mark = check_begin("desync check");
    int same = same_everywhere(key);
    check_end(mark);
    if (same) return;
    call_info_t c = {.key = key,
                     .seq = atomic_load(&dps_guard_pos.seq) + 1,
                     .step = atomic_load(&dps_guard_pos.step),
                     .count = count,
                     .coll = collective,
                     .dtype = dtype};
    snprintf(c.hook, sizeof c.hook, "%s", hook);
    report_mismatch("desync: the ranks are about to make different collective calls", &c);
}

void dps_guard_note(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    if (dps_guard_conf.desync == DPS_V_guard_desync_full) check_call(hook, collective, dtype, count);
    calls_fingerprint = dps_guard_mix(calls_fingerprint, describe_call(hook, collective, dtype, count));
}

/* [guard] desync = step: the same sequence of collectives in the step on every rank. */
void dps_guard_check_step(uint64_t step)
{
    if (!checks_possible()) return;
    uint64_t key = dps_guard_mix(calls_fingerprint, atomic_load(&dps_guard_pos.seq));
    call_info_t mine = last_call(key); /* before the check marks the position */
    check_mark_t mark = check_begin("desync check (step end)");
    int same = same_everywhere(key);
    check_end(mark);
    if (!same) {
        char head[160];
        snprintf(head, sizeof head,
                 "desync in step %llu: the ranks made different collective calls (last calls shown)",
                 (unsigned long long)step);
        report_mismatch(head, &mine);
    }
    calls_fingerprint = 0;
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0x84222325cbf29ce4ull ^ n, v;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        memcpy(&v, b + i, 8), h = dps_guard_mix(h, v);
    for (; i < n; i++)
        h = dps_guard_mix(h, b[i]);
    return h;
}

static dps_guard_reader_fn reader;

void dps_guard_set_reader(dps_guard_reader_fn fn) { reader = fn; }

/* A parameter tensor's checksum; in GPU memory it is copied to the host first. */
static uint64_t hash_tensor(const dp_tensor *t)
{
    size_t bytes = t->count * dps_dtype_size(t->dtype);
    void *copy = reader && bytes ? malloc(bytes) : NULL;
    int r = copy ? reader(t, copy) : 0;
    uint64_t h = r == 0 ? hash_bytes(t->data, bytes) : r > 0 ? hash_bytes(copy, bytes) : 0;
    free(copy);
    return h;
}

/* [guard] drift_every: the parameters dp_params last saw are bitwise the same on every rank. */
void dps_guard_check_drift(uint64_t step)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    if (!checks_possible() || !drift_nparams) return;
    size_t n = drift_nparams;
    uint64_t *v = malloc(2 * n * sizeof *v), *mine = malloc(n * sizeof *mine);
    if (!v || !mine) return free(v), free(mine);
    for (size_t i = 0; i < n; i++) {
        const dp_tensor *t = &drift_params[i];
        mine[i] = hash_tensor(t);
        v[i] = mine[i], v[n + i] = ~mine[i];
    }
    check_mark_t mark = check_begin("drift check");
    int ok = conf->be->guard_min_u64(v, 2 * n) != 0;
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
    uint64_t *all = calloc((size_t)conf->size, sizeof *all);
    int gathered = all && conf->be->guard_allgather(&mine[bad], all, sizeof *all) == 0;
    const char *name = drift_params[bad].name ? drift_params[bad].name : "unnamed";
    char why[DPS_GUARD_HOOK_NAME + 256];
    snprintf(why, sizeof why, "guard: drift after step %llu in parameter tensor '%s'",
             (unsigned long long)step, name);
    dps_guard_diag_fail(why);
    if (conf->rank == 0) {
        int *votes = gathered ? tally(all, conf->size) : NULL;
        DPS_ERROR("guard: drift after step %llu: parameter tensor %zu '%s' is not the same on every rank",
                  (unsigned long long)step, bad, name);
        for (int r = 0; gathered && r < conf->size; r++)
            DPS_ERROR("guard:   rank %d: checksum %016llx%s", r, (unsigned long long)all[r],
                      votes && 2 * votes[r] <= conf->size ? "  <-- differs" : "");
        DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
        dps_guard_end_job(1);
    }
    DPS_ERROR(
        "guard: drift after step %llu in tensor '%s'; ending the job (exit status %d), rank 0 prints every "
        "rank's checksum",
        (unsigned long long)step, name, DPS_EXIT_GUARD);
    dps_guard_end_job(0);
}
