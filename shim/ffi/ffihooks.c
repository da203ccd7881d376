/* Declarative hooks ([hook NAME] in the policy, policy/hookdecl.h) bound with libffi.
 *
 * For each declared function a libffi closure is built from the declared signature. Every
 * loaded object's GOT slots (PLT jump slots and GLOB_DAT data relocations) for the symbol are
 * pointed at the closure, which runs the "before" actions, calls the original with ffi_call,
 * and runs the "after" actions. Objects loaded later are bound as they arrive: calls to dlopen
 * are hooked the same way (only when hooks are declared). A full-RELRO object's GOT is made
 * writable for the store and read-only again after. libffi is opened with dlopen, so a policy
 * without hooks costs nothing and libdpshim.so keeps glibc as its only dependency. */
#define _GNU_SOURCE
#include "ffihooks.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdatomic.h>
#include <errno.h>
#include <ffi.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dps.h"
#include "dpshim/hooks.h"
#include "engine/engine.h"

#if defined(__x86_64__)
#define RELOC_JUMP_SLOT R_X86_64_JUMP_SLOT
#define RELOC_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define RELOC_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define RELOC_GLOB_DAT R_AARCH64_GLOB_DAT
#else
#error "declarative hooks: GOT binding is written for x86-64 and aarch64"
#endif

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
    ffi_cif cif;
    ffi_type *atypes[DPS_HOOK_MAX_ARGS];
    variant_t **v; /* stable addresses: closures point at them */
    size_t nv, capv;
    void *library_def; /* library =: the definition in that library (its handle stays open) */
    void *global_def;  /* the global scope's definition, during a binding pass */
    uint64_t steps;
    int sites; /* GOT slots pointing at one of the closures */
    int defined;
} bound_t;

static bound_t *hooks;
static int nhooks;
static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int bind_again; /* a dlopen finished while another thread was binding */
static _Thread_local int in_dlopen;
static void *self_base;
static long page; /* bytes, for mprotect */
static void *(*real_dlopen)(const char *, int);

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
    if (!tmp)
        dps_fatal("[hook %s] %s: out of memory for %lld indices", b->d->name, b->d->symbol, (long long)n);
    for (int64_t i = 0; i < n; i++)
        tmp[i] = (uint64_t)load_int((char *)buf + (size_t)i * es, t);
    size_t keep = a->kind == DPS_ACT_BATCH ? dp_batch(tmp, (size_t)n) : dp_epoch(tmp, (size_t)n);
    for (size_t i = 0; i < keep; i++)
        store_int((char *)buf + i * es, t, (int64_t)tmp[i]);
    free(tmp);
    ref_set(b, &a->count, args, ret, (int64_t)keep);
}

/* Runs one action; 1 when the call itself must be skipped (rank0_only on another rank). */
static int act(bound_t *b, const dps_action_t *a, void **args, void *ret)
{
    char where[200];
    snprintf(where, sizeof where, "[hook %s] %s", b->d->name, b->d->symbol);
    int rc = 0;
    switch (a->kind) {
    case DPS_ACT_GRADS:
    case DPS_ACT_ALLREDUCE:
    case DPS_ACT_BROADCAST: {
        void *buf = *(void **)args[a->buf];
        int64_t n = ref_get(b, &a->count, args, ret);
        if (n < 0) dps_fatal("%s: negative count %lld for %s", where, (long long)n, b->d->args[a->buf].name);
        if (!n) break;
        dp_tensor t = {buf, (uint64_t)n, a->dtype, DP_HOST, b->d->args[a->buf].name};
        if (a->kind == DPS_ACT_GRADS)
            rc = dp_grads(&t, 1);
        else if (a->kind == DPS_ACT_BROADCAST)
            rc = dp_params(&t, 1);
        else
            rc = dps_hook_allreduce(where, &t, a->op);
        break;
    }
    case DPS_ACT_BATCH:
    case DPS_ACT_EPOCH:
        shard_indices(b, a, args, ret);
        break;
    case DPS_ACT_SEED: {
        uint64_t s = (uint64_t)ref_get(b, &a->value, args, ret);
        rc = dp_seed(&s);
        ref_set(b, &a->value, args, ret, (int64_t)s);
        break;
    }
    case DPS_ACT_RANK0_ONLY:
        if (dps_g.eff_rank == 0) break;
        if (ret && b->d->ret.type != DPS_CT_VOID) {
            if (b->d->ret.type == DPS_CT_F32)
                *(float *)ret = (float)a->ret_f;
            else if (b->d->ret.type == DPS_CT_F64)
                *(double *)ret = a->ret_f;
            else if (b->d->ret.type == DPS_CT_PTR)
                *(void **)ret = (void *)(intptr_t)a->ret_i;
            else
                store_ret(ret, b->d->ret.type, a->ret_i);
        }
        return 1;
    case DPS_ACT_BARRIER: {
        double one = 1;
        rc = dp_metric(&one, 1, DP_SUM);
        break;
    }
    case DPS_ACT_STEP_END:
        rc = dp_step_end(++b->steps);
        break;
    }
    if (rc != 0)
        dps_fatal("%s: the action failed (see above); the ranks would go on with different values", where);
    return 0;
}

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

