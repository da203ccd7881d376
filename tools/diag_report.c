/* dpshim-diag report: reads the per-rank files of [diag] dir (the format of shim/diag/diag_format.h,
 * which the shim writes with the same tables) and merges them: a table of where each rank's time
 * went, who kept the others waiting, and what looks wrong; optionally one Chrome/Perfetto trace
 * of all ranks and an SVG picture of the timeline. */
#define _GNU_SOURCE
#include "diag_report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag_format.h"

typedef dps_diag_event_t ev_t;

typedef struct rank_data {
    int present; /* its stats file was there */
    dps_diag_stats_t st;
    ev_t *ev;
    size_t n;
    double wait_s; /* inside collectives, waiting for the last rank to arrive */
    uint64_t last; /* collectives this rank arrived at last */
    double late_s; /* how much later than the second-to-last it arrived, summed */
    /* start-up: from the rank's start to where its first step begins (see find_startup); 0 when
     * its trace holds no collective and no step end */
    uint64_t first_step;
    uint64_t startup_comm_ns; /* of that, inside collectives */
} rank_data_t;

/* The ranks of one host: by_host[at .. at + n), in ascending order. */
typedef struct host_group {
    int at, n;
} host_group_t;

/* The files of one job, as read. Hook names are kept once each: events hold their index. */
typedef struct job {
    const char *dir;
    int size, missing; /* missing: ranks without a stats file */
    rank_data_t *rd;
    char **names;
    uint32_t nnames, last_name;
    /* the ranks with files grouped by host, hosts in the order of their first rank (the report's) */
    int *by_host, nhosts;
    host_group_t *hosts;
} job_t;

static void free_job(job_t *j)
{
    for (int r = 0; j->rd && r < j->size; r++)
        free(j->rd[r].ev);
    for (uint32_t i = 0; i < j->nnames; i++)
        free(j->names[i]);
    free(j->rd), free(j->names), free(j->by_host), free(j->hosts);
}

/* --- reading --- */

/* Opens path and checks its first line, MAGIC and the format version. 1 with *f_p open, 0 when
 * there is no such file, -1 with err set when it is not one of ours or of another version. */
static int open_versioned(const char *path, const char *magic, const char *what, FILE **f_p, char *err,
                          size_t errlen)
{
    char line[128];
    int version = -1;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(line, sizeof line, f) || strncmp(line, magic, strlen(magic)) ||
        sscanf(line + strlen(magic), " %d", &version) != 1) {
        snprintf(err, errlen, "%s: not a dpshim %s file of format %d", path, what, DPS_DIAG_FORMAT_VERSION);
        fclose(f);
        return -1;
    }
    if (version != DPS_DIAG_FORMAT_VERSION) {
        snprintf(
            err, errlen,
            "%s: a dpshim %s file of format %d, but this dpshim-diag reads format %d; use the dpshim-diag "
            "built with the shim that wrote it",
            path, what, version, DPS_DIAG_FORMAT_VERSION);
        fclose(f);
        return -1;
    }
    *f_p = f;
    return 1;
}

/* One "key value" line of a stats file into st; keys of other versions are passed over. 0, or -1
 * for a number that does not read as one (a damaged file). */
