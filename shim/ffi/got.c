/* GOT binding (got.h): finds the GOT slots of the client's symbols in every loaded object with
 * dl_iterate_phdr, resolves each object's references as ld.so does, and patches the slots (a
 * full-RELRO object's read-only pages are unprotected for the store); a dlopen wrapper does the
 * same for objects loaded later and opens bare names from the caller's search path. */
#define _GNU_SOURCE
#include "got.h"

#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dps.h"
#include "core/sys.h"

#if defined(__x86_64__)
#define RELOC_JUMP_SLOT R_X86_64_JUMP_SLOT
#define RELOC_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define RELOC_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define RELOC_GLOB_DAT R_AARCH64_GLOB_DAT
#else
#error "GOT binding is written for x86-64 and aarch64"
#endif

/* A slot's symbol: the client's names[i] (i >= 0), dlopen itself, or one of neither. */
enum { SYM_DLOPEN = -1, SYM_OTHER = -2 };

static const dps_got_client_t *client;
static void **global_def; /* per name: the global scope's definition, during a pass */
static void *self_base;
static long page; /* bytes, for mprotect */
static void *(*real_dlopen)(const char *, int);
static Dl_serinfo *own_path; /* the directories the real dlopen searches for libdpshim.so */
static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int bind_again; /* a dlopen finished while another thread was binding */
static __thread int in_dlopen __attribute__((tls_model("initial-exec")));

static void *dlopen_wrapper(const char *file, int mode);

/* --- finding the slots --- */

typedef struct slot_ref {
    void **slot;
    int sym, obj;
} slot_ref_t;

typedef struct object_ref {
    char name[512];               /* "" for the main program */
    uintptr_t relro_lo, relro_hi; /* the pages ld.so made read-only */
} object_ref_t;

/* One pass's findings, reused from pass to pass (under bind_lock). */
static struct {
    slot_ref_t *slots;
    size_t nslots, capslots;
    object_ref_t *objs;
    size_t nobjs, capobjs;
} found;

/* The dynamic tables that list an object's relocations and name their symbols. */
typedef struct dyn_tables {
    const ElfW(Sym) * symtab;
    const char *strtab;
    const ElfW(Rela) * rela[2]; /* PLT relocations (when RELA), then the others */
    size_t count[2];
} dyn_tables_t;

static uintptr_t dyn_addr(uintptr_t v, uintptr_t base)
{
    return v < base ? v + base : v;
}

/* The object's dynamic section, and its RELRO range as ld.so protects it: whole pages only. */
static const ElfW(Dyn) * read_phdrs(const struct dl_phdr_info *info, object_ref_t *o)
{
    uintptr_t base = info->dlpi_addr;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            o->relro_lo = (base + ph->p_vaddr) & ~(uintptr_t)(page - 1);
            o->relro_hi = (base + ph->p_vaddr + ph->p_memsz) & ~(uintptr_t)(page - 1);
        }
    }
    return dyn;
}

/* 0 when the object has the tables a slot search needs. */
static int read_dynamic(const ElfW(Dyn) * dyn, uintptr_t base, dyn_tables_t *t)
{
    const ElfW(Rela) *jmprel = NULL;
    size_t jmpsz = 0, relasz = 0;
    int pltrel_rela = 1;
    memset(t, 0, sizeof *t);
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB) t->symtab = (const ElfW(Sym) *)dyn_addr(d->d_un.d_ptr, base);
        if (d->d_tag == DT_STRTAB) t->strtab = (const char *)dyn_addr(d->d_un.d_ptr, base);
        if (d->d_tag == DT_JMPREL) jmprel = (const ElfW(Rela) *)dyn_addr(d->d_un.d_ptr, base);
        if (d->d_tag == DT_PLTRELSZ) jmpsz = d->d_un.d_val;
        if (d->d_tag == DT_RELA) t->rela[1] = (const ElfW(Rela) *)dyn_addr(d->d_un.d_ptr, base);
        if (d->d_tag == DT_RELASZ) relasz = d->d_un.d_val;
        if (d->d_tag == DT_PLTREL) pltrel_rela = d->d_un.d_val == DT_RELA;
    }
    t->rela[0] = pltrel_rela ? jmprel : NULL;
    t->count[0] = jmpsz / sizeof(ElfW(Rela)), t->count[1] = relasz / sizeof(ElfW(Rela));
    return t->symtab && t->strtab ? 0 : -1;
}

