/* File policy decisions and the leader/follower protocol (see files.h). Runs only for programs
 * whose policy names globs; the interposers check dps_files_on before anything else. */
#define _GNU_SOURCE
#include "files.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/dps.h"
#include "core/real.h"
#include "diag/diag.h"
#include "glob.h"
#include "core/sys.h"

/* tested by every interposer, set at start-up: with the start-up data (policy.h) */
DPS_STARTUP_DATA atomic_int dps_files_on;
DPS_STARTUP_DATA atomic_int dps_files_handles;
DPS_STARTUP_DATA off_t dps_files_standin_bytes = (off_t)64 << 20;

typedef enum { GLOB_BASENAME, GLOB_ABSOLUTE, GLOB_RELATIVE } glob_kind_t;
typedef struct glob_list {
    char **pat;
    glob_kind_t *kind;
    size_t n;
} glob_list_t;

DPS_STARTUP_DATA static glob_list_t rank0_only, per_rank;
DPS_STARTUP_DATA static int my_rank, my_size, need_cwd;

/* The rank that leads: rank 0, or after its loss the lowest survivor (dps_files_new_leader), and
 * the ranks that follow it (NULL: every other rank of the job). By the job's ranks. */
static _Atomic int leader;
static int *followers, nfollowers;
static int lead_changed; /* rank 0 was lost: outcomes may come twice (told again, made again) */

static int leads(void)
{
    return my_rank == atomic_load_explicit(&leader, memory_order_relaxed);
}

int dps_files_leads(void)
{
    return leads();
}

DPS_STARTUP static int parse_globs(glob_list_t *l, const char *text)
{
    for (const char *s = text; *s;) {
        while (isspace((unsigned char)*s))
            s++;
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

DPS_STARTUP int dps_files_configure(const dps_policy_t *p, int rank, int size, char *err, size_t errlen)
{
    my_rank = rank, my_size = size;
    atomic_store(&leader, 0); /* the job as it starts */
    free(followers), followers = NULL, nfollowers = 0, lead_changed = 0;
    if (parse_globs(&rank0_only, dps_policy_text(p, DPS_P_files_rank0_only)) ||
        parse_globs(&per_rank, dps_policy_text(p, DPS_P_files_per_rank))) {
        snprintf(err, errlen, "out of memory reading [files] globs");
        return -1;
    }
    dps_files_standin_bytes = (off_t)dps_policy_num(p, DPS_P_files_standin_mb) << 20;
    atomic_store(&dps_files_on, rank0_only.n + per_rank.n > 0);
    return 0;
}

/* --- paths ------------------------------------------------------------------------------ */

static char *_Atomic cwd_cache; /* replaced on chdir, never freed: readers may hold it */

void dps_files_cwd_changed(void)
{
    atomic_store(&cwd_cache, NULL);
}

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
        while (*s == '/')
            s++;
        size_t len = strcspn(s, "/");
        const char *seg = s;
        s += len;
        if (!len || (len == 1 && seg[0] == '.')) continue;
        if (len == 2 && seg[0] == '.' && seg[1] == '.') {
            size_t last = n;
            while (last > root && dst[last - 1] != '/')
                last--;
            int last_is_up = n - last == 2 && dst[last] == '.' && dst[last + 1] == '.';
            if (n > root && !last_is_up) { /* drop the parent segment */
                n = last > root ? last - 1 : root;
                continue;
            }
            if (root) continue; /* "/.." is "/" */
        }
        if (n > root && n < cap - 1) dst[n++] = '/';
        for (size_t i = 0; i < len && n < cap - 1; i++)
            dst[n++] = seg[i];
    }
    if (n == 0) dst[n++] = '.';
    dst[n] = '\0';
}

/* Absolute, normalized form of (dirfd, path) into out; 0 on success. */
int dps_files_absolute(int dirfd, const char *path, char *out, size_t cap)
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
    if (!need_cwd || dps_files_absolute(dirfd, path, v->absbuf, sizeof v->absbuf) != 0) return;
    v->abs = v->absbuf;
    const char *c = cwd();
    size_t cl = c ? strlen(c) : 0;
    if (c && strncmp(v->abs, c, cl) == 0 && v->abs[cl] == '/')
        v->rel = v->abs + cl + 1;
    else if (c && cl == 1)
        v->rel = v->abs + 1; /* cwd is '/' */
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
void dps_files_normalize(const char *src, char *dst, size_t cap)
{
    normalize(src, dst, cap);
}
void dps_files_rank_path(const char *path, char *out, size_t cap)
{
    rank_path(path, out, cap);
}

/* --- learned sources: a path renamed onto a gated one is gated from then on ------------------ */

static pthread_mutex_t learned_lock = PTHREAD_MUTEX_INITIALIZER;
static char **learned;
static size_t nlearned;
static atomic_size_t nlearned_pub; /* read without the lock on the classify path */

static int is_learned(int dirfd, const char *path)
{
    size_t n = atomic_load_explicit(&nlearned_pub, memory_order_acquire);
    char abs[DPS_PATH_BUF];
    if (!n || dps_files_absolute(dirfd, path, abs, sizeof abs) != 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(learned[i], abs)) return 1;
    return 0;
}

