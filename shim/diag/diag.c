/* Diagnostics files (see diag.h, format in diag_format.h). Events go to a buffer that grows by
 * doubling up to [diag] trace_mb, so recording one costs a store or two and a long job cannot
 * take the node's memory; events past the cap are counted. Files are written at exit (or when
 * the guard ends the job), with the shim's own calls passing through its interposers untouched. */
#define _GNU_SOURCE
#include "diag.h"
#include "core/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

dps_diag_counters_t dps_diag_count;
DPS_STARTUP_DATA int dps_diag_on;
/* the recorder below was set up once: a later configuration starts it afresh */
DPS_STARTUP_DATA static int recorder_used;

/* Hook names are copied, not pointed to, so that no caller's buffer has to outlive the job. Few
 * names exist (the hook ABI's and one per [hook] section); the last slot stands for any beyond
 * the table. */
#define NAME_MAX_LEN DPS_HOOK_WHERE_MAX
#define NAMES 256

/* Everything below is guarded by `lock`: the main and the progress thread record, and the
 * guard's watchdog may write the files while they do. */
static struct {
    char dir[PATH_MAX]; /* [diag] dir, made absolute at start-up */
    char shown[1024];   /* [diag] dir as the user wrote it, for messages */
    const dps_state_t *s;
    dps_diag_stats_t st; /* the counters; identity and file counts are filled in at writing */
    dps_diag_event_t *ev;
    size_t n, cap, max;         /* max: events [diag] trace_mb holds */
    dps_diag_event_t in_flight; /* the collective the guard found stuck, kept whatever the cap */
    int has_in_flight;
    char names[NAMES][NAME_MAX_LEN];
    uint32_t nnames, last_name;
} diag;

/* Uncontended but for [comm] overlap, and at the end, when the files are written. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Counted in every rank process, diagnostics files or not: the stats file's counters and the exit
 * summary's figures are these. Relaxed atomics: the progress thread counts beside the main
 * thread, and nothing on the collective path takes a lock for them. */
DPS_STARTUP_DATA static struct {
    atomic_uint_fast64_t steps, collectives, bytes, comm_ns, bg_collectives, bg_bytes, bg_comm_ns;
    uint64_t start_ns;
    atomic_uint_fast64_t end_ns; /* when the program left (dps_diag_leaving); 0 while it runs */
} tally;

#define TALLY_ADD(field, v) atomic_fetch_add_explicit(&tally.field, (v), memory_order_relaxed)
#define TALLY_GET(field) atomic_load_explicit(&tally.field, memory_order_relaxed)

/* dps_diag_set_clock's figures, apart from `diag`: a fresh record starts with the same clocks.
 * Guarded by `lock`. */
static struct {
    int measured;
    int64_t offset_ns;
    uint64_t error_ns;
} clock_to_rank0;

uint64_t dps_diag_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* At start-up, and again where a child process takes the rank's place (dps_claim_rank): its
 * figures count from then, and a relative [diag] dir is the one it is in then. Only a rank reads
 * the clock: a process that records nothing pays nothing. */
DPS_STARTUP void dps_diag_configure(const dps_state_t *s)
{
    const char *dir = dps_policy_text(&s->policy, DPS_P_diag_dir);
    int on = dir && *dir && s->role == DPS_ROLE_RANK;
    /* the figures of the stats file and of the job's summary line (two ranks or more) */
    if (s->role == DPS_ROLE_RANK && (on || s->size > 1)) {
        memset(&tally, 0, sizeof tally);
        tally.start_ns = dps_diag_now();
    }
    /* every process passes here: one that records nothing leaves the recorder's pages untouched */
    if (!on && !recorder_used) return;
    recorder_used = 1;
    pthread_mutex_lock(&lock);
    free(diag.ev);
    memset(&diag, 0, sizeof diag);
    diag.s = s;
    diag.max = (size_t)dps_policy_num(&s->policy, DPS_P_diag_trace_mb) * (1u << 20) / sizeof *diag.ev;
    snprintf(diag.shown, sizeof diag.shown, "%s", dir ? dir : "");
    /* A relative dir means the directory the rank started in, not the one the program has
     * moved to by exit. Without a known working directory (removed, too long) it stays relative. */
    char cwd[PATH_MAX];
    if (!on || dir[0] == '/' || !getcwd(cwd, sizeof cwd) ||
        snprintf(diag.dir, sizeof diag.dir, "%s/%s", cwd, dir) >= (int)sizeof diag.dir)
        snprintf(diag.dir, sizeof diag.dir, "%s", dir ? dir : "");
    dps_diag_on = on;
    pthread_mutex_unlock(&lock);
}

