/* Symbols of the loaded objects, read from their own hash tables (see dps.h, dps_elf_defines and
 * dps_elf_next): what dlsym answers, without dlsym's error state, allocation or locks beyond
 * dl_iterate_phdr's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>

#include "dps.h"

/* One object's dynamic symbol tables. */
typedef struct dyn_syms {
    uintptr_t base;
    const uint32_t *gnu, *sysv; /* DT_GNU_HASH, DT_HASH: one at least, or the object is skipped */
    const ElfW(Sym) * symtab;
    const ElfW(Half) * versym;
    const char *strtab;
} dyn_syms_t;

/* ld.so rewrites most objects' dynamic entries to addresses; the vDSO's stay offsets. */
static uintptr_t dyn_ptr(uintptr_t v, uintptr_t base)
{
    return v < base ? v + base : v;
}

static int read_syms(const struct dl_phdr_info *info, dyn_syms_t *t)
{
    memset(t, 0, sizeof *t);
    t->base = info->dlpi_addr;
    const ElfW(Dyn) *d = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            d = (const ElfW(Dyn) *)(t->base + info->dlpi_phdr[i].p_vaddr);
    for (; d && d->d_tag != DT_NULL; d++) {
        uintptr_t p = dyn_ptr(d->d_un.d_ptr, t->base);
        if (d->d_tag == DT_GNU_HASH) t->gnu = (const uint32_t *)p;
        if (d->d_tag == DT_HASH) t->sysv = (const uint32_t *)p;
        if (d->d_tag == DT_SYMTAB) t->symtab = (const ElfW(Sym) *)p;
        if (d->d_tag == DT_STRTAB) t->strtab = (const char *)p;
        if (d->d_tag == DT_VERSYM) t->versym = (const ElfW(Half) *)p;
    }
    return t->symtab && t->strtab && (t->gnu || t->sysv) ? 0 : -1;
}

/* A name and its hash in each table's function. */
typedef struct hashed {
    const char *name;
    uint32_t gnu, sysv;
} hashed_t;

static hashed_t hash_name(const char *name)
{
    hashed_t h = {name, 5381, 0};
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        h.gnu = h.gnu * 33 + *c;
        h.sysv = (h.sysv << 4) + *c;
        h.sysv = (h.sysv ^ ((h.sysv & 0xf0000000u) >> 24)) & 0x0fffffffu;
    }
    return h;
}

/* symtab[i] if it is the name's definition that dlsym finds: defined, global or weak, not
 * thread-local, and not a hidden (non-default) version. */
static const ElfW(Sym) * definition(const dyn_syms_t *t, size_t i, const hashed_t *h)
{
    const ElfW(Sym) *s = &t->symtab[i];
    int bind = ELF64_ST_BIND(s->st_info);
    if (s->st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) ||
        ELF64_ST_TYPE(s->st_info) == STT_TLS || (t->versym && (t->versym[i] & 0x8000)))
        return NULL;
    /* compared by hand: strcmp would be one more libc function to bind, and one more of its pages
     * to touch, in every process */
    const char *a = t->strtab + s->st_name, *b = h->name;
    while (*a && *a == *b)
        a++, b++;
    return *a == *b ? s : NULL;
}

static const ElfW(Sym) * lookup(const dyn_syms_t *t, const hashed_t *h)
{
    if (t->gnu) {
        const uint32_t *g = t->gnu;
        uint32_t nbuckets = g[0], symoffset = g[1], bloom_size = g[2], shift = g[3];
        const ElfW(Addr) *bloom = (const ElfW(Addr) *)(g + 4);
        const uint32_t *buckets = (const uint32_t *)(bloom + bloom_size), *chain = buckets + nbuckets;
        const unsigned bits = sizeof(ElfW(Addr)) * 8;
        ElfW(Addr) word = bloom[(h->gnu / bits) % bloom_size];
        ElfW(Addr) mask = ((ElfW(Addr))1 << (h->gnu % bits)) | ((ElfW(Addr))1 << ((h->gnu >> shift) % bits));
        if (!nbuckets || (word & mask) != mask) return NULL;
        for (uint32_t i = buckets[h->gnu % nbuckets]; i >= symoffset; i++) {
            uint32_t h2 = chain[i - symoffset];
            const ElfW(Sym) *s = (h2 | 1) == (h->gnu | 1) ? definition(t, i, h) : NULL;
            if (s) return s;
            if (h2 & 1) break;
        }
        return NULL;
    }
    uint32_t nbucket = t->sysv[0];
    const uint32_t *bucket = t->sysv + 2, *chain = bucket + nbucket;
    for (uint32_t i = nbucket ? bucket[h->sysv % nbucket] : STN_UNDEF; i != STN_UNDEF; i = chain[i]) {
        const ElfW(Sym) *s = definition(t, i, h);
        if (s) return s;
    }
    return NULL;
}

/* --- dps_elf_defines: in any object -------------------------------------------------------- */

typedef struct any_query {
    hashed_t h;
    int found;
} any_query_t;

/* dl_iterate_phdr callbacks read the tables only (ld.so's list lock is held). */
static int defines_in(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    any_query_t *q = data;
    dyn_syms_t t;
    q->found = read_syms(info, &t) == 0 && lookup(&t, &q->h);
    return q->found; /* non-zero ends the walk */
}

int dps_elf_defines(const char *name)
{
    any_query_t q = {hash_name(name), 0};
    dl_iterate_phdr(defines_in, &q);
    return q.found;
}

/* --- dps_elf_next: in the objects after libdpshim.so -------------------------------------- */

typedef struct next_query {
    dps_elf_sym_t *syms;
    size_t n;
    int past_self;
    uint64_t ifunc; /* the names that are indirect functions: their address comes from dlsym */
} next_query_t;

static int holds(const struct dl_phdr_info *info, const void *addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (uintptr_t)addr >= lo && (uintptr_t)addr < lo + ph->p_memsz) return 1;
    }
    return 0;
}

static int next_in(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    next_query_t *q = data;
    dyn_syms_t t;
    if (!q->past_self) {
        q->past_self = holds(info, (const void *)&dps_elf_next);
        return 0;
    }
    if (read_syms(info, &t) != 0) return 0;
    int left = 0;
    for (size_t i = 0; i < q->n; i++) {
        dps_elf_sym_t *s = &q->syms[i];
        if (s->addr || (q->ifunc >> i & 1)) continue;
        hashed_t h = hash_name(s->name);
        const ElfW(Sym) *d = lookup(&t, &h);
        if (d && ELF64_ST_TYPE(d->st_info) == STT_GNU_IFUNC)
            q->ifunc |= (uint64_t)1 << i;
        else if (d)
            s->addr = (void *)(t.base + d->st_value);
        else
            left = 1;
    }
    return !left;
}

void dps_elf_next(dps_elf_sym_t *syms, size_t n)
{
    next_query_t q = {syms, n < 64 ? n : 64, 0, 0};
    for (size_t i = 0; i < q.n; i++)
        syms[i].addr = NULL;
    dl_iterate_phdr(next_in, &q);
    for (size_t i = 0; i < q.n; i++)
        if (q.ifunc >> i & 1) syms[i].addr = dlsym(RTLD_NEXT, syms[i].name); /* found: no error is left */
}
