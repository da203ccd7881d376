/* File policy decisions (see files.h). Runs only for programs whose policy names globs; the
 * interposers check dps_files_on before anything else. Never changes errno: callers save it. */
#define _GNU_SOURCE
#include "files.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dps.h"
#include "core/real.h"
#include "diag/diag.h"
#include "glob.h"

atomic_int dps_files_on;
atomic_int dps_files_pending;

typedef enum { GLOB_BASENAME, GLOB_ABSOLUTE, GLOB_RELATIVE } glob_kind_t;
typedef struct glob_list {
    char **pat;
    glob_kind_t *kind;
    size_t n;
} glob_list_t;

static glob_list_t rank0_only, per_rank;
static int my_rank, need_cwd;

DPS_REAL_DECLARE(int, rename, (const char *, const char *));
DPS_REAL_DECLARE(int, unlink, (const char *));

DPS_STARTUP static int parse_globs(glob_list_t *l, const char *text)
{
    for (const char *s = text; *s;) {
        while (isspace((unsigned char)*s)) s++;
        size_t len = strcspn(s, " \t\r\n\v\f");
        if (!len) break;
        char **pat = realloc(l->pat, (l->n + 1) * sizeof *pat);
        glob_kind_t *kind = realloc(l->kind, (l->n + 1) * sizeof *kind);
        if (pat) l->pat = pat;
        if (kind) l->kind = kind;
        if (!pat || !kind || !(l->pat[l->n] = strndup(s, len))) return -1;
        l->kind[l->n] = *s == '/' ? GLOB_ABSOLUTE : memchr(s, '/', len) ? GLOB_RELATIVE : GLOB_BASENAME;
        need_cwd |= l->kind[l->n] != GLOB_BASENAME;
        l->n++;
        s += len;
    }
    return 0;
}

DPS_STARTUP int dps_files_configure(const dps_policy_t *p, int rank, char *err, size_t errlen)
{
    my_rank = rank;
    if (parse_globs(&rank0_only, dps_policy_text(p, DPS_P_files_rank0_only)) ||
        parse_globs(&per_rank, dps_policy_text(p, DPS_P_files_per_rank))) {
        snprintf(err, errlen, "out of memory reading [files] globs");
        return -1;
    }
    atomic_store(&dps_files_on, rank0_only.n + per_rank.n > 0);
    return 0;
}

/* --- paths ------------------------------------------------------------------------------ */

static char *_Atomic cwd_cache; /* replaced on chdir, never freed: readers may hold it */

void dps_files_cwd_changed(void) { atomic_store(&cwd_cache, NULL); }

static const char *cwd(void)
{
    char *c = atomic_load(&cwd_cache);
    if (!c && (c = getcwd(NULL, 0))) atomic_store(&cwd_cache, c);
    return c;
}

/* Lexical normalization of src into dst: no '//', no '.', '..' folded into its parent. */
static void normalize(const char *src, char *dst, size_t cap)
{
    size_t n = 0, root = *src == '/';
    if (root) dst[n++] = '/';
    for (const char *s = src; *s;) {
        while (*s == '/') s++;
        size_t len = strcspn(s, "/");
        const char *seg = s;
        s += len;
        if (!len || (len == 1 && seg[0] == '.')) continue;
        if (len == 2 && seg[0] == '.' && seg[1] == '.') {
            size_t last = n;
            while (last > root && dst[last - 1] != '/') last--;
            int last_is_up = n - last == 2 && dst[last] == '.' && dst[last + 1] == '.';
            if (n > root && !last_is_up) { /* drop the parent segment */
                n = last > root ? last - 1 : root;
                continue;
            }
            if (root) continue; /* "/.." is "/" */
        }
        if (n > root && n < cap - 1) dst[n++] = '/';
        for (size_t i = 0; i < len && n < cap - 1; i++) dst[n++] = seg[i];
    }
    if (n == 0) dst[n++] = '.';
    dst[n] = '\0';
}