/* Called on every rank at the same gated rename, so every rank learns at the same call. */
static void learn(int dirfd, const char *src, const char *dst)
{
    char abs[DPS_PATH_BUF];
    if (dps_files_absolute(dirfd, src, abs, sizeof abs) != 0 || is_learned(dirfd, src)) return;
    pthread_mutex_lock(&learned_lock);
    char **l = realloc(learned, (nlearned + 1) * sizeof *l); /* readers see the old array's prefix */
    char *copy = strdup(abs);
    if (l && copy) {
        learned = l;
        learned[nlearned++] = copy;
        atomic_store_explicit(&nlearned_pub, nlearned, memory_order_release);
    } else {
        free(copy);
    }
    pthread_mutex_unlock(&learned_lock);
    if (leads())
        DPS_WARN_ONCE("[files] %s is renamed onto %s, which rank0_only matches, but no glob matches %s: "
                      "every rank wrote it. It is rank 0's from now on; add it to [files] rank0_only so "
                      "that the first save is rank 0's alone too",
                      src, dst, src);
}

/* --- classification ----------------------------------------------------------------------- */

static void settle_reads(const dps_redirect_t *r);

static int is_read(dps_file_op_t op)
{
    return op == DPS_FOP_OPEN_READ || op == DPS_FOP_LOOKUP;
}

/* Rank 0 is about to change a gated path (below). */
static void before_change(const dps_redirect_t *r)
{
    if (r->action == DPS_FILE_LEAD && !is_read(r->op)) settle_reads(r);
}

/* Common part: per_rank mapping, and whether the (mapped) path is gated. */
static void classify(dps_redirect_t *r, int dirfd, const char *path)
{
    r->action = DPS_FILE_PASS;
    r->path = r->orig = path;
    r->dirfd = dirfd;
    r->first = NULL;
    r->gated = 0;
    r->sink = -1;
    r->rc0 = 0, r->err0 = 0;
    r->seq = UINT64_MAX;
    r->hollow = 0;
    if (!path || !*path || system_path(path)) return;
    views_t v;
    make_views(&v, dirfd, path);
    if (matches(&per_rank, &v)) { /* per_rank wins: the file is no longer shared */
        atomic_fetch_add_explicit(&dps_diag_count.rank_paths, 1, memory_order_relaxed);
        rank_path(path, r->buf, sizeof r->buf);
        r->path = r->buf;
        return;
    }
    r->gated = matches(&rank0_only, &v) || is_learned(dirfd, path);
    if (r->gated && my_size > 1) r->action = leads() ? DPS_FILE_LEAD : DPS_FILE_FOLLOW;
}

void dps_files_path(dps_redirect_t *r, dps_file_op_t op, int dirfd, const char *path)
{
    classify(r, dirfd, path);
    r->op = op;
    before_change(r);
}

void dps_files_open(dps_redirect_t *r, int dirfd, const char *path, int flags)
{
    classify(r, dirfd, path);
    r->flags = flags;
    int acc = flags & O_ACCMODE, tmpfile = (flags & O_TMPFILE) == O_TMPFILE; /* includes O_DIRECTORY */
    int writing = acc != O_RDONLY || (flags & (O_CREAT | O_TRUNC)) || tmpfile;
    r->op = writing ? DPS_FOP_OPEN_WRITE : DPS_FOP_OPEN_READ;
    before_change(r);
}

/* rename(a, b) and link(a, b): rank 0's alone when either path is gated (the other rank's copy
 * of a gated file is a sink; a gated name must come from rank 0). A rename of an ungated path
 * onto a gated one teaches the policy that the source is rank 0's too. */
void dps_files_pair(dps_redirect_t *ra, dps_redirect_t *rb, dps_file_op_t op, int fda, const char *a, int fdb,
                    const char *b)
{
    classify(ra, fda, a);
    classify(rb, fdb, b);
    ra->op = rb->op = op;
    rb->first = a, rb->first_dirfd = fda; /* the leader posts the first path's key */
    if (op == DPS_FOP_RENAME && rb->gated && !ra->gated && ra->path == a) learn(fda, a, b);
    if (ra->action != DPS_FILE_PASS && rb->action == DPS_FILE_PASS && rb->path == b) rb->action = ra->action;
    before_change(rb);
}

/* --- the leader's outcomes ----------------------------------------------------------------- */

static const dps_files_channel_t *_Atomic channel;

void dps_files_set_channel(const dps_files_channel_t *c)
{
    atomic_store(&channel, c);
}

/* A message on the channel: the outcome of rank 0's call #seq, or (op MSG_WRITE) of a write of
 * rank 0's to a gated file, or (MSG_MARK) rank 0's place alone. Each says where rank 0 was. */
