/* The guard's consistency checks: desync (the ranks make the same collective calls, compared at
 * each step end or before every call) and drift (the parameters stay bitwise the same). They are
 * collectives of the main thread on the backend's side channel, so the watchdog covers them. */
#define _GNU_SOURCE
#include "guard_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dtype.h"

/* Main thread only: the parameters dp_params last saw (what the drift check compares), and room
 * for their checksums, grown with them (a check allocates nothing: every rank makes its
 * comparisons, or none does). */
static dp_tensor *drift_params;
static size_t drift_nparams;
static uint64_t *drift_room; /* 3 per tensor + 2: this rank's checksums, then the comparison's */

/* Each call adds its tensors (a framework may give its parameters module by module); a tensor
 * given again at the same address replaces the earlier entry. */
void dps_guard_params(const dp_tensor *t, size_t n)
{
    static size_t cap, room_cap;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < drift_nparams && drift_params[j].data != t[i].data)
            j++;
        if (j == drift_nparams &&
            (dps_grow((void **)&drift_params, &cap, drift_nparams + 1, sizeof *drift_params) ||
             dps_grow((void **)&drift_room, &room_cap, 3 * (drift_nparams + 1) + 2, sizeof *drift_room)))
            return;
        drift_params[j] = t[i];
        if (j == drift_nparams) drift_nparams++;
    }
}

/* The tensor list of the next call noted (dps_guard_tensors): how many, and their sizes and
 * dtypes in order, so that 400 + 600 elements differ from 600 + 400 in one bucket of 1000. */
typedef struct shape {
    uint64_t hash;
    uint32_t n;
    uint64_t first[3]; /* the first sizes, for reports */
} shape_t;
static shape_t next_shape;

void dps_guard_tensors(const dp_tensor *t, size_t n)
{
    shape_t sh = {.hash = 0x9ae16a3b2f90404full, .n = (uint32_t)n};
    for (size_t i = 0; i < n; i++) {
        sh.hash = dps_guard_mix(sh.hash, t[i].count ^ (uint64_t)(uint32_t)t[i].dtype << 56);
        if (i < 3) sh.first[i] = t[i].count;
    }
    next_shape = sh;
}

/* Where in the program the next collective comes from, as an adapter knows it ("train.py:57 in
 * main"): named beside the call in desync reports, taken by the next call noted. Not a hook:
 * hooks have no caller's place, and a C framework's debugger knows it better. */
#define SITE_MAX 96
static char next_site[SITE_MAX];

DPS_EXPORT void dpshim_site(const char *where)
{
    snprintf(next_site, sizeof next_site, "%s", where ? where : "");
}

/* What a collective is, as a number every rank computes alike. Hooks' names are constants, and
 * calls come from one hook after another: the last name's hash is kept (main thread only). */
