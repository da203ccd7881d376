/* Fused collectives (shim/engine/fusion.c) against a stub backend that records every call and
 * acts as NRANKS identical ranks: bucket planning (order, splits, dtype changes, tensors that go
 * in place), scaling, half types, [comm] compress, broadcasts, integer sums, zero-count tensors,
 * unpacking, and the errors for bad tensors. The main lane's bucket is allocated once, at its
 * first use, with the bucket size of that moment: cases with another size run in a child. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "core/dtype.h"
#include "engine/engine.h"
#include "guard/guard.h"

#define NRANKS 4
#define BUCKET 64 /* bytes: 16 f32, 8 f64, 32 halves per bucket */

/* --- the stub backend ---------------------------------------------------------------------- */

typedef struct call {
    char kind;    /* 'a' allreduce, 'g' background allreduce, 'b' bcast, 'r' barrier */
    void *buf;    /* what the backend was given */
    size_t count; /* elements; bcast: bytes */
    int dtype;    /* bcast, barrier: -1 */
    dps_redop_t op;
    double pre, post; /* the weights the backend was asked to apply */
    int one_tensor;
    unsigned char data[1 << 12]; /* the buffer as the backend received it (its head) */
} call_t;

static call_t calls[64];
static size_t ncalls;
static int fail_calls; /* the backend fails from now on */

static void record(char kind, void *buf, size_t count, int dtype, dps_redop_t op, size_t bytes)
{
    if (ncalls == sizeof calls / sizeof *calls) abort(); /* more calls than any case makes */
    call_t *c = &calls[ncalls++];
    c->kind = kind, c->buf = buf, c->count = count, c->dtype = dtype, c->op = op;
    memcpy(c->data, buf, bytes < sizeof c->data ? bytes : sizeof c->data);
}

/* NRANKS identical ranks: a sum is NRANKS times the value (half types added in f32 and rounded
 * back, as the mpi backend's reduction does); MIN and MAX leave it. */
static int stub_reduce(char kind, void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                       int one_tensor)
{
    if (op == DPS_RED_SUM) dps_scale_in_place(buf, count, dtype, pre); /* as the mpi backend, per piece */
    record(kind, buf, count, dtype, op, count * dps_dtype_size(dtype));
    calls[ncalls - 1].pre = pre, calls[ncalls - 1].post = post, calls[ncalls - 1].one_tensor = one_tensor;
    if (fail_calls) return -1;
    if (op != DPS_RED_SUM) return 0;
    for (size_t j = 0; j < count; j++)
        switch (dtype) {
        case DP_F32:
            ((float *)buf)[j] *= NRANKS;
            break;
        case DP_F64:
            ((double *)buf)[j] *= NRANKS;
            break;
        case DP_F16:
            ((uint16_t *)buf)[j] = dps_f32_to_f16(dps_f16_to_f32(((uint16_t *)buf)[j]) * NRANKS);
            break;
        case DP_BF16:
            ((uint16_t *)buf)[j] = dps_f32_to_bf16(dps_bf16_to_f32(((uint16_t *)buf)[j]) * NRANKS);
            break;
        case DP_I32:
            ((int32_t *)buf)[j] *= NRANKS;
            break;
        case DP_I64:
            ((int64_t *)buf)[j] *= NRANKS;
            break;
        case DP_U8:
            ((uint8_t *)buf)[j] = (uint8_t)(((uint8_t *)buf)[j] * NRANKS);
            break;
        default:
            abort();
        }
    dps_scale_in_place(buf, count, dtype, post);
    return 0;
}
static int stub_allreduce(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                          int one_tensor)
{
    return stub_reduce('a', buf, count, dtype, op, pre, post, one_tensor);
}
static int stub_allreduce_bg(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                             int one_tensor)
{
    return stub_reduce('g', buf, count, dtype, op, pre, post, one_tensor);
}

/* Rank 0's bytes as another rank receives them: ours, each XORed with BCAST_XOR, so that what
 * lands in a tensor can only have come out of the buffer the backend was given. */
#define BCAST_XOR 0x5a
static int stub_bcast(void *buf, size_t bytes, int root)
{
    record('b', buf, bytes, -1, DPS_RED_SUM, bytes);
    if (fail_calls || root != 0) return -1;
    for (size_t j = 0; j < bytes; j++)
        ((unsigned char *)buf)[j] ^= BCAST_XOR;
    return 0;
}
static int stub_barrier(void)
{
    if (ncalls == sizeof calls / sizeof *calls) abort();
    calls[ncalls++] = (call_t){.kind = 'r', .dtype = -1};
    return fail_calls ? -1 : 0;
}
static const char *stub_error(void)
{
    return "stub backend failure";
}

static const dps_backend_t stub = {.name = "stub",
                                   .allreduce = stub_allreduce,
                                   .bcast = stub_bcast,
                                   .barrier = stub_barrier,
                                   .last_error = stub_error,
                                   .allreduce_bg = stub_allreduce_bg,
                                   .last_error_bg = stub_error};

static void reset(void)
{
    ncalls = 0;
    fail_calls = 0;
}

/* --- helpers ------------------------------------------------------------------------------- */

/* A rank's own weight: applied to what it sends, before the reduction. */
static dps_weight_t per_rank(double scale)
{
    return (dps_weight_t){scale, 1};
}

static dp_tensor tensor(void *data, uint64_t count, int32_t dtype, const char *name)
{
    return (dp_tensor){.data = data, .count = count, .dtype = dtype, .device = DP_HOST, .name = name};
}

/* Distinct values per tensor and element, exact in f32, f64 and (for k < 8) f16: k*16 + j/4 - 3. */
static double value(int k, size_t j)
{
    return k * 16.0 + (double)(j % 32) / 4.0 - 3.0;
}