/* The index of hook's name, added on first sight. Called with the lock held. */
static uint32_t name_of(const char *hook)
{
    if (!hook) hook = "?";
    if (diag.nnames && !strncmp(diag.names[diag.last_name], hook, NAME_MAX_LEN - 1)) return diag.last_name;
    uint32_t i = 0;
    while (i < diag.nnames && strncmp(diag.names[i], hook, NAME_MAX_LEN - 1))
        i++;
    if (i == diag.nnames && i < NAMES - 1) {
        char *to = diag.names[diag.nnames++];
        snprintf(to, NAME_MAX_LEN, "%s", hook);
        for (char *c = to; *c; c++)
            if (*c == '\n' || *c == '\r') *c = ' '; /* one event, one line */
    } else if (i == diag.nnames) {
        i = NAMES - 1;
        snprintf(diag.names[i], NAME_MAX_LEN, "(a hook past the first %d names)", NAMES - 1);
    }
    return diag.last_name = i;
}

/* Keeps an event while the buffer may grow toward [diag] trace_mb; past that, or when memory
 * runs out, it is counted as dropped. */
static void add(char kind, const char *hook, uint64_t begin_ns, uint64_t end_ns, uint64_t seq, uint64_t step,
                uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    dps_diag_event_t e = {.kind = kind,
                          .hook = name_of(hook),
                          .begin_ns = begin_ns,
                          .end_ns = end_ns,
                          .seq = seq,
                          .step = step,
                          .bytes = bytes};
    if (diag.n == diag.cap && diag.cap < diag.max) {
        size_t cap = diag.cap ? 2 * diag.cap : 4096;
        if (cap > diag.max) cap = diag.max;
        dps_diag_event_t *p = realloc(diag.ev, cap * sizeof *p);
        if (p) diag.ev = p, diag.cap = cap; /* else drop it: diagnostics never break the job */
    }
    if (diag.n < diag.cap)
        diag.ev[diag.n++] = e;
    else
        diag.st.dropped_events++;
    pthread_mutex_unlock(&lock);
}

void dps_diag_collective(const char *hook, uint64_t bytes, uint64_t begin_ns, uint64_t end_ns, uint64_t seq,
                         uint64_t step)
{
    TALLY_ADD(collectives, 1), TALLY_ADD(bytes, bytes), TALLY_ADD(comm_ns, end_ns - begin_ns);
    if (!dps_diag_on) return;
    add(DPS_DIAG_COLLECTIVE, hook, begin_ns, end_ns, seq, step, bytes);
}

void dps_diag_background(const char *hook, uint64_t bytes, uint64_t begin_ns, uint64_t end_ns, uint64_t seq,
                         uint64_t step)
{
    TALLY_ADD(bg_collectives, 1), TALLY_ADD(bg_bytes, bytes), TALLY_ADD(bg_comm_ns, end_ns - begin_ns);
    if (!dps_diag_on) return;
    add(DPS_DIAG_BACKGROUND, hook, begin_ns, end_ns, seq, step, bytes);
}

void dps_diag_step(uint64_t step)
{
    TALLY_ADD(steps, 1);
    if (!dps_diag_on) return;
    uint64_t t = dps_diag_now();
    add(DPS_DIAG_STEP, "dp_step_end", t, t, 0, step, 0);
}

void dps_diag_leaving(void)
{
    uint64_t none = 0;
    atomic_compare_exchange_strong(&tally.end_ns, &none, dps_diag_now());
}

/* The end of the rank's wall time: when the program left, else now. */
static uint64_t end_ns(void)
{
    uint64_t end = atomic_load(&tally.end_ns);
    return end ? end : dps_diag_now();
}

void dps_diag_tally(dps_diag_tally_t *out)
{
    *out = (dps_diag_tally_t){.steps = TALLY_GET(steps),
                              .collectives = TALLY_GET(collectives),
                              .bytes = TALLY_GET(bytes) + TALLY_GET(bg_bytes),
                              .comm_ns = TALLY_GET(comm_ns),
                              .wall_ns = end_ns() - tally.start_ns};
}

const char *dps_diag_dir(void)
{
    return dps_diag_on ? diag.dir : NULL;
}

void dps_diag_set_clock(int64_t offset_ns, uint64_t error_ns)
{
    pthread_mutex_lock(&lock);
    clock_to_rank0.measured = 1;
    clock_to_rank0.offset_ns = offset_ns, clock_to_rank0.error_ns = error_ns;
    pthread_mutex_unlock(&lock);
}

/* --- writing --- */

/* One file being written, and what went wrong with it. */
typedef struct out {
    char path[PATH_MAX + 64]; /* in the absolute [diag] dir */
    char shown[1100];         /* the same in [diag] dir as written, for messages */
    char refused[96];         /* why what stands at path is left alone, "" when it is not */
    FILE *f;
    int err; /* errno of the first failure, 0 while none */
} out_t;