static int prepare_cif(bound_t *b, char *err, size_t len)
{
    const dps_hookdecl_t *d = b->d;
    for (int i = 0; i < d->nargs; i++)
        b->atypes[i] = ffi.type[d->args[i].type];
    if (ffi.prep_cif(&b->cif, FFI_DEFAULT_ABI, (unsigned)d->nargs, ffi.type[d->ret.type], b->atypes) !=
        FFI_OK) {
        snprintf(err, len, "[hook %s] %s: libffi cannot describe this signature", d->name, d->symbol);
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
        DPS_WARN("[hook %s] %s: libffi cannot build a closure; calls go on unhooked", b->d->name,
                 b->d->symbol);
        free(v);
        return NULL;
    }
    v->b = b, v->original = original, v->code = code;
    b->v[b->nv++] = v;
    return v;
}

/* --- GOT binding --- */

static uintptr_t dyn_addr(uintptr_t v, uintptr_t base)
{
    return v < base ? v + base : v;
}

/* A GOT slot for a declared symbol (hook >= 0) or for dlopen (hook = -1), in object `obj`. */
typedef struct slot_ref {
    void **slot;
    int hook, obj;
} slot_ref_t;

typedef struct object_ref {
    char name[512];               /* "" for the main program */
    uintptr_t relro_lo, relro_hi; /* the pages ld.so made read-only */
} object_ref_t;

static struct {
    slot_ref_t *slots;
    size_t nslots, capslots;
    object_ref_t *objs;
    size_t nobjs, capobjs;
} found;

/* dl_iterate_phdr callback: only reads the ELF tables (no libdl calls while it holds ld.so's
 * list lock); resolution and patching come after. */
static int collect_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    uintptr_t base = info->dlpi_addr;
    if ((self_base && (void *)base == self_base) || (ffi.base && (void *)base == ffi.base)) return 0;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t relro_lo = 0, relro_hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) { /* as ld.so protects it: whole pages only */
            relro_lo = (base + ph->p_vaddr) & ~(uintptr_t)(page - 1);
            relro_hi = (base + ph->p_vaddr + ph->p_memsz) & ~(uintptr_t)(page - 1);
        }
    }
    if (!dyn) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmpsz = 0, relasz = 0;
    int pltrel_rela = 1;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB:
            symtab = (const ElfW(Sym) *)dyn_addr(d->d_un.d_ptr, base);
            break;
        case DT_STRTAB:
            strtab = (const char *)dyn_addr(d->d_un.d_ptr, base);
            break;
        case DT_JMPREL:
            jmprel = (const ElfW(Rela) *)dyn_addr(d->d_un.d_ptr, base);
            break;
        case DT_PLTRELSZ:
            jmpsz = d->d_un.d_val;
            break;
        case DT_RELA:
            rela = (const ElfW(Rela) *)dyn_addr(d->d_un.d_ptr, base);
            break;
        case DT_RELASZ:
            relasz = d->d_un.d_val;
            break;
        case DT_PLTREL:
            pltrel_rela = d->d_un.d_val == DT_RELA;
            break;
        }
    }
    if (!symtab || !strtab) return 0;
    int obj = -1;
    const ElfW(Rela) * tables[2] = {pltrel_rela ? jmprel : NULL, rela};
    size_t counts[2] = {jmpsz / sizeof(ElfW(Rela)), relasz / sizeof(ElfW(Rela))};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; tables[t] && i < counts[t]; i++) {
            const ElfW(Rela) *r = &tables[t][i];
            unsigned type = (unsigned)ELF64_R_TYPE(r->r_info);
            size_t sym = ELF64_R_SYM(r->r_info);
            if ((type != RELOC_JUMP_SLOT && type != RELOC_GLOB_DAT) || !sym) continue;
            const char *name = strtab + symtab[sym].st_name;
            int hook = strcmp(name, "dlopen") ? -2 : -1;
            for (int k = 0; hook == -2 && k < nhooks; k++)
                if (!strcmp(name, hooks[k].d->symbol)) hook = k;
            if (hook == -2) continue;
            if (obj < 0) {
                if (dps_grow((void **)&found.objs, &found.capobjs, found.nobjs + 1, sizeof *found.objs))
                    return 1;
                object_ref_t *o = &found.objs[found.nobjs];
                snprintf(o->name, sizeof o->name, "%s", info->dlpi_name ? info->dlpi_name : "");
                o->relro_lo = relro_lo, o->relro_hi = relro_hi;
                obj = (int)found.nobjs++;
            }
            if (dps_grow((void **)&found.slots, &found.capslots, found.nslots + 1, sizeof *found.slots))
                return 1;
            found.slots[found.nslots++] = (slot_ref_t){(void **)(base + r->r_offset), hook, obj};
        }
    return 0;
}

