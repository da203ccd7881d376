#define _GNU_SOURCE
/* dpnn model, training and checkpoints. The only distribution-aware lines are the weak hook
 * calls (dp_*), each a no-op when the hook is NULL; everything else is single-process code. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

#include "dpnn.h"

#define BN_EPS 1e-5
#define BN_MOMENTUM 0.1

typedef enum { L_DENSE, L_BN, L_RELU } layer_kind_t;

typedef struct layer {
    layer_kind_t kind;
    size_t in, out;
    float *w, *b;        /* dense: weights [in][out] and bias; BN: gamma and beta */
    float *gw, *gb;      /* their gradients */
    float *vw, *vb;      /* momentum */
    float *rmean, *rvar; /* BN running statistics */
    double *istd;        /* BN: 1/sqrt(var + eps) of the last training batch */
    float *xhat;         /* BN: normalized input of the last training batch */
    float *act, *dact;   /* output and its gradient, [batch][out] */
} layer_t;

struct dpnn_model {
    dpnn_config_t cfg;
    int nl;
    layer_t L[3 * DPNN_MAX_HIDDEN + 1];
    size_t cap; /* batch capacity of the activation buffers */
    float *input;
    uint64_t steps, shuffle_state;
    dp_tensor params[6 * (DPNN_MAX_HIDDEN + 1)], grads[4 * (DPNN_MAX_HIDDEN + 1)];
    size_t nparams, ngrads;
    uint64_t *perm, *bidx;
    size_t perm_cap;
};

/* splitmix64: small, fast, and identical on every platform */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s)
{
    return ((rng_next(s) >> 11) + 0.5) * 0x1.0p-53;
}

static double rng_normal(uint64_t *s)
{
    double u = rng_uniform(s), v = rng_uniform(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586476925 * v);
}

static float *zalloc(size_t n)
{
    return calloc(n ? n : 1, sizeof(float));
}

static void add_param(dpnn_model_t *m, float *data, size_t n, const char *name)
{
    m->params[m->nparams++] = (dp_tensor){data, n, DP_F32, DP_HOST, name};
}

static void add_grad(dpnn_model_t *m, float *data, size_t n, const char *name)
{
    m->grads[m->ngrads++] = (dp_tensor){data, n, DP_F32, DP_HOST, name};
}

static const char *const names[][6] = {
#define N(i)                                                                                                 \
    {                                                                                                        \
        "fc" #i ".w", "fc" #i ".b", "bn" #i ".gamma", "bn" #i ".beta", "bn" #i ".mean", "bn" #i ".var"       \
    }
    N(0), N(1), N(2), N(3), N(4), N(5), N(6), N(7), N(8),
#undef N
};

static layer_t *add_layer(dpnn_model_t *m, layer_kind_t kind, size_t in, size_t out)
{
    layer_t *l = &m->L[m->nl++];
    memset(l, 0, sizeof *l);
    l->kind = kind, l->in = in, l->out = out;
    return l;
}

