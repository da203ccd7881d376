/* One job, one truth: when the backend opens, before any of the program's data moves, the ranks
 * compare everything that shapes the collective sequence or the arithmetic, and take the
 * decisions left to "auto" together. The rule for new code: nothing that changes which
 * collectives run, their sizes, or the numbers they produce is decided by one rank alone; it is
 * a JOB key of policy_keys.def (compared here), or an item below, or agreed as one.
 *
 * The comparison is one small all-reduce on the main channel (every backend has one): each item
 * travels as its checksum h and ~h, and the element-wise minimum gives min(h) and ~max(h), equal
 * exactly when every rank has the same value. Only when they differ do the ranks exchange the
 * values' text, to name the keys, the ranks and their values. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "diag/diag.h"
#include "engine.h"
#include "guard/guard.h"
#include "core/sys.h"


/* Room for an item's name and a rank's value in the exchange of texts. */
#define ITEM_TEXT 96

/* --- the items: JOB keys, then what is not a key ------------------------------------------ */

/* [hook NAME] sections change which functions gain collectives: the same on every rank. */
static uint64_t hooks_checksum(const dps_policy_t *p)
{
    uint64_t h = DPS_FNV_SEED;
    for (int i = 0; i < p->nhooks; i++) {
        dps_hookdecl_t d = p->hooks[i];
        d.line = 0; /* where in its file does not matter; parsed into zeroed memory, so no padding noise */
        h = dps_fnv1a(h, &d, sizeof d);
    }
    return h;
}

static void hooks_text(const dps_policy_t *p, char *buf, size_t len)
{
    const char *file = p->file[0] ? p->file : "no policy file", *base = strrchr(file, '/');
    snprintf(buf, len, "%d section(s), checksum %08llx (%.40s)", p->nhooks,
             (unsigned long long)(hooks_checksum(p) & 0xffffffffu), base ? base + 1 : file);
}

#define LIBRARY_TEXT "libdpshim " DPS_VERSION ", hook ABI " DPS_STR(DPSHIM_HOOK_ABI_VERSION)
#define DPS_STR_(x) #x
#define DPS_STR(x) DPS_STR_(x)

typedef enum { ITEM_KEY, ITEM_HOOKS, ITEM_LIBRARY } item_kind_t;

typedef struct item {
    item_kind_t kind;
    dps_key_id_t key; /* ITEM_KEY */
} item_t;

static const char *item_name(const item_t *it, char *buf, size_t len)
{
    if (it->kind == ITEM_HOOKS) return "[hook] declarations";
    if (it->kind == ITEM_LIBRARY) return "the dpshim library";
    snprintf(buf, len, "[%s] %s", dps_keys[it->key].section, dps_keys[it->key].key);
    return buf;
}

/* This rank's value, as the error shows it: "scale (env DPSHIM_DATA_MODE)". */
static void item_text(const item_t *it, char *buf, size_t len)
{
    const dps_policy_t *p = &dps_g.policy;
    char src[1100];
    if (it->kind == ITEM_HOOKS)
        hooks_text(p, buf, len);
    else if (it->kind == ITEM_LIBRARY)
        snprintf(buf, len, "%s", LIBRARY_TEXT);
    else
        snprintf(buf, len, "%.40s (%.48s)", dps_policy_text(p, it->key),
                 dps_policy_source(p, it->key, src, sizeof src));
}

static uint64_t item_checksum(const item_t *it)
{
    const dps_policy_t *p = &dps_g.policy;
    if (it->kind == ITEM_HOOKS) return hooks_checksum(p);
    if (it->kind == ITEM_LIBRARY) return dps_fnv1a(DPS_FNV_SEED, LIBRARY_TEXT, sizeof LIBRARY_TEXT);
    const char *v = dps_policy_text(p, it->key);
    return dps_fnv1a(DPS_FNV_SEED ^ (uint64_t)it->key, v, strlen(v));
}

static size_t list_items(item_t *out)
{
    size_t n = 0;
    for (int k = 0; k < DPS_NKEYS; k++)
        if (dps_keys[k].job) out[n++] = (item_t){ITEM_KEY, (dps_key_id_t)k};
    out[n++] = (item_t){ITEM_HOOKS, 0};
    out[n++] = (item_t){ITEM_LIBRARY, 0};
    return n;
}

/* --- decisions taken for the job ---------------------------------------------------------- */

/* A progress thread pays off only on a core of its own: where a rank has one core (ranks bound
 * to cores, or as many ranks as cores), it takes its time slices from the framework and spins
 * waiting for peers that are descheduled (measured: 5% slower at np=2 on 2 cores). */
static int spare_core(void)
{
    cpu_set_t mask;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int mine = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : (int)online;
    long per_rank = online / (dps_g.local_size > 0 ? dps_g.local_size : 1);
    int spare = mine >= 2 && per_rank >= 2;
    DPS_INFO("[comm] overlap = auto: %s here (%d core(s) in this rank's affinity mask, %ld per local rank)",
             spare ? "a core to spare" : "no core to spare", mine, per_rank);
    return spare;
}

