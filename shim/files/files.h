/* The file policy: which paths a call touches on this rank. [files] per_rank paths gain the
 * rank on every rank; [files] rank0_only paths are written by rank 0 alone (other ranks get a
 * sink or a successful no-op), and rank 0's truncating writes appear atomically when the file
 * is closed. The interposers in shim/interpose/ ask here and call the real function. */
#ifndef DPS_FILES_H
#define DPS_FILES_H

#include <limits.h>
#include <stdatomic.h>

#include "policy.h"

#define DPS_PATH_BUF (PATH_MAX + 64)

typedef enum {
    DPS_FILE_PASS,    /* the call as the program made it (path may be rank-mapped) */
    DPS_FILE_SINK,    /* open: /dev/null instead (non-root, rank0_only, writing) */
    DPS_FILE_NOOP,    /* rename/unlink/mkdir/truncate/chmod: succeed without effect */
    DPS_FILE_PUBLISH, /* open on rank 0: write a temporary, rename it over the path at close */
} dps_file_action_t;

typedef struct dps_redirect {
    dps_file_action_t action;
    const char *path; /* what the real call gets */
    int flags;        /* open flags the real call gets */
    int gated;        /* the path matches [files] rank0_only */
    char buf[DPS_PATH_BUF];
    char final[DPS_PATH_BUF]; /* PUBLISH: absolute path the temporary becomes */
} dps_redirect_t;

/* Nonzero when any glob is configured: the interposers' only check on the fast path. */
extern atomic_int dps_files_on;
/* Nonzero while PUBLISH files are open: close() looks them up only then. */
extern atomic_int dps_files_pending;

int dps_files_configure(const dps_policy_t *p, int rank, char *err, size_t errlen);

/* open family: fills r (r->path, r->flags) for a call with these arguments. */
void dps_files_open(dps_redirect_t *r, int dirfd, const char *path, int flags);
/* After the real open: registers a PUBLISH file; returns fd unchanged, errno untouched. */
int dps_files_opened(dps_redirect_t *r, int fd);

/* A PUBLISH file being closed: taken from the table before the real close (so its descriptor
 * number cannot be reused under us), finished after it. */
typedef struct dps_publish {
    char *tmp, *final;
} dps_publish_t;
int dps_files_take(int fd, dps_publish_t *p); /* 1 when fd was a PUBLISH file */
/* ok: the close succeeded, so the temporary becomes its path; else it is removed. */
void dps_files_finish(dps_publish_t *p, int ok);
/* Path-only calls (rename, unlink, mkdir, truncate, chmod) that modify `path`. */
void dps_files_modify(dps_redirect_t *r, int dirfd, const char *path);
/* Lookups (stat, access): only the per_rank mapping applies. */
void dps_files_lookup(dps_redirect_t *r, int dirfd, const char *path);
/* At exit of the rank process: publish what is still open. */
void dps_files_shutdown(void);
/* chdir/fchdir happened: relative paths resolve elsewhere now. */
void dps_files_cwd_changed(void);

/* Exposed for unit tests (tests/unit/test_files.c), unchanged: the lexical normalization that
 * glob views and published paths go through, and the per-rank name (with the configured rank)
 * that per_rank paths become. */
void dps_files_normalize(const char *src, char *dst, size_t cap);
void dps_files_rank_path(const char *path, char *out, size_t cap);

#endif