dpnn_model_t *dpnn_create(const dpnn_config_t *cfg)
{
    if (cfg->nhidden < 0 || cfg->nhidden > DPNN_MAX_HIDDEN) return NULL;
    dpnn_model_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    /* every rank draws the same initial weights and shuffles from the root's seed */
    uint64_t seed = cfg->seed;
    if (dp_seed) dp_seed(&seed);
    uint64_t init_state = seed;
    m->shuffle_state = seed ^ 0x5deece66dull;
    size_t in = cfg->in_dim;
    for (int h = 0; h <= cfg->nhidden; h++) {
        size_t out = h < cfg->nhidden ? cfg->hidden[h] : cfg->nclass;
        layer_t *d = add_layer(m, L_DENSE, in, out);
        d->w = zalloc(in * out), d->gw = zalloc(in * out), d->vw = zalloc(in * out);
        d->b = zalloc(out), d->gb = zalloc(out), d->vb = zalloc(out);
        double sd = sqrt(2.0 / (double)in); /* He initialization for ReLU */
        for (size_t i = 0; i < in * out; i++)
            d->w[i] = (float)(sd * rng_normal(&init_state));
        add_param(m, d->w, in * out, names[h][0]);
        add_param(m, d->b, out, names[h][1]);
        add_grad(m, d->gw, in * out, names[h][0]);
        add_grad(m, d->gb, out, names[h][1]);
        if (h < cfg->nhidden) {
            if (cfg->batchnorm) {
                layer_t *bn = add_layer(m, L_BN, out, out);
                bn->w = zalloc(out), bn->gw = zalloc(out), bn->vw = zalloc(out);
                bn->b = zalloc(out), bn->gb = zalloc(out), bn->vb = zalloc(out);
                bn->rmean = zalloc(out), bn->rvar = zalloc(out);
                bn->istd = calloc(out, sizeof(double));
                for (size_t c = 0; c < out; c++)
                    bn->w[c] = 1.0f, bn->rvar[c] = 1.0f;
                add_param(m, bn->w, out, names[h][2]);
                add_param(m, bn->b, out, names[h][3]);
                add_param(m, bn->rmean, out, names[h][4]);
                add_param(m, bn->rvar, out, names[h][5]);
                add_grad(m, bn->gw, out, names[h][2]);
                add_grad(m, bn->gb, out, names[h][3]);
            }
            add_layer(m, L_RELU, out, out);
        }
        in = out;
    }
    if (dp_params) dp_params(m->params, m->nparams);
    return m;
}

void dpnn_free(dpnn_model_t *m)
{
    if (!m) return;
    for (int i = 0; i < m->nl; i++) {
        layer_t *l = &m->L[i];
        free(l->w), free(l->b), free(l->gw), free(l->gb), free(l->vw), free(l->vb);
        free(l->rmean), free(l->rvar), free(l->istd), free(l->xhat), free(l->act), free(l->dact);
    }
    free(m->input), free(m->perm), free(m->bidx);
    free(m);
}

uint64_t dpnn_steps(const dpnn_model_t *m)
{
    return m->steps;
}

static int ensure_capacity(dpnn_model_t *m, size_t n)
{
    if (n <= m->cap) return 0;
    free(m->input);
    if (!(m->input = zalloc(n * m->cfg.in_dim))) return -1;
    for (int i = 0; i < m->nl; i++) {
        layer_t *l = &m->L[i];
        free(l->act), free(l->dact), free(l->xhat);
        l->act = zalloc(n * l->out), l->dact = zalloc(n * l->out);
        l->xhat = l->kind == L_BN ? zalloc(n * l->out) : NULL;
        if (!l->act || !l->dact || (l->kind == L_BN && !l->xhat)) return -1;
    }
    m->cap = n;
    return 0;
}

static void gather(dpnn_model_t *m, const dpnn_data_t *d, const uint64_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *px = d->pixels + idx[i] * d->dim;
        for (size_t k = 0; k < d->dim; k++)
            m->input[i * d->dim + k] = px[k] * (1.0f / 255.0f);
    }
}

static void dense_forward(const layer_t *l, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float *y = l->act + i * l->out;
        memcpy(y, l->b, l->out * sizeof *y);
        for (size_t k = 0; k < l->in; k++) {
            float a = x[i * l->in + k];
            if (a == 0.0f) continue; /* inputs and ReLU outputs are often zero */
            const float *w = l->w + k * l->out;
            for (size_t j = 0; j < l->out; j++)
                y[j] += a * w[j];
        }
    }
}

