/* dpshim-diag report: reads the per-rank files of [diag] dir (stats.rankN.txt, trace.rankN.txt,
 * format version 1, written by shim/diag/diag.c) and merges them: a table of where each rank's
 * time went, who kept the others waiting, and what looks wrong; optionally one Chrome/Perfetto
 * trace of all ranks and an SVG picture of the timeline. */
#define _GNU_SOURCE
#include "diag_report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FORMAT_VERSION 1

typedef struct ev {
    char kind;
    uint64_t begin, end, seq, step, bytes;
    char hook[32];
} ev_t;

typedef struct rank_data {
    int present, size;
    char host[128], launcher[32], failure[256];
    uint64_t start, end, steps, collectives, bytes, comm, sinks, noops, published, rank_paths;
    uint64_t bg_collectives, bg_bytes, bg_comm; /* [comm] overlap: the progress thread's */
    ev_t *ev;
    size_t n;
    double wait_s;   /* inside collectives, waiting for the last rank to arrive */
    uint64_t last;   /* collectives this rank arrived at last */
    double late_s;   /* how much later than the second-to-last it arrived, summed */
} rank_data_t;

static int read_stats(const char *dir, int r, rank_data_t *d, char *err, size_t errlen)
{
    char path[4200], key[64], val[256];
    snprintf(path, sizeof path, "%s/stats.rank%d.txt", dir, r);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int version = 0;
    if (fscanf(f, "dpshim-stats %d\n", &version) != 1 || version != FORMAT_VERSION) {
        snprintf(err, errlen, "%s: not a dpshim stats file of format %d", path, FORMAT_VERSION);
        fclose(f);
        return -1;
    }
    while (fscanf(f, "%63s %255[^\n]\n", key, val) == 2) {
        unsigned long long x = strtoull(val, NULL, 10);
        if (!strcmp(key, "host")) snprintf(d->host, sizeof d->host, "%.127s", val);
        else if (!strcmp(key, "launcher")) snprintf(d->launcher, sizeof d->launcher, "%.31s", val);
        else if (!strcmp(key, "size")) d->size = (int)x;
        else if (!strcmp(key, "failure")) snprintf(d->failure, sizeof d->failure, "%.255s", val);
        else if (!strcmp(key, "start_ns")) d->start = x;
        else if (!strcmp(key, "end_ns")) d->end = x;
        else if (!strcmp(key, "steps")) d->steps = x;
        else if (!strcmp(key, "collectives")) d->collectives = x;
        else if (!strcmp(key, "bytes")) d->bytes = x;
        else if (!strcmp(key, "comm_ns")) d->comm = x;
        else if (!strcmp(key, "bg_collectives")) d->bg_collectives = x;
        else if (!strcmp(key, "bg_bytes")) d->bg_bytes = x;
        else if (!strcmp(key, "bg_comm_ns")) d->bg_comm = x;
        else if (!strcmp(key, "gated_sinks")) d->sinks = x;
        else if (!strcmp(key, "gated_noops")) d->noops = x;
        else if (!strcmp(key, "published")) d->published = x;
        else if (!strcmp(key, "rank_paths")) d->rank_paths = x;
    }
    fclose(f);
    d->present = 1;
    return 1;
}

static int read_trace(const char *dir, int r, rank_data_t *d, char *err, size_t errlen)
{
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/trace.rank%d.txt", dir, r);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int version = 0;
    if (!fgets(line, sizeof line, f) || sscanf(line, "dpshim-trace %d", &version) != 1 || version != FORMAT_VERSION) {
        snprintf(err, errlen, "%s: not a dpshim trace file of format %d", path, FORMAT_VERSION);
        fclose(f);
        return -1;
    }
    size_t cap = 0;
    while (fgets(line, sizeof line, f)) {
        ev_t e;
        unsigned long long b, en, sq, st, by;
        if (line[0] == '#' || sscanf(line, "%c %llu %llu %llu %llu %llu %31s", &e.kind, &b, &en, &sq, &st, &by, e.hook) != 7)
            continue;
        e.begin = b, e.end = en, e.seq = sq, e.step = st, e.bytes = by;
        if (d->n == cap) {
            cap = cap ? 2 * cap : 1024;
            ev_t *p = realloc(d->ev, cap * sizeof *p);
            if (!p) break;
            d->ev = p;
        }
        d->ev[d->n++] = e;
    }
    fclose(f);
    return 1;
}

/* Steps every rank's cursor `at` to its next collective. 1 when every rank has one and they
 * carry the same number (the same collective); then *latest is when the last rank arrived,
 * *last is that rank and *second when the one before it arrived. 0 at the end, or where the
 * ranks' sequences diverge (a desync). */
