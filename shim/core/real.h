/* The real symbol behind an interposer: declared once per symbol, resolved lazily with
 * dlsym(RTLD_NEXT) on first use. Racing threads resolve the same address, so a relaxed atomic
 * store is enough and no lock is taken on the call path. */
#ifndef DPS_REAL_H
#define DPS_REAL_H

#define _GNU_SOURCE
#include <dlfcn.h>

#define DPS_REAL_DECLARE(ret, name, params) static ret(*dps_real_##name) params

#define DPS_REAL(name)                                                                          \
    (__atomic_load_n(&dps_real_##name, __ATOMIC_RELAXED)                                        \
         ? dps_real_##name                                                                      \
         : (__atomic_store_n((void **)&dps_real_##name, dlsym(RTLD_NEXT, #name), __ATOMIC_RELAXED), \
            dps_real_##name))

#endif