/* dW += x^T dy, db += sum dy, and (when dx) dx = dy W^T */
static void dense_backward(const layer_t *l, const float *x, float *dx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float *dy = l->dact + i * l->out;
        for (size_t j = 0; j < l->out; j++)
            l->gb[j] += dy[j];
        for (size_t k = 0; k < l->in; k++) {
            float a = x[i * l->in + k];
            float *gw = l->gw + k * l->out;
            const float *w = l->w + k * l->out;
            if (a != 0.0f)
                for (size_t j = 0; j < l->out; j++)
                    gw[j] += a * dy[j];
            if (dx) {
                float s = 0.0f;
                for (size_t j = 0; j < l->out; j++)
                    s += dy[j] * w[j];
                dx[i * l->in + k] = s;
            }
        }
    }
}

/* Per-channel sums over the (global) batch: dp_bn_stats adds the other ranks' sums. */
static void channel_sums(double *s1, double *s2, uint64_t *count, size_t c)
{
    if (!dp_bn_stats) return;
    dp_tensor t1 = {s1, c, DP_F64, DP_HOST, "bn.sum"}, t2 = {s2, c, DP_F64, DP_HOST, "bn.sumsq"};
    dp_bn_stats(&t1, &t2, count);
}

static void bn_forward(layer_t *l, const float *x, size_t n, int train)
{
    size_t C = l->out;
    if (!train) {
        for (size_t i = 0; i < n; i++)
            for (size_t c = 0; c < C; c++) {
                double xh = (x[i * C + c] - l->rmean[c]) / sqrt((double)l->rvar[c] + BN_EPS);
                l->act[i * C + c] = (float)(l->w[c] * xh + l->b[c]);
            }
        return;
    }
    double *s = calloc(2 * C, sizeof *s), *ss = s + C;
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < C; c++) {
            double v = x[i * C + c];
            s[c] += v, ss[c] += v * v;
        }
    uint64_t total = n;
    channel_sums(s, ss, &total, C);
    for (size_t c = 0; c < C; c++) {
        double mean = total ? s[c] / (double)total : 0.0;
        double var = total ? ss[c] / (double)total - mean * mean : 0.0;
        if (var < 0) var = 0;
        l->istd[c] = 1.0 / sqrt(var + BN_EPS);
        double unbiased = total > 1 ? var * (double)total / (double)(total - 1) : var;
        l->rmean[c] = (float)((1 - BN_MOMENTUM) * l->rmean[c] + BN_MOMENTUM * mean);
        l->rvar[c] = (float)((1 - BN_MOMENTUM) * l->rvar[c] + BN_MOMENTUM * unbiased);
        for (size_t i = 0; i < n; i++) {
            float xh = (float)((x[i * C + c] - mean) * l->istd[c]);
            l->xhat[i * C + c] = xh;
            l->act[i * C + c] = l->w[c] * xh + l->b[c];
        }
    }
    free(s);
}

/* BatchNorm backward over the global batch. dy is the gradient of this process's mean loss
 * over its n samples; scaled by n it is per-sample, so sums from other ranks (whose n differ)
 * combine into the global batch's sums, and dividing by n again returns to this process's
 * convention. Alone (no shim) this is the textbook formula. */
static void bn_backward(layer_t *l, float *dx, size_t n)
{
    size_t C = l->out;
    double *s = calloc(2 * C, sizeof *s), *sx = s + C;
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < C; c++) {
            double dy = l->dact[i * C + c];
            l->gb[c] += (float)dy;
            l->gw[c] += (float)(dy * l->xhat[i * C + c]);
            s[c] += dy * (double)n, sx[c] += dy * l->xhat[i * C + c] * (double)n;
        }
    uint64_t total = n;
    channel_sums(s, sx, &total, C);
    for (size_t c = 0; c < C; c++) {
        double k = total && n ? 1.0 / ((double)total * (double)n) : 0.0;
        double g = l->w[c] * l->istd[c];
        for (size_t i = 0; i < n; i++)
            dx[i * C + c] = (float)(g * (l->dact[i * C + c] - s[c] * k - l->xhat[i * C + c] * sx[c] * k));
    }
    free(s);
}

static const float *layer_input(const dpnn_model_t *m, int i)
{
    return i == 0 ? m->input : m->L[i - 1].act;
}