enum { MSG_WRITE = DPS_FOP_COUNT, MSG_MARK, MSG_STREAM_CALL };
typedef struct message {
    uint64_t seq;        /* an outcome: the call's number; else the number of rank 0's next call */
    uint64_t coll;       /* the places rank 0 had reached; UINT64_MAX: rank 0 is leaving */
    int32_t op, rc, err; /* rc: 0 or -1 for a call; a write's WRITE_* */
    uint32_t path;       /* the path's hash: the same call on a per-call temporary name differs */
    uint64_t id;         /* MSG_WRITE, MSG_STREAM_CALL: the handle, by the number of the open */
    int64_t off, asked;  /* MSG_WRITE: at off, asked bytes written (0 where it failed);
                          * MSG_STREAM_CALL: the call's number on the stream, what it returned */
} message_t;
enum { WRITE_FAILED = -1, WRITE_WHOLE, WRITE_SHORT };
_Static_assert(sizeof(message_t) <= 64, "a message fits the channel's");

/* One order on each rank: the leader posts, and a follower takes in, one message at a time. */
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_seq;

/* Rank 0's reads by path (one past the number of its last read of each path), and the other
 * ranks' acknowledgements of them (rank, path, one past the number acknowledged). */
typedef struct read_mark {
    int rank;
    uint32_t path;
    uint64_t until;
} read_mark_t;
typedef struct marks {
    read_mark_t *m;
    size_t n, cap;
} marks_t;
static marks_t reads, acks;
static pthread_mutex_t ack_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t mark_of(const marks_t *l, int rank, uint32_t path)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->m[i].rank == rank && l->m[i].path == path) return l->m[i].until;
    return 0;
}

static void set_mark(marks_t *l, int rank, uint32_t path, uint64_t until)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->m[i].rank == rank && l->m[i].path == path) {
            if (until > l->m[i].until) l->m[i].until = until;
            return;
        }
    if (l->n == l->cap) {
        size_t c = l->cap ? 2 * l->cap : 64;
        read_mark_t *m = realloc(l->m, c * sizeof *m);
        if (!m) return; /* unrecorded: rank 0 then does not wait for that path */
        l->m = m, l->cap = c;
    }
    l->m[l->n++] = (read_mark_t){rank, path, until};
}

const char *dps_files_op_name(dps_file_op_t op)
{
    static const char *const names[] = {
#define DPS_FILE_OP_NAME(id, text) text,
        DPS_FILE_OPS(DPS_FILE_OP_NAME)
#undef DPS_FILE_OP_NAME
    };
    return names[op];
}

static uint32_t path_hash(const char *p)
{
    return (uint32_t)dps_fnv1a(DPS_FNV_SEED, p, strlen(p));
}

/* The key of a path rank 0 reads and changes: its absolute, normalized form where known, so that
 * "ckpt.pt" and "./ckpt.pt" are one file. */
static uint32_t path_key(int dirfd, const char *p)
{
    char abs[DPS_PATH_BUF];
    return dps_files_absolute(dirfd, p, abs, sizeof abs) == 0 ? path_hash(abs) : path_hash(p);
}

/* Children, forked or exec'd, have no channel: a leader's child never posts and a follower's
 * child never waits, so both sides agree on which calls go through it. */
static const dps_files_channel_t *usable_channel(void)
{
    if (dps_g.role != DPS_ROLE_RANK || atomic_load_explicit(&dps_g.forked, memory_order_relaxed)) return NULL;
    return atomic_load(&channel);
}

/* The same for a follower's waits: none on the leader (a stand-in it kept where it could not take
 * rank 0's place in a file: dps_files_lead_handles). */
static const dps_files_channel_t *follower_channel(void)
{
    return leads() ? NULL : usable_channel();
}

/* The places where a rank blocks on the others (collectives, the guard's checks) it has reached:
 * every rank reaches the same ones in the same order (dps_files_at_place). */
static atomic_uint_fast64_t places;
static uint64_t places_reached(void)
{
    return atomic_load_explicit(&places, memory_order_relaxed);
}

/* Rank 0: m goes out, with rank 0's place (coll 0: the collectives entered by now); 0 once
 * posted. A call's outcome takes the next number. */
static int post(const dps_files_channel_t *c, message_t *m)
{
    pthread_mutex_lock(&order_lock);
    m->seq = next_seq;
    if (!m->coll) m->coll = places_reached();
    int rc = c->post(m, sizeof *m);
    if (rc == 0 && m->op < MSG_WRITE) next_seq++;
    pthread_mutex_unlock(&order_lock);
    return rc;
}

void dps_files_post(dps_redirect_t *r, int ok)
{
    const dps_files_channel_t *c = usable_channel();
    if (!c) return;
    message_t m = {.op = (int32_t)r->op,
                   .rc = ok ? 0 : -1,
                   .err = ok ? 0 : errno,
                   .path = r->first ? path_key(r->first_dirfd, r->first) : path_key(r->dirfd, r->orig)};
    dps_in_shim++;
    if (post(c, &m) == 0) {
        r->seq = m.seq; /* an open that writes: its handle's key (dps_files_post_write) */
        if (is_read(r->op)) {
            pthread_mutex_lock(&ack_lock);
            set_mark(&reads, 0, m.path, m.seq + 1);
            pthread_mutex_unlock(&ack_lock);
        }
    }
    dps_in_shim--;
}