static int stats_line(char *line, dps_diag_stats_t *st)
{
    line[strcspn(line, "\n")] = '\0';
    char *val = strchr(line, ' '), *end;
    if (!val) return 0;
    *val++ = '\0';
#define NUM(key)                                                                                             \
    if (!strcmp(line, #key)) {                                                                               \
        st->key = strtoull(val, &end, 10);                                                                   \
        return end == val || *end || *val == '-' ? -1 : 0;                                                   \
    }
#define SNUM(key)                                                                                            \
    if (!strcmp(line, #key)) {                                                                               \
        st->key = strtoll(val, &end, 10);                                                                    \
        return end == val || *end ? -1 : 0;                                                                  \
    }
#define TEXT(key, len)                                                                                       \
    if (!strcmp(line, #key)) {                                                                               \
        snprintf(st->key, sizeof st->key, "%s", val);                                                        \
        return 0;                                                                                            \
    }
    DPS_DIAG_STATS(NUM, SNUM, TEXT)
#undef NUM
#undef SNUM
#undef TEXT
    return 0;
}

/* 1 with rank r's stats in *st, 0 without a file, -1 with err set. */
static int read_stats(const char *dir, int r, dps_diag_stats_t *st, char *err, size_t errlen)
{
    char name[64], path[4200], *line = NULL;
    size_t cap = 0;
    FILE *f;
    snprintf(name, sizeof name, DPS_DIAG_STATS_FILE, r);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = open_versioned(path, DPS_DIAG_STATS_MAGIC, "stats", &f, err, errlen);
    if (rc <= 0) return rc;
    memset(st, 0, sizeof *st);
    int lineno = 1, bad = 0; /* the first line is the format's */
    while (!bad && getline(&line, &cap, f) > 0) {
        lineno++;
        if (stats_line(line, st)) {
            line[strcspn(line, " ")] = '\0';
            snprintf(err, errlen, "%s:%d: the value of '%s' is not a number: the file is damaged", path,
                     lineno, line);
            bad = 1;
        }
    }
    free(line);
    fclose(f);
    return bad ? -1 : 1;
}

/* The index of name in the job's table, added on first sight; names repeat on every step, so the
 * last one found is tried first. UINT32_MAX when memory runs out. */
static uint32_t name_index(job_t *j, const char *name)
{
    if (j->nnames && !strcmp(j->names[j->last_name], name)) return j->last_name;
    uint32_t i = 0;
    while (i < j->nnames && strcmp(j->names[i], name))
        i++;
    if (i == j->nnames) {
        char *copy = strdup(name);
        char **p = copy ? realloc(j->names, (j->nnames + 1) * sizeof *p) : NULL;
        if (!p) {
            free(copy);
            return UINT32_MAX;
        }
        j->names = p, j->names[j->nnames++] = copy;
    }
    return j->last_name = i;
}

/* One trace line into *e: the kind, the numbers of DPS_DIAG_TRACE_FIELDS, then the hook, the rest
 * of the line. 0, or -1 for a line that is not an event (the column names, damage). */
static int parse_event(job_t *j, char *line, ev_t *e)
{
    char *p = line + 1, *end;
    line[strcspn(line, "\n")] = '\0';
    if (line[0] == '#' || !line[0] || line[1] != ' ') return -1;
    e->kind = line[0];
#define FIELD(field)                                                                                         \
    e->field = strtoull(p, &end, 10);                                                                        \
    if (end == p || *end != ' ') return -1;                                                                  \
    p = end;
    DPS_DIAG_TRACE_FIELDS(FIELD)
#undef FIELD
    e->hook = name_index(j, p + 1);
    return e->hook == UINT32_MAX ? -1 : 0;
}

/* 1 with rank r's events in j->rd[r], 0 without a file, -1 with err set. */
static int read_trace(job_t *j, int r, char *err, size_t errlen)
{
    char name[64], path[4200], *line = NULL;
    size_t len = 0, cap = 0;
    rank_data_t *d = &j->rd[r];
    FILE *f;
    snprintf(name, sizeof name, DPS_DIAG_TRACE_FILE, r);
    snprintf(path, sizeof path, "%s/%s", j->dir, name);
    int rc = open_versioned(path, DPS_DIAG_TRACE_MAGIC, "trace", &f, err, errlen);
    if (rc <= 0) return rc;
    int lineno = 1, damaged = 0, first_damaged = 0, cut = 0;
    ssize_t got;
    while ((got = getline(&line, &len, f)) > 0) {
        ev_t e;
        lineno++;
        if (line[got - 1] != '\n') { /* the shim ends every line: this one was cut */
            cut = lineno;
            break;
        }
        if (parse_event(j, line, &e)) {
            if (line[0] != '#' && line[0] && !damaged++) first_damaged = lineno;
            continue;
        }
        if (d->n == cap) {
            cap = cap ? 2 * cap : 1024;
            ev_t *p = realloc(d->ev, cap * sizeof *p);
            if (!p) break;
            d->ev = p;
        }
        d->ev[d->n++] = e;
    }
    free(line);
    fclose(f);
    /* a rank killed while it wrote leaves its last line cut: said, and the rest is read */
    if (cut)
        fprintf(stderr,
                "dpshim-diag report: %s:%d: the last line is cut (the rank ended while writing it); "
                "it is left out\n",
                path, cut);
    if (damaged)
        fprintf(stderr,
                "dpshim-diag report: %s: %d line(s) are not events (the first at line %d): the file is "
                "damaged; they are left out, and the figures from this rank's trace may be short\n",
                path, damaged, first_damaged);
    return 1;
}

/* Reads rank 0's stats for the job's size: 1 with j->size set, 0 without the file, -1 with err
 * set. A size out of range is left to the caller (0). */
static int probe_job(const char *dir, job_t *j, char *err, size_t errlen)
{
    dps_diag_stats_t st;
    memset(j, 0, sizeof *j);
    j->dir = dir;
    int rc = read_stats(dir, 0, &st, err, errlen);
    if (rc > 0) j->size = st.size > 0 && st.size <= 65536 ? (int)st.size : 0;
    return rc;
}

/* Puts rank d's times on rank 0's clock: its measured offset (its clock minus rank 0's) is
 * subtracted, so that arrivals on different hosts compare. Unsigned arithmetic wraps, so adding
 * the two's complement subtracts a negative offset as well. */
static void to_rank0_clock(rank_data_t *d)
{
    if (!d->st.clock_measured) return;
    uint64_t off = (uint64_t)d->st.clock_offset_ns;
    d->st.start_ns -= off, d->st.end_ns -= off;
    for (size_t i = 0; i < d->n; i++)
        d->ev[i].begin_ns -= off, d->ev[i].end_ns -= off;
}

/* Every rank's files, on rank 0's clock where offsets were measured. With need_all a rank
 * without files is an error; else it counts as missing. 0, or -1 with err set. */
static int read_ranks(job_t *j, int need_all, char *err, size_t errlen)
{
    j->rd = calloc((size_t)j->size, sizeof *j->rd);
    if (!j->rd) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int r = 0; r < j->size; r++) {
        rank_data_t *d = &j->rd[r];
        int rc = read_stats(j->dir, r, &d->st, err, errlen);
        if (rc < 0 || (need_all && rc == 0)) goto fail;
        d->present = rc;
        j->missing += !d->present;
        rc = read_trace(j, r, err, errlen);
        if (rc < 0 || (need_all && rc == 0)) goto fail;
        to_rank0_clock(d);
        continue;
    fail: /* err is set, or the rank has no files */
        if (!err[0])
            snprintf(err, errlen, "%s: the files of rank %d are missing; a profile needs every rank's",
                     j->dir, r);
        return -1;
    }
    return 0;
}

/* --- hosts and their clocks --- */

/* By host name, then by rank: a host's ranks end up together, in ascending order. */
static int host_order(const void *a, const void *b, void *rd_p)
{
    const rank_data_t *rd = rd_p;
    int ra = *(const int *)a, rb = *(const int *)b, c = strcmp(rd[ra].st.host, rd[rb].st.host);
    return c ? c : (ra > rb) - (ra < rb);
}

/* By the host's first rank. */
static int first_rank_order(const void *a, const void *b, void *by_host_p)
{
    const int *by_host = by_host_p;
    int ra = by_host[((const host_group_t *)a)->at], rb = by_host[((const host_group_t *)b)->at];
    return (ra > rb) - (ra < rb);
}

/* Groups the ranks with files by the host their stats name. Sorting keeps it fast at thousands
 * of hosts. 0, or -1 when memory runs out. */
static int group_hosts(job_t *j)
{
    int n = 0;
    j->by_host = malloc(((size_t)j->size + 1) * sizeof *j->by_host);
    j->hosts = malloc(((size_t)j->size + 1) * sizeof *j->hosts);
    if (!j->by_host || !j->hosts) return -1;
    for (int r = 0; r < j->size; r++)
        if (j->rd[r].present) j->by_host[n++] = r;
    qsort_r(j->by_host, (size_t)n, sizeof *j->by_host, host_order, j->rd);
    for (int i = 0; i < n; i++) {
        if (!i || strcmp(j->rd[j->by_host[i]].st.host, j->rd[j->by_host[i - 1]].st.host))
            j->hosts[j->nhosts++] = (host_group_t){.at = i};
        j->hosts[j->nhosts - 1].n++;
    }
    qsort_r(j->hosts, (size_t)j->nhosts, sizeof *j->hosts, first_rank_order, j->by_host);
    return 0;
}

static const char *host_of(const job_t *j, int r)
{
    return j->rd[r].st.host[0] ? j->rd[r].st.host : "?";
}

/* A lane's name in the trace and the picture: "rank N (host)". */
static void lane_name(const job_t *j, int r, char *buf, size_t len)
{
    if (j->rd[r].present)
        snprintf(buf, len, "rank %d (%s)", r, host_of(j, r));
    else
        snprintf(buf, len, "rank %d (no files)", r);
}

/* The clock offsets to rank 0 that the ranks recorded (see to_rank0_clock). */
typedef struct clocks {
    int others, measured;      /* ranks other than 0 with files; those of them with an offset */
    uint64_t max_off, max_err; /* the largest offset, either way, and the largest error bound */
    int one_clock;             /* one host and no offset: nothing to correct (the usual case) */
    int corrected;             /* offsets were subtracted from the times of another host */
} clocks_t;

static clocks_t clock_summary(const job_t *j)
{
    clocks_t c = {0};
    for (int r = 1; r < j->size; r++) {
        const dps_diag_stats_t *st = &j->rd[r].st;
        if (!j->rd[r].present) continue;
        c.others++;
        if (!st->clock_measured) continue;
        c.measured++;
        uint64_t off =
            st->clock_offset_ns < 0 ? 0 - (uint64_t)st->clock_offset_ns : (uint64_t)st->clock_offset_ns;
        if (off > c.max_off) c.max_off = off;
        if (st->clock_error_ns > c.max_err) c.max_err = st->clock_error_ns;
    }
    c.one_clock = j->nhosts == 1 && !c.max_off;
    c.corrected = c.measured && !c.one_clock;
    return c;
}

/* --- matching collectives across ranks --- */

/* Steps every rank's cursor `at` to its next collective. 1 when every rank has one and they
 * carry the same number (the same collective); then *latest is when the last rank arrived,
 * *last is that rank and *second when the one before it arrived. 0 at the end, or where the
 * ranks' sequences diverge (a desync). */
static int next_matched(const rank_data_t *rd, int size, size_t *at, uint64_t *latest, uint64_t *second,
                        int *last)
{
    *latest = *second = 0, *last = -1;
    for (int r = 0; r < size; r++) {
        while (at[r] < rd[r].n && rd[r].ev[at[r]].kind != DPS_DIAG_COLLECTIVE)
            at[r]++;
        if (at[r] >= rd[r].n) return 0;
    }
    for (int r = 0; r < size; r++) {
        const ev_t *e = &rd[r].ev[at[r]];
        if (e->seq != rd[0].ev[at[0]].seq) return 0;
        if (e->begin_ns >= *latest)
            *second = *latest, *latest = e->begin_ns, *last = r;
        else if (e->begin_ns > *second)
            *second = e->begin_ns;
    }
    return 1;
}

/* Who arrived last at each collective, and how long the others waited for it; counted for the
 * collectives rank 0 entered between lo and hi. */
static void match_collectives(rank_data_t *rd, int size, uint64_t lo, uint64_t hi)
{
    size_t *at = calloc((size_t)size, sizeof *at);
    uint64_t latest, second;
    int last;
    while (at && next_matched(rd, size, at, &latest, &second, &last)) {
        uint64_t b0 = rd[0].ev[at[0]].begin_ns;
        if (b0 < lo || b0 > hi) {
            for (int r = 0; r < size; r++)
                at[r]++;
            continue;
        }
        for (int r = 0; r < size; r++)
            rd[r].wait_s += (double)(latest - rd[r].ev[at[r]++].begin_ns) * 1e-9;
        if (size > 1) rd[last].last++, rd[last].late_s += (double)(latest - second) * 1e-9;
    }
    free(at);
}

/* --- start-up --- */

static int u64_order(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The middle of the times between rank d's step ends (its typical step); 0 with fewer than two. */
static uint64_t median_step(const rank_data_t *d)
{
    size_t n = 0;
    uint64_t prev = 0, mid = 0, *len = malloc(d->n * sizeof *len);
    for (size_t i = 0; len && i < d->n; i++)
        if (d->ev[i].kind == DPS_DIAG_STEP) {
            if (prev) len[n++] = d->ev[i].begin_ns - prev;
            prev = d->ev[i].begin_ns;
        }
    if (n) {
        qsort(len, n, sizeof *len, u64_order);
        mid = len[n / 2];
    }
    free(len);
    return mid;
}

/* Where each rank's training begins, so that the table's compute column and the picture leave out
 * the start-up before it (an interpreter's imports, loading data, building the model, which can
 * outlast a short run's steps many times). Only step ends are recorded, so the first step is taken
 * to last as long as the rank's median step: it begins that long before the first step end, never
 * before the rank started. A rank with fewer than two step ends starts training at its first
 * collective; one whose trace holds neither (trace_mb = 0), nowhere known. */
static void find_startup(job_t *j)
{
    for (int r = 0; r < j->size; r++) {
        rank_data_t *d = &j->rd[r];
        uint64_t first_end = 0, first_coll = 0, step = median_step(d);
        for (size_t i = 0; i < d->n && !first_end; i++) {
            if (d->ev[i].kind == DPS_DIAG_STEP) first_end = d->ev[i].begin_ns;
            if (d->ev[i].kind == DPS_DIAG_COLLECTIVE && !first_coll) first_coll = d->ev[i].begin_ns;
        }
        if (!step)
            d->first_step = first_coll;
        else if (first_end > d->st.start_ns + step)
            d->first_step = first_end - step;
        else
            d->first_step = d->st.start_ns;
        d->startup_comm_ns = 0;
        for (size_t i = 0; i < d->n; i++) {
            const ev_t *e = &d->ev[i];
            if (e->kind != DPS_DIAG_COLLECTIVE || e->begin_ns >= d->first_step) continue;
            d->startup_comm_ns += (e->end_ns < d->first_step ? e->end_ns : d->first_step) - e->begin_ns;
        }
    }
}

/* Rank d's start-up outside collectives, in seconds: what the compute column leaves out. */
static double startup_s(const rank_data_t *d)
{
    if (!d->first_step || d->first_step <= d->st.start_ns) return 0;
    return (double)(d->first_step - d->st.start_ns - d->startup_comm_ns) * 1e-9;
}

/* The earliest first step of the ranks with files; 0 where none is known. */
static uint64_t job_first_step(const job_t *j)
{
    uint64_t first = 0;
    for (int r = 0; r < j->size; r++)
        if (j->rd[r].present && j->rd[r].first_step && (!first || j->rd[r].first_step < first))
            first = j->rd[r].first_step;
    return first;
}

/* --- the Chrome/Perfetto trace --- */

/* A JSON string: hook names are plain, but nothing stops one holding a quote. */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, f);
    fputc('"', f);
}

/* A collective as a span: on the rank's lane (comm), or its background lane. */
static void json_span(FILE *f, const job_t *j, const ev_t *e, const char *cat, int tid, uint64_t t0)
{
    fprintf(f, ",\n{\"name\":");
    json_string(f, j->names[e->hook]);
    fprintf(f,
            ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
            "\"args\":{\"seq\":%llu,\"step\":%llu,\"bytes\":%llu}}",
            cat, tid, (double)(e->begin_ns - t0) / 1e3, (double)(e->end_ns - e->begin_ns) / 1e3,
            (unsigned long long)e->seq, (unsigned long long)e->step, (unsigned long long)e->bytes);
}

/* The metadata event that names lane tid after rank r, with `suffix` after its name. */
static void json_lane(FILE *f, const job_t *j, int r, int tid, const char *suffix, const char *sep)
{
    char name[400];
    lane_name(j, r, name, sizeof name);
    snprintf(name + strlen(name), sizeof name - strlen(name), "%s", suffix);
    fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":", sep, tid);
    json_string(f, name);
    fprintf(f, "}}");
}

