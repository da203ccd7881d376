/* stdio file entry points under the file policy: fopen, freopen (and their 64-bit names) are
 * decided like open with the flags their mode string means; fclose, fflush and the calls that
 * write (fwrite, fputs, fprintf, vfprintf, fputc, putc and the names compilers emit for them) on
 * gated streams return rank 0's outcome. glibc's stdio calls its own open and write internally,
 * so these need wrappers. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/dps.h"
#include "core/real.h"
#include "files/files.h"
#include "files_channel.h"
#include "output/output.h"

/* The open(2) flags that an fopen mode string stands for. */
static int mode_flags(const char *mode)
{
    int plus = strchr(mode, '+') != NULL, f;
    switch (mode[0]) {
    case 'w':
        f = O_CREAT | O_TRUNC | (plus ? O_RDWR : O_WRONLY);
        break;
    case 'a':
        f = O_CREAT | O_APPEND | (plus ? O_RDWR : O_WRONLY);
        break;
    default:
        f = plus ? O_RDWR : O_RDONLY;
        break;
    }
    return f | (strchr(mode, 'x') ? O_EXCL : 0);
}

/* The mode that reopens a follower's sink: the same, less 'x' (the sink exists). */
static const char *sink_mode(const char *mode, char *buf, size_t len)
{
    size_t n = 0;
    for (const char *m = mode; *m && n + 1 < len; m++)
        if (*m != 'x') buf[n++] = *m;
    buf[n] = '\0';
    return buf;
}

DPS_REAL_DECLARE(int, fclose, (FILE *));

/* FAILED: what the call does when rank 0's failed (freopen closes the stream it was given). */
#define FOPEN_BODY(path_, mode_, CALL, FAILED)                                                               \
    do {                                                                                                     \
        if (DPS_LIKELY(!atomic_load_explicit(&dps_files_on, memory_order_relaxed)) || dps_in_shim || !mode_) \
            return CALL(path_, mode_);                                                                       \
        int saved_ = errno;                                                                                  \
        dps_redirect_t r_;                                                                                   \
        char m_[16];                                                                                         \
        dps_in_shim++;                                                                                       \
        dps_files_open(&r_, AT_FDCWD, path_, mode_flags(mode_));                                             \
        dps_in_shim--;                                                                                       \
        errno = saved_;                                                                                      \
        if (r_.action != DPS_FILE_PASS) dps_files_start_channel();                                           \
        if (r_.action == DPS_FILE_FOLLOW && !dps_files_follow(&r_)) {                                        \
            FAILED;                                                                                          \
            errno = r_.err0;                                                                                 \
            return NULL;                                                                                     \
        }                                                                                                    \
        FILE *f_ = CALL(r_.path, r_.sink >= 0 ? sink_mode(mode_, m_, sizeof m_) : mode_);                    \
        if (dps_files_done(&r_, f_ != NULL)) {                                                               \
            if (f_) dps_files_opened(&r_, fileno(f_));                                                       \
            return f_;                                                                                       \
        }                                                                                                    \
        DPS_REAL(fclose)(f_); /* freopen's stream is closed on failure too */                                \
        errno = r_.err0;                                                                                     \
        return NULL;                                                                                         \
    } while (0)

DPS_REAL_DECLARE(FILE *, fopen, (const char *, const char *));
DPS_REAL_DECLARE(FILE *, fopen64, (const char *, const char *));
DPS_REAL_DECLARE(FILE *, freopen, (const char *, const char *, FILE *));
DPS_REAL_DECLARE(FILE *, freopen64, (const char *, const char *, FILE *));
DPS_EXPORT FILE *fopen(const char *path, const char *mode)
{
#define CALL(p, m) DPS_REAL(fopen)(p, m)
    FOPEN_BODY(path, mode, CALL, (void)0);
#undef CALL
}

DPS_EXPORT FILE *fopen64(const char *path, const char *mode)
{
#define CALL(p, m) DPS_REAL(fopen64)(p, m)
    FOPEN_BODY(path, mode, CALL, (void)0);
#undef CALL
}

DPS_EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream)
{
#define CALL(p, m) DPS_REAL(freopen)(p, m, stream)
    FOPEN_BODY(path, mode, CALL, DPS_REAL(fclose)(stream));
#undef CALL
}

DPS_EXPORT FILE *freopen64(const char *path, const char *mode, FILE *stream)
{
#define CALL(p, m) DPS_REAL(freopen64)(p, m, stream)
    FOPEN_BODY(path, mode, CALL, DPS_REAL(fclose)(stream));
#undef CALL
}

