/* Built twice (libffi_dup_a.so with DUP_VALUE 1, libffi_dup_b.so with DUP_VALUE 100) and opened
 * RTLD_LOCAL by ffi_roundtrip: each library calls its own ft_dup through its GOT, and a hook on
 * ft_dup must call each library's own definition. */
#include <stdint.h>

int32_t ft_dup(int32_t x)
{
    return x + DUP_VALUE;
}

int32_t dup_call(int32_t x)
{
    return ft_dup(x);
}
