/* Below both of the engine's paths (common.h): its state, tensor checks, the ready list. */
#include "common.h"

#include "core/dtype.h"

DPS_STARTUP_DATA dps_engine_t dps_e;

int dps_check_tensors(const char *hook, const dp_tensor *t, size_t n, int device_ok)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].count && !t[i].data) {
            DPS_ERROR("%s: tensor %zu (%s) has %llu elements but no data", hook, i, dps_tensor_name(&t[i]),
                      (unsigned long long)t[i].count);
            return -1;
        }
        if (!dps_dtype_size(t[i].dtype)) {
            DPS_ERROR("%s: tensor %zu (%s) has invalid dtype %d", hook, i, dps_tensor_name(&t[i]),
                      t[i].dtype);
            return -1;
        }
        if (t[i].device != DP_HOST && !device_ok) { /* the hooks sort GPU tensors out before this */
            DPS_ERROR("%s: tensor %zu (%s) is on CUDA device %d where only host tensors can go", hook, i,
                      dps_tensor_name(&t[i]), t[i].device);
            return -1;
        }
    }
    return 0;
}

int dps_ready_add(dps_ready_t *r, const dp_tensor *t, size_t bytes)
{
    if (dps_grow((void **)&r->pending, &r->cap_pending, r->npending + 1, sizeof *r->pending)) return -1;
    r->pending[r->npending++] = *t;
    r->pending_bytes += bytes;
    return 0;
}

int dps_ready_reserve(dps_ready_t *r)
{
    return dps_grow((void **)&r->handed, &r->cap_handed, r->nhanded + r->npending, sizeof *r->handed);
}

void dps_ready_handed_on(dps_ready_t *r)
{
    for (size_t i = 0; i < r->npending; i++)
        r->handed[r->nhanded++] = r->pending[i].data;
    r->npending = r->pending_bytes = 0;
}

int dps_ready_announced(const dps_ready_t *r, const void *data)
{
    for (size_t i = 0; i < r->nhanded; i++)
        if (r->handed[i] == data) return 1;
    for (size_t i = 0; i < r->npending; i++)
        if (r->pending[i].data == data) return 1;
    return 0;
}

int dps_ready_make_room(dps_ready_t *r, size_t n)
{
    return dps_grow((void **)&r->rest, &r->cap_rest, r->npending + n, sizeof *r->rest);
}

int dps_ready_complete(dps_ready_t *r, const dp_tensor *t, size_t n, size_t *m_p)
{
    if (dps_ready_make_room(r, n)) return -1;
    size_t m = 0;
    for (size_t i = 0; i < r->npending; i++)
        r->rest[m++] = r->pending[i];
    int any = dps_ready_outstanding(r); /* none announced: every tensor goes, nothing looked up */
    for (size_t i = 0; i < n; i++)
        if (!any || !dps_ready_announced(r, t[i].data)) r->rest[m++] = t[i];
    r->npending = r->pending_bytes = r->nhanded = 0;
    *m_p = m;
    return 0;
}