/* Time outside collectives on lane tid: "compute", or "start-up" before the first step. */
static void json_compute(FILE *f, const char *what, int tid, uint64_t from, uint64_t to, uint64_t t0)
{
    fprintf(f,
            ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
            what, what, tid, (double)(from - t0) / 1e3, (double)(to - from) / 1e3);
}

/* One rank's lanes: the start-up, compute between its collectives, the collectives, step marks,
 * and the progress thread's reductions on a lane of their own. */
static void json_rank(FILE *f, const job_t *j, int r, uint64_t t0)
{
    const rank_data_t *d = &j->rd[r];
    if (d->st.bg_collectives) json_lane(f, j, r, j->size + r, " background", ",\n");
    uint64_t prev = d->st.start_ns;
    for (size_t i = 0; i < d->n; i++) {
        const ev_t *e = &d->ev[i];
        if (e->kind == DPS_DIAG_STEP) {
            fprintf(f,
                    ",\n{\"name\":\"step %llu\",\"ph\":\"i\",\"s\":\"t\",\"pid\":0,\"tid\":%d,\"ts\":%.3f}",
                    (unsigned long long)e->step, r, (double)(e->begin_ns - t0) / 1e3);
            continue;
        }
        if (e->kind == DPS_DIAG_BACKGROUND) {
            json_span(f, j, e, "background", j->size + r, t0);
            continue;
        }
        if (prev < d->first_step && e->begin_ns > prev) { /* the part before the first step */
            uint64_t end = e->begin_ns < d->first_step ? e->begin_ns : d->first_step;
            json_compute(f, "start-up", r, prev, end, t0);
            prev = end;
        }
        if (e->begin_ns > prev) json_compute(f, "compute", r, prev, e->begin_ns, t0);
        json_span(f, j, e, "comm", r, t0);
        prev = e->end_ns;
    }
}