static uint64_t describe_call(const char *hook, int collective, int32_t dtype, uint64_t count, uint64_t shape)
{
    static const char *last_hook;
    static uint64_t last_hash;
    if (hook != last_hook) last_hash = dps_fnv1a(DPS_FNV_SEED, hook, strlen(hook)), last_hook = hook;
    uint64_t h = last_hash;
    h = dps_guard_mix(dps_guard_mix(dps_guard_mix(h, (uint64_t)collective), (uint64_t)dtype), count);
    return dps_guard_mix(h, shape);
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

/* 1 when x is the same on every rank. */
static int same_everywhere(uint64_t x)
{
    uint64_t v[2] = {x, ~x};
    if (dps_guard_conf.be->guard_min_u64(v, 2) != 0) return 1; /* a failed check must not end a healthy job */
    return v[0] == ~v[1];
}

/* One collective as the reports show it. */
typedef struct call_info {
    uint64_t key, seq, step, count;
    int32_t coll, dtype;
    uint32_t made; /* 0: no call at this place (this rank made fewer in the step) */
    shape_t shape;
    char hook[DPS_GUARD_HOOK_NAME];
    char site[SITE_MAX];
} call_info_t;

/* [guard] desync = step: this step's calls (the first CALL_LOG_MAX of them; the fingerprint
 * covers all), each with the fingerprint of the step up to it, so that a difference is traced
 * to the first call where the ranks part. Grown in the first steps, then reused. */
#define CALL_LOG_MAX 4096
typedef struct call_rec {
    uint64_t key, upto, seq, count;
    const char *hook; /* hooks' names outlive the job */
    int32_t coll, dtype;
    shape_t shape;
    char site[SITE_MAX];
} call_rec_t;
static struct {
    call_rec_t *rec;
    size_t n, cap;
    uint64_t fingerprint;
} step_calls;

static void log_call(const char *hook, int coll, int32_t dtype, uint64_t count, uint64_t key,
                     const shape_t *sh, const char *site)
{
    step_calls.fingerprint = dps_guard_mix(step_calls.fingerprint, key);
    size_t n = step_calls.n;
    if (n == CALL_LOG_MAX ||
        dps_grow((void **)&step_calls.rec, &step_calls.cap, n + 1, sizeof *step_calls.rec) != 0)
        return;
    call_rec_t *c = &step_calls.rec[n];
    c->key = key, c->upto = step_calls.fingerprint, c->seq = atomic_load(&dps_guard_pos.seq) + 1,
    c->count = count;
    c->hook = hook, c->coll = coll, c->dtype = dtype, c->shape = *sh;
    if (site[0])
        snprintf(c->site, sizeof c->site, "%s", site); /* most calls have none: no formatting */
    else
        c->site[0] = 0;
    step_calls.n = n + 1;
}

static void describe_info(const call_info_t *c, char *buf, size_t len)
{
    int o = snprintf(buf, len, "%s (%s %s x %llu", c->hook, dps_coll_name(c->coll), dps_dtype_name(c->dtype),
                     (unsigned long long)c->count);
    if (o > 0 && (size_t)o < len && c->shape.n > 1) {
        o += snprintf(buf + o, len - (size_t)o, " in %u tensors:", c->shape.n);
        for (uint32_t i = 0; i < c->shape.n && i < 3 && o > 0 && (size_t)o < len; i++)
            o += snprintf(buf + o, len - (size_t)o, "%s %llu", i ? "," : "",
                          (unsigned long long)c->shape.first[i]);
        if (c->shape.n > 3 && o > 0 && (size_t)o < len) o += snprintf(buf + o, len - (size_t)o, ", ...");
    }
    if (o > 0 && (size_t)o < len)
        o += snprintf(buf + o, len - (size_t)o, "), collective #%llu after step %llu",
                      (unsigned long long)c->seq, (unsigned long long)c->step);
    if (o > 0 && (size_t)o < len && c->site[0]) snprintf(buf + o, len - (size_t)o, ", from %s", c->site);
}

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
        for (int r = 0; r < conf->size; r++) {
            char d[DPS_GUARD_HOOK_NAME + SITE_MAX + 256], who[DPS_GUARD_HOST + 32];
            if (all[r].made)
                describe_info(&all[r], d, sizeof d);
            else
                snprintf(d, sizeof d, "no call here: it made fewer collective calls in the step");
            DPS_ERROR("guard:   %s: %s%s", dps_guard_who(r, who, sizeof who), d,
                      votes && 2 * votes[r] <= conf->size ? "  <-- culprit" : "");
        }
        DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
        dps_guard_end_job(1);
    }
    DPS_ERROR("guard: %s; ending the job (exit status %d), rank 0 prints every rank's call", headline,
              DPS_EXIT_GUARD);
    dps_guard_end_job(0);
}

static call_info_t info_of(const call_rec_t *c)
{
    call_info_t i = {.key = c->key,
                     .seq = c->seq,
                     .step = atomic_load(&dps_guard_pos.step),
                     .count = c->count,
                     .coll = c->coll,
                     .dtype = c->dtype,
                     .made = 1,
                     .shape = c->shape};
    snprintf(i.hook, sizeof i.hook, "%s", c->hook);
    snprintf(i.site, sizeof i.site, "%s", c->site);
    return i;
}

/* [guard] desync = full: every rank is about to make the same call, or the job ends naming the
 * first call that differs. */
static void check_call(const call_rec_t *c)
{
    if (!checks_possible()) return;
    uint64_t key = dps_guard_mix(c->key, c->seq);
    dps_guard_mark_t mark = dps_guard_own_begin("desync check");
    atomic_store(&dps_guard_pos.before_next, 1); /* a rank that left before that call never comes */
    int same = same_everywhere(key);
    atomic_store(&dps_guard_pos.before_next, 0);
    dps_guard_own_end(mark);
    if (same) return;
    call_info_t i = info_of(c);
    i.key = key;
    report_mismatch("desync: the ranks are about to make different collective calls", &i);
}