/* Which symbol a relocation fills, when it is a slot of one we bind. */
static int slot_symbol(const dyn_tables_t *t, const ElfW(Rela) * r)
{
    unsigned type = (unsigned)ELF64_R_TYPE(r->r_info);
    size_t sym = ELF64_R_SYM(r->r_info);
    if ((type != RELOC_JUMP_SLOT && type != RELOC_GLOB_DAT) || !sym) return SYM_OTHER;
    const char *name = t->strtab + t->symtab[sym].st_name;
    if (!strcmp(name, "dlopen")) return SYM_DLOPEN;
    for (int i = 0; i < client->nnames; i++)
        if (!strcmp(name, client->names[i])) return i;
    return SYM_OTHER;
}

static int add_object(const struct dl_phdr_info *info, const object_ref_t *o)
{
    if (dps_grow((void **)&found.objs, &found.capobjs, found.nobjs + 1, sizeof *found.objs)) return -1;
    object_ref_t *to = &found.objs[found.nobjs];
    *to = *o;
    snprintf(to->name, sizeof to->name, "%s", info->dlpi_name ? info->dlpi_name : "");
    return (int)found.nobjs++;
}

static int add_slot(void **slot, int sym, int obj)
{
    if (dps_grow((void **)&found.slots, &found.capslots, found.nslots + 1, sizeof *found.slots)) return -1;
    found.slots[found.nslots++] = (slot_ref_t){slot, sym, obj};
    return 0;
}

/* dl_iterate_phdr callback: only reads the ELF tables (no libdl calls while it holds ld.so's
 * list lock); resolution and patching come after. Slots are recorded object by object. */
static int collect_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    uintptr_t base = info->dlpi_addr;
    if ((self_base && (void *)base == self_base) || (client->skip && (const void *)base == client->skip))
        return 0;
    object_ref_t o = {.relro_lo = 0};
    dyn_tables_t t;
    const ElfW(Dyn) *dyn = read_phdrs(info, &o);
    if (!dyn || read_dynamic(dyn, base, &t)) return 0;
    int obj = -1;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; t.rela[k] && i < t.count[k]; i++) {
            int sym = slot_symbol(&t, &t.rela[k][i]);
            if (sym == SYM_OTHER) continue;
            if (obj < 0 && (obj = add_object(info, &o)) < 0) return 1;
            if (add_slot((void **)(base + t.rela[k][i].r_offset), sym, obj)) return 1;
        }
    return 0;
}

/* --- patching --- */

static void patch_slot(void **slot, void *to, const object_ref_t *o)
{
    if (*slot == to) return;
    uintptr_t p = (uintptr_t)slot & ~(uintptr_t)(page - 1);
    int in_relro = (uintptr_t)slot >= o->relro_lo && (uintptr_t)slot < o->relro_hi;
    if (in_relro && mprotect((void *)p, (size_t)page, PROT_READ | PROT_WRITE) != 0) return;
    __atomic_store_n(slot, to, __ATOMIC_RELEASE);
    if (in_relro) mprotect((void *)p, (size_t)page, PROT_READ);
}

/* An object as a handle (to dlclose), only when it is fully loaded: RTLD_NOLOAD finds nothing
 * else (the vdso, say). */
static void *object_handle(const char *name)
{
    return real_dlopen(name[0] ? name : NULL, RTLD_LAZY | RTLD_NOLOAD);
}

/* What `handle`'s references to sym bind to, as ld.so looks it up: the global scope first (found
 * once per pass), then the object's own dependencies (an RTLD_LOCAL library's own definition). */
static void *resolve_in(int sym, void *handle)
{
    return global_def[sym] ? global_def[sym] : dlsym(handle, client->names[sym]);
}

static void bind_slot(const slot_ref_t *sr, void *handle)
{
    const object_ref_t *o = &found.objs[sr->obj];
    if (sr->sym == SYM_DLOPEN) {
        patch_slot(sr->slot, (void *)&dlopen_wrapper, o);
        return;
    }
    void *def = resolve_in(sr->sym, handle);
    void *to = def ? client->target(client->ctx, sr->sym, def) : NULL;
    if (!to || *sr->slot == to) return;
    patch_slot(sr->slot, to, o);
    if (*sr->slot == to) client->patched(client->ctx, sr->sym);
}

