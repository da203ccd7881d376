/* The double's streams and events. A stream is a worker thread running its operations in order;
 * an operation also waits for what CUDA's rules make it wait for: the legacy default stream and
 * the blocking streams wait for each other, cudaStreamWaitEvent adds an event's marker. All of
 * it is decided at enqueue time, as snapshots of per-stream counters, under one lock. */
#define _GNU_SOURCE
#include "double.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

enum { NONBLOCKING = 1 };
enum { CAPTURE_NONE = 0, CAPTURE_ACTIVE = 1, CAPTURE_INVALIDATED = 2 };

typedef struct stream stream_t;

/* Something an operation waits for: stream s has completed upto operations. */
typedef struct dep {
    stream_t *s;
    uint64_t upto;
} dep_t;

typedef struct op {
    struct op *next;
    dps_dbl_work_t w;
    uint64_t seq; /* its position in its stream, from 1 */
    int ndeps;
    dep_t *deps;
} op_t;

struct stream {
    stream_t *next; /* every stream that exists: with a handle, or still working */
    unsigned flags;
    int legacy;
    int refs; /* its handle, its worker, events and operations waiting on it */
    int destroyed, has_worker, capturing;
    int dev;                 /* the device current when it was made (the legacy stream: none) */
    int capture_mode;        /* as cudaStreamBeginCapture was given it */
    pthread_t capture_owner; /* the thread that began the capture */
    uint64_t enqueued, completed;
    op_t *head, *tail;
    pthread_cond_t work; /* an operation arrived, or the handle was destroyed */
};

typedef struct event {
    struct event *next;
    unsigned flags;
    stream_t *s; /* where it was last recorded (NULL: never), and its marker */
    uint64_t upto;
} event_t;

/* One lock for all streams and events; progress: some operation completed. */
static pthread_mutex_t sched = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER;
static stream_t legacy_stream = {.legacy = 1, .refs = 1, .work = PTHREAD_COND_INITIALIZER};
static stream_t *streams = &legacy_stream;
static event_t *events;
static char dummy_graph; /* what cudaStreamEndCapture hands out: no graph is ever built */

/* cudaStreamCaptureMode: the calling thread's (cudaThreadExchangeStreamCaptureMode). */
enum { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 };
static __thread int thread_capture_mode = MODE_GLOBAL;

/* A potentially unsafe call (a query or synchronization) from a thread in global mode while
 * another thread captures in global mode: CUDA refuses it and the capture is invalidated (a
 * watchdog thread querying events breaks the program's torch.cuda.graph capture). Under sched. */
static int unsafe_during_capture(void)
{
    if (thread_capture_mode != MODE_GLOBAL) return 0;
    int hit = 0;
    for (stream_t *t = streams; t; t = t->next)
        if (t->capturing == CAPTURE_ACTIVE && t->capture_mode == MODE_GLOBAL &&
            !pthread_equal(t->capture_owner, pthread_self())) {
            t->capturing = CAPTURE_INVALIDATED;
            hit = 1;
        }
    if (hit) dps_dbl_trace("an unsafe call from another thread in global capture mode invalidated a capture");
    return hit ? DPS_DBL_ECAPTURE : 0;
}

DPS_DBL_API int cudaThreadExchangeStreamCaptureMode(int *mode)
{
    dps_dbl_trace("cudaThreadExchangeStreamCaptureMode mode=%d", mode ? *mode : -1);
    if (!mode || *mode < MODE_GLOBAL || *mode > MODE_RELAXED) return dps_dbl_rt_end(DPS_DBL_EINVAL);
    int old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return DPS_DBL_SUCCESS;
}

static int is_legacy_handle(void *h)
{
    return !h || h == (void *)0x1 || h == (void *)0x2;
}

int dps_dbl_stream_device(void *h)
{
    int dev = -1;
    if (is_legacy_handle(h)) return dps_dbl_current_device(&dev) ? -1 : dev; /* each device has its own */
    pthread_mutex_lock(&sched);
    for (stream_t *t = streams; t; t = t->next)
        if (t == h && !t->destroyed) dev = t->dev;
    pthread_mutex_unlock(&sched);
    return dev;
}

/* The stream behind a handle (cudaStreamPerThread is taken as the legacy stream), or NULL. */
static stream_t *resolve(void *h)
{
    if (is_legacy_handle(h)) return &legacy_stream;
    for (stream_t *s = streams; s; s = s->next)
        if (s == h && !s->destroyed) return s;
    return NULL;
}

