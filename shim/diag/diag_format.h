/* The format of the diagnostics files, declared once for their writer (shim/diag/diag.c) and
 * their reader (tools/diag_report.c), as Darshan shares its log format between runtime and parser:
 * both expand the tables below, so a key or a column added here is written and read alike.
 * Plain C and <stdint.h> only: the tools include this header without the rest of the shim. */
#ifndef DPS_DIAG_FORMAT_H
#define DPS_DIAG_FORMAT_H

#include <stdint.h>

/* Each file opens with its magic word and this number; the reader refuses other versions.
 * Version 2: the hook is the rest of a trace line (names may hold spaces); dropped_events.
 * Version 3: clock_measured, clock_offset_ns (the first signed key), clock_error_ns.
 * Version 5: nothing_shared. */
#define DPS_DIAG_FORMAT_VERSION 5
#define DPS_DIAG_STATS_MAGIC "dpshim-stats"
#define DPS_DIAG_TRACE_MAGIC "dpshim-trace"

/* The files of rank N in [diag] dir: printf formats of the rank. */
#define DPS_DIAG_STATS_FILE "stats.rank%d.txt"
#define DPS_DIAG_TRACE_FILE "trace.rank%d.txt"

/* The stats file after its first line: one "key value" line per key, in this order. NUM values
 * are unsigned decimal numbers (uint64_t), SNUM values signed ones (int64_t, a leading '-' when
 * negative); TEXT values are the rest of the line, and a key whose text is empty is left out. A
 * key is also the name of its field in dps_diag_stats_t. A key the reader does not find stays 0. */
#define DPS_DIAG_STATS(NUM, SNUM, TEXT)                                                                      \
    /* who: the rank, the job's size, the rank on its node, its host, what started the job */                \
    NUM(rank)                                                                                                \
    NUM(size)                                                                                                \
    NUM(local_rank)                                                                                          \
    TEXT(host, 256)                                                                                          \
    TEXT(launcher, 32)                                                                                       \
    /* wall clock at start-up and when the files were written; dp_step_end calls */                          \
    NUM(start_ns)                                                                                            \
    NUM(end_ns)                                                                                              \
    NUM(steps)                                                                                               \
    /* these times and the trace's are this host's wall clock; the report puts them on rank 0's */           \
    /* by subtracting clock_offset_ns: this rank's clock minus rank 0's, measured at start-up by a */        \
    /* ping-pong with rank 0, with clock_error_ns as its bound (half the best round trip). */                \
    /* clock_measured 0: no offset was measured (a job of one rank, or the start-up did not compare) */      \
    NUM(clock_measured)                                                                                      \
    SNUM(clock_offset_ns)                                                                                    \
    NUM(clock_error_ns)                                                                                      \
    /* the main thread's collectives (count, bytes moved, time inside), then the progress */                 \
    /* thread's ([comm] overlap), counted apart */                                                           \
    NUM(collectives)                                                                                         \
    NUM(bytes)                                                                                               \
    NUM(comm_ns)                                                                                             \
    NUM(bg_collectives)                                                                                      \
    NUM(bg_bytes)                                                                                            \
    NUM(bg_comm_ns)                                                                                          \
    /* the file policy's effects: writes sent to a sink on ranks other than 0, calls without */              \
    /* effect there, gated calls that took rank 0's outcome, per-rank paths */                               \
    NUM(gated_sinks)                                                                                         \
    NUM(gated_noops)                                                                                         \
    NUM(followed)                                                                                            \
    NUM(rank_paths)                                                                                          \
    /* events past [diag] trace_mb: counted above, missing from the trace */                                 \
    NUM(dropped_events)                                                                                      \
    /* why the guard ended the job */                                                                        \
    TEXT(failure, 512)                                                                                       \
    /* [elastic] lost_rank = continue: the ranks the job went on without, as this rank saw them */           \
    TEXT(lost, 512)                                                                                          \
    /* a job of 2 or more ranks in which no hook shared out any work: what was found */                      \
    TEXT(nothing_shared, 1200)

typedef struct dps_diag_stats {
#define DPS_DIAG_NUM_FIELD_(key) uint64_t key;
#define DPS_DIAG_SNUM_FIELD_(key) int64_t key;
#define DPS_DIAG_TEXT_FIELD_(key, len) char key[len];
    DPS_DIAG_STATS(DPS_DIAG_NUM_FIELD_, DPS_DIAG_SNUM_FIELD_, DPS_DIAG_TEXT_FIELD_)
#undef DPS_DIAG_NUM_FIELD_
#undef DPS_DIAG_SNUM_FIELD_
#undef DPS_DIAG_TEXT_FIELD_
} dps_diag_stats_t;

/* The trace file after its first line: a line naming the columns, then one line per event: the
 * kind (one character), the numbers below, and the hook's name, which is the rest of the line
 * (a declarative hook is named "[hook NAME] symbol", spaces and all). */
typedef enum dps_diag_kind {
    DPS_DIAG_COLLECTIVE = 'c', /* of the main thread, numbered by the guard */
    DPS_DIAG_BACKGROUND = 'b', /* of the progress thread ([comm] overlap), numbered apart */
    DPS_DIAG_STEP = 's',       /* a step's end (dp_step_end): begin_ns = end_ns */
} dps_diag_kind_t;

#define DPS_DIAG_TRACE_FIELDS(X) X(begin_ns) X(end_ns) X(seq) X(step) X(bytes)
#define DPS_DIAG_COLUMN_(field) " " #field
#define DPS_DIAG_TRACE_COLUMNS "# kind" DPS_DIAG_TRACE_FIELDS(DPS_DIAG_COLUMN_) " hook"

/* One event. The hook is an index into a table of names that each side keeps for itself: names
 * repeat on every step. */
typedef struct dps_diag_event {
#define DPS_DIAG_EVENT_FIELD_(field) uint64_t field;
    DPS_DIAG_TRACE_FIELDS(DPS_DIAG_EVENT_FIELD_)
#undef DPS_DIAG_EVENT_FIELD_
    uint32_t hook;
    char kind; /* a dps_diag_kind_t */
} dps_diag_event_t;

#endif
