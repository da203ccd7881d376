/* Who am I in the job: rank, world size, local rank. The launchers' environment (Open MPI,
 * PMI, Slurm, torchrun), else PMIx (opened with dlopen), else a singleton.
 * Why PMIx is not asked first when the environment already answers: a launcher counts a
 * process that called PMIx_Init as a member that must finalize, so a rank process that leaves
 * with _exit (a shell, Python's os._exit) would make mpirun fail the whole job, and Open MPI
 * cannot initialize PMIx again after the shim finalized it early. Where the environment has no
 * identity (a bare PMIx launcher such as prterun), PMIx is the source. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pmix.h>

#include "dps.h"
#include "sys.h"

/* One row per launcher whose environment tells the rank; checked in this order. */
typedef struct launcher_env {
    const char *name, *rank, *size, *local_rank, *local_size;
} launcher_env_t;

static const launcher_env_t launcher_envs[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
};

/* The number in [0, INT32_MAX] at s, which must end at `stop`; -2 when it is anything else.
 * *next_p: just past the stop character. What strtol accepts (leading blanks, a sign), read by
 * hand: every process under the preload reads its identity here, and strtol's code and locale
 * tables are pages of libc that a short process would touch for this alone. */
DPS_STARTUP static long read_count(const char *s, char stop, const char **next_p)
{
    while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
        s++;
    int minus = *s == '-';
    s += minus || *s == '+';
    const char *digits = s;
    long x = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        if ((x = x * 10 + (*s - '0')) > INT32_MAX) return -2;
    if (s == digits || *s != stop || (minus && x)) return -2;
    *next_p = s + 1;
    return x;
}

/* -1 when unset; -2 when set but not a number in [0, INT32_MAX]. */
DPS_STARTUP static long env_int(const char *name)
{
    const char *v = name ? getenv(name) : NULL, *next;
    return v ? read_count(v, '\0', &next) : -1;
}

DPS_STARTUP_DATA static struct { /* asked at start-up (up) by every rank process */
    void *lib;
    pmix_status_t (*init)(pmix_proc_t *, pmix_info_t *, size_t);
    pmix_status_t (*finalize)(const pmix_info_t *, size_t);
    pmix_status_t (*get)(const pmix_proc_t *, const char *, const pmix_info_t *, size_t, pmix_value_t **);
    pmix_proc_t me;
    int up;
} pmix;

static long pmix_get_uint(const pmix_proc_t *p, const char *key)
{
    pmix_value_t *v = NULL;
    long r = -1;
    if (pmix.get(p, key, NULL, 0, &v) != PMIX_SUCCESS || !v) return -1;
    switch (v->type) {
    case PMIX_UINT32:
        r = (long)v->data.uint32;
        break;
    case PMIX_UINT16:
        r = (long)v->data.uint16;
        break;
    case PMIX_INT:
        r = v->data.integer;
        break;
    case PMIX_UINT:
        r = (long)v->data.uint;
        break;
    default:
        break;
    }
    free(v); /* scalar values own no other memory */
    return r;
}

/* Returns 1 when PMIx gave the identity, 0 when PMIx is not there. */
static int bootstrap_pmix(dps_state_t *s)
{
    if (!getenv("PMIX_NAMESPACE") || !getenv("PMIX_RANK")) return 0;
    pmix.lib = dlopen("libpmix.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!pmix.lib) {
        DPS_INFO(
            "PMIx environment present but libpmix.so.2 not loadable (%s); using the launcher environment",
            dlerror());
        return 0;
    }
    *(void **)&pmix.init = dlsym(pmix.lib, "PMIx_Init");
    *(void **)&pmix.finalize = dlsym(pmix.lib, "PMIx_Finalize");
    *(void **)&pmix.get = dlsym(pmix.lib, "PMIx_Get");
    if (!pmix.init || !pmix.finalize || !pmix.get) return 0;
    pmix_status_t rc = pmix.init(&pmix.me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        DPS_INFO("PMIx_Init failed (status %d); using the launcher environment", (int)rc);
        return 0;
    }
    pmix.up = 1;
    pmix_proc_t job = pmix.me;
    job.rank = PMIX_RANK_WILDCARD;
    long size = pmix_get_uint(&job, PMIX_JOB_SIZE);
    long local_rank = pmix_get_uint(&pmix.me, PMIX_LOCAL_RANK);
    long local_size = pmix_get_uint(&job, PMIX_LOCAL_SIZE);
    if (size <= 0 || (long)pmix.me.rank >= size) return 0;
    s->rank = (int)pmix.me.rank;
    s->size = (int)size;
    s->local_rank = local_rank >= 0 ? (int)local_rank : 0;
    s->local_size = local_size > 0 ? (int)local_size : 1;
    s->local_source = local_size > 0 ? "PMIx (PMIX_LOCAL_SIZE)" : "PMIx, without a local size (1 taken)";
    s->local_size_guessed = local_size <= 0;
    s->local_rank_source =
        local_rank >= 0 ? "PMIx (PMIX_LOCAL_RANK)" : "PMIx, without a local rank (0 taken)";
    s->launcher = "pmix";
    return 1;
}

