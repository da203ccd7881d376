/* The real symbol behind an interposer: declared once per symbol, resolved lazily with
 * dlsym(RTLD_NEXT) on first use. Racing threads resolve the same address, so a relaxed atomic
 * store is enough and no lock is taken on the call path. A symbol that no object after
 * libdpshim.so defines ends the process with a message naming it (dps_real_find): calling
 * through a NULL pointer would be a SIGSEGV that says nothing. */
#ifndef DPS_REAL_H
#define DPS_REAL_H

#define _GNU_SOURCE
#include <dlfcn.h>

#include "policy.h" /* DPS_STARTUP_DATA: the write family is resolved in every process */

/* The definition of `name` after libdpshim.so; never NULL (fatal instead). */
void *dps_real_find(const char *name);

#define DPS_REAL_DECLARE(ret, name, params) DPS_STARTUP_DATA static ret(*dps_real_##name) params

#define DPS_REAL(name)                                                                                       \
    (__atomic_load_n(&dps_real_##name, __ATOMIC_RELAXED)                                                     \
         ? dps_real_##name                                                                                   \
         : (__atomic_store_n((void **)&dps_real_##name, dps_real_find(#name), __ATOMIC_RELAXED),             \
            dps_real_##name))

/* Resolves names now: dps_real_resolve(r, n) with r[] = {DPS_REAL_NOW(name), ...}. For the
 * functions a program may hand a string that dlerror() returned (fprintf(stderr, "%s",
 * dlerror()), write(2, msg, len)): glibc frees that string at the next dl call, so a first call
 * that looked the real function up with dlsym would print freed memory. Their files resolve them
 * in a constructor, before the program runs, all in one walk of the loaded objects' symbol
 * tables (dps_elf_next: every process under the preload pays this, and no dl call is made); one
 * not found stays for DPS_REAL, which ends the process naming it if the program ever calls it. */
typedef struct dps_real_now {
    const char *name;
    void **real;
} dps_real_now_t;
#define DPS_REAL_NOW(name)                                                                                   \
    {                                                                                                        \
#name, (void **)&dps_real_##name                                                                     \
    }
void dps_real_resolve(const dps_real_now_t *r, size_t n);

#endif