static event_t *find_event(void *h)
{
    for (event_t *e = events; e; e = e->next)
        if (e == h) return e;
    return NULL;
}

static int blocking(const stream_t *s)
{
    return !s->legacy && !(s->flags & NONBLOCKING);
}

static void unref(stream_t *s)
{
    if (--s->refs > 0) return;
    stream_t **p = &streams;
    while (*p != s)
        p = &(*p)->next;
    *p = s->next;
    pthread_cond_destroy(&s->work);
    free(s);
}

static int deps_met(const dep_t *d, int n)
{
    for (int i = 0; i < n; i++)
        if (d[i].s->completed < d[i].upto) return 0;
    return 1;
}

static void release_deps(dep_t *d, int n)
{
    for (int i = 0; i < n; i++)
        unref(d[i].s);
    free(d);
}

/* What work on s must wait for now, beyond s's own order: the legacy stream waits for every
 * blocking stream, a blocking stream for the legacy stream; plus extra (an event). *d_p gets a
 * reference to each stream. Returns the count, or -1 without memory. */
static int snapshot(const stream_t *s, const dep_t *extra, dep_t **d_p)
{
    int n = 0, cap = 1;
    for (stream_t *t = streams; t; t = t->next)
        cap++;
    dep_t *d = malloc((size_t)cap * sizeof *d);
    if (!d) return -1;
    for (stream_t *t = streams; t; t = t->next) {
        if (t == s || t->completed >= t->enqueued) continue;
        if ((s->legacy && blocking(t)) || (blocking(s) && t->legacy)) d[n++] = (dep_t){t, t->enqueued};
    }
    if (extra && extra->s != s && extra->s->completed < extra->upto) d[n++] = *extra;
    for (int i = 0; i < n; i++)
        d[i].s->refs++;
    *d_p = d;
    return n;
}

/* Using the legacy stream while a blocking stream captures would make the capture depend on it:
 * CUDA refuses and invalidates the capture. */
static int legacy_conflict(int invalidate)
{
    int hit = 0;
    for (stream_t *t = streams; t; t = t->next)
        if (blocking(t) && t->capturing == CAPTURE_ACTIVE) {
            hit = 1;
            if (invalidate) t->capturing = CAPTURE_INVALIDATED;
        }
    return hit;
}

static void *worker(void *arg)
{
    stream_t *s = arg;
    const dps_dbl_conf_t *conf = dps_dbl_conf();
    pthread_mutex_lock(&sched);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&s->work, &sched);
        op_t *op = s->head;
        if (!op) break;
        while (!deps_met(op->deps, op->ndeps))
            pthread_cond_wait(&progress, &sched);
        pthread_mutex_unlock(&sched);
        if (op->w.delayed && conf->delay_ms > 0) dps_dbl_sleep_us(conf->delay_ms * 1000);
        if (op->w.run) op->w.run(&op->w);
        if (op->w.fini) op->w.fini(&op->w);
        pthread_mutex_lock(&sched);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->completed = op->seq;
        release_deps(op->deps, op->ndeps);
        free(op);
        pthread_cond_broadcast(&progress);
    }
    s->has_worker = 0;
    unref(s);
    pthread_mutex_unlock(&sched);
    return NULL;
}

static int start_worker(stream_t *s)
{
    int rc = dps_dbl_start_thread(worker, s);
    if (rc) return DPS_DBL_ENOMEM;
    s->has_worker = 1;
    s->refs++;
    return DPS_DBL_SUCCESS;
}

/* Under sched. *discarded_p: a capture took it (it will not run). *seq_p: its position. */
static int enqueue_locked(stream_t *s, const dps_dbl_work_t *w, const dep_t *extra, uint64_t *seq_p,
                          int *discarded_p)
{
    *discarded_p = 0;
    if (s->legacy && legacy_conflict(1)) return DPS_DBL_ECAPIMPLICIT;
    if (s->capturing == CAPTURE_INVALIDATED) return DPS_DBL_ECAPINVALID;
    if (s->capturing == CAPTURE_ACTIVE) {
        *discarded_p = 1; /* a graph is never launched here: captured work is dropped */
        return DPS_DBL_SUCCESS;
    }
    if (!s->has_worker && start_worker(s)) return DPS_DBL_ENOMEM;
    op_t *op = calloc(1, sizeof *op);
    if (!op || (op->ndeps = snapshot(s, extra, &op->deps)) < 0) {
        free(op);
        return DPS_DBL_ENOMEM;
    }
    op->w = *w;
    op->seq = ++s->enqueued;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    if (op->w.accepted) op->w.accepted(&op->w, s, op->seq);
    pthread_cond_signal(&s->work);
    *seq_p = op->seq;
    return DPS_DBL_SUCCESS;
}