static void json_events(FILE *f, const job_t *j, uint64_t t0)
{
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    int first = 1;
    for (int r = 0; r < j->size; r++) {
        if (!j->rd[r].present) continue;
        json_lane(f, j, r, r, "", first ? "" : ",\n");
        first = 0;
        json_rank(f, j, r, t0);
    }
    fprintf(f, "\n]}\n");
}

/* --- the SVG timeline --- */

/* The picture's time axis: the start-up, from the first rank's start t0 to the first step at ts,
 * then the training to the last event at t1. A start-up that would take more than SVG_FOLD_W
 * pixels at the training's scale is folded: drawn that wide, hatched, not to scale, and set off by
 * a break, so that a short run after a long start-up (an interpreter's imports) shows its steps
 * across the picture. Lanes are named "rank N (host)"; a thin dark line marks each step end. */
enum { SVG_FOLD_W = 64, SVG_BREAK_W = 10 };
#define SVG_COMPUTE "#9ecae1"
#define SVG_WAIT "#e6550d"
#define SVG_COMM "#31a354"
#define SVG_STEP "#08306b"

typedef struct svg_frame {
    double W, left, lane, top;
    double x_train, x_of; /* where the training begins on the picture; pixels per ns from there */
    uint64_t t0, ts, t1;
    int folded;
} svg_frame_t;

static double svg_x(const svg_frame_t *s, uint64_t t)
{
    if (s->folded && t < s->ts) return s->left + SVG_FOLD_W * (double)(t - s->t0) / (double)(s->ts - s->t0);
    return s->x_train + (t >= s->ts ? (double)(t - s->ts) : -(double)(s->ts - t)) * s->x_of;
}

/* A span of lane r; what falls in a folded start-up is left out (not to scale there). */
static void svg_box(FILE *f, const svg_frame_t *s, int r, uint64_t from, uint64_t to, const char *color)
{
    if (s->folded && from < s->ts) from = s->ts;
    if (to <= from) return;
    double x = svg_x(s, from);
    fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>\n", x,
            s->top + s->lane * r + 4, svg_x(s, to) - x, s->lane - 8, color);
}

/* Collectives matched across ranks by number, so that waiting can be drawn apart from
 * transfer; then what never completed everywhere (a job the guard ended), drawn as waiting to
 * the end. */
