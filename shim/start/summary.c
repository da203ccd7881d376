/* The line rank 0 prints at exit of a job of two or more ranks ([diag] summary): what the job did
 * (ranks, steps, collectives, data reduced), where its time went (inside collectives, and of
 * that, waiting for the other ranks), the slowest rank, and where to look further. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "diag/diag.h"
#include "engine/engine.h"
#include "guard/guard.h"
#include "start.h"

/* Hosts among the ranks' gathered names; 0 where they were never gathered. */
static int count_hosts(int size)
{
    int hosts = 0;
    for (int r = 0; r < size; r++) {
        const char *h = dps_guard_host(r);
        if (!h || !h[0]) return 0;
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = !strcmp(h, dps_guard_host(q));
        hosts += !seen;
    }
    return hosts;
}

/* The figures below read every rank that was heard from at the exit barrier (rank 0's own where
 * there was none). A rank's time in collectives is its transfers plus its waits for the last rank
 * to arrive; the rank that spent the least there kept the others waiting (the slowest), and what
 * another spent beyond it is counted as waiting. The same counters fill the stats files, so
 * dpshim-diag report shows the same steps, collectives and bytes per rank. */
void dps_summary_at_exit(void)
{
    /* every rank's figures after an exit barrier (on rank 0, or the lowest rank left where rank 0
     * was lost), else rank 0's own alone */
    const dps_diag_tally_t *barrier = dps_guard_exit_tallies(), *all = barrier;
    if ((!barrier && dps_g.rank != 0) || dps_g.size < 2 || dps_g.role != DPS_ROLE_RANK ||
        DPS_POLICY_ENUM(&dps_g.policy, diag, summary) == DPS_V_diag_summary_off)
        return;
    dps_diag_tally_t own;
    int ranks = dps_g.size;
    if (!all) dps_diag_tally(&own), all = &own, ranks = 1;
    const dps_diag_tally_t *me = barrier ? &all[dps_g.rank] : &own;
    int heard = 0, slowest = -1;
    uint64_t least_comm = UINT64_MAX;
    for (int r = 0; r < ranks; r++) {
        if (!all[r].wall_ns) continue; /* not heard from */
        heard++;
        if (all[r].comm_ns < least_comm) least_comm = all[r].comm_ns, slowest = r;
    }
    double in_coll = 0, waiting = 0;
    for (int r = 0; r < ranks; r++) {
        if (!all[r].wall_ns) continue;
        in_coll += (double)all[r].comm_ns / (double)all[r].wall_ns / heard;
        waiting += (double)(all[r].comm_ns - least_comm) / (double)all[r].wall_ns / heard;
    }

    char line[1800];
    size_t n = 0;
#define ADD(...) (n += n < sizeof line ? (size_t)snprintf(line + n, sizeof line - n, __VA_ARGS__) : 0)
    int hosts = count_hosts(dps_g.size);
    ADD("%d ranks", dps_g.size);
    if (hosts) ADD(" on %d host%s", hosts, hosts == 1 ? "" : "s");
    ADD(", %.1f s: %llu steps, %llu collectives, %.1f MB reduced per rank", (double)me->wall_ns * 1e-9,
        (unsigned long long)me->steps, (unsigned long long)me->collectives, (double)me->bytes / 1e6);
    if (me->collectives)
        ADD("; in collectives %.1f%% of the wall time (waiting there for the last rank to arrive: %.1f%%; "
            "means of "
            "the ranks)",
            100 * in_coll, 100 * waiting);
    char who[128];
    /* under 1% of the time the ranks arrive together, and which one came last is chance */
    if (heard > 1 && me->collectives && waiting >= 0.01)
        ADD("; slowest: %s (the least time in collectives: the others waited for it)",
            dps_guard_who(slowest, who, sizeof who));
    else if (heard > 1 && me->collectives)
        ADD("; no rank kept the others waiting");
    if (heard < dps_g.size)
        ADD("; figures of %d of %d ranks (%s)", heard, dps_g.size,
            !barrier && DPS_POLICY_ENUM(&dps_g.policy, guard, exit_barrier) == DPS_V_guard_exit_barrier_off
                ? "[guard] exit_barrier = off"
            : !barrier ? "no exit barrier: the ranks never talked"
                       : "the others left without a word or are still running");
    if (dps_e.aside) ADD("; dpshim stepped aside: the script distributes itself (%s)", dps_e.aside_why);
    if (!dps_e.shared_work && !dps_e.aside) ADD("; no work was shared out (see the warning above)");
    const char *dir = dps_diag_dir();
    if (dir)
        ADD("; more: dpshim-diag report %s", dir);
    else
        ADD("; more: [diag] dir = DIR keeps per-rank figures and traces for dpshim-diag report DIR");
#undef ADD
    DPS_NOTE("SUMMARY", "%s", line);
}
