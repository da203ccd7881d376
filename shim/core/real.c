/* Resolution of the real symbols behind the interposers (see real.h). */
#define _GNU_SOURCE
#include "real.h"

#include "dps.h"

void dps_real_resolve(const dps_real_now_t *r, size_t n)
{
    dps_elf_sym_t syms[64];
    n = n < 64 ? n : 64;
    for (size_t i = 0; i < n; i++)
        syms[i].name = r[i].name;
    dps_elf_next(syms, n);
    for (size_t i = 0; i < n; i++)
        __atomic_store_n(r[i].real, syms[i].addr, __ATOMIC_RELAXED);
}

void *dps_real_find(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (DPS_UNLIKELY(!f)) {
        const char *why = dlerror();
        dps_fatal("%s: the program calls it, but no library loaded after libdpshim.so defines it (%s); "
                  "link the program with the library that provides %s, or start it without LD_PRELOAD",
                  name, why ? why : "dlsym found nothing", name);
    }
    return f;
}
