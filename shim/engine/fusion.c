/* Fused collectives: many small tensors travel as one bucket, a large one in place. Bucket
 * order follows the caller's tensor order, so it is identical on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "common.h"
#include "diag/diag.h"
#include "elastic.h"
#include "guard/guard.h"

/* Where a fused collective runs: the main thread, or the progress thread on the backend's
 * background channel. Each lane has its own bucket, so both can pack at once. */
typedef struct lane {
    int background;
    int (*allreduce)(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                     int one_tensor);
    const char *(*last_error)(void);
    unsigned char *bucket;
    uint64_t seq; /* background collectives so far (the main lane's are the guard's) */
    char *err;    /* background: where a failure is described for the waiting thread */
    size_t errlen;
} lane_t;

static lane_t main_lane, bg_lane = {.background = 1};

static int in_place(const dp_tensor *t, int32_t rd, size_t es, size_t room)
{
    return rd == t->dtype && (t->count >= room / 2 || t->count * es >= DPS_INPLACE_MIN_BYTES);
}

static float load_float(const unsigned char *src, int32_t dtype, uint64_t j)
{
    switch (dtype) {
    case DP_F16:
        return dps_f16_to_f32(((const uint16_t *)src)[j]);
    case DP_BF16:
        return dps_bf16_to_f32(((const uint16_t *)src)[j]);
    default:
        return ((const float *)src)[j];
    }
}

static void store_half(unsigned char *dst, int32_t dtype, uint64_t j, float x)
{
    ((uint16_t *)dst)[j] = dtype == DP_F16 ? dps_f32_to_f16(x) : dps_f32_to_bf16(x);
}

/* Tensor elements [off, off+k) -> bucket (in the reduction dtype rd), times `pre` for a reduction. */
static void pack(unsigned char *dst, const dp_tensor *t, uint64_t off, uint64_t k, dps_fuse_t kind,
                 double pre, int32_t rd)
{
    size_t es = dps_dtype_size(t->dtype);
    const unsigned char *src = (const unsigned char *)t->data + off * es;
    float *f = (float *)dst;
    if (kind != DPS_FUSE_BCAST && (rd == DP_F16 || rd == DP_BF16)) { /* [comm] compress */
        for (uint64_t j = 0; j < k; j++)
            store_half(dst, rd, j, (float)dps_scaled(load_float(src, t->dtype, j), pre));
        return;
    }
    if (kind == DPS_FUSE_BCAST || (t->dtype != DP_F16 && t->dtype != DP_BF16)) {
        memcpy(dst, src, k * es);
        if (kind != DPS_FUSE_BCAST) dps_scale_in_place(dst, k, t->dtype, pre); /* just written: in cache */
        return;
    }
    for (uint64_t j = 0; j < k; j++)
        f[j] = (float)dps_scaled(load_float(src, t->dtype, j), pre); /* halves in f32 */
}

/* Bucket -> tensor elements [off, off+k), the reduced values times `post`. */
static void unpack(const dp_tensor *t, uint64_t off, const unsigned char *src, uint64_t k, dps_fuse_t kind,
                   int32_t rd, double post)
{
    size_t es = dps_dtype_size(t->dtype);
    unsigned char *dst = (unsigned char *)t->data + off * es;
    const float *f = (const float *)src;
    if (kind == DPS_FUSE_BCAST) {
        memcpy(dst, src, k * es);
        return;
    }
    if ((rd == DP_F16 || rd == DP_BF16) && rd != t->dtype) { /* compressed */
        for (uint64_t j = 0; j < k; j++) {
            float x = (float)dps_scaled(load_float(src, rd, j), post);
            if (t->dtype == DP_F32)
                ((float *)dst)[j] = x;
            else
                store_half(dst, t->dtype, j, x);
        }
        return;
    }
    if (rd == t->dtype) { /* a bucket of the tensor's own dtype */
        memcpy(dst, src, k * es);
        dps_scale_in_place(dst, k, t->dtype, post); /* just written: in cache */
        return;
    }
    for (uint64_t j = 0; j < k; j++)
        store_half(dst, t->dtype, j, (float)dps_scaled(f[j], post)); /* from f32 */
}

/* The main thread's collective in elastic mode: after a loss it goes on among the survivors,
 * either holding the result another survivor completed (*replayed) or running it again there (a
 * gradient sum `fixable` then weighted over the survivors' shares). */
