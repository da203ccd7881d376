/* Declarative hooks ([hook NAME] in the policy, policy/hookdecl.h) bound with libffi.
 *
 * For each declared function a libffi closure is built from the declared signature; got.c points
 * every loaded object's GOT slots for the symbol at it (objects loaded later too). The closure
 * runs the "before" actions, calls the original with ffi_call, and runs the "after" actions.
 * libffi is opened with dlopen, so a policy without hooks costs nothing and libdpshim.so keeps
 * glibc as its only dependency. */
#define _GNU_SOURCE
#include "ffihooks.h"

#include <dlfcn.h>
#include <errno.h>
#include <ffi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dps.h"
#include "dpshim/hooks.h"
#include "engine/engine.h"
#include "got.h"

/* --- libffi, opened at first use --- */

static struct {
    ffi_status (*prep_cif)(ffi_cif *, ffi_abi, unsigned, ffi_type *, ffi_type **);
    void *(*closure_alloc)(size_t, void **);
    ffi_status (*prep_closure_loc)(ffi_closure *, ffi_cif *, void (*)(ffi_cif *, void *, void **, void *),
                                   void *, void *);
    void (*call)(ffi_cif *, void (*)(void), void *, void **);
    ffi_type *type[DPS_CT_PTR + 1];
    void *base; /* libffi's load address, never patched */
} ffi;

static int open_ffi(char *err, size_t len)
{
    void *h = dlopen("libffi.so.8", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, len, "cannot load libffi (%s); install libffi8", dlerror());
        return -1;
    }
    static const char *const types[] = {"ffi_type_void",   "ffi_type_sint8",  "ffi_type_uint8",
                                        "ffi_type_sint16", "ffi_type_uint16", "ffi_type_sint32",
                                        "ffi_type_uint32", "ffi_type_sint64", "ffi_type_uint64",
                                        "ffi_type_float",  "ffi_type_double", "ffi_type_pointer"};
    *(void **)&ffi.prep_cif = dlsym(h, "ffi_prep_cif");
    *(void **)&ffi.closure_alloc = dlsym(h, "ffi_closure_alloc");
    *(void **)&ffi.prep_closure_loc = dlsym(h, "ffi_prep_closure_loc");
    *(void **)&ffi.call = dlsym(h, "ffi_call");
    int ok = ffi.prep_cif && ffi.closure_alloc && ffi.prep_closure_loc && ffi.call;
    for (int i = 0; i <= DPS_CT_PTR; i++)
        ok &= (ffi.type[i] = dlsym(h, types[i])) != NULL;
    Dl_info info;
    if (ok && dladdr((void *)ffi.call, &info)) ffi.base = info.dli_fbase;
    if (!ok) snprintf(err, len, "libffi.so.8 lacks the closure API");
    return ok ? 0 : -1;
}

/* --- one bound hook --- */

struct bound;

/* One closure per definition the program's objects bind the symbol to (two RTLD_LOCAL
 * libraries may each define their own). */
typedef struct variant {
    struct bound *b;
    void *original; /* the definition this closure calls */
    void *code;     /* the closure's entry point */
} variant_t;

typedef struct bound {
    const dps_hookdecl_t *d;
    /* "[hook NAME] SYMBOL", built once: the engine's guard and diagnostics keep the pointer
     * they are given for the whole job (traces are written at exit) */
    char where[DPS_HOOK_WHERE_MAX];
    ffi_cif cif;
    ffi_type *atypes[DPS_HOOK_MAX_ARGS];
    variant_t **v; /* stable addresses: closures point at them */
    size_t nv, capv;
    void *library_def; /* library =: the definition in that library (its handle stays open) */
    uint64_t steps;
    int sites; /* GOT slots pointing at one of the closures */
    int defined;
} bound_t;

static bound_t *hooks; /* never freed: closures and the engine point into it */
static int nhooks;

/* Integers of any declared width, read and written through the argument or return storage
 * libffi hands the closure (return values narrower than ffi_arg occupy a whole ffi_arg). */
static int64_t load_int(const void *p, dps_ctype_t t)
{
    switch (t) {
    case DPS_CT_I8:
        return *(const int8_t *)p;
    case DPS_CT_U8:
        return *(const uint8_t *)p;
    case DPS_CT_I16:
        return *(const int16_t *)p;
    case DPS_CT_U16:
        return *(const uint16_t *)p;
    case DPS_CT_I32:
        return *(const int32_t *)p;
    case DPS_CT_U32:
        return *(const uint32_t *)p;
    default:
        return *(const int64_t *)p;
    }
}

