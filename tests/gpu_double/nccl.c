/* The double's NCCL communicators: ranks (processes) meet in a shared-memory segment named
 * after the unique id; init (blocking or not), abort, destroy, queries and error texts. The fault
 * switches make a rank's init fail. collectives.c runs the collectives through the segment. */
#define _GNU_SOURCE
#include "comm.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const char SEG_PREFIX[] = "dpshim-double-";

static size_t seg_size(int nranks)
{
    return dps_dbl_slots_offset(nranks) + (size_t)nranks * SLOT_BYTES;
}

void dps_dbl_ring(seg_hdr_t *h)
{
    atomic_fetch_add(&h->bell, 1);
    syscall(SYS_futex, (uint32_t *)&h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void dps_dbl_doze(seg_hdr_t *h, unsigned seen)
{
    struct timespec ts = {0, 100 * 1000 * 1000};
    syscall(SYS_futex, (uint32_t *)&h->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static pthread_mutex_t comms_lock = PTHREAD_MUTEX_INITIALIZER;
static comm_t *comms;
static pthread_mutex_t error_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];

/* NCCL keeps the last warning's text for ncclGetLastError. */
void dps_dbl_nccl_error(const char *fmt, ...)
{
    char buf[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&error_lock);
    memcpy(last_error, buf, sizeof buf);
    pthread_mutex_unlock(&error_lock);
    dps_dbl_trace("nccl error: %s", buf);
}

int dps_dbl_nccl_runtime_gone(void)
{
    if (!dps_dbl_runtime_gone()) return 0;
    dps_dbl_nccl_error("Cuda failure 4 'driver shutting down'");
    return 1;
}

/* Real NCCL's API functions are weak symbols of default visibility (NCCL_API with PROFAPI),
 * and NCCL calls some of them itself: before each collective, ncclCommEnsureReady calls
 * ncclCommGetAsyncError. A second copy of NCCL loaded into a process that already has one in
 * its global scope therefore reaches the first copy's function, which reads this copy's
 * communicator with its own layout, and every collective fails with "invalid argument". */
int dps_dbl_nccl_second_copy(void)
{
    void *first = dlsym(RTLD_DEFAULT, "ncclCommGetAsyncError");
    Dl_info first_at, own_at;
    if (!first || !dladdr(first, &first_at) || !dladdr((void *)dps_dbl_nccl_second_copy, &own_at) ||
        first_at.dli_fbase == own_at.dli_fbase)
        return 0;
    dps_dbl_nccl_error("Attempt to use communicator before the previous operation returned ncclSuccess "
                       "(test double: this copy of NCCL calls the ncclCommGetAsyncError of another copy, %s)",
                       first_at.dli_fname);
    return 1;
}

/* Handles that abort or destroy freed: their memory is kept, so a later use is recognized. */
static comm_t *dead_comms;

static _Noreturn void crash(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void crash(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    n = n < 0 ? 0 : n > (int)sizeof buf - 2 ? (int)sizeof buf - 2 : n;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
    dps_dbl_trace("crash: %.*s", n - 1, buf);
    abort();
}

comm_t *dps_dbl_comm_get(void *h)
{
    pthread_mutex_lock(&comms_lock);
    for (comm_t *d = dead_comms; d; d = d->next)
        if (d == h)
            crash("gpu double: NCCL communicator %p used after ncclCommAbort or ncclCommDestroy freed it", h);
    comm_t *c = comms;
    while (c && c != h)
        c = c->next;
    if (c && c->pid != getpid()) c = NULL;
    if (c) c->refs++;
    pthread_mutex_unlock(&comms_lock);
    return c;
}

void dps_dbl_comm_enter(comm_t *c, const char *call)
{
    int me = (int)gettid(), none = 0;
    if (!atomic_compare_exchange_strong(&c->caller, &none, me))
        crash("gpu double: two threads called NCCL on communicator %p at once: %s on thread %d while %s on "
              "thread %d (a communicator takes one call at a time)",
              (void *)c, call, me, c->call_name ? c->call_name : "?", none);
    c->call_name = call;
    long us = dps_dbl_conf()->call_us;
    if (us > 0) dps_dbl_sleep_us(us);
}

void dps_dbl_comm_leave(comm_t *c)
{
    atomic_store(&c->caller, 0);
}

/* Removes the handle from the registry; the caller gets the registry's reference. From now on
 * the handle is dead. */
static comm_t *comm_take(void *h)
{
    pthread_mutex_lock(&comms_lock);
    comm_t **p = &comms;
    while (*p && *p != h)
        p = &(*p)->next;
    comm_t *c = *p && (*p)->pid == getpid() ? *p : NULL;
    if (c) *p = c->next;
    pthread_mutex_unlock(&comms_lock);
    return c;
}

/* The handle goes on the dead list (the last reference keeps the memory for that). */
static void comm_bury(comm_t *c)
{
    pthread_mutex_lock(&comms_lock);
    c->dead = 1;
    c->next = dead_comms, dead_comms = c; /* comm_take unlinked it from the live ones */
    pthread_mutex_unlock(&comms_lock);
}

void dps_dbl_comm_put(comm_t *c)
{
    pthread_mutex_lock(&comms_lock);
    int last = --c->refs == 0; /* a dead one's memory stays, to recognize the handle */
    pthread_mutex_unlock(&comms_lock);
    if (!last) return;
    if (c->seg) munmap(c->seg, c->seg_len), c->seg = NULL;
    free(c->ops);
    c->ops = NULL;
    if (c->dead) return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

void dps_dbl_comm_fail(comm_t *c, int code, const char *fmt, ...)
{
    char buf[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    dps_dbl_nccl_error("%s", buf);
    int cur = atomic_load(&c->async);
    while ((cur == NCCL_OK || cur == NCCL_IN_PROGRESS) &&
           !atomic_compare_exchange_weak(&c->async, &cur, code)) {
    }
    if (c->joined) {
        int ok = HEALTH_OK;
        atomic_compare_exchange_strong(&dps_dbl_me(c)->health, &ok, HEALTH_FAILED);
        dps_dbl_ring(c->seg);
    }
}

static void seg_name(const dps_dbl_unique_id_t *id, char *buf, size_t len)
{
    int n = snprintf(buf, len, "/%s", SEG_PREFIX);
    for (int i = 0; i < 16 && n + 2 < (int)len; i++)
        n += snprintf(buf + n, len - (size_t)n, "%02x", (unsigned char)id->internal[i]);
}

/* Opens (or creates: whoever comes first) the segment. Every rank sizes it alike, and growing a
 * file to the size it already has changes nothing, so the race needs no lock. */
static int seg_attach(comm_t *c, const dps_dbl_unique_id_t *id)
{
    seg_name(id, c->name, sizeof c->name);
    c->seg_len = seg_size(c->nranks);
    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    struct stat st;
    void *map = MAP_FAILED;
    if (fd >= 0 && !fstat(fd, &st) && ((size_t)st.st_size >= c->seg_len || !ftruncate(fd, (off_t)c->seg_len)))
        map = mmap(NULL, c->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (map == MAP_FAILED) {
        dps_dbl_nccl_error("test double: cannot open shared memory %s: %s", c->name, strerror(errno));
        return NCCL_SYSTEM_ERROR;
    }
    seg_hdr_t *h = map;
    unsigned none = 0;
    atomic_compare_exchange_strong(&h->magic, &none, SEG_MAGIC);
    int zero = 0;
    atomic_compare_exchange_strong(&h->nranks, &zero, c->nranks);
    if (atomic_load(&h->magic) != SEG_MAGIC || atomic_load(&h->nranks) != c->nranks) {
        dps_dbl_nccl_error("test double: ranks of unique id %s disagree on nranks (%d here, %d there)",
                           c->name, c->nranks, atomic_load(&h->nranks));
        munmap(map, c->seg_len);
        return NCCL_INVALID_USAGE;
    }
    atomic_fetch_add(&h->attached, 1);
    atomic_fetch_add(&h->attached_ever, 1);
    c->seg = h;
    return NCCL_OK;
}

/* The last rank to leave removes the name, once every rank has come: a rank that fails early
 * must not take the segment from under a late one (which would wait in a new one forever).
 * Mappings stay valid until each rank unmaps; what a crash leaves, sweep_stale_segments takes. */
static void seg_detach(comm_t *c)
{
    if (!c->seg || c->detached) return;
    c->detached = 1;
    if (atomic_fetch_sub(&c->seg->attached, 1) == 1 && atomic_load(&c->seg->attached_ever) >= c->nranks)
        shm_unlink(c->name);
}

/* Segments whose ranks all died (a crashed test) would stay in /dev/shm forever: remove them. */
static void sweep_stale_segments(void)
{
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, SEG_PREFIX, sizeof SEG_PREFIX - 1)) continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        struct stat st;
        if (fd < 0) continue;
        int stale = 0;
        if (!fstat(fd, &st)) {
            int old = time(NULL) - st.st_mtime > 60;
            seg_hdr_t *h = (size_t)st.st_size >= sizeof *h
                               ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)
                               : MAP_FAILED;
            if (h != MAP_FAILED) {
                int n = atomic_load(&h->nranks), seen = 0, alive = 0;
                if (n > 0 && dps_dbl_slots_offset(n) <= (size_t)st.st_size)
                    for (int r = 0; r < n; r++)
                        if (atomic_load(&h->rank[r].arrived)) {
                            seen++;
                            alive += !kill(h->rank[r].pid, 0) || errno == EPERM;
                        }
                stale = seen ? !alive : old;
                munmap(h, (size_t)st.st_size);
            } else {
                stale = old;
            }
        }
        close(fd);
        if (stale) shm_unlink(name);
    }
    if (d) closedir(d);
}

int dps_dbl_aborted_peer(comm_t *c)
{
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank && atomic_load(&c->seg->rank[r].health) == HEALTH_ABORTED) return r;
    return -1;
}

int dps_dbl_wait_ranks(comm_t *c, int which, uint64_t v)
{
    seg_hdr_t *h = c->seg;
    for (;;) {
        unsigned seen = atomic_load(&h->bell);
        if (dps_dbl_stopped(c)) return -1;
        int all = 1;
        for (int r = 0; r < c->nranks; r++) {
            seg_rank_t *p = &h->rank[r];
            if (r == c->rank || atomic_load(which == WAIT_DONE ? &p->done : &p->posted) >= v) continue;
            if (atomic_load(&p->health) != HEALTH_OK) return r + 1;
            all = 0;
        }
        if (all) return 0;
        dps_dbl_doze(h, seen);
    }
}

/* ---- init ---- */

static uint64_t host_hash(void)
{
    char host[256] = "";
    const char *id = getenv("NCCL_HOSTID");
    if (!id || !*id) {
        gethostname(host, sizeof host - 1);
        id = host;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 0x100000001b3ull;
    return h;
}

/* NCCL's busIdToInt64: the hex digits of "00000000:11:00.0" as one number (its messages print it). */
static long bus_number(const char *bus)
{
    char hex[17];
    int n = 0;
    for (; *bus && n < 16; bus++) {
        if (*bus == ':' || *bus == '.') continue;
        if (!strchr("0123456789abcdefABCDEF", *bus)) break;
        hex[n++] = *bus;
    }
    hex[n] = '\0';
    return strtol(hex, NULL, 16);
}

/* The rendezvous, on the caller's thread (blocking) or the init thread. Every rank decides the
 * outcome from the same data: when a rank's init fails (injected, or a duplicate GPU), the ranks
 * that did nothing wrong fail too, with ncclRemoteError, as NCCL's next bootstrap step would. */
static void comm_init_run(comm_t *c, const char *bus)
{
    seg_hdr_t *h = c->seg;
    seg_rank_t *m = dps_dbl_me(c);
    const dps_dbl_conf_t *conf = dps_dbl_conf();
    if (atomic_load(&m->arrived)) {
        dps_dbl_comm_fail(c, NCCL_INVALID_USAGE,
                          "test double: rank %d already joined unique id %s (an id serves one "
                          "communicator)",
                          c->rank, c->name);
        return;
    }
    m->pid = (int32_t)getpid();
    m->dev = c->dev;
    m->host_hash = host_hash();
    snprintf(m->bus, sizeof m->bus, "%s", bus);
    m->init_fail = conf->init_fail_rank == c->rank;
    atomic_store(&m->arrived, 1);
    c->joined = 1;
    dps_dbl_ring(h);
    if (m->init_fail) {
        dps_dbl_comm_fail(c, NCCL_SYSTEM_ERROR, "test double: injected init failure");
        return;
    }
    for (;;) {
        unsigned seen = atomic_load(&h->bell);
        if (atomic_load(&c->aborted)) return;
        int n = 0;
        for (int r = 0; r < c->nranks; r++)
            n += atomic_load(&h->rank[r].arrived);
        if (n == c->nranks) break;
        dps_dbl_doze(h, seen);
    }
    for (int r = 0; r < c->nranks; r++)
        if (h->rank[r].init_fail) {
            dps_dbl_comm_fail(c, NCCL_REMOTE_ERROR, "test double: rank %d failed its init", r);
            return;
        }
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank && h->rank[r].host_hash == m->host_hash && !strcmp(h->rank[r].bus, m->bus)) {
            dps_dbl_comm_fail(c, NCCL_INVALID_USAGE,
                              "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", c->rank,
                              r, bus_number(m->bus));
            return;
        }
    for (int i = 0; i < c->nranks; i++)
        for (int j = i + 1; j < c->nranks; j++)
            if (h->rank[i].host_hash == h->rank[j].host_hash && !strcmp(h->rank[i].bus, h->rank[j].bus)) {
                dps_dbl_comm_fail(c, NCCL_REMOTE_ERROR,
                                  "test double: ranks %d and %d share a GPU: their init failed", i, j);
                return;
            }
    int busy = NCCL_IN_PROGRESS;
    atomic_compare_exchange_strong(&c->async, &busy, NCCL_OK);
}

typedef struct init_arg {
    comm_t *c;
    char bus[32];
} init_arg_t;

/* A comm's helper thread (init, finalize) ends: the comm is no longer busy with it (an abort
 * may be waiting for that), and the thread's reference goes. */
static void *helper_done(comm_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->busy--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    dps_dbl_comm_put(c);
    return NULL;
}

/* A non-blocking shrink's child is done (or failed): NCCL hands the handle over only now, and
 * the parent's state, in progress until then, becomes the child's outcome. */
static void shrink_done(comm_t *c)
{
    comm_t *parent = c->shrunk_from;
    if (!parent) return;
    __atomic_store_n(c->publish, (void *)c, __ATOMIC_RELEASE);
    int busy = NCCL_IN_PROGRESS, outcome = atomic_load(&c->async);
    if (outcome == NCCL_IN_PROGRESS) outcome = NCCL_SYSTEM_ERROR; /* the child was aborted in its init */
    atomic_compare_exchange_strong(&parent->async, &busy, outcome);
    c->shrunk_from = NULL;
    dps_dbl_comm_put(parent);
}

static void *init_thread(void *p)
{
    init_arg_t *a = p;
    comm_t *c = a->c;
    comm_init_run(c, a->bus);
    shrink_done(c);
    free(a);
    return helper_done(c);
}

DPS_DBL_API int ncclGetVersion(int *v)
{
    dps_dbl_trace("ncclGetVersion");
    if (!v) return NCCL_INVALID_ARGUMENT;
    *v = 22809;
    return NCCL_OK;
}

DPS_DBL_API int ncclGetUniqueId(dps_dbl_unique_id_t *id)
{
    dps_dbl_trace("ncclGetUniqueId");
    if (!id) return NCCL_INVALID_ARGUMENT;
    sweep_stale_segments();
    size_t got = 0;
    while (got < sizeof id->internal) {
        ssize_t n = getrandom(id->internal + got, sizeof id->internal - got, 0);
        if (n < 0 && errno != EINTR) break;
        if (n > 0) got += (size_t)n;
    }
    if (got < sizeof id->internal) {
        /* No entropy source: time and pid still make ids of concurrent jobs differ. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t mix[2] = {(uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec, (uint64_t)getpid()};
        memcpy(id->internal, mix, sizeof mix);
    }
    return NCCL_OK;
}

/* A communicator on the calling thread's current device, joining the others of `id`: init (a
 * non-blocking one on a thread of its own). */
static int comm_create(void **comm_p, int nranks, const dps_dbl_unique_id_t *id, int rank, int blocking,
                       comm_t *shrunk_from)
{
    int dev = 0;
    char bus[32];
    int cerr = dps_dbl_current_device(&dev);
    if (!cerr) cerr = dps_dbl_bus_id(dev, bus, sizeof bus);
    if (cerr) {
        dps_dbl_nccl_error("Cuda failure %d '%s'", cerr, dps_dbl_cuda_error_string(cerr));
        return NCCL_CUDA_ERROR;
    }
    comm_t *c = calloc(1, sizeof *c);
    if (!c) return NCCL_SYSTEM_ERROR;
    c->refs = 1, c->nranks = nranks, c->rank = rank, c->dev = dev, c->next_run = 1, c->pid = getpid();
    c->nonblocking = !blocking, c->id = *id;
    atomic_init(&c->async, NCCL_IN_PROGRESS);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int err = seg_attach(c, id);
    if (err) {
        dps_dbl_comm_put(c);
        return err;
    }
    pthread_mutex_lock(&comms_lock);
    static unsigned made;
    c->made = ++made;
    c->next = comms;
    comms = c;
    c->refs++; /* the init's own, dropped below or by the init thread */
    pthread_mutex_unlock(&comms_lock);
    *comm_p = c;
    dps_dbl_trace("comm %p: nranks=%d rank=%d blocking=%d dev=%d bus=%s", (void *)c, nranks, rank, blocking,
                  dev, bus);
    if (shrunk_from && !blocking) { /* NCCL writes the child's handle when its init is done */
        *comm_p = NULL;
        c->publish = comm_p, c->shrunk_from = shrunk_from;
        pthread_mutex_lock(&comms_lock);
        shrunk_from->refs++;
        pthread_mutex_unlock(&comms_lock);
        atomic_store(&shrunk_from->async, NCCL_IN_PROGRESS);
    }
    init_arg_t *a = blocking ? NULL : malloc(sizeof *a);
    if (a) {
        a->c = c;
        memcpy(a->bus, bus, sizeof bus);
        pthread_mutex_lock(&c->mu);
        c->busy++;
        pthread_mutex_unlock(&c->mu);
        if (!dps_dbl_start_thread(init_thread, a)) return NCCL_IN_PROGRESS;
        pthread_mutex_lock(&c->mu);
        c->busy--;
        pthread_mutex_unlock(&c->mu);
        free(a);
    }
    /* Blocking (or no thread could start): NCCL reports the outcome; the handle stays valid for
     * ncclCommAbort or ncclCommDestroy either way. */
    comm_init_run(c, bus);
    shrink_done(c);
    err = atomic_load(&c->async);
    dps_dbl_comm_put(c);
    return err;
}

static int config_blocking(const void *config)
{
    const dps_dbl_nccl_config_t *cfg = config;
    return !cfg || cfg->blocking == INT_MIN || cfg->blocking != 0;
}

DPS_DBL_API int ncclCommInitRankConfig(void **comm_p, int nranks, dps_dbl_unique_id_t id, int rank,
                                       void *config)
{
    dps_dbl_trace("ncclCommInitRankConfig nranks=%d rank=%d", nranks, rank);
    if (!comm_p) {
        dps_dbl_nccl_error("ncclCommInitRank: comm argument is NULL");
        return NCCL_INVALID_ARGUMENT;
    }
    *comm_p = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        dps_dbl_nccl_error("Invalid rank requested : %d/%d", rank, nranks);
        return NCCL_INVALID_ARGUMENT;
    }
    /* GPU_DOUBLE_DIE_IN_INIT: that rank ends as it makes its communicator, the others in theirs */
    if (dps_dbl_conf()->die_in_init == rank) raise(SIGKILL);
    return comm_create(comm_p, nranks, &id, rank, config_blocking(config), NULL);
}

DPS_DBL_API int ncclCommInitRank(void **comm_p, int nranks, dps_dbl_unique_id_t id, int rank)
{
    return ncclCommInitRankConfig(comm_p, nranks, id, rank, NULL);
}

enum { SHRINK_ABORT = 1 }; /* NCCL_SHRINK_ABORT */

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* NCCL_SHRINK_ABORT: the comm's collectives under way and queued end without results (NCCL sets
 * its abort flag until its kernels have left), and the comm stays valid for an abort or a
 * destroy. Waits for them as NCCL waits for its stream. */
static void cancel_ongoing(comm_t *c)
{
    dps_dbl_launch_pending(c, 1);
    atomic_store(&c->cancel, 1);
    if (c->seg) dps_dbl_ring(c->seg);
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    while (c->finished < c->queued)
        dps_dbl_wait_cv(c, 10);
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->cancel, 0);
}

/* The child's id: the parent's, this shrink's number on it and the ranks left out, so that the
 * same shrink on every survivor meets in one segment and no other does. */
static dps_dbl_unique_id_t child_id(const comm_t *c, const int *sorted, int n)
{
    dps_dbl_unique_id_t id = c->id;
    uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 16; i++)
            h[k] = (h[k] ^ (unsigned char)c->id.internal[i]) * 0x100000001b3ull;
        h[k] = (h[k] ^ c->shrinks) * 0x100000001b3ull;
        for (int i = 0; i < n; i++)
            h[k] = (h[k] ^ (uint64_t)(unsigned)sorted[i]) * 0x100000001b3ull;
    }
    memcpy(id.internal, h, sizeof h);
    return id;
}