/* [diag] dir may be shared with other users (a scratch directory): what stands at a file's name
 * is replaced only when it is a regular file of this user's own, and never written through. It
 * is removed, and the file created anew with O_EXCL | O_NOFOLLOW, so neither a symbolic link
 * (one planted after the check makes the creation fail) nor a hard link to another file is
 * followed. A symbolic link, another user's file, or anything but a regular file is left alone
 * with a warning naming it. */
static void check_out(out_t *o, const char *file_fmt)
{
    char name[64];
    snprintf(name, sizeof name, file_fmt, diag.s->rank);
    snprintf(o->path, sizeof o->path, "%s/%s", diag.dir, name);
    snprintf(o->shown, sizeof o->shown, "%s/%s", diag.shown, name);
    struct stat st;
    if (dps_sys_lstat(o->path, &st) != 0) return; /* nothing there, or what creating it will say */
    if (S_ISLNK(st.st_mode))
        snprintf(o->refused, sizeof o->refused, "is a symbolic link");
    else if (!S_ISREG(st.st_mode))
        snprintf(o->refused, sizeof o->refused, "is not a regular file");
    else if (st.st_uid != geteuid())
        snprintf(o->refused, sizeof o->refused, "belongs to user %u, not to this user (%u)",
                 (unsigned)st.st_uid, (unsigned)geteuid());
}

