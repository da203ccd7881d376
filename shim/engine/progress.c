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
    size_t first, n; /* tensors queue.t[first .. first+n) */
    dps_weight_t w;
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
} queue = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER};

static void *progress_main(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the program's, not ours */
    dp_tensor *mine = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&queue.lock);
    for (;;) {
        while (!queue.stop && (queue.next == queue.ng || queue.err[0]))
            pthread_cond_wait(&queue.work, &queue.lock);
        if (queue.stop) break;
        group_t g = queue.g[queue.next];
        /* the submitter may grow queue.t meanwhile: work on a copy */
        if (dps_grow((void **)&mine, &cap, g.n, sizeof *mine)) {
            snprintf(queue.err, sizeof queue.err, "dp_grad_ready: out of memory in the progress thread");
            pthread_cond_broadcast(&queue.idle);
            continue;
        }
        memcpy(mine, queue.t + g.first, g.n * sizeof *mine);
        queue.busy = 1;
        pthread_mutex_unlock(&queue.lock);
        char err[sizeof queue.err] = "";
        int rc = dps_fused_background("dp_grad_ready", queue.be, mine, g.n, g.w, err, sizeof err);
        pthread_mutex_lock(&queue.lock);
        queue.busy = 0;
        queue.next++;
        if (rc) snprintf(queue.err, sizeof queue.err, "%s", err);
        if (queue.next == queue.ng || queue.err[0]) pthread_cond_broadcast(&queue.idle);
    }
    pthread_mutex_unlock(&queue.lock);
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
    pthread_mutex_lock(&queue.lock);
    if (!queue.running && !queue.stop) {
        queue.be = be;
        queue.running = pthread_create(&queue.thread, NULL, progress_main, NULL) == 0;
        if (!queue.running)
            DPS_WARN("[comm] overlap: cannot start the progress thread; gradients are reduced in dp_grads");
        queue.stop = !queue.running; /* do not try again */
    }
    int ok = queue.running;
    atomic_store_explicit(&decided, ok ? 1 : -1, memory_order_release);
    pthread_mutex_unlock(&queue.lock);
    return ok;
}

int dps_progress_submit(const dp_tensor *t, size_t n, dps_weight_t w)
{
    pthread_mutex_lock(&queue.lock);
    int rc = -1;
    if (dps_grow((void **)&queue.t, &queue.cap_t, queue.nt + n, sizeof *queue.t) ||
        dps_grow((void **)&queue.g, &queue.cap_g, queue.ng + 1, sizeof *queue.g))
        goto out;
    memcpy(queue.t + queue.nt, t, n * sizeof *t);
    queue.g[queue.ng++] = (group_t){queue.nt, n, w};
    queue.nt += n;
    pthread_cond_signal(&queue.work);
    rc = 0;
out:
    pthread_mutex_unlock(&queue.lock);
    if (rc) DPS_ERROR("dp_grad_ready: out of memory queueing gradients for the progress thread");
    return rc;
}

int dps_progress_wait(char *err, size_t errlen)
{
    pthread_mutex_lock(&queue.lock);
    while (queue.next < queue.ng && !queue.err[0])
        pthread_cond_wait(&queue.idle, &queue.lock);
    int rc = queue.err[0] ? -1 : 0;
    if (rc)
        snprintf(err, errlen, "%s", queue.err);
    else
        queue.nt = queue.ng = queue.next = 0; /* drained: the next step starts from an empty queue */
    pthread_mutex_unlock(&queue.lock);
    return rc;
}

void dps_progress_stop(void)
{
    pthread_mutex_lock(&queue.lock);
    int running = queue.running, busy = queue.busy || queue.next < queue.ng;
    queue.stop = 1;
    pthread_cond_broadcast(&queue.work);
    pthread_mutex_unlock(&queue.lock);
    if (!running) return;
    if (busy) {
        /* only a program that announced gradients and never called dp_grads gets here; its
         * thread may wait in a collective forever, so it is left behind */
        DPS_WARN("exit while gradients announced by dp_grad_ready are still being reduced; call dp_grads "
                 "before the program ends");
        return;
    }
    pthread_join(queue.thread, NULL);
    queue.running = 0;
}