static void patch_slot(void **slot, void *code, const object_ref_t *o)
{
    if (*slot == code) return;
    uintptr_t p = (uintptr_t)slot & ~(uintptr_t)(page - 1);
    int in_relro = (uintptr_t)slot >= o->relro_lo && (uintptr_t)slot < o->relro_hi;
    if (in_relro && mprotect((void *)p, (size_t)page, PROT_READ | PROT_WRITE) != 0) return;
    __atomic_store_n(slot, code, __ATOMIC_RELEASE);
    if (in_relro) mprotect((void *)p, (size_t)page, PROT_READ);
}

/* What an object's references to a hooked symbol bind to, as ld.so looks it up: the global
 * scope first (found once per pass), then the object's own dependencies (an RTLD_LOCAL
 * library's own definition). */
static void *resolve_in(const bound_t *b, void *handle)
{
    return b->global_def ? b->global_def : dlsym(handle, b->d->symbol);
}

static void *dlopen_wrapper(const char *file, int mode);

static void bind_once(void)
{
    found.nslots = found.nobjs = 0;
    dl_iterate_phdr(collect_object, NULL);
    for (int i = 0; i < nhooks; i++) hooks[i].global_def = dlsym(RTLD_DEFAULT, hooks[i].d->symbol);
    /* slots come object by object: one handle per object */
    void *h = NULL;
    int h_obj = -1;
    for (size_t i = 0; i < found.nslots; i++) {
        const slot_ref_t *sr = &found.slots[i];
        const object_ref_t *obj = &found.objs[sr->obj];
        if (sr->obj != h_obj) {
            if (h) dlclose(h);
            /* a handle only for objects fully loaded (RTLD_NOLOAD finds nothing else, e.g. the vdso) */
            h = real_dlopen(obj->name[0] ? obj->name : NULL, RTLD_LAZY | RTLD_NOLOAD);
            h_obj = sr->obj;
        }
        if (!h) continue;
        if (sr->hook < 0) {
            patch_slot(sr->slot, (void *)&dlopen_wrapper, obj);
            continue;
        }
        bound_t *b = &hooks[sr->hook];
        void *target = resolve_in(b, h);
        if (!target || (b->d->library[0] && target != b->library_def)) continue;
        b->defined = 1;
        variant_t *v = variant_for(b, target);
        if (!v || *sr->slot == v->code) continue;
        patch_slot(sr->slot, v->code, obj);
        if (*sr->slot == v->code) b->sites++;
    }
    if (h) dlclose(h);
}

static void bind_all(void)
{
    /* never wait for the lock: a thread inside dlopen (holding ld.so's lock) may reach here
     * while the binding thread waits for ld.so; the binder repeats for it instead */
    atomic_store(&bind_again, 1);
    while (atomic_load(&bind_again) && pthread_mutex_trylock(&bind_lock) == 0) {
        while (atomic_exchange(&bind_again, 0)) {
            for (int i = 0; i < nhooks; i++)
                if (hooks[i].d->library[0] && !hooks[i].library_def) {
                    void *lib = real_dlopen(hooks[i].d->library, RTLD_NOW | RTLD_NOLOAD);
                    if (lib) hooks[i].library_def = dlsym(lib, hooks[i].d->symbol); /* lib stays open */
                }
            bind_once();
        }
        pthread_mutex_unlock(&bind_lock);
    }
}

static const char *origin_of(const void *caller, char *buf, size_t len)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm) return NULL;
    if (lm->l_name && lm->l_name[0])
        snprintf(buf, len, "%s", lm->l_name);
    else { /* the main program: argv[0] may be relative, /proc/self/exe is not */
        ssize_t n = readlink("/proc/self/exe", buf, len - 1);
        if (n <= 0) return NULL;
        buf[n] = '\0';
    }
    char *slash = strrchr(buf, '/');
    if (slash) *slash = '\0';
    return buf;
}