static void svg_collectives(FILE *f, const svg_frame_t *s, const rank_data_t *rd, int size)
{
    size_t *at = size > 0 ? calloc((size_t)size, sizeof *at) : NULL;
    uint64_t latest, second;
    int last;
    if (!at) return; /* the picture lacks the collectives; the report says what it can */
    while (next_matched(rd, size, at, &latest, &second, &last)) {
        for (int r = 0; r < size; r++) {
            const ev_t *e = &rd[r].ev[at[r]++];
            uint64_t w_end = latest < e->end_ns ? latest : e->end_ns;
            if (w_end > e->begin_ns) svg_box(f, s, r, e->begin_ns, w_end, SVG_WAIT);
            if (e->end_ns > w_end) svg_box(f, s, r, w_end, e->end_ns, SVG_COMM);
        }
    }
    for (int r = 0; r < size; r++)
        for (; at[r] < rd[r].n; at[r]++) {
            const ev_t *e = &rd[r].ev[at[r]];
            if (e->kind == DPS_DIAG_COLLECTIVE && e->end_ns > e->begin_ns)
                svg_box(f, s, r, e->begin_ns, e->end_ns, SVG_WAIT);
        }
    free(at);
}

/* Every `every`-th step: 1, 2, 5, 10, 20, 50 ... steps, the fewest that leave `px` pixels
 * between two marks at a typical step of step_ns. */
static uint64_t svg_every(const svg_frame_t *s, uint64_t step_ns, double px)
{
    double step_px = (double)step_ns * s->x_of;
    for (uint64_t k = 1;; k *= 10)
        for (int m = 0; m < 3; m++) {
            uint64_t every = k * (uint64_t)(m == 0 ? 1 : m == 1 ? 2 : 5);
            if (step_px <= 0 || (double)every * step_px >= px || every >= UINT64_MAX / 20) return every;
        }
}

/* Each rank's step ends as thin lines across its lane (every few where steps are narrow), and
 * rank 0's step numbers above the lanes. */
static void svg_steps(FILE *f, const svg_frame_t *s, const job_t *j)
{
    uint64_t typical = median_step(&j->rd[0]), mark = svg_every(s, typical, 4),
             label = svg_every(s, typical, 48);
    for (int r = 0; r < j->size; r++)
        for (size_t i = 0; i < j->rd[r].n; i++) {
            const ev_t *e = &j->rd[r].ev[i];
            if (e->kind != DPS_DIAG_STEP || e->step % mark || (s->folded && e->begin_ns < s->ts)) continue;
            fprintf(f,
                    "<rect x=\"%.0f\" y=\"%.1f\" width=\"1\" height=\"%.1f\" fill=\"" SVG_STEP
                    "\" shape-rendering=\"crispEdges\"/>\n",
                    svg_x(s, e->begin_ns) - 0.5, s->top + s->lane * r + 4, s->lane - 8);
            if (r == 0 && e->step % label == 0)
                fprintf(f,
                        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%llu</text>\n",
                        svg_x(s, e->begin_ns), s->top - 2, (unsigned long long)e->step);
        }
    if (j->rd[0].st.steps) fprintf(f, "<text x=\"8\" y=\"%.1f\" font-size=\"10\">step</text>\n", s->top - 2);
}

/* A folded start-up: a hatched band per lane and a break after it. */
static void svg_fold(FILE *f, const svg_frame_t *s, int size)
{
    for (int r = 0; r < size; r++) {
        double y = s->top + s->lane * r;
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"url(#startup)\"/>\n",
                s->left, y + 4, SVG_FOLD_W, s->lane - 8);
        double x = s->left + SVG_FOLD_W;
        fprintf(
            f,
            "<path d=\"M%.1f %.1f L%.1f %.1f M%.1f %.1f L%.1f %.1f\" stroke=\"#636363\" stroke-width=\"1.5\" "
            "fill=\"none\"/>\n",
            x + 1, y + s->lane - 4, x + 5, y + 4, x + 5, y + s->lane - 4, x + 9, y + 4);
    }
}

static void svg_legend(FILE *f, const svg_frame_t *s, int size)
{
    double ly = s->top + s->lane * size + 25;
    const char *names[] = {"compute", "waiting for the last rank", "communication", "step end",
                           s->folded ? "start-up (folded, not to scale)" : "start-up"};
    const char *colors[] = {SVG_COMPUTE, SVG_WAIT, SVG_COMM, SVG_STEP, "url(#startup)"};
    for (int i = 0; i < 5; i++) {
        double x = s->left + 175 * i;
        if (i == 3)
            fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"2\" height=\"14\" fill=\"%s\"/>\n", x + 6, ly,
                    colors[i]);
        else
            fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", x, ly,
                    colors[i]);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", x + 20, ly + 12, names[i]);
    }
    double ay = ly + 36;
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">0 s</text>\n", s->left, ay);
    if (s->ts > s->t0 && svg_x(s, s->ts) - s->left >= 50 && s->W - 20 - svg_x(s, s->ts) >= 90)
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\">%.3f s</text>\n", svg_x(s, s->ts), ay,
                (double)(s->ts - s->t0) * 1e-9);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.3f s</text>\n", s->W - 20, ay,
            (double)(s->t1 - s->t0) * 1e-9);
}

/* Text in an SVG element: host names and directories may hold what XML reserves. */
static void svg_text(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
}

/* The lanes' names are drawn left of the lanes: room for the longest, about 6.5 px a character at
 * font-size 12, and at most a third of the picture. */
static double svg_left(const job_t *j, double W)
{
    size_t longest = 0;
    char name[400];
    for (int r = 0; r < j->size; r++) {
        lane_name(j, r, name, sizeof name);
        if (strlen(name) > longest) longest = strlen(name);
    }
    double left = 16 + 6.5 * (double)longest;
    return left < 70 ? 70 : left > W / 3 ? W / 3 : left;
}

/* The last event of any rank (a collective's end, a step end); 0 without any. */
static uint64_t last_event(const job_t *j)
{
    uint64_t t1 = 0;
    for (int r = 0; r < j->size; r++)
        for (size_t i = 0; i < j->rd[r].n; i++)
            if (j->rd[r].ev[i].end_ns > t1) t1 = j->rd[r].ev[i].end_ns;
    return t1;
}