DPS_DBL_API int ncclCommShrink(void *comm, int *exclude, int nexclude, void **newcomm, void *config,
                               int flags)
{
    dps_dbl_trace("ncclCommShrink comm=%p nexclude=%d flags=%d", comm, nexclude, flags);
    if (dps_dbl_nccl_runtime_gone()) return NCCL_CUDA_ERROR;
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c) {
        dps_dbl_nccl_error("test double: ncclCommShrink: invalid or destroyed communicator %p", comm);
        return NCCL_INVALID_ARGUMENT;
    }
    if (!newcomm || !exclude || nexclude <= 0 || nexclude >= c->nranks) {
        dps_dbl_nccl_error("ncclCommShrink: %s", !newcomm ? "newcomm argument is NULL"
                                                 : !exclude
                                                     ? "excludeRanksList argument is NULL"
                                                     : "excludeRanksCount must leave 1 to nranks-1 ranks");
        dps_dbl_comm_put(c);
        return NCCL_INVALID_ARGUMENT;
    }
    *newcomm = NULL;
    /* GPU_DOUBLE_DIE_IN_SHRINK: the rank of that number in the communicator ends as it shrinks:
     * a second loss while the survivors of a first make their communicator */
    if (dps_dbl_conf()->die_in_shrink == c->rank) raise(SIGKILL);
    dps_dbl_comm_enter(c, "ncclCommShrink");
    int *sorted = malloc((size_t)nexclude * sizeof *sorted), err = NCCL_OK, below = 0;
    if (!sorted) err = NCCL_SYSTEM_ERROR;
    for (int i = 0; !err && i < nexclude; i++)
        sorted[i] = exclude[i];
    if (!err) qsort(sorted, (size_t)nexclude, sizeof *sorted, cmp_int);
    for (int i = 0; !err && i < nexclude; i++) {
        if (sorted[i] < 0 || sorted[i] >= c->nranks || (i && sorted[i] == sorted[i - 1]) ||
            sorted[i] == c->rank) {
            dps_dbl_nccl_error("ncclCommShrink: excluded rank %d is %s", sorted[i],
                               sorted[i] == c->rank ? "this rank (an excluded rank must not call it)"
                                                    : "out of range or listed twice");
            err = NCCL_INVALID_ARGUMENT;
        }
        below += sorted[i] < c->rank;
    }
    int state = atomic_load(&c->async);
    if (!err && dps_dbl_busy_comm(c))
        err = NCCL_INVALID_ARGUMENT;
    else if (!err && state != NCCL_OK)
        err = state; /* NCCL's ncclCommEnsureReady: a failed comm answers its error */
    if (!err && (flags & SHRINK_ABORT))
        cancel_ongoing(c);
    else if (!err) {
        pthread_mutex_lock(&c->mu);
        uint64_t stuck = c->finished < c->queued ? c->finished + 1 : 0;
        pthread_mutex_unlock(&c->mu);
        if (stuck) {
            dps_dbl_nccl_error(
                "test double: ncclCommShrink without NCCL_SHRINK_ABORT while collective #%llu is "
                "unfinished (where a peer was lost, it never ends)",
                (unsigned long long)stuck);
            err = NCCL_INVALID_USAGE;
        }
    }
    if (!err) {
        dps_dbl_unique_id_t id = child_id(c, sorted, nexclude);
        c->shrinks++;
        err = comm_create(newcomm, c->nranks - nexclude, &id, c->rank - below,
                          config ? config_blocking(config) : !c->nonblocking, c);
    }
    free(sorted);
    dps_dbl_comm_leave(c);
    dps_dbl_comm_put(c);
    return err;
}

