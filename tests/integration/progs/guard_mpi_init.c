/* A program that initializes MPI itself with plain MPI_Init (so MPI_THREAD_MULTIPLE is not
 * provided and the guard has no side channel), then trains on the hook ABI.
 *   guard_mpi_init STEPS [stall RANK STEP]
 * stall: RANK sleeps for ever before its collective of step STEP, so the others wait in it. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

int main(int argc, char **argv)
{
    if (argc < 2 || !dp_grads) {
        fprintf(stderr, "usage: guard_mpi_init STEPS [stall RANK STEP] (under the shim)\n");
        return 2;
    }
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
    int provided = -1;
    MPI_Query_thread(&provided);
    int steps = atoi(argv[1]), rank = dp_rank(), size = dp_world_size();
    int stall = argc > 4 && !strcmp(argv[2], "stall");
    int frank = stall ? atoi(argv[3]) : -1, fstep = stall ? atoi(argv[4]) : -1;
    if (rank == 0)
        printf("MPI thread level %s\n", provided == MPI_THREAD_MULTIPLE ? "multiple" : "below multiple");
    static float w[1000], g[1000];
    dp_tensor tw = {w, 1000, DP_F32, DP_HOST, "w"}, tg = {g, 1000, DP_F32, DP_HOST, "w.grad"};
    dp_params(&tw, 1);
    for (int s = 1; s <= steps; s++) {
        if (rank == frank && s == fstep) {
            printf("rank %d stalls at step %d\n", rank, s);
            fflush(stdout);
            for (;;)
                pause();
        }
        for (int i = 0; i < 1000; i++)
            g[i] = (float)(rank + 1);
        dp_grads(&tg, 1);
        for (int i = 0; i < 1000; i++)
            w[i] -= 0.01f * g[i];
        dp_step_end((uint64_t)s);
    }
    double v = 1;
    dp_metric(&v, 1, DP_SUM);
    printf("rank %d finished %d steps, %g ranks\n", rank, steps, v);
    MPI_Finalize();
    return v == size ? 0 : 1;
}
