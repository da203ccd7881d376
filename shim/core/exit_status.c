/* A rank process's exit status, left as $DPSHIM_STATUS_DIR/rank.N for dpshim-run. Under the
 * launcher's recovery mode (mpirun --enable-recovery) the launcher exits 0 whatever the ranks
 * return, so dpshim-run gives the job the status its ranks left here. Written with system calls
 * only: the shim's own exits run on the watchdog thread too, and after a failed collective. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dps.h"
#include "sys.h"

/* $DPSHIM_STATUS_DIR/KIND.RANK, created empty for writing; -1 where no folder is set or it fails. */
static int create_in_status_dir(const char *kind, int rank)
{
    const char *dir = getenv(DPS_ENV_STATUS_DIR);
    if (!dir || !*dir) return -1;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s.%d", dir, kind, rank);
    if (n < 0 || (size_t)n >= sizeof path) return -1;
    return dps_sys_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

void dps_exit_status_note(int status)
{
    if (dps_g.role != DPS_ROLE_RANK) return;
    int fd = create_in_status_dir("rank", dps_g.rank);
    if (fd < 0) return;
    char text[16];
    int n = snprintf(text, sizeof text, "%d\n", status & 0xff);
    /* nothing to say on failure here (logging sits above this file): a rank with no status file
     * is one dpshim-run names as lost */
    (void)!dps_sys_write(fd, text, (size_t)n);
    dps_sys_close(fd);
}

void dps_exit_status_lost(int rank)
{
    int fd = create_in_status_dir("lost", rank);
    if (fd >= 0) dps_sys_close(fd);
}

void dps_exit_status_ends_job(void)
{
    if (dps_g.role != DPS_ROLE_RANK) return;
    int fd = create_in_status_dir("end", dps_g.rank);
    if (fd >= 0) dps_sys_close(fd);
}

int dps_launcher_keeps_survivors(void)
{
    const char *v = getenv("OMPI_MCA_orte_enable_recovery");
    return v && (!strcmp(v, "1") || !strcmp(v, "true"));
}

int dps_job_may_go_on(const dps_state_t *s)
{
    return s->size >= 2 &&
           DPS_POLICY_ENUM(&s->policy, elastic, lost_rank) == DPS_V_elastic_lost_rank_continue &&
           dps_launcher_keeps_survivors();
}

_Noreturn void dps_exit_now(int status)
{
    dps_exit_status_note(status);
    dps_sys_flush_all();
    _exit(status);
}