static void open_out(out_t *o)
{
    if (dps_sys_unlink(o->path) != 0 && errno != ENOENT) {
        o->err = errno;
        return;
    }
    int fd = dps_sys_open(o->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    o->f = fd < 0 ? NULL : fdopen(fd, "w");
    o->err = o->f ? 0 : errno;
    if (fd >= 0 && !o->f) dps_sys_close(fd);
}

/* Closes o's file whatever happened to the other one: closing is what flushes it. */
static void close_out(out_t *o)
{
    if (!o->f) return;
    if (ferror(o->f) && !o->err) o->err = errno ? errno : EIO;
    if (dps_sys_fclose(o->f) != 0 && !o->err) o->err = errno;
    o->f = NULL;
}

/* The stats: the counters, who this rank is, and the file policy's effects. Lock held. */
static void write_stats(FILE *f)
{
    dps_diag_stats_t st = diag.st;
    st.start_ns = tally.start_ns, st.steps = TALLY_GET(steps);
    st.collectives = TALLY_GET(collectives), st.bytes = TALLY_GET(bytes), st.comm_ns = TALLY_GET(comm_ns);
    st.bg_collectives = TALLY_GET(bg_collectives), st.bg_bytes = TALLY_GET(bg_bytes);
    st.bg_comm_ns = TALLY_GET(bg_comm_ns);
    st.rank = (uint64_t)diag.s->rank;
    st.size = (uint64_t)diag.s->size;
    st.local_rank = (uint64_t)diag.s->local_rank;
    gethostname(st.host, sizeof st.host - 1);
    snprintf(st.launcher, sizeof st.launcher, "%s", diag.s->launcher ? diag.s->launcher : "");
    st.end_ns = end_ns();
    st.clock_measured = (uint64_t)clock_to_rank0.measured;
    st.clock_offset_ns = clock_to_rank0.offset_ns, st.clock_error_ns = clock_to_rank0.error_ns;
    st.gated_sinks = atomic_load(&dps_diag_count.sinks), st.gated_noops = atomic_load(&dps_diag_count.noops);
    st.followed = atomic_load(&dps_diag_count.followed);
    st.rank_paths = atomic_load(&dps_diag_count.rank_paths);
    dps_sys_fprintf(f, DPS_DIAG_STATS_MAGIC " %d\n", DPS_DIAG_FORMAT_VERSION);
#define NUM(key) dps_sys_fprintf(f, #key " %llu\n", (unsigned long long)st.key);
#define SNUM(key) dps_sys_fprintf(f, #key " %lld\n", (long long)st.key);
#define TEXT(key, len)                                                                                       \
    if (st.key[0]) dps_sys_fprintf(f, #key " %s\n", st.key);
    DPS_DIAG_STATS(NUM, SNUM, TEXT)
#undef NUM
#undef SNUM
#undef TEXT
}

static void write_event(FILE *f, const dps_diag_event_t *e)
{
    dps_sys_fputc(e->kind, f);
#define FIELD(field) dps_sys_fprintf(f, " %llu", (unsigned long long)e->field);
    DPS_DIAG_TRACE_FIELDS(FIELD)
#undef FIELD
    dps_sys_fprintf(f, " %s\n", diag.names[e->hook]);
}

/* The trace: every event kept, then the one the guard found in flight. Lock held. */
static void write_trace(FILE *f)
{
    dps_sys_fprintf(f, DPS_DIAG_TRACE_MAGIC " %d\n" DPS_DIAG_TRACE_COLUMNS "\n", DPS_DIAG_FORMAT_VERSION);
    for (size_t i = 0; i < diag.n; i++)
        write_event(f, &diag.ev[i]);
    if (diag.has_in_flight) write_event(f, &diag.in_flight);
}

/* Adds "writing PATH failed (why)" to warn when o failed. */
static void note_failure(const out_t *o, char *warn, size_t len)
{
    size_t n = strlen(warn);
    if (o->err && n < len)
        snprintf(warn + n, len - n, "%swriting %s failed (%s)", n ? "; " : "", o->shown, strerror(o->err));
}

/* Adds "PATH is a symbolic link" to warn when o's name is taken. */
static void note_refusal(const out_t *o, char *warn, size_t len)
{
    size_t n = strlen(warn);
    if (o->refused[0] && n < len) snprintf(warn + n, len - n, "%s%s %s", n ? "; " : "", o->shown, o->refused);
}

/* Both files, under the lock so that no thread grows the buffer being read. Nothing here may
 * record or log: a warning is left in `warn` for the caller to print once the lock is free. */
static void write_files(char *warn, size_t len)
{
    out_t st = {0}, tr = {0};
    pthread_mutex_lock(&lock);
    if (dps_sys_mkdir(diag.dir, 0755) != 0 && errno != EEXIST) {
        snprintf(warn, len, "cannot create it (%s); no diagnostics written", strerror(errno));
        goto done;
    }
    check_out(&st, DPS_DIAG_STATS_FILE);
    check_out(&tr, DPS_DIAG_TRACE_FILE);
    if (st.refused[0] || tr.refused[0]) {
        note_refusal(&st, warn, len);
        note_refusal(&tr, warn, len);
        size_t n = strlen(warn);
        snprintf(warn + n, len - n,
                 "; dpshim replaces only regular files of this user's own there (remove what is "
                 "in the way, or choose a [diag] dir of your own); no diagnostics written");
        goto done;
    }
    open_out(&st);
    open_out(&tr);
    errno = 0; /* what close_out finds is a write's */
    if (st.f && tr.f)
        write_stats(st.f), write_trace(tr.f);
    else
        snprintf(warn, len, "cannot write %s (%s); no diagnostics written", st.f ? tr.shown : st.shown,
                 strerror(st.f ? tr.err : st.err));
done:
    close_out(&st);
    close_out(&tr);
    pthread_mutex_unlock(&lock);
    if (warn[0]) return;
    note_failure(&st, warn, len);
    note_failure(&tr, warn, len);
}

void dps_diag_write(void)
{
    if (!dps_diag_on || atomic_load(&dps_g.forked)) return;
    int saved = errno;
    dps_in_shim++;
    char warn[3000] = "";
    write_files(warn, sizeof warn);
    if (warn[0]) DPS_WARN("[diag] dir = %s: %s", diag.shown, warn);
    dps_in_shim--;
    errno = saved;
}

void dps_diag_nothing_shared(const char *head, const char *why)
{
    if (!dps_diag_on) return;
    pthread_mutex_lock(&lock);
    snprintf(diag.st.nothing_shared, sizeof diag.st.nothing_shared, "%s. %s", head, why);
    pthread_mutex_unlock(&lock);
}

void dps_diag_lost(const char *what)
{
    if (!dps_diag_on) return;
    pthread_mutex_lock(&lock);
    size_t used = strlen(diag.st.lost);
    snprintf(diag.st.lost + used, sizeof diag.st.lost - used, "%s%s", used ? "; " : "", what);
    pthread_mutex_unlock(&lock);
}

void dps_diag_fail(const char *why, const char *hook, uint64_t in_flight_seq, uint64_t ago_ns, uint64_t step)
{
    if (!dps_diag_on) return;
    uint64_t now = dps_diag_now();
    pthread_mutex_lock(&lock);
    snprintf(diag.st.failure, sizeof diag.st.failure, "%s", why);
    if (in_flight_seq) {
        diag.in_flight = (dps_diag_event_t){.kind = DPS_DIAG_COLLECTIVE,
                                            .hook = name_of(hook),
                                            .begin_ns = now - ago_ns,
                                            .end_ns = now,
                                            .seq = in_flight_seq,
                                            .step = step};
        diag.has_in_flight = 1;
        TALLY_ADD(collectives, 1), TALLY_ADD(comm_ns, ago_ns); /* the stats count it as the trace shows it */
    }
    pthread_mutex_unlock(&lock);
    dps_diag_write();
}