static int next_matched(const rank_data_t *rd, int size, size_t *at, uint64_t *latest, uint64_t *second, int *last)
{
    *latest = *second = 0, *last = -1;
    for (int r = 0; r < size; r++) {
        while (at[r] < rd[r].n && rd[r].ev[at[r]].kind != 'c') at[r]++;
        if (at[r] >= rd[r].n) return 0;
    }
    for (int r = 0; r < size; r++) {
        const ev_t *e = &rd[r].ev[at[r]];
        if (e->seq != rd[0].ev[at[0]].seq) return 0;
        if (e->begin >= *latest) *second = *latest, *latest = e->begin, *last = r;
        else if (e->begin > *second) *second = e->begin;
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
        uint64_t b0 = rd[0].ev[at[0]].begin;
        if (b0 < lo || b0 > hi) {
            for (int r = 0; r < size; r++) at[r]++;
            continue;
        }
        for (int r = 0; r < size; r++) rd[r].wait_s += (double)(latest - rd[r].ev[at[r]++].begin) * 1e-9;
        if (size > 1) rd[last].last++, rd[last].late_s += (double)(latest - second) * 1e-9;
    }
    free(at);
}

static void json_events(FILE *f, const rank_data_t *rd, int size, uint64_t t0)
{
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    int first = 1;
    for (int r = 0; r < size; r++) {
        if (!rd[r].present) continue;
        fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d\"}}",
                first ? "" : ",\n", r, r);
        first = 0;
        if (rd[r].bg_collectives)
            fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d background\"}}",
                    size + r, r);
        uint64_t prev = rd[r].start;
        for (size_t i = 0; i < rd[r].n; i++) {
            const ev_t *e = &rd[r].ev[i];
            if (e->kind == 's') {
                fprintf(f, ",\n{\"name\":\"step %llu\",\"ph\":\"i\",\"s\":\"t\",\"pid\":0,\"tid\":%d,\"ts\":%.3f}",
                        (unsigned long long)e->step, r, (double)(e->begin - t0) / 1e3);
                continue;
            }
            if (e->kind == 'b') { /* the progress thread: a lane of its own */
                fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"background\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,"
                           "\"dur\":%.3f,\"args\":{\"seq\":%llu,\"step\":%llu,\"bytes\":%llu}}",
                        e->hook, size + r, (double)(e->begin - t0) / 1e3, (double)(e->end - e->begin) / 1e3,
                        (unsigned long long)e->seq, (unsigned long long)e->step, (unsigned long long)e->bytes);
                continue;
            }
            if (e->begin > prev)
                fprintf(f, ",\n{\"name\":\"compute\",\"cat\":\"compute\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                        r, (double)(prev - t0) / 1e3, (double)(e->begin - prev) / 1e3);
            fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"comm\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                       "\"args\":{\"seq\":%llu,\"step\":%llu,\"bytes\":%llu}}",
                    e->hook, r, (double)(e->begin - t0) / 1e3, (double)(e->end - e->begin) / 1e3,
                    (unsigned long long)e->seq, (unsigned long long)e->step, (unsigned long long)e->bytes);
            prev = e->end;
        }
    }
    fprintf(f, "\n]}\n");
}

/* One lane per rank: compute, waiting for the last rank inside a collective, and transfer. */
static void svg_timeline(FILE *f, rank_data_t *rd, int size, uint64_t t0, uint64_t t1, const char *dir)
{
    const double W = 1100, left = 70, lane = 34, top = 50;
    double span = (double)(t1 - t0), x_of = (W - left - 20) / (span > 0 ? span : 1);
    double H = top + lane * size + 70;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">dpshim timeline of %s: %d ranks, first to last collective, %.3f s</text>\n",
            left, dir, size, span * 1e-9);
    size_t *at = calloc((size_t)size, sizeof *at);
    for (int r = 0; r < size; r++) {
        double y = top + lane * r;
        fprintf(f, "<text x=\"8\" y=\"%.1f\">rank %d</text>\n", y + lane * 0.6, r);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#9ecae1\"/>\n", left,
                y + 4, span * x_of, lane - 8);
    }
    /* collectives, matched across ranks by number, so waiting can be drawn */
    uint64_t latest, second;
    int last;
    while (next_matched(rd, size, at, &latest, &second, &last)) {
        for (int r = 0; r < size; r++) {
            const ev_t *e = &rd[r].ev[at[r]++];
            double y = top + lane * r + 4, h = lane - 8;
            uint64_t w_end = latest < e->end ? latest : e->end;
            if (w_end > e->begin)
                fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"#e6550d\"/>\n",
                        left + (double)(e->begin - t0) * x_of, y, (double)(w_end - e->begin) * x_of, h);
            if (e->end > w_end)
                fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"#31a354\"/>\n",
                        left + (double)(w_end - t0) * x_of, y, (double)(e->end - w_end) * x_of, h);
        }
    }
    /* what never completed everywhere (a job the guard ended): drawn as waiting to the end */
    for (int r = 0; r < size; r++)
        for (; at[r] < rd[r].n; at[r]++) {
            const ev_t *e = &rd[r].ev[at[r]];
            if (e->kind == 'c' && e->end > e->begin)
                fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"#e6550d\"/>\n",
                        left + (double)(e->begin - t0) * x_of, top + lane * r + 4, (double)(e->end - e->begin) * x_of, lane - 8);
        }
    free(at);
    double ly = top + lane * size + 25;
    const char *names[] = {"compute", "waiting for the last rank", "communication"};
    const char *colors[] = {"#9ecae1", "#e6550d", "#31a354"};
    for (int i = 0; i < 3; i++) {
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", left + 230 * i, ly, colors[i]);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", left + 230 * i + 20, ly + 12, names[i]);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">0 s</text><text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.3f s</text>\n",
            left, ly + 36, W - 20, ly + 36, span * 1e-9);
    fprintf(f, "</svg>\n");
}