/* Absolute, normalized form of (dirfd, path) into out; 0 on success. */
static int absolute(int dirfd, const char *path, char *out, size_t cap)
{
    char tmp[2 * DPS_PATH_BUF], dir[DPS_PATH_BUF];
    const char *base = dir;
    if (*path == '/') {
        normalize(path, out, cap);
        return 0;
    }
    if (dirfd == AT_FDCWD) {
        if (!(base = cwd())) return -1;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t k = readlink(link, dir, sizeof dir - 1);
        if (k <= 0) return -1;
        dir[k] = '\0';
    }
    int n = snprintf(tmp, sizeof tmp, "%s/%s", base, path);
    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
    normalize(tmp, out, cap);
    return 0;
}

typedef struct views {
    const char *base, *abs, *rel; /* abs/rel NULL when unknown */
    char absbuf[DPS_PATH_BUF];
} views_t;

static void make_views(views_t *v, int dirfd, const char *path)
{
    const char *slash = strrchr(path, '/');
    v->base = slash ? slash + 1 : path;
    v->abs = v->rel = NULL;
    if (!need_cwd || absolute(dirfd, path, v->absbuf, sizeof v->absbuf) != 0) return;
    v->abs = v->absbuf;
    const char *c = cwd();
    size_t cl = c ? strlen(c) : 0;
    if (c && strncmp(v->abs, c, cl) == 0 && v->abs[cl] == '/') v->rel = v->abs + cl + 1;
    else if (c && cl == 1) v->rel = v->abs + 1; /* cwd is '/' */
}

static int matches(const glob_list_t *l, const views_t *v)
{
    for (size_t i = 0; i < l->n; i++) {
        const char *s = l->kind[i] == GLOB_BASENAME ? v->base : l->kind[i] == GLOB_ABSOLUTE ? v->abs : v->rel;
        if (s && dps_glob_match(l->pat[i], s, strlen(s))) return 1;
    }
    return 0;
}

/* Devices, /proc and /sys are never the program's files to gate. */
static int system_path(const char *p)
{
    return !strncmp(p, "/dev/", 5) || !strncmp(p, "/proc/", 6) || !strncmp(p, "/sys/", 5);
}

/* train.log -> train.rank3.log, logs/out -> logs/out.rank3, .bashrc -> .bashrc.rank3 */
static void rank_path(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    const char *dot = strrchr(base, '.');
    if (!dot || dot == base) dot = base + strlen(base);
    snprintf(out, cap, "%.*s.rank%d%s", (int)(dot - path), path, my_rank, dot);
}

/* Exposed for unit tests (files.h); the policy itself calls the static functions. */
void dps_files_normalize(const char *src, char *dst, size_t cap) { normalize(src, dst, cap); }
void dps_files_rank_path(const char *path, char *out, size_t cap) { rank_path(path, out, cap); }

/* Common part: per_rank mapping, and whether the (mapped) path is gated. */
static void classify(dps_redirect_t *r, int dirfd, const char *path)
{
    r->action = DPS_FILE_PASS;
    r->path = path;
    r->gated = 0;
    if (!path || !*path || system_path(path)) return;
    views_t v;
    make_views(&v, dirfd, path);
    if (matches(&per_rank, &v)) { /* per_rank wins: the file is no longer shared */
        atomic_fetch_add_explicit(&dps_diag_count.rank_paths, 1, memory_order_relaxed);
        rank_path(path, r->buf, sizeof r->buf);
        r->path = r->buf;
        return;
    }
    r->gated = matches(&rank0_only, &v);
}

void dps_files_lookup(dps_redirect_t *r, int dirfd, const char *path) { classify(r, dirfd, path); }

void dps_files_modify(dps_redirect_t *r, int dirfd, const char *path)
{
    classify(r, dirfd, path);
    if (r->gated && my_rank != 0) {
        r->action = DPS_FILE_NOOP;
        atomic_fetch_add_explicit(&dps_diag_count.noops, 1, memory_order_relaxed);
    }
}

/* --- open and publish ----------------------------------------------------------------------- */

typedef struct publish {
    int fd;
    dps_publish_t file;
} publish_t;

static pthread_mutex_t publish_lock = PTHREAD_MUTEX_INITIALIZER;
static publish_t *publishing;
static size_t npublishing, cap_publishing;
static atomic_uint publish_seq;

