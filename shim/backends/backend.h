/* Communication backends: one table row each (backend.c). The engine picks one per job; a
 * backend that needs a foreign library (MPI, NCCL) lives in a plugin opened at first use. What a
 * plugin and the library agree on is in plugin_abi/. */
#ifndef DPS_BACKEND_H
#define DPS_BACKEND_H

#include <stddef.h>

#include "plugin_abi/backend.h"
#include "plugin_abi/device.h"

/* Opens the named backend ("mpi"); NULL with err set on failure. */
const dps_backend_t *dps_backend_open(const char *name, int rank, int size, char *err, size_t errlen);

/* Opens libdpshim-nccl.so beside libdpshim.so: NULL with err set when it or the CUDA runtime
 * cannot be loaded. Once per process; later calls return the same table or the same error. */
const dps_device_t *dps_device_open(char *err, size_t errlen);

#endif