static void fill(dp_tensor *t, int k)
{
    for (size_t j = 0; j < t->count; j++) {
        double v = value(k, j);
        switch (t->dtype) {
        case DP_F32:
            ((float *)t->data)[j] = (float)v;
            break;
        case DP_F64:
            ((double *)t->data)[j] = v;
            break;
        case DP_F16:
            ((uint16_t *)t->data)[j] = dps_f32_to_f16((float)v);
            break;
        case DP_BF16:
            ((uint16_t *)t->data)[j] = dps_f32_to_bf16((float)v);
            break;
        case DP_I32:
            ((int32_t *)t->data)[j] = (int32_t)(k * 100 + (int)j - 7);
            break;
        case DP_I64:
            ((int64_t *)t->data)[j] = (int64_t)(k * 100 + (int)j - 7) * 1000000007LL;
            break;
        case DP_U8:
            ((uint8_t *)t->data)[j] = (uint8_t)(k * 10 + j);
            break;
        }
    }
}

static int same_bits(const void *a, const void *b, size_t n)
{
    return memcmp(a, b, n) == 0;
}

static float f32_at(const call_t *c, size_t j)
{
    float f;
    memcpy(&f, c->data + 4 * j, 4);
    return f;
}

static uint64_t guard_calls(uint64_t since)
{
    return dps_guard_seq() - since;
}

/* Runs fn in a child process with a fresh bucket of `bucket` bytes; 0 when it passed. */
static void in_child(const char *name, size_t bucket, void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        check_failures = check_count = 0;
        dps_g.bucket_bytes = bucket;
        fn();
        exit(check_report(name));
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork/wait for %s", name);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child status %#x", name, status);
}

/* A weight every rank shares goes on the reduced sum: the backend gets the elements as they are
 * (no pass over them before the reduction) and `post`, and each result is the sum times the
 * weight, rounded once; in a bucket (applied at unpack) and in place, f32 and a half tensor. */
static void test_shared_weight(void)
{
    float a[3], e[20];
    uint16_t h[4];
    dp_tensor t[] = {tensor(a, 3, DP_F32, "a"), tensor(e, 20, DP_F32, "e"), tensor(h, 4, DP_F16, "h")};
    enum { N = sizeof t / sizeof *t };
    unsigned char orig[N][80];
    for (int k = 0; k < N; k++)
        fill(&t[k], k), memcpy(orig[k], t[k].data, t[k].count * dps_dtype_size(t[k].dtype));
    const double scale = 1.0 / 3.0; /* not a power of two: before and after round differently */
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, N, DPS_FUSE_GRADS, (dps_weight_t){scale, 0}, DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls == 3, "%zu calls, want 3 (a alone, e in place, h packed)", ncalls);
    if (ncalls != 3) return;
    CHECK(calls[0].buf == a && calls[0].pre == 1.0 && calls[0].post == scale && calls[1].buf == e &&
              calls[1].pre == 1.0 && calls[1].post == scale,
          "a and e in place: pre %g %g post %g %g, want 1 and the weight", calls[0].pre, calls[1].pre,
          calls[0].post, calls[1].post);
    CHECK(calls[2].buf != h && calls[2].pre == 1.0 && calls[2].post == 1.0,
          "h (f16, reduced in f32) is packed and weighted at unpack, not by the backend");
    CHECK(same_bits(calls[0].data, orig[0], 3 * 4) && same_bits(calls[1].data, orig[1], 20 * 4),
          "the elements were weighted before the reduction");
    for (size_t j = 0; j < 3; j++) {
        float want = (float)(((float *)orig[0])[j] * NRANKS * scale);
        CHECK(same_bits(&a[j], &want, 4), "a[%zu] = %g, want the sum times the weight %g", j, a[j], want);
    }
    for (size_t j = 0; j < 20; j++) {
        float want = (float)(((float *)orig[1])[j] * NRANKS * scale);
        CHECK(same_bits(&e[j], &want, 4), "e[%zu] = %g, want %g", j, e[j], want);
    }
    for (size_t j = 0; j < 4; j++) {
        float sum = dps_f16_to_f32(((uint16_t *)orig[2])[j]) * NRANKS; /* reduced in f32 */
        uint16_t want = dps_f32_to_f16((float)(sum * scale));
        CHECK(h[j] == want, "h[%zu] = %#x, want %#x", j, h[j], want);
    }
}

/* --- bucket planning ----------------------------------------------------------------------- */