/* Ends the communicator's part: peers see it gone (HEALTH_ABORTED), its waits end; waits up to
 * 1 s for its running collectives and init to notice. Under no lock. */
static void comm_abort(comm_t *c)
{
    atomic_store(&c->aborted, 1);
    dps_dbl_launch_pending(c, 1);
    if (c->joined) {
        int ok = HEALTH_OK;
        atomic_compare_exchange_strong(&dps_dbl_me(c)->health, &ok, HEALTH_ABORTED);
    }
    if (c->seg) dps_dbl_ring(c->seg);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    while (c->busy && pthread_cond_timedwait(&c->cv, &c->mu, &until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&c->mu);
}

DPS_DBL_API int ncclCommAbort(void *comm)
{
    dps_dbl_trace("ncclCommAbort comm=%p", comm);
    if (!comm) return NCCL_OK; /* NCCL: aborting NULL is a no-op */
    if (dps_dbl_nccl_runtime_gone()) return NCCL_CUDA_ERROR;
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c) {
        dps_dbl_nccl_error("test double: ncclCommAbort: invalid or destroyed communicator %p", comm);
        return NCCL_INVALID_ARGUMENT;
    }
    dps_dbl_comm_enter(c, "ncclCommAbort");
    dps_dbl_comm_put(c);
    c = comm_take(comm);
    comm_bury(c);
    dps_dbl_comm_leave(c);
    comm_abort(c);
    long ms = dps_dbl_conf()->abort_ms; /* NCCL's own abort takes its time: a thread tearing down */
    if (ms > 0) nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000}, NULL);
    seg_detach(c);
    dps_dbl_comm_put(c);
    return NCCL_OK;
}