int dps_diag_report(const char *dir, const char *trace_out, const char *svg_out)
{
    char err[4400] = "";
    rank_data_t probe = {0};
    if (read_stats(dir, 0, &probe, err, sizeof err) <= 0) {
        fprintf(stderr, "dpshim-diag: %s\n", err[0] ? err : "no stats.rank0.txt: is DIR the [diag] dir of a finished job?");
        return 1;
    }
    int size = probe.size;
    if (size <= 0 || size > 65536) {
        fprintf(stderr, "dpshim-diag: %s/stats.rank0.txt does not say the job's size\n", dir);
        return 1;
    }
    free(probe.ev);
    rank_data_t *rd = calloc((size_t)size, sizeof *rd);
    int missing = 0;
    for (int r = 0; r < size; r++) {
        if (read_stats(dir, r, &rd[r], err, sizeof err) < 0 || read_trace(dir, r, &rd[r], err, sizeof err) < 0) {
            fprintf(stderr, "dpshim-diag: %s\n", err);
            return 1;
        }
        missing += !rd[r].present;
    }
    match_collectives(rd, size, 0, UINT64_MAX);
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (int r = 0; r < size; r++)
        if (rd[r].present) {
            if (rd[r].start < t0) t0 = rd[r].start;
            if (rd[r].end > t1) t1 = rd[r].end;
        }
    printf("dpshim report of %s: %d ranks, host %s, launcher %s, %.3f s\n\n", dir, size, rd[0].host, rd[0].launcher,
           (double)(t1 - t0) * 1e-9);
    printf("rank  steps  collectives  MB reduced   wall s  compute s   comm s  waiting s  comm %%  arrived last\n");
    for (int r = 0; r < size; r++) {
        const rank_data_t *d = &rd[r];
        if (!d->present) {
            printf("%4d  no files: the rank crashed, was killed, or left with _exit\n", r);
            continue;
        }
        double wall = (double)(d->end - d->start) * 1e-9, comm = (double)d->comm * 1e-9;
        printf("%4d  %5llu  %11llu  %10.1f  %7.3f  %9.3f  %7.3f  %9.3f  %5.1f%%  %5.1f%%\n", r,
               (unsigned long long)d->steps, (unsigned long long)d->collectives, (double)(d->bytes + d->bg_bytes) / 1e6, wall,
               wall - comm, comm, d->wait_s, wall > 0 ? 100 * comm / wall : 0,
               d->collectives ? 100.0 * (double)d->last / (double)d->collectives : 0);
    }
    for (int r = 0; r < size; r++)
        if (rd[r].present && rd[r].bg_collectives)
            printf("%4d  in the background ([comm] overlap): %llu reductions, %.1f MB, %.3f s, of which only the "
                   "wait in dp_grads counts as comm above\n", r, (unsigned long long)rd[r].bg_collectives,
                   (double)rd[r].bg_bytes / 1e6, (double)rd[r].bg_comm * 1e-9);
    int straggler = -1;
    for (int r = 0; r < size; r++)
        if (rd[r].present && (straggler < 0 || rd[r].late_s > rd[straggler].late_s)) straggler = r;
    if (size > 1 && straggler >= 0 && rd[straggler].last)
        printf("\nstraggler: rank %d arrived last at %llu collectives, keeping the others waiting %.3f s in all "
               "(%.3f ms each)\n", straggler, (unsigned long long)rd[straggler].last, rd[straggler].late_s,
               1e3 * rd[straggler].late_s / (double)rd[straggler].last);
    int desync = 0;
    for (int r = 1; r < size; r++)
        if (rd[r].present && rd[0].present && rd[r].collectives != rd[0].collectives) desync = 1;
    uint64_t sinks = 0, noops = 0, pub = 0, rp = 0;
    for (int r = 0; r < size; r++) sinks += rd[r].sinks, noops += rd[r].noops, pub += rd[r].published, rp += rd[r].rank_paths;
    printf("files: %llu writes to a sink and %llu calls without effect on ranks other than 0, %llu files published "
           "whole by rank 0, %llu per-rank paths\n", (unsigned long long)sinks, (unsigned long long)noops,
           (unsigned long long)pub, (unsigned long long)rp);
    int failed = 0;
    for (int r = 0; r < size; r++) failed |= rd[r].failure[0] != 0;
    printf("problems: %s%s%s\n", missing ? "ranks without files (see above); " : "",
           desync ? "the ranks made different numbers of collectives (a desync); " : "",
           missing || desync || failed ? "" : "none");
    for (int r = 0; r < size; r++)
        if (rd[r].failure[0]) printf("  rank %d: %s\n", r, rd[r].failure);
    int rc = 0;
    if (trace_out) {
        FILE *f = fopen(trace_out, "w");
        if (!f) fprintf(stderr, "dpshim-diag: cannot write %s: %s\n", trace_out, strerror(errno)), rc = 1;
        else json_events(f, rd, size, t0), rc |= fclose(f) != 0, printf("trace: %s (chrome://tracing, ui.perfetto.dev)\n", trace_out);
    }
    uint64_t c0 = UINT64_MAX, c1 = 0; /* the picture shows the span of the collectives */
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < rd[r].n; i++)
            if (rd[r].ev[i].kind == 'c') {
                if (rd[r].ev[i].begin < c0) c0 = rd[r].ev[i].begin;
                if (rd[r].ev[i].end > c1) c1 = rd[r].ev[i].end;
            }
    if (c1 <= c0) c0 = t0, c1 = t1;
    if (svg_out) {
        FILE *f = fopen(svg_out, "w");
        if (!f) fprintf(stderr, "dpshim-diag: cannot write %s: %s\n", svg_out, strerror(errno)), rc = 1;
        else svg_timeline(f, rd, size, c0, c1, dir), rc |= fclose(f) != 0, printf("timeline: %s\n", svg_out);
    }
    for (int r = 0; r < size; r++) free(rd[r].ev);
    free(rd);
    return rc;
}