/* One lane per rank: the start-up, then compute, waiting for the last rank inside a collective,
 * transfer, and step ends; t0 is the first rank's start, t_end the last one's exit. */
static void svg_timeline(FILE *f, const job_t *j, uint64_t t0, uint64_t t_end)
{
    svg_frame_t s = {.W = 1100, .left = svg_left(j, 1100), .lane = 34, .top = 56, .t0 = t0};
    s.t1 = last_event(j) > t0 ? last_event(j) : t_end;
    s.ts = job_first_step(j);
    if (s.ts < t0 || s.ts >= s.t1) s.ts = t0; /* no start-up known: all of it to scale */
    double plot = s.W - s.left - 20, all = (double)(s.t1 - t0), H = s.top + s.lane * j->size + 70;
    s.folded = all > 0 && (double)(s.ts - t0) / all * plot > SVG_FOLD_W;
    s.x_train = s.folded ? s.left + SVG_FOLD_W + SVG_BREAK_W
                         : s.left + (all > 0 ? (double)(s.ts - t0) / all * plot : 0);
    s.x_of =
        s.folded ? (plot - SVG_FOLD_W - SVG_BREAK_W) / (double)(s.t1 - s.ts) : plot / (all > 0 ? all : 1);
    char name[400];
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n",
            s.W, H);
    fprintf(f, "<defs><pattern id=\"startup\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
               "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#e0e0e0\"/>"
               "<rect width=\"2\" height=\"6\" fill=\"#bdbdbd\"/></pattern></defs>\n");
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">dpshim timeline of ", s.left);
    svg_text(f, j->dir);
    fprintf(f, ": %d ranks on %d host%s, %.3f s", j->size, j->nhosts, j->nhosts == 1 ? "" : "s", all * 1e-9);
    if (s.ts > t0)
        fprintf(f, "; first step at %.3f s%s, %llu steps", (double)(s.ts - t0) * 1e-9,
                s.folded ? " (start-up folded)" : "", (unsigned long long)j->rd[0].st.steps);
    fprintf(f, "%s</text>\n", clock_summary(j).corrected ? ", on rank 0's clock" : "");
    for (int r = 0; r < j->size; r++) {
        double y = s.top + s.lane * r;
        lane_name(j, r, name, sizeof name);
        fprintf(f, "<text x=\"8\" y=\"%.1f\">", y + s.lane * 0.6);
        svg_text(f, name);
        fprintf(f, "</text>\n");
        if (!s.folded && s.ts > t0) svg_box(f, &s, r, t0, s.ts, "url(#startup)");
        svg_box(f, &s, r, s.ts, s.t1, SVG_COMPUTE);
    }
    if (s.folded) svg_fold(f, &s, j->size);
    svg_collectives(f, &s, j->rd, j->size);
    svg_steps(f, &s, j);
    svg_legend(f, &s, j->size);
    fprintf(f, "</svg>\n");
}

/* --- the report --- */

/* From the first rank's start to the last one's files. */
static void job_span(const job_t *j, uint64_t *t0, uint64_t *t1)
{
    *t0 = UINT64_MAX, *t1 = 0;
    for (int r = 0; r < j->size; r++)
        if (j->rd[r].present) {
            if (j->rd[r].st.start_ns < *t0) *t0 = j->rd[r].st.start_ns;
            if (j->rd[r].st.end_ns > *t1) *t1 = j->rd[r].st.end_ns;
        }
}

/* Where each rank's time went, a line per rank; then the progress thread's share. */
static void print_ranks(const job_t *j)
{
    printf("rank  steps  collectives  MB reduced   wall s  compute s   comm s  waiting s  comm %%  arrived "
           "last  host\n");
    for (int r = 0; r < j->size; r++) {
        const rank_data_t *d = &j->rd[r];
        if (!d->present) {
            printf("%4d  no files: the rank crashed, was killed, or left with _exit\n", r);
            continue;
        }
        double wall = (double)(d->st.end_ns - d->st.start_ns) * 1e-9, comm = (double)d->st.comm_ns * 1e-9;
        printf("%4d  %5llu  %11llu  %10.1f  %7.3f  %9.3f  %7.3f  %9.3f  %5.1f%%  %5.1f%%        %s\n", r,
               (unsigned long long)d->st.steps, (unsigned long long)d->st.collectives,
               (double)(d->st.bytes + d->st.bg_bytes) / 1e6, wall, wall - startup_s(d) - comm, comm,
               d->wait_s, wall > 0 ? 100 * comm / wall : 0,
               d->st.collectives ? 100.0 * (double)d->last / (double)d->st.collectives : 0, host_of(j, r));
    }
    for (int r = 0; r < j->size; r++)
        if (j->rd[r].present && j->rd[r].st.bg_collectives)
            printf("%4d  in the background ([comm] overlap): %llu reductions, %.1f MB, %.3f s, of which only "
                   "the "
                   "wait in dp_grads counts as comm above\n",
                   r, (unsigned long long)j->rd[r].st.bg_collectives, (double)j->rd[r].st.bg_bytes / 1e6,
                   (double)j->rd[r].st.bg_comm_ns * 1e-9);
}

/* The start-up the compute column leaves out: rank 0's, and the range over the ranks. */
static void print_startup(const job_t *j)
{
    double lo = -1, hi = 0;
    int known = 0;
    for (int r = 0; r < j->size; r++)
        if (j->rd[r].present && j->rd[r].first_step) {
            double s = startup_s(&j->rd[r]);
            lo = lo < 0 || s < lo ? s : lo, hi = s > hi ? s : hi, known++;
        }
    if (!known) return;
    printf("start-up, before the first step and outside collectives (not in compute s): ");
    if (j->rd[0].present && j->rd[0].first_step)
        printf("%.3f s on rank 0%s", startup_s(&j->rd[0]), known > 1 ? ", " : "");
    if (known > 1) printf("%.3f to %.3f s on the ranks", lo, hi);
    printf("\n");
}

