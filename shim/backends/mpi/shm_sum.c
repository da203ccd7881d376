/* Small all-reduces through a shared-memory segment of the shim's own, when every rank of the
 * communicator runs on one machine. Each rank has two slots (calls alternate between them) and a
 * counter `done` on a cache line of its own: the last call it finished reading every rank's slot
 * for. A call writes this rank's data into its slot, then the call's number into the slot's head
 * (the head and the first bytes of data share a cache line: a peer waiting for the number has a
 * small buffer in the same transfer), waits for every rank's slot to show the number, and adds
 * the slots in rank order, so every rank computes the same bits whatever the timing. A slot is
 * written again two calls later, once every rank's `done` says it was read. A rank that waits
 * longer than a peer on another core would take spins, then sleeps on the counter (a futex on its
 * low 32 bits) until the peer's store wakes it: on a busy machine a sleeper is scheduled back at
 * once when woken, where a rank yielding in a loop burns its share of the core and comes back
 * late, and every BatchNorm layer's sums wait like this twice a step. Open MPI 4.1's
 * MPI_Allreduce on one machine (vader, recursive doubling; its coll/sm component was slower
 * still) cost more than the shim's whole call for small buffers: see docs/performance.md's
 * section. */
#define _GNU_SOURCE
#include "shm_sum.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/dtype.h"

#define LINE 64
/* A counter that only grows, and how many ranks sleep waiting for it to grow. */
typedef struct counter {
    _Atomic uint64_t v;
    _Atomic uint32_t sleepers;
    char pad[LINE - sizeof(uint64_t) - sizeof(uint32_t)];
} counter_t;

/* What a rank's slot holds: the call (written last), and what is reduced, compared across ranks
 * so that ranks reducing different buffers are named instead of adding unrelated data. */
typedef struct slot_head {
    _Atomic uint64_t call;
    uint64_t count;
    int32_t dtype, op;
    _Atomic uint32_t sleepers; /* ranks asleep waiting for `call` */
} slot_head_t;
#define DATA_AT 32 /* the data's offset in a slot: its first 32 bytes share the head's cache line */
_Static_assert(sizeof(slot_head_t) <= DATA_AT, "a slot's head must end where its data begins");

struct dps_shm_sum {
    int rank, size;
    size_t max_bytes, stride; /* a slot: its head, then max_bytes, rounded up to cache lines */
    unsigned spins;           /* before yielding the core; none where ranks outnumber cores */
    uint64_t calls;
    uint64_t *seen_done; /* each rank's `done` as last read: it only grows, so most calls need no read */
    void *base;
    size_t len;
    counter_t *done;
    unsigned char *slots;
};

static unsigned char *slot(const dps_shm_sum_t *s, int r, uint64_t call)
{
    return s->slots + ((size_t)r * 2 + (size_t)(call & 1)) * s->stride;
}

/* How long a waiting rank keeps its core (spinning, then yielding) before it sleeps: a peer that
 * computed as long arrives within it; one that is later pays a wake-up that is small beside its
 * lateness. */
#define AWAKE_NS 100000

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The counter's low 32 bits, where a futex can wait (x86 and every little-endian machine). */
static uint32_t *low_word(_Atomic uint64_t *c)
{
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the futex word is the counter's low half");
    return (uint32_t *)(void *)c;
}

/* Sleeps while *c is still `seen`, for 100 ms at most: the wait is re-checked then (the guard's
 * watchdog thread covers a rank that never comes). A shared mapping: not a private futex. */
static void sleep_on(_Atomic uint64_t *c, _Atomic uint32_t *sleepers, uint64_t seen)
{
    atomic_fetch_add(sleepers, 1); /* seq_cst, as the store and load in wake(): one of us sees the other */
    if (atomic_load(c) == seen) {
        struct timespec limit = {0, 100000000};
        if (syscall(SYS_futex, low_word(c), FUTEX_WAIT, (uint32_t)seen, &limit, NULL, 0) != 0 &&
            errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT)
            sched_yield(); /* no futex here: waiting goes on as before */
    }
    atomic_fetch_sub(sleepers, 1);
}