/* Rank 0: m, about the handle m->id, where that handle pairs (it was opened on the channel). */
static void post_about_handle(message_t *m)
{
    const dps_files_channel_t *c = usable_channel();
    if (!c || m->id == UINT64_MAX) return;
    dps_in_shim++;
    post(c, m);
    dps_in_shim--;
}

void dps_files_post_write(uint64_t id, off_t off, size_t asked, ssize_t rc, int err)
{
    message_t m = {.op = MSG_WRITE, .id = id, .off = off};
    if (rc < 0)
        m.rc = WRITE_FAILED, m.err = err;
    else
        m.rc = (size_t)rc < asked ? WRITE_SHORT : WRITE_WHOLE, m.asked = rc;
    post_about_handle(&m);
}

void dps_files_post_stream_call(uint64_t id, uint64_t k, int64_t ret, int failed, int err)
{
    message_t m = {.op = MSG_STREAM_CALL,
                   .rc = failed ? WRITE_FAILED : WRITE_WHOLE,
                   .err = failed ? err : 0,
                   .id = id,
                   .off = (int64_t)k,
                   .asked = ret};
    post_about_handle(&m);
}

/* --- a follower's view of rank 0: its writes and its place ------------------------------------ */

#define MAX_RANK0_FILES 64
#define MAX_FAILED_RUNS 16
typedef struct rank0_file {
    uint64_t id;    /* UINT64_MAX: a free slot */
    off_t end;      /* the end of rank 0's furthest write that succeeded */
    off_t fail_at;  /* where rank 0's writes stopped: -1 while none failed */
    int err;        /* the errno there; 0 after a short write, until rank 0's next write says */
    uint64_t calls; /* a stdio stream: rank 0's calls told */
    /* its calls that failed and this rank has not made yet, as runs of calls that returned the
     * same (a full disk fails every call from one on); more than fit are told as successes */
    struct failed_run {
        int64_t from, to, ret;
        int err;
    } failed[MAX_FAILED_RUNS];
    int nfailed;
} rank0_file_t;

/* All under order_lock. */
static rank0_file_t rank0_files[MAX_RANK0_FILES] = {[0 ... MAX_RANK0_FILES - 1] = {.id = UINT64_MAX}};
static unsigned rank0_files_next;      /* the slot taken when none is free: the oldest, about */
static uint64_t rank0_seq, rank0_coll; /* rank 0's place: the most its messages said */
static message_t pending;              /* an outcome that came during a write's wait */
static int have_pending;
/* The last outcomes taken in: where rank 0 is lost, the survivor that takes its place tells them
 * again, for a survivor that had not received them all (no survivor is more than one collective
 * ahead of another, and the calls between two collectives are few). Writes are not kept: a save
 * posts thousands; a stand-in's write that misses rank 0's goes on at the leader's next place. */
#define HISTORY 256
static message_t history[HISTORY];
static uint64_t nhistory;

static rank0_file_t *rank0_file(uint64_t id, int make)
{
    for (int i = 0; i < MAX_RANK0_FILES; i++)
        if (rank0_files[i].id == id) return &rank0_files[i];
    if (!make) return NULL;
    int i = 0;
    while (i < MAX_RANK0_FILES && rank0_files[i].id != UINT64_MAX)
        i++;
    if (i == MAX_RANK0_FILES) i = (int)(rank0_files_next++ % MAX_RANK0_FILES);
    rank0_files[i] = (rank0_file_t){.id = id, .fail_at = -1};
    return &rank0_files[i];
}

static void take_in(const message_t *m)
{
    /* after rank 0's loss, an outcome this rank took already: told again by its successor, or made
     * again by it (the successor had not heard of it): the first one stands */
    if (lead_changed && m->op < MSG_WRITE && m->seq < next_seq + (uint64_t)have_pending) return;
    if (m->op < MSG_WRITE) history[nhistory++ % HISTORY] = *m;
    uint64_t at = m->op < MSG_WRITE ? m->seq + 1 : m->seq;
    if (at > rank0_seq) rank0_seq = at;
    if (m->coll > rank0_coll) rank0_coll = m->coll;
    if (m->op < MSG_WRITE) {
        pending = *m, have_pending = 1;
        return;
    }
    if (m->op == MSG_STREAM_CALL) {
        rank0_file_t *f = rank0_file(m->id, 1);
        if ((uint64_t)m->off + 1 > f->calls) f->calls = (uint64_t)m->off + 1;
        if (m->rc != WRITE_FAILED) return;
        struct failed_run *last = f->nfailed ? &f->failed[f->nfailed - 1] : NULL;
        if (last && last->to + 1 == m->off && last->ret == m->asked && last->err == m->err)
            last->to = m->off;
        else if (f->nfailed < MAX_FAILED_RUNS)
            f->failed[f->nfailed++] = (struct failed_run){m->off, m->off, m->asked, m->err};
        else
            DPS_WARN_ONCE("[files] rank 0's writes to a gated stream failed in more than %d ways this rank "
                          "has not reached yet: the later ones succeed here",
                          MAX_FAILED_RUNS);
        return;
    }
    if (m->op != MSG_WRITE) return;
    rank0_file_t *f = rank0_file(m->id, 1);
    off_t done = m->off + m->asked;
    if (m->rc == WRITE_FAILED) {
        if (m->err == EINTR || m->err == EAGAIN || m->err == EWOULDBLOCK) return; /* retried */
        if (f->fail_at < 0) f->fail_at = m->off;
        if (!f->err) f->err = m->err;
        return;
    }
    if (done > f->end) f->end = done;
    if (f->fail_at >= 0 && !f->err && m->off >= f->fail_at) f->fail_at = -1; /* after a short write, on */
    if (m->rc == WRITE_SHORT && f->fail_at < 0) f->fail_at = done;           /* the next write says why */
}