static void forward(dpnn_model_t *m, size_t n, int train)
{
    for (int i = 0; i < m->nl; i++) {
        layer_t *l = &m->L[i];
        const float *x = layer_input(m, i);
        switch (l->kind) {
        case L_DENSE:
            dense_forward(l, x, n);
            break;
        case L_BN:
            bn_forward(l, x, n, train);
            break;
        case L_RELU:
            for (size_t j = 0; j < n * l->out; j++)
                l->act[j] = x[j] > 0.0f ? x[j] : 0.0f;
            break;
        }
    }
}

/* Softmax cross-entropy on the last layer's output: returns the summed loss, leaves
 * d(mean loss)/d(logits) in its dact. */
static double loss_and_grad(dpnn_model_t *m, const uint8_t *labels, const uint64_t *idx, size_t n)
{
    layer_t *out = &m->L[m->nl - 1];
    size_t K = out->out;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float *z = out->act + i * K;
        float *g = out->dact + i * K;
        float mx = z[0];
        for (size_t k = 1; k < K; k++)
            mx = z[k] > mx ? z[k] : mx;
        double den = 0.0;
        for (size_t k = 0; k < K; k++)
            den += exp((double)(z[k] - mx));
        unsigned y = labels[idx[i]];
        for (size_t k = 0; k < K; k++) {
            double p = exp((double)(z[k] - mx)) / den;
            g[k] = (float)((p - (k == y)) / (double)n);
        }
        sum += log(den) - (double)(z[y] - mx);
    }
    return sum;
}

static void announce(const layer_t *l)
{
    if (!dp_grad_ready) return;
    size_t nw = l->kind == L_DENSE ? l->in * l->out : l->out;
    dp_tensor gw = {l->gw, nw, DP_F32, DP_HOST, NULL}, gb = {l->gb, l->out, DP_F32, DP_HOST, NULL};
    dp_grad_ready(&gw);
    dp_grad_ready(&gb);
}

static void backward(dpnn_model_t *m, size_t n)
{
    for (int i = 0; i < m->nl; i++) {
        layer_t *l = &m->L[i];
        if (l->gw) memset(l->gw, 0, (l->kind == L_DENSE ? l->in * l->out : l->out) * sizeof(float));
        if (l->gb) memset(l->gb, 0, l->out * sizeof(float));
    }
    for (int i = m->nl - 1; i >= 0; i--) {
        layer_t *l = &m->L[i];
        float *dx = i > 0 ? m->L[i - 1].dact : NULL;
        switch (l->kind) {
        case L_DENSE:
            dense_backward(l, layer_input(m, i), dx, n);
            break;
        case L_BN:
            bn_backward(l, dx, n);
            break;
        case L_RELU:
            for (size_t j = 0; j < n * l->out; j++)
                dx[j] = l->act[j] > 0.0f ? l->dact[j] : 0.0f;
            break;
        }
        if (l->gw) announce(l);
    }
}

static void sgd(dpnn_model_t *m)
{
    float lr = m->cfg.lr, mu = m->cfg.momentum;
    for (int i = 0; i < m->nl; i++) {
        layer_t *l = &m->L[i];
        if (!l->gw) continue;
        size_t nw = l->kind == L_DENSE ? l->in * l->out : l->out;
        for (size_t j = 0; j < nw; j++)
            l->vw[j] = mu * l->vw[j] + l->gw[j], l->w[j] -= lr * l->vw[j];
        for (size_t j = 0; j < l->out; j++)
            l->vb[j] = mu * l->vb[j] + l->gb[j], l->b[j] -= lr * l->vb[j];
    }
}

