/* libtorch's entry points, defined under their mangled names (libtorch.c) and forwarded to the
 * libtorch adapter; what the library and that plugin agree on is plugin_abi/libtorch.h. */
#ifndef DPS_LIBTORCH_H
#define DPS_LIBTORCH_H

#include "plugin_abi/libtorch.h"

/* libdpshim.so: what became of the adapter in this process, for the end-of-job summary: "" while
 * no entry point was called, else a sentence (it runs; libtorch is not the one it is built for;
 * it was not built). */
const char *dps_torch_adapter_state(void);
int dps_torch_adapter_running(void);

#endif