static void bind_pass(void)
{
    found.nslots = found.nobjs = 0;
    dl_iterate_phdr(collect_object, NULL);
    for (int i = 0; i < client->nnames; i++)
        global_def[i] = dlsym(RTLD_DEFAULT, client->names[i]);
    void *h = NULL;
    int h_obj = -1;
    for (size_t i = 0; i < found.nslots; i++) {
        const slot_ref_t *sr = &found.slots[i];
        if (sr->obj != h_obj) {
            if (h) dlclose(h);
            h = object_handle(found.objs[sr->obj].name);
            h_obj = sr->obj;
        }
        if (h) bind_slot(sr, h);
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
            if (client->pass_begins) client->pass_begins(client->ctx);
            bind_pass();
        }
        pthread_mutex_unlock(&bind_lock);
    }
}

/* --- dlopen: the caller's search path, then binding --- */

/* The directories ld.so searches for a dlopen called from `obj`, in its order: the RPATHs (the
 * object's and its loaders', unless it has a RUNPATH), LD_LIBRARY_PATH, its RUNPATH, the system
 * directories; $ORIGIN expanded. Asked of ld.so itself rather than read from the ELF tables, so
 * that its own rules (secure mode, $ORIGIN and the other substitutions) apply. malloc'd, or NULL. */
static Dl_serinfo *search_path_of(void *obj)
{
    Dl_serinfo size;
    if (dlinfo(obj, RTLD_DI_SERINFOSIZE, &size) != 0) return NULL;
    Dl_serinfo *si = malloc(size.dls_size);
    if (!si) return NULL;
    si->dls_size = size.dls_size, si->dls_cnt = size.dls_cnt;
    if (dlinfo(obj, RTLD_DI_SERINFO, si) != 0) return free(si), NULL;
    return si;
}

/* How many directories end both lists, in the same order. */
static unsigned common_tail(const Dl_serinfo *a, const Dl_serinfo *b)
{
    unsigned n = 0;
    while (n < a->dls_cnt && n < b->dls_cnt &&
           !strcmp(a->dls_serpath[a->dls_cnt - 1 - n].dls_name, b->dls_serpath[b->dls_cnt - 1 - n].dls_name))
        n++;
    return n;
}

static void *open_in(const char *dir, const char *file, int mode)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path) return NULL;
    dps_in_shim++; /* access is interposed: the file policy is not for the shim's own lookups */
    int there = dps_sys_access(path, R_OK) == 0;
    dps_in_shim--;
    return there ? real_dlopen(path, mode) : NULL;
}

/* The real dlopen, called from here, searches libdpshim.so's path, not the caller's (a RUNPATH
 * serves only its own object's dlopen calls). So a name without '/' is looked up as ld.so would
 * for the caller: a library already loaded under that name first, then the caller's directories
 * in ld.so's order. The tail that list shares with libdpshim.so's (the system directories, and
 * LD_LIBRARY_PATH or the program's RPATH where they come last) is left to the real dlopen: it
 * searches the same directories there and consults ld.so.cache before the system ones, which no
 * list shows; it also gives the answer, or the error, for a name no directory has.
 * NULL: call the real dlopen. */
static void *open_from_caller_path(const char *file, int mode, const void *caller)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!file || strchr(file, '/') || !dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
        return NULL;
    void *h = real_dlopen(file, mode | RTLD_NOLOAD);
    if (h) return h;
    void *obj = object_handle(lm->l_name ? lm->l_name : "");
    Dl_serinfo *si = obj ? search_path_of(obj) : NULL;
    unsigned n = si ? si->dls_cnt - (own_path ? common_tail(si, own_path) : 0) : 0;
    for (unsigned i = 0; !h && i < n; i++)
        h = open_in(si->dls_serpath[i].dls_name, file, mode);
    free(si);
    if (obj) dlclose(obj);
    return h;
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

int dps_got_start(const dps_got_client_t *c, char *err, size_t len)
{
    client = c;
    page = sysconf(_SC_PAGESIZE);
    global_def = calloc((size_t)c->nnames + 1, sizeof *global_def);
    if (!global_def) return snprintf(err, len, "out of memory for %d GOT symbols", c->nnames), -1;
    *(void **)&real_dlopen = dlsym(RTLD_NEXT, "dlopen");
    if (!real_dlopen) *(void **)&real_dlopen = dlsym(RTLD_DEFAULT, "dlopen");
    Dl_info info;
    void *self = NULL;
    if (dladdr((void *)&dps_got_start, &info)) {
        self_base = info.dli_fbase;
        self = info.dli_fname ? object_handle(info.dli_fname) : NULL;
    }
    if (self) own_path = search_path_of(self), dlclose(self);
    bind_all();
    return 0;
}
