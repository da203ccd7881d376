/* Open files on gated paths (files.h): what a stand-in keeps in memory, rank 0's outcome of
 * closing and syncing on every rank, and the files rank 0 was left short of at exit.
 *
 * A handle is an open that wrote through the file policy on this rank: rank 0's real file, or
 * another rank's stand-in. The table is scanned without a lock (a write to an untracked file,
 * from any thread or a signal handler, reads the fds and leaves); only a handle's own details
 * are changed under the lock. A handle records the file's device and inode, so an fd number
 * closed behind the shim's back (close_range, a child's cleanup) and reused is never taken for
 * the gated file. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/dps.h"
#include "files.h"
#include "core/sys.h"

#define MAX_HANDLES 64

typedef struct handle {
    _Atomic int fd; /* -1: a free slot */
    int sink;       /* a stand-in (not rank 0) */
    uint64_t id;    /* the number of the open on the file channel; UINT64_MAX: none (unpaired) */
    dev_t dev;
    ino_t ino;
    char *path;            /* the program's path, absolute where known: messages and the channel's key */
    off_t end;             /* rank 0: how far the program wrote (the end of its furthest write) */
    int err;               /* rank 0: the errno of the first write that failed; 0 while none did */
    int dropped;           /* stand-in: bytes past the bound were counted, not kept */
    off_t hollow;          /* stand-in: its first bytes are not the file's (made for writing only) */
    uint64_t stream_calls; /* stdio write calls on its stream so far */
} handle_t;

static handle_t handles[MAX_HANDLES] = {[0 ... MAX_HANDLES - 1] = {.fd = -1}};
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;

/* Rank 0's files whose last writer failed and that are short of what the program wrote. */
typedef struct short_file {
    char *path;
    off_t end;
    int err;
    const char *where;
} short_file_t;
static short_file_t *shorts;
static size_t nshorts;

/* The files this rank took over from a lost rank 0 without the whole content (dps_files_lead_handles):
 * what is wrong with each, until the program writes it anew. */
typedef struct partial_file {
    char *path;
    char why[160];
} partial_file_t;
static partial_file_t *partials;
static size_t npartials;


static int slot_of(int fd)
{
    if (fd < 0) return -1;
    for (int i = 0; i < MAX_HANDLES; i++)
        if (atomic_load_explicit(&handles[i].fd, memory_order_acquire) == fd) return i;
    return -1;
}

static void release(int i)
{
    free(handles[i].path);
    handles[i].path = NULL;
    atomic_store(&handles[i].fd, -1);
    atomic_fetch_sub(&dps_files_handles, 1);
}

/* The handle fd stands for, with the lock held; -1 (lock released) when fd is no gated file. */
static int lock_handle(int fd)
{
    if (slot_of(fd) < 0) return -1;
    struct stat st;
    int have = fstat(fd, &st) == 0;
    pthread_mutex_lock(&handles_lock);
    int i = slot_of(fd);
    if (i >= 0 && (!have || st.st_dev != handles[i].dev || st.st_ino != handles[i].ino)) {
        release(i); /* the number was reused behind the shim's back */
        i = -1;
    }
    if (i < 0) pthread_mutex_unlock(&handles_lock);
    return i;
}

/* The same, for an fd this interposed call already found a handle for (dps_files_handle_kind):
 * its identity was checked then, so no second fstat on the write path. */
static int lock_checked(int fd)
{
    pthread_mutex_lock(&handles_lock);
    int i = slot_of(fd);
    if (i < 0) pthread_mutex_unlock(&handles_lock);
    return i;
}

static void forget_partial(const char *path)
{
    for (size_t k = 0; k < npartials; k++)
        if (!strcmp(partials[k].path, path)) {
            free(partials[k].path);
            partials[k] = partials[--npartials];
            return;
        }
}

static void forget_short(const char *path)
{
    for (size_t k = 0; k < nshorts; k++)
        if (!strcmp(shorts[k].path, path)) {
            free(shorts[k].path);
            shorts[k] = shorts[--nshorts];
            return;
        }
}