static void test_planning(void)
{
    float a[3], b[5], c[7], d[6], e[20], f[2], g[7];
    dp_tensor t[] = {tensor(a, 3, DP_F32, "a"), tensor(b, 5, DP_F32, "b"),  tensor(c, 7, DP_F32, "c"),
                     tensor(d, 6, DP_F32, "d"), tensor(e, 20, DP_F32, "e"), tensor(f, 2, DP_F32, "f"),
                     tensor(g, 7, DP_F32, "g")};
    enum { N = sizeof t / sizeof *t };
    float orig[N][20];
    for (int k = 0; k < N; k++)
        fill(&t[k], k), memcpy(orig[k], t[k].data, t[k].count * 4);
    const double scale = 0.5;
    reset();
    uint64_t seq = dps_guard_seq();
    CHECK(dps_fused_host("dp_grads", &stub, t, N, DPS_FUSE_GRADS, per_rank(scale), DPS_RED_SUM) == 0,
          "dps_fused failed");
    /* a b c and d's first element fill a bucket of 16; the rest of d; e in place (>= 8, half a
     * bucket), which also closes the bucket before it; f and g */
    CHECK(ncalls == 4, "%zu calls, want 4", ncalls);
    CHECK(guard_calls(seq) == 4, "the guard saw %llu collectives", (unsigned long long)guard_calls(seq));
    if (ncalls != 4) return;
    static const size_t counts[4] = {16, 5, 20, 9};
    for (int i = 0; i < 4; i++) {
        CHECK(calls[i].kind == 'a' && calls[i].count == counts[i] && calls[i].dtype == DP_F32 &&
                  calls[i].op == DPS_RED_SUM,
              "call %d: %c count %zu dtype %d, want count %zu f32", i, calls[i].kind, calls[i].count,
              calls[i].dtype, counts[i]);
    }
    CHECK(calls[2].buf == e, "e (20 elements, more than half a bucket) not reduced in place");
    /* a tensor in place is weighted by the backend, piece by piece (no pass of its own); a bucket
     * was weighted while packed */
    CHECK(calls[2].pre == scale && calls[0].pre == 1.0 && calls[1].pre == 1.0 && calls[3].pre == 1.0,
          "weights handed to the backend: %g %g %g %g, want 1 1 %g 1", calls[0].pre, calls[1].pre,
          calls[2].pre, calls[3].pre, scale);
    /* only a tensor alone may take an algorithm whose order follows the offset (the ring) */
    CHECK(calls[2].one_tensor && !calls[0].one_tensor && !calls[1].one_tensor && !calls[3].one_tensor,
          "one_tensor flags %d %d %d %d, want 0 0 1 0", calls[0].one_tensor, calls[1].one_tensor,
          calls[2].one_tensor, calls[3].one_tensor);
    CHECK(calls[0].buf == calls[1].buf && calls[1].buf == calls[3].buf, "the buckets are not one buffer");
    for (int k = 0; k < N; k++)
        CHECK((unsigned char *)calls[0].buf < (unsigned char *)t[k].data ||
                  (unsigned char *)calls[0].buf >= (unsigned char *)t[k].data + t[k].count * 4,
              "the bucket is inside tensor %d", k);
    /* what the backend got: each element times scale, in the caller's order */
    float want[20];
    size_t at = 0;
    int order[][3] = {{0, 0, 3}, {1, 0, 5}, {2, 0, 7}, {3, 0, 1}}; /* tensor, first, count */
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < order[s][2]; j++, at++) {
            float x = (float)(orig[order[s][0]][order[s][1] + j] * scale);
            CHECK(same_bits(calls[0].data + 4 * at, &x, 4), "bucket 1 element %zu: %g, want %g", at,
                  f32_at(&calls[0], at), x);
        }
    for (int j = 0; j < 5; j++) { /* d split across two buckets: the second holds d[1..6) */
        want[j] = (float)(orig[3][1 + j] * scale);
        CHECK(same_bits(calls[1].data + 4 * j, &want[j], 4), "bucket 2 element %d", j);
    }
    for (int j = 0; j < 20; j++) {
        want[j] = (float)(orig[4][j] * scale);
        CHECK(same_bits(calls[2].data + 4 * j, &want[j], 4), "e in place element %d not scaled first", j);
    }
    for (int j = 0; j < 9; j++) {
        want[j] = (float)(orig[j < 2 ? 5 : 6][j < 2 ? j : j - 2] * scale);
        CHECK(same_bits(calls[3].data + 4 * j, &want[j], 4), "bucket 4 element %d", j);
    }
    /* every tensor got its own result back */
    for (int k = 0; k < N; k++)
        for (size_t j = 0; j < t[k].count; j++) {
            float x = (float)(orig[k][j] * scale) * NRANKS, y = ((float *)t[k].data)[j];
            CHECK(same_bits(&x, &y, 4), "tensor %s[%zu] = %g, want %g", t[k].name, j, y, x);
        }
}

/* Half a bucket is the threshold: 8 f32 go in place, 7 are packed; 4 f64 in place, 3 packed. */
static void test_half_bucket(void)
{
    float a[7], b[8], c[7];
    double x[3], y[4];
    dp_tensor t[] = {tensor(a, 7, DP_F32, "a"), tensor(b, 8, DP_F32, "b"), tensor(c, 7, DP_F32, "c"),
                     tensor(x, 3, DP_F64, "x"), tensor(y, 4, DP_F64, "y")};
    for (int k = 0; k < 5; k++)
        fill(&t[k], k);
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 5, DPS_FUSE_GRADS, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls == 5, "%zu calls, want 5", ncalls);
    if (ncalls != 5) return;
    /* a, c and x would each be alone in a bucket (the next tensor goes in place or has another
     * dtype): they go as they are, no copy */
    CHECK(calls[0].count == 7 && calls[0].buf == a, "a: alone in its bucket (b goes in place), not in place");
    CHECK(calls[1].count == 8 && calls[1].buf == b, "b: in place");
    CHECK(calls[2].count == 7 && calls[2].dtype == DP_F32 && calls[2].buf == c,
          "c: alone (x is f64), not in place");
    CHECK(calls[3].count == 3 && calls[3].dtype == DP_F64 && calls[3].buf == x, "x: alone, not in place");
    CHECK(calls[4].count == 4 && calls[4].dtype == DP_F64 && calls[4].buf == y, "y: in place");
    for (int j = 0; j < 4; j++)
        CHECK(y[j] == value(4, (size_t)j) * NRANKS, "y[%d] = %g", j, y[j]);
    for (int j = 0; j < 7; j++)
        CHECK(c[j] == (float)value(2, (size_t)j) * NRANKS, "c[%d] = %g", j, c[j]);
}

