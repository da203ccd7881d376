/* The file policy: which paths a call touches on this rank, and with what outcome.
 *
 * [files] per_rank paths gain the rank on every rank. [files] rank0_only paths ("gated") are
 * rank 0's alone, with one rule: rank 0's calls are the plain program's calls, exactly (its
 * paths, modes, links, flags and errno; data written through, so it survives any way out), and
 * every other rank gets the outcome rank 0 got, with nothing landing. Rank 0 leads: after each
 * call on a gated path it posts the outcome (success, or the errno) on the backend's file
 * channel, in order; the others follow: each gated call waits for rank 0's outcome of the same
 * call (the n-th gated call of one rank is the n-th of the other, as the ranks run one program)
 * and then
 *   - an open that writes gives a sink (a stand-in), a memory file of its own that supports what
 *     the file would (fsync, ftruncate, fallocate, mmap, reading back, starting from the file's
 *     content when not truncated) and takes no space where the file lies;
 *   - a call that changes the tree (rename, unlink, mkdir, rmdir, link, symlink, truncate,
 *     chmod) returns rank 0's result and does nothing;
 *   - a lookup or an open that reads runs for real after rank 0's, so a file rank 0 wrote earlier
 *     is read whole, as rank 0 left it (read after write); the follower acknowledges it, and
 *     rank 0 changes no gated path before every follower made the reads of it rank 0 made.
 * The channel exists from the job's first collective or first gated call on (the interposers
 * open the backend there in a program that calls hooks: interpose/posix_files.c). Where none
 * exists (children of a rank process, a wrapper, a rank-0 scope, a backend without one), or the
 * calls do not pair (another kind of call than rank 0's), the other ranks take rank 0's call to
 * have succeeded: their own tree cannot tell what rank 0's will be.
 * The interposers in shim/interpose/ ask here and call the real function. */
#ifndef DPS_FILES_H
#define DPS_FILES_H

#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "policy.h"

#define DPS_PATH_BUF (PATH_MAX + 64)

typedef enum {
    DPS_FILE_PASS,   /* the call as the program made it (the path may be rank-mapped) */
    DPS_FILE_LEAD,   /* rank 0, a gated path: the real call, whose outcome is posted */
    DPS_FILE_FOLLOW, /* another rank, a gated path: rank 0's outcome first (dps_files_follow) */
} dps_file_action_t;

/* The kinds of gated call; the leader's and a follower's n-th calls must be of one kind. */
/* One kind per line: clang-format 14 does not settle on one layout for this list. */
/* clang-format off */
#define DPS_FILE_OPS(X) \
    X(OPEN_WRITE, "open for writing") \
    X(OPEN_READ, "open for reading") \
    X(LOOKUP, "lookup") \
    X(RENAME, "rename") \
    X(UNLINK, "unlink") \
    X(MKDIR, "mkdir") \
    X(RMDIR, "rmdir") \
    X(LINK, "link") \
    X(SYMLINK, "symlink") \
    X(TRUNCATE, "truncate") \
    X(CHMOD, "chmod") \
    X(CLOSE, "close") \
    X(SYNC, "fsync") \
    X(FLUSH, "fflush")
/* clang-format on */
typedef enum {
#define DPS_FILE_OP_ENUM(id, text) DPS_FOP_##id,
    DPS_FILE_OPS(DPS_FILE_OP_ENUM)
#undef DPS_FILE_OP_ENUM
        DPS_FOP_COUNT
} dps_file_op_t;

typedef struct dps_redirect {
    dps_file_action_t action;
    dps_file_op_t op;
    const char *path;  /* what the real call gets */
    int flags;         /* open flags the real call gets */
    int gated;         /* the path matches [files] rank0_only (or was learned, see rename) */
    int sink;          /* FOLLOW, an open that writes: the sink, until dps_files_done */
    int rc0, err0;     /* FOLLOW: rank 0's outcome (0 or -1, and its errno) */
    uint32_t path0;    /* FOLLOW: the key of rank 0's path (its first, for rename and link) */
    uint64_t seq;      /* FOLLOW: the number of rank 0's call; UINT64_MAX where none was taken */
    off_t hollow;      /* FOLLOW, an open that writes: the sink's first bytes, not the file's */
    const char *orig;  /* the program's path */
    const char *first; /* rename and link: the first path, whose key rank 0 posts */
    int first_dirfd;
    int dirfd;
    char buf[DPS_PATH_BUF];
} dps_redirect_t;

/* Nonzero when any glob is configured: the interposers' only check on the fast path. */
extern atomic_int dps_files_on;

int dps_files_configure(const dps_policy_t *p, int rank, int size, char *err, size_t errlen);