void dps_files_opened(const dps_redirect_t *r, int fd)
{
    if (r->action == DPS_FILE_PASS || r->op != DPS_FOP_OPEN_WRITE || fd < 0) return;
    int saved = errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        errno = saved;
        return;
    }
    char abs[DPS_PATH_BUF];
    dps_in_shim++;
    if (dps_files_absolute(r->dirfd, r->orig, abs, sizeof abs) != 0) snprintf(abs, sizeof abs, "%s", r->orig);
    char *path = strdup(abs);
    pthread_mutex_lock(&handles_lock);
    if (r->action == DPS_FILE_LEAD && (r->flags & O_TRUNC)) forget_partial(abs); /* written anew */
    int i = slot_of(fd);
    if (i >= 0) release(i); /* closed behind the shim's back */
    for (i = 0; i < MAX_HANDLES && atomic_load(&handles[i].fd) >= 0; i++) {
    }
    if (i < MAX_HANDLES && path) {
        handles[i] = (handle_t){.fd = -1,
                                .sink = r->action == DPS_FILE_FOLLOW,
                                .id = r->seq,
                                .dev = st.st_dev,
                                .ino = st.st_ino,
                                .hollow = r->hollow,
                                .path = path};
        atomic_fetch_add(&dps_files_handles, 1);
        atomic_store_explicit(&handles[i].fd, fd, memory_order_release);
        path = NULL;
    }
    pthread_mutex_unlock(&handles_lock);
    dps_in_shim--;
    if (path) {
        free(path);
        /* the same on every rank (they open the same files), so close stays paired */
        DPS_WARN_ONCE("[files] more than %d gated files open at once: %s is written without a bound on the "
                      "other ranks' memory and closed without rank 0's outcome",
                      MAX_HANDLES, abs);
    }
    errno = saved;
}

int dps_files_handle_kind(int fd)
{
    int i = lock_handle(fd);
    if (i < 0) return DPS_HANDLE_NONE;
    int kind = handles[i].sink ? DPS_HANDLE_STANDIN : DPS_HANDLE_RANK0;
    pthread_mutex_unlock(&handles_lock);
    return kind;
}

/* --- stand-ins: the first bytes kept, the rest counted --------------------------------------- */

static size_t iov_total(const struct iovec *iov, int n)
{
    size_t t = 0;
    for (int k = 0; k < n; k++)
        t += iov[k].iov_len;
    return t;
}

/* Writes `len` bytes of iov at pos (the first of them past the bound are counted, not kept);
 * len, or -1. */
static ssize_t standin_put(int fd, const struct iovec *iov, int n, off_t pos, size_t len)
{
    size_t keep = pos < dps_files_standin_bytes ? (size_t)(dps_files_standin_bytes - pos) : 0, at = 0;
    if (keep > len) keep = len;
    for (int k = 0; k < n && at < keep; k++) {
        size_t part = iov[k].iov_len < keep - at ? iov[k].iov_len : keep - at;
        if (dps_sys_pwrite(fd, iov[k].iov_base, part, pos + (off_t)at) != (ssize_t)part) return -1;
        at += part;
    }
    struct stat st;
    off_t end = pos + (off_t)len;
    if (fstat(fd, &st) == 0 && st.st_size < end && ftruncate(fd, end) != 0) return -1;
    return (ssize_t)len;
}

