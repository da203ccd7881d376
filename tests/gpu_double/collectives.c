/* The double's collectives: all-reduce and broadcast as operations on the caller's stream. When
 * one runs, each rank copies its input into its own slot of the segment, waits for every rank's
 * slot, and reduces all slots in rank order itself: every rank gets the same bits. The fault
 * switches make a rank's collective stall or fail asynchronously. Also the PreMulSum operators. */
#define _GNU_SOURCE
#include "comm.h"

#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* ---- reduction operators ---- */

static int redop_create(int *op, void *scalar, int dtype, int residence, void *comm);

DPS_DBL_API int ncclRedOpCreatePreMulSum(int *op, void *scalar, int dtype, int residence, void *comm)
{
    comm_t *c = dps_dbl_comm_get(comm);
    if (c) dps_dbl_comm_enter(c, "ncclRedOpCreatePreMulSum");
    int err = redop_create(op, scalar, dtype, residence, comm);
    if (c) dps_dbl_comm_leave(c), dps_dbl_comm_put(c);
    return err;
}

static int redop_create(int *op, void *scalar, int dtype, int residence, void *comm)
{
    dps_dbl_trace("ncclRedOpCreatePreMulSum scalar=%p dtype=%d residence=%d comm=%p", scalar, dtype,
                  residence, comm);
    comm_t *c = dps_dbl_comm_get(comm);
    if (c && dps_dbl_busy_comm(c)) {
        dps_dbl_comm_put(c);
        return NCCL_INVALID_ARGUMENT;
    }
    size_t esz = dps_dbl_dtype_size(dtype);
    int err = !c || !op || !scalar || !esz ? NCCL_INVALID_ARGUMENT : NCCL_OK;
    premul_t p = {1, dtype, residence, {0}, NULL};
    if (!err && residence == SCALAR_HOST_IMMEDIATE)
        memcpy(p.imm, scalar, esz);
    else if (!err && residence == SCALAR_DEVICE &&
             dps_dbl_lookup(scalar, esz, NULL, NULL) == DPS_DBL_MEM_DEVICE)
        p.ptr = scalar;
    else if (!err)
        err = NCCL_INVALID_ARGUMENT;
    if (err) {
        dps_dbl_nccl_error("test double: ncclRedOpCreatePreMulSum: invalid argument (comm %p, scalar %p, "
                           "dtype %d, residence %d)",
                           comm, scalar, dtype, residence);
        if (c) dps_dbl_comm_put(c);
        return err;
    }
    pthread_mutex_lock(&c->mu);
    int i = 0;
    while (i < c->nops && c->ops[i].used)
        i++;
    if (i == c->nops) {
        premul_t *grown = realloc(c->ops, (size_t)(c->nops + 1) * sizeof *grown);
        if (grown) c->ops = grown, c->nops++;
    }
    if (i < c->nops) {
        c->ops[i] = p;
        *op = NCCL_NUM_OPS + i;
    } else {
        err = NCCL_SYSTEM_ERROR;
    }
    pthread_mutex_unlock(&c->mu);
    dps_dbl_comm_put(c);
    return err;
}

DPS_DBL_API int ncclRedOpDestroy(int op, void *comm)
{
    dps_dbl_trace("ncclRedOpDestroy op=%d comm=%p", op, comm);
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c) return NCCL_INVALID_ARGUMENT;
    dps_dbl_comm_enter(c, "ncclRedOpDestroy");
    dps_dbl_comm_leave(c); /* the check is enough: the rest is under c->mu */
    if (dps_dbl_busy_comm(c)) {
        dps_dbl_comm_put(c);
        return NCCL_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&c->mu);
    int i = op - NCCL_NUM_OPS, ok = i >= 0 && i < c->nops && c->ops[i].used;
    if (ok) c->ops[i].used = 0;
    pthread_mutex_unlock(&c->mu);
    dps_dbl_comm_put(c);
    if (!ok)
        dps_dbl_nccl_error("test double: ncclRedOpDestroy: operator %d was not created on this communicator",
                           op);
    return ok ? NCCL_OK : NCCL_INVALID_ARGUMENT;
}