/* Whose clock the waiting and arrived-last columns read, where more than one clock is involved. */
static void print_clock_note(const job_t *j, const clocks_t *c)
{
    if (c->corrected)
        printf("waiting and arrived last are on rank 0's clock: each rank's measured offset is subtracted "
               "from its times\n");
    else if (j->nhosts > 1)
        printf("waiting and arrived last compare the hosts' clocks as they are (offsets not measured): skew "
               "between them reads as waiting\n");
}

/* The rank that kept the others waiting longest, if any did. */
static void print_straggler(const job_t *j)
{
    const rank_data_t *rd = j->rd;
    int straggler = -1;
    for (int r = 0; r < j->size; r++)
        if (rd[r].present && (straggler < 0 || rd[r].late_s > rd[straggler].late_s)) straggler = r;
    if (j->size > 1 && straggler >= 0 && rd[straggler].last)
        printf(
            "\nstraggler: rank %d arrived last at %llu collectives, keeping the others waiting %.3f s in all "
            "(%.3f ms each)\n",
            straggler, (unsigned long long)rd[straggler].last, rd[straggler].late_s,
            1e3 * rd[straggler].late_s / (double)rd[straggler].last);
}

static void print_files(const job_t *j)
{
    uint64_t sinks = 0, noops = 0, followed = 0, rp = 0;
    for (int r = 0; r < j->size; r++) {
        const dps_diag_stats_t *st = &j->rd[r].st;
        sinks += st->gated_sinks, noops += st->gated_noops, followed += st->followed, rp += st->rank_paths;
    }
    printf("files: %llu writes to a sink and %llu calls without effect on ranks other than 0, %llu calls "
           "that took rank 0's outcome, %llu per-rank paths\n",
           (unsigned long long)sinks, (unsigned long long)noops, (unsigned long long)followed,
           (unsigned long long)rp);
}

/* Ranks whose trace lacks events past [diag] trace_mb: the figures drawn from the trace cover
 * only what was kept, while the counts above cover everything. */
static void print_dropped(const job_t *j)
{
    enum { SHOWN = 8 };
    int ranks = 0;
    uint64_t all = 0;
    for (int r = 0; r < j->size; r++) {
        uint64_t n = j->rd[r].st.dropped_events;
        if (!n) continue;
        if (!ranks) printf("trace cap: events past [diag] trace_mb were counted but not traced:");
        if (ranks < SHOWN) printf("%s rank %d lacks %llu", ranks ? "," : "", r, (unsigned long long)n);
        ranks++, all += n;
    }
    if (!ranks) return;
    if (ranks > SHOWN)
        printf(", and %d more ranks (%llu events in all)", ranks - SHOWN, (unsigned long long)all);
    printf("\n  the waiting and arrived-last columns, --trace and --svg show only the events kept; raise "
           "[diag] trace_mb to keep them all\n");
}

/* Ranks without files, a desync, and the failure each rank recorded. */
static void print_problems(const job_t *j)
{
    const rank_data_t *rd = j->rd;
    int desync = 0, failed = 0, nothing = rd[0].present && rd[0].st.nothing_shared[0];
    for (int r = 1; r < j->size; r++)
        if (rd[r].present && rd[0].present && rd[r].st.collectives != rd[0].st.collectives) desync = 1;
    for (int r = 0; r < j->size; r++)
        failed |= rd[r].st.failure[0] != 0;
    printf("problems: %s%s%s%s\n", j->missing ? "ranks without files (see above); " : "",
           desync ? "the ranks made different numbers of collectives (a desync); " : "",
           nothing ? "nothing was distributed; " : "",
           j->missing || desync || failed || nothing ? "" : "none");
    if (nothing) printf("  %s\n", rd[0].st.nothing_shared);
    for (int r = 0; r < j->size; r++)
        if (rd[r].st.failure[0]) printf("  rank %d: %s\n", r, rd[r].st.failure);
    /* the survivors agree on every loss: the lowest one with a record says it for all */
    for (int r = 0; r < j->size; r++)
        if (rd[r].present && rd[r].st.lost[0]) {
            printf("lost: the job went on without %s (as rank %d recorded it)\n", rd[r].st.lost, r);
            break;
        }
}

/* --trace and --svg: 0, or 1 when one could not be written. */
static int write_pictures(const job_t *j, const char *trace_out, const char *svg_out, uint64_t t0,
                          uint64_t t1)
{
    int rc = 0;
    if (trace_out) {
        FILE *f = fopen(trace_out, "w");
        if (!f)
            fprintf(stderr, "dpshim-diag: cannot write %s: %s\n", trace_out, strerror(errno)), rc = 1;
        else
            json_events(f, j, t0), rc |= fclose(f) != 0,
                printf("trace: %s (chrome://tracing, ui.perfetto.dev)\n", trace_out);
    }
    if (svg_out) {
        FILE *f = fopen(svg_out, "w");
        if (!f)
            fprintf(stderr, "dpshim-diag: cannot write %s: %s\n", svg_out, strerror(errno)), rc = 1;
        else
            svg_timeline(f, j, t0, t1), rc |= fclose(f) != 0, printf("timeline: %s\n", svg_out);
    }
    return rc;
}

/* "ranks 0-3,8": a host's ranks as runs of consecutive ones, the first RUNS of them. */
static void print_rank_runs(const int *rank, int n)
{
    enum { RUNS = 4 };
    printf(n == 1 ? "rank " : "ranks ");
    for (int i = 0, runs = 0; i < n; i++, runs++) {
        int k = i;
        while (k + 1 < n && rank[k + 1] == rank[k] + 1)
            k++;
        if (runs == RUNS) {
            printf(",... %d in all", n);
            return;
        }
        printf("%s%d", runs ? "," : "", rank[i]);
        if (k > i) printf("-%d", rank[k]);
        i = k;
    }
}

/* Each host with its ranks, the first SHOWN hosts. */
static void print_hosts(const job_t *j)
{
    enum { SHOWN = 16 };
    printf("hosts:");
    for (int h = 0; h < j->nhosts && h < SHOWN; h++) {
        const host_group_t *g = &j->hosts[h];
        printf("%s %s (", h ? "," : "", host_of(j, j->by_host[g->at]));
        print_rank_runs(j->by_host + g->at, g->n);
        printf(")");
    }
    if (j->nhosts > SHOWN) printf(", and %d more hosts", j->nhosts - SHOWN);
    printf("\n");
}

