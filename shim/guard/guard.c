/* The guard (see guard.h): its configuration and the main thread's position. The main thread
 * only stores where it is (a few relaxed atomic stores per collective); the watchdog thread
 * (watchdog.c) does the rest, so a healthy job pays next to nothing (measured: ./dev.sh bench). */
#define _GNU_SOURCE
#include "guard_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

DPS_STARTUP_DATA dps_guard_pos_t dps_guard_pos;
DPS_STARTUP_DATA dps_guard_conf_t dps_guard_conf;
/* Every rank's host (set once, before any report reads it), and this process's own. */
static char *hosts;
DPS_STARTUP_DATA static char own_host[DPS_GUARD_HOST];

/* The zeroed state before configuration must check nothing. */
_Static_assert(DPS_V_guard_desync_off == 0, "[guard] desync must list off first");

DPS_STARTUP void dps_guard_configure(const dps_state_t *s)
{
    dps_guard_conf_t *conf = &dps_guard_conf;
    conf->rank = s->rank, conf->size = s->size;
    conf->timeout = (double)dps_policy_num(&s->policy, DPS_P_guard_timeout);
    conf->exit_barrier = DPS_POLICY_ENUM(&s->policy, guard, exit_barrier) == DPS_V_guard_exit_barrier_on;
    conf->desync = DPS_POLICY_ENUM(&s->policy, guard, desync);
    conf->drift_every = dps_policy_num(&s->policy, DPS_P_guard_drift_every);
    conf->recovery_hint =
        DPS_POLICY_ENUM(&s->policy, elastic, lost_rank) == DPS_V_elastic_lost_rank_continue &&
        !dps_launcher_keeps_survivors();
    /* with neither a watchdog nor an exit barrier there is nothing for the thread to do */
    conf->on = s->eff_size > 1 && (conf->timeout > 0 || conf->exit_barrier);
    atomic_store(&dps_guard_pos.hook, "start");
    if (s->role == DPS_ROLE_RANK && s->size > 1) dps_guard_note_host();
    /* "in the program's own code for N s" counts from here; only a rank of a job reports it */
    if (s->role == DPS_ROLE_RANK && s->eff_size > 1)
        atomic_store(&dps_guard_pos.since_ns, dps_guard_now_ns());
}

void dps_guard_note_host(void)
{
    if (!own_host[0] && gethostname(own_host, sizeof own_host - 1) != 0)
        snprintf(own_host, sizeof own_host, "?");
}

static void (*_Atomic at_place)(void);

void dps_guard_on_place(void (*fn)(void))
{
    atomic_store(&at_place, fn);
}

/* Before a wait for every rank: the same places on every rank, in the same order. */
static void place_reached(void)
{
    void (*fn)(void) = atomic_load_explicit(&at_place, memory_order_relaxed);
    if (fn) fn();
}

/* Collectives entered inside another (the NCCL path's set-up collectives on the host, inside
 * the program's GPU collective after a loss) or inside the shim's own wait: each leave puts the
 * rank back where its enter found it, so that the rest of the outer one is watched too. Only the
 * thread in a hook enters (hooks run one at a time); deeper than NEST_MAX, a leave ends the watch
 * as before nesting existed. The collectives' count (seq) only grows: a report after a nested one
 * names the outer hook with the nested one's number. */
#define NEST_MAX 4
static struct {
    int depth;
    struct saved {
        const char *hook;
        int coll, dtype, in_coll;
        uint64_t count, call;
    } saved[NEST_MAX];
} nest;

void dps_guard_enter(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    dps_guard_pos_t *pos = &dps_guard_pos;
    if (nest.depth < NEST_MAX)
        nest.saved[nest.depth] = (struct saved){
            atomic_load_explicit(&pos->hook, memory_order_relaxed),
            atomic_load_explicit(&pos->coll, memory_order_relaxed),
            atomic_load_explicit(&pos->dtype, memory_order_relaxed),
            atomic_load_explicit(&pos->in_coll, memory_order_relaxed),
            atomic_load_explicit(&pos->count, memory_order_relaxed),
            atomic_load_explicit(&pos->call, memory_order_relaxed),
        };
    nest.depth++;
    place_reached(); /* every collective passes here, its desync check next */
    uint64_t call = dps_guard_note(hook, collective, dtype, count); /* checks.c: the desync checks' record */
    atomic_store_explicit(&pos->call, call, memory_order_relaxed);
    atomic_store_explicit(&pos->hook, hook, memory_order_relaxed);
    atomic_store_explicit(&pos->coll, collective, memory_order_relaxed);
    atomic_store_explicit(&pos->dtype, dtype, memory_order_relaxed);
    atomic_store_explicit(&pos->count, count, memory_order_relaxed);
    atomic_store_explicit(&pos->since_ns, dps_guard_now_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&pos->seq, 1, memory_order_relaxed);
    atomic_store_explicit(&pos->in_coll, 1, memory_order_release);
}

