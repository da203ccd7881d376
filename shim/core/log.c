/* dpshim's own messages: "[dpshim r1/4] WARN ...", formatted on the stack and written with the
 * write system call (sys.h), so logging never goes through stdio, malloc or the shim's interposers. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dps.h"
#include "sys.h"

DPS_STARTUP_DATA atomic_int dps_log_level = DPS_LOG_WARN;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

static void vlog(const char *label, const char *fmt, va_list ap)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "[dpshim r%d/%d] %s ", dps_g.rank, dps_g.size, label);
    if (n < 0) return;
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    for (size_t off = 0; off < len;) {
        ssize_t w = dps_sys_write(STDERR_FILENO, buf + off, len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
}

void dps_log(dps_log_level_t lvl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level_names[lvl], fmt, ap);
    va_end(ap);
}

void dps_note(const char *label, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(label, fmt, ap);
    va_end(ap);
}

void (*volatile dps_before_fatal_exit)(void);

void dps_run_before_fatal_exit(void)
{
    /* once, even when it fails on the way, or when the watchdog and the program's thread end the
     * job at the same time (a race ThreadSanitizer found) */
    void (*fn)(void) = __atomic_exchange_n(&dps_before_fatal_exit, NULL, __ATOMIC_ACQ_REL);
    if (fn) fn();
}

_Noreturn void dps_fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level_names[DPS_LOG_ERROR], fmt, ap);
    va_end(ap);
    /* _exit: finalizing MPI or PMIx now could wait on ranks that will never come; the
     * launcher sees the non-zero status and ends the job. The program's output is kept. */
    dps_run_before_fatal_exit();
    dps_exit_now(DPS_EXIT_FATAL);
}