/* Waits for the queued collectives (and an init under way), for 10 s at most, then aborts. */
DPS_DBL_API int ncclCommDestroy(void *comm)
{
    dps_dbl_trace("ncclCommDestroy comm=%p", comm);
    if (!comm) return NCCL_OK;
    if (dps_dbl_nccl_runtime_gone()) return NCCL_CUDA_ERROR;
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c) {
        dps_dbl_nccl_error("test double: ncclCommDestroy: invalid or destroyed communicator %p", comm);
        return NCCL_INVALID_ARGUMENT;
    }
    dps_dbl_comm_enter(c, "ncclCommDestroy");
    dps_dbl_comm_put(c);
    c = comm_take(comm);
    comm_bury(c);
    dps_dbl_comm_leave(c);
    dps_dbl_launch_pending(c, 0);
    dps_dbl_launch_pending(c, 1); /* one still connecting to a peer: it never will */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&c->mu);
    int timed_out = 0;
    while ((c->finished < c->queued || c->busy) && !timed_out)
        timed_out = pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT;
    int pending = c->finished < c->queued || c->busy;
    pthread_mutex_unlock(&c->mu);
    if (pending) comm_abort(c);
    seg_detach(c);
    dps_dbl_comm_put(c);
    return NCCL_OK;
}

