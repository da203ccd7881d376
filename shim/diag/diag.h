/* Diagnostics files ([diag] dir): per-rank statistics and an event trace, written at exit of
 * each rank process in the versioned text format of diag_format.h, which tools/dpshim-diag
 * reads. Off (one branch per collective) when [diag] dir is empty. */
#ifndef DPS_DIAG_H
#define DPS_DIAG_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/dps.h"
#include "diag_format.h"

/* Counted always: the file policy's effects. */
typedef struct dps_diag_counters {
    atomic_uint_fast64_t sinks, noops, followed, rank_paths;
} dps_diag_counters_t;
extern dps_diag_counters_t dps_diag_count;

/* Starts a fresh record from s's policy ([diag] dir, trace_mb); s is read again at writing. */
void dps_diag_configure(const dps_state_t *s);
/* [diag] dir is set in this process: collectives are timed only then. */
extern int dps_diag_on;
uint64_t dps_diag_now(void); /* wall-clock ns, comparable across the ranks of a node */
/* A collective of the main thread: hook, payload bytes, its number and the step it follows. */
void dps_diag_collective(const char *hook, uint64_t bytes, uint64_t begin_ns, uint64_t end_ns, uint64_t seq,
                         uint64_t step);
/* A collective of the progress thread ([comm] overlap), numbered apart from the main thread's. */
void dps_diag_background(const char *hook, uint64_t bytes, uint64_t begin_ns, uint64_t end_ns, uint64_t seq,
                         uint64_t step);
void dps_diag_step(uint64_t step);
/* What a rank counted so far, [diag] dir or not, for the exit summary: dp_step_end calls, the
 * main thread's collectives, the bytes reduced by both threads, the main thread's time inside
 * collectives, and the wall time from start-up to the program's exit (or to now while it runs;
 * never 0 in a rank process). The stats file
 * carries the same counters. */
typedef struct dps_diag_tally {
    uint64_t steps, collectives, bytes, comm_ns, wall_ns;
} dps_diag_tally_t;
void dps_diag_tally(dps_diag_tally_t *out);
/* The program is leaving (the rank's exit work starts): its wall time ends here, in the tally and
 * the stats file alike, whatever the exit barrier then waits for. Once; later calls keep it. */
void dps_diag_leaving(void);
/* [diag] dir made absolute, or NULL when no files are written. */
const char *dps_diag_dir(void);
/* This rank's wall clock minus rank 0's (dps_diag_now on each), and the bound on its error, as
 * start-up measured them: recorded in the stats so that the report can put every rank's events on
 * rank 0's clock. Kept across dps_diag_configure, since the clocks do not change with the policy;
 * without a call the stats say clock_measured 0. */
void dps_diag_set_clock(int64_t offset_ns, uint64_t error_ns);
/* At exit of the rank process. Safe while other threads record: they wait for the files. */
void dps_diag_write(void);
/* The guard is about to end the job: say why in the stats, record the collective still in
 * flight (when in_flight_seq > 0; it began ago_ns ago), and write the files now. */
/* At exit: no hook shared out work in a job of several ranks; head, then what was found. */
void dps_diag_nothing_shared(const char *head, const char *why);
/* Elastic mode: the job went on without a rank ("rank 2 in step 3 (its process ended)"); each
 * loss is added to the rank's record. */
void dps_diag_lost(const char *what);
void dps_diag_fail(const char *why, const char *hook, uint64_t in_flight_seq, uint64_t ago_ns, uint64_t step);

#endif