static void store_int(void *p, dps_ctype_t t, int64_t v)
{
    switch (t) {
    case DPS_CT_I8:
    case DPS_CT_U8:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case DPS_CT_I16:
    case DPS_CT_U16:
        *(uint16_t *)p = (uint16_t)v;
        break;
    case DPS_CT_I32:
    case DPS_CT_U32:
        *(uint32_t *)p = (uint32_t)v;
        break;
    default:
        *(int64_t *)p = v;
    }
}

static int64_t load_ret(const void *ret, dps_ctype_t t)
{
    return dps_ctype_size(t) < sizeof(ffi_arg) ? (int64_t) * (const ffi_arg *)ret : load_int(ret, t);
}

static void store_ret(void *ret, dps_ctype_t t, int64_t v)
{
    if (dps_ctype_size(t) < sizeof(ffi_arg))
        *(ffi_arg *)ret = (ffi_arg)v;
    else
        store_int(ret, t, v);
}

/* A count or value reference: read, and write back. */
static int64_t ref_get(const bound_t *b, const dps_ref_t *r, void **args, const void *ret)
{
    switch (r->kind) {
    case DPS_REF_ARG:
        return load_int(args[r->arg], b->d->args[r->arg].type);
    case DPS_REF_DEREF: {
        const void *p = *(void *const *)args[r->arg];
        return p ? load_int(p, b->d->args[r->arg].pointee) : 0;
    }
    case DPS_REF_CONST:
        return (int64_t)r->value;
    default:
        return load_ret(ret, b->d->ret.type);
    }
}

static void ref_set(const bound_t *b, const dps_ref_t *r, void **args, void *ret, int64_t v)
{
    switch (r->kind) {
    case DPS_REF_ARG:
        store_int(args[r->arg], b->d->args[r->arg].type, v);
        break;
    case DPS_REF_DEREF: {
        void *p = *(void **)args[r->arg];
        if (p) store_int(p, b->d->args[r->arg].pointee, v);
        break;
    }
    case DPS_REF_CONST:
        break;
    default:
        store_ret(ret, b->d->ret.type, v);
    }
}

/* batch / epoch on an index array of any integer width: through uint64 for the hook ABI. */
static void shard_indices(const bound_t *b, const dps_action_t *a, void **args, void *ret)
{
    void *buf = *(void **)args[a->buf];
    int64_t n = ref_get(b, &a->count, args, ret);
    if (!buf || n <= 0) return;
    dps_ctype_t t = b->d->args[a->buf].pointee;
    size_t es = dps_ctype_size(t);
    uint64_t *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) dps_fatal("%s: out of memory for %lld indices", b->where, (long long)n);
    for (int64_t i = 0; i < n; i++)
        tmp[i] = (uint64_t)load_int((char *)buf + (size_t)i * es, t);
    size_t keep = a->kind == DPS_ACT_BATCH ? dp_batch(tmp, (size_t)n) : dp_epoch(tmp, (size_t)n);
    for (size_t i = 0; i < keep; i++)
        store_int((char *)buf + i * es, t, (int64_t)tmp[i]);
    free(tmp);
    ref_set(b, &a->count, args, ret, (int64_t)keep);
}

/* --- actions --- */

/* grads, allreduce, broadcast: BUF[COUNT] in place. */
static int act_on_buffer(bound_t *b, const dps_action_t *a, void **args, void *ret)
{
    void *buf = *(void **)args[a->buf];
    int64_t n = ref_get(b, &a->count, args, ret);
    if (n < 0) dps_fatal("%s: negative count %lld for %s", b->where, (long long)n, b->d->args[a->buf].name);
    if (!n) return 0;
    dp_tensor t = {buf, (uint64_t)n, a->dtype, DP_HOST, b->d->args[a->buf].name};
    if (a->kind == DPS_ACT_GRADS) return dp_grads(&t, 1);
    if (a->kind == DPS_ACT_BROADCAST) return dp_params(&t, 1);
    return dps_hook_allreduce(b->where, &t, a->op);
}

