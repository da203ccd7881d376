/* dpshim-diag model: an alpha-beta model of a trainer's step at 8 .. 1024 GPUs, from the figures
 * dpshim-diag bench measured and the per-step profile in a [diag] dir. docs/performance.md "Scaling model"
 * states the model and its assumptions; the formulas are the ones in model_row below. */
#define _GNU_SOURCE
#include "diag_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag_report.h"

typedef struct link {
    double alpha_s; /* per message step */
    double bw;      /* bytes/s a rank sends and receives at once */
} link_t;

typedef struct model {
    link_t in, net;        /* within a node (measured or given), between nodes (given or assumed) */
    const char *in_from;   /* where the link within a node comes from: "measured", "given", ... */
    int per_node;          /* GPUs per node */
    double backward_share; /* of compute, which overlap can hide communication behind */
    dps_step_profile_t prof;
} model_t;

/* Ring all-reduce of `bytes` over p ranks in `calls` collectives on one kind of link. */
static double ring_s(const link_t *l, double p, double bytes, double calls)
{
    return calls * 2 * (p - 1) * l->alpha_s + 2 * (p - 1) / p * bytes / l->bw;
}

/* Reduce-scatter within each node, ring all-reduce of the 1/g shards between the nodes (g rings
 * side by side, one per GPU of a node), all-gather within each node. */
static double hierarchical_s(const model_t *m, double p, double bytes, double calls)
{
    double g = p < m->per_node ? p : m->per_node, nodes = ceil(p / g);
    double intra = calls * 2 * (g - 1) * m->in.alpha_s + 2 * (g - 1) / g * bytes / m->in.bw;
    double inter = nodes > 1 ? ring_s(&m->net, nodes, bytes / g, calls) : 0;
    return intra + inter;
}

static double step_s(const model_t *m, double comm, int overlap)
{
    double c = m->prof.compute_s, hidden = overlap ? m->backward_share * c : 0;
    return c + (comm > hidden ? comm - hidden : 0);
}

static void model_row(const model_t *m, int p)
{
    const link_t *slow = p > m->per_node ? &m->net : &m->in;
    double n = m->prof.bytes, k = m->prof.collectives;
    double ring = ring_s(slow, p, n, k), hier = hierarchical_s(m, p, n, k);
    double bound = 2.0 * (p - 1) / p * n / slow->bw;
    double c = m->prof.compute_s;
    printf("%6d %6d %10.3f %10.3f %10.3f %11.3f %11.3f %7.1f%% %7.1f%% %7.1f%%\n", p,
           (p + m->per_node - 1) / m->per_node, ring * 1e3, hier * 1e3, bound * 1e3, step_s(m, ring, 1) * 1e3,
           step_s(m, hier, 1) * 1e3, 100 * c / step_s(m, ring, 1), 100 * c / step_s(m, hier, 0),
           100 * c / step_s(m, hier, 1));
}

/* The "model inputs" line of a saved `dpshim-diag bench` (sweep) output. */
static int read_bench(const char *path, link_t *l)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr,
                "dpshim-diag model: cannot read %s; save the output of `mpirun -np 2 ... dpshim-diag bench` "
                "there\n",
                path);
        return -1;
    }
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "--alpha-us ");
        double a, b;
        if (at && sscanf(at, "--alpha-us %lf --bw-gbs %lf", &a, &b) == 2)
            l->alpha_s = a * 1e-6, l->bw = b * 1e9, found = 1;
    }
    fclose(f);
    if (!found)
        fprintf(stderr,
                "dpshim-diag model: %s has no \"model inputs\" line; it comes from `dpshim-diag bench` "
                "(the sweep, run at np >= 2)\n",
                path);
    return found ? 0 : -1;
}

static int positive(const char *opt, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "dpshim-diag model: %s needs a number in [%g, %g], got '%s'\n", opt, lo, hi,
                v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* The figures given on the command line. */
typedef struct args {
    const char *dir, *bench;
    double a_in, bw_in; /* -1: not given */
} args_t;

/* One "--option value" into m or a: 0, or 2 after saying what is wrong. */
static int parse_option(const char *o, const char *val, model_t *m, args_t *a)
{
    double v;
    if (!strcmp(o, "--bench"))
        a->bench = val;
    else if (!strcmp(o, "--alpha-us")) {
        if (positive(o, val, 0, 1e6, &a->a_in)) return 2;
    } else if (!strcmp(o, "--bw-gbs")) {
        if (positive(o, val, 1e-3, 1e6, &a->bw_in)) return 2;
    } else if (!strcmp(o, "--net-alpha-us")) {
        if (positive(o, val, 0, 1e6, &v)) return 2;
        m->net.alpha_s = v * 1e-6;
    } else if (!strcmp(o, "--net-bw-gbs")) {
        if (positive(o, val, 1e-3, 1e6, &v)) return 2;
        m->net.bw = v * 1e9;
    } else if (!strcmp(o, "--gpus-per-node")) {
        if (positive(o, val, 1, 1024, &v)) return 2;
        m->per_node = (int)v;
    } else if (!strcmp(o, "--backward-share")) {
        if (positive(o, val, 0, 1, &v)) return 2;
        m->backward_share = v;
    } else {
        fprintf(stderr, "dpshim-diag model: unknown option %s\n", o);
        return 2;
    }
    if (!val) {
        fprintf(stderr, "dpshim-diag model: %s needs a value\n", o);
        return 2;
    }
    return 0;
}

/* The command line into m and a: 0, or 2 after saying what is wrong. */
static int parse_args(int argc, char **argv, model_t *m, args_t *a)
{
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (o[0] != '-') {
            a->dir = o;
            continue;
        }
        i++;
        if (parse_option(o, val, m, a)) return 2;
    }
    if (!a->dir || (!a->bench && (a->a_in < 0 || a->bw_in < 0))) {
        fprintf(
            stderr,
            "usage: dpshim-diag model DIR (--bench BENCH.txt | --alpha-us A --bw-gbs B) [--net-alpha-us A] "
            "[--net-bw-gbs B] [--gpus-per-node G] [--backward-share F]\n"
            "  DIR: the [diag] dir of a trainer run; BENCH.txt: saved output of dpshim-diag bench\n");
        return 2;
    }
    return 0;
}

