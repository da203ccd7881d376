/* The few CUDA runtime and NCCL declarations the plugin uses, so it builds without the CUDA
 * toolkit. Values are those of cuda_runtime_api.h / driver_types.h (CUDA 12 and 13) and nccl.h
 * (2.19 and later); unit.cuda_api checks them against the real headers where they exist. */
#ifndef DPS_CUDA_API_H
#define DPS_CUDA_API_H

#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>

typedef int dps_cudaError_t;
typedef void *dps_cudaStream_t;
typedef void *dps_cudaEvent_t;
#define DPS_cudaSuccess 0
#define DPS_cudaErrorNotReady 600
#define DPS_cudaErrorCudartUnloading 4 /* "driver shutting down": the runtime's exit handler ran */
#define DPS_cudaStreamLegacy ((dps_cudaStream_t)0x1)
#define DPS_cudaStreamNonBlocking 0x1u
#define DPS_cudaEventDisableTiming 0x2u
#define DPS_cudaHostAllocDefault 0x0u
#define DPS_cudaStreamCaptureStatusNone 0
#define DPS_cudaStreamCaptureModeThreadLocal 1
enum { DPS_cudaMemcpyHostToDevice = 1, DPS_cudaMemcpyDeviceToHost = 2, DPS_cudaMemcpyDeviceToDevice = 3 };

typedef int dps_ncclResult_t;
typedef void *dps_ncclComm_t;
typedef int dps_ncclDataType_t;
typedef int dps_ncclRedOp_t;
#define DPS_ncclSuccess 0
#define DPS_ncclInProgress 7
#define DPS_ncclRemoteError 6
#define DPS_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[DPS_NCCL_UNIQUE_ID_BYTES];
} dps_ncclUniqueId;
enum {
    DPS_ncclInt8 = 0,
    DPS_ncclUint8 = 1,
    DPS_ncclInt32 = 2,
    DPS_ncclInt64 = 4,
    DPS_ncclFloat16 = 6,
    DPS_ncclFloat32 = 7,
    DPS_ncclFloat64 = 8,
    DPS_ncclBfloat16 = 9
};
enum { DPS_ncclSum = 0, DPS_ncclMax = 2, DPS_ncclMin = 3 };
#define DPS_ncclScalarHostImmediate 1

/* ncclConfig_t as NCCL 2.14 introduced it: later versions append fields and read `version` to
 * know which a caller filled in, so this prefix is accepted by every release since. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
} dps_ncclConfig_t;
#define DPS_NCCL_CONFIG_MAGIC 0xcafebeefu
#define DPS_NCCL_CONFIG_VERSION 21403u /* NCCL_VERSION(2, 14, 3) */
#define DPS_NCCL_CONFIG_UNDEF_INT INT_MIN
#define DPS_NCCL_SHRINK_ABORT 0x01 /* ends the parent's operations first */

/* A function to look up by name, and where its address goes. */
typedef struct dps_sym_row {
    const char *name;
    void **slot;
} dps_sym_row_t;

/* Every row's symbol from the library h: 0, or -1 with the first missing name in `missing`. */
static inline int dps_bind_syms(void *h, const dps_sym_row_t *rows, size_t n, char *missing, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (!(*rows[i].slot = dlsym(h, rows[i].name))) {
            snprintf(missing, len, "%s", rows[i].name);
            return -1;
        }
    return 0;
}

#endif
