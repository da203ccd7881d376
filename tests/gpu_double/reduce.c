/* The arithmetic of the double's collectives: NCCL's datatypes, and reductions that combine the
 * ranks' inputs in rank order, each in its datatype's own arithmetic, so that every rank computes
 * bit-identical results. Half types accumulate in float and round once (to nearest even). */
#include "double.h"

#include <string.h>

static const struct {
    size_t size;
    const char *name;
} dtypes[DPS_DBL_NTYPES] = {
    {1, "int8"},   {1, "uint8"},   {4, "int32"},   {4, "uint32"},  {8, "int64"},
    {8, "uint64"}, {2, "float16"}, {4, "float32"}, {8, "float64"}, {2, "bfloat16"},
};

size_t dps_dbl_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < DPS_DBL_NTYPES ? dtypes[dtype].size : 0;
}

const char *dps_dbl_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < DPS_DBL_NTYPES ? dtypes[dtype].name : "invalid";
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
        return sign ? -v : v;
    }
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        /* A subnormal half (or zero): the 24-bit significand shifted down, rounded to even. */
        uint32_t m = mant | 0x800000, shift = (uint32_t)(14 - e);
        if (shift > 24) return (uint16_t)sign;
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)h;
}

static float bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float load_f16(const void *p, size_t i)
{
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    return f16_to_f32(h);
}

static float load_bf16(const void *p, size_t i)
{
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    return bf16_to_f32(h);
}

static void store_f16(void *p, size_t i, float v)
{
    uint16_t h = f32_to_f16(v);
    memcpy((char *)p + 2 * i, &h, 2);
}

static void store_bf16(void *p, size_t i, float v)
{
    uint16_t h = f32_to_bf16(v);
    memcpy((char *)p + 2 * i, &h, 2);
}

static float load_f32(const void *p, size_t i)
{
    float v;
    memcpy(&v, (const char *)p + 4 * i, 4);
    return v;
}

static void store_f32(void *p, size_t i, float v)
{
    memcpy((char *)p + 4 * i, &v, 4);
}

static double load_f64(const void *p, size_t i)
{
    double v;
    memcpy(&v, (const char *)p + 8 * i, 8);
    return v;
}

static void store_f64(void *p, size_t i, double v)
{
    memcpy((char *)p + 8 * i, &v, 8);
}

/* Floating types: A is the arithmetic (float for the half types), LOAD/STORE convert. Every
 * product and sum is a separate, rounded operation (the build turns off contraction to FMA). */
#define REDUCE_FLOAT(A, LOAD, STORE)                                                                         \
    for (size_t i = 0; i < n; i++) {                                                                         \
        A acc = 0;                                                                                           \
        for (int r = 0; r < nranks; r++) {                                                                   \
            A v = LOAD(in[r], i);                                                                            \
            if (scaled && scale[r]) {                                                                        \
                A s = LOAD(scale[r], 0);                                                                     \
                v = v * s;                                                                                   \
            }                                                                                                \
            if (r == 0)                                                                                      \
                acc = v;                                                                                     \
            else if (op == DPS_DBL_PROD)                                                                     \
                acc = acc * v;                                                                               \
            else if (op == DPS_DBL_MAX)                                                                      \
                acc = v > acc ? v : acc;                                                                     \
            else if (op == DPS_DBL_MIN)                                                                      \
                acc = v < acc ? v : acc;                                                                     \
            else                                                                                             \
                acc = acc + v;                                                                               \
        }                                                                                                    \
        if (op == DPS_DBL_AVG) acc = acc / (A)nranks;                                                        \
        STORE(out, i, acc);                                                                                  \
    }

/* Integer types: sums and products wrap (computed unsigned, then truncated to T); comparisons
 * and the average's division in W, T's signedness at 64 bits. */
#define REDUCE_INT(T, W)                                                                                     \
    for (size_t i = 0; i < n; i++) {                                                                         \
        uint64_t acc = 0;                                                                                    \
        W best = 0;                                                                                          \
        for (int r = 0; r < nranks; r++) {                                                                   \
            T x;                                                                                             \
            memcpy(&x, (const char *)in[r] + i * sizeof x, sizeof x);                                        \
            if (scaled && scale[r]) {                                                                        \
                T s;                                                                                         \
                memcpy(&s, scale[r], sizeof s);                                                              \
                x = (T)((uint64_t)(W)x * (uint64_t)(W)s);                                                    \
            }                                                                                                \
            W v = (W)x;                                                                                      \
            if (r == 0)                                                                                      \
                acc = (uint64_t)v, best = v;                                                                 \
            else if (op == DPS_DBL_PROD)                                                                     \
                acc *= (uint64_t)v;                                                                          \
            else if (op == DPS_DBL_MAX)                                                                      \
                best = v > best ? v : best;                                                                  \
            else if (op == DPS_DBL_MIN)                                                                      \
                best = v < best ? v : best;                                                                  \
            else                                                                                             \
                acc += (uint64_t)v;                                                                          \
        }                                                                                                    \
        T res = op == DPS_DBL_MAX || op == DPS_DBL_MIN ? (T)best : (T)acc;                                   \
        if (op == DPS_DBL_AVG) res = (T)((W)res / (W)nranks);                                                \
        memcpy((char *)out + i * sizeof res, &res, sizeof res);                                              \
    }

void dps_dbl_reduce(int dtype, int op, int nranks, const void *const *in, const void *const *scale, void *out,
                    size_t n)
{
    int scaled = op == DPS_DBL_SUM && scale;
    switch (dtype) {
    case 0:
        REDUCE_INT(int8_t, int64_t) break;
    case 1:
        REDUCE_INT(uint8_t, uint64_t) break;
    case 2:
        REDUCE_INT(int32_t, int64_t) break;
    case 3:
        REDUCE_INT(uint32_t, uint64_t) break;
    case 4:
        REDUCE_INT(int64_t, int64_t) break;
    case 5:
        REDUCE_INT(uint64_t, uint64_t) break;
    case DPS_DBL_F16:
        REDUCE_FLOAT(float, load_f16, store_f16) break;
    case 7:
        REDUCE_FLOAT(float, load_f32, store_f32) break;
    case 8:
        REDUCE_FLOAT(double, load_f64, store_f64) break;
    case DPS_DBL_BF16:
        REDUCE_FLOAT(float, load_bf16, store_bf16) break;
    }
}
