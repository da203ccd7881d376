/* dpshim-diag report: merge the per-rank diagnostics files of a [diag] dir. */
#ifndef DPS_DIAG_REPORT_H
#define DPS_DIAG_REPORT_H

#include <stddef.h>
#include <stdint.h>

/* Prints the merged table; writes a Chrome trace and/or an SVG timeline when asked. 0 on
 * success, 1 with a message on stderr otherwise. */
int dps_diag_report(const char *dir, const char *trace_out, const char *svg_out);

/* One step of a trainer, from rank 0's files (the window between its first and last step end). */
typedef struct dps_step_profile {
    int size;           /* ranks of the profiled job */
    double steps;       /* steps in the window */
    double step_s;      /* wall time per step */
    double compute_s;   /* of which outside collectives (the main thread's exposed waits) */
    double comm_s;      /* of which inside collectives */
    double wait_s;      /* of that, waiting for the last rank to arrive */
    double bytes;       /* all-reduced and broadcast bytes per step (both threads) */
    double collectives; /* collectives moving data per step */
} dps_step_profile_t;

/* 0, or -1 with err set. */
int dps_diag_profile(const char *dir, dps_step_profile_t *p, char *err, size_t errlen);

#endif