/* Closing and flushing a gated stream: rank 0's outcome on every rank, as close(2) (handles.c);
 * glibc closes and writes the stream's descriptor internally, so these need wrappers too. */
DPS_REAL_DECLARE(int, fflush, (FILE *));

#define STREAM_BODY(f_, op_, CALL)                                                                           \
    do {                                                                                                     \
        dps_fdcall_t c_;                                                                                     \
        FILE *const given_ = (f_); /* a copy: glibc 2.41 declares fclose's nonnull */                        \
        if (DPS_LIKELY(!atomic_load_explicit(&dps_files_handles, memory_order_relaxed)) || dps_in_shim ||    \
            !given_ || !dps_files_fd_begin(&c_, fileno(f_), DPS_FOP_##op_))                                  \
            return CALL;                                                                                     \
        if (!c_.sink && DPS_FOP_##op_ == DPS_FOP_CLOSE) {                                                    \
            /* stdio wrote the stream through glibc's own write: what it left */                             \
            off_t at_ = ftello(f_);                                                                          \
            if (at_ > c_.end) c_.end = at_;                                                                  \
            if (!c_.err && ferror(f_)) c_.err = EIO; /* for the check at exit */                             \
        }                                                                                                    \
        int rc_ = CALL;                                                                                      \
        return dps_files_fd_end(&c_, rc_ == 0 ? 0 : -1, errno) == 0 ? 0 : EOF;                               \
    } while (0)

DPS_EXPORT int fclose(FILE *f)
{
    STREAM_BODY(f, CLOSE, DPS_REAL(fclose)(f));
}
DPS_EXPORT int fflush(FILE *f)
{
    STREAM_BODY(f, FLUSH, DPS_REAL(fflush)(f));
}

/* Writes to a gated stream, paired by call (files.h): rank 0's outcome of each is told to the
 * others; another rank's call returns what rank 0's returned where that failed, with rank 0's
 * errno and the stream's error indicator set, and is made for real otherwise. T is the call's
 * result type, CALL the real call, OK whether a result r_ is a success. A write to stderr first
 * lets output.c make a wrapper's stderr line buffered. */
#define STREAM_WRITE_BODY(f_, T, CALL, OK)                                                                   \
    do {                                                                                                     \
        if (DPS_UNLIKELY((f_) == stderr)) dps_output_wrapper_stderr();                                       \
        if (DPS_LIKELY(!atomic_load_explicit(&dps_files_handles, memory_order_relaxed)) || dps_in_shim)      \
            return CALL;                                                                                     \
        uint64_t id_, k_;                                                                                    \
        char path_[DPS_PATH_BUF];                                                                            \
        int kind_ = dps_files_stream_call(fileno(f_), &id_, &k_, path_);                                     \
        if (kind_ == DPS_HANDLE_STANDIN) {                                                                   \
            int64_t ret_;                                                                                    \
            int err_;                                                                                        \
            if (!dps_files_rank0_stream_call(id_, k_, path_, &ret_, &err_)) return CALL;                     \
            (f_)->_flags |= _IO_ERR_SEEN;                                                                    \
            errno = err_;                                                                                    \
            return (T)ret_;                                                                                  \
        }                                                                                                    \
        T r_ = CALL;                                                                                         \
        if (kind_ == DPS_HANDLE_RANK0) {                                                                     \
            int err_ = errno;                                                                                \
            dps_files_post_stream_call(id_, k_, (int64_t)r_, !(OK), err_);                                   \
            errno = err_;                                                                                    \
        }                                                                                                    \
        return r_;                                                                                           \
    } while (0)

#undef fwrite_unlocked /* an inline macro of glibc's where optimizing: the function is what is interposed */
#undef fputs_unlocked
DPS_REAL_DECLARE(size_t, fwrite, (const void *, size_t, size_t, FILE *));
DPS_REAL_DECLARE(size_t, fwrite_unlocked, (const void *, size_t, size_t, FILE *));
DPS_REAL_DECLARE(int, fputs, (const char *, FILE *));
DPS_REAL_DECLARE(int, fputs_unlocked, (const char *, FILE *));

DPS_EXPORT size_t fwrite(const void *p, size_t size, size_t n, FILE *f)
{
    STREAM_WRITE_BODY(f, size_t, DPS_REAL(fwrite)(p, size, n, f), r_ == n || !size);
}
DPS_EXPORT size_t fwrite_unlocked(const void *p, size_t size, size_t n, FILE *f)
{
    STREAM_WRITE_BODY(f, size_t, DPS_REAL(fwrite_unlocked)(p, size, n, f), r_ == n || !size);
}
DPS_EXPORT int fputs(const char *s, FILE *f)
{
    STREAM_WRITE_BODY(f, int, DPS_REAL(fputs)(s, f), r_ != EOF);
}
DPS_EXPORT int fputs_unlocked(const char *s, FILE *f)
{
    STREAM_WRITE_BODY(f, int, DPS_REAL(fputs_unlocked)(s, f), r_ != EOF);
}

/* The names a compiler emits for formatted and character output (gcc 12 on glibc 2.36): fprintf
 * and vfprintf, or __fprintf_chk and __vfprintf_chk under _FORTIFY_SOURCE; fputc and putc at any
 * level (and fprintf with a lone "%c" or one character becomes fputc); fputc_unlocked and
 * putc_unlocked where not optimizing; _IO_putc from binaries built against glibc before 2.28,
 * whose putc was a macro for it. Optimized, fputc_unlocked and putc_unlocked are inline stores
 * into the buffer that call __overflow when it is full: that is not paired, as its calls follow
 * the buffer's size (the file system's block size, which a stand-in need not share), not the
 * program's calls; such a stream's failure shows at its fflush or fclose, which are paired. */
#undef fputc_unlocked
#undef putc_unlocked
DPS_REAL_DECLARE(int, vfprintf, (FILE *, const char *, va_list));
DPS_REAL_DECLARE(int, __vfprintf_chk, (FILE *, int, const char *, va_list));
DPS_REAL_DECLARE(int, fputc, (int, FILE *));
DPS_REAL_DECLARE(int, putc, (int, FILE *));
DPS_REAL_DECLARE(int, _IO_putc, (int, FILE *));
DPS_REAL_DECLARE(int, fputc_unlocked, (int, FILE *));
DPS_REAL_DECLARE(int, putc_unlocked, (int, FILE *));

/* Before main: a first fprintf or fputs may print a dlerror() string (real.h, dps_real_resolve). */
__attribute__((constructor)) DPS_STARTUP static void resolve_stream_writes(void)
{
    const dps_real_now_t now[] = {DPS_REAL_NOW(fwrite),       DPS_REAL_NOW(fwrite_unlocked),
                                  DPS_REAL_NOW(fputs),        DPS_REAL_NOW(fputs_unlocked),
                                  DPS_REAL_NOW(vfprintf),     DPS_REAL_NOW(__vfprintf_chk),
                                  DPS_REAL_NOW(fputc),        DPS_REAL_NOW(putc),
                                  DPS_REAL_NOW(_IO_putc),     DPS_REAL_NOW(fputc_unlocked),
                                  DPS_REAL_NOW(putc_unlocked)};
    dps_real_resolve(now, sizeof now / sizeof *now);
}

static int paired_vfprintf(FILE *f, const char *fmt, va_list ap)
{
    STREAM_WRITE_BODY(f, int, DPS_REAL(vfprintf)(f, fmt, ap), r_ >= 0);
}
static int paired_vfprintf_chk(FILE *f, int flag, const char *fmt, va_list ap)
{
    STREAM_WRITE_BODY(f, int, DPS_REAL(__vfprintf_chk)(f, flag, fmt, ap), r_ >= 0);
}

DPS_EXPORT int vfprintf(FILE *f, const char *fmt, va_list ap)
{
    return paired_vfprintf(f, fmt, ap);
}
DPS_EXPORT int __vfprintf_chk(FILE *f, int flag, const char *fmt, va_list ap)
{
    return paired_vfprintf_chk(f, flag, fmt, ap);
}
DPS_EXPORT int fprintf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = paired_vfprintf(f, fmt, ap);
    va_end(ap);
    return r;
}
DPS_EXPORT int __fprintf_chk(FILE *f, int flag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = paired_vfprintf_chk(f, flag, fmt, ap);
    va_end(ap);
    return r;
}

#define PUTC_WRAPPER(name)                                                                                   \
    DPS_EXPORT int name(int c, FILE *f)                                                                      \
    {                                                                                                        \
        STREAM_WRITE_BODY(f, int, DPS_REAL(name)(c, f), r_ != EOF);                                          \
    }
PUTC_WRAPPER(fputc)
PUTC_WRAPPER(putc)
PUTC_WRAPPER(_IO_putc)
PUTC_WRAPPER(fputc_unlocked)
PUTC_WRAPPER(putc_unlocked)