/* The decisions' slots after the items': minimum over ranks. */
enum { DECIDE_OVERLAP, DECIDE_NO_DIAG, DECIDE_DESYNC, NDECISIONS };

/* --- when ranks differ -------------------------------------------------------------------- */

/* "0, 2-3" for the ranks r whose text equals `value`. */
static void ranks_with(const char *texts, int size, const char *value, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int r = 0; r < size && o < len; r++) {
        if (strcmp(texts + (size_t)r * ITEM_TEXT, value) != 0) continue;
        int e = r;
        while (e + 1 < size && strcmp(texts + (size_t)(e + 1) * ITEM_TEXT, value) == 0)
            e++;
        o += (size_t)snprintf(buf + o, len - o, o ? ", %d" : "%d", r);
        if (e > r && o < len) o += (size_t)snprintf(buf + o, len - o, e > r + 1 ? "-%d" : ", %d", e);
        r = e;
    }
}

/* Rank 0 lists each value with its ranks; the others name their own and rank 0's. */
static void report_item(const item_t *it, const char *texts, int size)
{
    char name[64], ranks[256];
    item_name(it, name, sizeof name);
    const char *mine = texts + (size_t)dps_g.eff_rank * ITEM_TEXT;
    if (dps_g.eff_rank != 0) {
        if (strcmp(mine, texts) != 0)
            DPS_ERROR("%s differs between the ranks: here %s, on rank 0 %s; rank 0 lists every rank's value",
                      name, mine, texts);
        return;
    }
    DPS_ERROR("%s differs between the ranks; it must be the same on every rank (it shapes the collectives "
              "or their arithmetic):",
              name);
    for (int r = 0; r < size; r++) {
        const char *v = texts + (size_t)r * ITEM_TEXT;
        int first = 1;
        for (int q = 0; q < r && first; q++)
            first = strcmp(texts + (size_t)q * ITEM_TEXT, v) != 0;
        if (!first) continue;
        ranks_with(texts, size, v, ranks, sizeof ranks);
        DPS_ERROR("  rank%s %s: %s", strchr(ranks, ',') || strchr(ranks, '-') ? "s" : "", ranks, v);
    }
}

/* Every rank's text of the differing items, through the all-reduce: each rank fills its own
 * slots of a zeroed buffer and the byte sum is everyone's. Then the error, and every rank ends. */
static _Noreturn void report_differences(const dps_backend_t *be, const item_t *items, const size_t *bad,
                                         size_t nbad)
{
    int size = dps_g.eff_size;
    size_t slot = (size_t)size * ITEM_TEXT;
    unsigned char *texts = calloc(nbad, slot);
    if (texts) {
        for (size_t i = 0; i < nbad; i++)
            item_text(&items[bad[i]], (char *)texts + i * slot + (size_t)dps_g.eff_rank * ITEM_TEXT,
                      ITEM_TEXT);
        if (be->allreduce(texts, nbad * slot, DP_U8, DPS_RED_SUM, 1.0, 1.0, 0) != 0)
            free(texts), texts = NULL;
    }
    char names[512] = "";
    for (size_t i = 0; i < nbad; i++) {
        char name[64];
        if (texts) report_item(&items[bad[i]], (char *)texts + i * slot, size);
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 item_name(&items[bad[i]], name, sizeof name));
    }
    DPS_ERROR("the ranks differ in %s: the job was not started. Set these alike on every rank (a per-host "
              "environment, a module file or a policy file that differs between nodes does this; "
              "dpshim-diag config shows where each value comes from)",
              names);
    /* rank 0's list first: the launcher ends the job at the first exit */
    if (dps_g.eff_rank != 0) sleep(2);
    dps_run_before_fatal_exit();
    dps_exit_now(DPS_EXIT_CONFIG);
}

/* --- the agreement ------------------------------------------------------------------------- */

/* Every rank's host, and then every rank's process id (the guard watches the processes of its
 * host), by one all-reduce of zeroed slots. */
static char *gather_hosts(const dps_backend_t *be)
{
    size_t n = (size_t)dps_g.eff_size, host_bytes = n * DPS_GUARD_HOST;
    char *table = calloc(1, host_bytes + n * sizeof(uint32_t));
    if (!table) return NULL;
    snprintf(table + (size_t)dps_g.eff_rank * DPS_GUARD_HOST, DPS_GUARD_HOST, "%s",
             dps_guard_host(dps_g.eff_rank));
    uint32_t pid = (uint32_t)getpid();
    memcpy(table + host_bytes + (size_t)dps_g.eff_rank * sizeof pid, &pid, sizeof pid);
    if (be->allreduce(table, host_bytes + n * sizeof pid, DP_U8, DPS_RED_SUM, 1.0, 1.0, 0) != 0) {
        free(table);
        return NULL;
    }
    return table;
}

