/* Every hook of ABI v1 checked on real ranks: each rank feeds rank-dependent data and checks the
 * result it gets back against the arithmetic the ABI promises. Run under mpirun with
 * LD_PRELOAD=libdpshim.so; exits non-zero and names the failing check otherwise. The policy in
 * the environment (DPSHIM_DATA_MODE, DPSHIM_BN_SYNC) selects which promise applies. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

static int failures, checks, rank, size;

#define EXPECT(cond, ...)                                                                                    \
    do {                                                                                                     \
        checks++;                                                                                            \
        if (!(cond)) {                                                                                       \
            failures++;                                                                                      \
            fprintf(stderr, "hook_check rank %d: line %d: ", rank, __LINE__);                                \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)

static int env_is(const char *name, const char *v)
{
    const char *e = getenv(name);
    return e && strcmp(e, v) == 0;
}

static uint16_t to_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static float from_f16(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}
static uint16_t to_bf16(float f) /* exact for the small integers used here */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A set of tensors of every dtype, and one large enough to bypass the fusion bucket. */
#define BIG (3u << 20) /* 12 MiB of f32: above any small [comm] bucket_mb */
typedef struct {
    float f32[37], *big;
    double f64[5];
    int32_t i32[3];
    int64_t i64[2];
    uint16_t f16[9], bf16[9];
    uint8_t u8[4];
    dp_tensor t[8];
} set_t;

static void set_init(set_t *s, double v)
{
    for (int i = 0; i < 37; i++)
        s->f32[i] = (float)v;
    for (unsigned i = 0; i < BIG; i++)
        s->big[i] = (float)v;
    for (int i = 0; i < 5; i++)
        s->f64[i] = v;
    for (int i = 0; i < 3; i++)
        s->i32[i] = (int32_t)v;
    for (int i = 0; i < 2; i++)
        s->i64[i] = (int64_t)v;
    for (int i = 0; i < 9; i++)
        s->f16[i] = to_f16((float)v), s->bf16[i] = to_bf16((float)v);
    for (int i = 0; i < 4; i++)
        s->u8[i] = (uint8_t)v;
    dp_tensor t[8] = {{s->f32, 37, DP_F32, DP_HOST, "f32"},   {s->big, BIG, DP_F32, DP_HOST, "big"},
                      {s->f64, 5, DP_F64, DP_HOST, "f64"},    {s->i32, 3, DP_I32, DP_HOST, "i32"},
                      {s->i64, 2, DP_I64, DP_HOST, "i64"},    {s->f16, 9, DP_F16, DP_HOST, "f16"},
                      {s->bf16, 9, DP_BF16, DP_HOST, "bf16"}, {s->u8, 4, DP_U8, DP_HOST, "u8"}};
    memcpy(s->t, t, sizeof t);
}

/* Every element of the float tensors equals v (within tol); integers exactly iv. */
static void set_expect(const set_t *s, double v, double tol, int check_ints, double iv, const char *what)
{
    int bad = 0;
    for (int i = 0; i < 37; i++)
        bad |= fabs(s->f32[i] - v) > tol;
    for (unsigned i = 0; i < BIG; i++)
        bad |= fabs(s->big[i] - v) > tol;
    for (int i = 0; i < 5; i++)
        bad |= fabs(s->f64[i] - v) > tol;
    for (int i = 0; i < 9; i++)
        bad |= fabs(from_f16(s->f16[i]) - v) > fmax(tol, 1e-3 * fabs(v));
    for (int i = 0; i < 9; i++)
        bad |= fabs(from_bf16(s->bf16[i]) - v) > fmax(tol, 1e-2 * fabs(v));
    EXPECT(!bad, "%s: float tensors are not all %g (f32[0]=%g big[0]=%g f64[0]=%g f16[0]=%g bf16[0]=%g)",
           what, v, s->f32[0], s->big[0], s->f64[0], from_f16(s->f16[0]), from_bf16(s->bf16[0]));
    if (check_ints)
        EXPECT(s->i32[0] == (int32_t)iv && s->i64[1] == (int64_t)iv && s->u8[3] == (uint8_t)iv,
               "%s: integer tensors are %d %lld %d, expected %g", what, s->i32[0], (long long)s->i64[1],
               s->u8[3], iv);
}

