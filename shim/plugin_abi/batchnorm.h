/* The one-pass BatchNorm backward that libdpshim.so exports for the adapters (shim/engine/
 * batchnorm.c): the PyTorch adapter calls it through ctypes, the libtorch adapter directly. Plain
 * C, nothing of the shim: both sides include it. */
#ifndef DPS_PLUGIN_ABI_BATCHNORM_H
#define DPS_PLUGIN_ABI_BATCHNORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x, dy and gx: contiguous (outer, channels, inner) in dtype (DP_F32 or DP_F64); mean, var (the
 * global batch's, rounded to dtype), weight (NULL: none) and this rank's gw, gb from the native
 * kernel: per channel, in dtype. total: the global batch's sample count from the forward.
 * over_ranks = 0 leaves the per-channel sums this rank's (the adapters' probe). Returns 0, or -1:
 * not on this CPU (x86-64 with AVX2 and FMA only), out of memory, or dp_bn_stats failed. */
int dpshim_bn_backward(int dtype, uint64_t outer, uint64_t channels, uint64_t inner, const void *x,
                       const void *dy, void *gx, const void *mean, const void *var, const void *weight,
                       const void *gw, const void *gb, double eps, uint64_t total, int over_ranks);

#ifdef __cplusplus
}
#endif

#endif