static int act_seed(bound_t *b, const dps_action_t *a, void **args, void *ret)
{
    uint64_t s = (uint64_t)ref_get(b, &a->value, args, ret);
    int rc = dp_seed(&s);
    ref_set(b, &a->value, args, ret, (int64_t)s);
    return rc;
}

/* rank0_only on another rank: the call's result is return=VALUE (0 by default). */
static void skip_call(const bound_t *b, const dps_action_t *a, void *ret)
{
    if (!ret || b->d->ret.type == DPS_CT_VOID) return;
    if (b->d->ret.type == DPS_CT_F32)
        *(float *)ret = (float)a->ret_f;
    else if (b->d->ret.type == DPS_CT_F64)
        *(double *)ret = a->ret_f;
    else if (b->d->ret.type == DPS_CT_PTR)
        *(void **)ret = (void *)(intptr_t)a->ret_i;
    else
        store_ret(ret, b->d->ret.type, a->ret_i);
}

/* Runs one action; 1 when the call itself must be skipped (rank0_only on another rank). */
static int act(bound_t *b, const dps_action_t *a, void **args, void *ret)
{
    int rc = 0;
    switch (a->kind) {
    case DPS_ACT_GRADS:
    case DPS_ACT_ALLREDUCE:
    case DPS_ACT_BROADCAST:
        rc = act_on_buffer(b, a, args, ret);
        break;
    case DPS_ACT_BATCH:
    case DPS_ACT_EPOCH:
        shard_indices(b, a, args, ret);
        break;
    case DPS_ACT_SEED:
        rc = act_seed(b, a, args, ret);
        break;
    case DPS_ACT_RANK0_ONLY:
        if (dps_g.eff_rank == 0) break;
        skip_call(b, a, ret);
        return 1;
    case DPS_ACT_BARRIER:
        rc = dps_hook_barrier(b->where);
        break;
    case DPS_ACT_STEP_END:
        rc = dp_step_end(++b->steps);
        break;
    }
    if (rc != 0)
        dps_fatal("%s: the action failed (see above); the ranks would go on with different values", b->where);
    return 0;
}

/* --- closures --- */

static void closure_main(ffi_cif *cif, void *ret, void **args, void *user)
{
    variant_t *v = user;
    bound_t *b = v->b;
    int saved = errno, skip = 0;
    for (int i = 0; i < b->d->nbefore; i++)
        skip |= act(b, &b->d->before[i], args, ret);
    errno = saved;
    if (!skip) ffi.call(cif, (void (*)(void))v->original, ret, args);
    saved = errno;
    for (int i = 0; i < b->d->nafter; i++)
        act(b, &b->d->after[i], args, ret);
    errno = saved;
}

/* The hook's name for messages, reports and traces, and its signature described to libffi. */
static int prepare_hook(bound_t *b, const dps_hookdecl_t *d, char *err, size_t len)
{
    b->d = d;
    snprintf(b->where, sizeof b->where, "[hook %s] %s", d->name, d->symbol);
    for (int i = 0; i < d->nargs; i++)
        b->atypes[i] = ffi.type[d->args[i].type];
    if (ffi.prep_cif(&b->cif, FFI_DEFAULT_ABI, (unsigned)d->nargs, ffi.type[d->ret.type], b->atypes) !=
        FFI_OK) {
        snprintf(err, len, "%s: libffi cannot describe this signature", b->where);
        return -1;
    }
    return 0;
}

/* The closure that calls `original`, made at its first use. */
static variant_t *variant_for(bound_t *b, void *original)
{
    for (size_t i = 0; i < b->nv; i++)
        if (b->v[i]->original == original) return b->v[i];
    if (dps_grow((void **)&b->v, &b->capv, b->nv + 1, sizeof *b->v)) return NULL;
    variant_t *v = calloc(1, sizeof *v);
    void *code = NULL;
    ffi_closure *c = v ? ffi.closure_alloc(sizeof(ffi_closure), &code) : NULL;
    if (!c || ffi.prep_closure_loc(c, &b->cif, closure_main, v, code) != FFI_OK) {
        DPS_WARN("%s: libffi cannot build a closure; calls go on unhooked", b->where);
        free(v);
        return NULL;
    }
    v->b = b, v->original = original, v->code = code;
    b->v[b->nv++] = v;
    return v;
}