/* How far the ranks' clocks were from rank 0's, and whether the report corrected them. Nothing
 * for a job of one rank. */
static void print_clocks(const clocks_t *c)
{
    if (!c->others) return;
    if (c->one_clock || !c->measured) {
        printf("clock offsets to rank 0: %s\n", c->one_clock
                                                    ? "none (one host, one clock)"
                                                    : "not measured; each host's clock is taken as it is");
        return;
    }
    uint64_t top = c->max_off > c->max_err ? c->max_off : c->max_err;
    double unit = top >= 1000000000 ? 1e9 : top >= 1000000 ? 1e6 : 1e3;
    const char *u = unit == 1e9 ? "s" : unit == 1e6 ? "ms" : "us";
    printf("clock offsets to rank 0: up to %.3f %s (+/- %.3f %s), corrected", (double)c->max_off / unit, u,
           (double)c->max_err / unit, u);
    if (c->measured < c->others)
        printf("; not measured on %d rank%s, whose clocks are taken as they are", c->others - c->measured,
               c->others - c->measured == 1 ? "" : "s");
    printf("\n");
}

/* The job of dir, read whole for the report: 0, or 1 after saying what is wrong. */
static int load_for_report(const char *dir, job_t *j)
{
    char err[4400] = "";
    int rc = probe_job(dir, j, err, sizeof err);
    if (rc <= 0) {
        fprintf(stderr, "dpshim-diag: %s\n",
                err[0] ? err : "no stats.rank0.txt: is DIR the [diag] dir of a finished job?");
        return 1;
    }
    if (!j->size) {
        fprintf(stderr, "dpshim-diag: %s/stats.rank0.txt does not say the job's size\n", dir);
        return 1;
    }
    if (read_ranks(j, 0, err, sizeof err)) {
        fprintf(stderr, "dpshim-diag: %s\n", err);
        return 1;
    }
    if (group_hosts(j)) {
        fprintf(stderr, "dpshim-diag: out of memory\n");
        return 1;
    }
    find_startup(j);
    return 0;
}

int dps_diag_report(const char *dir, const char *trace_out, const char *svg_out)
{
    job_t j;
    if (load_for_report(dir, &j)) return free_job(&j), 1;
    match_collectives(j.rd, j.size, 0, UINT64_MAX);
    uint64_t t0, t1;
    job_span(&j, &t0, &t1);
    clocks_t clocks = clock_summary(&j);
    printf("dpshim report of %s: %d ranks on %d host%s, launcher %s, %.3f s\n", dir, j.size, j.nhosts,
           j.nhosts == 1 ? "" : "s", j.rd[0].st.launcher, (double)(t1 - t0) * 1e-9);
    print_hosts(&j);
    print_clocks(&clocks);
    printf("\n");
    print_ranks(&j);
    print_startup(&j);
    print_clock_note(&j, &clocks);
    print_straggler(&j);
    print_files(&j);
    print_dropped(&j);
    print_problems(&j);
    int rc = write_pictures(&j, trace_out, svg_out, t0, t1);
    free_job(&j);
    return rc;
}

/* --- the per-step profile (dpshim-diag model) --- */

/* The window from rank 0's first to its last step end: start-up and the tail are left out.
 * The number of step ends in it, or 0 with err set when there are too few for a profile. */
static uint64_t step_window(const job_t *j, uint64_t *first, uint64_t *last, char *err, size_t errlen)
{
    const rank_data_t *d = &j->rd[0];
    uint64_t steps = 0;
    *first = *last = 0;
    for (size_t i = 0; i < d->n; i++)
        if (d->ev[i].kind == DPS_DIAG_STEP) {
            if (!steps++) *first = d->ev[i].begin_ns;
            *last = d->ev[i].begin_ns;
        }
    if (steps >= 3) return steps;
    snprintf(err, errlen,
             "%s: rank 0 recorded %llu step(s); a profile needs at least 3 (dp_step_end after each step)",
             j->dir, (unsigned long long)steps);
    return 0;
}

/* Rank 0's collectives inside the window: the main thread's exposed time, and the bytes and
 * collectives of both threads. The wait in dp_grads moves no bytes and is not counted as one. */
static void window_comm(const job_t *j, uint64_t first, uint64_t last, double *exposed, double *bytes,
                        double *calls)
{
    const rank_data_t *d = &j->rd[0];
    *exposed = *bytes = *calls = 0;
    for (size_t i = 0; i < d->n; i++) {
        const ev_t *e = &d->ev[i];
        if ((e->kind != DPS_DIAG_COLLECTIVE && e->kind != DPS_DIAG_BACKGROUND) || e->begin_ns < first ||
            e->end_ns > last)
            continue;
        if (e->kind == DPS_DIAG_COLLECTIVE) *exposed += (double)(e->end_ns - e->begin_ns) * 1e-9;
        *bytes += (double)e->bytes, *calls += e->bytes > 0;
    }
}

int dps_diag_profile(const char *dir, dps_step_profile_t *p, char *err, size_t errlen)
{
    job_t j;
    int rc = probe_job(dir, &j, err, errlen);
    if (rc <= 0) {
        if (!rc)
            snprintf(err, errlen, "%s/stats.rank0.txt: missing; is DIR the [diag] dir of a finished job?",
                     dir);
        return -1;
    }
    if (!j.size) j.size = 1;
    uint64_t first, last, steps;
    rc = -1;
    if (read_ranks(&j, 1, err, errlen) || !(steps = step_window(&j, &first, &last, err, errlen))) goto out;
    double exposed, bytes, calls;
    window_comm(&j, first, last, &exposed, &bytes, &calls);
    match_collectives(j.rd, j.size, first, last);
    double n = (double)(steps - 1), window = (double)(last - first) * 1e-9;
    p->size = j.size, p->steps = n;
    p->step_s = window / n, p->comm_s = exposed / n, p->compute_s = (window - exposed) / n;
    p->wait_s = j.rd[0].wait_s / n;
    p->bytes = bytes / n, p->collectives = calls / n;
    rc = 0;
out:
    free_job(&j);
    return rc;
}
