/* dpshim-diag report: merge the per-rank diagnostics files of a [diag] dir. */
#ifndef DPS_DIAG_REPORT_H
#define DPS_DIAG_REPORT_H

#include <stdint.h>

/* Prints the merged table; writes a Chrome trace and/or an SVG timeline when asked. 0 on
 * success, 1 with a message on stderr otherwise. */
int dps_diag_report(const char *dir, const char *trace_out, const char *svg_out);

#endif
