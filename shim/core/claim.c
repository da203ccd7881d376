/* The rank's place in the job: one process of a rank's process tree talks to the other ranks.
 * The process the launcher started (the rank process) holds it unless it never calls a hook:
 * a wrapper that starts the trainer as its child (/usr/bin/time, a shell line, a script that
 * prepares a folder first) leaves the place to the first process of its tree that calls one.
 * The holder is one word in a memory file the rank process makes and its children inherit (its
 * descriptor is named in DPSHIM_RANK_PID, bootstrap.c; no name on any file system, so nothing is
 * left behind however a process ends); the first process to set it from 0 to its pid holds the
 * place for the rest of the job. A child that cannot see the word (a program closed the
 * descriptor) never takes the place. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dps.h"
#include "sys.h"

#define CLAIM_NAME "dpshim-rank"
#define CLAIM_FD_MIN 100 /* above the low numbers shells and scripts use themselves */

DPS_STARTUP_DATA static _Atomic int32_t *_Atomic owner_word;
DPS_STARTUP_DATA static int child_fd = -1; /* a child's claim file, mapped when first needed (word()) */
DPS_STARTUP_DATA void (*volatile dps_on_rank_claimed)(void);

/* fd, if it is the claim file: mapped, else NULL. */
static _Atomic int32_t *map_word(int fd)
{
    char link[64], target[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return NULL;
    target[n] = '\0';
    if (strncmp(target, "/memfd:" CLAIM_NAME " ", sizeof "/memfd:" CLAIM_NAME) != 0) return NULL;
    void *p = mmap(NULL, sizeof(int32_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* A child only notes the descriptor: most children (a shell, a compiler) never ask, and start-up
 * is the cost every one of them pays. The rank process maps its file at once: it must see the
 * word at its exit even if the program closed the descriptor. */
DPS_STARTUP int dps_claim_setup(int role, int fd)
{
    if (role == DPS_ROLE_CHILD) return child_fd = fd;
    dps_in_shim++;
    if (fd < 0) {
        int made = memfd_create(CLAIM_NAME, 0); /* inherited across exec: no close-on-exec */
        fd = made >= 0 && ftruncate(made, sizeof(int32_t)) == 0 ? fcntl(made, F_DUPFD, CLAIM_FD_MIN) : -1;
        if (made >= 0) dps_sys_close(made);
        if (fd < 0) DPS_DEBUG("no claim file (%s): the rank process keeps the rank's place", strerror(errno));
    }
    if (fd >= 0) atomic_store(&owner_word, map_word(fd));
    dps_in_shim--;
    return atomic_load(&owner_word) ? fd : -1;
}

/* The owner word; NULL where this process has none (no claim file, or a descriptor that is
 * not it any more). */
static _Atomic int32_t *word(void)
{
    _Atomic int32_t *w = atomic_load(&owner_word);
    if (w || child_fd < 0) return w;
    dps_in_shim++;
    _Atomic int32_t *mapped = map_word(child_fd), *none = NULL;
    dps_in_shim--;
    if (mapped && !atomic_compare_exchange_strong(&owner_word, &none, mapped))
        munmap((void *)mapped, sizeof(int32_t));
    return atomic_load(&owner_word);
}

int dps_rank_owner(void)
{
    _Atomic int32_t *w = word();
    return w ? atomic_load(w) : 0;
}

int dps_rank_place_free(void)
{
    _Atomic int32_t *w = word();
    return w && atomic_load(w) == 0;
}

int dps_claim_rank(void)
{
    if (atomic_load_explicit(&dps_g.forked, memory_order_relaxed)) return 0; /* a worker, never the rank */
    _Atomic int32_t *w = word();
    if (!w) return dps_g.role == DPS_ROLE_RANK;
    int32_t holder = 0, me = (int32_t)getpid();
    if (!atomic_compare_exchange_strong(w, &holder, me) && holder != me) return 0;
    if (dps_g.role == DPS_ROLE_CHILD) {
        dps_g.role =
            DPS_ROLE_RANK; /* its children are its own: start-up exports its marker (dps_on_rank_claimed) */
        DPS_INFO("rank %d: this process (%d) takes the rank's place in the job: the process the launcher "
                 "started never called a hook",
                 dps_g.rank, (int)me);
        if (dps_on_rank_claimed) dps_on_rank_claimed();
    }
    return 1;
}