static int run_elastic(const char *hook, const dps_backend_t *be, int coll, void *buf, size_t count,
                       int32_t dtype, dps_redop_t op, double pre, double post, int one_tensor, int fixable,
                       int *replayed)
{
    uint64_t bytes = coll == DPS_COLL_BARRIER ? 1 : count * dps_dtype_size(dtype);
    /* a loss found before this one starts */
    if (dps_elastic_recover_pending(be, hook) && dps_e.stop_at_loss) return DPS_STOPPED_AT_LOSS;
    for (;;) {
        double fixed = fixable ? post * dps_elastic_fix() : post;
        int rc = coll == DPS_COLL_BARRIER ? be->barrier()
                 : coll == DPS_COLL_BCAST ? be->bcast(buf, bytes, dps_e.bcast_root)
                                          : be->allreduce(buf, count, dtype, op, pre, fixed, one_tensor);
        if (rc == 0) dps_elastic_completed();
        if (rc != DPS_BACKEND_ABANDONED) return rc;
        unsigned char one;
        if (dps_elastic_recover(be, hook, 1, coll == DPS_COLL_BARRIER ? &one : buf, (size_t)bytes) ==
            DPS_ELASTIC_REPLAYED) {
            *replayed = 1;
            return 0;
        }
        /* not completed anywhere: a survivor one collective behind completed the one before
         * (replayed to it) and stops there, so this rank stops here */
        if (dps_e.stop_at_loss) return DPS_STOPPED_AT_LOSS;
    }
}

/* One collective on buf (one tensor, or a bucket); a reduction weights what goes in by `pre` and
 * what comes out by `post`. `fixable`: a gradient sum whose weight follows the ranks that
 * contribute (elastic mode); *replayed: its result came whole from another survivor. */
static int run(lane_t *L, const char *hook, const dps_backend_t *be, dps_fuse_t kind, void *buf, size_t count,
               int32_t dtype, dps_redop_t op, double pre, double post, int one_tensor, int fixable,
               int *replayed)
{
    uint64_t bytes = count * dps_dtype_size(dtype);
    *replayed = 0;
    if (L->background) {
        /* the guard watches the main thread, which waits for this in dp_grads */
        uint64_t t0 = dps_diag_now();
        int rc = L->allreduce(buf, count, dtype, op, pre, post, one_tensor);
        ++L->seq;
        dps_diag_background(hook, bytes, t0, dps_diag_now(), L->seq, dps_e.step);
        if (rc != 0)
            snprintf(L->err, L->errlen, "%s (background reduction #%llu): %s", hook,
                     (unsigned long long)L->seq, L->last_error());
        return rc;
    }
    int coll = kind == DPS_FUSE_BARRIER ? DPS_COLL_BARRIER
               : kind == DPS_FUSE_BCAST ? DPS_COLL_BCAST
                                        : DPS_COLL_ALLREDUCE;
    dps_guard_enter(hook, coll, dtype, count);
    uint64_t t0 = dps_diag_now();
    *replayed = 0;
    int rc = dps_elastic_on() ? run_elastic(hook, be, coll, buf, count, dtype, op, pre, post, one_tensor,
                                            fixable, replayed)
             : coll == DPS_COLL_BARRIER ? be->barrier()
             : coll == DPS_COLL_BCAST   ? be->bcast(buf, bytes, dps_e.bcast_root)
                                        : be->allreduce(buf, count, dtype, op, pre, post, one_tensor);
    dps_diag_collective(hook, bytes, t0, dps_diag_now(), dps_guard_seq(), dps_e.step);
    if (rc == DPS_STOPPED_AT_LOSS) {
        dps_guard_leave();
        return rc;
    }
    /* a failed collective leaves ranks with different values: going on would be silently wrong */
    if (rc != 0) {
        char what[600], where[96];
        dps_guard_where(where, sizeof where);
        snprintf(what, sizeof what, "%s (%s): %s%s", hook, where, be->last_error(),
                 strstr(be->last_error(), "TRUNCATE") ? " (ranks are calling different collectives: a desync)"
                                                      : "");
        dps_guard_failed(what);
    }
    dps_guard_leave();
    return 0;
}

static int32_t bucket_dtype(const dp_tensor *t, dps_fuse_t kind)
{
    if (kind == DPS_FUSE_BCAST) return t->dtype;
    if (kind == DPS_FUSE_GRADS && dps_g.compress_dtype >= 0 &&
        (t->dtype == DP_F32 || t->dtype == DP_F16 || t->dtype == DP_BF16))
        return dps_g.compress_dtype; /* gradients travel in half precision */
    return dps_reduce_dtype(t->dtype);
}

