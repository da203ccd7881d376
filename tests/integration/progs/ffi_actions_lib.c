/* libffi_actions.so: functions that policies/ffi_actions.conf declares with actions that
 * communicate (allreduce, barrier), called by ffi_actions.c through its GOT. */
#include <stddef.h>
#include <stdint.h>

/* Doubles v in place, so that the program sees the action ran before the call. */
void fa_reduce(double *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] *= 2;
}

int64_t fa_total(int64_t *count, size_t n)
{
    int64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += count[i];
    return s;
}

void fa_meet(void) {}