/* ---- collectives ---- */

/* One collective as its stream operation carries it. */
typedef struct coll {
    comm_t *c;
    uint64_t k;            /* its number on the comm, from 1, in enqueue order */
    seg_desc_t desc;       /* as posted (chunk and coll filled in per step) */
    char *send, *recv;     /* the double's views (send NULL where unused) */
    const void *scale_ptr; /* a device scalar, read when it runs */
} coll_t;

static const char *op_name(int op)
{
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return op >= 0 && op < NCCL_NUM_OPS ? names[op] : "?";
}

static void describe(const seg_desc_t *d, char *buf, size_t len)
{
    if (d->kind == COLL_ALLREDUCE)
        snprintf(buf, len, "collective #%llu AllReduce(count=%llu, %s, %s)", (unsigned long long)d->coll,
                 (unsigned long long)d->count, dps_dbl_dtype_name(d->dtype),
                 d->scaled ? "premulsum" : op_name(d->op));
    else
        snprintf(buf, len, "collective #%llu Broadcast(count=%llu, %s, root=%d)", (unsigned long long)d->coll,
                 (unsigned long long)d->count, dps_dbl_dtype_name(d->dtype), d->root);
}

/* The operation must be the same on every rank, a pre-multiplied sum included: NCCL picks its
 * algorithm from it (NVLS takes a sum, not a PreMulSum), so ranks that differ could pick
 * different algorithms and hang. Only the scalars may differ. */
static int same_shape(const seg_desc_t *a, const seg_desc_t *b)
{
    return a->coll == b->coll && a->chunk == b->chunk && a->count == b->count && a->kind == b->kind &&
           a->dtype == b->dtype && a->root == b->root && a->op == b->op && a->scaled == b->scaled;
}

static void peer_gone(comm_t *c, int r, uint64_t k)
{
    dps_dbl_comm_fail(c, NCCL_REMOTE_ERROR,
                      "test double: rank %d failed or aborted; collective #%llu on rank %d cannot complete",
                      r, (unsigned long long)k, c->rank);
}

/* The collective through the segment, one slot-sized chunk per step. */
static void coll_steps(coll_t *x)
{
    comm_t *c = x->c;
    seg_hdr_t *h = c->seg;
    seg_rank_t *m = dps_dbl_me(c);
    size_t esz = dps_dbl_dtype_size(x->desc.dtype), per = SLOT_BYTES / esz;
    uint64_t count = x->desc.count;
    for (uint64_t off = 0, chunk = 0; off < count; off += per, chunk++) {
        size_t n = count - off < per ? (size_t)(count - off) : per;
        uint64_t step = ++c->step;
        /* Everyone must be done reading my slot from the step before. */
        int w = step > 1 ? dps_dbl_wait_ranks(c, WAIT_DONE, step - 1) : 0;
        if (w) {
            if (w > 0) peer_gone(c, w - 1, x->k);
            return;
        }
        if (x->desc.kind == COLL_ALLREDUCE || c->rank == x->desc.root)
            memcpy(dps_dbl_slot(c, c->rank), x->send + off * esz, n * esz);
        m->desc = x->desc;
        m->desc.chunk = chunk;
        atomic_store(&m->posted, step);
        dps_dbl_ring(h);
        /* GPU_DOUBLE_DIE_RANK: the process ends with its data given, mid-collective: peers can
         * complete this one, but each at its own pace */
        if (dps_dbl_conf()->die_rank == c->rank && (uint64_t)dps_dbl_conf()->die_at == x->k) raise(SIGKILL);
        if ((w = dps_dbl_wait_ranks(c, WAIT_POSTED, step))) {
            if (w > 0) peer_gone(c, w - 1, x->k);
            return;
        }
        /* GPU_DOUBLE_SLOW_RANK: this rank reads the others' data late, as a rank whose GPU is
         * busier finishes the same collective later than its peers */
        if (dps_dbl_conf()->slow_rank == c->rank) dps_dbl_sleep_us(dps_dbl_conf()->slow_ms * 1000);
        for (int r = 0; r < c->nranks; r++)
            if (!same_shape(&h->rank[r].desc, &m->desc)) {
                char mine[160], theirs[160];
                describe(&m->desc, mine, sizeof mine);
                describe(&h->rank[r].desc, theirs, sizeof theirs);
                dps_dbl_comm_fail(c, NCCL_INVALID_USAGE,
                                  "test double: ranks disagree: rank %d called %s, rank %d called %s",
                                  c->rank, mine, r, theirs);
                return;
            }
        if (x->desc.kind == COLL_ALLREDUCE) {
            const void *in[c->nranks], *scale[c->nranks];
            for (int r = 0; r < c->nranks; r++) {
                in[r] = dps_dbl_slot(c, r);
                scale[r] = h->rank[r].desc.scaled ? h->rank[r].desc.scale : NULL;
            }
            dps_dbl_reduce(x->desc.dtype, x->desc.op, c->nranks, in, scale, x->recv + off * esz, n);
        } else {
            memcpy(x->recv + off * esz, dps_dbl_slot(c, x->desc.root), n * esz);
        }
        /* a peer that aborted meanwhile tore its side down while this rank was still reading
         * from it (its proxy, its connections): what was read cannot be trusted */
        int gone = dps_dbl_aborted_peer(c);
        if (gone >= 0) {
            peer_gone(c, gone, x->k);
            return;
        }
        atomic_store(&m->done, step);
        dps_dbl_ring(h);
    }
}