ssize_t dps_files_standin_write(int fd, const struct iovec *iov, int n, off_t off)
{
    int saved = errno, err = 0;
    size_t total = iov_total(iov, n);
    dps_in_shim++;
    off_t pos = off;
    if (pos < 0) {
        struct stat st;
        pos = (fcntl(fd, F_GETFL) & O_APPEND) && fstat(fd, &st) == 0 ? st.st_size : lseek(fd, 0, SEEK_CUR);
    }
    uint64_t id = UINT64_MAX;
    char path[DPS_PATH_BUF];
    int i = lock_checked(fd);
    if (i >= 0) {
        id = handles[i].id;
        snprintf(path, sizeof path, "%s", handles[i].path);
        pthread_mutex_unlock(&handles_lock);
    }
    /* what rank 0's write of these bytes returned: all of them, fewer, or an error */
    ssize_t rc = pos >= 0 ? dps_files_rank0_write(id, path, pos, pos + (off_t)total, &err) : (ssize_t)total;
    /* rank 0 was lost meanwhile and this rank took its place: its stand-in is the file now */
    if (i >= 0 && dps_files_leads() && (i = lock_checked(fd)) >= 0) {
        int lead = !handles[i].sink;
        pthread_mutex_unlock(&handles_lock);
        if (lead) {
            dps_in_shim--;
            rc = off < 0 ? dps_sys_writev(fd, iov, n) : dps_sys_pwritev(fd, iov, n, off);
            dps_files_wrote(fd, total, off, rc, rc < 0 ? errno : saved);
            return rc;
        }
    }
    if (rc < 0) {
        dps_in_shim--;
        errno = err;
        return -1;
    }
    if (pos >= 0 && (size_t)rc == total && pos + (off_t)total <= dps_files_standin_bytes) {
        rc = off < 0 ? dps_sys_writev(fd, iov, n) : dps_sys_pwritev(fd, iov, n, off);
    } else if (pos >= 0) {
        rc = standin_put(fd, iov, n, pos, (size_t)rc);
        if (off < 0 && rc >= 0) lseek(fd, pos + rc, SEEK_SET);
        if (pos + (off_t)total > dps_files_standin_bytes && (i = lock_checked(fd)) >= 0) {
            int first = !handles[i].dropped;
            handles[i].dropped = 1;
            if (first)
                DPS_INFO("[files] the stand-in for %s keeps its first %lld MiB in memory; what this rank "
                         "writes past that is counted, not kept (reading it back here gives zeros; rank "
                         "0's file is whole)",
                         handles[i].path, (long long)(dps_files_standin_bytes >> 20));
            pthread_mutex_unlock(&handles_lock);
        }
    }
    dps_in_shim--;
    if (rc >= 0) errno = saved;
    return rc;
}

/* --- rank 0's writes ----------------------------------------------------------------------- */

void dps_files_wrote(int fd, size_t asked, off_t off, ssize_t rc, int err)
{
    int i = lock_checked(fd);
    if (i < 0) {
        errno = err;
        return;
    }
    handle_t *h = &handles[i];
    uint64_t id = h->id;
    off_t now = off >= 0 ? off : lseek(fd, 0, SEEK_CUR);
    off_t before = off >= 0 ? off : now - (rc > 0 ? rc : 0);
    if (now >= 0 && before + (off_t)asked > h->end) h->end = before + (off_t)asked;
    /* an interrupted or would-block write wrote nothing: the program retries, the file is whole */
    if (rc < 0 && !h->err && err != EINTR && err != EAGAIN && err != EWOULDBLOCK) h->err = err;
    pthread_mutex_unlock(&handles_lock);
    if (now >= 0) dps_files_post_write(id, before, asked, rc, err);
    errno = err;
}

int dps_files_stream_call(int fd, uint64_t *id, uint64_t *k, char *path)
{
    int i = lock_handle(fd);
    if (i < 0) return DPS_HANDLE_NONE;
    int kind = handles[i].sink ? DPS_HANDLE_STANDIN : DPS_HANDLE_RANK0;
    *id = handles[i].id, *k = handles[i].stream_calls++;
    snprintf(path, DPS_PATH_BUF, "%s", handles[i].path);
    pthread_mutex_unlock(&handles_lock);
    return kind;
}

/* --- closing and syncing: rank 0's outcome on every rank ---------------------------------------- */

static void note_short(const char *path, off_t end, int err, const char *where)
{
    forget_short(path);
    short_file_t *s = realloc(shorts, (nshorts + 1) * sizeof *s);
    if (!s) return;
    shorts = s;
    char *p = strdup(path);
    if (p) shorts[nshorts++] = (short_file_t){p, end, err, where};
}

