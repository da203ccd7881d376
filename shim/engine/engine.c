/* Engine configuration and backend life cycle. */
#define _GNU_SOURCE
#include "engine.h"
#include "files/files.h"
#include "guard/guard.h"
#include "device.h"
#include "elastic.h"
#include "progress.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const dps_files_channel_t files_channel; /* below, next to the backend's opening */

DPS_STARTUP int dps_engine_configure(dps_state_t *s, char *err, size_t errlen)
{
    const dps_policy_t *p = &s->policy;
    if (dps_policy_unavailable(p, err, errlen)) return -1;
    int self = DPS_POLICY_ENUM(p, comm, backend) == DPS_V_comm_backend_self;
    s->eff_rank = self ? 0 : s->rank;
    s->eff_size = self ? 1 : s->size;
    dps_elastic_plan(s);
    if (self && s->size > 1 && s->rank == 0)
        DPS_WARN("[comm] backend = self with %d ranks: every rank trains alone on all the data", s->size);
    s->split_mode = DPS_POLICY_ENUM(p, data, mode) == DPS_V_data_mode_split;
    s->reduce_sum = DPS_POLICY_ENUM(p, comm, reduce) == DPS_V_comm_reduce_sum;
    s->bn_sync = DPS_POLICY_ENUM(p, bn, sync) == DPS_V_bn_sync_on;
    s->uneven = (int)dps_policy_num(p, DPS_P_data_uneven);
    s->bucket_bytes = (size_t)dps_policy_num(p, DPS_P_comm_bucket_mb) << 20;
    /* auto is decided for the whole job when the backend opens (agree.c) */
    s->overlap = DPS_POLICY_ENUM(p, comm, overlap) == DPS_V_comm_overlap_on;
    s->compress_dtype = DPS_POLICY_ENUM(p, comm, compress) == DPS_V_comm_compress_fp16   ? DP_F16
                        : DPS_POLICY_ENUM(p, comm, compress) == DPS_V_comm_compress_bf16 ? DP_BF16
                                                                                         : -1;
    dps_e.be = s->eff_size == 1 ? &dps_backend_self : NULL;
    if (s->eff_size > 1) {
        dps_files_set_channel(&files_channel);
        dps_guard_on_place(dps_files_at_place); /* where rank 0's writes can be told complete */
    }
    /* host buffers, and the agreement on GPU tensors' mode (engine/device.c) */
    dps_e.be_name = "mpi";
    return 0;
}

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* Opens the backend for `hook` under the guard (its watchdog covers the start-up, which waits
 * for every rank), then the job-wide agreement. A failure is fatal, or with !fatal (at exit)
 * a warning and -1. */