uint64_t dps_guard_note(const char *hook, int collective, int32_t dtype, uint64_t count)
{
    shape_t sh = next_shape; /* the list's shape and the site go with its first collective only */
    next_shape = (shape_t){0};
    uint64_t key = describe_call(hook, collective, dtype, count, sh.hash);
    if (dps_guard_conf.desync == DPS_V_guard_desync_full) {
        call_rec_t c = {key, 0, atomic_load(&dps_guard_pos.seq) + 1, count, hook, collective, dtype, sh, ""};
        snprintf(c.site, sizeof c.site, "%s", next_site);
        check_call(&c);
    } else if (dps_guard_conf.desync == DPS_V_guard_desync_step) {
        log_call(hook, collective, dtype, count, key, &sh, next_site);
    }
    next_site[0] = 0;
    return key;
}

/* The first call of the step where the ranks part: a binary search over the logged calls'
 * fingerprints, in collectives that every rank makes alike. CALL_LOG_MAX when the calls logged
 * on every rank agree (the difference is past the log, or in the number of calls). */
static size_t first_difference(void)
{
    uint64_t n = step_calls.n;
    if (dps_guard_conf.be->guard_min_u64(&n, 1) != 0) return CALL_LOG_MAX;
    size_t lo = 0, hi = (size_t)n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (same_everywhere(step_calls.rec[mid].upto))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < (size_t)n || (size_t)n < CALL_LOG_MAX ? lo : CALL_LOG_MAX;
}

/* [guard] desync = step: the same sequence of collectives in the step on every rank. */
static uint64_t drift_sums(void);
static void name_drift(uint64_t step);

void dps_guard_check_step(uint64_t step, int drift_due)
{
    if (!checks_possible()) return;
    uint64_t key = dps_guard_mix(step_calls.fingerprint, atomic_load(&dps_guard_pos.seq));
    dps_guard_mark_t mark = dps_guard_own_begin("desync check (step end)");
    /* a drift check due now rides along: one comparison for both, a second only to tell them
     * apart when they differ (every rank takes it: each saw the same outcome) */
    int same = drift_due ? same_everywhere(dps_guard_mix(key, drift_sums())) : 0;
    if (same)
        drift_due = 0;
    else
        same = same_everywhere(key);
    if (same && drift_due) name_drift(step);
    if (!same) {
        size_t at = first_difference();
        call_info_t mine = {.key = key, .step = step};
        char head[192];
        if (at < step_calls.n) {
            mine = info_of(&step_calls.rec[at]);
        } else if (at != CALL_LOG_MAX) {
            mine.made = 0; /* fewer calls than some other rank */
        } else {           /* past the log: the last call stands for the step */
            mine = info_of(&step_calls.rec[step_calls.n - 1]);
            mine.key = key;
        }
        if (at != CALL_LOG_MAX)
            snprintf(head, sizeof head,
                     "desync in step %llu: the ranks' collective calls part at call %zu of the step",
                     (unsigned long long)step, at + 1);
        else
            snprintf(head, sizeof head,
                     "desync in step %llu: the ranks made different collective calls "
                     "(last calls shown)",
                     (unsigned long long)step);
        report_mismatch(head, &mine);
    }
    dps_guard_own_end(mark);
    step_calls.n = 0, step_calls.fingerprint = 0;
}

/* 32 independent lanes of 8 bytes, each a multiply of what it read: the lanes fill the widest
 * vectors (one chain of dependent mixes ran at a seventh of this speed, 4.3 against 30 GB/s on
 * parameters in cache; the drift check reads every parameter at each check). */
#define HASH_LANES 32
static inline DPS_ALWAYS_INLINE uint64_t hash_bytes_body(const unsigned char *restrict b, size_t n)
{
    uint64_t lane[HASH_LANES], v;
    for (int k = 0; k < HASH_LANES; k++)
        lane[k] = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1) ^ n;
    size_t i = 0;
    for (; i + 8 * HASH_LANES <= n; i += 8 * HASH_LANES)
        for (int k = 0; k < HASH_LANES; k++)
            memcpy(&v, b + i + 8 * k, 8), lane[k] = (lane[k] ^ v) * 0xff51afd7ed558ccdull;
    uint64_t h = 0x84222325cbf29ce4ull;
    for (int k = 0; k < HASH_LANES; k++)
        h = dps_guard_mix(h, lane[k]);
    for (; i + 8 <= n; i += 8)
        memcpy(&v, b + i, 8), h = dps_guard_mix(h, v);
    for (; i < n; i++)
        h = dps_guard_mix(h, b[i]);
    return h;
}
DPS_WIDEST_LAZY(uint64_t, hash_bytes, (const unsigned char *restrict b, size_t n), (b, n))