static void wait_upto(stream_t *s, uint64_t upto)
{
    s->refs++;
    while (s->completed < upto)
        pthread_cond_wait(&progress, &sched);
    unref(s);
}

int dps_dbl_enqueue(void *stream, const dps_dbl_work_t *w, int wait, int *captured_p)
{
    dps_dbl_work_t copy = *w;
    uint64_t seq = 0;
    int discarded = 0, err = DPS_DBL_EHANDLE;
    pthread_mutex_lock(&sched);
    stream_t *s = resolve(stream);
    if (s) err = enqueue_locked(s, w, NULL, &seq, &discarded);
    if (s && !err && !discarded && wait) wait_upto(s, seq);
    pthread_mutex_unlock(&sched);
    if (captured_p) *captured_p = discarded;
    if ((err || discarded) && copy.fini) copy.fini(&copy);
    return err;
}

/* Waits for what the snapshot of s (or of every stream, s NULL) holds now. */
static void sync_locked(stream_t *s)
{
    dep_t *d;
    int n = 0;
    if (s) {
        /* The stream's own work; for the legacy stream also, as for a legacy operation, the
         * blocking streams' work. */
        if (s->legacy)
            n = snapshot(s, NULL, &d);
        else
            n = (d = malloc(sizeof *d)) ? 0 : -1;
        if (n >= 0 && s->completed < s->enqueued) {
            d[n++] = (dep_t){s, s->enqueued};
            s->refs++;
        }
    } else {
        int cap = 0;
        for (stream_t *t = streams; t; t = t->next)
            cap++;
        d = malloc((size_t)cap * sizeof *d);
        for (stream_t *t = streams; d && t; t = t->next)
            if (t->completed < t->enqueued) {
                d[n++] = (dep_t){t, t->enqueued};
                t->refs++;
            }
        if (!d) n = -1;
    }
    if (n < 0) return;
    while (!deps_met(d, n))
        pthread_cond_wait(&progress, &sched);
    release_deps(d, n);
}

void dps_dbl_drain_all(void)
{
    pthread_mutex_lock(&sched);
    sync_locked(NULL);
    pthread_mutex_unlock(&sched);
}

/* ---- streams ---- */

DPS_DBL_API int cudaStreamCreateWithFlags(void **h, unsigned flags)
{
    dps_dbl_trace("cudaStreamCreateWithFlags flags=%u", flags);
    int err = dps_dbl_rt_begin();
    if (err || !h) return dps_dbl_rt_end(err ? err : DPS_DBL_EINVAL);
    stream_t *s = calloc(1, sizeof *s);
    if (!s) return dps_dbl_rt_end(DPS_DBL_ENOMEM);
    s->flags = flags, s->refs = 1;
    dps_dbl_current_device(&s->dev);
    pthread_cond_init(&s->work, NULL);
    pthread_mutex_lock(&sched);
    err = start_worker(s);
    if (!err) {
        s->next = streams->next; /* after the legacy stream, which stays first */
        streams->next = s;
    }
    pthread_mutex_unlock(&sched);
    if (err) {
        pthread_cond_destroy(&s->work);
        free(s);
        return dps_dbl_rt_end(err);
    }
    *h = s;
    dps_dbl_trace("cudaStreamCreateWithFlags -> %p", (void *)s);
    return DPS_DBL_SUCCESS;
}

DPS_DBL_API int cudaStreamCreate(void **h)
{
    return cudaStreamCreateWithFlags(h, 0);
}

/* CUDA returns at once; the stream's queued work still runs, then its resources go. */
DPS_DBL_API int cudaStreamDestroy(void *h)
{
    DPS_DBL_RT_ENTER("cudaStreamDestroy stream=%p", h);
    pthread_mutex_lock(&sched);
    stream_t *s = is_legacy_handle(h) ? NULL : resolve(h);
    if (s) {
        s->destroyed = 1;
        s->capturing = CAPTURE_NONE;
        pthread_cond_signal(&s->work);
        unref(s);
    }
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(s ? DPS_DBL_SUCCESS : DPS_DBL_EHANDLE);
}

