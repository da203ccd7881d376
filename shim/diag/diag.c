/* Diagnostics files (see diag.h). Events go to a buffer that grows by doubling, so recording
 * one costs a store or two; files are written once, at exit, with the shim's own calls passing
 * through its interposers untouched. */
#define _GNU_SOURCE
#include "diag.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


dps_diag_counters_t dps_diag_count;
int dps_diag_on;

typedef struct event {
    char kind; /* 'c' collective, 'b' background collective, 's' step end */
    const char *hook;
    uint64_t begin_ns, end_ns, seq, step, bytes;
} event_t;

static struct {
    char dir[1024];
    const dps_state_t *s;
    event_t *ev;
    size_t n, cap;
    uint64_t start_ns, collectives, bytes, comm_ns, steps;
    uint64_t bg_collectives, bg_bytes, bg_comm_ns;
    char failure[256];
} diag;

uint64_t dps_diag_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void dps_diag_configure(const dps_state_t *s)
{
    const char *dir = dps_policy_text(&s->policy, DPS_P_diag_dir);
    diag.s = s;
    dps_diag_on = dir && *dir && s->role == DPS_ROLE_RANK;
    snprintf(diag.dir, sizeof diag.dir, "%s", dir ? dir : "");
    diag.start_ns = dps_diag_now();
}

/* The main and the progress thread both record; the lock is uncontended but for overlaps. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void add(event_t e)
{
    pthread_mutex_lock(&lock);
    if (e.kind == 'c') diag.collectives++, diag.bytes += e.bytes, diag.comm_ns += e.end_ns - e.begin_ns;
    if (e.kind == 'b') diag.bg_collectives++, diag.bg_bytes += e.bytes, diag.bg_comm_ns += e.end_ns - e.begin_ns;
    if (diag.n == diag.cap) {
        size_t cap = diag.cap ? 2 * diag.cap : 4096;
        event_t *p = realloc(diag.ev, cap * sizeof *p);
        if (!p) goto out; /* diagnostics never break the job: drop the event */
        diag.ev = p, diag.cap = cap;
    }
    diag.ev[diag.n++] = e;
out:
    pthread_mutex_unlock(&lock);
}

void dps_diag_collective(const char *hook, uint64_t bytes, uint64_t begin_ns, uint64_t end_ns,
                         uint64_t seq, uint64_t step)
{
    if (!dps_diag_on) return;
    add((event_t){'c', hook, begin_ns, end_ns, seq, step, bytes});
}

void dps_diag_background(const char *hook, uint64_t bytes, uint64_t begin_ns, uint64_t end_ns,
                         uint64_t seq, uint64_t step)
{
    if (!dps_diag_on) return;
    add((event_t){'b', hook, begin_ns, end_ns, seq, step, bytes});
}

void dps_diag_step(uint64_t step)
{
    if (!dps_diag_on) return;
    diag.steps++;
    uint64_t t = dps_diag_now();
    add((event_t){'s', "dp_step_end", t, t, 0, step, 0});
}

static FILE *open_out(const char *what)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.rank%diag.txt", diag.dir, what, diag.s->rank);
    return fopen(path, "w");
}

void dps_diag_write(void)
{
    if (!dps_diag_on || atomic_load(&dps_g.forked)) return;
    int saved = errno;
    dps_in_shim++;
    if (mkdir(diag.dir, 0755) != 0 && errno != EEXIST) {
        DPS_WARN("[diag] dir = %s: cannot create it (%s); no diagnostics written", diag.dir, strerror(errno));
        goto out;
    }
    FILE *st = open_out("stats"), *tr = open_out("trace");
    if (!st || !tr) {
        DPS_WARN("[diag] dir = %s: cannot write there (%s); no diagnostics written", diag.dir, strerror(errno));
        if (st) fclose(st);
        if (tr) fclose(tr);
        goto out;
    }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    fprintf(st, "dpshim-stats %d\nrank %d\nsize %d\nlocal_rank %d\nhost %s\nlauncher %s\n"
                "start_ns %llu\nend_ns %llu\nsteps %llu\ncollectives %llu\nbytes %llu\ncomm_ns %llu\n"
                "bg_collectives %llu\nbg_bytes %llu\nbg_comm_ns %llu\n"
                "gated_sinks %llu\ngated_noops %llu\npublished %llu\nrank_paths %llu\n",
            DPS_DIAG_FORMAT_VERSION, diag.s->rank, diag.s->size, diag.s->local_rank, host, diag.s->launcher,
            (unsigned long long)diag.start_ns, (unsigned long long)dps_diag_now(), (unsigned long long)diag.steps,
            (unsigned long long)diag.collectives, (unsigned long long)diag.bytes, (unsigned long long)diag.comm_ns,
            (unsigned long long)diag.bg_collectives, (unsigned long long)diag.bg_bytes, (unsigned long long)diag.bg_comm_ns,
            (unsigned long long)atomic_load(&dps_diag_count.sinks), (unsigned long long)atomic_load(&dps_diag_count.noops),
            (unsigned long long)atomic_load(&dps_diag_count.published),
            (unsigned long long)atomic_load(&dps_diag_count.rank_paths));
    if (diag.failure[0]) fprintf(st, "failure %s\n", diag.failure);
    fprintf(tr, "dpshim-trace %d\n# kind begin_ns end_ns seq step bytes hook\n", DPS_DIAG_FORMAT_VERSION);
    for (size_t i = 0; i < diag.n; i++)
        fprintf(tr, "%c %llu %llu %llu %llu %llu %s\n", diag.ev[i].kind, (unsigned long long)diag.ev[i].begin_ns,
                (unsigned long long)diag.ev[i].end_ns, (unsigned long long)diag.ev[i].seq,
                (unsigned long long)diag.ev[i].step, (unsigned long long)diag.ev[i].bytes, diag.ev[i].hook);
    if (fclose(st) != 0 || fclose(tr) != 0)
        DPS_WARN("[diag] dir = %s: writing the diagnostics failed (%s)", diag.dir, strerror(errno));
out:
    dps_in_shim--;
    errno = saved;
}

void dps_diag_fail(const char *why, const char *hook, uint64_t in_flight_seq, uint64_t ago_ns, uint64_t step)
{
    if (!dps_diag_on) return;
    snprintf(diag.failure, sizeof diag.failure, "%s", why);
    uint64_t now = dps_diag_now();
    if (in_flight_seq) add((event_t){'c', hook, now - ago_ns, now, in_flight_seq, step, 0});
    dps_diag_write();
}