void dps_files_open(dps_redirect_t *r, int dirfd, const char *path, int flags)
{
    classify(r, dirfd, path);
    r->flags = flags;
    int acc = flags & O_ACCMODE;
    int tmpfile = (flags & O_TMPFILE) == O_TMPFILE; /* O_TMPFILE includes O_DIRECTORY */
    int writing = acc != O_RDONLY || (flags & (O_CREAT | O_TRUNC)) || tmpfile;
    if (!r->gated || !writing) return; /* reads are never redirected */
    if (my_rank != 0) {
        r->action = DPS_FILE_SINK;
        atomic_fetch_add_explicit(&dps_diag_count.sinks, 1, memory_order_relaxed);
        r->path = "/dev/null";
        r->flags = (flags & (O_CLOEXEC | O_APPEND | O_NONBLOCK)) | (acc == O_RDONLY ? O_RDWR : acc);
        return;
    }
    /* Rank 0: a truncating write replaces the file atomically at close; appends, in-place
     * updates and exclusive creation keep their own semantics and go straight to the file. */
    if (!(flags & O_TRUNC) || acc == O_RDONLY || (flags & (O_EXCL | O_APPEND)) || tmpfile)
        return;
    if (absolute(dirfd, path, r->final, sizeof r->final) != 0) return;
    char *slash = strrchr(r->final, '/');
    int n = snprintf(r->buf, sizeof r->buf, "%.*s/.%s.dpshim-%d-%u", (int)(slash - r->final), r->final,
                     slash + 1, (int)getpid(), atomic_fetch_add(&publish_seq, 1));
    if (n <= 0 || (size_t)n >= sizeof r->buf) return;
    r->action = DPS_FILE_PUBLISH;
    r->path = r->buf;
    r->flags = flags | O_CREAT;
}

int dps_files_opened(dps_redirect_t *r, int fd)
{
    if (r->action != DPS_FILE_PUBLISH || fd < 0) return fd;
    int saved = errno;
    pthread_mutex_lock(&publish_lock);
    if (npublishing == cap_publishing) {
        size_t c = cap_publishing ? 2 * cap_publishing : 16;
        publish_t *p = realloc(publishing, c * sizeof *p);
        if (p) publishing = p, cap_publishing = c;
    }
    char *tmp = strdup(r->buf), *final = strdup(r->final);
    if (npublishing < cap_publishing && tmp && final) {
        publishing[npublishing++] = (publish_t){fd, {tmp, final}};
        atomic_fetch_add(&dps_files_pending, 1);
        tmp = final = NULL;
    } else {
        DPS_WARN_ONCE("cannot track %s for atomic publication; it will appear at exit", r->final);
    }
    pthread_mutex_unlock(&publish_lock);
    free(tmp), free(final);
    errno = saved;
    return fd;
}

void dps_files_finish(dps_publish_t *p, int ok)
{
    int saved = errno;
    if (!ok) {
        DPS_ERROR("closing %s failed: the previous version is kept", p->final);
        DPS_REAL(unlink)(p->tmp);
    } else if (DPS_REAL(rename)(p->tmp, p->final) == 0) {
        atomic_fetch_add_explicit(&dps_diag_count.published, 1, memory_order_relaxed);
    } else {
        DPS_ERROR("cannot publish %s (written as %s): %s", p->final, p->tmp, strerror(errno));
        DPS_REAL(unlink)(p->tmp);
    }
    free(p->tmp), free(p->final);
    errno = saved;
}

int dps_files_take(int fd, dps_publish_t *p)
{
    if (atomic_load(&dps_g.forked)) return 0; /* the parent still holds the file */
    int found = 0;
    pthread_mutex_lock(&publish_lock);
    for (size_t i = 0; i < npublishing && !found; i++)
        if (publishing[i].fd == fd) {
            *p = publishing[i].file;
            publishing[i] = publishing[--npublishing];
            atomic_fetch_sub(&dps_files_pending, 1);
            found = 1;
        }
    pthread_mutex_unlock(&publish_lock);
    return found;
}

void dps_files_shutdown(void)
{
    if (!atomic_load(&dps_files_pending) || atomic_load(&dps_g.forked)) return;
    fflush(NULL); /* stdio buffers of files the program never closed */
    pthread_mutex_lock(&publish_lock);
    for (size_t i = 0; i < npublishing; i++) dps_files_finish(&publishing[i].file, 1);
    npublishing = 0;
    atomic_store(&dps_files_pending, 0);
    pthread_mutex_unlock(&publish_lock);
}
