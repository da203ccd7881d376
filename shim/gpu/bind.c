/* [gpu] bind (see bind.h). */
#define _GNU_SOURCE
#include "bind.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dps.h"

int dps_gpu_count(void)
{
    int n = 0;
    DIR *d = opendir("/dev");
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "nvidia", 6) && e->d_name[6] >= '0' && e->d_name[6] <= '9' &&
            strspn(e->d_name + 6, "0123456789") == strlen(e->d_name + 6))
            n++;
    if (d) closedir(d);
    return n;
}

DPS_STARTUP void dps_gpu_bind(dps_state_t *s)
{
    if (s->role != DPS_ROLE_RANK || s->local_size < 2 ||
        DPS_POLICY_ENUM(&s->policy, gpu, bind) != DPS_V_gpu_bind_auto)
        return;
    /* a rank that exec'd itself (a wrapper script, dpshim-diag bench) was bound before: binding
     * again would take its one device for the node's list */
    if (s->exec_in_place) return;
    const char *user = getenv("CUDA_VISIBLE_DEVICES");
    char pick[256], was[1024];
    snprintf(was, sizeof was, "%s", user ? user : "");
    int shared,
        n = dps_gpu_pick(user, dps_gpu_count(), s->local_rank, s->local_size, pick, sizeof pick, &shared);
    if (!n) return; /* no GPU here (or none visible to the user): a CPU job */
    setenv("CUDA_VISIBLE_DEVICES", pick, 1);
    DPS_INFO("[gpu] bind: local rank %d of %d sees GPU %s only (CUDA_VISIBLE_DEVICES=%s; it was %s)",
             s->local_rank, s->local_size, pick, pick, user ? was : "unset, all of /dev's");
    if (shared && s->local_rank == 0)
        DPS_WARN(
            "[gpu] bind: %d local ranks share %d GPU(s); NCCL cannot put two ranks on one GPU, so start at "
            "most %d ranks per node for GPU training",
            s->local_size, n, n);
}
