/* Declarative hooks: [hook NAME] policy sections bound to the program with libffi closures
 * (ffihooks.c; the declarations are parsed by policy/hookdecl.c). */
#ifndef DPS_FFIHOOKS_H
#define DPS_FFIHOOKS_H

#include <stddef.h>

#include "policy.h"

/* In the constructor of a rank process (never of its children): build a closure per declared hook
 * and bind every loaded object's calls to it (and, from then on, those of objects loaded with
 * dlopen). 0, or -1 with err set (a hook with missing = error whose function is nowhere, libffi
 * absent). No-op without hooks. */
int dps_ffi_hooks_start(const dps_policy_t *p, char *err, size_t len);

/* How many [hook] declarations there are, and at how many call sites they are bound. */
void dps_ffi_hooks_summary(int *declared, int *sites);

#endif
