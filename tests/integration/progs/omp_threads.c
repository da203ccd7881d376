/* An OpenMP program: the threads its parallel regions get, as its OpenMP runtime (loaded, and
 * its environment read, before the shim's constructor runs) decides them. */
#include <omp.h>
#include <stdio.h>

int main(void)
{
    int team = 0;
#pragma omp parallel
    {
#pragma omp single
        team = omp_get_num_threads();
    }
    printf("openmp threads %d\n", team);
    return 0;
}