static int train_batch(dpnn_model_t *m, const dpnn_data_t *d, const uint64_t *idx, size_t n, double *loss_sum)
{
    if (ensure_capacity(m, n) != 0) return -1;
    gather(m, d, idx, n);
    forward(m, n, 1);
    *loss_sum += loss_and_grad(m, d->labels, idx, n);
    backward(m, n);
    if (dp_grads) dp_grads(m->grads, m->ngrads);
    sgd(m);
    m->steps++;
    if (dp_step_end) dp_step_end(m->steps);
    return 0;
}

static int ensure_perm(dpnn_model_t *m, size_t n)
{
    if (n <= m->perm_cap) return 0;
    free(m->perm), free(m->bidx);
    m->perm = malloc(n * sizeof *m->perm), m->bidx = malloc(n * sizeof *m->bidx);
    m->perm_cap = m->perm && m->bidx ? n : 0;
    return m->perm_cap ? 0 : -1;
}

/* Trains m->perm[0..n) in batches of `batch`, adding the loss and sample count to v. */
static int train_samples(dpnn_model_t *m, const dpnn_data_t *d, size_t n, size_t batch, uint64_t max_steps,
                         double v[2])
{
    for (size_t s = 0; s < n && !(max_steps && m->steps >= max_steps); s += batch) {
        size_t b = n - s < batch ? n - s : batch;
        memcpy(m->bidx, m->perm + s, b * sizeof *m->bidx);
        size_t k = dp_batch ? dp_batch(m->bidx, b) : b;
        if (train_batch(m, d, m->bidx, k, &v[0]) != 0) return -1;
        v[1] += (double)k;
    }
    return 0;
}

int dpnn_train_epoch(dpnn_model_t *m, const dpnn_data_t *d, size_t batch, uint64_t max_steps,
                     dpnn_epoch_stats_t *stats)
{
    if (batch == 0 || ensure_perm(m, d->n) != 0) return -1;
    for (size_t i = 0; i < d->n; i++)
        m->perm[i] = i;
    for (size_t i = d->n; i > 1; i--) { /* Fisher-Yates */
        size_t j = (size_t)(rng_next(&m->shuffle_state) % i);
        uint64_t t = m->perm[i - 1];
        m->perm[i - 1] = m->perm[j], m->perm[j] = t;
    }
    size_t n = dp_epoch ? dp_epoch(m->perm, d->n) : d->n;
    double v[2] = {0.0, 0.0}; /* summed loss, samples */
    uint64_t first = m->steps;
    if (train_samples(m, d, n, batch, max_steps, v) != 0) return -1;
    /* a job that went on without a rank lost in this epoch: this rank's share of what it had not
     * trained, asked again once trained until none is left (dp_epoch_rest needs hook ABI version 5) */
    int ask = dp_abi_version && dp_abi_version() >= 5 && dp_epoch_rest;
    for (size_t rest; ask && (rest = dp_epoch_rest(NULL, 0)) != 0;) { /* its length, then the share */
        if (ensure_perm(m, rest) != 0) return -1;
        dp_epoch_rest(m->perm, rest);
        if (train_samples(m, d, rest, batch, max_steps, v) != 0) return -1;
    }
    if (dp_metric) dp_metric(v, 2, DP_SUM);
    stats->loss = v[1] > 0 ? v[0] / v[1] : 0.0;
    stats->steps = m->steps - first;
    return 0;
}

double dpnn_evaluate(dpnn_model_t *m, const dpnn_data_t *d, size_t batch)
{
    double v[2] = {0.0, 0.0}; /* correct, total */
    if (batch == 0 || ensure_perm(m, batch) != 0 || ensure_capacity(m, batch) != 0) return -1.0;
    for (size_t s = 0; s < d->n; s += batch) {
        size_t b = d->n - s < batch ? d->n - s : batch;
        for (size_t i = 0; i < b; i++)
            m->bidx[i] = s + i;
        size_t k = dp_batch ? dp_batch(m->bidx, b) : b;
        gather(m, d, m->bidx, k);
        forward(m, k, 0);
        const layer_t *out = &m->L[m->nl - 1];
        for (size_t i = 0; i < k; i++) {
            const float *z = out->act + i * out->out;
            size_t best = 0;
            for (size_t c = 1; c < out->out; c++)
                best = z[c] > z[best] ? c : best;
            v[0] += best == d->labels[m->bidx[i]];
        }
        v[1] += (double)k;
    }
    if (dp_metric) dp_metric(v, 2, DP_SUM);
    return v[1] > 0 ? v[0] / v[1] : 0.0;
}