int dps_bootstrap_pmix_up(void)
{
    return pmix.up;
}

void dps_bootstrap_finalize(void)
{
    if (pmix.up && !atomic_load(&dps_g.forked)) pmix.finalize(NULL, 0);
    pmix.up = 0;
}

DPS_STARTUP static int pmix_server_in_env(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, "PMIX_SERVER_URI", 15)) return 1;
    return 0;
}

/* Open MPI's launchers (ORTE's mpirun, PRRTE) always give their processes a way back to them: a
 * PMIx server's address, or ORTE's daemon's. OMPI_COMM_WORLD_* without one were left in a shell
 * by an earlier job (or exported by hand), and no peer will ever come. */
DPS_STARTUP static int openmpi_launcher_alive(void)
{
    return getenv("OMPI_MCA_orte_hnp_uri") || getenv("OMPI_MCA_orte_local_daemon_uri") ||
           pmix_server_in_env();
}

#ifndef DPS_MPI_LIBDIR
#define DPS_MPI_LIBDIR "/usr/lib"
#endif

/* Whether the Open MPI that libdpshim-mpi.so is built with can join a job started without PMIx
 * (srun --mpi=pmi2, MPICH's PMI): only an Open MPI built --with-pmi has the pmix/s1 and s2
 * components for that; Debian's has neither. 1 also where it cannot be told (its components are
 * not where the build found them), so that nothing is refused on a guess. */
DPS_STARTUP static int mpi_joins_without_pmix(void)
{
    const char *relocated = getenv("OPAL_PKGLIBDIR");
    const char *dirs[] = {relocated, DPS_MPI_LIBDIR "/openmpi3", DPS_MPI_LIBDIR "/openmpi"};
    char path[1024];
    int seen = 0;
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        if (!dirs[i] || dps_sys_access(dirs[i], F_OK) != 0) continue;
        seen = 1;
        for (int k = 1; k <= 2; k++) {
            snprintf(path, sizeof path, "%s/mca_pmix_s%d.so", dirs[i], k);
            if (dps_sys_access(path, F_OK) == 0) return 1;
        }
    }
    return !seen;
}

/* Slurm's tasks on node `node` from a tasks-per-node list such as "2(x3),1" (2 on each of the
 * first three nodes, 1 on the fourth); -1 when the list does not say. */
