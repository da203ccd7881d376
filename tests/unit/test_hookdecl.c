/* [hook] declarations: what signatures and actions parse to, and what is refused. */
#include <string.h>

#include "check.h"
#include "hookdecl.h"

static int build(dps_hookdecl_t *h, const char *sym, const char *sig, const char *before, const char *after,
                 char *err)
{
    memset(h, 0, sizeof *h);
    return dps_hookdecl_build(h, sym, NULL, sig, before, after, NULL, err, 512);
}

static void test_types(void)
{
    dps_hookdecl_t h;
    char err[512] = "";
    int rc = build(&h, NULL,
                   "unsigned long long f(const char *s, unsigned char a, short b, unsigned short c, int d, "
                   "unsigned e, long f2, size_t g, ssize_t h2, int8_t i, uint64_t j, float k, double l, "
                   "struct model *m, model_t **mm, bool z)",
                   NULL, NULL, err);
    CHECK(rc == 0, "%s", err);
    CHECK(!strcmp(h.symbol, "f") && h.nargs == 16, "symbol %s, %d args", h.symbol, h.nargs);
    CHECK(h.ret.type == DPS_CT_U64, "return type %d", h.ret.type);
    const dps_ctype_t want[16] = {DPS_CT_PTR, DPS_CT_U8,  DPS_CT_I16, DPS_CT_U16, DPS_CT_I32, DPS_CT_U32,
                                  DPS_CT_I64, DPS_CT_U64, DPS_CT_I64, DPS_CT_I8,  DPS_CT_U64, DPS_CT_F32,
                                  DPS_CT_F64, DPS_CT_PTR, DPS_CT_PTR, DPS_CT_U8};
    for (int i = 0; i < 16 && rc == 0; i++)
        CHECK(h.args[i].type == want[i], "argument %d: type %d", i + 1, h.args[i].type);
    CHECK(h.args[0].pointee == DPS_CT_I8 && h.args[13].pointee == DPS_CT_VOID &&
              h.args[14].pointee == DPS_CT_VOID,
          "pointees");
    CHECK(!strcmp(h.args[6].name, "f2") && !strcmp(h.args[15].name, "z"), "names");
    CHECK(build(&h, "g", "void (void)", NULL, NULL, err) == 0 && h.nargs == 0 && !strcmp(h.symbol, "g"), "%s",
          err);
    CHECK(build(&h, "g", "int (int, float *)", NULL, NULL, err) == 0 && h.nargs == 2 && !h.args[0].name[0],
          "unnamed arguments: %s", err);
}

static void test_actions(void)
{
    dps_hookdecl_t h;
    char err[512] = "";
    const char *sig = "size_t next(void *buf, uint32_t *idx, size_t *n, size_t cap, uint64_t seed)";
    CHECK(build(&h, NULL, sig, "seed seed, allreduce buf[cap] f64 max, barrier",
                "batch idx[*n], epoch idx[return], step_end", err) == 0,
          "%s", err);
    CHECK(h.nbefore == 3 && h.nafter == 3, "%d before, %d after", h.nbefore, h.nafter);
    CHECK(h.before[0].kind == DPS_ACT_SEED && h.before[0].value.kind == DPS_REF_ARG &&
              h.before[0].value.arg == 4,
          "seed");
    CHECK(h.before[1].kind == DPS_ACT_ALLREDUCE && h.before[1].buf == 0 && h.before[1].count.arg == 3 &&
              h.before[1].dtype == 1 && h.before[1].op == 3,
          "allreduce");
    CHECK(h.after[0].count.kind == DPS_REF_DEREF && h.after[0].count.arg == 2, "batch *n");
    CHECK(h.after[1].count.kind == DPS_REF_RETURN, "epoch return");
    CHECK(build(&h, NULL, "void u(float *w, const float *g, size_t n)", "grads $2[$3]", NULL, err) == 0 &&
              h.before[0].buf == 1 && h.before[0].count.arg == 2 && h.before[0].dtype == 0,
          "positional: %s", err);
    CHECK(build(&h, NULL, "void u(double *w)", "broadcast w[784]", NULL, err) == 0 &&
              h.before[0].count.kind == DPS_REF_CONST && h.before[0].count.value == 784 &&
              h.before[0].dtype == 1,
          "constant count: %s", err);
    CHECK(build(&h, NULL, "int save(const char *p)", "rank0_only return=-3", NULL, err) == 0 &&
              h.before[0].has_return && h.before[0].ret_i == -3,
          "rank0_only: %s", err);
    CHECK(build(&h, NULL, "int save(const char *p)", "rank0_only return=010", NULL, err) == 0 &&
              h.before[0].ret_i == 10,
          "decimal, not octal: %s", err);
    CHECK(build(&h, NULL, "double loss(void)", "rank0_only return=1.5", NULL, err) == 0 &&
              h.before[0].ret_f == 1.5,
          "float result: %s", err);
    CHECK(build(&h, NULL, "void *buf(void)", "rank0_only return=NULL", NULL, err) == 0 &&
              h.before[0].ret_i == 0,
          "pointer result: %s", err);
    /* names longer than an argument's 31 characters are refused, a function's may have 127 */
    const char *lng =
        "void legacy_optimizer_apply_gradients_fp32_with_a_rather_long_name(float *g, size_t n)";
    CHECK(build(&h, NULL, lng, NULL, NULL, err) == 0 &&
              !strcmp(h.symbol, "legacy_optimizer_apply_gradients_fp32_with_a_rather_long_name"),
          "long symbol: %s", err);
}