/* Searches dir list `path` (':'-separated, $ORIGIN expanded) for file; a handle or NULL. */
static void *open_in_path(const char *path, const char *origin, const char *file, int mode)
{
    for (const char *s = path; s && *s;) {
        const char *e = strchr(s, ':');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        char dir[1024], full[2300];
        snprintf(dir, sizeof dir, "%.*s", (int)n, s);
        const char *o = strstr(dir, "$ORIGIN"), *ob = strstr(dir, "${ORIGIN}");
        if ((o || ob) && origin) {
            const char *at = ob ? ob : o;
            snprintf(full, sizeof full, "%.*s%s%s/%s", (int)(at - dir), dir, origin, at + (ob ? 9 : 7), file);
        } else
            snprintf(full, sizeof full, "%s/%s", dir, file);
        if (n && access(full, R_OK) == 0) {
            void *h = real_dlopen(full, mode);
            if (h) return h;
        }
        s = e ? e + 1 : s + n;
    }
    return NULL;
}

/* The real dlopen, called from here, would search libdpshim.so's RPATH/RUNPATH instead of the
 * caller's: for a name without '/', the caller's are searched in ld.so's order (RPATH, then
 * LD_LIBRARY_PATH, then RUNPATH), after a check for a library already loaded under that name. */
static void *open_from_caller_path(const char *file, int mode, const void *caller)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!file || strchr(file, '/') || !dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm ||
        !lm->l_ld)
        return NULL;
    const char *strtab = NULL, *rpath = NULL, *runpath = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++)
        if (d->d_tag == DT_STRTAB) strtab = (const char *)dyn_addr(d->d_un.d_ptr, lm->l_addr);
    for (const ElfW(Dyn) *d = lm->l_ld; strtab && d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_RUNPATH) runpath = strtab + d->d_un.d_val;
        if (d->d_tag == DT_RPATH) rpath = strtab + d->d_un.d_val;
    }
    if (!rpath && !runpath) return NULL;
    void *h = real_dlopen(file, mode | RTLD_NOLOAD);
    if (h) return h;
    char origin[1024];
    const char *org = origin_of(caller, origin, sizeof origin);
    if (!runpath && (h = open_in_path(rpath, org, file, mode))) return h;
    if ((h = open_in_path(getenv("LD_LIBRARY_PATH"), NULL, file, mode))) return h;
    return runpath ? open_in_path(runpath, org, file, mode) : NULL;
}

static void *dlopen_wrapper(const char *file, int mode)
{
    in_dlopen++;
    void *h = open_from_caller_path(file, mode, __builtin_return_address(0));
    if (!h) h = real_dlopen(file, mode);
    in_dlopen--;
    /* a dlopen from a constructor of a library still loading waits for the outer one: ld.so
     * has not finished relocating what it is loading */
    if (h && !in_dlopen) bind_all();
    return h;
}

int dps_ffi_hooks_start(const dps_policy_t *p, char *err, size_t len)
{
    if (!p->nhooks) return 0;
    if (open_ffi(err, len)) return -1;
    Dl_info info;
    if (dladdr((void *)&dps_ffi_hooks_start, &info)) self_base = info.dli_fbase;
    page = sysconf(_SC_PAGESIZE);
    *(void **)&real_dlopen = dlsym(RTLD_NEXT, "dlopen");
    if (!real_dlopen) *(void **)&real_dlopen = dlsym(RTLD_DEFAULT, "dlopen");
    hooks = calloc((size_t)p->nhooks, sizeof *hooks);
    if (!hooks) return snprintf(err, len, "out of memory for %d hooks", p->nhooks), -1;
    nhooks = p->nhooks;
    for (int i = 0; i < nhooks; i++) {
        hooks[i].d = &p->hooks[i];
        if (prepare_cif(&hooks[i], err, len)) return -1;
    }
    bind_all();
    for (int i = 0; i < nhooks; i++) {
        const bound_t *b = &hooks[i];
        const char *src = p->file[0] ? p->file : "policy";
        int defined = b->defined ||
                      (b->d->library[0] ? b->library_def != NULL : dlsym(RTLD_DEFAULT, b->d->symbol) != NULL);
        if (b->sites)
            DPS_INFO("[hook %s] %s bound at %d call site(s)", b->d->name, b->d->symbol, b->sites);
        else if (b->d->missing == DPS_MISSING_ERROR)
            return snprintf(err, len, "%s:%d: [hook %s]: %s %s%s%s (missing = error)", src, b->d->line,
                            b->d->name, b->d->symbol,
                            defined ? "is defined but no loaded object calls it through its GOT"
                                    : "is not defined by any loaded object",
                            b->d->library[0] ? " in " : "", b->d->library),
                   -1;
        else if (b->d->missing == DPS_MISSING_WARN && dps_g.rank == 0)
            DPS_WARN("%s:%d: [hook %s]: %s %s; it is bound if a library loaded later calls it", src,
                     b->d->line, b->d->name, b->d->symbol,
                     defined ? "is defined but not called through any GOT yet"
                             : "is not defined by any loaded object");
    }
    return 0;
}