int dps_dbl_busy_comm(comm_t *c)
{
    if (atomic_load(&c->async) != NCCL_IN_PROGRESS) return 0;
    dps_dbl_nccl_error("Attempt to use communicator before the previous operation returned ncclSuccess");
    return 1;
}

/* NCCL connects a communicator's ranks at its first collective (NCCL_RUNTIME_CONNECT, the default
 * from NCCL 2.22): a launch stays in progress until every peer launched its own first one, and
 * forever where a peer died before. */
static int connected(comm_t *c)
{
    if (c->connected || !c->seg) return 1;
    for (int r = 0; r < c->nranks; r++)
        if (!atomic_load(&c->seg->rank[r].launched)) return 0;
    return c->connected = 1;
}

void dps_dbl_launch_pending(comm_t *c, int discard)
{
    if (!discard && !connected(c)) return; /* still connecting: discarded only by an abort */
    pthread_mutex_lock(&c->mu);
    int has = c->has_pending;
    dps_dbl_work_t w = c->pending;
    void *stream = c->pending_stream;
    c->has_pending = 0;
    pthread_mutex_unlock(&c->mu);
    if (!has) return;
    int cerr = 0, in = NCCL_IN_PROGRESS;
    if (discard)
        w.fini(&w);
    else if ((cerr = dps_dbl_enqueue(stream, &w, 0, NULL)))
        dps_dbl_nccl_error("Cuda failure %d '%s'", cerr, dps_dbl_cuda_error_string(cerr));
    atomic_compare_exchange_strong(&c->async, &in, cerr ? NCCL_CUDA_ERROR : NCCL_OK);
}

enum { LATE_WAITING = 1, LATE_GO, LATE_FAILED };

void dps_dbl_wait_cv(comm_t *c, long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += ms * 1000 * 1000;
    t.tv_sec += t.tv_nsec / 1000000000, t.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&c->cv, &c->mu, &t);
}

/* Sets c->late to `to`, then waits (0: not) until it is `until` or the comm is aborted. */
static void late_set(comm_t *c, int to, int until)
{
    pthread_mutex_lock(&c->mu);
    c->late = to;
    pthread_cond_broadcast(&c->cv);
    while (until && c->late != until && !dps_dbl_stopped(c))
        dps_dbl_wait_cv(c, 100);
    pthread_mutex_unlock(&c->mu);
}