/* Rank 0 is past this rank's place: a call this rank has not made, or a collective or check it
 * has not reached. Its writes before there are all here then. */
static int rank0_is_past(void)
{
    return have_pending || rank0_seq > next_seq || rank0_coll > places_reached();
}

/* What a write of this rank's pairs with: bytes [a, b) of handle id, or its stream's call #k. */
typedef struct paired {
    uint64_t id, k;
    off_t a, b;
} paired_t;

static int write_failed(const rank0_file_t *f, const paired_t *p)
{
    return f && f->fail_at >= 0 && f->fail_at < p->b && (p->a < f->fail_at || f->err);
}
static int write_known(const rank0_file_t *f, const paired_t *p)
{
    return write_failed(f, p) || (f && f->end >= p->b);
}
static int call_known(const rank0_file_t *f, const paired_t *p)
{
    return f && f->calls > p->k;
}

/* A wait the leader's loss ended (DPS_FILES_RANK_LOST): the survivors agree, and the lowest of them
 * leads from now on. 0: wait again (for the new leader, or not at all where that is this rank);
 * -1: no agreement here (not the main thread), the rank decides alone. Without order_lock, which
 * the new leader's take-over takes. */
static int leader_lost(const dps_files_channel_t *c, const char *what)
{
    dps_in_shim++;
    int rc = c->recover(what);
    dps_in_shim--;
    return rc;
}

/* With order_lock held: rank 0's messages taken in until known(rank 0's record of p's handle, p)
 * says rank 0's outcome is here, rank 0 is past this rank's place, or the channel is gone (*lost:
 * by the leader's loss). The record, or NULL. `what` names the wait for the guard (static: it may
 * read it meanwhile). */
static rank0_file_t *wait_for_rank0(const dps_files_channel_t *c, const paired_t *p,
                                    int (*known)(const rank0_file_t *, const paired_t *), const char *what,
                                    int *lost)
{
    *lost = 0;
    while (!known(rank0_file(p->id, 0), p) && !rank0_is_past()) {
        message_t m;
        int rc = c->wait(&m, sizeof m, what);
        *lost = rc == DPS_FILES_RANK_LOST;
        if (rc != 0) break;
        take_in(&m);
    }
    return rank0_file(p->id, 0);
}

ssize_t dps_files_rank0_write(uint64_t id, const char *path, off_t a, off_t b, int *err)
{
    static char what[DPS_PATH_BUF + 96]; /* as in dps_files_take */
    paired_t p = {.id = id, .a = a, .b = b};
    ssize_t n = b - a;
    for (int lost = 1; lost;) {
        const dps_files_channel_t *c = follower_channel();
        if (!c || id == UINT64_MAX) return b - a;
        dps_in_shim++;
        pthread_mutex_lock(&order_lock);
        snprintf(what, sizeof what, "wait for rank 0's write of %s (bytes %lld to %lld)", path, (long long)a,
                 (long long)b);
        const rank0_file_t *f = wait_for_rank0(c, &p, write_known, what, &lost);
        if (!lost && write_failed(f, &p)) n = a < f->fail_at ? f->fail_at - a : -1, *err = f->err;
        pthread_mutex_unlock(&order_lock);
        dps_in_shim--;
        if (lost && leader_lost(c, what) != 0) break;
    }
    return n;
}

int dps_files_rank0_stream_call(uint64_t id, uint64_t k, const char *path, int64_t *ret, int *err)
{
    static char what[DPS_PATH_BUF + 96]; /* as in dps_files_take */
    paired_t p = {.id = id, .k = k};
    rank0_file_t *f = NULL;
    for (int lost = 1; lost;) {
        const dps_files_channel_t *c = follower_channel();
        if (!c || id == UINT64_MAX) return 0;
        dps_in_shim++;
        pthread_mutex_lock(&order_lock);
        snprintf(what, sizeof what, "wait for rank 0's write call #%llu to %s", (unsigned long long)k + 1,
                 path);
        f = wait_for_rank0(c, &p, call_known, what, &lost);
        if (!lost) break; /* with the lock */
        pthread_mutex_unlock(&order_lock);
        dps_in_shim--;
        if (leader_lost(c, what) != 0) return 0;
    }
    int failed = 0, n = 0;
    for (int i = 0; f && i < f->nfailed; i++) {
        struct failed_run *run = &f->failed[i];
        if (run->from <= (int64_t)k && (int64_t)k <= run->to) failed = 1, *ret = run->ret, *err = run->err;
        if (run->to > (int64_t)k)
            f->failed[n++] = *run; /* this rank's calls come in order: the rest are done */
    }
    if (f) f->nfailed = n;
    pthread_mutex_unlock(&order_lock);
    dps_in_shim--;
    return failed;
}

