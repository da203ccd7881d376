/* The backward of BatchNorm over the global batch, in one pass over the layer (the PyTorch and
 * libtorch adapters' SyncedBatchNorm, [bn] sync = on). PyTorch's native kernel in evaluation mode
 * gives the direct term dy * invstd * w and the affine gradients; the statistics of the global
 * batch add x * slope + offset per channel. As PyTorch ops that is three passes over the layer (the
 * native kernel's, addcmul_, add_) and some fifteen operations on per-channel vectors; here it is
 * one pass and a loop over the channels, with the roundings of PyTorch's AVX2 kernels: every
 * per-channel value in double in the ops' order, and addcmul_ as one fused multiply-add, as those
 * kernels are compiled. Whether the PyTorch at hand rounds so each adapter finds out once with a
 * probe against PyTorch itself, and keeps PyTorch's ops where it does not.
 * Compiled with -ffp-contract=off: nothing is fused that the code does not fuse by name. */
#include <stdint.h>
#include <stdlib.h>

#include "plugin_abi/batchnorm.h"

#include "core/dps.h"
#include "dpshim/hooks.h"

#if defined(__x86_64__)
#include <immintrin.h>

static double value_at(const void *p, int dtype, uint64_t i)
{
    return dtype == DP_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* One channel's constants, in double; the float32 pass rounds them to float as PyTorch's .to does. */
typedef struct {
    double invstd, w, slope, offset;
} bn_channel_t;

/* gx = fma(x, slope, dy * invstd * w) + offset, plane by plane (a plane: one sample's channel) */
__attribute__((target("avx2,fma"))) static void pass_f32(float *gx, const float *dy, const float *x,
                                                         uint64_t planes, uint64_t channels, uint64_t inner,
                                                         const bn_channel_t *ch)
{
    for (uint64_t p = 0; p < planes; p++) {
        const bn_channel_t *c = &ch[p % channels];
        float invstd = (float)c->invstd, w = (float)c->w, slope = (float)c->slope, offset = (float)c->offset;
        const float *d = dy + p * inner, *xs = x + p * inner;
        float *g = gx + p * inner;
        __m256 vi = _mm256_set1_ps(invstd), vw = _mm256_set1_ps(w), vs = _mm256_set1_ps(slope),
               vo = _mm256_set1_ps(offset);
        uint64_t i = 0;
        for (; i + 8 <= inner; i += 8) {
            __m256 direct = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(d + i), vi), vw);
            _mm256_storeu_ps(g + i, _mm256_add_ps(_mm256_fmadd_ps(_mm256_loadu_ps(xs + i), vs, direct), vo));
        }
        for (; i < inner; i++)
            g[i] = __builtin_fmaf(xs[i], slope, d[i] * invstd * w) + offset;
    }
}

__attribute__((target("avx2,fma"))) static void pass_f64(double *gx, const double *dy, const double *x,
                                                         uint64_t planes, uint64_t channels, uint64_t inner,
                                                         const bn_channel_t *ch)
{
    for (uint64_t p = 0; p < planes; p++) {
        const bn_channel_t *c = &ch[p % channels];
        const double *d = dy + p * inner, *xs = x + p * inner;
        double *g = gx + p * inner;
        __m256d vi = _mm256_set1_pd(c->invstd), vw = _mm256_set1_pd(c->w), vs = _mm256_set1_pd(c->slope),
                vo = _mm256_set1_pd(c->offset);
        uint64_t i = 0;
        for (; i + 4 <= inner; i += 4) {
            __m256d direct = _mm256_mul_pd(_mm256_mul_pd(_mm256_loadu_pd(d + i), vi), vw);
            _mm256_storeu_pd(g + i, _mm256_add_pd(_mm256_fmadd_pd(_mm256_loadu_pd(xs + i), vs, direct), vo));
        }
        for (; i < inner; i++)
            g[i] = __builtin_fma(xs[i], c->slope, d[i] * c->invstd * c->w) + c->offset;
    }
}
#endif /* __x86_64__ */

DPS_EXPORT int dpshim_bn_backward(int dtype, uint64_t outer, uint64_t channels, uint64_t inner, const void *x,
                                  const void *dy, void *gx, const void *mean, const void *var,
                                  const void *weight, const void *gw, const void *gb, double eps,
                                  uint64_t total, int over_ranks)
{
#if defined(__x86_64__)
    if ((dtype != DP_F32 && dtype != DP_F64) || !__builtin_cpu_supports("avx2") ||
        !__builtin_cpu_supports("fma"))
        return -1;
    uint64_t n = outer * inner;
    /* one more than needed: a layer of no channels still takes part in dp_bn_stats */
    bn_channel_t *ch = malloc((channels + 1) * sizeof *ch);
    double *sums = malloc((2 * channels + 1) * sizeof *sums); /* a then b: what dp_bn_stats adds up */
    if (!ch || !sums) {
        free(ch);
        free(sums);
        return -1;
    }
    double *a = sums, *b = sums + channels;
    for (uint64_t c = 0; c < channels; c++) {
        /* the native kernel's invstd, in double, then in dtype for the direct term (the builtin,
         * with this file's -fno-math-errno: one instruction at every optimization level, where
         * sqrt is a call to libm at -O0, which the library does not link) */
        double invstd = 1.0 / __builtin_sqrt(value_at(var, dtype, c) + eps);
        ch[c].invstd = invstd;
        ch[c].w = weight ? value_at(weight, dtype, c) : 1.0;
        /* gb = sum(dy), gw = invstd * sum(dy * (x - mean)): per-sample sums of this rank */
        a[c] = value_at(gb, dtype, c) * (double)n;
        b[c] = value_at(gw, dtype, c) / invstd * (double)n;
    }
    int rc = 0;
    if (over_ranks) {
        uint64_t count = n;
        dp_tensor ta = {a, channels, DP_F64, DP_HOST, NULL}, tb = {b, channels, DP_F64, DP_HOST, NULL};
        rc = dp_bn_stats(&ta, &tb, &count);
    }
    if (rc == 0) {
        for (uint64_t c = 0; c < channels; c++) {
            /* gx -= k * (a + (x - mean) * invstd^2 * b), as gx += x * slope + offset; an empty
             * share has no element to add them to */
            double slope = 0.0, offset = 0.0;
            if (n && total) {
                double minus_k = -(ch[c].w * ch[c].invstd / (double)(n * total));
                slope = minus_k * ch[c].invstd * ch[c].invstd * b[c];
                offset = minus_k * a[c] - slope * value_at(mean, dtype, c);
            }
            ch[c].slope = slope;
            ch[c].offset = offset;
        }
        if (dtype == DP_F32)
            pass_f32(gx, dy, x, outer * channels, channels, inner, ch);
        else
            pass_f64(gx, dy, x, outer * channels, channels, inner, ch);
    }
    free(ch);
    free(sums);
    return rc;
#else
    (void)dtype, (void)outer, (void)channels, (void)inner, (void)x, (void)dy, (void)gx, (void)mean, (void)var;
    (void)weight, (void)gw, (void)gb, (void)eps, (void)total, (void)over_ranks;
    return -1;
#endif
}
