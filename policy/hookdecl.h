/* Declarative hooks: the [hook NAME] sections of a policy file. A section names an exported
 * function, its C signature, and actions from a fixed menu that run before or after it:
 *
 *   [hook update]
 *   signature = void legacy_sgd_update(float *w, const float *g, size_t n, float lr)
 *   before = grads g[n]
 *
 * This is the pure parser and validator (dpshim-diag check uses it too); shim/ffi binds the
 * declarations to the program with libffi closures. */
#ifndef DPS_HOOKDECL_H
#define DPS_HOOKDECL_H

#include <stddef.h>
#include <stdint.h>

#define DPS_HOOK_MAX_ARGS 16
#define DPS_HOOK_MAX_ACTIONS 8

/* C types a signature may use. Pointers record what they point to (VOID for void * and for
 * pointers to structs, typedefs or pointers). */
typedef enum {
    DPS_CT_VOID,
    DPS_CT_I8,
    DPS_CT_U8,
    DPS_CT_I16,
    DPS_CT_U16,
    DPS_CT_I32,
    DPS_CT_U32,
    DPS_CT_I64,
    DPS_CT_U64,
    DPS_CT_F32,
    DPS_CT_F64,
    DPS_CT_PTR
} dps_ctype_t;

typedef struct dps_carg {
    dps_ctype_t type;
    dps_ctype_t pointee; /* for DPS_CT_PTR */
    char name[32];       /* "" when the signature gives none */
} dps_carg_t;

typedef enum {
    DPS_ACT_GRADS,      /* grads BUF[COUNT] [DTYPE]: as dp_grads */
    DPS_ACT_ALLREDUCE,  /* allreduce BUF[COUNT] [DTYPE] OP */
    DPS_ACT_BROADCAST,  /* broadcast BUF[COUNT] [DTYPE]: from rank 0, as dp_params */
    DPS_ACT_BATCH,      /* batch BUF[COUNT]: this rank's share of a batch of indices, as dp_batch */
    DPS_ACT_EPOCH,      /* epoch BUF[COUNT]: this rank's shard of an epoch, as dp_epoch */
    DPS_ACT_SEED,       /* seed VALUE: rank 0's value everywhere, as dp_seed */
    DPS_ACT_RANK0_ONLY, /* rank0_only [return=VALUE]: other ranks skip the call */
    DPS_ACT_BARRIER,    /* barrier */
    DPS_ACT_STEP_END    /* step_end: as dp_step_end, counting calls */
} dps_action_kind_t;

/* Where a count or a value comes from: an argument (ARG), what an argument points to (*ARG),
 * a constant, or the function's return value. Actions that change a count write it back there. */
typedef enum { DPS_REF_ARG, DPS_REF_DEREF, DPS_REF_CONST, DPS_REF_RETURN } dps_ref_kind_t;

typedef struct dps_ref {
    dps_ref_kind_t kind;
    int arg;        /* ARG and DEREF: argument index */
    uint64_t value; /* CONST */
} dps_ref_t;

typedef struct dps_action {
    dps_action_kind_t kind;
    int buf;         /* buffer actions: the pointer argument's index */
    dps_ref_t count; /* buffer actions: its element count */
    dps_ref_t value; /* seed: the value */
    int dtype;       /* DP_* of the buffer */
    int op;          /* allreduce: DP_SUM, DP_MEAN, DP_MIN, DP_MAX */
    int has_return;  /* rank0_only: return=VALUE given */
    double ret_f;    /* ... as a float, and as an integer */
    int64_t ret_i;
} dps_action_t;

typedef enum { DPS_MISSING_WARN, DPS_MISSING_ERROR, DPS_MISSING_IGNORE } dps_missing_t;

/* Room for the name a declarative hook goes by in messages, reports and traces,
 * "[hook NAME] SYMBOL" with its NUL (NAME and SYMBOL as long as dps_hookdecl_t holds them). */
#define DPS_HOOK_WHERE_MAX (sizeof "[hook ] " + 64 + 128)

typedef struct dps_hookdecl {
    char name[64]; /* the section's NAME (DPS_HOOK_WHERE_MAX counts on these sizes) */
    char symbol[128];
    char library[256]; /* "" : wherever the symbol is defined */
    dps_carg_t ret;
    dps_carg_t args[DPS_HOOK_MAX_ARGS];
    int nargs;
    dps_action_t before[DPS_HOOK_MAX_ACTIONS], after[DPS_HOOK_MAX_ACTIONS];
    int nbefore, nafter;
    dps_missing_t missing;
    int line; /* of the section header */
} dps_hookdecl_t;

/* Parse and check one hook from its keys' values (NULL when absent). 0, or -1 with a message
 * in err that starts with the key at fault ("signature: unknown type 'flaot'"). */
int dps_hookdecl_build(dps_hookdecl_t *h, const char *symbol, const char *library, const char *signature,
                       const char *before, const char *after, const char *missing, char *err, size_t errlen);

/* Bytes of a value of type t (pointers: 8). */
size_t dps_ctype_size(dps_ctype_t t);
/* "float *", "size_t"... for messages, into buf. */
const char *dps_carg_text(const dps_carg_t *a, char *buf, size_t len);

/* One line: "void f(float *g, uint64_t n); before: grads g[n] f32", into buf. */
const char *dps_hookdecl_describe(const dps_hookdecl_t *h, char *buf, size_t len);
/* 1 when the declared function is the C library's or the dynamic loader's (free, write), which
 * the shim and MPI call themselves: a hook there is refused. Its library's name into lib. */
int dps_hookdecl_system_function(const dps_hookdecl_t *d, char *lib, size_t len);

#endif
