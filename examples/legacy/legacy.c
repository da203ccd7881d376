/* liblegacy (see legacy.h). */
#include "legacy.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* splitmix64: a small, well-mixed generator of its own */
static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void legacy_init_weights(float *w, size_t n, unsigned seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        w[i] = (float)((double)(next_random(&s) >> 11) / 9007199254740992.0 - 0.5) * 0.02f;
}

void legacy_shuffle(int64_t *perm, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        perm[i] = (int64_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(next_random(&s) % i);
        int64_t t = perm[i - 1];
        perm[i - 1] = perm[j], perm[j] = t;
    }
}

size_t legacy_batch(const int64_t *perm, size_t n, size_t start, size_t bs, int64_t *idx)
{
    size_t k = start < n ? (n - start < bs ? n - start : bs) : 0;
    memcpy(idx, perm + start, k * sizeof *idx);
    return k;
}

static void logits(const float *w, const uint8_t *px, double *z)
{
    for (int c = 0; c < LEGACY_CLASSES; c++) {
        const float *wc = w + (size_t)c * LEGACY_PIXELS;
        double s = w[LEGACY_CLASSES * LEGACY_PIXELS + c];
        for (int j = 0; j < LEGACY_PIXELS; j++)
            s += wc[j] * (px[j] / 255.0f);
        z[c] = s;
    }
}

float legacy_gradient(const float *w, const uint8_t *pixels, const uint8_t *labels, const int64_t *idx,
                      size_t count, float *g)
{
    memset(g, 0, LEGACY_PARAMS * sizeof *g);
    double loss = 0;
    for (size_t i = 0; i < count; i++) {
        const uint8_t *px = pixels + (size_t)idx[i] * LEGACY_PIXELS;
        double z[LEGACY_CLASSES], mx = -1e300, den = 0;
        logits(w, px, z);
        for (int c = 0; c < LEGACY_CLASSES; c++)
            mx = z[c] > mx ? z[c] : mx;
        for (int c = 0; c < LEGACY_CLASSES; c++)
            den += exp(z[c] - mx);
        int y = labels[idx[i]];
        loss += log(den) - (z[y] - mx);
        for (int c = 0; c < LEGACY_CLASSES; c++) {
            float d = (float)((exp(z[c] - mx) / den - (c == y)) / (double)count);
            float *gc = g + (size_t)c * LEGACY_PIXELS;
            for (int j = 0; j < LEGACY_PIXELS; j++)
                gc[j] += d * (px[j] / 255.0f);
            g[LEGACY_CLASSES * LEGACY_PIXELS + c] += d;
        }
    }
    return count ? (float)(loss / (double)count) : 0.0f;
}

void legacy_sgd_update(float *w, const float *g, size_t n, float lr)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= lr * g[i];
}

int legacy_save_model(const char *path, const float *w, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t put = fwrite(w, sizeof *w, n, f);
    return fclose(f) == 0 && put == n ? 0 : -1;
}

double legacy_accuracy(const float *w, const uint8_t *pixels, const uint8_t *labels, size_t n)
{
    size_t right = 0;
    for (size_t i = 0; i < n; i++) {
        double z[LEGACY_CLASSES];
        logits(w, pixels + i * LEGACY_PIXELS, z);
        int best = 0;
        for (int c = 1; c < LEGACY_CLASSES; c++)
            best = z[c] > z[best] ? c : best;
        right += best == labels[i];
    }
    return n ? (double)right / (double)n : 0.0;
}