/* The channel the leader posts on and the followers wait on (set by the engine, which opens the
 * backend on first use), and back: a follower acknowledges each read or lookup it made, and
 * the leader, before it changes a gated path, waits until every follower has made the reads of
 * it that the leader made before (so a follower never opens a later version than rank 0 did). Each returns -1
 * where there is no channel for this call: then the ranks decide alone. `what` names a wait
 * for the guard. */
typedef struct dps_files_channel {
    int (*post)(const void *msg, size_t len);
    /* wait: DPS_FILES_RANK_LOST where the leader was lost meanwhile; then recover: the survivors
     * agree (0; -1 where this rank cannot take part: not the main thread), and the lowest of them
     * leads from now on (dps_files_new_leader). next_ack: DPS_FILES_RANK_LOST while a rank's loss
     * is pending; lost(r): rank r was lost (its acknowledgements will never come). */
    int (*wait)(void *msg, size_t len, const char *what);
    int (*poll)(void *msg, size_t len); /* 1: a message came, 0: none has */
    int (*ack)(const void *msg, size_t len);
    int (*next_ack)(void *msg, size_t len, int *src, const char *what);
    int (*recover)(const char *what);
    int (*lost)(int rank);
} dps_files_channel_t;
enum { DPS_FILES_RANK_LOST = 1 };
void dps_files_set_channel(const dps_files_channel_t *c);

/* Classification (fills r): the open family with its flags; calls on one path, which change it
 * (op: UNLINK, MKDIR, RMDIR, SYMLINK, TRUNCATE, CHMOD) or look it up (LOOKUP: stat, access);
 * two-path calls (rename, link), gated when either path is, where rb gets the action and the
 * new path. */
void dps_files_open(dps_redirect_t *r, int dirfd, const char *path, int flags);
void dps_files_path(dps_redirect_t *r, dps_file_op_t op, int dirfd, const char *path);
void dps_files_pair(dps_redirect_t *ra, dps_redirect_t *rb, dps_file_op_t op, int fda, const char *a, int fdb,
                    const char *b);

/* FOLLOW: waits for rank 0's outcome of this call. 1: make the real call now (on r->path with
 * r->flags: the sink, for an open that writes; the program's path, where rank 0 was lost meanwhile
 * and this rank leads now: r->action is LEAD), then dps_files_done. 0: the call is complete;
 * return r->rc0 with errno = r->err0. For a rename or link, ra is the first path's redirect. */
int dps_files_follow(dps_redirect_t *r);
int dps_files_follow_pair(dps_redirect_t *ra, dps_redirect_t *rb);
/* After the real call (ok: it succeeded), for every action; errno is kept. LEAD: posts the
 * outcome. FOLLOW: closes the sink; returns 0 when rank 0 failed where this rank succeeded
 * (the caller undoes its call and returns -1 with errno = r->err0), else 1. */
int dps_files_done(dps_redirect_t *r, int ok);

/* --- rank 0's writes on the other ranks ---
 * Rank 0 posts the outcome of each write to a gated file on the channel too, keyed by the number
 * of the open that made the handle, and its place (its next call's number, its collectives
 * entered). A write to a stand-in returns what rank 0's write of the same bytes returned: it
 * waits until rank 0 has written them, or has failed before them, or is past this rank's place
 * (a later gated call, a later collective: rank 0 wrote no such bytes, content that differs by
 * rank). Rank 0 marks its place at each collective while it holds a gated file open, so no such
 * wait outlasts rank 0's next collective. */
/* Rank 0: wrote [off, off + asked) of handle id with result rc (errno err). */
void dps_files_post_write(uint64_t id, off_t off, size_t asked, ssize_t rc, int err);
/* Another rank: how many of the bytes [a, b) of handle id a write may take (b - a: all of them),
 * or -1 with *err = rank 0's errno; path names the wait. */
ssize_t dps_files_rank0_write(uint64_t id, const char *path, off_t a, off_t b, int *err);
/* C stdio writes to a gated stream (fwrite, fputs, fprintf, fputc, putc): glibc writes the
 * stream's buffer from inside, so these pair by call instead, the k-th of a stream with rank 0's
 * k-th. Rank 0 posts each call's outcome (ret, and err where it failed); another rank's k-th
 * call returns what rank 0's returned where that was a failure (1, with *ret and *err), else
 * makes the real call (0). */