void dps_dbl_late_failure(comm_t *c)
{
    pthread_mutex_lock(&c->mu);
    int waiting = c->late == LATE_WAITING;
    pthread_mutex_unlock(&c->mu);
    if (!waiting) return;
    late_set(c, LATE_GO, LATE_FAILED);
    /* the stream's work after the failed collective (the caller's marker) completes meanwhile */
    struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

static void coll_run(dps_dbl_work_t *w)
{
    coll_t *x = w->ctx;
    comm_t *c = x->c;
    const dps_dbl_conf_t *conf = dps_dbl_conf();
    /* A comm's collectives run one at a time in enqueue order, whatever streams carry them. */
    pthread_mutex_lock(&c->mu);
    while (c->next_run < x->k && !dps_dbl_stopped(c))
        pthread_cond_wait(&c->cv, &c->mu);
    c->busy++;
    pthread_mutex_unlock(&c->mu);
    dps_dbl_trace("collective #%llu runs on rank %d", (unsigned long long)x->k, c->rank);
    int state = atomic_load(&c->async); /* in progress: a later collective's launch */
    if (dps_dbl_stopped(c) || (state != NCCL_OK && state != NCCL_IN_PROGRESS)) {
        /* nothing: an aborted, cancelled or failed comm's collectives end without results */
    } else if (conf->stall_rank == c->rank && (uint64_t)conf->stall_at == x->k &&
               (!conf->stall_comm || conf->stall_comm == c->made)) {
        dps_dbl_trace("collective #%llu stalls (GPU_DOUBLE_STALL_RANK)", (unsigned long long)x->k);
        while (!dps_dbl_stopped(c)) {
            unsigned seen = atomic_load(&c->seg->bell);
            if (!dps_dbl_stopped(c)) dps_dbl_doze(c->seg, seen);
        }
    } else if (conf->async_error_rank == c->rank && (uint64_t)conf->async_error_at == x->k) {
        if (conf->async_error_late) late_set(c, LATE_WAITING, LATE_GO);
        dps_dbl_comm_fail(c, NCCL_SYSTEM_ERROR,
                          "test double: injected asynchronous failure in collective #%llu",
                          (unsigned long long)x->k);
        if (conf->async_error_late) late_set(c, LATE_FAILED, 0);
    } else if (x->scale_ptr) {
        void *rw;
        size_t esz = dps_dbl_dtype_size(x->desc.dtype);
        if (dps_dbl_lookup(x->scale_ptr, esz, &rw, NULL) == DPS_DBL_MEM_DEVICE) {
            memcpy(x->desc.scale, rw, esz);
            coll_steps(x);
        } else {
            dps_dbl_comm_fail(c, NCCL_INVALID_ARGUMENT,
                              "test double: the device scalar %p of collective #%llu was freed", x->scale_ptr,
                              (unsigned long long)x->k);
        }
    } else {
        coll_steps(x);
    }
    pthread_mutex_lock(&c->mu);
    c->busy--;
    c->finished++;
    if (c->next_run < x->k + 1) c->next_run = x->k + 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Under the streams' lock, in enqueue order: the collective's number. */
static void coll_accepted(dps_dbl_work_t *w, void *stream, uint64_t seq)
{
    (void)stream, (void)seq;
    coll_t *x = w->ctx;
    x->k = atomic_fetch_add(&x->c->colls, 1) + 1;
    x->desc.coll = x->k;
    pthread_mutex_lock(&x->c->mu);
    x->c->queued++;
    pthread_mutex_unlock(&x->c->mu);
}

static void coll_fini(dps_dbl_work_t *w)
{
    coll_t *x = w->ctx;
    dps_dbl_comm_put(x->c);
    free(x);
}

/* Checks a collective and enqueues it on the stream: NCCL's argument errors come back now,
 * everything else asynchronously. */
static int coll_check_enqueue(const char *name, const void *send, void *recv, size_t count, int dtype, int op,
                              int root, int kind, void *comm, void *stream);

static int coll_enqueue(const char *name, const void *send, void *recv, size_t count, int dtype, int op,
                        int root, int kind, void *comm, void *stream)
{
    comm_t *c = dps_dbl_comm_get(comm);
    if (c) dps_dbl_comm_enter(c, name);
    int err = coll_check_enqueue(name, send, recv, count, dtype, op, root, kind, comm, stream);
    if (c) dps_dbl_comm_leave(c), dps_dbl_comm_put(c);
    return err;
}

static int coll_check_enqueue(const char *name, const void *send, void *recv, size_t count, int dtype, int op,
                              int root, int kind, void *comm, void *stream)
{
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c) {
        dps_dbl_nccl_error("test double: %s: invalid or destroyed communicator %p", name, comm);
        return NCCL_INVALID_ARGUMENT;
    }
    int err = dps_dbl_nccl_runtime_gone()                          ? NCCL_CUDA_ERROR
              : dps_dbl_busy_comm(c) || dps_dbl_nccl_second_copy() ? NCCL_INVALID_ARGUMENT
                                                                   : atomic_load(&c->async);
    coll_t x = {c,
                0,
                {0,
                 0,
                 count,
                 kind,
                 dtype,
                 kind == COLL_ALLREDUCE ? -1 : root,
                 kind == COLL_ALLREDUCE ? op : -1,
                 0,
                 {0}},
                NULL,
                NULL,
                NULL};
    size_t esz = dps_dbl_dtype_size(dtype);
    if (!err && !esz) {
        dps_dbl_nccl_error("%s: invalid type %d", name, dtype);
        err = NCCL_INVALID_ARGUMENT;
    }
    if (!err && kind == COLL_BROADCAST && (root < 0 || root >= c->nranks)) {
        dps_dbl_nccl_error("%s: invalid root %d (root should be in the 0..%d range)", name, root, c->nranks);
        err = NCCL_INVALID_ARGUMENT;
    }
    if (!err && kind == COLL_ALLREDUCE && op >= NCCL_NUM_OPS) {
        pthread_mutex_lock(&c->mu);
        int i = op - NCCL_NUM_OPS;
        premul_t p = i < c->nops ? c->ops[i] : (premul_t){0};
        pthread_mutex_unlock(&c->mu);
        if (!p.used || p.dtype != dtype) {
            dps_dbl_nccl_error("%s: invalid reduction operation %d for type %d", name, op, dtype);
            err = NCCL_INVALID_ARGUMENT;
        }
        x.desc.op = DPS_DBL_SUM; /* a premultiplied sum sums like a plain one, across ranks */
        x.desc.scaled = 1;
        memcpy(x.desc.scale, p.imm, sizeof p.imm);
        x.scale_ptr = p.residence == SCALAR_DEVICE ? p.ptr : NULL;
    } else if (!err && kind == COLL_ALLREDUCE && op < 0) {
        dps_dbl_nccl_error("%s: invalid reduction operation %d", name, op);
        err = NCCL_INVALID_ARGUMENT;
    }
    size_t bytes = count * esz;
    if (!err && esz && bytes / esz != count) err = NCCL_INVALID_ARGUMENT;
    void *rw;
    int need_send = kind == COLL_ALLREDUCE || c->rank == root, bdev = -1;
    if (!err && count && need_send) {
        if (dps_dbl_lookup(send, bytes, &rw, &bdev) == DPS_DBL_MEM_DEVICE) {
            x.send = rw;
        } else {
            dps_dbl_nccl_error("%s: send buffer %p is not device memory of %zu bytes", name, send, bytes);
            err = NCCL_INVALID_ARGUMENT;
        }
        if (!err && bdev != c->dev) {
            dps_dbl_nccl_error("%s : sendbuff allocated on device %d mismatchs with NCCL device %d", name,
                               bdev, c->dev);
            err = NCCL_INVALID_ARGUMENT;
        }
    }
    if (!err && count) {
        if (dps_dbl_lookup(recv, bytes, &rw, &bdev) == DPS_DBL_MEM_DEVICE) {
            x.recv = rw;
        } else {
            dps_dbl_nccl_error("%s: recv buffer %p is not device memory of %zu bytes", name, recv, bytes);
            err = NCCL_INVALID_ARGUMENT;
        }
        if (!err && bdev != c->dev) {
            dps_dbl_nccl_error("%s : recvbuff allocated on device %d mismatchs with NCCL device %d", name,
                               bdev, c->dev);
            err = NCCL_INVALID_ARGUMENT;
        }
    }
    /* NCCL launches on the communicator's device: a stream of another one is no valid handle there */
    int sdev = dps_dbl_stream_device(stream);
    if (!err && count && sdev != c->dev) {
        dps_dbl_nccl_error(
            "Cuda failure 400 'invalid resource handle' (a stream of device %d on the communicator "
            "of device %d)",
            sdev, c->dev);
        err = NCCL_CUDA_ERROR;
    }
    coll_t *heap = !err && count ? malloc(sizeof *heap) : NULL;
    if (err || !count || !heap) {
        dps_dbl_comm_put(c);
        return err ? err : count ? NCCL_SYSTEM_ERROR : NCCL_OK; /* nothing to move: nothing to do */
    }
    *heap = x; /* carries the reference comm_get took, until coll_fini */
    dps_dbl_work_t w = {
        .run = coll_run, .fini = coll_fini, .accepted = coll_accepted, .delayed = 1, .ctx = heap};
    /* GPU_DOUBLE_DIE_AT=0: that rank ends as it launches its first collective, before its side
     * connects: its peers' launches stay in progress */
    if (c->seg && !atomic_load(&dps_dbl_me(c)->launched)) {
        if (dps_dbl_conf()->die_rank == c->rank && dps_dbl_conf()->die_at == 0) raise(SIGKILL);
        atomic_store(&dps_dbl_me(c)->launched, 1);
        dps_dbl_ring(c->seg);
    }
    int ok = NCCL_OK;
    if (c->nonblocking && atomic_compare_exchange_strong(&c->async, &ok, NCCL_IN_PROGRESS)) {
        /* as NCCL from 2.23: launched on a thread of its own, done when a poll says so */
        pthread_mutex_lock(&c->mu);
        c->pending = w, c->pending_stream = stream, c->has_pending = 1;
        pthread_mutex_unlock(&c->mu);
        return NCCL_IN_PROGRESS;
    }
    int cerr = dps_dbl_enqueue(stream, &w, 0, NULL);
    if (cerr) {
        dps_dbl_nccl_error("Cuda failure %d '%s'", cerr, dps_dbl_cuda_error_string(cerr));
        return NCCL_CUDA_ERROR;
    }
    return NCCL_OK;
}

DPS_DBL_API int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm,
                              void *stream)
{
    dps_dbl_trace("ncclAllReduce send=%p recv=%p count=%zu dtype=%d op=%d comm=%p stream=%p", send, recv,
                  count, dtype, op, comm, stream);
    return coll_enqueue("AllReduce", send, recv, count, dtype, op, 0, COLL_ALLREDUCE, comm, stream);
}

DPS_DBL_API int ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, void *comm,
                              void *stream)
{
    dps_dbl_trace("ncclBroadcast send=%p recv=%p count=%zu dtype=%d root=%d comm=%p stream=%p", send, recv,
                  count, dtype, root, comm, stream);
    return coll_enqueue("Broadcast", send, recv, count, dtype, -1, root, COLL_BROADCAST, comm, stream);
}

DPS_DBL_API int ncclBcast(void *buf, size_t count, int dtype, int root, void *comm, void *stream)
{
    dps_dbl_trace("ncclBcast buf=%p count=%zu dtype=%d root=%d comm=%p stream=%p", buf, count, dtype, root,
                  comm, stream);
    return coll_enqueue("Broadcast", buf, buf, count, dtype, -1, root, COLL_BROADCAST, comm, stream);
}
