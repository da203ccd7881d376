/* Whether another rank's process still exists. A rank killed by a signal, by the OOM killer or by
 * its own _exit says nothing; where the launcher keeps the other ranks running (mpirun
 * --enable-recovery, srun --no-kill) nothing else tells them, and a collective that waits for it
 * would wait for the guard's timeout. The ranks of this host are watched by process id, as the
 * ranks gathered them when the backend opened, and by start time, read once from /proc: a process
 * id used again by another process is not the rank. A rank of another host, or one this process
 * cannot see (another PID namespace), is never called gone here. */
#define _GNU_SOURCE
#include "guard_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sys.h"

typedef struct watched {
    uint32_t pid;
    unsigned long long start; /* /proc/PID/stat's start time; 0: not watched */
} watched_t;

/* dps_guard_conf.size entries, set once by the main thread while the watchdog may read it */
static _Atomic(watched_t *) watched;

/* The process's state letter and start time from /proc/PID/stat; -1 where it is not there. The
 * command (field 2) may hold spaces and parentheses: the fields after its last ')' are read. */
static int read_stat(uint32_t pid, char *state, unsigned long long *start)
{
    char path[40], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = dps_sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return -1;
    ssize_t n = dps_sys_read(fd, buf, sizeof buf - 1);
    dps_sys_close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    if (!p) return -1;
    /* after ')', one space before each field: the state (field 3), ..., the start time (field 22) */
    if (sscanf(p + 1, " %c", state) != 1) return -1;
    for (int space = 1; space <= 22 - 2; space++) {
        p = strchr(p + 1, ' ');
        if (!p) return -1;
    }
    return sscanf(p + 1, "%llu", start) == 1 ? 0 : -1;
}

void dps_guard_set_pids(const uint32_t *pids, int n)
{
    const dps_guard_conf_t *conf = &dps_guard_conf;
    if (atomic_load(&watched) || n != conf->size) return;
    watched_t *w = calloc((size_t)n, sizeof *w);
    if (!w) return;
    const char *mine = dps_guard_host(conf->rank);
    for (int r = 0; r < n; r++) {
        char state;
        w[r].pid = pids[r]; /* every rank's, for messages; watched on this host only */
        if (r == conf->rank || !mine[0] || strcmp(dps_guard_host(r), mine) != 0) continue;
        if (read_stat(pids[r], &state, &w[r].start) != 0) w[r].start = 0; /* not ours to see */
    }
    atomic_store_explicit(&watched, w, memory_order_release);
}

int dps_guard_peer_gone(int r)
{
    const watched_t *w = atomic_load_explicit(&watched, memory_order_acquire);
    if (!w || r < 0 || r >= dps_guard_conf.size || !w[r].start) return 0;
    char state;
    unsigned long long start;
    if (read_stat(w[r].pid, &state, &start) != 0) return 1;
    /* a zombie (Z) or a dying process (X) is gone; another process under the same id too */
    return state == 'Z' || state == 'X' || start != w[r].start;
}

uint32_t dps_guard_pid(int r)
{
    const watched_t *w = atomic_load_explicit(&watched, memory_order_acquire);
    return w && r >= 0 && r < dps_guard_conf.size ? w[r].pid : 0;
}

int dps_guard_end_peer(int r)
{
    const watched_t *w = atomic_load_explicit(&watched, memory_order_acquire);
    if (!w || r < 0 || r >= dps_guard_conf.size || !w[r].start || dps_guard_peer_gone(r)) return 0;
    return kill((pid_t)w[r].pid, SIGKILL) == 0;
}