int dps_diag_profile(const char *dir, dps_step_profile_t *p, char *err, size_t errlen)
{
    rank_data_t probe = {0};
    int rc = read_stats(dir, 0, &probe, err, errlen);
    if (rc <= 0) {
        if (!rc) snprintf(err, errlen, "%s/stats.rank0.txt: missing; is DIR the [diag] dir of a finished job?", dir);
        return -1;
    }
    int size = probe.size > 0 && probe.size <= 65536 ? probe.size : 1;
    rank_data_t *rd = calloc((size_t)size, sizeof *rd);
    if (!rd) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    rc = -1;
    for (int r = 0; r < size; r++)
        if (read_stats(dir, r, &rd[r], err, errlen) <= 0 || read_trace(dir, r, &rd[r], err, errlen) <= 0) {
            if (!err[0]) snprintf(err, errlen, "%s: the files of rank %d are missing; a profile needs every rank's", dir, r);
            goto out;
        }
    /* the window from rank 0's first to its last step end: start-up and the tail are left out */
    const rank_data_t *d = &rd[0];
    uint64_t first = 0, last = 0, steps = 0;
    for (size_t i = 0; i < d->n; i++)
        if (d->ev[i].kind == 's') {
            if (!steps++) first = d->ev[i].begin;
            last = d->ev[i].begin;
        }
    if (steps < 3) {
        snprintf(err, errlen, "%s: rank 0 recorded %llu step(s); a profile needs at least 3 (dp_step_end after each step)",
                 dir, (unsigned long long)steps);
        goto out;
    }
    double exposed = 0, bytes = 0, calls = 0;
    for (size_t i = 0; i < d->n; i++) {
        const ev_t *e = &d->ev[i];
        if ((e->kind != 'c' && e->kind != 'b') || e->begin < first || e->end > last) continue;
        if (e->kind == 'c') exposed += (double)(e->end - e->begin) * 1e-9;
        bytes += (double)e->bytes, calls += e->bytes > 0; /* the wait in dp_grads moves no bytes */
    }
    match_collectives(rd, size, first, last);
    double n = (double)(steps - 1), window = (double)(last - first) * 1e-9;
    p->size = size, p->steps = n;
    p->step_s = window / n, p->comm_s = exposed / n, p->compute_s = (window - exposed) / n;
    p->wait_s = rd[0].wait_s / n;
    p->bytes = bytes / n, p->collectives = calls / n;
    rc = 0;
out:
    for (int r = 0; r < size; r++) free(rd[r].ev);
    free(rd);
    free(probe.ev);
    return rc;
}
