/* dpshim_bn_backward, the PyTorch adapter's BatchNorm backward in one pass, against BatchNorm's
 * backward as written in the textbook: with this rank's sums alone (over_ranks = 0) over a batch
 * of n samples, gx = w * invstd * (dy - sum(dy) / total - (x - mean) * invstd^2 * sum(dy * (x -
 * mean)) / total), float32 and float64, with and without a weight, planes of 19 (vector code and
 * a scalar tail) and of 1. That the pass gives PyTorch's own bits is tests/integration's
 * bn_reference.py; here, that it computes BatchNorm's gradient at all. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dpshim/hooks.h"
#include "plugin_abi/batchnorm.h"

static uint64_t lcg = 12345;
static double uniform(void) /* in [-1, 1) */
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 11) / (double)(1ull << 52) - 1.0;
}

/* v[i] as dtype */
static void put(void *v, int dtype, size_t i, double value)
{
    if (dtype == DP_F32)
        ((float *)v)[i] = (float)value;
    else
        ((double *)v)[i] = value;
}
static double get(const void *v, int dtype, size_t i)
{
    return dtype == DP_F32 ? ((const float *)v)[i] : ((const double *)v)[i];
}

/* One layer of outer x channels x inner: the native kernel's per-channel inputs computed here,
 * the pass's gx against the textbook's, relative to the largest term. total: the batch the
 * statistics are over (n here; more where other ranks' samples counted). */
static void check_layer(int dtype, size_t outer, size_t channels, size_t inner, int affine,
                        uint64_t total_factor)
{
    size_t n = outer * inner, all = outer * channels * inner, esize = dtype == DP_F32 ? 4 : 8;
    void *x = malloc(all * esize), *dy = malloc(all * esize), *gx = malloc(all * esize);
    void *mean = malloc(channels * esize), *var = malloc(channels * esize), *w = malloc(channels * esize);
    void *gw = malloc(channels * esize), *gb = malloc(channels * esize);
    for (size_t i = 0; i < all; i++)
        put(x, dtype, i, 2.0 * uniform() + 0.5), put(dy, dtype, i, uniform());
    double eps = 1e-5;
    for (size_t c = 0; c < channels; c++) {
        double s = 0, ss = 0;
        for (size_t o = 0; o < outer; o++)
            for (size_t i = 0; i < inner; i++) {
                double v = get(x, dtype, (o * channels + c) * inner + i);
                s += v, ss += v * v;
            }
        put(mean, dtype, c, s / (double)n);
        put(var, dtype, c, ss / (double)n - (s / (double)n) * (s / (double)n));
        put(w, dtype, c, uniform() + 1.5);
        double m = get(mean, dtype, c), invstd = 1.0 / sqrt(get(var, dtype, c) + eps), sum_dy = 0, dot = 0;
        for (size_t o = 0; o < outer; o++)
            for (size_t i = 0; i < inner; i++) {
                size_t at = (o * channels + c) * inner + i;
                sum_dy += get(dy, dtype, at), dot += get(dy, dtype, at) * (get(x, dtype, at) - m);
            }
        put(gb, dtype, c, sum_dy);
        put(gw, dtype, c, invstd * dot);
    }
    uint64_t total = n * total_factor;
    int rc = dpshim_bn_backward(dtype, outer, channels, inner, x, dy, gx, mean, var, affine ? w : NULL, gw,
                                gb, eps, total, 0);
    CHECK(rc == 0, "dpshim_bn_backward returned %d", rc);
    double worst = 0, tolerance = dtype == DP_F32 ? 1e-5 : 1e-12;
    for (size_t c = 0; rc == 0 && c < channels; c++) {
        double m = get(mean, dtype, c), invstd = 1.0 / sqrt(get(var, dtype, c) + eps);
        double wc = affine ? get(w, dtype, c) : 1.0, sum_dy = get(gb, dtype, c),
               dot = get(gw, dtype, c) / invstd;
        for (size_t o = 0; o < outer; o++)
            for (size_t i = 0; i < inner; i++) {
                size_t at = (o * channels + c) * inner + i;
                double d = get(dy, dtype, at), xm = get(x, dtype, at) - m;
                double want =
                    wc * invstd * (d - sum_dy / (double)total - xm * invstd * invstd * dot / (double)total);
                double scale = fabs(wc * invstd * d) + fabs(wc * invstd * sum_dy / (double)total) +
                               fabs(wc * invstd * invstd * invstd * xm * dot / (double)total) + 1e-30;
                double off = fabs(get(gx, dtype, at) - want) / scale;
                worst = off > worst ? off : worst;
            }
    }
    CHECK(worst < tolerance,
          "dtype %d, %zu x %zu x %zu, affine %d, total %llu x n: off by %g of the largest term", dtype, outer,
          channels, inner, affine, (unsigned long long)total_factor, worst);
    free(x), free(dy), free(gx), free(mean), free(var), free(w), free(gw), free(gb);
}

int main(void)
{
    double one = 1.0;
    /* an integer layer is not BatchNorm's: refused, nothing written */
    CHECK(dpshim_bn_backward(DP_I32, 1, 1, 1, &one, &one, &one, &one, &one, NULL, &one, &one, 1e-5, 1, 0) ==
              -1,
          "an int32 layer was taken");
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        /* PyTorch's AVX2 roundings need AVX2 and FMA: the adapter keeps PyTorch's ops */
        CHECK(dpshim_bn_backward(DP_F64, 1, 1, 1, &one, &one, &one, &one, &one, NULL, &one, &one, 1e-5, 1,
                                 0) == -1,
              "the pass ran on a CPU without AVX2 and FMA");
        return check_report("test_batchnorm");
    }
    for (int dtype = DP_F32; dtype <= DP_F64; dtype++)
        for (int affine = 0; affine <= 1; affine++) {
            check_layer(dtype, 3, 5, 19, affine, 1); /* planes: vector code and a tail */
            check_layer(dtype, 23, 6, 1, affine, 1); /* BatchNorm1d on (N, C): planes of one */
            check_layer(dtype, 4, 3, 16, affine, 3); /* statistics over three times this batch */
        }
    /* no channels, no samples: nothing to do, and no error */
    CHECK(dpshim_bn_backward(DP_F32, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1e-5, 0, 0) ==
              0,
          "an empty layer failed");
#else
    CHECK(dpshim_bn_backward(DP_F64, 1, 1, 1, &one, &one, &one, &one, &one, NULL, &one, &one, 1e-5, 1, 0) ==
              -1,
          "the pass ran off x86-64");
#endif
    return check_report("test_batchnorm");
}