DPS_STARTUP static long slurm_tasks_on_node(const char *spec, long node)
{
    long seen = 0;
    for (const char *p = spec; p && *p;) {
        char *end;
        long n = strtol(p, &end, 10), reps = 1;
        if (end == p || n < 0) return -1;
        if (end[0] == '(') {
            if (end[1] != 'x') return -1;
            reps = strtol(end + 2, &end, 10);
            if (*end != ')' || reps < 1) return -1;
            end++;
        }
        if (node < seen + reps) return n;
        seen += reps;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return -1;
}

/* This node's task count in the Slurm step (the job's where the step's is missing), or -1. */
DPS_STARTUP static long slurm_local_size(void)
{
    long node = env_int("SLURM_NODEID");
    const char *spec = getenv("SLURM_STEP_TASKS_PER_NODE");
    if (!spec) spec = getenv("SLURM_TASKS_PER_NODE");
    return slurm_tasks_on_node(spec, node >= 0 ? node : 0);
}

/* The launcher environment alone, without PMIx: what a child of the rank process sees. */
DPS_STARTUP static int bootstrap_env(dps_state_t *s, char *err, size_t errlen)
{
    s->rank = 0, s->size = 1, s->local_rank = 0, s->local_size = 1, s->launcher = "singleton";
    s->local_source = s->local_rank_source = "a process alone";
    for (size_t i = 0; i < sizeof launcher_envs / sizeof *launcher_envs; i++) {
        const launcher_env_t *l = &launcher_envs[i];
        long rank = env_int(l->rank), size = env_int(l->size);
        if (rank == -1 && size == -1) continue;
        if (!strcmp(l->name, "openmpi") && !openmpi_launcher_alive()) {
            DPS_WARN(
                "%s=%s and %s=%s are set, but no Open MPI launcher started this process (no PMIx server or "
                "mpirun daemon to reach): left over from an earlier job? They are ignored: this process runs "
                "alone; unset them, or start the program with mpirun",
                l->rank, getenv(l->rank) ? getenv(l->rank) : "(unset)", l->size,
                getenv(l->size) ? getenv(l->size) : "(unset)");
            continue;
        }
        if (rank < 0 || size <= 0 || rank >= size) {
            snprintf(err, errlen,
                     "the %s launcher environment is inconsistent (%s=%s, %s=%s): rank must be "
                     "an integer in [0, size); check the launch line",
                     l->name, l->rank, getenv(l->rank) ? getenv(l->rank) : "(unset)", l->size,
                     getenv(l->size) ? getenv(l->size) : "(unset)");
            return -1;
        }
        long lr = env_int(l->local_rank), ls = env_int(l->local_size);
        /* Slurm has no local-size variable: its tasks-per-node list gives it; a PMI-2 launch under
         * Slurm (srun --mpi=pmi2) gives no local values of its own, and Slurm's are right */
        int under_slurm =
            !strcmp(l->name, "slurm") || (!strcmp(l->name, "pmi") && lr < 0 && getenv("SLURM_LOCALID"));
        s->local_rank_source = lr >= 0 ? l->local_rank : "no variable of the launcher's (0 taken)";
        if (under_slurm && lr < 0 && (lr = env_int("SLURM_LOCALID")) >= 0)
            s->local_rank_source = "SLURM_LOCALID";
        s->local_source = ls > 0 ? l->local_size : "no variable of the launcher's (1 taken)";
        if (under_slurm && ls <= 0 && (ls = slurm_local_size()) > 0)
            s->local_source =
                getenv("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
        s->local_size_guessed = ls <= 0;
        s->rank = (int)rank, s->size = (int)size;
        s->local_rank = lr >= 0 ? (int)lr : 0;
        s->local_size = ls > 0 ? (int)ls : 1;
        s->launcher = l->name;
        return 0;
    }
    return 0;
}

/* The command line of this process, shell-quoted where needed, for a message ("..." past len). */
DPS_STARTUP static void own_command(char *out, size_t len)
{
    char buf[4096];
    size_t n = 0, o = 0;
    int fd = dps_sys_open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
        ssize_t r = read(fd, buf, sizeof buf - 1);
        n = r > 0 ? (size_t)r : 0;
        dps_sys_close(fd);
    }
    buf[n] = '\0';
    out[0] = '\0';
    for (size_t i = 0; i < n && o + 8 < len; i += strlen(buf + i) + 1) {
        const char *a = buf + i;
        int quote = !*a || strpbrk(a, " \t'\"$&;|<>*?()") != NULL;
        int w = snprintf(out + o, len - o, "%s%s%s%s", o ? " " : "", quote ? "'" : "", a, quote ? "'" : "");
        if (w < 0 || (size_t)w >= len - o) {
            snprintf(out + (len > 4 ? len - 4 : 0), 4, "...");
            return;
        }
        o += (size_t)w;
    }
}

/* Launches the shim's MPI cannot join, said at once with the line to use: a Slurm or PMI launch
 * without a PMIx server, and torchrun (or torch.distributed.launch, DeepSpeed's and Accelerate's
 * launchers, which set the same RANK and WORLD_SIZE), which starts its workers as separate
 * programs without an MPI job behind them. */
DPS_STARTUP static int refuse_non_mpi_launcher(const dps_state_t *s, char *err, size_t errlen)
{
    /* srun --mpi=pmi2 (or none), MPICH's mpiexec: the MPI would fail in MPI_Init with words of its
     * own ("OMPI was not built with SLURM's PMI support"); said here, with the line that works */
    int slurm = !strcmp(s->launcher, "slurm") || (!strcmp(s->launcher, "pmi") && getenv("SLURM_STEP_ID"));
    if ((slurm || !strcmp(s->launcher, "pmi")) && s->size > 1 && !pmix_server_in_env() &&
        !mpi_joins_without_pmix()) {
        snprintf(
            err, errlen,
            "%s started this process without a PMIx server (rank %d of %d), and the MPI dpshim runs on (Open "
            "MPI, %s) joins a job only through PMIx: every rank would fail in MPI_Init. %s",
            slurm ? "srun" : "a PMI launcher", s->rank, s->size, DPS_MPI_LIBDIR,
            slurm ? "Start the step with srun --mpi=pmix (srun --mpi=list shows what this Slurm offers; "
                    "MpiDefault=pmix in slurm.conf makes it the default)"
                  : "Start the job with Open MPI's mpirun");
        return -1;
    }
    if (strcmp(s->launcher, "torchrun") || s->size < 2) return 0;
    char cmd[600], lib[512] = "libdpshim.so";
    Dl_info info;
    if (dladdr((void *)&refuse_non_mpi_launcher, &info) && info.dli_fname)
        snprintf(lib, sizeof lib, "%s", info.dli_fname);
    own_command(cmd, sizeof cmd);
    snprintf(
        err, errlen,
        "this process was started by %s (RANK=%d, WORLD_SIZE=%d%s), which starts its workers without an MPI "
        "job: dpshim's collectives run over MPI and could not reach the other ranks. Start the unmodified "
        "program with mpirun instead of the launcher, one process per rank: mpirun -np %d env LD_PRELOAD=%s "
        "%s",
        getenv("TORCHELASTIC_RUN_ID") ? "torchrun"
                                      : "a launcher that sets RANK and WORLD_SIZE (torchrun, "
                                        "torch.distributed.launch, deepspeed, accelerate)",
        s->rank, s->size, getenv("TORCHELASTIC_RUN_ID") ? ", TORCHELASTIC_RUN_ID set" : "", s->size, lib,
        cmd);
    return -1;
}

/* The rank process exports its identity so that exec'd children keep their rank's file policy
 * and find the rank's place (claim.c): "pid:rank:size:local_rank:local_size:claim_fd", 0 for
 * no claim file. Read and written by hand:
 * every process of the job passes here, and stdio's formatting is the costliest code a short
 * child (a shell, a compiler) would otherwise run at start (docs/performance.md: cost for other programs). */
enum { MARKER_FIELDS = 6 };

/* "1:2:3:4:5:6" into v[6]; 1 when it is exactly six non-negative integers. */
DPS_STARTUP static int parse_marker(const char *m, long v[MARKER_FIELDS])
{
    for (int i = 0; i < MARKER_FIELDS; i++)
        if ((v[i] = read_count(m, i + 1 < MARKER_FIELDS ? ':' : '\0', &m)) < 0) return 0;
    return 1;
}

DPS_STARTUP static void format_marker(char *out, const long v[MARKER_FIELDS])
{
    char *o = out;
    for (int i = 0; i < MARKER_FIELDS; i++) {
        char digits[24];
        int n = 0;
        unsigned long x = (unsigned long)v[i];
        do
            digits[n++] = (char)('0' + x % 10);
        while (x /= 10);
        while (n)
            *o++ = digits[--n];
        *o++ = i + 1 < MARKER_FIELDS ? ':' : '\0';
    }
}

DPS_STARTUP_DATA static int claim_fd = -1;

static void export_marker(const dps_state_t *s)
{
    char buf[MARKER_FIELDS * 24];
    format_marker(buf, (long[MARKER_FIELDS]){(long)dps_sys_getpid(), s->rank, s->size, s->local_rank,
                                             s->local_size, claim_fd > 0 ? (long)claim_fd : 0L});
    setenv(DPS_ENV_RANK_PID, buf, 1);
}

DPS_STARTUP int dps_bootstrap(dps_state_t *s, char *err, size_t errlen)
{
    if (bootstrap_env(s, err, errlen) != 0) return -1;
    const char *marker = getenv(DPS_ENV_RANK_PID);
    long m[MARKER_FIELDS] = {-1, -1, -1, 0, 1, 0};
    int parsed = marker && parse_marker(marker, m);
    long pid = m[0];
    int r = (int)m[1], n = (int)m[2], lr = (int)m[3], ls = (int)m[4];
    long my_rank = s->rank, my_size = s->size;
    /* PMIx-only launcher: the env has no size (PMIX_RANK asked first: a child, which has none,
     * then binds no strcmp) */
    if (parsed && env_int("PMIX_RANK") >= 0 && strcmp(s->launcher, "singleton") == 0)
        my_rank = env_int("PMIX_RANK"), my_size = n;
    if (parsed && pid != dps_sys_getpid() && r == my_rank && n == my_size) {
        /* Same rank as the process that set the marker, another pid: its child. A marker from
         * another identity (e.g. a preloaded mpirun, a singleton) says nothing about us. */
        s->role = DPS_ROLE_CHILD;
        s->rank = r, s->size = n, s->local_rank = lr, s->local_size = ls;
        s->local_source = s->local_rank_source = "the rank process's (DPSHIM_RANK_PID)";
        if (n > 1 && m[5] > 0) claim_fd = dps_claim_setup(DPS_ROLE_CHILD, (int)m[5]);
        return 0;
    }
    s->role = DPS_ROLE_RANK;
    if (refuse_non_mpi_launcher(s, err, errlen)) return -1;
    s->exec_in_place = parsed && pid == dps_sys_getpid();
    if (strcmp(s->launcher, "singleton") == 0) bootstrap_pmix(s);
    /* after an exec in place, the claim file the earlier image made */
    if (s->size > 1) claim_fd = dps_claim_setup(DPS_ROLE_RANK, s->exec_in_place && m[5] > 0 ? (int)m[5] : -1);
    export_marker(s);
    return 0;
}

/* This process is the rank process from now on: its children are its own. */
void dps_bootstrap_export_marker(void)
{
    export_marker(&dps_g);
}
