/* The hooks' error returns: a NULL list and lists the shim cannot track are refused with a
 * message naming the hook, never -1 alone (and never a SIGSEGV). Runs against the engine with a
 * stub backend standing for a two-rank job. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "core/dps.h"
#include "dpshim/hooks.h"
#include "engine/engine.h"

/* A huge list makes the hooks' own arrays fail to grow: under ASan or TSan that must be NULL, not
 * a report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
    return "allocator_may_return_null=1";
}

static int stub_calls;
static int stub_allreduce(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                          int one_tensor)
{
    (void)buf, (void)count, (void)dtype, (void)op, (void)pre, (void)post, (void)one_tensor;
    return ++stub_calls, 0;
}
static int roots[8], nroots; /* the roots of the broadcasts so far */
static int stub_bcast(void *buf, size_t bytes, int root)
{
    (void)buf, (void)bytes;
    if (nroots < 8) roots[nroots++] = root;
    return ++stub_calls, 0;
}
static const char *stub_error(void)
{
    return "";
}
static const dps_backend_t stub = {
    .name = "stub", .allreduce = stub_allreduce, .bcast = stub_bcast, .last_error = stub_error};

static dp_tensor one = {NULL, 0, DP_F32, DP_HOST, "empty"};
static int grads_null(void)
{
    return dp_grads(NULL, 3);
}
static int params_null(void)
{
    return dp_params(NULL, 2);
}
static int ready_null(void)
{
    return dp_grad_ready(NULL);
}
static int seed_null(void)
{
    return dp_seed(NULL);
}
static int metric_null(void)
{
    return dp_metric(NULL, 4, DP_SUM);
}
static int bn_null(void)
{
    return dp_bn_stats(&one, &one, NULL);
}
static int owners_null(void)
{
    return dp_from_owners(&one, 1, NULL);
}
static int owners_outside(void)
{
    int32_t owner[2] = {0, 2};
    dp_tensor t[2] = {one, one};
    return dp_from_owners(t, 2, owner);
}
static int grads_huge(void)
{
    return dp_grads(&one, (size_t)1 << 44);
}

typedef struct row {
    const char *name;
    int (*call)(void);
    const char *message;
} row_t;

static void expect_refused(const row_t *r)
{
    int calls = stub_calls;
    dps_test_capture_begin();
    int rc = r->call();
    const char *text = dps_test_capture_end();
    CHECK(rc == -1, "%s returned %d, expected -1", r->name, rc);
    CHECK(strstr(text, r->message) != NULL, "%s: message '%s' not in: %s", r->name, r->message, text);
    CHECK(stub_calls == calls, "%s reached the backend", r->name);
}

int main(void)
{
    /* a two-rank job whose backend is already open */
    dps_g.size = dps_g.eff_size = 2;
    dps_g.rank = dps_g.eff_rank = 0;
    dps_g.role = DPS_ROLE_RANK;
    dps_g.bucket_bytes = 1 << 20;
    dps_e.be = &stub;
    static const row_t rows[] = {
        {"dp_grads(NULL, 3)", grads_null, "ERROR dp_grads: called with a NULL pointer for 3 element(s)"},
        {"dp_params(NULL, 2)", params_null, "ERROR dp_params: called with a NULL pointer for 2 element(s)"},
        {"dp_grad_ready(NULL)", ready_null, "ERROR dp_grad_ready: called with a NULL pointer"},
        {"dp_seed(NULL)", seed_null, "ERROR dp_seed: called with a NULL pointer"},
        {"dp_metric(NULL, 4)", metric_null, "ERROR dp_metric: called with a NULL pointer for 4 element(s)"},
        {"dp_bn_stats(.., NULL)", bn_null, "ERROR dp_bn_stats: called with a NULL pointer"},
        {"dp_from_owners(t, 1, NULL)", owners_null,
         "ERROR dp_from_owners: called with a NULL pointer for 1 element(s)"},
        {"dp_from_owners owner 2 of 2 ranks", owners_outside,
         "ERROR dp_from_owners: tensor 1 (empty) names owner 2, outside the job's ranks 0..1"},
        {"dp_grads(t, 2^44)", grads_huge,
         "ERROR dp_grads: out of memory tracking 17592186044416 gradient tensors"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        expect_refused(&rows[i]);
    /* a well-formed call still goes through */
    float g[4] = {1, 2, 3, 4};
    dp_tensor t = {g, 4, DP_F32, DP_HOST, "g"};
    int calls = stub_calls;
    CHECK(dp_grads(&t, 1) == 0 && stub_calls == calls + 1, "a valid dp_grads did not reach the backend once");
    /* each owner's tensors as its broadcasts, owners in rank order, back to root 0 after */
    static float a[2] = {1, 2}, b[300000], c[2] = {5, 6}; /* b goes in place, a and c in a bucket */
    dp_tensor ts[3] = {
        {a, 2, DP_F32, DP_HOST, "a"}, {b, 300000, DP_F32, DP_HOST, "b"}, {c, 2, DP_F32, DP_HOST, "c"}};
    int32_t owner[3] = {1, 0, 1};
    nroots = 0;
    CHECK(dp_from_owners(ts, 3, owner) == 0, "a valid dp_from_owners failed");
    CHECK(nroots == 2 && roots[0] == 0 && roots[1] == 1,
          "dp_from_owners broadcast from %d roots (%d, %d), expected 0 then 1", nroots, roots[0], roots[1]);
    nroots = 0;
    CHECK(dp_params(&t, 1) == 0 && nroots == 1 && roots[0] == 0,
          "dp_params after dp_from_owners did not go from rank 0");
    return check_report("test_hooks");
}