/* t[i] would be the only tensor of its bucket (the next one with elements goes elsewhere, or there
 * is none): it can go to the backend as it is. Decided from counts and dtypes, as all planning. */
static int alone(const dp_tensor *t, size_t n, size_t i, dps_fuse_t kind, int32_t rd, size_t es, size_t room)
{
    if (rd != t[i].dtype || t[i].count > room) return 0;
    size_t j = i + 1;
    while (j < n && !t[j].count)
        j++;
    return j == n || bucket_dtype(&t[j], kind) != rd || in_place(&t[j], rd, es, room) ||
           t[i].count + t[j].count > room;
}

static int fuse(lane_t *L, const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n,
                dps_fuse_t kind, dps_weight_t w, dps_redop_t op)
{
    size_t cap = dps_g.bucket_bytes;
    /* a weight every rank shares goes on the result, a rank's own on what it sends */
    double pre = kind == DPS_FUSE_BCAST || !w.per_rank ? 1.0 : w.scale;
    double post = kind == DPS_FUSE_BCAST || w.per_rank ? 1.0 : w.scale;
    if (dps_check_tensors(hook, t, n, 0)) return -1;
    /* elastic mode: a gradient sum's weight follows the ranks that contribute */
    int fixable = kind == DPS_FUSE_GRADS && (w.scale != 1.0 || w.per_rank), replayed = 0;
    if (!L->bucket && !(L->bucket = malloc(cap))) {
        DPS_ERROR("%s: cannot allocate a %zu-byte fusion bucket; lower [comm] bucket_mb", hook, cap);
        return -1;
    }
    unsigned char *bucket = L->bucket;
    size_t i = 0;
    uint64_t off = 0;
    while (i < n) {
        if (off == t[i].count) {
            i++, off = 0;
            continue;
        }
        int32_t rd = bucket_dtype(&t[i], kind);
        size_t es = dps_dtype_size(rd), room = cap / es;
        if (off == 0 && (in_place(&t[i], rd, es, room) || alone(t, n, i, kind, rd, es, room))) {
            /* large enough to travel alone, or alone in its bucket anyway: no copy, and the
             * backend weights it (piece by piece) */
            int rc = run(L, hook, be, kind, t[i].data, t[i].count, rd, op, pre, post, 1, fixable, &replayed);
            if (rc) return rc;
            i++;
            continue;
        }
        size_t first = i, used = 0;
        uint64_t first_off = off;
        while (i < n && used < room) {
            const dp_tensor *y = &t[i];
            if (off == y->count) {
                i++, off = 0;
                continue;
            }
            if (bucket_dtype(y, kind) != rd || (off == 0 && in_place(y, rd, es, room) && used)) break;
            uint64_t k = y->count - off < room - used ? y->count - off : room - used;
            pack(bucket + used * es, y, off, k, kind, pre, rd);
            used += k, off += k;
        }
        int rc = run(L, hook, be, kind, bucket, used, rd, op, 1.0, 1.0, 0, 0, &replayed);
        if (rc) return rc; /* packing and unpacking weigh */
        double out = fixable && !replayed ? post * dps_elastic_fix() : post;
        for (size_t j = first, done = 0; done < used;) {
            uint64_t k = t[j].count - first_off < used - done ? t[j].count - first_off : used - done;
            if (k)
                unpack(&t[j], first_off, bucket + done * es, k, kind, rd,
                       out); /* an empty tensor may have no data */
            done += k, first_off += k;
            if (first_off == t[j].count) j++, first_off = 0;
        }
    }
    return 0;
}

int dps_barrier(const char *hook, const dps_backend_t *be)
{
    int replayed;
    return run(&main_lane, hook, be, DPS_FUSE_BARRIER, NULL, 0, DP_U8, DPS_RED_SUM, 1.0, 1.0, 0, 0,
               &replayed);
}

int dps_fused_host(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n, dps_fuse_t kind,
                   dps_weight_t w, dps_redop_t op)
{
    dps_guard_tensors(t, n);
    return fuse(&main_lane, hook, be, t, n, kind, w, op);
}

int dps_fused_background(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n,
                         dps_weight_t w, char *err, size_t errlen)
{
    bg_lane.allreduce = be->allreduce_bg, bg_lane.last_error = be->last_error_bg;
    bg_lane.err = err, bg_lane.errlen = errlen;
    int rc = fuse(&bg_lane, hook, be, t, n, DPS_FUSE_GRADS, w, DPS_RED_SUM);
    if (rc && !err[0]) snprintf(err, errlen, "%s: a tensor cannot be reduced (see the message above)", hook);
    return rc;
}
