/* The guard: no silent hangs. It tracks where the main thread is (which collective, which step),
 * and a watchdog thread talks to the other ranks over the backend's side channel: a collective
 * that waits longer than [guard] timeout, or one that a rank which already left can never join,
 * ends the job with one table of where every rank is. At exit a rank waits for the others
 * ([guard] exit_barrier), and a crashing rank says where it was before it dies. */
#ifndef DPS_GUARD_H
#define DPS_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "core/dps.h"
#include "diag/diag.h"
#include "dpshim/hooks.h"

/* A position saved while the shim runs collectives of its own (dps_guard_own_begin). */
typedef struct dps_guard_mark {
    const char *hook;
    int coll;
    int in_coll; /* inside a collective (the program's, or an outer wait of the shim's), which goes
                  * on after this wait */
} dps_guard_mark_t;

/* Exit status of a job the guard ended. */
#define DPS_EXIT_GUARD 75

void dps_guard_configure(const dps_state_t *s);
/* The rank process is up: crash reports. */
void dps_guard_install_crash_handlers(void);
/* The backend is about to open for `hook`: the watchdog covers its start-up (which waits for
 * every rank), reporting this rank alone until the side channel exists. Returns the position to
 * restore with dps_guard_own_end once the backend is open. */
dps_guard_mark_t dps_guard_opening(const char *hook);
/* The backend opened: the watchdog starts. Without a side channel (MPI below
 * MPI_THREAD_MULTIPLE) it watches this rank alone, and rank 0 warns once of what is off. */
void dps_guard_start(const dps_backend_t *be);
/* The tensor list of the hook call about to run (main thread): its length, sizes and dtypes
 * in order go into the next collective's fingerprint. */
void dps_guard_tensors(const dp_tensor *t, size_t n);
/* A collective the main thread hands to the progress thread: compared across ranks by the
 * desync checks like the main thread's own. Returns the call's fingerprint. */
uint64_t dps_guard_note(const char *hook, int collective, int32_t dtype, uint64_t count);
/* Around every collective of the main thread (and its waits for the progress thread). */
void dps_guard_enter(const char *hook, int collective, int32_t dtype, uint64_t count);
/* fn is called before each wait for every rank (a collective, a check of the guard's, start-up):
 * places every rank reaches in the same order. */
void dps_guard_on_place(void (*fn)(void));
void dps_guard_leave(void);
/* A collective of the main thread failed (the backend returned `what`), still marked as entered:
 * with a side channel the watchdog asks every rank where it is and prints the table (a rank that
 * called another collective, or the same with other sizes, is marked), then ends the job;
 * without one the rank ends with the error. */
_Noreturn void dps_guard_failed(const char *what);
/* After each optimizer step: the desync and drift checks the policy asks for, unless `alone`
 * (a rank-0 scope, where the other ranks skip the body and would never join a check). */
void dps_guard_step(uint64_t step, int alone);
/* The parameters the drift check compares (what dp_params last saw). */
void dps_guard_params(const dp_tensor *t, size_t n);
/* Collectives the main thread has entered so far: the number of the current or last one. */
uint64_t dps_guard_seq(void);
/* "collective #57 after step 6", for messages. */
void dps_guard_where(char *buf, size_t len);
/* Work the main thread queued without waiting for it (GPU collectives ordered before a stream
 * the framework named): at each look the watchdog asks `probe`, which returns 1 and describes
 * the oldest unfinished collective (hook and number) with its age, -1 and a description when
 * one failed, 0 when nothing is outstanding. Past [guard] timeout, or on a failure, the job
 * ends as for a collective of the main thread. */
typedef int (*dps_guard_probe_fn)(char *what, size_t len, double *age_s);
void dps_guard_set_probe(dps_guard_probe_fn probe);
/* How the drift check reads a tensor in GPU memory: copies t's bytes to `out` and returns 1, or
 * returns 0 for host memory (read in place), -1 on failure. Set by the GPU path. */
typedef int (*dps_guard_reader_fn)(const dp_tensor *t, void *out);
void dps_guard_set_reader(dps_guard_reader_fn reader);
/* Around the shim's own collectives (the checks, the start-up agreement): the watchdog covers
 * them as any collective, while they are not counted as the program's; `what` names it. */
dps_guard_mark_t dps_guard_own_begin(const char *what);
void dps_guard_own_end(dps_guard_mark_t prev);
/* The same for the file channel's waits: for rank 0's file operation (for_rank0; only rank 0's
 * call ends it: the watchdog asks rank 0 where it is, and a rank 0 inside a collective this rank
 * has not entered, or gone, ends the job at once), or rank 0's for the others' acks. */