static void refused(const char *sig, const char *before, const char *after, const char *fragment)
{
    dps_hookdecl_t h;
    char err[512] = "";
    CHECK(build(&h, NULL, sig, before, after, err) != 0 && strstr(err, fragment),
          "%s | %s | %s: got '%s', want '%s'", sig, before ? before : "", after ? after : "", err, fragment);
}

int main(void)
{
    test_types();
    test_actions();
    refused("void f(flaot *g)", NULL, NULL, "unknown type 'flaot'; did you mean 'float'?");
    refused("void f(model_t m)", NULL, NULL, "unknown type 'model_t'");
    refused("void f(int a, ...)", NULL, NULL, "variadic");
    refused("void f(int a, int a)", NULL, NULL, "two arguments are named 'a'");
    refused("void f(int a", NULL, NULL, "expected ',' or ')' after argument 1");
    refused("void f(float *g, size_t n)", "grads $3[n]", NULL,
            "argument $3 out of range: the signature has 2");
    refused("void f(void *g, size_t n)", "grads g[n]", NULL, "needs a dtype");
    refused("void f(float *g, size_t n)", "grads g[n] i32", NULL, "dtype i32 does not match 'g'");
    refused("void f(float *g, size_t n)", "allreduce g[n]", NULL, "needs an op");
    refused("void f(int32_t *g, size_t n)", "allreduce g[n] mean", NULL, "mean of integers");
    refused("void f(float *g, float n)", "grads g[n]", NULL, "'n' must be an integer");
    refused("size_t f(int64_t *i, size_t n)", "batch i[return]", NULL, "only exists after the call");
    refused("void f(int64_t *i, size_t n)", NULL, "batch i[n]", "cannot change the argument 'n'");
    refused("void f(int64_t *i, size_t n)", "batch i[10]", NULL, "changes the count");
    refused("void f(float *i, size_t n)", "batch i[n]", NULL, "32- or 64-bit integer indices");
    refused("void f(int a)", NULL, "rank0_only", "put it in before");
    refused("void f(int a)", "rank0_only return=1", NULL, "returns void");
    refused("void f(int a)", "scatter a[1]", NULL, "unknown action 'scatter'");
    refused("void f(int a)", "barrier,,step_end", NULL, "empty action");
    refused("void f(int a)", "barrier now", NULL, "takes nothing");
    refused("void f(float *gradient_buffer_of_the_whole_model_x)", NULL, NULL,
            "is longer than 31 characters");
    refused("int f(void)", "rank0_only return=1.5", NULL, "not a value of the return type");
    refused("unsigned f(void)", "rank0_only return=-1", NULL, "not a value of the return type");
    refused("void *f(void)", "rank0_only return=7", NULL, "can only be return=NULL");
    return check_report("test_hookdecl");
}
