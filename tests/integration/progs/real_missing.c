/* Calls MPI_Init through the global scope without being linked with MPI: alone it finds no
 * MPI_Init (exit 3); under the shim it reaches the shim's MPI_Init, whose real symbol does not
 * exist anywhere after libdpshim.so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
    int (*init)(int *, char ***);
    *(void **)&init = dlsym(RTLD_DEFAULT, "MPI_Init");
    if (!init) {
        puts("real_missing: no MPI_Init in this process");
        return 3;
    }
    int rc = init(NULL, NULL);
    printf("real_missing: MPI_Init returned %d\n", rc);
    return 0;
}
