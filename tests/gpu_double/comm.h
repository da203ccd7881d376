/* Internal interface of the double's NCCL: the shared segment where ranks meet, and the
 * communicator, shared by nccl.c (communicators) and collectives.c (collectives). */
#ifndef DPS_GPU_DOUBLE_COMM_H
#define DPS_GPU_DOUBLE_COMM_H

#include "double.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

/* ncclResult_t (nccl.h). */
enum {
    NCCL_OK = 0,
    NCCL_CUDA_ERROR = 1,
    NCCL_SYSTEM_ERROR = 2,
    NCCL_INTERNAL_ERROR = 3,
    NCCL_INVALID_ARGUMENT = 4,
    NCCL_INVALID_USAGE = 5,
    NCCL_REMOTE_ERROR = 6,
    NCCL_IN_PROGRESS = 7,
};
enum { NCCL_NUM_OPS = 5, SCALAR_DEVICE = 0, SCALAR_HOST_IMMEDIATE = 1 };

typedef struct dps_dbl_unique_id {
    char internal[128];
} dps_dbl_unique_id_t;

/* The start of ncclConfig_t: only blocking is honoured. */
typedef struct dps_dbl_nccl_config {
    size_t size;
    unsigned magic, version;
    int blocking;
} dps_dbl_nccl_config_t;

enum { SLOT_BYTES = 4 << 20, SEG_MAGIC = 0x44424c31 /* "DBL1" */ };
enum { COLL_ALLREDUCE = 1, COLL_BROADCAST = 2 };
enum { HEALTH_OK = 0, HEALTH_ABORTED = 1, HEALTH_FAILED = 2 };
enum { WAIT_POSTED = 0, WAIT_DONE = 1 };

/* ---- the shared segment ---- */

/* What a rank put in its slot at a step; all ranks' must agree (but the scalar). */
typedef struct seg_desc {
    uint64_t coll, chunk, count;
    int32_t kind, dtype, root, op; /* root -1 for all-reduce, op -1 for broadcast */
    int32_t scaled;
    unsigned char scale[8];
} seg_desc_t;

typedef struct seg_rank {
    atomic_int arrived, health;
    int32_t pid, dev, init_fail;
    uint64_t host_hash;
    char bus[32];
    _Atomic uint64_t posted, done; /* the last step whose slot it filled, and finished reading */
    atomic_int launched;           /* it launched its first collective: its side connects */
    seg_desc_t desc;
} seg_rank_t;

typedef struct seg_hdr {
    atomic_uint magic;
    atomic_uint bell; /* a futex word: bumped at every change another rank may wait for */
    atomic_int nranks, attached, attached_ever;
    seg_rank_t rank[];
} seg_hdr_t;

_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "the segment's atomics must work across processes");

/* ---- communicators ---- */

typedef struct premul {
    int used, dtype, residence;
    unsigned char imm[8];
    const void *ptr;
} premul_t;

typedef struct comm {
    struct comm *next; /* the registry of live handles */
    int refs;          /* under comms_lock: the handle, the init thread, queued collectives */
    int nranks, rank, dev, joined;
    unsigned made;    /* this process's n-th communicator (from 1), inits and shrinks alike */
    pid_t pid;        /* a forked child does not own its parent's communicators */
    atomic_int async; /* ncclInProgress during init, then 0 or the first error */
    atomic_int aborted;
    atomic_int cancel; /* ncclCommShrink's NCCL_SHRINK_ABORT: ongoing collectives end, no results */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy;                            /* under mu: the init thread and running collectives */
    uint64_t queued, finished, next_run; /* under mu: collectives by number k, from 1 */
    _Atomic uint64_t colls;
    uint64_t step; /* this rank's steps through the segment (collectives run one at a time) */
    int connected; /* every peer launched its first collective */
    seg_hdr_t *seg;
    size_t seg_len;
    int detached;
    char name[64];
    premul_t *ops; /* under mu */
    int nops;
    int late; /* under mu, GPU_DOUBLE_ASYNC_ERROR_LATE: LATE_WAITING, LATE_GO, LATE_FAILED */
    int nonblocking;
    dps_dbl_unique_id_t id; /* what its segment was named from: a shrink's id derives from it */
    unsigned shrinks;       /* ncclCommShrink calls on it so far: each child gets an id of its own */
    /* a non-blocking shrink's child: where the handle goes once its init is done (NCCL writes it
     * only then), and the parent, whose state is in progress until then (with a reference) */
    void **publish;
    struct comm *shrunk_from;
    atomic_int caller;     /* the thread (tid) inside an API call on this comm, 0: none */
    const char *call_name; /* what it called */
    int dead;              /* under comms_lock: aborted or destroyed; the handle must not be used */
    int finalized;         /* ncclCommFinalize was called */
    int has_pending;       /* under mu: a collective of a non-blocking comm, launched at the next poll */
    dps_dbl_work_t pending;
    void *pending_stream;
} comm_t;

