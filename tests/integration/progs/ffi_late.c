/* Opened with dlopen by ffi_roundtrip: its call to ft_late must be bound when it arrives. */
#include <stdint.h>

int32_t ft_late(int32_t x);

int32_t late_call(int32_t x)
{
    return ft_late(x) + 1;
}