/* Clocks of hosts other than rank 0's, compared with rank 0's for the report's time line. */
static void measure_clocks(const dps_backend_t *be, const char *hosts)
{
    unsigned char *measure = calloc((size_t)dps_g.eff_size, 1);
    int any = 0;
    for (int r = 1; measure && hosts && r < dps_g.eff_size; r++)
        any |= measure[r] = strcmp(hosts + (size_t)r * DPS_GUARD_HOST, hosts) != 0;
    int64_t offset = 0;
    uint64_t error = 0;
    if (any && be->clock_offset && be->clock_offset(measure, &offset, &error) == 0) {
        dps_diag_set_clock(offset, error);
        DPS_INFO("wall clock %+.3f ms from rank 0's (within %.3f ms)", (double)offset * 1e-6,
                 (double)error * 1e-6);
    } else if (!any && measure) {
        dps_diag_set_clock(0, 0); /* one host: one clock */
    } else if (any) {
        DPS_WARN("clock offsets between hosts could not be measured: the diagnostics report aligns ranks by "
                 "each host's own clock");
    }
    free(measure);
}

/* The launcher's local size against the ranks the host table puts on this host: the GPU binding,
 * overlap's core count and the shared-memory sums follow the local size, so a disagreement ends
 * the job naming both sources, never a guess. Every rank of a host sees the same table. */
static void check_local_size(const char *hosts, const char *hook)
{
    if (!hosts || dps_g.eff_size != dps_g.size) return;
    const char *mine = hosts + (size_t)dps_g.rank * DPS_GUARD_HOST;
    int on_host = 0;
    for (int r = 0; r < dps_g.size; r++)
        on_host += strcmp(hosts + (size_t)r * DPS_GUARD_HOST, mine) == 0;
    if (on_host != dps_g.local_size)
        dps_fatal(
            "%s: the launcher gives this rank local rank %d of %d (from %s, launcher %s), but %d rank(s) of "
            "the "
            "job run on this host (%s) by their host names: the GPU binding and the shared-memory sums would "
            "be wrong. Check the launch line (a Slurm step with another task layout than the job's, or a "
            "hand-set variable), or start with mpirun",
            hook, dps_g.local_rank, dps_g.local_size, dps_g.local_source ? dps_g.local_source : "?",
            dps_g.launcher, on_host, mine);
}

void dps_engine_agree(const dps_backend_t *be, const char *hook)
{
    item_t items[DPS_NKEYS + 2];
    size_t n = list_items(items);
    int64_t v[2 * (DPS_NKEYS + 2) + NDECISIONS];
    for (size_t i = 0; i < n; i++) {
        uint64_t h = item_checksum(&items[i]);
        v[2 * i] = (int64_t)h, v[2 * i + 1] = (int64_t)~h;
    }
    int auto_overlap = DPS_POLICY_ENUM(&dps_g.policy, comm, overlap) == DPS_V_comm_overlap_auto;
    v[2 * n + DECIDE_OVERLAP] = auto_overlap && spare_core();
    v[2 * n + DECIDE_NO_DIAG] = !dps_diag_on;
    /* desync = auto: full only where every rank runs the PyTorch adapter (step < full: the minimum) */
    int auto_desync = DPS_POLICY_ENUM(&dps_g.policy, guard, desync) == DPS_V_guard_desync_auto;
    v[2 * n + DECIDE_DESYNC] = dps_g.python_adapter ? DPS_V_guard_desync_full : DPS_V_guard_desync_step;
    dps_guard_mark_t mark = dps_guard_own_begin("start-up agreement");
    if (be->allreduce(v, 2 * n + NDECISIONS, DP_I64, DPS_RED_MIN, 1.0, 1.0, 0) != 0)
        dps_fatal("%s: the ranks' start-up agreement failed: %s", hook, be->last_error());
    size_t bad[DPS_NKEYS + 2], nbad = 0;
    for (size_t i = 0; i < n; i++)
        if (v[2 * i] != ~v[2 * i + 1]) bad[nbad++] = i;
    if (nbad) report_differences(be, items, bad, nbad);
    if (auto_overlap) {
        dps_g.overlap = v[2 * n + DECIDE_OVERLAP] != 0;
        if (dps_g.eff_rank == 0)
            DPS_INFO("[comm] overlap = auto, for the job: %s", dps_g.overlap
                                                                   ? "on (every rank has a core to spare)"
                                                                   : "off (some rank has no core to spare)");
    }
    if (auto_desync) {
        dps_guard_set_desync((int)v[2 * n + DECIDE_DESYNC]);
        if (dps_g.eff_rank == 0)
            DPS_INFO("[guard] desync = auto, for the job: %s",
                     v[2 * n + DECIDE_DESYNC] == DPS_V_guard_desync_full
                         ? "full (every rank runs the PyTorch adapter)"
                         : "step");
    }
    char *hosts = gather_hosts(be);
    if (hosts) {
        dps_guard_set_hosts(hosts);
        dps_guard_set_pids((const uint32_t *)(const void *)(hosts + (size_t)dps_g.eff_size * DPS_GUARD_HOST),
                           dps_g.eff_size);
    }
    check_local_size(hosts, hook);
    if (!v[2 * n + DECIDE_NO_DIAG]) measure_clocks(be, hosts); /* some rank keeps diagnostics */
    free(hosts);
    dps_guard_own_end(mark);
}