/* A change of reduction dtype starts a new bucket; half types share f32's. */
static void test_dtype_change(void)
{
    float a[3], e[2];
    double b[2], c[1];
    int32_t d[4];
    uint16_t h[3], bf[4];
    dp_tensor t[] = {tensor(a, 3, DP_F32, "a"),   tensor(b, 2, DP_F64, "b"), tensor(c, 1, DP_F64, "c"),
                     tensor(d, 4, DP_I32, "d"),   tensor(h, 3, DP_F16, "h"), tensor(e, 2, DP_F32, "e"),
                     tensor(bf, 4, DP_BF16, "bf")};
    enum { N = sizeof t / sizeof *t };
    for (int k = 0; k < N; k++)
        fill(&t[k], k);
    uint16_t h0[3], bf0[4]; /* as rounded to their type by fill */
    memcpy(h0, h, sizeof h), memcpy(bf0, bf, sizeof bf);
    reset();
    CHECK(dps_fused_host("dp_metric", &stub, t, N, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    static const struct {
        size_t count;
        int dtype;
    } want[] = {{3, DP_F32}, {3, DP_F64}, {4, DP_I32}, {9, DP_F32}};
    CHECK(ncalls == 4, "%zu calls, want 4", ncalls);
    for (size_t i = 0; i < 4 && i < ncalls; i++)
        CHECK(calls[i].count == want[i].count && calls[i].dtype == want[i].dtype,
              "call %zu: count %zu dtype %d", i, calls[i].count, calls[i].dtype);
    /* the f16, f32 and bf16 bucket: halves widened to f32 before the reduction */
    if (ncalls == 4)
        for (size_t j = 0; j < 9; j++) {
            double v = j < 3 ? dps_f16_to_f32(h0[j]) : j < 5 ? value(5, j - 3) : dps_bf16_to_f32(bf0[j - 5]);
            CHECK(f32_at(&calls[3], j) == (float)v, "mixed bucket element %zu: %g, want %g", j,
                  f32_at(&calls[3], j), v);
        }
    for (int j = 0; j < 3; j++)
        CHECK(h[j] == dps_f32_to_f16(dps_f16_to_f32(h0[j]) * NRANKS), "h[%d]", j);
    for (int j = 0; j < 4; j++)
        CHECK(bf[j] == dps_f32_to_bf16(dps_bf16_to_f32(bf0[j]) * NRANKS), "bf[%d]", j);
    for (int j = 0; j < 2; j++)
        CHECK(b[j] == value(1, (size_t)j) * NRANKS, "b[%d]", j);
    CHECK(c[0] == value(2, 0) * NRANKS, "c[0]");
    for (int j = 0; j < 4; j++)
        CHECK(d[j] == (3 * 100 + j - 7) * NRANKS, "d[%d] = %d", j, d[j]);
}

/* Half types are reduced in f32 and rounded back: never in place, in pieces of a bucket. */
static void test_half_types(void)
{
    uint16_t h[40], bf[5];
    dp_tensor t[] = {tensor(h, 40, DP_F16, "h"), tensor(bf, 5, DP_BF16, "bf")};
    fill(&t[0], 1), fill(&t[1], 2);
    uint16_t h0[40], bf0[5];
    memcpy(h0, h, sizeof h), memcpy(bf0, bf, sizeof bf);
    const double scale = 1.0 / 3.0;
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 2, DPS_FUSE_GRADS, per_rank(scale), DPS_RED_SUM) == 0,
          "dps_fused failed");
    /* 40 + 5 halves as f32, 16 a bucket: 16, 16, 8 + 5 */
    CHECK(ncalls == 3, "%zu calls, want 3", ncalls);
    for (size_t i = 0; i < ncalls; i++)
        CHECK(calls[i].dtype == DP_F32 && calls[i].buf != h && calls[i].count == (i < 2 ? 16u : 13u),
              "call %zu: dtype %d count %zu", i, calls[i].dtype, calls[i].count);
    if (ncalls == 3) {
        float x = (float)(dps_f16_to_f32(h0[17]) * scale);
        CHECK(same_bits(calls[1].data + 4, &x, 4), "h[17] sent as %g, want %g", f32_at(&calls[1], 1), x);
        x = (float)(dps_bf16_to_f32(bf0[0]) * scale);
        CHECK(same_bits(calls[2].data + 4 * 8, &x, 4), "bf[0] sent as %g, want %g", f32_at(&calls[2], 8), x);
    }
    for (int j = 0; j < 40; j++) {
        uint16_t w = dps_f32_to_f16((float)(dps_f16_to_f32(h0[j]) * scale) * NRANKS);
        CHECK(h[j] == w, "h[%d] = %#x, want %#x", j, h[j], w);
    }
    for (int j = 0; j < 5; j++) {
        uint16_t w = dps_f32_to_bf16((float)(dps_bf16_to_f32(bf0[j]) * scale) * NRANKS);
        CHECK(bf[j] == w, "bf[%d] = %#x, want %#x", j, bf[j], w);
    }
}

/* --- scaling ------------------------------------------------------------------------------- */

static void test_scale_zero(void)
{
    const float fsp[] = {NAN, INFINITY, -INFINITY, -0.0f, 1.0f, -3.5f, 1e30f};
    float a[7], big[10];
    double b[7];
    uint16_t h[7], bf[7];
    for (int j = 0; j < 7; j++) {
        a[j] = fsp[j], b[j] = fsp[j], h[j] = dps_f32_to_f16(fsp[j]), bf[j] = dps_f32_to_bf16(fsp[j]);
        big[j] = fsp[j];
    }
    big[7] = NAN, big[8] = -INFINITY, big[9] = -0.0f;
    double bigd[4] = {NAN, -INFINITY, INFINITY, -0.0};
    dp_tensor t[] = {tensor(a, 7, DP_F32, "a"), tensor(big, 10, DP_F32, "big"),
                     tensor(b, 7, DP_F64, "b"), tensor(bigd, 4, DP_F64, "bigd"),
                     tensor(h, 7, DP_F16, "h"), tensor(bf, 7, DP_BF16, "bf")};
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 6, DPS_FUSE_GRADS, per_rank(0.0), DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls >= 4 && calls[1].buf == big && calls[3].buf == bigd,
          "big and bigd were not reduced in place");
    /* exact +0: no NaN, no infinity, no -0 */
    static const unsigned char zeros[80];
    CHECK(same_bits(a, zeros, sizeof a), "a is not all +0");
    CHECK(same_bits(big, zeros, sizeof big), "big (in place) is not all +0");
    CHECK(same_bits(b, zeros, sizeof b), "b is not all +0");
    CHECK(same_bits(bigd, zeros, sizeof bigd), "bigd (in place) is not all +0");
    CHECK(same_bits(h, zeros, sizeof h), "h is not all +0");
    CHECK(same_bits(bf, zeros, sizeof bf), "bf is not all +0");
    /* the zeros were made before the reduction, not by it */
    for (size_t i = 0; i < ncalls; i++)
        CHECK(same_bits(calls[i].data, zeros, calls[i].count * dps_dtype_size(calls[i].dtype)),
              "call %zu sent something other than zeros", i);
}

