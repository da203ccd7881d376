/* What the guard's files share (guard.c: position and configuration, watchdog.c, checks.c,
 * crash.c); other folders use guard.h only. */
#ifndef DPS_GUARD_INTERNAL_H
#define DPS_GUARD_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "guard.h"

/* Room for a collective's hook name in messages between ranks: a declarative hook's is the
 * longest (policy/hookdecl.h). */
#define DPS_GUARD_HOOK_NAME DPS_HOOK_WHERE_MAX

/* Where the main thread is: written by it (relaxed stores, no lock: this is the collective path),
 * read by the watchdog, the checks and the crash handler. */
typedef struct dps_guard_pos {
    atomic_uint_fast64_t seq;      /* collectives entered so far (the current one's number) */
    atomic_int in_coll;            /* inside collective #seq */
    atomic_uint_fast64_t since_ns; /* when it entered, or when it last left one */
    atomic_uint_fast64_t step;
    _Atomic(const char *) hook; /* the current or last collective's hook */
    atomic_int coll, dtype;     /* coll < 0: one of the guard's own checks, not the program's */
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t call; /* the current or last collective's fingerprint (dps_guard_note) */
    atomic_int leaving;        /* the program is exiting */
    atomic_int before_next;    /* in the desync check of collective #seq + 1, which it is part of */
    atomic_int files_wait;     /* the shim's own wait is a file one: FILES_WAIT_RANK0, FILES_WAIT_ACKS */
} dps_guard_pos_t;
extern dps_guard_pos_t dps_guard_pos;
/* A wait for rank 0's file operation (only rank 0 ends it); rank 0's wait for the others' acks. */
enum { FILES_WAIT_RANK0 = 1, FILES_WAIT_ACKS = 2 };

/* What the policy asks of the guard, set before the program runs and read-only afterwards,
 * and the backend, set once when it opens. */
typedef struct dps_guard_conf {
    int on; /* a watchdog thread has work: a timeout or an exit barrier, more than one rank */
    int exit_barrier;
    dps_guard_desync_t desync;
    uint64_t drift_every;
    double timeout;    /* seconds; 0: no watchdog */
    int recovery_hint; /* [elastic] lost_rank = continue, but the launcher ends every rank at a loss */
    int rank, size;
    const dps_backend_t *be;
} dps_guard_conf_t;
extern dps_guard_conf_t dps_guard_conf;

/* The coarse clock: a few ms of resolution is plenty for timeouts of seconds, and reading it
 * costs next to nothing on the collective path. */
static inline uint64_t dps_guard_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t dps_guard_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* guard.c: asks this process's host name, once, for reports and the hosts table. In a rank process
 * of a job at start-up, else when the process opens the backend (a child that took the rank's
 * place): the shells and compilers a rank starts never report, and pay no system call for it. */
void dps_guard_note_host(void);

/* How many of the n keys equal each one, into votes_p (n entries): the ranks' answers are
 * compared by sorting, so a report stays quick at any job size. -1 when memory is short. */
int dps_guard_votes(const uint64_t *keys, int n, int *votes_p);

/* checks.c (with dps_guard_note and dps_guard_params): the desync checks (a fingerprint of every
 * collective, compared at step ends or before each call) and the drift check, on the backend's
 * side channel. */
void dps_guard_check_step(uint64_t step, int drift_due);
void dps_guard_check_drift(uint64_t step);

/* watchdog.c: ending a job that went wrong. The diagnostics files get the reason and the
 * collective this rank is stuck in (if it is); then the rank exits with DPS_EXIT_GUARD, after a
 * pause when another rank prints the report (the launcher ends the job at the first exit). */
void dps_guard_diag_fail(const char *why);
_Noreturn void dps_guard_end_job(int printed);

#endif