dps_guard_mark_t dps_guard_files_wait_begin(const char *what, int for_rank0);
/* Every rank's host name (size entries of DPS_GUARD_HOST bytes, in rank order), gathered when the
 * backend opens: the guard's tables and messages name each rank's host. */
#define DPS_GUARD_HOST 64
void dps_guard_set_hosts(const char *hosts);
/* Every rank's process id (n entries, in rank order), gathered with the hosts: the processes of
 * this host are watched from here on (liveness.c). */
void dps_guard_set_pids(const uint32_t *pids, int n);
/* 1 where rank r ran on this host and its process has ended (or is a zombie), 0 where it runs or
 * cannot be seen from here (another host, another PID namespace). */
int dps_guard_peer_gone(int r);
/* Rank r's process id as gathered, 0 where unknown. */
uint32_t dps_guard_pid(int r);
/* Ends rank r's process with SIGKILL where it runs on this host and can be seen from here: 1 where
 * the signal went out, else 0 (another host, another PID namespace, already gone). */
int dps_guard_end_peer(int r);

/* Elastic mode: a lost rank does not end the job (watchdog.c, with survivors.c). Started once the
 * backend is open (0; -1 where it cannot be: no watchdog or side channel). From then on a rank
 * found lost (rank 0 too: the lowest survivor takes its place) goes to the survivors' agreement,
 * the desync and drift checks are off, and dps_guard_lost_pending says the main thread must give
 * up its collective. */
int dps_guard_elastic_start(int min_ranks);
int dps_guard_lost_pending(void);
/* Elastic mode, where a loss lets the job go on: rank r is lost; the rank that leads the gated
 * files (rank 0, or the lowest survivor) is. */
int dps_guard_rank_lost(int r);
int dps_guard_leader_lost(void);
/* How many ranks' processes ended without leaving the program, as the watchdog found them. */
int dps_guard_ranks_gone(void);
/* Why rank r was lost, for messages: "its process ended", "stalled ..." (found by the guard's
 * timeout, and ended), "no answer ..."; "" where r was not lost. */
const char *dps_guard_lost_cause(int r);
/* The survivors' decision, as the main thread uses it: the survivors' ranks in the job as it
 * started, in order (their index is their new rank), the cut (collectives completed by those
 * furthest on), the root among them (index) and each one's lag behind the cut (0 or 1). */
typedef struct dps_guard_decision {
    int n, root;
    uint32_t generation;
    uint64_t cut;
    int *ranks;             /* room for the job's size, the caller's */
    unsigned char *laggard; /* likewise */
    char why[192];          /* where there is no going on: why */
} dps_guard_decision_t;
/* Waits (this rank having completed `done` collectives) for the decision: 0, or -1 with `why`
 * where the job cannot go on: none came ([guard] timeout passed, or the survivors' counts are too
 * far apart), fewer than [elastic] min_ranks are left, or they are not a quorum: no more than half
 * of the ranks of the last decision (exactly half: without its lowest rank). A cut link leaves
 * each side believing the other lost; only one side may go on. */
int dps_guard_survivors(uint64_t done, dps_guard_decision_t *out);
/* The job went on among these ranks (of the job as it started): the others are no culprit of
 * what the guard reports later. */
void dps_guard_went_on(const int *ranks, int n);

/* [guard] desync = auto, as the ranks agreed it (step or full) when the backend opened. */
void dps_guard_set_desync(int desync);
/* Rank r's host: the gathered name, this process's own for r == rank, else "". */
const char *dps_guard_host(int r);
/* "rank 3 (nodeB)", or "rank 3" where the host is unknown, into buf. */
const char *dps_guard_who(int r, char *buf, size_t len);
/* At exit of the rank process, before the backend finalizes: the exit barrier. */
void dps_guard_exit(void);
/* On rank 0 (the lowest rank left, where rank 0 was lost) after the exit barrier: every rank's
 * figures (dps_diag_tally) as it left, size entries in rank order, wall_ns 0 for a rank not heard
 * from; NULL where there was no barrier ([guard] exit_barrier = off, no side channel, another
 * rank). */
const dps_diag_tally_t *dps_guard_exit_tallies(void);

/* The kinds of collective, and their names in reports. */
enum { DPS_COLL_ALLREDUCE, DPS_COLL_BCAST, DPS_COLL_BARRIER };
static inline const char *dps_coll_name(int coll)
{
    return coll == DPS_COLL_BCAST ? "broadcast" : coll == DPS_COLL_BARRIER ? "barrier" : "all-reduce";
}

#endif
