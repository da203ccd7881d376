/* Start-up and tear-down of libdpshim in every process that preloads it: identity, policy,
 * engine configuration before main(); backend and PMIx finalization at exit. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "start.h"

#include "diag/diag.h"
#include "engine/elastic.h"
#include "engine/engine.h"
#include "ffi/ffihooks.h"
#include "files/files.h"
#include "gpu/bind.h"
#include "guard/guard.h"
#include "output/output.h"
#include "core/sys.h"

extern char **environ;

static void on_fork_child(void)
{
    /* A fork child (a DataLoader-style worker) shares the parent's communicator state but is
     * not a member of the job: it must never enter a collective or finalize MPI/PMIx. */
    atomic_store(&dps_g.forked, 1);
}

/* The rank process's exit work; 0 where this process has none (a fork child, a child of the rank,
 * a wrapper whose child held the rank's place). */
static int exit_work(void)
{
    if (atomic_load(&dps_g.forked)) return 0;
    if (dps_g.role != DPS_ROLE_RANK) return 0; /* a child has no guard, diagnostics, PMIx or backend */
    int holder = dps_rank_owner();
    if (holder && holder != (int)getpid()) {
        /* a wrapper: the trainer it started held the rank's place and did the exit work */
        DPS_DEBUG("exit: process %d held the rank's place", holder);
        return 0;
    }
    DPS_DEBUG("exit: finalizing the backend and PMIx");
    dps_diag_leaving();
    int nothing_shared = dps_check_something_shared();
    dps_files_leaving(); /* rank 0 writes no more: a rank waiting for it goes on */
    dps_engine_join_at_exit();
    dps_guard_exit();
    dps_elastic_at_exit();
    dps_diag_write();
    dps_summary_at_exit();
    /* PMIx first: Open MPI shares the PMIx client, and the launcher counts the process as
     * finalized only when the last reference goes, which must be MPI's own. */
    dps_bootstrap_finalize();
    dps_engine_shutdown();
    /* a save that failed on rank 0 and was swallowed must not end as a job that succeeded; last,
     * as the program's other exit work is done by now */
    if (dps_files_exit_check()) dps_exit_now(DPS_EXIT_IO);
    if (nothing_shared) dps_exit_now(DPS_EXIT_CONFIG);
    return 1;
}

/* The program's own exit status (exit(3), a Python exception's 1), left for dpshim-run once the
 * exit work above is done: it may end the process with a status of its own instead. */
static void at_exit_with_status(int status, void *arg)
{
    (void)arg;
    if (exit_work()) dps_exit_status_note(status);
}

/* Children must find the same policy after a chdir (system("cd sub && ...")), and so must this
 * process after a chdir and an exec: a relative path (DPSHIM_POLICY=p.conf, or ./dpshim.conf
 * found) is resolved once, here, against the directory the process started in, and exported. */
DPS_STARTUP static void export_policy_path(void)
{
    char abs[PATH_MAX];
    if (dps_g.policy.file[0] && dps_g.policy.file[0] != '/' && realpath(dps_g.policy.file, abs))
        setenv(DPS_ENV_POLICY, abs, 1);
}

DPS_STARTUP_DATA static atomic_int fork_work_registered, exit_work_registered;

static void register_fork_work(void)
{
    if (!atomic_exchange(&fork_work_registered, 1)) pthread_atfork(NULL, NULL, on_fork_child);
}

static void register_exit_work(void)
{
    register_fork_work();
    if (!atomic_exchange(&exit_work_registered, 1)) on_exit(at_exit_with_status, NULL);
}

/* A child that took the rank's place (claim.c): what start-up gives a rank process and a child
 * lacks. The output policy and the GPU binding came with the environment it inherited. */
static void became_rank(void)
{
    dps_bootstrap_export_marker(); /* its children are its own now */
    dps_diag_configure(&dps_g);    /* its figures and [diag] dir start here */
    if (dps_g.size > 1) dps_guard_install_crash_handlers();
    register_exit_work();
}

static _Noreturn void stop_before_main(const char *msg, const char *hint)
{
    DPS_ERROR("%s [the program was not started%s]", msg, hint);
    dps_bootstrap_finalize();
    exit(DPS_EXIT_CONFIG);
}

static _Noreturn void config_error(const char *msg)
{
    stop_before_main(msg, "; dpshim-diag check FILE validates a policy file");
}