int main(void)
{
    if (!dp_rank) {
        fprintf(stderr, "hook_check: run it with LD_PRELOAD=libdpshim.so\n");
        return 2;
    }
    rank = dp_rank(), size = dp_world_size();
    int split = !env_is("DPSHIM_DATA_MODE", "scale"), bn_sync = !env_is("DPSHIM_BN_SYNC", "off");
    const char *er = getenv("OMPI_COMM_WORLD_RANK");
    EXPECT(!er || atoi(er) == rank, "dp_rank %d but the launcher says %s", rank, er);
    EXPECT(dp_local_rank() >= 0 && dp_local_rank() < size, "dp_local_rank %d", dp_local_rank());

    uint64_t seed = 1000 + (uint64_t)rank;
    EXPECT(dp_seed(&seed) == 0 && seed == 1000, "dp_seed gave %llu, expected root's 1000",
           (unsigned long long)seed);

    set_t s;
    s.big = malloc(BIG * sizeof(float));
    set_init(&s, 10 + rank);
    EXPECT(dp_params(s.t, 8) == 0, "dp_params failed");
    set_expect(&s, 10, 0, 1, 10, "dp_params");

    double m[4] = {rank + 1, rank + 1, rank + 1, rank + 1};
    dp_metric(&m[0], 1, DP_SUM), dp_metric(&m[1], 1, DP_MEAN), dp_metric(&m[2], 1, DP_MIN),
        dp_metric(&m[3], 1, DP_MAX);
    EXPECT(m[0] == size * (size + 1) / 2.0 && fabs(m[1] - (size + 1) / 2.0) < 1e-12 && m[2] == 1 &&
               m[3] == size,
           "dp_metric sum/mean/min/max gave %g %g %g %g", m[0], m[1], m[2], m[3]);
    EXPECT(dp_metric(m, 1, 42) < 0, "dp_metric accepted op 42");

    /* a global batch of 10: shares of 10/size, contiguous, in rank order */
    uint64_t idx[10];
    for (int i = 0; i < 10; i++)
        idx[i] = 100 + i;
    size_t share = dp_batch(idx, 10);
    size_t base = 10 / (size_t)size, extra = 10 % (size_t)size, me = (size_t)rank,
           start = me * base + (me < extra ? me : extra);
    if (split)
        EXPECT(share == base + (me < extra) && idx[0] == 100 + start, "dp_batch kept %zu from %llu", share,
               (unsigned long long)idx[0]);
    else
        EXPECT(share == 10 && idx[0] == 100, "scale mode: dp_batch must keep the batch, kept %zu", share);

    /* gradients: rank r contributes r+1, weighted by its share in split mode, else the mean */
    double expect = 0;
    for (int r = 0; r < size; r++) {
        size_t sh = split ? 10 / size + (r < (int)(10 % size)) : 10;
        expect += (r + 1) * (split ? sh / 10.0 : 1.0 / size);
    }
    set_init(&s, rank + 1);
    EXPECT(dp_grads(s.t, 8) == 0, "dp_grads failed");
    set_expect(&s, expect, 1e-5, 1, size * (size + 1) / 2.0, "dp_grads");

    /* announced tensors are reduced once, whether their bucket left early or with dp_grads */
    set_init(&s, rank + 1);
    dp_grad_ready(&s.t[1]);
    dp_grad_ready(&s.t[0]);
    dp_grad_ready(&s.t[5]);
    EXPECT(dp_grads(s.t, 8) == 0, "dp_grads after dp_grad_ready failed");
    set_expect(&s, expect, 1e-5, 1, size * (size + 1) / 2.0, "dp_grad_ready + dp_grads");
    dp_step_end(1);

    /* integers are summed as they are: bytes wrap modulo 256 as on a GPU (enough of them that
     * a vectorized reduction is used) */
    uint8_t bytes[64];
    memset(bytes, 200 + rank, sizeof bytes);
    dp_tensor tb = {bytes, sizeof bytes, DP_U8, DP_HOST, "bytes"};
    unsigned wrapped = 0;
    for (int r = 0; r < size; r++)
        wrapped += 200u + (unsigned)r;
    EXPECT(dp_grads(&tb, 1) == 0 && bytes[0] == (uint8_t)wrapped && bytes[63] == (uint8_t)wrapped,
           "a byte sum gave %u, expected %u (modulo 256)", bytes[0], wrapped & 255);

    double sum[3] = {rank + 1, rank + 1, rank + 1}, sq[3] = {2.0 * (rank + 1), 0, 0};
    uint64_t count = (uint64_t)rank + 1;
    dp_tensor ts = {sum, 3, DP_F64, DP_HOST, "sum"}, tq = {sq, 3, DP_F64, DP_HOST, "sumsq"};
    EXPECT(dp_bn_stats(&ts, &tq, &count) == 0, "dp_bn_stats failed");
    double tot = bn_sync ? size * (size + 1) / 2.0 : rank + 1;
    EXPECT(sum[2] == tot && sq[0] == 2 * tot && count == (uint64_t)tot,
           "dp_bn_stats (sync %s) gave sum %g sumsq %g count %llu, expected %g", bn_sync ? "on" : "off",
           sum[2], sq[0], (unsigned long long)count, tot);

    /* rank-0 scope: the body runs on rank 0 alone, and its collectives act as world size 1 */
    int in = dp_scope_begin("save");
    EXPECT(in == (rank == 0), "dp_scope_begin returned %d", in);
    if (in) {
        double v = 5;
        dp_metric(&v, 1, DP_SUM);
        EXPECT(v == 5, "dp_metric inside a rank-0 scope gave %g", v);
    }
    EXPECT(dp_scope_end() == 0, "dp_scope_end failed");
    EXPECT(dp_scope_end() < 0, "an unbalanced dp_scope_end was accepted");
    double after = 1;
    dp_metric(&after, 1, DP_SUM);
    EXPECT(after == size, "collectives after the scope gave %g", after);

    free(s.big);
    printf("hook_check rank %d of %d: %d checks, %d failed\n", rank, size, checks, failures);
    return failures ? 1 : 0;
}
