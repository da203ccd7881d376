/* fmnist_train inside a program that uses MPI itself: it calls MPI_Init and MPI_Finalize and
 * sends its own messages on MPI_COMM_WORLD, around the unmodified trainer. With --mpi-late it
 * calls MPI_Init only after training, when the shim has long initialized MPI. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int fmnist_main(int argc, char **argv);

static int own_traffic(void)
{
    int rank, size, sum = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (sum != size * (size - 1) / 2) {
        fprintf(stderr, "fmnist_train_mpi: own MPI_Allreduce gave %d, expected %d\n", sum,
                size * (size - 1) / 2);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int late = argc > 1 && strcmp(argv[1], "--mpi-late") == 0;
    if (late) argv[1] = argv[0], argc--, argv++;
    if (!late && (MPI_Init(&argc, &argv) != MPI_SUCCESS || own_traffic())) return 1;
    int rc = fmnist_main(argc, argv);
    if (late && MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
    if (own_traffic()) rc = 1;
    if (MPI_Finalize() != MPI_SUCCESS) rc = 1;
    if (rc == 0) printf("fmnist_train_mpi: own MPI traffic ok\n");
    return rc;
}