/* Synchronizing or querying a capturing stream is not allowed and breaks the capture; for the
 * legacy stream, a capturing blocking stream is the conflict. */
static int sync_check(stream_t *s)
{
    if (s->legacy) return legacy_conflict(1) ? DPS_DBL_ECAPIMPLICIT : 0;
    if (s->capturing == CAPTURE_NONE) return 0;
    s->capturing = CAPTURE_INVALIDATED;
    return DPS_DBL_ECAPTURE;
}

DPS_DBL_API int cudaStreamSynchronize(void *h)
{
    DPS_DBL_RT_ENTER("cudaStreamSynchronize stream=%p", h);
    pthread_mutex_lock(&sched);
    stream_t *s = resolve(h);
    err = unsafe_during_capture();
    if (!err) err = s ? sync_check(s) : DPS_DBL_EHANDLE;
    if (!err) sync_locked(s);
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaStreamQuery(void *h)
{
    DPS_DBL_RT_ENTER("cudaStreamQuery stream=%p", h);
    pthread_mutex_lock(&sched);
    stream_t *s = resolve(h);
    err = unsafe_during_capture();
    if (!err) err = s ? sync_check(s) : DPS_DBL_EHANDLE;
    if (!err) {
        int busy = s->completed < s->enqueued;
        for (stream_t *t = streams; s->legacy && t; t = t->next)
            busy |= blocking(t) && t->completed < t->enqueued;
        err = busy ? DPS_DBL_ENOTREADY : DPS_DBL_SUCCESS;
    }
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaDeviceSynchronize(void)
{
    DPS_DBL_RT_ENTER("cudaDeviceSynchronize");
    pthread_mutex_lock(&sched);
    for (stream_t *t = streams; t; t = t->next)
        if (t->capturing == CAPTURE_ACTIVE) {
            t->capturing = CAPTURE_INVALIDATED;
            err = DPS_DBL_ECAPTURE;
        }
    if (!err) sync_locked(NULL);
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaStreamBeginCapture(void *h, int mode)
{
    DPS_DBL_RT_ENTER("cudaStreamBeginCapture stream=%p mode=%d", h, mode);
    pthread_mutex_lock(&sched);
    stream_t *s = resolve(h);
    if (!s)
        err = DPS_DBL_EHANDLE;
    else if (s->legacy)
        err = DPS_DBL_ECAPTURE; /* the legacy stream cannot capture */
    else if (s->capturing)
        err = DPS_DBL_ESTATE;
    else if (mode < MODE_GLOBAL || mode > MODE_RELAXED)
        err = DPS_DBL_EINVAL;
    else
        s->capturing = CAPTURE_ACTIVE, s->capture_mode = mode, s->capture_owner = pthread_self();
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaStreamEndCapture(void *h, void **graph)
{
    DPS_DBL_RT_ENTER("cudaStreamEndCapture stream=%p", h);
    pthread_mutex_lock(&sched);
    stream_t *s = resolve(h);
    if (!s)
        err = DPS_DBL_EHANDLE;
    else if (!graph)
        err = DPS_DBL_EINVAL;
    else if (s->legacy || !s->capturing)
        err = DPS_DBL_ESTATE;
    else {
        err = s->capturing == CAPTURE_INVALIDATED ? DPS_DBL_ECAPINVALID : DPS_DBL_SUCCESS;
        *graph = err ? NULL : &dummy_graph;
        s->capturing = CAPTURE_NONE;
    }
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaStreamIsCapturing(void *h, int *status)
{
    DPS_DBL_RT_ENTER("cudaStreamIsCapturing stream=%p", h);
    pthread_mutex_lock(&sched);
    stream_t *s = resolve(h);
    if (!s)
        err = DPS_DBL_EHANDLE;
    else if (!status)
        err = DPS_DBL_EINVAL;
    else if (s->legacy)
        /* CUDA: the legacy stream while a blocking stream captures says so, and the capture
         * goes on. */
        err = legacy_conflict(0) ? DPS_DBL_ECAPIMPLICIT : (*status = CAPTURE_NONE, DPS_DBL_SUCCESS);
    else
        *status = s->capturing;
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaGraphDestroy(void *graph)
{
    dps_dbl_trace("cudaGraphDestroy graph=%p", graph);
    return dps_dbl_rt_end(graph == &dummy_graph ? DPS_DBL_SUCCESS : DPS_DBL_EINVAL);
}

/* ---- events ---- */

DPS_DBL_API int cudaEventCreateWithFlags(void **h, unsigned flags)
{
    dps_dbl_trace("cudaEventCreateWithFlags flags=%u", flags);
    int err = dps_dbl_rt_begin();
    if (err || !h) return dps_dbl_rt_end(err ? err : DPS_DBL_EINVAL);
    event_t *e = calloc(1, sizeof *e);
    if (!e) return dps_dbl_rt_end(DPS_DBL_ENOMEM);
    e->flags = flags;
    pthread_mutex_lock(&sched);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&sched);
    *h = e;
    dps_dbl_trace("cudaEventCreateWithFlags -> %p", (void *)e);
    return DPS_DBL_SUCCESS;
}

DPS_DBL_API int cudaEventCreate(void **h)
{
    return cudaEventCreateWithFlags(h, 0);
}

DPS_DBL_API int cudaEventDestroy(void *h)
{
    DPS_DBL_RT_ENTER("cudaEventDestroy event=%p", h);
    pthread_mutex_lock(&sched);
    event_t **p = &events;
    while (*p && *p != h)
        p = &(*p)->next;
    event_t *e = *p;
    if (e) {
        *p = e->next;
        if (e->s) unref(e->s);
        free(e);
    }
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(e ? DPS_DBL_SUCCESS : DPS_DBL_EHANDLE);
}

/* Under sched, when the marker is enqueued: the event now stands for it. */
static void event_marked(dps_dbl_work_t *w, void *stream, uint64_t seq)
{
    event_t *e = w->ctx;
    stream_t *s = stream;
    s->refs++;
    if (e->s) unref(e->s);
    e->s = s, e->upto = seq;
}

DPS_DBL_API int cudaEventRecord(void *h, void *stream)
{
    DPS_DBL_RT_ENTER("cudaEventRecord event=%p stream=%p", h, stream);
    pthread_mutex_lock(&sched);
    event_t *e = find_event(h);
    stream_t *s = resolve(stream);
    if (!e || !s) {
        err = DPS_DBL_EHANDLE;
    } else {
        /* A marker: it completes when everything before it on the stream has. */
        dps_dbl_work_t w = {.accepted = event_marked, .delayed = 1, .ctx = e};
        uint64_t seq;
        int discarded;
        err = enqueue_locked(s, &w, NULL, &seq, &discarded);
    }
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaEventQuery(void *h)
{
    DPS_DBL_RT_ENTER("cudaEventQuery event=%p", h);
    pthread_mutex_lock(&sched);
    event_t *e = find_event(h);
    if ((err = unsafe_during_capture()))
        ;
    else if (!e)
        err = DPS_DBL_EHANDLE;
    else if (e->s && e->s->completed < e->upto)
        err = DPS_DBL_ENOTREADY;
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaEventSynchronize(void *h)
{
    DPS_DBL_RT_ENTER("cudaEventSynchronize event=%p", h);
    pthread_mutex_lock(&sched);
    event_t *e = find_event(h);
    if ((err = unsafe_during_capture()))
        ;
    else if (!e)
        err = DPS_DBL_EHANDLE;
    else if (e->s)
        wait_upto(e->s, e->upto);
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}

/* Later work on the stream waits for the event's marker as it stands now; an event never
 * recorded is no wait. */
DPS_DBL_API int cudaStreamWaitEvent(void *stream, void *h, unsigned flags)
{
    DPS_DBL_RT_ENTER("cudaStreamWaitEvent stream=%p event=%p flags=%u", stream, h, flags);
    pthread_mutex_lock(&sched);
    event_t *e = find_event(h);
    stream_t *s = resolve(stream);
    if (!e || !s) {
        err = DPS_DBL_EHANDLE;
    } else {
        dps_dbl_work_t w = {0};
        dep_t extra = {e->s, e->upto};
        uint64_t seq;
        int discarded;
        err = enqueue_locked(s, &w, e->s ? &extra : NULL, &seq, &discarded);
    }
    pthread_mutex_unlock(&sched);
    return dps_dbl_rt_end(err);
}
