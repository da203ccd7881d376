/* The program's own MPI_Init/MPI_Finalize, so that its MPI and the shim's share one MPI: a
 * second MPI_Init after the shim initialized MPI is a successful no-op, and the shim lets go of
 * its communicator before the program finalizes. The constants used are the same in Open MPI
 * and MPICH (MPI_SUCCESS = 0), so this file needs no mpi.h. */
#include "core/real.h"
#include "engine/engine.h"

#define DPS_MPI_SUCCESS 0

DPS_REAL_DECLARE(int, MPI_Init, (int *, char ***));
DPS_REAL_DECLARE(int, MPI_Init_thread, (int *, char ***, int, int *));
DPS_REAL_DECLARE(int, MPI_Query_thread, (int *));
DPS_REAL_DECLARE(int, MPI_Finalize, (void));

DPS_EXPORT int MPI_Init(int *argc, char ***argv)
{
    if (dps_engine_owns_mpi_init()) return DPS_MPI_SUCCESS;
    return DPS_REAL(MPI_Init)(argc, argv);
}

DPS_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    if (dps_engine_owns_mpi_init()) return DPS_REAL(MPI_Query_thread)(provided);
    return DPS_REAL(MPI_Init_thread)(argc, argv, required, provided);
}

DPS_EXPORT int MPI_Finalize(void)
{
    dps_engine_before_mpi_finalize();
    return DPS_REAL(MPI_Finalize)();
}