static void test_scale_one_and_ops(void)
{
    /* scale 1: the bytes as they are, NaN payloads included; MIN and MAX leave the values */
    float a[4] = {1.5f, -2.0f, NAN, INFINITY}, big[12];
    for (int j = 0; j < 12; j++)
        big[j] = (float)j - 5.25f;
    float a0[4], big0[12];
    memcpy(a0, a, sizeof a), memcpy(big0, big, sizeof big);
    dp_tensor t[] = {tensor(a, 4, DP_F32, "a"), tensor(big, 12, DP_F32, "big")};
    for (int op = DPS_RED_MIN; op <= DPS_RED_MAX; op++) {
        reset();
        CHECK(dps_fused_host("dp_metric", &stub, t, 2, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, (dps_redop_t)op) ==
                  0,
              "dps_fused failed");
        CHECK(ncalls == 2 && calls[0].op == (dps_redop_t)op && calls[1].op == (dps_redop_t)op,
              "op %d not passed on", op);
        CHECK(ncalls == 2 && same_bits(calls[0].data, a0, sizeof a0) &&
                  same_bits(calls[1].data, big0, sizeof big0),
              "op %d: scale 1 changed what was sent", op);
        CHECK(same_bits(a, a0, sizeof a) && same_bits(big, big0, sizeof big), "op %d changed the values", op);
    }
    /* a plain all-reduce with a scale (dp_metric's mean) scales like gradients */
    reset();
    CHECK(dps_fused_host("dp_metric", &stub, t, 1, DPS_FUSE_ALLREDUCE, per_rank(0.25), DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(a[0] == 1.5f && a[1] == -2.0f && isnan(a[2]) && a[3] == INFINITY,
          "mean of identical ranks: %g %g %g %g", a[0], a[1], a[2], a[3]);
}

/* Integers are summed as they are, whatever the scale; in a bucket and in place. */
static void test_integers(void)
{
    int32_t a[3], big[8];
    int64_t b[2];
    uint8_t c[5];
    dp_tensor t[] = {tensor(a, 3, DP_I32, "a"), tensor(b, 2, DP_I64, "b"), tensor(c, 5, DP_U8, "c"),
                     tensor(big, 8, DP_I32, "big")};
    for (int k = 0; k < 4; k++)
        fill(&t[k], k);
    int32_t a0[3], big0[8];
    int64_t b0[2];
    uint8_t c0[5];
    memcpy(a0, a, sizeof a), memcpy(b0, b, sizeof b), memcpy(c0, c, sizeof c), memcpy(big0, big, sizeof big);
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 4, DPS_FUSE_GRADS, per_rank(0.5), DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls == 4, "%zu calls, want 4", ncalls);
    if (ncalls == 4) {
        CHECK(calls[0].dtype == DP_I32 && same_bits(calls[0].data, a0, sizeof a0), "a was scaled");
        CHECK(calls[1].dtype == DP_I64 && same_bits(calls[1].data, b0, sizeof b0), "b was scaled");
        CHECK(calls[2].dtype == DP_U8 && same_bits(calls[2].data, c0, sizeof c0), "c was scaled");
        CHECK(calls[3].buf == big && same_bits(calls[3].data, big0, sizeof big0),
              "big: not in place, or scaled");
    }
    for (int j = 0; j < 3; j++)
        CHECK(a[j] == a0[j] * NRANKS, "a[%d] = %d", j, a[j]);
    for (int j = 0; j < 2; j++)
        CHECK(b[j] == b0[j] * NRANKS, "b[%d] = %lld", j, (long long)b[j]);
    for (int j = 0; j < 5; j++)
        CHECK(c[j] == (uint8_t)(c0[j] * NRANKS), "c[%d] = %d", j, c[j]);
    for (int j = 0; j < 8; j++)
        CHECK(big[j] == big0[j] * NRANKS, "big[%d] = %d", j, big[j]);
}

/* --- broadcast ----------------------------------------------------------------------------- */

static void test_broadcast(void)
{
    float f[3] = {NAN, -0.0f, 1.25f};
    double d[2] = {-INFINITY, 3.0};
    uint16_t h[3] = {0x7e01, 0x8000, 0x3c00},
             bf[3] = {0x7fc1, 0xff80, 0x3f80}; /* NaN payloads, -0, -inf, 1 */
    int32_t i[2] = {-1, 123456};
    int64_t l[2] = {INT64_MIN, 42};
    uint8_t u[5] = {0, 1, 0x5a, 0xa5, 255}, big[40];
    for (int j = 0; j < 40; j++)
        big[j] = (uint8_t)(j * 7);
    dp_tensor t[] = {tensor(f, 3, DP_F32, "f"),    tensor(d, 2, DP_F64, "d"),    tensor(h, 3, DP_F16, "h"),
                     tensor(bf, 3, DP_BF16, "bf"), tensor(i, 2, DP_I32, "i"),    tensor(l, 2, DP_I64, "l"),
                     tensor(u, 5, DP_U8, "u"),     tensor(big, 40, DP_U8, "big")};
    enum { N = sizeof t / sizeof *t };
    unsigned char orig[N][64];
    for (int k = 0; k < N; k++)
        memcpy(orig[k], t[k].data, t[k].count * dps_dtype_size(t[k].dtype));
    reset();
    uint64_t seq = dps_guard_seq();
    /* the scale never applies to a broadcast (0 would zero every float) */
    CHECK(dps_fused_host("dp_params", &stub, t, N, DPS_FUSE_BCAST, per_rank(0.0), DPS_RED_SUM) == 0,
          "dps_fused failed");
    /* every dtype its own bucket (f16 and bf16 included: bytes are not widened), big in place */
    CHECK(ncalls == N, "%zu calls, want %d", ncalls, N);
    CHECK(guard_calls(seq) == ncalls, "the guard saw %llu collectives", (unsigned long long)guard_calls(seq));
    for (size_t k = 0; k < ncalls && k < N; k++) {
        size_t bytes = t[k].count * dps_dtype_size(t[k].dtype);
        CHECK(calls[k].kind == 'b' && calls[k].count == bytes, "call %zu: %c %zu bytes, want %zu", k,
              calls[k].kind, calls[k].count, bytes);
        CHECK(same_bits(calls[k].data, orig[k], bytes), "%s: the bytes sent were changed", t[k].name);
        unsigned char want[64];
        for (size_t j = 0; j < bytes; j++)
            want[j] = orig[k][j] ^ BCAST_XOR;
        CHECK(same_bits(t[k].data, want, bytes), "%s: not rank 0's bytes after the broadcast", t[k].name);
    }
    CHECK(ncalls == N && calls[N - 1].buf == big, "big (a bucket's size) not broadcast in place");
    /* several small tensors of one dtype share a bucket, and one is split across two */
    float p[10], q[10];
    for (int j = 0; j < 10; j++)
        p[j] = (float)j, q[j] = (float)(100 + j);
    dp_tensor pq[] = {tensor(p, 7, DP_F32, "p"), tensor(q, 7, DP_F32, "q"), tensor(p + 7, 3, DP_F32, "p2"),
                      tensor(q + 7, 3, DP_F32, "q2")};
    float p0[10], q0[10];
    memcpy(p0, p, sizeof p), memcpy(q0, q, sizeof q);
    reset();
    CHECK(dps_fused_host("dp_params", &stub, pq, 4, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls == 2 && calls[0].count == 64 && calls[1].count == 16, "%zu calls: %zu, %zu bytes", ncalls,
          ncalls ? calls[0].count : 0, ncalls > 1 ? calls[1].count : 0);
    for (int j = 0; j < 10; j++) {
        uint32_t x, y, wx, wy;
        memcpy(&x, &p[j], 4), memcpy(&y, &q[j], 4), memcpy(&wx, &p0[j], 4), memcpy(&wy, &q0[j], 4);
        wx ^= 0x5a5a5a5au, wy ^= 0x5a5a5a5au;
        CHECK(x == wx && y == wy, "p[%d] or q[%d] not rank 0's", j, j);
    }
}

/* --- [comm] compress ----------------------------------------------------------------------- */

static uint16_t to_half(int32_t dt, float x)
{
    return dt == DP_F16 ? dps_f32_to_f16(x) : dps_f32_to_bf16(x);
}
static float from_half(int32_t dt, uint16_t h)
{
    return dt == DP_F16 ? dps_f16_to_f32(h) : dps_bf16_to_f32(h);
}

static void test_compress(int32_t cd)
{
    const char *cn = cd == DP_F16 ? "fp16" : "bf16";
    const int32_t other = cd == DP_F16 ? DP_BF16 : DP_F16;
    dps_g.compress_dtype = cd;
    float a[3], big[40], e[5];
    double d[2];
    int32_t i[2];
    uint16_t o[3], own[20],
        small[3]; /* the other half type; the compression's own type, in place and packed */
    dp_tensor t[] = {tensor(a, 3, DP_F32, "a"),  tensor(d, 2, DP_F64, "d"),    tensor(i, 2, DP_I32, "i"),
                     tensor(e, 5, DP_F32, "e"),  tensor(o, 3, other, "o"),     tensor(big, 40, DP_F32, "big"),
                     tensor(own, 20, cd, "own"), tensor(small, 3, cd, "small")};
    enum { N = sizeof t / sizeof *t };
    for (int k = 0; k < N; k++)
        fill(&t[k], k);
    unsigned char orig[N][160];
    for (int k = 0; k < N; k++)
        memcpy(orig[k], t[k].data, t[k].count * dps_dtype_size(t[k].dtype));
    const double scale = 0.5;
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, N, DPS_FUSE_GRADS, per_rank(scale), DPS_RED_SUM) == 0,
          "%s: dps_fused failed", cn);
    /* a | d | i | e o big[0..24) (32 halves) | big[24..40) | own in place (20 >= 16) | small */
    static const struct {
        size_t count;
        int dtype;
    } want[] = {{3, -2}, {2, DP_F64}, {2, DP_I32}, {32, -2}, {16, -2}, {20, -2}, {3, -2}};
    CHECK(ncalls == 7, "%s: %zu calls, want 7", cn, ncalls);
    for (size_t c = 0; c < 7 && c < ncalls; c++)
        CHECK(calls[c].count == want[c].count && calls[c].dtype == (want[c].dtype == -2 ? cd : want[c].dtype),
              "%s: call %zu: count %zu dtype %d", cn, c, calls[c].count, calls[c].dtype);
    if (ncalls == 7) {
        CHECK(calls[3].buf != big && calls[4].buf != big, "%s: an f32 tensor went in place", cn);
        CHECK(calls[6].buf == small,
              "%s: a small tensor of the compressed type, alone in its bucket, was copied", cn);
        CHECK(calls[5].buf == own, "%s: a tensor of the compressed type was not reduced in place", cn);
        /* sent: the scaled value rounded to the half type */
        float a0 = ((float *)orig[0])[1];
        uint16_t w = to_half(cd, (float)(a0 * scale)), got;
        memcpy(&got, calls[0].data + 2, 2);
        CHECK(got == w, "%s: a[1] sent as %#x, want %#x", cn, got, w);
        double d0 = ((double *)orig[1])[1];
        CHECK(same_bits(calls[1].data + 8, &(double){d0 * scale}, 8), "%s: f64 compressed or not scaled", cn);
    }
    /* received: widened back into each tensor's own dtype */
    for (int j = 0; j < 3; j++) {
        float x = from_half(
            cd, to_half(cd, from_half(cd, to_half(cd, (float)(((float *)orig[0])[j] * scale))) * NRANKS));
        CHECK(same_bits(&a[j], &x, 4), "%s: a[%d] = %g, want %g", cn, j, a[j], x);
    }
    for (int j = 0; j < 40; j++) {
        float x = from_half(
            cd, to_half(cd, from_half(cd, to_half(cd, (float)(((float *)orig[5])[j] * scale))) * NRANKS));
        CHECK(same_bits(&big[j], &x, 4), "%s: big[%d] = %g, want %g", cn, j, big[j], x);
    }
    for (int j = 0; j < 3; j++) {
        float v = from_half(other, ((uint16_t *)orig[4])[j]);
        uint16_t x = to_half(
            other, from_half(cd, to_half(cd, from_half(cd, to_half(cd, (float)(v * scale))) * NRANKS)));
        CHECK(o[j] == x, "%s: o[%d] = %#x, want %#x", cn, j, o[j], x);
    }
    for (int j = 0; j < 20; j++) {
        uint16_t x =
            to_half(cd, from_half(cd, to_half(cd, (float)(from_half(cd, ((uint16_t *)orig[6])[j]) * scale))) *
                            NRANKS);
        CHECK(own[j] == x, "%s: own[%d] = %#x, want %#x", cn, j, own[j], x);
    }
    for (int j = 0; j < 3; j++) { /* packed in a bucket of its own dtype: it comes back as it travelled */
        uint16_t x =
            to_half(cd, from_half(cd, to_half(cd, (float)(from_half(cd, ((uint16_t *)orig[7])[j]) * scale))) *
                            NRANKS);
        CHECK(small[j] == x, "%s: small[%d] = %#x, want %#x", cn, j, small[j], x);
    }
    for (int j = 0; j < 2; j++)
        CHECK(d[j] == ((double *)orig[1])[j] * scale * NRANKS, "%s: d[%d]", cn, j);
    for (int j = 0; j < 2; j++)
        CHECK(i[j] == ((int32_t *)orig[2])[j] * NRANKS, "%s: i[%d]", cn, j);

    /* only gradients are compressed: a plain all-reduce and a broadcast go as they are */
    for (int k = 0; k < N; k++)
        fill(&t[k], k);
    reset();
    CHECK(dps_fused_host("dp_metric", &stub, t, 1, DPS_FUSE_ALLREDUCE, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls == 1 && calls[0].dtype == DP_F32, "%s: a plain all-reduce was compressed", cn);
    reset();
    CHECK(dps_fused_host("dp_params", &stub, &t[5], 1, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls == 1 && calls[0].count == 160 && calls[0].buf == big, "%s: a broadcast was compressed", cn);
    dps_g.compress_dtype = -1;
}

/* --- zero-count tensors, empty lists, barriers, the background lane ------------------------ */

static void test_zero_counts(void)
{
    float a[3] = {1, 2, 3}, b[2] = {4, 5}, c[8] = {1, 1, 1, 1, 2, 2, 2, 2}, unused[1] = {9};
    /* an empty tensor may have no data, also between tensors packed in one bucket (UBSan checks
     * that nothing hands its NULL to memcpy) */
    dp_tensor t[] = {tensor(NULL, 0, DP_F32, "z0"),   tensor(a, 3, DP_F32, "a"),
                     tensor(unused, 0, DP_F64, "z1"), tensor(NULL, 0, DP_F32, "z2"),
                     tensor(b, 2, DP_F32, "b"),       tensor(unused, 0, DP_I32, "z3"),
                     tensor(c, 8, DP_F32, "c"),       tensor(NULL, 0, DP_U8, "z4")};
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 8, DPS_FUSE_GRADS, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    /* the empty f64 and i32 tensors do not split the f32 bucket */
    CHECK(ncalls == 2 && calls[0].count == 5 && calls[0].dtype == DP_F32 && calls[1].buf == c, "%zu calls",
          ncalls);
    CHECK(a[2] == 12 && b[0] == 16 && b[1] == 20 && c[7] == 8 && unused[0] == 9,
          "results of the non-empty tensors");
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 0, DPS_FUSE_GRADS, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "empty list");
    dp_tensor empty[] = {tensor(NULL, 0, DP_F32, "z"), tensor(NULL, 0, DP_BF16, "z")};
    CHECK(dps_fused_host("dp_grads", &stub, empty, 2, DPS_FUSE_GRADS, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "empty tensors");
    CHECK(dps_fused_host("dp_params", &stub, empty, 2, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "empty broadcast");
    CHECK(ncalls == 0, "%zu calls for nothing", ncalls);
}

static void test_barrier(void)
{
    reset();
    uint64_t seq = dps_guard_seq();
    CHECK(dps_barrier("dp_scope_end", &stub) == 0, "dps_barrier");
    CHECK(ncalls == 1 && calls[0].kind == 'r' && guard_calls(seq) == 1, "barrier: %zu calls", ncalls);
}

static void test_background(void)
{
    float a[3], b[20];
    dp_tensor t[] = {tensor(a, 3, DP_F32, "a"), tensor(b, 20, DP_F32, "b")};
    fill(&t[0], 0), fill(&t[1], 1);
    char err[256] = "";
    reset();
    uint64_t seq = dps_guard_seq();
    CHECK(dps_fused_background("dp_grad_ready", &stub, t, 2, per_rank(0.25), err, sizeof err) == 0,
          "background: %s", err);
    CHECK(ncalls == 2 && calls[0].kind == 'g' && calls[1].kind == 'g' && calls[1].buf == b,
          "background: %zu calls on the wrong channel", ncalls);
    CHECK(guard_calls(seq) == 0, "the background lane moved the guard");
    for (int j = 0; j < 20; j++)
        CHECK(b[j] == (float)value(1, (size_t)j), "b[%d] = %g", j, b[j]);
    /* a failure is described, not fatal */
    reset();
    fail_calls = 1;
    CHECK(dps_fused_background("dp_grad_ready", &stub, t, 1, DPS_UNWEIGHTED, err, sizeof err) == -1,
          "background failure");
    CHECK(strstr(err, "dp_grad_ready") && strstr(err, "background reduction") &&
              strstr(err, "stub backend failure"),
          "background error '%s'", err);
    reset();
    err[0] = '\0';
    dp_tensor bad = tensor(a, 3, 42, "bad");
    dps_test_capture_begin();
    int rc = dps_fused_background("dp_grad_ready", &stub, &bad, 1, DPS_UNWEIGHTED, err, sizeof err);
    dps_test_capture_end();
    CHECK(rc == -1 && strstr(err, "dp_grad_ready") && ncalls == 0, "background bad tensor: %d '%s'", rc, err);
}

/* --- bad tensors --------------------------------------------------------------------------- */

static void expect_bad(dp_tensor bad, const char *frag)
{
    float a[3] = {1, 2, 3}, b[9] = {0};
    dp_tensor t[] = {tensor(a, 3, DP_F32, "a"), tensor(b, 9, DP_F32, "b"), bad};
    reset();
    uint64_t seq = dps_guard_seq();
    dps_test_capture_begin();
    int rc = dps_fused_host("dp_grads", &stub, t, 3, DPS_FUSE_GRADS, per_rank(0.5), DPS_RED_SUM);
    const char *msg = dps_test_capture_end();
    CHECK(rc == -1, "%s: returned %d", frag, rc);
    CHECK(ncalls == 0 && guard_calls(seq) == 0, "%s: %zu collectives before the error", frag, ncalls);
    CHECK(a[0] == 1 && a[2] == 3 && b[0] == 0, "%s: tensors touched", frag);
    CHECK(strstr(msg, "ERROR") && strstr(msg, "dp_grads") && strstr(msg, "tensor 2") && strstr(msg, frag),
          "message '%s' lacks '%s'", msg, frag);
}

static void test_bad_tensors(void)
{
    float x[4];
    expect_bad(tensor(x, 4, 7, "w"), "(w) has invalid dtype 7");
    expect_bad(tensor(x, 4, -1, NULL), "(unnamed) has invalid dtype -1");
    expect_bad(tensor(x, 0, 99, "empty"), "invalid dtype 99");
    expect_bad(tensor(NULL, 5, DP_F32, "nodata"), "(nodata) has 5 elements but no data");
    /* a GPU tensor beside host ones: the bad one is still found before any collective */
    dp_tensor dev = tensor(x, 4, 42, "gpu");
    dev.device = 0;
    expect_bad(dev, "(gpu) has invalid dtype 42");
    dev.device = 3, dev.dtype = DP_F32, dev.data = NULL;
    expect_bad(dev, "(gpu) has 4 elements but no data");
}

/* A failed collective ends the process (exit 70): going on would leave ranks different. */
static void fail_allreduce(void)
{
    float a[3] = {1, 2, 3};
    dp_tensor t = tensor(a, 3, DP_F32, "a");
    fail_calls = 1;
    dps_fused_host("dp_grads", &stub, &t, 1, DPS_FUSE_GRADS, DPS_UNWEIGHTED, DPS_RED_SUM);
    _exit(0); /* not reached */
}
static void fail_bcast(void)
{
    float a[30] = {0};
    dp_tensor t = tensor(a, 30, DP_F32, "a");
    fail_calls = 1;
    dps_fused_host("dp_params", &stub, &t, 1, DPS_FUSE_BCAST, DPS_UNWEIGHTED, DPS_RED_SUM);
    _exit(0);
}

static void expect_fatal(void (*fn)(void), const char *frag)
{
    int pipefd[2];
    CHECK(pipe(pipefd) == 0, "pipe");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        fn();
    }
    close(pipefd[1]);
    char msg[1024] = "";
    size_t n = 0;
    ssize_t k;
    while (n < sizeof msg - 1 && (k = read(pipefd[0], msg + n, sizeof msg - 1 - n)) > 0)
        n += (size_t)k;
    close(pipefd[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "wait");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == DPS_EXIT_FATAL, "%s: status %#x, want exit %d", frag,
          status, DPS_EXIT_FATAL);
    CHECK(strstr(msg, frag) && strstr(msg, "stub backend failure"), "fatal message '%s' lacks '%s'", msg,
          frag);
}

/* --- the DPS_INPLACE_MIN_BYTES rule, with a bucket so large that half of it is more ---------- */

static void big_bucket(void)
{
    enum { ELEMS = DPS_INPLACE_MIN_BYTES / 4 };
    float *a = malloc(ELEMS * sizeof *a), *b = malloc((ELEMS - 1) * sizeof *b), c[5];
    if (!a || !b) abort();
    for (size_t j = 0; j < ELEMS; j++)
        a[j] = 1.0f;
    for (size_t j = 0; j < ELEMS - 1; j++)
        b[j] = 2.0f;
    dp_tensor t[] = {tensor(c, 5, DP_F32, "c"), tensor(b, ELEMS - 1, DP_F32, "b"),
                     tensor(a, ELEMS, DP_F32, "a")};
    fill(&t[0], 0);
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 3, DPS_FUSE_GRADS, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    /* 1 MiB bucket, half is 512 KiB: b (256 KiB - 4) is packed with c, a (256 KiB) goes in place */
    CHECK(ncalls == 2, "%zu calls, want 2", ncalls);
    if (ncalls == 2) {
        CHECK(calls[0].count == ELEMS + 4 && calls[0].buf != b, "c and b: count %zu", calls[0].count);
        CHECK(calls[1].count == ELEMS && calls[1].buf == a, "a: count %zu, not in place", calls[1].count);
    }
    CHECK(a[ELEMS - 1] == NRANKS && b[0] == 2 * NRANKS && b[ELEMS - 2] == 2 * NRANKS, "results");
    free(a), free(b);
}

/* A bucket of 256 bytes: 64 f32, so many small tensors travel in one call. */
static void bucket_256(void)
{
    float v[60][1];
    dp_tensor t[60];
    for (int k = 0; k < 60; k++)
        v[k][0] = (float)k, t[k] = tensor(v[k], 1, DP_F32, "v");
    reset();
    CHECK(dps_fused_host("dp_grads", &stub, t, 60, DPS_FUSE_GRADS, DPS_UNWEIGHTED, DPS_RED_SUM) == 0,
          "dps_fused failed");
    CHECK(ncalls == 1 && calls[0].count == 60, "%zu calls", ncalls);
    for (int k = 0; k < 60; k++)
        CHECK(v[k][0] == (float)(k * NRANKS), "v[%d] = %g", k, v[k][0]);
}

int main(void)
{
    dps_g.eff_size = NRANKS, dps_g.eff_rank = 0;
    dps_g.compress_dtype = -1;

    in_child("test_fusion 1 MiB bucket", 1u << 20, big_bucket);
    in_child("test_fusion 256-byte bucket", 256, bucket_256);

    dps_g.bucket_bytes = BUCKET;
    test_planning();
    test_shared_weight();
    test_half_bucket();
    test_dtype_change();
    test_half_types();
    test_scale_zero();
    test_scale_one_and_ops();
    test_integers();
    test_broadcast();
    test_compress(DP_F16);
    test_compress(DP_BF16);
    test_zero_counts();
    test_barrier();
    test_background();
    test_bad_tensors();
    expect_fatal(fail_allreduce, "dp_grads (collective #");
    expect_fatal(fail_bcast, "dp_params (collective #");
    return check_report("test_fusion");
}