int dps_files_fd_begin(dps_fdcall_t *c, int fd, dps_file_op_t op)
{
    int i = lock_handle(fd);
    if (i < 0) return 0;
    c->sink = handles[i].sink, c->end = handles[i].end, c->err = handles[i].err, c->id = handles[i].id;
    dps_redirect_t *r = &c->r;
    memset(r, 0, sizeof *r);
    r->action = c->sink ? DPS_FILE_FOLLOW : DPS_FILE_LEAD;
    r->op = op, r->dirfd = AT_FDCWD, r->sink = -1, r->seq = UINT64_MAX;
    snprintf(r->buf, sizeof r->buf, "%s", handles[i].path);
    r->orig = r->path = r->buf;
    /* before the real close: from it on, another thread's open may get the same number */
    if (op == DPS_FOP_CLOSE && !c->sink) release(i);
    pthread_mutex_unlock(&handles_lock);
    if (!c->sink) return 1;
    int took = dps_files_take(r);
    if (took != 0 && took != DPS_FILES_LEAD_NOW)
        r->rc0 = 0, r->err0 = 0; /* alone: rank 0's taken to succeed */
    /* the handle stayed in the table through the wait: where rank 0 was lost meanwhile and this
     * rank leads now, its stand-in became the file (dps_files_lead_handles), closed as rank 0's */
    if ((i = lock_handle(fd)) >= 0) {
        c->sink = handles[i].sink, c->end = handles[i].end, c->err = handles[i].err;
        if (op == DPS_FOP_CLOSE) release(i);
        pthread_mutex_unlock(&handles_lock);
    }
    if (took == DPS_FILES_LEAD_NOW) c->sink = 0, r->action = DPS_FILE_LEAD;
    if (c->sink && op == DPS_FOP_CLOSE) dps_files_forget_writes(c->id);
    return 1;
}

int dps_files_fd_end(dps_fdcall_t *c, int rc, int err)
{
    dps_redirect_t *r = &c->r;
    if (!c->sink) {
        int failed_write = r->op == DPS_FOP_CLOSE ? c->err : 0;
        /* writes the others could not pair (a file opened before the first collective, where
         * the channel starts): the close carries one that failed before it, so the others
         * learn there */
        int carried = c->id == UINT64_MAX ? failed_write : 0;
        pthread_mutex_lock(&handles_lock);
        if (rc < 0 || failed_write)
            note_short(r->buf, c->end, rc < 0 ? err : failed_write,
                       rc < 0 ? dps_files_op_name(r->op) : "write");
        else if (r->op == DPS_FOP_CLOSE)
            forget_short(r->buf);
        pthread_mutex_unlock(&handles_lock);
        errno = rc < 0 ? err : carried;
        dps_files_post(r, rc == 0 && !carried);
        errno = err;
        return rc;
    }
    if (r->rc0 != 0) {
        errno = r->err0;
        return -1;
    }
    errno = err;
    return rc < 0 && r->op != DPS_FOP_CLOSE ? rc : 0;
}

/* --- rank 0 lost: its successor's stand-ins become the files ------------------------------------ */

/* The stand-in on fd becomes h's file, and fd the file from then on (same offset and flags). A
 * stand-in's write waits for rank 0's of the same bytes, so the file holds what this rank wrote
 * through write(2); a stdio stream writes its buffer past the shim, and rank 0's buffer died with
 * it: what the stand-in holds is written to the file again, at its place (the same bytes, where
 * rank 0 wrote them), and the file is cut to the stand-in's length (what rank 0 wrote further,
 * this rank writes again). NULL, or what failed; *missing: the bytes neither holds. */
