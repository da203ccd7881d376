/* The guard's crash report: a crashing rank says where it was, then dies as the signal wants. The
 * handler may interrupt malloc or stdio inside their locks, so it and all it calls live here and
 * are async-signal-safe (tests/checks/signal_safe.sh checks this file's object). */
#define _GNU_SOURCE
#include "guard_internal.h"
#include "core/sys.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

/* The signals reported, with the names strsignal gives them (which the handler cannot call). */
static const struct {
    int sig;
    const char *name;
} crash_signals[] = {
    {SIGSEGV, "Segmentation fault"}, {SIGBUS, "Bus error"}, {SIGFPE, "Floating point exception"},
    {SIGILL, "Illegal instruction"}, {SIGABRT, "Aborted"},
};
enum { NCRASH_SIGNALS = sizeof crash_signals / sizeof *crash_signals };

/* The program's own action for each (SIG_DFL: handlers are installed only there). */
static struct sigaction old_actions[NCRASH_SIGNALS];

/* The message, built by hand in a stack buffer: snprintf may allocate or take locks. */
typedef struct crash_text {
    char buf[512];
    size_t len;
} crash_text_t;

static void put_str(crash_text_t *t, const char *s)
{
    while (s && *s && t->len < sizeof t->buf)
        t->buf[t->len++] = *s++;
}

static void put_u64(crash_text_t *t, uint64_t v)
{
    char digits[20];
    int n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0 && t->len < sizeof t->buf)
        t->buf[t->len++] = digits[--n];
}

static void put_int(crash_text_t *t, int v)
{
    if (v < 0) put_str(t, "-");
    put_u64(t, v < 0 ? -(uint64_t)v : (uint64_t)v);
}

static void on_crash(int sig)
{
    const dps_guard_pos_t *pos = &dps_guard_pos;
    int which = 0;
    while (which < NCRASH_SIGNALS - 1 && crash_signals[which].sig != sig)
        which++;
    int rank = dps_guard_conf.rank;
    crash_text_t t = {.len = 0};
    put_str(&t, "[dpshim r"), put_int(&t, rank), put_str(&t, "/"), put_int(&t, dps_guard_conf.size);
    put_str(&t, "] ERROR guard: rank "), put_int(&t, rank);
    put_str(&t, " crashed with signal "), put_int(&t, sig);
    put_str(&t, " ("), put_str(&t, crash_signals[which].sig == sig ? crash_signals[which].name : "?");
    put_str(&t, ") after step "), put_u64(&t, atomic_load(&pos->step));
    put_str(&t, atomic_load(&pos->in_coll) ? ", inside " : ", after "), put_str(&t, atomic_load(&pos->hook));
    put_str(&t, " collective #"), put_u64(&t, atomic_load(&pos->seq));
    put_str(&t, "; the launcher ends the job\n");
    if (t.len == sizeof t.buf) t.buf[t.len - 1] = '\n';
    for (size_t off = 0; off < t.len;) {
        ssize_t n = dps_sys_write(STDERR_FILENO, t.buf + off, t.len - off);
        if (n <= 0) break;
        off += (size_t)n;
    }
    if (crash_signals[which].sig == sig)
        sigaction(sig, &old_actions[which], NULL); /* the program's own handler, or the default */
    raise(sig);
}

void dps_guard_install_crash_handlers(void)
{
    for (int i = 0; i < NCRASH_SIGNALS; i++) {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_crash;
        sa.sa_flags = SA_RESETHAND | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        /* leave signals the program (or its runtime) already handles alone */
        if (sigaction(crash_signals[i].sig, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
            sigaction(crash_signals[i].sig, &sa, &old_actions[i]);
    }
}
