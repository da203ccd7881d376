/* Where the launcher put the rank: Open MPI's mpirun binds each rank to a core by default (at 2
 * ranks or fewer), and a trainer's threads, its DataLoader workers and dpshim's background
 * reduction then share that one core while the node has more for each local rank. Said once, by
 * rank 0, with the launch line that gives each rank its share. A binding the user asked for (an
 * --bind-to or --map-by of theirs, which mpirun passes on in the environment) is left alone. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "start.h"

DPS_STARTUP void dps_placement_check(const dps_state_t *s)
{
    const char *bound = getenv("OMPI_MCA_orte_bound_at_launch");
    if (s->role != DPS_ROLE_RANK || s->rank != 0 || strcmp(s->launcher, "openmpi") || !bound || strcmp(bound, "1") ||
        getenv("OMPI_MCA_hwloc_base_binding_policy") || getenv("OMPI_MCA_rmaps_base_mapping_policy"))
        return;
    cpu_set_t mask;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof mask, &mask) != 0 || online < 1) return;
    int mine = CPU_COUNT(&mask);
    long per_rank = online / (s->local_size > 0 ? s->local_size : 1);
    if (mine >= per_rank) return;
    DPS_WARN("Open MPI bound each rank to %d core(s) (its default binding), while this node has %ld cores for its "
             "%d local rank(s): the trainer's threads, its DataLoader workers and dpshim's background reduction share "
             "%s. Start the job with mpirun --bind-to none (or --map-by slot:PE=%ld) to give each rank its share "
             "(docs/performance.md has what it cost the example trainer)",
             mine, online, s->local_size, mine == 1 ? "that one core" : "them", per_rank);
}
