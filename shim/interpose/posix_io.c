/* The write family, close and sync on open gated files (shim/files/handles.c). With no gated
 * file open, or inside the shim, each wrapper is one atomic load and the real call. On a rank
 * other than 0 a write to a stand-in keeps what the bound allows; rank 0's writes go to the file
 * and their failures are noted; close, fsync and fdatasync return rank 0's outcome everywhere. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/dps.h"
#include "core/real.h"
#include "files/files.h"

#define BYPASS() (DPS_LIKELY(!atomic_load_explicit(&dps_files_handles, memory_order_relaxed)) || dps_in_shim)

/* A write of `iov` at off (-1: at the file offset); CALL is the real call. */
#define WRITE_BODY(fd_, iov_, n_, off_, CALL)                                                                \
    do {                                                                                                     \
        if (BYPASS()) return CALL;                                                                           \
        int kind_ = dps_files_handle_kind(fd_);                                                              \
        if (kind_ == DPS_HANDLE_STANDIN) return dps_files_standin_write(fd_, iov_, n_, off_);                \
        ssize_t rc_ = CALL;                                                                                  \
        if (kind_ == DPS_HANDLE_RANK0) {                                                                     \
            size_t asked_ = 0;                                                                               \
            for (int k_ = 0; k_ < (n_); k_++)                                                                \
                asked_ += (iov_)[k_].iov_len;                                                                \
            dps_files_wrote(fd_, asked_, off_, rc_, errno);                                                  \
        }                                                                                                    \
        return rc_;                                                                                          \
    } while (0)

DPS_REAL_DECLARE(ssize_t, write, (int, const void *, size_t));
DPS_REAL_DECLARE(ssize_t, pwrite, (int, const void *, size_t, off_t));
DPS_REAL_DECLARE(ssize_t, pwrite64, (int, const void *, size_t, off64_t));
DPS_REAL_DECLARE(ssize_t, writev, (int, const struct iovec *, int));
DPS_REAL_DECLARE(ssize_t, pwritev, (int, const struct iovec *, int, off_t));
DPS_REAL_DECLARE(ssize_t, pwritev64, (int, const struct iovec *, int, off64_t));

/* Before main: a first write may carry a dlerror() string (real.h, dps_real_resolve). */
__attribute__((constructor)) DPS_STARTUP static void resolve_writes(void)
{
    const dps_real_now_t now[] = {DPS_REAL_NOW(write),  DPS_REAL_NOW(pwrite),  DPS_REAL_NOW(pwrite64),
                                  DPS_REAL_NOW(writev), DPS_REAL_NOW(pwritev), DPS_REAL_NOW(pwritev64)};
    dps_real_resolve(now, sizeof now / sizeof *now);
}

DPS_EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
    struct iovec v = {(void *)buf, n};
    WRITE_BODY(fd, &v, 1, -1, DPS_REAL(write)(fd, buf, n));
}
DPS_EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    struct iovec v = {(void *)buf, n};
    WRITE_BODY(fd, &v, 1, off, DPS_REAL(pwrite)(fd, buf, n, off));
}
DPS_EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    struct iovec v = {(void *)buf, n};
    WRITE_BODY(fd, &v, 1, off, DPS_REAL(pwrite64)(fd, buf, n, off));
}
DPS_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
    WRITE_BODY(fd, iov, n, -1, DPS_REAL(writev)(fd, iov, n));
}
DPS_EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
    WRITE_BODY(fd, iov, n, off, DPS_REAL(pwritev)(fd, iov, n, off));
}
DPS_EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int n, off64_t off)
{
    WRITE_BODY(fd, iov, n, off, DPS_REAL(pwritev64)(fd, iov, n, off));
}

/* close and sync: CALL is the real call on fd, returning 0 or -1. */
#define PAIRED_BODY(fd_, op_, CALL)                                                                          \
    do {                                                                                                     \
        if (BYPASS()) return CALL;                                                                           \
        dps_fdcall_t c_;                                                                                     \
        if (!dps_files_fd_begin(&c_, fd_, DPS_FOP_##op_)) return CALL;                                       \
        int rc_ = CALL;                                                                                      \
        return dps_files_fd_end(&c_, rc_, errno);                                                            \
    } while (0)

DPS_REAL_DECLARE(int, close, (int));
DPS_REAL_DECLARE(int, fsync, (int));
DPS_REAL_DECLARE(int, fdatasync, (int));

DPS_EXPORT int close(int fd)
{
    PAIRED_BODY(fd, CLOSE, DPS_REAL(close)(fd));
}
DPS_EXPORT int fsync(int fd)
{
    PAIRED_BODY(fd, SYNC, DPS_REAL(fsync)(fd));
}
DPS_EXPORT int fdatasync(int fd)
{
    PAIRED_BODY(fd, SYNC, DPS_REAL(fdatasync)(fd));
}