static void wake(_Atomic uint64_t *c, _Atomic uint32_t *sleepers, uint64_t v)
{
    atomic_store(c, v);
    if (atomic_load(sleepers)) syscall(SYS_futex, low_word(c), FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Spins briefly (a peer on another core answers within a microsecond), then yields the core, then
 * sleeps; where the ranks outnumber their cores, sleeps at once (the rank waited for may need this
 * core). */
int (*dps_shm_abandon)(void);

/* UINT64_MAX where dps_shm_abandon says to give up (a lost rank would never come). */
static uint64_t wait_for(const dps_shm_sum_t *s, _Atomic uint64_t *c, _Atomic uint32_t *sleepers,
                         uint64_t at_least)
{
    uint64_t v, since = 0;
    int (*abandon)(void) = dps_shm_abandon;
    for (unsigned spins = 0; (v = atomic_load_explicit(c, memory_order_acquire)) < at_least; spins++) {
        if (abandon && (spins & 1023) == 1023 && abandon()) return UINT64_MAX;
        if (spins < s->spins) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        if (s->spins && !since) since = now_ns();
        if (s->spins && now_ns() - since < AWAKE_NS)
            sched_yield();
        else
            sleep_on(c, sleepers, v);
        if (abandon && spins >= s->spins && abandon()) return UINT64_MAX;
    }
    return v;
}

dps_shm_sum_t *dps_shm_sum_open(MPI_Comm comm, size_t max_bytes, const char **why_p)
{
    int rank = 0, size = 0, local = 0;
    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    *why_p = "[comm] shm_kb = 0";
    if (!max_bytes) return NULL; /* the job's value: every rank returns here alike */
    /* all on one machine, or none is; agreed, so that a failed split on one rank cannot leave
     * it out of the collectives below */
    MPI_Comm node = MPI_COMM_NULL;
    if (PMPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        PMPI_Comm_size(node, &local);
        PMPI_Comm_free(&node);
    }
    int one_machine = local == size;
    if (PMPI_Allreduce(MPI_IN_PLACE, &one_machine, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) one_machine = 0;
    *why_p = "the ranks run on more than one machine";
    if (!one_machine) return NULL;

    dps_shm_sum_t *s = calloc(1, sizeof *s);
    uint64_t *seen = calloc((size_t)size, sizeof *seen);
    size_t stride = (DATA_AT + max_bytes + LINE - 1) / LINE * LINE;
    size_t len = (size_t)size * sizeof(counter_t) + 2 * (size_t)size * stride;
    char name[64] = "";
    int fd = -1;
    static unsigned opened; /* one segment per channel, and a name no other job has */
    for (int tries = 0; rank == 0 && s && seen && fd < 0 && tries < 8; tries++) {
        snprintf(name, sizeof name, "/dpshim-sum.%d.%u", (int)getpid(), opened++);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        /* the pages themselves, not a size (ftruncate): a full /dev/shm is a clear no here
         * instead of SIGBUS at the first write */
        if (fd >= 0 && posix_fallocate(fd, 0, (off_t)len) != 0) {
            close(fd), shm_unlink(name), fd = -1;
            break;
        }
    }
    if (rank == 0 && fd < 0) name[0] = 0;
    PMPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
    if (rank != 0 && s && seen && name[0]) fd = shm_open(name, O_RDWR, 0);
    void *base = fd >= 0 ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd);
    int ok = base != MAP_FAILED;
    if (PMPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) ok = 0;
    if (rank == 0 && name[0]) shm_unlink(name); /* every rank has it mapped (or gave up): no file stays */
    /* more ranks than the cores they may run on, together: a waiting rank gives its core away */
    cpu_set_t cores;
    CPU_ZERO(&cores);
    if (sched_getaffinity(0, sizeof cores, &cores) != 0) CPU_ZERO(&cores);
    PMPI_Allreduce(MPI_IN_PLACE, &cores, (int)sizeof cores, MPI_UNSIGNED_CHAR, MPI_BOR, comm);
    unsigned spins = CPU_COUNT(&cores) >= size ? 256 : 0;
    if (!ok) {
        if (base != MAP_FAILED) munmap(base, len);
        free(s), free(seen);
        *why_p = "a rank could not map a shared-memory segment in /dev/shm (full or missing: give it room, "
                 "e.g. docker run --shm-size, or lower [comm] shm_kb)";
        return NULL;
    }
    *s = (dps_shm_sum_t){.rank = rank,
                         .size = size,
                         .spins = spins,
                         .max_bytes = max_bytes,
                         .stride = stride,
                         .seen_done = seen,
                         .base = base,
                         .len = len,
                         .done = base,
                         .slots = (unsigned char *)base + (size_t)size * sizeof(counter_t)};
    *why_p = NULL;
    return s;
}

size_t dps_shm_sum_max(const dps_shm_sum_t *s)
{
    return s ? s->max_bytes : 0;
}

/* Every rank's slot says what it reduces: -1 and the list (the same text on every rank) when they
 * differ. */
static int mismatch(const dps_shm_sum_t *s, uint64_t call, char *err, size_t errlen)
{
    const slot_head_t *first = (const slot_head_t *)slot(s, 0, call);
    int r = 1;
    while (r < s->size) {
        const slot_head_t *h = (const slot_head_t *)slot(s, r, call);
        if (h->count != first->count || h->dtype != first->dtype || h->op != first->op) break;
        r++;
    }
    if (r == s->size) return 0;
    int o = snprintf(err, errlen, "ranks are reducing different buffers (a desync):");
    for (r = 0; r < s->size && o > 0 && (size_t)o < errlen; r++) {
        const slot_head_t *h = (const slot_head_t *)slot(s, r, call);
        o += snprintf(err + o, errlen - (size_t)o, "%s rank %d %llu x %s%s", r ? "," : "", r,
                      (unsigned long long)h->count, dps_dtype_name(h->dtype),
                      h->op != first->op ? " (another operation)" : "");
    }
    return -1;
}

/* A sum given up: buf is as it was, and the segment is not used again (its calls are out of step). */
static int abandoned(dps_shm_sum_t *s, char *err, size_t errlen)
{
    s->max_bytes = 0;
    snprintf(err, errlen, "a shared-memory sum given up: a rank of the job was lost");
    return -2;
}

int dps_shm_sum(dps_shm_sum_t *s, void *buf, int count, int dtype, MPI_Datatype t, MPI_Op o, int op,
                size_t es, double pre, double post, char *err, size_t errlen)
{
    size_t bytes = (size_t)count * es;
    if (bytes > s->max_bytes) {
        snprintf(err, errlen, "a shared-memory sum of %zu bytes where slots hold %zu", bytes, s->max_bytes);
        return -1;
    }
    uint64_t call = ++s->calls;
    for (int r = 0; call > 2 && r < s->size; r++) /* every rank has read what this slot held two calls ago */
        if (r != s->rank && s->seen_done[r] < call - 2) {
            uint64_t v = wait_for(s, &s->done[r].v, &s->done[r].sleepers, call - 2);
            if (v == UINT64_MAX) return abandoned(s, err, errlen);
            s->seen_done[r] = v;
        }
    unsigned char *mine = slot(s, s->rank, call);
    slot_head_t *head = (slot_head_t *)mine;
    head->count = (uint64_t)count, head->dtype = dtype, head->op = op;
    memcpy(mine + DATA_AT, buf, bytes);
    dps_scale_in_place(mine + DATA_AT, (size_t)count, dtype, pre);
    wake(&head->call, &head->sleepers, call);
    for (int r = 0; r < s->size; r++) {
        slot_head_t *theirs = (slot_head_t *)slot(s, r, call);
        if (r != s->rank && wait_for(s, &theirs->call, &theirs->sleepers, call) == UINT64_MAX)
            return abandoned(s, err, errlen);
    }
    int rc = mismatch(s, call, err, errlen);
    for (int r = 0; r < s->size && rc == 0; r++) {
        const unsigned char *theirs = slot(s, r, call) + DATA_AT;
        if (r == 0) {
            memcpy(buf, theirs, bytes);
        } else if (PMPI_Reduce_local(theirs, buf, count, t, o) != MPI_SUCCESS) {
            snprintf(err, errlen, "MPI_Reduce_local failed on a shared-memory sum");
            rc = -1;
        }
    }
    wake(&s->done[s->rank].v, &s->done[s->rank].sleepers, call);
    if (rc == 0) dps_scale_in_place(buf, (size_t)count, dtype, post);
    return rc;
}

void dps_shm_sum_close(dps_shm_sum_t *s)
{
    if (!s) return;
    munmap(s->base, s->len);
    free(s->seen_done);
    free(s);
}