/* The link within a node (measured by bench, or given) and the profile of the run: 0, or 1
 * after saying what could not be read. */
static int read_inputs(const args_t *a, model_t *m)
{
    if (a->bench && read_bench(a->bench, &m->in)) return 1;
    if (a->a_in >= 0) m->in.alpha_s = a->a_in * 1e-6;
    if (a->bw_in >= 0) m->in.bw = a->bw_in * 1e9;
    m->in_from = a->a_in >= 0 && (a->bw_in >= 0 || !a->bench) ? "given"
                 : a->a_in >= 0                               ? "alpha given, B measured"
                 : a->bw_in >= 0                              ? "alpha measured, B given"
                                                              : "measured";
    char err[4400] = "";
    if (dps_diag_profile(a->dir, &m->prof, err, sizeof err)) {
        fprintf(stderr, "dpshim-diag model: %s\n", err);
        return 1;
    }
    return 0;
}

/* What the model starts from: the profile, the links, and on one node a check of the model
 * against what the profiled job measured. */
static void print_inputs(const model_t *m, const char *dir)
{
    const dps_step_profile_t *p = &m->prof;
    printf("profile of %s (rank 0 of %d, %.0f steps): step %.3f ms = compute %.3f ms + collectives %.3f ms; "
           "%.2f MB in %.1f collectives per step\n",
           dir, p->size, p->steps, p->step_s * 1e3, p->compute_s * 1e3, p->comm_s * 1e3, p->bytes / 1e6,
           p->collectives);
    printf("links: within a node alpha %.2f us, B %.2f GB/s (%s); between nodes alpha %.2f us, B %.2f "
           "GB/s per GPU%s; "
           "%d GPUs per node; overlap hides up to %.0f%% of compute\n",
           m->in.alpha_s * 1e6, m->in.bw / 1e9, m->in_from, m->net.alpha_s * 1e6, m->net.bw / 1e9,
           m->net.bw == 25e9 && m->net.alpha_s == 5e-6 ? " (assumed)" : "", m->per_node,
           100 * m->backward_share);
    if (p->size > 1 && p->size <= m->per_node)
        printf("check on the profiled job (%d ranks, one node): collectives took %.3f ms per step, %.3f ms "
               "of it waiting for "
               "the last rank; the rest, %.3f ms, the model puts at %.3f ms\n",
               p->size, p->comm_s * 1e3, p->wait_s * 1e3, (p->comm_s - p->wait_s) * 1e3,
               ring_s(&m->in, p->size, p->bytes, p->collectives) * 1e3);
}

/* A row per size from 8 to 1024 GPUs, and what the columns mean. */
static void print_table(const model_t *m)
{
    printf("\n%6s %6s %10s %10s %10s %11s %11s %8s %8s %8s\n", "GPUs", "nodes", "ring ms", "hier ms",
           "bound ms", "step ring", "step hier", "eff ring", "hier off", "hier on");
    for (int gpus = 8; gpus <= 1024; gpus *= 2)
        model_row(m, gpus);
    printf("\nring/hier: all-reduce time per step; bound: 2(p-1)/p n/B on the slowest link; step: compute + "
           "the part of\n"
           "the all-reduce that overlap cannot hide; eff: compute / step, as in scale mode (weak scaling); "
           "hier off/on:\n"
           "without/with [comm] overlap.\n");
}

int dps_diag_model(int argc, char **argv)
{
    /* assumed network when none is given: one 200 Gb/s InfiniBand port per GPU */
    model_t m = {.net = {5e-6, 25e9}, .per_node = 8, .backward_share = 2.0 / 3};
    args_t a = {.a_in = -1, .bw_in = -1};
    if (parse_args(argc, argv, &m, &a)) return 2;
    if (read_inputs(&a, &m)) return 1;
    print_inputs(&m, a.dir);
    print_table(&m);
    return 0;
}
