/* Start-up and tear-down of libdpshim in every process that preloads it: identity, policy,
 * engine configuration before main(); backend and PMIx finalization at exit. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dps.h"
#include "engine/engine.h"

extern char **environ;

dps_state_t dps_g = {.size = 1, .eff_size = 1, .launcher = "singleton"};

static void on_fork_child(void)
{
    /* A fork child (a DataLoader-style worker) shares the parent's communicator state but is
     * not a member of the job: it must never enter a collective or finalize MPI/PMIx. */
    atomic_store(&dps_g.forked, 1);
}

static void at_exit(void)
{
    if (atomic_load(&dps_g.forked)) return;
    DPS_DEBUG("exit: finalizing the backend and PMIx");
    /* PMIx first: Open MPI shares the PMIx client, and the launcher counts the process as
     * finalized only when the last reference goes, which must be MPI's own. */
    dps_bootstrap_finalize();
    dps_engine_shutdown();
    DPS_DEBUG("exit: done");
}

static _Noreturn void config_error(const char *msg)
{
    DPS_ERROR("%s", msg);
    DPS_ERROR("the program was not started; fix the policy or environment (check a file with "
              "'dpshim-diag check FILE')");
    dps_bootstrap_finalize();
    exit(DPS_EXIT_CONFIG);
}

__attribute__((constructor)) static void dps_init(void)
{
    char err[1024];
    if (dps_bootstrap(&dps_g, err, sizeof err) != 0) config_error(err);
    dps_policy_init(&dps_g.policy);
    dps_error_t e;
    if (dps_policy_load(&dps_g.policy, environ, &e) != 0) config_error(e.msg);
    atomic_store(&dps_log_level, (int)dps_policy_num(&dps_g.policy, DPS_P_diag_log));
    if (dps_engine_configure(&dps_g, err, sizeof err) != 0) config_error(err);
    pthread_atfork(NULL, NULL, on_fork_child);
    atexit(at_exit);
    DPS_INFO("rank %d of %d (local %d of %d, launcher %s, %s process, policy %s)", dps_g.rank,
             dps_g.size, dps_g.local_rank, dps_g.local_size, dps_g.launcher,
             dps_g.role == DPS_ROLE_RANK ? "rank" : "child",
             dps_g.policy.file[0] ? dps_g.policy.file : "built-in defaults");
}