void dps_files_forget_writes(uint64_t id)
{
    if (id == UINT64_MAX) return;
    pthread_mutex_lock(&order_lock);
    rank0_file_t *f = rank0_file(id, 0);
    if (f) f->id = UINT64_MAX;
    pthread_mutex_unlock(&order_lock);
}

static void mark_place(uint64_t coll)
{
    if (DPS_LIKELY(!atomic_load_explicit(&dps_files_handles, memory_order_relaxed))) return;
    const dps_files_channel_t *c = usable_channel();
    if (!c) return;
    dps_in_shim++;
    if (leads()) {
        message_t m = {.op = MSG_MARK, .coll = coll};
        post(c, &m);
    } else if (pthread_mutex_trylock(&order_lock) == 0) { /* a waiting write holds it: it takes them in */
        message_t m;
        while (!have_pending && c->poll(&m, sizeof m) == 1)
            take_in(&m);
        pthread_mutex_unlock(&order_lock);
    }
    dps_in_shim--;
}

void dps_files_at_place(void)
{
    mark_place(atomic_fetch_add(&places, 1) + 1);
}
void dps_files_leaving(void)
{
    mark_place(UINT64_MAX);
}

static void acknowledge(uint64_t seq, uint32_t path);

/* Rank 0's outcome of this call into r->rc0/err0; 0, -1 where there is no channel, or
 * DPS_FILES_LEAD_NOW: rank 0 was lost meanwhile, and this rank took its place. */
int dps_files_take(dps_redirect_t *r)
{
    message_t o;
    /* static, so the guard may read it while this rank waits; one waiter at a time (order_lock) */
    static char what[DPS_PATH_BUF + 96];
    for (;;) {
        const dps_files_channel_t *c = follower_channel();
        if (!c) return leads() && usable_channel() ? DPS_FILES_LEAD_NOW : -1;
        int rc = 0;
        dps_in_shim++;
        pthread_mutex_lock(&order_lock);
        snprintf(what, sizeof what, "wait for rank 0's file operation #%llu (%s %s)",
                 (unsigned long long)next_seq + 1, dps_files_op_name(r->op), r->orig);
        while (!have_pending && rc == 0) {
            rc = c->wait(&o, sizeof o, what);
            if (rc == 0) take_in(&o);
        }
        if (rc == 0) o = pending, have_pending = 0, next_seq++;
        pthread_mutex_unlock(&order_lock);
        dps_in_shim--;
        if (rc == DPS_FILES_RANK_LOST && leader_lost(c, what) == 0) continue;
        if (rc != 0) return -1;
        break;
    }
    atomic_fetch_add_explicit(&dps_diag_count.followed, 1, memory_order_relaxed);
    if (o.op != (int32_t)r->op) {
        DPS_WARN_ONCE("[files] rank 0's gated file operation #%llu was '%s', this rank's is '%s' of %s: the "
                      "ranks' operations on rank0_only paths come in another order (threads, or code that "
                      "depends on the rank); this rank decides such calls alone",
                      (unsigned long long)o.seq + 1,
                      o.op >= 0 && o.op < DPS_FOP_COUNT ? dps_files_op_name(o.op) : "?",
                      dps_files_op_name(r->op), r->orig);
        if (is_read(o.op)) acknowledge(o.seq, o.path); /* past it: rank 0 must not wait for it */
        return -1;
    }
    r->rc0 = o.rc, r->err0 = o.err, r->path0 = o.path, r->seq = o.seq;
    return 0;
}

/* --- rank 0 lost: the lowest survivor leads ------------------------------------------------- */

