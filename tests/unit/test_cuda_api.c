/* The GPU plugin's own CUDA and NCCL declarations (shim/backends/nccl/cuda_api.h) against the
 * real headers, where the CUDA toolkit is installed: the plugin builds without them, so
 * nothing else would notice a value that drifted. */
#include <stddef.h>
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backends/nccl/cuda_api.h"
#include "check.h"

int main(void)
{
    CHECK((int)DPS_cudaSuccess == (int)cudaSuccess, "differs from the real header");
    CHECK((int)DPS_cudaErrorNotReady == (int)cudaErrorNotReady, "differs from the real header");
    CHECK((int)DPS_cudaErrorCudartUnloading == (int)cudaErrorCudartUnloading, "differs from the real header");
    CHECK((int)DPS_cudaStreamCaptureModeThreadLocal == (int)cudaStreamCaptureModeThreadLocal,
          "differs from the real header");
    CHECK((void *)DPS_cudaStreamLegacy == (void *)cudaStreamLegacy, "differs from the real header");
    CHECK((int)DPS_cudaStreamNonBlocking == (int)cudaStreamNonBlocking, "differs from the real header");
    CHECK((int)DPS_cudaEventDisableTiming == (int)cudaEventDisableTiming, "differs from the real header");
    CHECK((int)DPS_cudaHostAllocDefault == (int)cudaHostAllocDefault, "differs from the real header");
    CHECK((int)DPS_cudaStreamCaptureStatusNone == (int)cudaStreamCaptureStatusNone,
          "differs from the real header");
    CHECK((int)DPS_cudaMemcpyHostToDevice == (int)cudaMemcpyHostToDevice, "differs from the real header");
    CHECK((int)DPS_cudaMemcpyDeviceToHost == (int)cudaMemcpyDeviceToHost, "differs from the real header");
    CHECK((int)DPS_cudaMemcpyDeviceToDevice == (int)cudaMemcpyDeviceToDevice, "differs from the real header");

    CHECK((int)DPS_ncclSuccess == (int)ncclSuccess, "differs from the real header");
    CHECK((int)DPS_ncclInProgress == (int)ncclInProgress, "differs from the real header");
    CHECK((int)DPS_ncclRemoteError == (int)ncclRemoteError, "differs from the real header");
    CHECK(sizeof(dps_ncclUniqueId) == sizeof(ncclUniqueId), "differs from the real header");
    CHECK((int)DPS_ncclInt8 == (int)ncclInt8 && (int)DPS_ncclUint8 == (int)ncclUint8 &&
              (int)DPS_ncclInt32 == (int)ncclInt32,
          "differs from the real header");
    CHECK((int)DPS_ncclInt64 == (int)ncclInt64 && (int)DPS_ncclFloat16 == (int)ncclFloat16 &&
              (int)DPS_ncclFloat32 == (int)ncclFloat32,
          "differs from the real header");
    CHECK((int)DPS_ncclFloat64 == (int)ncclFloat64 && (int)DPS_ncclBfloat16 == (int)ncclBfloat16,
          "differs from the real header");
    CHECK((int)DPS_ncclSum == (int)ncclSum && (int)DPS_ncclMax == (int)ncclMax &&
              (int)DPS_ncclMin == (int)ncclMin,
          "differs from the real header");
    CHECK((int)DPS_ncclScalarHostImmediate == (int)ncclScalarHostImmediate, "differs from the real header");

    /* the config prefix: same offsets as the header's, and the header's initializer values */
    ncclConfig_t real = NCCL_CONFIG_INITIALIZER;
    CHECK(DPS_NCCL_CONFIG_MAGIC == real.magic, "differs from the real header");
    CHECK(DPS_NCCL_CONFIG_UNDEF_INT == real.blocking, "differs from the real header");
    CHECK(offsetof(dps_ncclConfig_t, blocking) == offsetof(ncclConfig_t, blocking),
          "differs from the real header");
    CHECK(offsetof(dps_ncclConfig_t, maxCTAs) == offsetof(ncclConfig_t, maxCTAs),
          "differs from the real header");
    CHECK(offsetof(dps_ncclConfig_t, netName) == offsetof(ncclConfig_t, netName),
          "differs from the real header");
    CHECK(sizeof(dps_ncclConfig_t) <= sizeof(ncclConfig_t), "differs from the real header");
    CHECK(DPS_NCCL_CONFIG_VERSION < (unsigned)NCCL_VERSION_CODE, "differs from the real header");
    return check_report("cuda_api");
}