/* What finalize flushes: this rank's queued collectives finish, and every peer has read what this
 * rank sent (its "done" reaches this rank's last step), so that a destroy or an abort after it
 * takes nothing from a peer still inside a collective. Bounded only by an abort. */
static void finalize_run(comm_t *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->finished < c->queued && !atomic_load(&c->aborted))
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    int w = c->joined && c->step ? dps_dbl_wait_ranks(c, WAIT_DONE, c->step) : 0;
    if (w > 0)
        dps_dbl_comm_fail(c, NCCL_REMOTE_ERROR,
                          "test double: rank %d failed or aborted before it finished reading "
                          "this rank's data",
                          w - 1);
    int busy = NCCL_IN_PROGRESS;
    if (!w) atomic_compare_exchange_strong(&c->async, &busy, NCCL_OK);
}

static void *finalize_thread(void *p)
{
    finalize_run(p);
    return helper_done(p);
}

DPS_DBL_API int ncclCommFinalize(void *comm)
{
    dps_dbl_trace("ncclCommFinalize comm=%p", comm);
    if (dps_dbl_nccl_runtime_gone()) return NCCL_CUDA_ERROR;
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c) return NCCL_INVALID_ARGUMENT;
    dps_dbl_comm_enter(c, "ncclCommFinalize");
    int err = NCCL_OK, ok = NCCL_OK;
    if (dps_dbl_busy_comm(c) || c->finalized) {
        err = NCCL_INVALID_ARGUMENT; /* NCCL refuses a second finalize */
    } else if (!atomic_compare_exchange_strong(&c->async, &ok, NCCL_IN_PROGRESS)) {
        err = ok; /* a failed comm: its error */
    } else {
        c->finalized = 1;
        if (c->nonblocking) {
            pthread_mutex_lock(&c->mu);
            c->busy++;
            pthread_mutex_unlock(&c->mu);
            pthread_mutex_lock(&comms_lock);
            c->refs++; /* the thread's */
            pthread_mutex_unlock(&comms_lock);
            err = NCCL_IN_PROGRESS;
            if (dps_dbl_start_thread(finalize_thread, c)) {
                pthread_mutex_lock(&c->mu);
                c->busy--;
                pthread_mutex_unlock(&c->mu);
                finalize_run(c);
                err = atomic_load(&c->async);
                dps_dbl_comm_put(c);
            }
        } else {
            finalize_run(c);
            err = atomic_load(&c->async);
        }
    }
    dps_dbl_comm_leave(c);
    dps_dbl_comm_put(c);
    return err;
}