void dps_guard_leave(void)
{
    dps_guard_pos_t *pos = &dps_guard_pos;
    if (nest.depth > 0 && --nest.depth < NEST_MAX && nest.saved[nest.depth].in_coll) {
        const struct saved *o = &nest.saved[nest.depth]; /* back in the outer wait, watched from now */
        atomic_store_explicit(&pos->hook, o->hook, memory_order_relaxed);
        atomic_store_explicit(&pos->coll, o->coll, memory_order_relaxed);
        atomic_store_explicit(&pos->dtype, o->dtype, memory_order_relaxed);
        atomic_store_explicit(&pos->count, o->count, memory_order_relaxed);
        atomic_store_explicit(&pos->call, o->call, memory_order_relaxed);
        atomic_store_explicit(&pos->since_ns, dps_guard_now_ns(), memory_order_relaxed);
        atomic_store_explicit(&pos->in_coll, 1, memory_order_release);
        return;
    }
    atomic_store_explicit(&pos->in_coll, 0, memory_order_relaxed);
    atomic_store_explicit(&pos->since_ns, dps_guard_now_ns(), memory_order_release);
}

void dps_guard_step(uint64_t step, int alone)
{
    atomic_store_explicit(&dps_guard_pos.step, step, memory_order_relaxed);
    if (alone) return;
    int drift_due = dps_guard_conf.drift_every && step % dps_guard_conf.drift_every == 0;
    if (dps_guard_conf.desync == DPS_V_guard_desync_step)
        dps_guard_check_step(step, drift_due);
    else if (drift_due)
        dps_guard_check_drift(step);
}

static dps_guard_mark_t own_begin(const char *what)
{
    dps_guard_pos_t *pos = &dps_guard_pos;
    dps_guard_mark_t prev = {atomic_load(&pos->hook), atomic_load(&pos->coll), atomic_load(&pos->in_coll)};
    atomic_store(&pos->hook, what);
    atomic_store(&pos->coll, -1); /* not one of the program's collectives */
    atomic_store(&pos->since_ns, dps_guard_now_ns());
    atomic_store(&pos->in_coll, 1);
    return prev;
}

/* The shim's own waits for every rank (start-up, the checks): the same places on every rank. */
dps_guard_mark_t dps_guard_own_begin(const char *what)
{
    place_reached();
    return own_begin(what);
}

/* A file wait is this rank's alone: no place. */
dps_guard_mark_t dps_guard_files_wait_begin(const char *what, int for_rank0)
{
    dps_guard_mark_t prev = own_begin(what);
    atomic_store(&dps_guard_pos.files_wait, for_rank0 ? FILES_WAIT_RANK0 : FILES_WAIT_ACKS);
    return prev;
}

/* Back to where the program was: its last collective stays the one reports name. A wait inside
 * one of its collectives (the survivors' agreement after a loss) leaves the rank in it: the
 * collective runs again among the survivors, watched from now as any other. */
void dps_guard_own_end(dps_guard_mark_t prev)
{
    atomic_store(&dps_guard_pos.files_wait, 0);
    atomic_store(&dps_guard_pos.hook, prev.hook);
    atomic_store(&dps_guard_pos.coll, prev.coll);
    atomic_store_explicit(&dps_guard_pos.since_ns, dps_guard_now_ns(), memory_order_relaxed);
    atomic_store_explicit(&dps_guard_pos.in_coll, prev.in_coll, memory_order_release);
}

void dps_guard_set_desync(int desync)
{
    dps_guard_conf.desync = (dps_guard_desync_t)desync;
}

void dps_guard_set_hosts(const char *table)
{
    char *copy = malloc((size_t)dps_guard_conf.size * DPS_GUARD_HOST);
    if (!copy) return;
    memcpy(copy, table, (size_t)dps_guard_conf.size * DPS_GUARD_HOST);
    hosts = copy;
}

const char *dps_guard_host(int r)
{
    if (hosts && r >= 0 && r < dps_guard_conf.size) return hosts + (size_t)r * DPS_GUARD_HOST;
    return r == dps_guard_conf.rank ? own_host : "";
}

const char *dps_guard_who(int r, char *buf, size_t len)
{
    const char *host = dps_guard_host(r);
    snprintf(buf, len, host[0] ? "rank %d (%s)" : "rank %d", r, host);
    return buf;
}

uint64_t dps_guard_seq(void)
{
    return atomic_load_explicit(&dps_guard_pos.seq, memory_order_relaxed);
}

void dps_guard_where(char *buf, size_t len)
{
    snprintf(buf, len, "collective #%llu after step %llu",
             (unsigned long long)atomic_load(&dps_guard_pos.seq),
             (unsigned long long)atomic_load(&dps_guard_pos.step));
}

typedef struct keyed {
    uint64_t key;
    int index;
} keyed_t;

static int by_key(const void *a, const void *b)
{
    uint64_t x = ((const keyed_t *)a)->key, y = ((const keyed_t *)b)->key;
    return (x > y) - (x < y);
}

int dps_guard_votes(const uint64_t *keys, int n, int *votes_p)
{
    keyed_t *sorted = malloc((size_t)(n > 0 ? n : 1) * sizeof *sorted);
    if (!sorted) return -1;
    for (int i = 0; i < n; i++)
        sorted[i] = (keyed_t){keys[i], i};
    qsort(sorted, (size_t)n, sizeof *sorted, by_key);
    for (int i = 0, j; i < n; i = j) { /* each run of equal keys */
        j = i + 1;
        while (j < n && sorted[j].key == sorted[i].key)
            j++;
        for (int k = i; k < j; k++)
            votes_p[sorted[k].index] = j - i;
    }
    free(sorted);
    return 0;
}
