/* A program of the other libtorch (other_libtorch.c): one optimizer step. */
#include <stdint.h>
#include <stdio.h>

uintptr_t sgd_step(uintptr_t result,
                   uintptr_t self) __asm__("_ZN5torch5optim3SGD4stepESt8functionIFN2at6TensorEvEE");

int main(void)
{
    char tensor[16];
    return sgd_step((uintptr_t)tensor, 0) == (uintptr_t)tensor ? 0 : 1;
}