/* 1 when the environment entry e starts with prefix: compared by hand, as the first libc call of
 * each kind costs a process its lazy binding (and the page of libc it is on). */
DPS_STARTUP static int starts_with(const char *e, const char *prefix)
{
    while (*prefix && *e == *prefix)
        e++, prefix++;
    return !*prefix;
}

/* What the policy reads of the environment: its DPSHIM_ entries but the rank's marker, which is
 * bootstrap's (out has room for cap - 1 and the NULL; more than that, the whole environment).
 * Gathered in one pass, so that the policy's scans go over no entry or a few, not the whole
 * environment, in every process under the preload; the marker is in every process of a job. */
DPS_STARTUP static char **policy_environ(char **out, size_t cap)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++) {
        if (!starts_with(*e, "DPSHIM_") || starts_with(*e, DPS_ENV_RANK_PID "=")) continue;
        if (n + 1 == cap) return environ;
        out[n++] = *e;
    }
    out[n] = NULL;
    return out;
}

__attribute__((constructor)) static void dps_init(void)
{
    /* Everything start-up does is the shim's own work: the policy library's open and access,
     * and the others' file calls, resolve to the shim's interposers, and the re-entry guard makes
     * them pass straight through, whatever the file policy is by then. */
    dps_in_shim++;
    char err[1024];
    if (dps_bootstrap(&dps_g, err, sizeof err) != 0) stop_before_main(err, ""); /* the launch, not a policy */
    dps_policy_init(&dps_g.policy);
    dps_error_t e;
    char *ours[64];
    if (dps_policy_load(&dps_g.policy, policy_environ(ours, sizeof ours / sizeof *ours), &e) != 0)
        config_error(e.msg);
    atomic_store(&dps_log_level, (int)dps_policy_num(&dps_g.policy, DPS_P_diag_log));
    /* before the program's first CUDA call, which may come from any constructor after ours */
    dps_gpu_bind(&dps_g);
    dps_python_inject(&dps_g);
    dps_placement_check(&dps_g);
    dps_threads_share(&dps_g);
    if (dps_engine_configure(&dps_g, err, sizeof err) != 0) config_error(err);
    if (dps_files_configure(&dps_g.policy, dps_g.rank, dps_g.size, err, sizeof err) != 0) config_error(err);
    /* [hook] declarations describe the rank's framework, which its children (a shell, a
     * compiler) never load: binding there would only stop them with missing = error */
    if (dps_g.role == DPS_ROLE_RANK && dps_g.policy.nhooks &&
        dps_ffi_hooks_start(&dps_g.policy, err, sizeof err) != 0)
        config_error(err);
    dps_guard_configure(&dps_g);
    dps_diag_configure(&dps_g);
    /* a crash report says where a rank was for the others' sake: alone, there are no others */
    if (dps_g.role == DPS_ROLE_RANK && dps_g.size > 1) dps_guard_install_crash_handlers();
    export_policy_path();
    if (dps_g.role == DPS_ROLE_RANK && dps_output_setup(&dps_g) != 0)
        DPS_WARN("[output] stdout = %s could not be set up (%s); output is not filtered",
                 dps_policy_text(&dps_g.policy, DPS_P_output_stdout), strerror(errno));
    /* At fork, a rank's workers and the fork children of a process with [files] globs learn that
     * they are fork children. At exit, a rank of a job finishes its part, and so does a rank of
     * its own that records diagnostics, gates files or holds PMIx; one that does none of these
     * (a program started alone under the preload) has nothing to finish, and a child never has:
     * their exit runs none of the shim's code (a shell command, a compiler). */
    if (dps_g.role == DPS_ROLE_RANK &&
        (dps_g.size > 1 || dps_diag_on || atomic_load(&dps_files_on) || dps_bootstrap_pmix_up()))
        register_exit_work();
    else if (dps_g.role == DPS_ROLE_RANK || atomic_load(&dps_files_on))
        register_fork_work();
    dps_on_rank_claimed = became_rank;
    DPS_INFO("rank %d of %d (local %d of %d, launcher %s, %s process, policy %s)", dps_g.rank, dps_g.size,
             dps_g.local_rank, dps_g.local_size, dps_g.launcher,
             dps_g.role == DPS_ROLE_RANK ? "rank" : "child",
             dps_g.policy.file[0] ? dps_g.policy.file : "built-in defaults");
    dps_in_shim--;
}