static int open_backend(const char *hook, int fatal)
{
    pthread_mutex_lock(&open_lock);
    if (!dps_e.be) {
        char err[1024];
        dps_guard_mark_t mark = dps_guard_opening(hook);
        const dps_backend_t *be =
            dps_backend_open(dps_e.be_name, dps_g.eff_rank, dps_g.eff_size, err, sizeof err);
        if (!be) {
            if (fatal) dps_fatal("%s: %s", hook, err);
            DPS_WARN("%s: %s", hook, err);
            pthread_mutex_unlock(&open_lock);
            return -1;
        }
        DPS_INFO("%s backend opened by %s", be->name, hook);
        dps_guard_start(be);
        dps_engine_agree(be, hook);
        dps_guard_own_end(mark);
        if (be->set_sizes)
            be->set_sizes((size_t)dps_policy_num(&dps_g.policy, DPS_P_comm_piece_kb) << 10,
                          (size_t)dps_policy_num(&dps_g.policy, DPS_P_comm_shm_kb) << 10);
        dps_elastic_setup(be);
        __atomic_store_n(&dps_e.be, be, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&open_lock);
    return 0;
}

const dps_backend_t *dps_comm(const char *hook)
{
    dps_elastic_hook_begin(); /* every hook call asks first: what a loss in it changes is its own */
    if (DPS_LIKELY(dps_e.be == &dps_backend_self)) return NULL;
    if (DPS_UNLIKELY(dps_e.scope_depth)) {
        if (dps_g.eff_rank == 0)
            DPS_WARN_ONCE("%s inside rank-0 scope '%s': it acts as world size 1 here (no other rank "
                          "takes part), so it cannot block",
                          hook, dps_e.scope_name ? dps_e.scope_name : "");
        else
            DPS_WARN_ONCE("%s inside rank-0 scope '%s' on a rank that should skip its body; it "
                          "acts as world size 1 here",
                          hook, dps_e.scope_name ? dps_e.scope_name : "");
        return NULL;
    }
    /* the first process of the rank's tree to reach a collective holds the rank's place (claim.c):
     * the rank process, or the trainer a wrapper started; a forked worker never */
    int forked = atomic_load_explicit(&dps_g.forked, memory_order_relaxed);
    if (DPS_UNLIKELY(forked || (!__atomic_load_n(&dps_e.be, __ATOMIC_ACQUIRE) && !dps_claim_rank()))) {
        if (dps_g.role == DPS_ROLE_RANK && !forked)
            dps_fatal(
                "%s in rank %d's process %d, but its child %d took the rank's place in the job by calling a "
                "hook first: the job can have one process per rank. Launch the trainer itself (mpirun ... "
                "env LD_PRELOAD=libdpshim.so ./trainer), and let a program that starts other programs call "
                "its first hook before it starts them",
                hook, dps_g.rank, (int)getpid(), dps_rank_owner());
        DPS_WARN_ONCE("%s called in process %d, a child of rank %d's process, which holds the rank's place: "
                      "children never enter collectives, so it acts as world size 1 here",
                      hook, (int)getpid(), dps_g.rank);
        return NULL;
    }
    if (DPS_UNLIKELY(dps_e.released)) {
        DPS_WARN_ONCE("%s after the program's MPI_Finalize: no collective is possible any more; "
                      "it acts as world size 1",
                      hook);
        return NULL;
    }
    const dps_backend_t *be = __atomic_load_n(&dps_e.be, __ATOMIC_ACQUIRE);
    if (DPS_LIKELY(be)) return be;
    if (open_backend(hook, 1) != 0) return NULL; /* not reached: fatal */
    return dps_e.be;
}

/* The file policy's channel (files.h): from the job's first collective on (the backend opens
 * there, at one point of the program on every rank), outside rank-0 scopes, while the backend
 * lives. The file policy never opens the backend itself: a rank process that never calls a hook
 * (a shell script) would then hold an MPI it leaves without finalizing. NULL: the ranks decide
 * alone. */
static const dps_backend_t *files_backend(void)
{
    if (dps_e.scope_depth || dps_e.released) return NULL;
    const dps_backend_t *be = __atomic_load_n(&dps_e.be, __ATOMIC_ACQUIRE);
    return be && be->files_post && be->files_wait && be->files_poll && be->files_ack && be->files_next_ack
               ? be
               : NULL;
}

static int files_post(const void *msg, size_t len)
{
    const dps_backend_t *be = files_backend();
    return be ? be->files_post(msg, len) : -1;
}

/* The main thread's waits are watched by the guard like a collective; another thread's are not
 * (the guard tracks one position, the main thread's). */
typedef struct files_watch {
    int on;
    dps_guard_mark_t mark;
} files_watch_t;

static files_watch_t files_watch_begin(const char *what, int for_rank0)
{
    files_watch_t w = {gettid() == getpid(), {0}};
    if (w.on) w.mark = dps_guard_files_wait_begin(what, for_rank0);
    return w;
}

static void files_watch_end(files_watch_t w)
{
    if (w.on) dps_guard_own_end(w.mark);
}

/* Where the job goes on after a loss, the wait polls, to leave it when the rank it waits for is
 * lost (the main thread then takes part in the survivors' agreement); the first polls spin, as the
 * blocking wait would, then in naps. A loss of another rank leaves it alone: the leader answers,
 * and every rank meets the agreement at its next collective. */
static int files_wait(void *msg, size_t len, const char *what)
{
    const dps_backend_t *be = files_backend();
    if (!be) return -1;
    files_watch_t w = files_watch_begin(what, 1);
    int rc;
    if (!dps_elastic_on()) {
        rc = be->files_wait(msg, len);
    } else {
        for (unsigned polls = 0;; polls++) {
            int got = be->files_poll(msg, len); /* 1: a message came */
            if (got != 0 || dps_guard_leader_lost()) {
                rc = got == 1 ? 0 : got < 0 ? -1 : DPS_FILES_RANK_LOST;
                break;
            }
            if (polls > 4096) {
                struct timespec nap = {0, 50000};
                nanosleep(&nap, NULL);
            }
        }
    }
    files_watch_end(w);
    return rc;
}

/* The survivors' agreement, from the main thread's file wait the leader's loss ended. */
static int files_recover(const char *what)
{
    const dps_backend_t *be = files_backend();
    if (!be || gettid() != getpid()) return -1;
    dps_elastic_recover(be, what, 0, NULL, 0);
    return 0;
}

static int files_poll(void *msg, size_t len)
{
    const dps_backend_t *be = files_backend();
    return be ? be->files_poll(msg, len) : -1;
}

static int files_ack(const void *msg, size_t len)
{
    const dps_backend_t *be = files_backend();
    return be ? be->files_ack(msg, len) : -1;
}

static int files_next_ack(void *msg, size_t len, int *src, const char *what)
{
    const dps_backend_t *be = files_backend();
    if (!be) return -1;
    files_watch_t w = files_watch_begin(what, 0);
    int rc = be->files_next_ack(msg, len, src);
    files_watch_end(w);
    return rc == DPS_BACKEND_ABANDONED ? DPS_FILES_RANK_LOST : rc;
}

static const dps_files_channel_t files_channel = {
    files_post, files_wait, files_poll, files_ack, files_next_ack, files_recover, dps_guard_rank_lost};

/* A rank that leaves before its first collective still takes part in the exit barrier, for which
 * it opens the backend now: the others may be waiting for it in the backend's start-up, and
 * would wait forever (a launcher does not end a job when a rank exits with status 0). */
void dps_engine_join_at_exit(void)
{
    const char *l = dps_g.launcher;
    if (dps_e.be || dps_e.released || dps_g.eff_size == 1 || dps_g.role != DPS_ROLE_RANK ||
        atomic_load(&dps_g.forked) ||
        DPS_POLICY_ENUM(&dps_g.policy, guard, exit_barrier) != DPS_V_guard_exit_barrier_on ||
        !strcmp(l, "torchrun") || !strcmp(l, "singleton"))
        return;
    DPS_DEBUG("exit before the first collective: joining the others at the exit barrier");
    open_backend("exit (before any collective)", 0);
}

void dps_engine_shutdown(void)
{
    dps_progress_stop();
    dps_device_shutdown();
    if (dps_e.be && dps_e.be != &dps_backend_self && dps_e.be->tuning()[0] && dps_g.rank == 0)
        DPS_INFO("%s backend: %s", dps_e.be->name, dps_e.be->tuning());
    /* After a lost rank, MPI_Finalize waits in the launcher's fence for a process that will never
     * come (seen: Open MPI 4.1 under --enable-recovery, now and then): the survivors leave without
     * it, which a launcher that keeps survivors running accepts (one that does not has ended
     * them by now). */
    if (dps_elastic_shrunk() || dps_guard_ranks_gone()) return;
    if (dps_e.be && dps_e.be != &dps_backend_self) dps_e.be->finalize();
}

void dps_engine_before_mpi_finalize(void)
{
    dps_progress_stop();
    dps_guard_exit(); /* the guard talks over MPI: done before the program finalizes it */
    if (dps_e.be && dps_e.be != &dps_backend_self) dps_e.be->release();
    dps_e.released = 1;
}

int dps_engine_owns_mpi_init(void)
{
    return dps_e.be && dps_e.be != &dps_backend_self && dps_e.be->owns_mpi_init();
}
