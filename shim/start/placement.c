/* Where the launcher put the rank, and how many threads it runs. Open MPI's mpirun binds each
 * rank to a core by default (at 2 ranks or fewer), and a trainer's threads, its DataLoader
 * workers and dpshim's background reduction then share that one core while the node has more
 * for each local rank. Said once, by rank 0, with the launch line that gives each rank its share.
 * A binding the user asked for (an --bind-to or --map-by of theirs, which mpirun passes on in the
 * environment) is left alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "start.h"
#include "core/sys.h"

DPS_STARTUP void dps_placement_check(const dps_state_t *s)
{
    const char *bound = getenv("OMPI_MCA_orte_bound_at_launch");
    if (s->role != DPS_ROLE_RANK || s->rank != 0 || strcmp(s->launcher, "openmpi") || !bound ||
        strcmp(bound, "1") || getenv("OMPI_MCA_hwloc_base_binding_policy") ||
        getenv("OMPI_MCA_rmaps_base_mapping_policy"))
        return;
    cpu_set_t mask;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof mask, &mask) != 0 || online < 1) return;
    int mine = CPU_COUNT(&mask);
    long per_rank = online / (s->local_size > 0 ? s->local_size : 1);
    if (mine >= per_rank) return;
    DPS_WARN(
        "Open MPI bound each rank to %d core(s) (its default binding), while this node has %ld cores for its "
        "%d local rank(s): the trainer's threads, its DataLoader workers and dpshim's background reduction "
        "share "
        "%s. Start the job with mpirun --bind-to none (or --map-by slot:PE=%ld) to give each rank its share "
        "(docs/performance.md has what it cost the example trainer)",
        mine, online, s->local_size, mine == 1 ? "that one core" : "them", per_rank);
}

/* The CPUs in a cpuset list ("0-3,8,10-11"); 0 where it is not one. */
static long cpu_list_count(const char *list)
{
    long n = 0;
    for (const char *p = list; *p && *p != '\n';) {
        char *end;
        long lo = strtol(p, &end, 10), hi = lo;
        if (end == p) return 0;
        if (*end == '-') hi = strtol(end + 1, &end, 10);
        n += hi - lo + 1;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* The CPUs this node gives the job: Slurm's allocation on it, else the cpuset of the cgroup the
 * rank runs in (a container's, a batch job's), else every online CPU. */
static long node_cpus(void)
{
    const char *slurm = getenv("SLURM_CPUS_ON_NODE");
    if (slurm && atol(slurm) > 0) return atol(slurm);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    /* cgroup v1 names the cpuset hierarchy ("N:cpuset:/path"), v2 has one ("0::/path") */
    char line[600], group[600] = "", path[800], list[4096];
    const char *root = NULL, *file = NULL;
    FILE *f = dps_sys_fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *two = strstr(line, ":cpuset:"), *v2 = strncmp(line, "0::", 3) ? NULL : line + 3;
        if (two || (v2 && !root)) {
            snprintf(group, sizeof group, "%s", two ? two + 8 : v2);
            root = two ? "/sys/fs/cgroup/cpuset" : "/sys/fs/cgroup";
            file = two ? "cpuset.effective_cpus" : "cpuset.cpus.effective";
        }
    }
    if (f) dps_sys_fclose(f);
    group[strcspn(group, "\n")] = '\0';
    while (root) { /* the nearest cgroup up the tree that says */
        snprintf(path, sizeof path, "%s%s/%s", root, group, file);
        if ((f = dps_sys_fopen(path, "r"))) {
            long in_set = fgets(list, sizeof list, f) ? cpu_list_count(list) : 0;
            dps_sys_fclose(f);
            if (in_set > 0 && in_set < n) n = in_set;
            break;
        }
        char *slash = strrchr(group, '/');
        if (!slash) break;
        *slash = '\0';
    }
    return n;
}

/* [cpu] threads = share: OpenMP runtimes (libgomp, and through it PyTorch's and libtorch's
 * intra-op pool) start a thread per core in every process, so N ranks on a node run N threads
 * per core, each spinning while it waits for the others: measured with libtorch 2.6 at np=2 on 2
 * cores, up to 100 times slower per step than with one thread per rank. PyTorch reads
 * OMP_NUM_THREADS when it starts its pool, after this constructor; an OpenMP runtime that has
 * read it already gets its default for the main thread through omp_set_num_threads, where the
 * process has one. A rank bound to cores of its own (its mask times the local ranks fits the
 * node) keeps them all; ranks whose masks must overlap divide the node's CPUs. */
DPS_STARTUP void dps_threads_share(const dps_state_t *s)
{
    if (s->role != DPS_ROLE_RANK || s->size < 2 || s->local_size < 1 || s->local_size_guessed ||
        DPS_POLICY_ENUM(&s->policy, cpu, threads) != DPS_V_cpu_threads_share || getenv("OMP_NUM_THREADS") ||
        getenv("MKL_NUM_THREADS"))
        return;
    cpu_set_t mask;
    long node = node_cpus();
    long mine = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : node;
    long share = mine * s->local_size <= node ? mine : node / s->local_size;
    if (share > mine) share = mine;
    if (share < 1) share = 1;
    char n[24];
    snprintf(n, sizeof n, "%ld", share);
    setenv("OMP_NUM_THREADS", n, 1);
    void (*set_threads)(int) = NULL;
    /* asked first without dlsym: its miss in a program without OpenMP would be the program's first dlerror() */
    if (dps_elf_defines("omp_set_num_threads"))
        *(void **)&set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (set_threads) set_threads((int)share);
    DPS_INFO(
        "[cpu] threads = share: OMP_NUM_THREADS=%ld (%ld CPUs on this node for %d local ranks, %ld in this "
        "rank's affinity mask)",
        share, node, s->local_size, mine);
}
