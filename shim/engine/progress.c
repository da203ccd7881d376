/* The progress thread ([comm] overlap): buckets of gradients announced by dp_grad_ready are
 * reduced on the backend's background channel while the framework's backward pass goes on;
 * dp_grads hands over the rest and waits. Groups are reduced in the order they were submitted,
 * which is the order of the dp_grad_ready calls, so it is the same on every rank. */
#define _GNU_SOURCE
#include "progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dps.h"

typedef struct group {
    size_t first, n; /* tensors q.t[first .. first+n) */
    double scale;
} group_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work, idle;
    pthread_t thread;
    int running, stop, busy;
    const dps_backend_t *be;
    dp_tensor *t; /* every tensor submitted since the queue was last empty */
    size_t nt, cap_t;
    group_t *g;
    size_t ng, cap_g, next; /* groups submitted, and the next one to reduce */
    char err[1024];         /* the first failure; the queue stops there */
} q = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER};

static void *progress_main(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the program's, not ours */
    dp_tensor *mine = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&q.lock);
    for (;;) {
        while (!q.stop && (q.next == q.ng || q.err[0]))
            pthread_cond_wait(&q.work, &q.lock);
        if (q.stop) break;
        group_t g = q.g[q.next];
        /* the submitter may grow q.t meanwhile: work on a copy */
        if (dps_grow((void **)&mine, &cap, g.n, sizeof *mine)) {
            snprintf(q.err, sizeof q.err, "dp_grad_ready: out of memory in the progress thread");
            pthread_cond_broadcast(&q.idle);
            continue;
        }
        memcpy(mine, q.t + g.first, g.n * sizeof *mine);
        q.busy = 1;
        pthread_mutex_unlock(&q.lock);
        char err[sizeof q.err] = "";
        int rc = dps_fused_background("dp_grad_ready", q.be, mine, g.n, g.scale, err, sizeof err);
        pthread_mutex_lock(&q.lock);
        q.busy = 0;
        q.next++;
        if (rc) snprintf(q.err, sizeof q.err, "%s", err);
        if (q.next == q.ng || q.err[0]) pthread_cond_broadcast(&q.idle);
    }
    pthread_mutex_unlock(&q.lock);
    free(mine);
    return NULL;
}

int dps_progress_available(const dps_backend_t *be)
{
    if (!dps_g.overlap || !be->allreduce_bg) return 0;
    /* decided once; every dp_grad_ready asks */
    static atomic_int decided; /* 0: not yet, 1: running, -1: could not start */
    int d = atomic_load_explicit(&decided, memory_order_acquire);
    if (d) return d > 0;
    pthread_mutex_lock(&q.lock);
    if (!q.running && !q.stop) {
        q.be = be;
        q.running = pthread_create(&q.thread, NULL, progress_main, NULL) == 0;
        if (!q.running)
            DPS_WARN("[comm] overlap: cannot start the progress thread; gradients are reduced in dp_grads");
        q.stop = !q.running; /* do not try again */
    }
    int ok = q.running;
    atomic_store_explicit(&decided, ok ? 1 : -1, memory_order_release);
    pthread_mutex_unlock(&q.lock);
    return ok;
}

int dps_progress_submit(const dp_tensor *t, size_t n, double scale)
{
    pthread_mutex_lock(&q.lock);
    int rc = -1;
    if (dps_grow((void **)&q.t, &q.cap_t, q.nt + n, sizeof *q.t) ||
        dps_grow((void **)&q.g, &q.cap_g, q.ng + 1, sizeof *q.g))
        goto out;
    memcpy(q.t + q.nt, t, n * sizeof *t);
    q.g[q.ng++] = (group_t){q.nt, n, scale};
    q.nt += n;
    pthread_cond_signal(&q.work);
    rc = 0;
out:
    pthread_mutex_unlock(&q.lock);
    if (rc) DPS_ERROR("dp_grad_ready: out of memory queueing gradients for the progress thread");
    return rc;
}

int dps_progress_wait(char *err, size_t errlen)
{
    pthread_mutex_lock(&q.lock);
    while (q.next < q.ng && !q.err[0])
        pthread_cond_wait(&q.idle, &q.lock);
    int rc = q.err[0] ? -1 : 0;
    if (rc)
        snprintf(err, errlen, "%s", q.err);
    else
        q.nt = q.ng = q.next = 0; /* drained: the next step starts from an empty queue */
    pthread_mutex_unlock(&q.lock);
    return rc;
}

void dps_progress_stop(void)
{
    pthread_mutex_lock(&q.lock);
    int running = q.running, busy = q.busy || q.next < q.ng;
    q.stop = 1;
    pthread_cond_broadcast(&q.work);
    pthread_mutex_unlock(&q.lock);
    if (!running) return;
    if (busy) {
        /* only a program that announced gradients and never called dp_grads gets here; its
         * thread may wait in a collective forever, so it is left behind */
        DPS_WARN("exit while gradients announced by dp_grad_ready are still being reduced; call dp_grads "
                 "before the program ends");
        return;
    }
    pthread_join(q.thread, NULL);
    q.running = 0;
}