/* Checkpoint: "DPNNCKPT", u32 version, u32 count, then per tensor: u32 name length, name,
 * u64 element count, float32 data. Host byte order. */
static const char ckpt_magic[8] = {'D', 'P', 'N', 'N', 'C', 'K', 'P', 'T'};

int dpnn_save(const dpnn_model_t *m, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    uint32_t version = 1, n = (uint32_t)m->nparams;
    int ok = fwrite(ckpt_magic, 8, 1, f) == 1 && fwrite(&version, 4, 1, f) == 1 && fwrite(&n, 4, 1, f) == 1;
    for (size_t i = 0; ok && i < m->nparams; i++) {
        const dp_tensor *t = &m->params[i];
        uint32_t nl = (uint32_t)strlen(t->name);
        ok = fwrite(&nl, 4, 1, f) == 1 && fwrite(t->name, nl, 1, f) == 1 && fwrite(&t->count, 8, 1, f) == 1 &&
             fwrite(t->data, sizeof(float), t->count, f) == t->count;
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

void dpnn_ckpt_free(dpnn_ckpt_tensor_t *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].data);
    free(t);
}

int dpnn_ckpt_read(const char *path, dpnn_ckpt_tensor_t **tensors_p, size_t *n_p, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char magic[8];
    uint32_t version = 0, n = 0;
    dpnn_ckpt_tensor_t *t = NULL;
    size_t got = 0;
    if (fread(magic, 8, 1, f) != 1 || memcmp(magic, ckpt_magic, 8) != 0 || fread(&version, 4, 1, f) != 1 ||
        version != 1 || fread(&n, 4, 1, f) != 1 || n > 4096)
        goto bad;
    if (!(t = calloc(n ? n : 1, sizeof *t))) goto bad;
    for (; got < n; got++) {
        uint32_t nl;
        if (fread(&nl, 4, 1, f) != 1 || nl >= sizeof t[got].name || fread(t[got].name, nl, 1, f) != 1 ||
            fread(&t[got].count, 8, 1, f) != 1 || t[got].count > ((uint64_t)1 << 32))
            goto bad;
        t[got].name[nl] = '\0';
        if (!(t[got].data = malloc(t[got].count * sizeof(float) + 1)) ||
            fread(t[got].data, sizeof(float), t[got].count, f) != t[got].count) {
            got++;
            goto bad;
        }
    }
    fclose(f);
    *tensors_p = t, *n_p = n;
    return 0;
bad:
    snprintf(err, errlen, "%s is not a complete dpnn checkpoint", path);
    dpnn_ckpt_free(t, got);
    fclose(f);
    return -1;
}

int dpnn_load(dpnn_model_t *m, const char *path, char *err, size_t errlen)
{
    dpnn_ckpt_tensor_t *t;
    size_t n;
    if (dpnn_ckpt_read(path, &t, &n, err, errlen) != 0) return -1;
    int ok = n == m->nparams;
    for (size_t i = 0; ok && i < n; i++)
        ok = strcmp(t[i].name, m->params[i].name) == 0 && t[i].count == m->params[i].count;
    for (size_t i = 0; ok && i < n; i++)
        memcpy(m->params[i].data, t[i].data, t[i].count * sizeof(float));
    dpnn_ckpt_free(t, n);
    if (!ok) {
        snprintf(err, errlen, "%s does not match this model's layers", path);
        return -1;
    }
    if (dp_params) dp_params(m->params, m->nparams);
    return 0;
}