int dps_files_new_leader(const int *ranks, int n)
{
    const dps_files_channel_t *c = usable_channel();
    int was = atomic_load(&leader), kept = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == was) kept = i;
    int *f = malloc((size_t)(n > 1 ? n - 1 : 1) * sizeof *f);
    if (!atomic_load(&dps_files_on) || !c || !f || n < 1) {
        free(f);
        if (n >= 1) atomic_store(&leader, ranks[0]);
        return 0;
    }
    for (int i = 0, k = 0; i < n; i++) /* the survivors, less the one that leads */
        if (i != (kept >= 0 ? kept : 0)) f[k++] = ranks[i];
    if (kept >= 0) { /* the leader survived: it waits no more for the lost ones' acknowledgements */
        pthread_mutex_lock(&ack_lock);
        free(followers);
        followers = f, nfollowers = n - 1;
        pthread_mutex_unlock(&ack_lock);
        return 0;
    }
    dps_in_shim++;
    pthread_mutex_lock(&order_lock);
    pthread_mutex_lock(&ack_lock);
    free(followers);
    followers = f, nfollowers = n - 1;
    reads.n = acks.n = 0; /* the reads the lost rank waited for are no one's now */
    pthread_mutex_unlock(&ack_lock);
    atomic_store(&leader, ranks[0]);
    /* the lost rank's place is no one's either: the new leader's messages say its own */
    rank0_seq = next_seq, rank0_coll = 0, lead_changed = 1;
    if (leads()) {
        /* what the lost rank told this rank, told again, in order: a survivor that had not taken it
         * all in takes the rest (and drops what it has) */
        uint64_t first = nhistory > HISTORY ? nhistory - HISTORY : 0;
        for (uint64_t i = first; i < nhistory; i++) {
            message_t m = history[i % HISTORY];
            m.coll = 0;
            c->post(&m, sizeof m);
        }
        if (have_pending) {
            message_t m = pending;
            m.coll = 0;
            c->post(&m, sizeof m);
            have_pending = 0; /* its call, not made here yet, this rank now makes as the leader */
        }
        for (int i = 0; i < MAX_RANK0_FILES; i++)
            rank0_files[i].id = UINT64_MAX;
    }
    pthread_mutex_unlock(&order_lock);
    dps_in_shim--;
    return leads();
}

/* --- reads before changes ------------------------------------------------------------------ */

/* A follower is past the read rank 0 made as call `seq`, of the path rank 0 knows as `path`. */
typedef struct ack {
    uint64_t seq;
    uint32_t path, pad;
} ack_t;

static void acknowledge(uint64_t seq, uint32_t path)
{
    const dps_files_channel_t *c = usable_channel();
    if (!c || seq == UINT64_MAX) return;
    ack_t a = {seq, path, 0};
    dps_in_shim++;
    c->ack(&a, sizeof a);
    dps_in_shim--;
}

/* Rank 0, before it changes a gated path: every follower has made the reads of that path rank 0
 * made before, so none reads what this change puts in place of what rank 0 read. Reads of other
 * paths are not waited for: code that reads a path on rank 0 alone never holds rank 0 up. */
static void settle_path(const dps_files_channel_t *c, int dirfd, const char *path, const char *op)
{
    uint32_t h = path_key(dirfd, path);
    uint64_t until = mark_of(&reads, 0, h);
    if (!until) return;
    static char what[DPS_PATH_BUF + 96]; /* as in wait_for_leader; one waiter at a time (ack_lock) */
    snprintf(what, sizeof what, "wait for the other ranks' reads of %s before rank 0's %s", path, op);
    for (int i = 0; i < (followers ? nfollowers : my_size - 1); i++) {
        int q = followers ? followers[i] : i + 1;
        while (mark_of(&acks, q, h) < until) {
            ack_t a;
            int src;
            int rc = c->next_ack(&a, sizeof a, &src, what);
            if (rc == DPS_FILES_RANK_LOST && c->lost(q)) break; /* q's read will never come */
            if (rc == DPS_FILES_RANK_LOST) { /* another rank's loss: q's read may still come */
                struct timespec nap = {0, 100000};
                nanosleep(&nap, NULL);
                continue;
            }
            if (rc != 0 || src < 0 || src >= my_size || src == my_rank) return;
            set_mark(&acks, src, a.path, a.seq + 1);
        }
    }
}

static void settle_reads(const dps_redirect_t *r)
{
    const dps_files_channel_t *c = usable_channel();
    if (!c) return;
    dps_in_shim++;
    pthread_mutex_lock(&ack_lock);
    if (reads.n) {
        settle_path(c, r->dirfd, r->orig, dps_files_op_name(r->op));
        if (r->first) settle_path(c, r->first_dirfd, r->first, dps_files_op_name(r->op));
    }
    pthread_mutex_unlock(&ack_lock);
    dps_in_shim--;
}

/* --- sinks ----------------------------------------------------------------------------------- */

DPS_REAL_DECLARE(int, openat, (int, const char *, int, ...));
DPS_REAL_DECLARE(int, close, (int));

/* A file of this rank's own for an open that writes `r->path`: in memory, so that it takes no
 * space where rank 0's file lies (a full disk, a quota, NFS's .nfs files would otherwise fail a
 * save alone succeeds in); handles.c bounds what it keeps. When the call does not truncate, it
 * starts as the file is (its content where the call may read, its size where it only writes). */
