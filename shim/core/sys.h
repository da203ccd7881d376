/* The shim's own system calls: straight to the kernel with syscall(2), never through the shim's
 * interposers (which define open, write, stat ... in this library, so a call by the libc name from
 * inside libdpshim.so binds to them), whatever the re-entry guard says, and safe in a signal
 * handler. The shim's own files, logs, pipes and probes go through here; a call that means to apply
 * the file policy calls the interposer's code by its dps_ name. Header only, depending on nothing
 * of the shim: the policy library, below it, uses it too. tests/checks/own_calls.sh fails when an
 * object outside shim/interpose/ refers to an interposed libc name. Linux, 64-bit (the kernel's
 * stat is glibc's struct stat there). */
#ifndef DPS_SYS_H
#define DPS_SYS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

_Static_assert(sizeof(long) == 8,
               "sys.h passes 64-bit offsets and the kernel's stat as glibc's: 64-bit Linux");

static inline ssize_t dps_sys_write(int fd, const void *buf, size_t n)
{
    return syscall(SYS_write, fd, buf, n);
}
static inline ssize_t dps_sys_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    return syscall(SYS_pwrite64, fd, buf, n, off);
}
static inline ssize_t dps_sys_writev(int fd, const struct iovec *iov, int n)
{
    return syscall(SYS_writev, fd, iov, n);
}
static inline ssize_t dps_sys_pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
    return syscall(SYS_pwritev, fd, iov, n, (unsigned long)off, (unsigned long)((uint64_t)off >> 32));
}
static inline int dps_sys_open(const char *path, int flags, mode_t mode)
{
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}
static inline ssize_t dps_sys_read(int fd, void *buf, size_t n)
{
    return syscall(SYS_read, fd, buf, n);
}
static inline int dps_sys_close(int fd)
{
    return (int)syscall(SYS_close, fd);
}
/* through syscall(), which start-up calls anyway, rather than the page of libc getpid is on */
static inline pid_t dps_sys_getpid(void)
{
    return (pid_t)syscall(SYS_getpid);
}
static inline int dps_sys_access(const char *path, int mode)
{
    return (int)syscall(SYS_faccessat, AT_FDCWD, path, mode);
}
static inline int dps_sys_fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
}
static inline int dps_sys_stat(const char *path, struct stat *st)
{
    return dps_sys_fstatat(AT_FDCWD, path, st, 0);
}
static inline int dps_sys_lstat(const char *path, struct stat *st)
{
    return dps_sys_fstatat(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}
static inline int dps_sys_unlink(const char *path)
{
    return (int)syscall(SYS_unlinkat, AT_FDCWD, path, 0);
}
static inline int dps_sys_mkdir(const char *path, mode_t mode)
{
    return (int)syscall(SYS_mkdirat, AT_FDCWD, path, mode);
}

/* stdio, whose real functions the shim reaches through dlsym (core/sys.c): flushing every
 * stream of the program before an _exit (its output kept, the file policy's pairing not asked:
 * the job is ending), and the shim's own streams (diagnostics files, /proc). */
int dps_sys_flush_all(void);
int dps_sys_fflush(FILE *f);
FILE *dps_sys_fopen(const char *path, const char *mode);
int dps_sys_fclose(FILE *f);
int dps_sys_fprintf(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int dps_sys_fputc(int c, FILE *f);

#endif