static const char *take_place(handle_t *h, int fd, off_t *missing)
{
    struct stat st, real;
    int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
    off_t pos = lseek(fd, 0, SEEK_CUR);
    *missing = 0;
    if (fl < 0 || fdfl < 0 || pos < 0 || fstat(fd, &st) != 0) return "the stand-in";
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int src = dps_sys_open(self, O_RDONLY | O_CLOEXEC, 0);
    int dst = dps_sys_open(h->path, O_WRONLY | O_CREAT | O_CLOEXEC, st.st_mode & 07777);
    const char *failed = src < 0 ? "the stand-in" : dst < 0 ? "open" : NULL;
    off_t at = h->hollow,
          kept = h->dropped && st.st_size > dps_files_standin_bytes ? dps_files_standin_bytes : st.st_size;
    while (!failed && at < kept) {
        char buf[1 << 16];
        size_t want = (size_t)(kept - at) < sizeof buf ? (size_t)(kept - at) : sizeof buf;
        ssize_t k = pread(src, buf, want, at);
        if (k <= 0 || dps_sys_pwrite(dst, buf, (size_t)k, at) != k) failed = "write";
        at += k > 0 ? k : 0;
    }
    if (!failed && fstat(dst, &real) == 0 && real.st_size < st.st_size) *missing = st.st_size - real.st_size;
    /* rank 0 was ahead: this rank writes what it wrote past here again (appends too) */
    if (!failed && ftruncate(dst, st.st_size) != 0) failed = "truncate";
    if (src >= 0) dps_sys_close(src);
    if (dst >= 0 && dps_sys_close(dst) != 0 && !failed) failed = "close";
    if (failed) return failed;
    int keep = fl & (O_ACCMODE | O_APPEND | O_NONBLOCK | O_SYNC | O_DSYNC);
    int file = dps_sys_open(h->path, keep | O_CLOEXEC, 0);
    if (file < 0) return "open";
    struct stat now;
    if (lseek(file, pos, SEEK_SET) != pos || dup3(file, fd, fdfl & FD_CLOEXEC ? O_CLOEXEC : 0) != fd ||
        fstat(fd, &now) != 0) {
        dps_sys_close(file);
        return "reopen";
    }
    dps_sys_close(file);
    h->dev = now.st_dev, h->ino = now.st_ino, h->end = st.st_size, h->err = 0;
    return NULL;
}

void dps_files_lead_handles(void)
{
    int saved = errno;
    pthread_mutex_lock(&handles_lock);
    for (int i = 0; i < MAX_HANDLES; i++) {
        handle_t *h = &handles[i];
        int fd = atomic_load(&h->fd);
        if (fd < 0 || !h->sink) continue;
        off_t missing;
        const char *failed = take_place(h, fd, &missing);
        /* a leader's handle from now on, the file or not: its writes and its close are told to the
         * others, who wait for them */
        h->sink = 0;
        char why[160] = "";
        if (failed)
            snprintf(why, sizeof why, "its %s failed (%s) as this rank took rank 0's place", failed,
                     strerror(errno));
        else if (missing)
            snprintf(why, sizeof why,
                     "%lld bytes that rank 0 had not written are past what this rank's stand-in kept "
                     "([files] standin_mb = %lld)",
                     (long long)missing, (long long)(dps_files_standin_bytes >> 20));
        if (why[0])
            DPS_WARN("[files] %s was open when rank 0 was lost: %s", h->path, why);
        else
            DPS_INFO("[files] %s was open when rank 0 was lost: this rank writes it from now on", h->path);
        partial_file_t *p = why[0] ? realloc(partials, (npartials + 1) * sizeof *p) : NULL;
        if (p) {
            partials = p;
            partials[npartials] = (partial_file_t){.path = strdup(h->path)};
            snprintf(partials[npartials].why, sizeof partials[npartials].why, "%s", why);
            if (partials[npartials].path) npartials++;
        }
    }
    pthread_mutex_unlock(&handles_lock);
    errno = saved;
}

int dps_files_exit_check(void)
{
    int left = 0;
    dps_in_shim++;
    pthread_mutex_lock(&handles_lock);
    for (size_t k = 0; k < npartials; k++, left++)
        DPS_ERROR("[files] %s is incomplete: it was open when rank 0 was lost, and %s. Write it again (or "
                  "run the job again); this rank exits %d",
                  partials[k].path, partials[k].why, DPS_EXIT_IO);
    for (size_t k = 0; k < nshorts; k++) {
        struct stat st;
        if (dps_sys_stat(shorts[k].path, &st) != 0 || st.st_size >= shorts[k].end) continue;
        DPS_ERROR(
            "[files] %s is %lld bytes, short of the %lld the program wrote to it: its %s failed (%s) on "
            "rank 0, the only rank that writes it. Make room for one copy where it lies and run "
            "again; this rank exits %d",
            shorts[k].path, (long long)st.st_size, (long long)shorts[k].end, shorts[k].where,
            strerror(shorts[k].err), DPS_EXIT_IO);
        left++;
    }
    pthread_mutex_unlock(&handles_lock);
    dps_in_shim--;
    return left;
}