DPS_DBL_API int ncclCommGetAsyncError(void *comm, int *state)
{
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c || !state) {
        if (c) dps_dbl_comm_put(c);
        return NCCL_INVALID_ARGUMENT;
    }
    dps_dbl_comm_enter(c, "ncclCommGetAsyncError");
    dps_dbl_launch_pending(c, 0);
    *state = atomic_load(&c->async);
    if (dps_dbl_conf()->async_error_late) dps_dbl_late_failure(c);
    dps_dbl_comm_leave(c);
    dps_dbl_comm_put(c);
    return NCCL_OK;
}

/* ncclCommCount, ncclCommUserRank, ncclCommCuDevice. */
static int comm_int(void *comm, int *out, int what)
{
    comm_t *c = dps_dbl_comm_get(comm);
    if (!c || !out) {
        if (c) dps_dbl_comm_put(c);
        return NCCL_INVALID_ARGUMENT;
    }
    *out = what == 0 ? c->nranks : what == 1 ? c->rank : c->dev;
    dps_dbl_comm_put(c);
    return NCCL_OK;
}

DPS_DBL_API int ncclCommCount(void *comm, int *count)
{
    return comm_int(comm, count, 0);
}
DPS_DBL_API int ncclCommUserRank(void *comm, int *rank)
{
    return comm_int(comm, rank, 1);
}
DPS_DBL_API int ncclCommCuDevice(void *comm, int *dev)
{
    return comm_int(comm, dev, 2);
}

DPS_DBL_API int ncclGroupStart(void)
{
    return NCCL_OK;
}
DPS_DBL_API int ncclGroupEnd(void)
{
    return NCCL_OK;
}

DPS_DBL_API const char *ncclGetErrorString(int result)
{
    switch (result) {
    case NCCL_OK:
        return "no error";
    case NCCL_CUDA_ERROR:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case NCCL_SYSTEM_ERROR:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case NCCL_INTERNAL_ERROR:
        return "internal error - please report this issue to the NCCL developers";
    case NCCL_INVALID_ARGUMENT:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case NCCL_INVALID_USAGE:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case NCCL_REMOTE_ERROR:
        return "remote process exited or there was a network error";
    case NCCL_IN_PROGRESS:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

/* Like NCCL's, one text for the process (the comm argument is not used). */
DPS_DBL_API const char *ncclGetLastError(void *comm)
{
    (void)comm;
    return last_error;
}