/* --- what got.c asks: where each slot goes --- */

/* library =: that library's definition, once it is loaded (its handle stays open). */
static void find_library_defs(void *ctx)
{
    (void)ctx;
    for (int i = 0; i < nhooks; i++)
        if (hooks[i].d->library[0] && !hooks[i].library_def) {
            void *lib = dlopen(hooks[i].d->library, RTLD_NOW | RTLD_NOLOAD);
            if (lib) hooks[i].library_def = dlsym(lib, hooks[i].d->symbol);
        }
}

static void *slot_target(void *ctx, int i, void *def)
{
    (void)ctx;
    bound_t *b = &hooks[i];
    if (b->d->library[0] && def != b->library_def) return NULL;
    b->defined = 1;
    variant_t *v = variant_for(b, def);
    return v ? v->code : NULL;
}

static void slot_patched(void *ctx, int i)
{
    (void)ctx;
    hooks[i].sites++;
}

/* --- start-up --- */

/* What keeps a hook that bound no call site unbound, into buf: its symbol's definition (in the
 * library = it names, where it names one: that library may not be loaded at all). */
static const char *why_unbound(const bound_t *b, int yet, char *buf, size_t len)
{
    const dps_hookdecl_t *d = b->d;
    const char *lib = d->library;
    void *handle = lib[0] ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (handle) dlclose(handle); /* NOLOAD took a reference: given back */
    if (lib[0] && !handle)
        snprintf(
            buf, len,
            "is to be bound in %s (library =), which is not loaded now (check the name: the one ldd lists)",
            lib);
    else if (b->defined || (lib[0] ? b->library_def != NULL : dlsym(RTLD_DEFAULT, d->symbol) != NULL))
        snprintf(buf, len, "is defined%s%s but %s", lib[0] ? " in " : "", lib,
                 yet ? "not called through any GOT yet" : "no loaded object calls it through its GOT");
    else
        snprintf(buf, len, "is not defined by %s", lib[0] ? lib : "any loaded object");
    return buf;
}

/* After the first binding: what became of one hook. 0, or -1 with err set (missing = error). */
static int report_hook(const bound_t *b, const char *src, char *err, size_t len)
{
    const dps_hookdecl_t *d = b->d;
    char why[600];
    if (b->sites)
        DPS_INFO("%s bound at %d call site(s)", b->where, b->sites);
    else if (d->missing == DPS_MISSING_ERROR)
        return snprintf(err, len, "%s:%d: [hook %s]: %s %s (missing = error)", src, d->line, d->name,
                        d->symbol, why_unbound(b, 0, why, sizeof why)),
               -1;
    else if (d->missing == DPS_MISSING_WARN && dps_g.rank == 0)
        DPS_WARN("%s:%d: [hook %s]: %s %s; it is bound if a library loaded later calls it", src, d->line,
                 d->name, d->symbol, why_unbound(b, 1, why, sizeof why));
    return 0;
}

void dps_ffi_hooks_summary(int *declared, int *sites)
{
    *declared = nhooks, *sites = 0;
    for (int i = 0; i < nhooks; i++)
        *sites += hooks[i].sites;
}

int dps_ffi_hooks_start(const dps_policy_t *p, char *err, size_t len)
{
    if (!p->nhooks) return 0;
    if (dps_policy_hooks_refused(p, err, len)) return -1; /* before any binding: a hook on free */
    if (open_ffi(err, len)) return -1;
    static dps_got_client_t got = {
        .pass_begins = find_library_defs, .target = slot_target, .patched = slot_patched};
    const char **names = calloc((size_t)p->nhooks, sizeof *names);
    hooks = calloc((size_t)p->nhooks, sizeof *hooks);
    if (!hooks || !names) return snprintf(err, len, "out of memory for %d hooks", p->nhooks), -1;
    nhooks = p->nhooks;
    for (int i = 0; i < nhooks; i++) {
        if (prepare_hook(&hooks[i], &p->hooks[i], err, len)) return -1;
        names[i] = p->hooks[i].symbol;
    }
    got.names = names, got.nnames = nhooks, got.skip = ffi.base;
    if (dps_got_start(&got, err, len)) return -1;
    for (int i = 0; i < nhooks; i++)
        if (report_hook(&hooks[i], p->file[0] ? p->file : "policy", err, len)) return -1;
    return 0;
}
