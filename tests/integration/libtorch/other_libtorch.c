/* Stands in for a libtorch other than the one the libtorch adapter is built for (another
 * version's soname): it defines one of the entry points the shim forwards, under the same
 * mangled name, and says when it runs. */
#include <stdint.h>
#include <stdio.h>

uintptr_t sgd_step(uintptr_t result,
                   uintptr_t self) __asm__("_ZN5torch5optim3SGD4stepESt8functionIFN2at6TensorEvEE");
uintptr_t sgd_step(uintptr_t result, uintptr_t self)
{
    (void)self;
    printf("the other libtorch's SGD::step ran\n");
    fflush(stdout);
    return result;
}
