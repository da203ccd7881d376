/* Policy parser: valid files, each kind of bad input with file:line and key, env overrides. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "policy.h"

static int parse(dps_policy_t *p, const char *text, dps_error_t *e)
{
    dps_policy_init(p);
    return dps_policy_parse(p, text, strlen(text), "t.conf", e);
}

/* The parse fails and the message contains every fragment given. */
static void expect_error(const char *text, const char *frag1, const char *frag2)
{
    dps_policy_t p;
    dps_error_t e = {{0}};
    int rc = parse(&p, text, &e);
    CHECK(rc == -1, "accepted: %s", text);
    CHECK(strstr(e.msg, frag1) != NULL, "'%s' lacks '%s'", e.msg, frag1);
    if (frag2) CHECK(strstr(e.msg, frag2) != NULL, "'%s' lacks '%s'", e.msg, frag2);
    dps_policy_free(&p);
}

static void test_defaults(void)
{
    dps_policy_t p;
    dps_policy_init(&p);
    CHECK(DPS_POLICY_ENUM(&p, comm, backend) == DPS_V_comm_backend_auto, "backend default");
    CHECK(dps_policy_num(&p, DPS_P_comm_bucket_mb) == 25, "bucket default");
    CHECK(DPS_POLICY_ENUM(&p, data, mode) == DPS_V_data_mode_split, "mode default");
    CHECK(dps_policy_num(&p, DPS_P_guard_timeout) == 300, "timeout default");
    CHECK(strcmp(dps_policy_text(&p, DPS_P_files_rank0_only), "") == 0, "globs default empty");
    char src[64];
    CHECK(strcmp(dps_policy_source(&p, DPS_P_bn_sync, src, sizeof src), "default") == 0, "source");
    dps_policy_free(&p);
}

static void test_valid_file(void)
{
    dps_policy_t p;
    dps_error_t e;
    const char *text = "# comment\n"
                       "[comm]\n"
                       "  bucket_mb = 64   # inline comment\n"
                       "reduce=sum\n"
                       "\n"
                       "; another comment\n"
                       "[data]\n"
                       "mode = scale\n"
                       "uneven = drop\n"
                       "[files]\n"
                       "rank0_only = *.ckpt checkpoints/** ckpt-[0-9].bin\n"
                       "[diag]\n"
                       "dir =\n";
    CHECK(parse(&p, text, &e) == 0, "valid file rejected: %s", e.msg);
    CHECK(dps_policy_num(&p, DPS_P_comm_bucket_mb) == 64, "bucket_mb");
    CHECK(DPS_POLICY_ENUM(&p, comm, reduce) == DPS_V_comm_reduce_sum, "reduce");
    CHECK(DPS_POLICY_ENUM(&p, data, mode) == DPS_V_data_mode_scale, "mode");
    CHECK(dps_policy_num(&p, DPS_P_data_uneven) == 1, "uneven index");
    CHECK(strcmp(dps_policy_text(&p, DPS_P_files_rank0_only), "*.ckpt checkpoints/** ckpt-[0-9].bin") == 0,
          "globs: '%s'", dps_policy_text(&p, DPS_P_files_rank0_only));
    char src[64];
    dps_policy_source(&p, DPS_P_comm_reduce, src, sizeof src);
    CHECK(strstr(src, ":4") != NULL, "source line of reduce: %s", src);
    dps_policy_free(&p);
}

