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
#include "dpshim/hooks.h"

/* Exit status of a job the guard ended. */
#define DPS_EXIT_GUARD 75

void dps_guard_configure(const dps_state_t *s);
/* The rank process is up: crash reports. */
void dps_guard_install_crash_handlers(void);
/* The backend opened: the watchdog starts. Without a side channel (MPI below
 * MPI_THREAD_MULTIPLE) it watches this rank alone, and rank 0 warns once of what is off. */
void dps_guard_start(const dps_backend_t *be);
/* A collective the main thread hands to the progress thread: compared across ranks by the
 * desync checks like the main thread's own. */
void dps_guard_note(const char *hook, int collective, int32_t dtype, uint64_t count);
/* Around every collective of the main thread (and its waits for the progress thread). */
void dps_guard_enter(const char *hook, int collective, int32_t dtype, uint64_t count);
void dps_guard_leave(void);
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
/* At exit of the rank process, before the backend finalizes: the exit barrier. */
void dps_guard_exit(void);

/* The kinds of collective, and their names in reports. */
enum { DPS_COLL_ALLREDUCE, DPS_COLL_BCAST, DPS_COLL_BARRIER };
static inline const char *dps_coll_name(int coll)
{
    return coll == DPS_COLL_BCAST ? "broadcast" : coll == DPS_COLL_BARRIER ? "barrier" : "all-reduce";
}

#endif