static dps_guard_reader_fn reader;

void dps_guard_set_reader(dps_guard_reader_fn fn)
{
    reader = fn;
}

/* 1 when every page of [p, p + n) is mapped: memory the framework gave to dp_params and freed
 * since (unmapped) is not read, rather than a crash. mincore asks the kernel without touching. */
static int mapped(const void *p, size_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1), end = (uintptr_t)p + n;
    unsigned char vec[1024];
    while (a < end) {
        size_t len = end - a < sizeof vec * (size_t)page ? end - a : sizeof vec * (size_t)page;
        if (mincore((void *)a, len, vec) != 0) return 0;
        a += len;
    }
    return 1;
}

/* A parameter tensor's checksum; in GPU memory it is copied to the host first. Memory no longer
 * mapped gives a checksum of its own (alike on ranks that all freed it), and a warning. */
static uint64_t hash_tensor(const dp_tensor *t)
{
    size_t bytes = t->count * dps_dtype_size(t->dtype);
    void *copy = reader && bytes ? malloc(bytes) : NULL;
    int r = copy ? reader(t, copy) : 0;
    uint64_t h = 0;
    if (r > 0)
        h = hash_bytes(copy, bytes);
    else if (r == 0 && mapped(t->data, bytes))
        h = hash_bytes(t->data, bytes);
    else if (r == 0) {
        DPS_WARN_ONCE("guard: parameter tensor '%s' given to dp_params is no longer in memory (the framework "
                      "freed it); the drift check skips it",
                      t->name ? t->name : "unnamed");
        h = 0x6f6e65676f6e6521ull; /* "gone" */
    }
    free(copy);
    return h;
}

static uint64_t no_params_room[2]; /* a rank that gave dp_params nothing compares too */

static uint64_t *room(void)
{
    return drift_room ? drift_room : no_params_room;
}

/* This rank's checksum of every tensor dp_params last saw into the room (and their complements
 * after them, for the comparison that names one); returns one checksum for them all. */
static uint64_t drift_sums(void)
{
    size_t n = drift_nparams;
    uint64_t *mine = room(), *v = mine + n, whole = n;
    for (size_t i = 0; i < n; i++) {
        mine[i] = hash_tensor(&drift_params[i]);
        v[i] = mine[i], v[n + i] = ~mine[i];
        whole = dps_guard_mix(whole, mine[i]);
    }
    /* the tensors' count rides along: never 2 numbers in all, which a backend may send another
     * way (guard_min_u64), should ranks hold different numbers of tensors */
    v[2 * n] = n, v[2 * n + 1] = ~(uint64_t)n;
    return whole;
}

/* After the checksums of all tensors differed (every rank comes here): the first tensor that
 * differs, every rank's checksum of it, and the job's end. Returns when no single tensor differs. */
static void name_drift(uint64_t step)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    size_t n = drift_nparams, bad = n;
    uint64_t *mine = room(), *v = mine + n;
    if (conf->be->guard_min_u64(v, 2 * n + 2) != 0) return;
    for (size_t i = 0; i < n && bad == n; i++)
        if (v[i] != ~v[n + i]) bad = i;
    if (bad == n) return;
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
        char who[DPS_GUARD_HOST + 32];
        for (int r = 0; gathered && r < conf->size; r++)
            DPS_ERROR("guard:   %s: checksum %016llx%s", dps_guard_who(r, who, sizeof who),
                      (unsigned long long)all[r], votes && 2 * votes[r] <= conf->size ? "  <-- differs" : "");
        DPS_ERROR("guard: ending the job (exit status %d)", DPS_EXIT_GUARD);
        dps_guard_end_job(1);
    }
    DPS_ERROR(
        "guard: drift after step %llu in tensor '%s'; ending the job (exit status %d), rank 0 prints every "
        "rank's checksum",
        (unsigned long long)step, name, DPS_EXIT_GUARD);
    dps_guard_end_job(0);
}

/* [guard] drift_every where desync is not step (whose comparison it otherwise rides): the
 * parameters dp_params last saw are bitwise the same on every rank. */
void dps_guard_check_drift(uint64_t step)
{
    if (!checks_possible()) return;
    dps_guard_mark_t mark = dps_guard_own_begin("drift check");
    if (!same_everywhere(drift_sums())) name_drift(step);
    dps_guard_own_end(mark);
}