void dps_files_post_stream_call(uint64_t id, uint64_t k, int64_t ret, int failed, int err);
int dps_files_rank0_stream_call(uint64_t id, uint64_t k, const char *path, int64_t *ret, int *err);
/* A stand-in closed: rank 0's writes of it are no longer needed. */
void dps_files_forget_writes(uint64_t id);
/* Every rank, before each collective and each check of the guard's that waits for the others
 * (the same places on every rank): rank 0 marks its place, the others take in what rank 0 said
 * so far. Rank 0 when it leaves: it writes no more. Both only while gated files are open. */
void dps_files_at_place(void);
void dps_files_leaving(void);

/* --- open gated files (handles.c) ---
 * An open that wrote a gated path (rank 0's real file, another rank's stand-in) is a handle until
 * it is closed. A stand-in keeps the first [files] standin_mb of what the rank writes in memory;
 * past that, writes move the size and the offset only. Writes are each rank's own (rank 0's
 * through to the file) and return rank 0's result (above); closing and syncing are paired like
 * the calls above: every rank gets rank 0's outcome. */
extern atomic_int dps_files_handles; /* open handles: the write family's fast path */
enum { DPS_HANDLE_NONE, DPS_HANDLE_RANK0, DPS_HANDLE_STANDIN };
/* What a stand-in keeps in memory at most ([files] standin_mb), set by dps_files_configure. Both
 * live in files.c, which handles.c stands on: the two files call one way. */
extern off_t dps_files_standin_bytes;
/* After an open on r that returned fd (any action; only opens that write a gated path count). */
void dps_files_opened(const dps_redirect_t *r, int fd);
int dps_files_handle_kind(int fd);
/* For an fd dps_files_handle_kind classified in the same call. A write to a stand-in, at off
 * (-1: at the file offset); the program's result. */
ssize_t dps_files_standin_write(int fd, const struct iovec *iov, int n, off_t off);
/* Rank 0 wrote `asked` bytes at off (-1: at the file offset), with result rc and errno err;
 * errno is left as err. */
void dps_files_wrote(int fd, size_t asked, off_t off, ssize_t rc, int err);
/* A stdio write call on the stream of fd: its kind (DPS_HANDLE_*), and, for a handle, its number
 * on the channel, the call's number on this stream and the path (cap DPS_PATH_BUF). */
int dps_files_stream_call(int fd, uint64_t *id, uint64_t *k, char *path);
/* close, fsync, fdatasync, fclose, fflush on fd: begin is 0 where fd is no handle (make the
 * plain call); else make the real call, then return what end returns (its errno set). */
typedef struct dps_fdcall {
    int sink, err; /* a stand-in; rank 0: the errno of a write that failed before */
    off_t end;     /* rank 0: how far the program wrote */
    uint64_t id;   /* the handle's number on the channel (UINT64_MAX: its writes were unpaired) */
    dps_redirect_t r;
} dps_fdcall_t;
int dps_files_fd_begin(dps_fdcall_t *c, int fd, dps_file_op_t op);
int dps_files_fd_end(dps_fdcall_t *c, int rc, int err);
/* Rank 0 at exit: the gated files left shorter than the program wrote them, or incomplete after
 * rank 0's loss (below), each reported; their number. */
int dps_files_exit_check(void);

/* --- rank 0 lost ---
 * The survivors ranks[0..n) (the job's ranks, in order) go on: called on every survivor after
 * each loss, once the backend's channel goes among them. Where the rank that led was lost, the
 * lowest survivor leads from now on: it tells the others again the last messages it took in (a
 * survivor that missed some takes them, the others drop them), and returns 1; it then calls
 * dps_files_lead_handles, and its stand-ins become the files (written from what the stand-in
 * holds where the file may lack it; a file left incomplete is reported at exit). */
int dps_files_new_leader(const int *ranks, int n);
/* This rank leads (rank 0, or the survivor that took its place). */
int dps_files_leads(void);
void dps_files_lead_handles(void);

/* Between files.c and handles.c: an absolute path, the channel's two ends, an op's name. */
int dps_files_absolute(int dirfd, const char *path, char *out, size_t cap);
void dps_files_post(dps_redirect_t *r, int ok);
enum { DPS_FILES_LEAD_NOW = 1 }; /* dps_files_take: rank 0 was lost, and this rank leads now */
int dps_files_take(dps_redirect_t *r);
const char *dps_files_op_name(dps_file_op_t op);

/* chdir/fchdir happened: relative paths resolve elsewhere now. */
void dps_files_cwd_changed(void);

/* Exposed for unit tests (tests/unit/test_files.c), unchanged: the lexical normalization that
 * glob views go through, and the per-rank name (with the configured rank) that per_rank paths
 * become. */
void dps_files_normalize(const char *src, char *dst, size_t cap);
void dps_files_rank_path(const char *path, char *out, size_t cap);

#endif
