/* Element sizes and half-precision conversions for the hook ABI's dtypes, and how loops over
 * tensors are built. */
#ifndef DPS_DTYPE_H
#define DPS_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "dpshim/hooks.h"

/* A loop over a whole tensor built for the widest vectors the CPU has: the generic x86-64 build
 * (SSE2) ran such loops at a half to a quarter of the speed.
 * DPS_WIDEST_VECTORS (target_clones) chooses when the object is loaded: for the plugins, which a
 * rank that reduces opens with dlopen. Not in libdpshim.so, which every process under the
 * preload loads: the clones' resolver runs at load and calls libgcc's CPU probe, a dozen cpuid
 * instructions (each a trap to the hypervisor on a virtual machine: 72 us for the probe on the
 * development machine) and five page faults, for a shell or a compiler that never hashes a
 * tensor. There DPS_WIDEST_LAZY chooses at the first call: define `static inline
 * DPS_ALWAYS_INLINE ret name_body params` with the loop, then DPS_WIDEST_LAZY(ret, name, params,
 * args) defines name. */
#define DPS_ALWAYS_INLINE __attribute__((always_inline))
#if defined(__x86_64__)
#include <cpuid.h>
#define DPS_WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))

/* 2 with AVX-512F, 1 with AVX2, 0 without either; counted only where the OS saves the registers
 * (XCR0), as libgcc's probe does. */
static inline int dps_cpu_vector_level(void)
{
    unsigned a, b, c, d, xcr0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return 0;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(d) : "c"(0));
    if ((xcr0 & 0x6) != 0x6 || __get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if ((b & bit_AVX512F) && (xcr0 & 0xe6) == 0xe6) return 2;
    return (b & bit_AVX2) ? 1 : 0;
}

#define DPS_WIDEST_LAZY(ret, name, params, args)                                                             \
    __attribute__((target("avx512f"))) static ret name##_avx512f params                                      \
    {                                                                                                        \
        return name##_body args;                                                                             \
    }                                                                                                        \
    __attribute__((target("avx2"))) static ret name##_avx2 params                                            \
    {                                                                                                        \
        return name##_body args;                                                                             \
    }                                                                                                        \
    static ret name##_generic params                                                                         \
    {                                                                                                        \
        return name##_body args;                                                                             \
    }                                                                                                        \
    static ret name params                                                                                   \
    {                                                                                                        \
        static ret(*pick_) params;                                                                           \
        ret(*fn_) params = __atomic_load_n(&pick_, __ATOMIC_RELAXED);                                        \
        if (!fn_) {                                                                                          \
            int level_ = dps_cpu_vector_level();                                                             \
            fn_ = level_ == 2 ? name##_avx512f : level_ == 1 ? name##_avx2 : name##_generic;                 \
            __atomic_store_n(&pick_, fn_, __ATOMIC_RELAXED);                                                 \
        }                                                                                                    \
        return fn_ args;                                                                                     \
    }
#else
#define DPS_WIDEST_VECTORS
#define DPS_WIDEST_LAZY(ret, name, params, args)                                                             \
    static ret name params                                                                                   \
    {                                                                                                        \
        return name##_body args;                                                                             \
    }
#endif

static inline size_t dps_dtype_size(int32_t dtype)
{
    switch (dtype) {
    case DP_F32:
    case DP_I32:
        return 4;
    case DP_F64:
    case DP_I64:
        return 8;
    case DP_F16:
    case DP_BF16:
        return 2;
    case DP_U8:
        return 1;
    default:
        return 0;
    }
}

static inline const char *dps_dtype_name(int32_t dtype)
{
    static const char *const names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return dtype >= 0 && dtype <= DP_U8 ? names[dtype] : "invalid";
}

/* Half types are reduced in f32: MPI has no half sum, and f32 accumulation loses nothing. */
static inline int32_t dps_reduce_dtype(int32_t dtype)
{
    return dtype == DP_F16 || dtype == DP_BF16 ? DP_F32 : dtype;
}

static inline float dps_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t dps_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* round to nearest even */
    return (uint16_t)(u >> 16);
}

#if !defined(__FLT16_MAX__)
#error "dpshim needs a compiler with _Float16 (GCC >= 12 or Clang on x86-64/aarch64)"
#endif

static inline float dps_f16_to_f32(uint16_t h)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

static inline uint16_t dps_f32_to_f16(float f)
{
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

/* A rank's gradient times its weight, as every path applies it: x * scale in double, rounded
 * to the element's type once (halves through f32, as they are reduced); scale 0 gives exact zeros,
 * so a rank without samples adds nothing whatever its buffer holds. */
static inline double dps_scaled(double x, double scale)
{
    return scale == 0.0 ? 0.0 : x * scale;
}

/* Blocks of a fixed length, so that -O2 vectorizes the loops (its cost model leaves loops of an
 * unknown trip count scalar); the tail goes element by element. */
#define DPS_SCALE_BLOCK 16
#define DPS_SCALE_LOOP(n, j, body)                                                                           \
    do {                                                                                                     \
        size_t at_ = 0;                                                                                      \
        for (; at_ + DPS_SCALE_BLOCK <= (n); at_ += DPS_SCALE_BLOCK)                                         \
            for (size_t k_ = 0; k_ < DPS_SCALE_BLOCK; k_++) {                                                \
                size_t j = at_ + k_;                                                                         \
                body;                                                                                        \
            }                                                                                                \
        for (size_t j = at_; j < (n); j++)                                                                   \
            body;                                                                                            \
    } while (0)

/* buf[0..n) of dtype multiplied by scale in place, as dps_scaled. Integers are summed as they
 * are. Called on one piece at a time, as it goes into a reduction or comes out of one. */
static inline void dps_scale_in_place(void *buf, size_t n, int32_t dtype, double scale)
{
    if (scale == 1.0) return;
    switch (dtype) {
    case DP_F32: {
        float *f = buf, s = (float)scale;
        if (scale == 0.0) memset(buf, 0, n * sizeof *f);
        /* a weight exact in f32 (1/2, 1/4, ...): the f32 product is the double one rounded once,
         * bit for bit, at four times the speed */
        else if ((double)s == scale)
            DPS_SCALE_LOOP(n, j, f[j] *= s);
        else
            DPS_SCALE_LOOP(n, j, f[j] = (float)((double)f[j] * scale));
        break;
    }
    case DP_F64: {
        double *d = buf;
        if (scale == 0.0)
            memset(buf, 0, n * sizeof *d);
        else
            DPS_SCALE_LOOP(n, j, d[j] *= scale);
        break;
    }
    case DP_F16:
        for (size_t j = 0; j < n; j++) {
            uint16_t *h = buf;
            h[j] = dps_f32_to_f16((float)dps_scaled(dps_f16_to_f32(h[j]), scale));
        }
        break;
    case DP_BF16:
        for (size_t j = 0; j < n; j++) {
            uint16_t *h = buf;
            h[j] = dps_f32_to_bf16((float)dps_scaled(dps_bf16_to_f32(h[j]), scale));
        }
        break;
    default:
        break;
    }
}

#endif