static int make_sink(dps_redirect_t *r)
{
    int tmpfile = (r->flags & O_TMPFILE) == O_TMPFILE;
    int fd = memfd_create("dpshim-standin", MFD_CLOEXEC);
    if (fd < 0) return -1;
    /* fstat on every rank shows the mode rank 0's file has: the one it was made with, less the
     * umask, or the one it already had (rank 0's call came first) */
    struct stat made;
    if (!tmpfile && dps_sys_fstatat(r->dirfd, r->path, &made, 0) == 0 && S_ISREG(made.st_mode))
        fchmod(fd, made.st_mode & 07777);
    if (!tmpfile && !(r->flags & O_TRUNC)) {
        int src = DPS_REAL(openat)(r->dirfd, r->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        struct stat st;
        if (src >= 0 && fstat(src, &st) == 0 && S_ISREG(st.st_mode)) {
            /* what it reads back: the content, up to the bound the stand-in keeps */
            off_t keep = (r->flags & O_ACCMODE) == O_WRONLY ? 0 : st.st_size;
            if (keep > dps_files_standin_bytes) keep = dps_files_standin_bytes;
            if (!keep) r->hollow = st.st_size;
            if (ftruncate(fd, st.st_size) != 0) DPS_DEBUG("sink for %s: %s", r->orig, strerror(errno));
            if (keep) {
                for (off_t left = keep; left > 0;) { /* in the kernel; a copy where it cannot */
                    ssize_t k = copy_file_range(src, NULL, fd, NULL, (size_t)left, 0);
                    if (k <= 0) {
                        char buf[1 << 16];
                        k = read(src, buf, (size_t)left < sizeof buf ? (size_t)left : sizeof buf);
                        if (k <= 0 || dps_sys_write(fd, buf, (size_t)k) != k) break;
                    }
                    left -= k;
                }
                lseek(fd, 0, SEEK_SET);
            }
        }
        if (src >= 0) DPS_REAL(close)(src);
    }
    return fd;
}

/* The flags that reopen the sink through /proc/self/fd as the program's call would open it. */
static int sink_flags(int flags)
{
    int acc = flags & O_ACCMODE;
    return (flags & ~(O_CREAT | O_EXCL | O_TRUNC | O_NOFOLLOW | O_TMPFILE | O_DIRECT | O_NOCTTY)) |
           (acc == O_RDONLY ? O_RDWR : acc);
}

/* --- followers -------------------------------------------------------------------------------- */

/* A follower's call whose wait ended with this rank in the lost rank 0's place: made as the leader. */
static int lead_now(dps_redirect_t *r, int saved)
{
    r->action = DPS_FILE_LEAD;
    before_change(r);
    errno = saved;
    return 1;
}

int dps_files_follow(dps_redirect_t *r)
{
    int saved = errno, took = dps_files_take(r);
    if (took == DPS_FILES_LEAD_NOW) return lead_now(r, saved);
    if (took != 0) r->rc0 = 0, r->err0 = 0; /* alone: rank 0's call is taken to succeed */
    int real = 1;
    if (r->op == DPS_FOP_OPEN_WRITE) {
        if (r->rc0 == 0) {
            dps_in_shim++;
            r->sink = make_sink(r);
            dps_in_shim--;
            if (r->sink < 0) {
                r->rc0 = -1, r->err0 = errno;
                DPS_WARN_ONCE("[files] no file to stand in for %s on this rank: %s", r->orig,
                              strerror(errno));
                real = 0;
            } else {
                snprintf(r->buf, sizeof r->buf, "/proc/self/fd/%d", r->sink);
                r->path = r->buf;
                r->flags = sink_flags(r->flags);
                atomic_fetch_add_explicit(&dps_diag_count.sinks, 1, memory_order_relaxed);
            }
        } else {
            real = 0;
        }
    } else if (!is_read(r->op)) {
        atomic_fetch_add_explicit(&dps_diag_count.noops, 1, memory_order_relaxed);
        real = 0;
    }
    errno = saved;
    return real;
}

DPS_REAL_DECLARE(int, unlinkat, (int, const char *, int));

int dps_files_follow_pair(dps_redirect_t *ra, dps_redirect_t *rb)
{
    int saved = errno;
    uint32_t mine = path_key(ra->dirfd, ra->orig);
    rb->path0 = mine; /* without a channel: rank 0's name is taken for ours */
    int took = dps_files_take(rb);
    if (took == DPS_FILES_LEAD_NOW) return lead_now(rb, saved);
    if (took != 0) rb->rc0 = 0, rb->err0 = 0;
    /* A rename takes the source away. Under a name of this rank's own (a per-call temporary)
     * the source is this rank's file: it goes. Under rank 0's name it was rank 0's, renamed by
     * now, or a copy on a file system rank 0 does not see: left alone. */
    if (rb->op == DPS_FOP_RENAME && rb->rc0 == 0 && !ra->gated && rb->path0 != mine) {
        dps_in_shim++;
        DPS_REAL(unlinkat)(ra->dirfd, ra->path, 0);
        dps_in_shim--;
    }
    atomic_fetch_add_explicit(&dps_diag_count.noops, 1, memory_order_relaxed);
    errno = saved;
    return 0;
}

int dps_files_done(dps_redirect_t *r, int ok)
{
    int saved = errno, keep = 1;
    if (r->action == DPS_FILE_LEAD) {
        dps_files_post(r, ok);
    } else if (r->action == DPS_FILE_FOLLOW) {
        if (r->sink >= 0) DPS_REAL(close)(r->sink), r->sink = -1;
        if (is_read(r->op)) acknowledge(r->seq, r->path0);
        keep = !(ok && r->rc0 != 0); /* rank 0 failed: so does this rank (its tree may differ) */
    }
    errno = saved;
    return keep;
}
