/* The stdio half of sys.h: the real functions, found with dlsym(RTLD_NEXT) once, so that the
 * shim's own streams never meet its interposers. Apart from real.c, which ends the process when a
 * symbol is missing through the log, which uses these: libc always has them, and a call that
 * cannot find one fails as the function would. */
#define _GNU_SOURCE
#include "sys.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>

#define SYS_REAL(type, name)                                                                                 \
    static type name##_p;                                                                                    \
    if (!__atomic_load_n(&name##_p, __ATOMIC_RELAXED))                                                       \
    __atomic_store_n(&name##_p, (type)dlsym(RTLD_NEXT, #name), __ATOMIC_RELAXED)

typedef int (*fflush_fn)(FILE *);
typedef FILE *(*fopen_fn)(const char *, const char *);
typedef int (*fclose_fn)(FILE *);
typedef int (*fputc_fn)(int, FILE *);
typedef int (*vfprintf_fn)(FILE *, const char *, va_list);

int dps_sys_flush_all(void)
{
    return dps_sys_fflush(NULL);
}

int dps_sys_fflush(FILE *f)
{
    SYS_REAL(fflush_fn, fflush);
    return fflush_p ? fflush_p(f) : (errno = ENOSYS, EOF);
}

FILE *dps_sys_fopen(const char *path, const char *mode)
{
    SYS_REAL(fopen_fn, fopen);
    return fopen_p ? fopen_p(path, mode) : (errno = ENOSYS, NULL);
}

int dps_sys_fclose(FILE *f)
{
    SYS_REAL(fclose_fn, fclose);
    return fclose_p ? fclose_p(f) : (errno = ENOSYS, EOF);
}

int dps_sys_fputc(int c, FILE *f)
{
    SYS_REAL(fputc_fn, fputc);
    return fputc_p ? fputc_p(c, f) : (errno = ENOSYS, EOF);
}

int dps_sys_fprintf(FILE *f, const char *fmt, ...)
{
    SYS_REAL(vfprintf_fn, vfprintf);
    if (!vfprintf_p) return errno = ENOSYS, -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf_p(f, fmt, ap);
    va_end(ap);
    return n;
}