/* The comm's waits and collectives end now: it was aborted, or its ongoing work is being
 * cancelled (a shrink with NCCL_SHRINK_ABORT). */
static inline int dps_dbl_stopped(comm_t *c)
{
    return atomic_load(&c->aborted) || atomic_load(&c->cancel);
}

static inline size_t dps_dbl_slots_offset(int nranks)
{
    size_t n = sizeof(seg_hdr_t) + (size_t)nranks * sizeof(seg_rank_t);
    return (n + 4095) / 4096 * 4096;
}

/* The segment's bell: ring after every change a peer may wait for; doze until it moves on from
 * seen (or 100 ms, a safety net, not a poll). */
void dps_dbl_ring(seg_hdr_t *h);
void dps_dbl_doze(seg_hdr_t *h, unsigned seen);

static inline seg_rank_t *dps_dbl_me(comm_t *c)
{
    return &c->seg->rank[c->rank];
}
static inline char *dps_dbl_slot(comm_t *c, int r)
{
    return (char *)c->seg + dps_dbl_slots_offset(c->nranks) + (size_t)r * SLOT_BYTES;
}

/* With c->mu held: waits on c->cv for at most ms (a safety net against a missed wake-up). */
void dps_dbl_wait_cv(comm_t *c, long ms);
/* Sets the text ncclGetLastError returns (NCCL's last warning). */
void dps_dbl_nccl_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A live handle of this process, with a reference; NULL for anything else. A handle that
 * ncclCommAbort or ncclCommDestroy freed crashes the process, as the freed memory would. */
comm_t *dps_dbl_comm_get(void *h);
/* An API call on c begins (held GPU_DOUBLE_CALL_US, so that overlaps show) and ends. A second
 * thread entering while one is inside crashes the process: NCCL's communicator is not
 * thread-safe (2.28's ncclCommGetAsyncError joins and frees the pending launch job). */
void dps_dbl_comm_enter(comm_t *c, const char *call);
void dps_dbl_comm_leave(comm_t *c);
void dps_dbl_comm_put(comm_t *c);
/* The comm's first error becomes its asynchronous error; peers waiting on this rank see it. */
void dps_dbl_comm_fail(comm_t *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Waits until every other rank's posted (or done) count reaches v. 0: they have; -1: this comm
 * was aborted; r+1: rank r failed or aborted first. */
int dps_dbl_wait_ranks(comm_t *c, int which, uint64_t v);
/* GPU_DOUBLE_ASYNC_ERROR_LATE: called by ncclCommGetAsyncError after it read the state. Where
 * the injected failure waits, it happens now, and the stream moves past it, before the answer
 * (success) returns: an error raised right after a poll. */
void dps_dbl_late_failure(comm_t *c);
/* A non-blocking comm's collective returned ncclInProgress: it is launched (or, with discard,
 * dropped) here, from ncclCommGetAsyncError (or an abort), and the comm's state leaves
 * ncclInProgress. */
void dps_dbl_launch_pending(comm_t *c, int discard);
/* A peer that aborted while this rank may still read its data: -1 none, else its rank. */
int dps_dbl_aborted_peer(comm_t *c);
/* Nonzero (and NCCL's error text set) once the CUDA runtime's exit handler ran: NCCL's calls
 * that need CUDA then fail with ncclUnhandledCudaError, as NCCL's own cudart calls would. */
int dps_dbl_nccl_runtime_gone(void);
/* 1 (and NCCL's warning) when another copy of NCCL in this process answers for this one. */
int dps_dbl_nccl_second_copy(void);
/* Nonzero (and NCCL's error text set) when a call on c comes while an operation is in progress. */
int dps_dbl_busy_comm(comm_t *c);

#endif