static void test_errors(void)
{
    expect_error("[comm]\nbuckt_mb = 4\n", "t.conf:2", "did you mean 'bucket_mb'");
    expect_error("[comm]\nbackend = mpi\nbackend = self\n", "t.conf:3", "duplicate key 'backend'");
    expect_error("[comm]\nbackend = mpii\n", "t.conf:2: [comm] backend", "did you mean 'mpi'");
    expect_error("[comm]\nbucket_mb = 12x\n", "t.conf:2: [comm] bucket_mb", "expected an integer in 1..4096");
    expect_error("[comm]\nbucket_mb = 0\n", "out of range", NULL);
    expect_error("[comm]\nbucket_mb = 99999999999999999999999\n", "out of range", NULL);
    expect_error("[comm]\nbucket_mb =\n", "empty value", NULL);
    expect_error("[gaurd]\ntimeout = 5\n", "t.conf:1: unknown section [gaurd]", "did you mean 'guard'");
    expect_error("timeout = 5\n", "before any [section]", NULL);
    expect_error("[guard\n", "closing ']'", NULL);
    expect_error("[guard]\ntimeout 5\n", "expected 'key = value'", NULL);
    expect_error("[files]\nrank0_only = ckpt[0-9.bin\n", "unclosed '['", NULL);
    expect_error("[comm]\nzzzzzzzz = 1\n", "unknown key 'zzzzzzzz'", NULL);
}

static void test_env(void)
{
    dps_policy_t p;
    dps_error_t e;
    char *env1[] = {"PATH=/bin", "DPSHIM_COMM_BUCKET_MB=8", "DPSHIM_DATA_MODE= scale ", "DPSHIM_POLICY=x",
                    NULL};
    dps_policy_init(&p);
    CHECK(dps_policy_apply_env(&p, env1, &e) == 0, "env rejected: %s", e.msg);
    CHECK(dps_policy_num(&p, DPS_P_comm_bucket_mb) == 8, "env bucket");
    CHECK(DPS_POLICY_ENUM(&p, data, mode) == DPS_V_data_mode_scale, "env mode");
    char src[64];
    CHECK(strcmp(dps_policy_source(&p, DPS_P_data_mode, src, sizeof src), "env DPSHIM_DATA_MODE") == 0, "%s",
          src);
    char *env2[] = {"DPSHIM_COMM_BUCKETMB=8", NULL};
    CHECK(dps_policy_apply_env(&p, env2, &e) == -1, "unknown env accepted");
    CHECK(strstr(e.msg, "did you mean 'DPSHIM_COMM_BUCKET_MB'") != NULL, "%s", e.msg);
    char *env3[] = {"DPSHIM_BN_SYNC=maybe", NULL};
    CHECK(dps_policy_apply_env(&p, env3, &e) == -1, "bad env value accepted");
    CHECK(strstr(e.msg, "DPSHIM_BN_SYNC") && strstr(e.msg, "on|off"), "%s", e.msg);
    dps_policy_free(&p);
}

static void test_table(void)
{
    /* every default is valid for its own key, and env names are unique */
    for (int i = 0; i < DPS_NKEYS; i++) {
        dps_policy_t p;
        dps_error_t e;
        dps_policy_init(&p);
        uint64_t init_num = dps_policy_num(&p, (dps_key_id_t)i); /* what start-up takes unparsed */
        CHECK(dps_policy_set_value(&p, (dps_key_id_t)i, dps_keys[i].def, strlen(dps_keys[i].def),
                                   DPS_SRC_DEFAULT, 0, &e) == 0,
              "default of %s: %s", dps_keys[i].key, e.msg);
        CHECK(dps_policy_num(&p, (dps_key_id_t)i) == init_num, "default of %s: parsed %llu, table %llu",
              dps_keys[i].key, (unsigned long long)dps_policy_num(&p, (dps_key_id_t)i),
              (unsigned long long)init_num);
        dps_policy_free(&p);
        for (int j = 0; j < i; j++) {
            char a[64], b[64];
            CHECK(strcmp(dps_policy_env_name((dps_key_id_t)i, a, 64),
                         dps_policy_env_name((dps_key_id_t)j, b, 64)),
                  "env name clash %s", a);
        }
    }
}

static void test_suggest(void)
{
    const char *c[] = {"bucket_mb", "backend", "reduce"};
    CHECK(dps_suggest("bakend", 6, c, 3) && !strcmp(dps_suggest("bakend", 6, c, 3), "backend"), "bakend");
    CHECK(dps_suggest("xyzzy", 5, c, 3) == NULL, "no suggestion for unrelated");
}

int main(void)
{
    test_defaults();
    test_valid_file();
    test_errors();
    test_env();
    test_table();
    test_suggest();
    return check_report("test_policy");
}
