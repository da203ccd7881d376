/* GPU tensors in the engine's collectives (device.c): split from host ones, reduced and
 * broadcast through NCCL or staged through host memory, in the mode all ranks agreed on. */
#ifndef DPS_ENGINE_DEVICE_H
#define DPS_ENGINE_DEVICE_H

#include <stddef.h>

#include "engine.h"

/* 0: every tensor of t[0..n) is in host memory (nothing else done). 1: some are on a GPU, and
 * the lists *host and *device (in the caller's order; each tensor's device resolved, a DP_HOST
 * tensor in device memory included) are valid until the next call. -1: out of memory. */
int dps_device_split(const dp_tensor *t, size_t n, dp_tensor **host, size_t *nhost, dp_tensor **device,
                     size_t *ndevice);

/* dps_fused for device tensors (all on one device). 0, DPS_STOPPED_AT_LOSS (dps_e.stop_at_loss),
 * or fatal: a failed collective leaves ranks with different values. */
int dps_device_fused(const char *hook, const dps_backend_t *be, const dp_tensor *t, size_t n, dps_fuse_t kind,
                     dps_weight_t w, dps_redop_t op);

/* dp_grad_ready with a device tensor: full buckets are queued at once and not waited for. */
int dps_device_grad_ready(const dps_backend_t *be, const dp_tensor *t, dps_weight_t w);
/* dp_grads's device tensors t[0..n): the ones not yet announced and the pending ones queued,
 * then everything of this step waited for. */
int dps_device_grads(const dps_backend_t *be, const dp_tensor *t, size_t n, dps_weight_t w);
/* Device gradients announced in this step and not yet waited for by dp_grads. */
int dps_device_outstanding(void);

/* At exit: queued GPU work gets a time limit, then the communicator is aborted. */
void dps_device_shutdown(void);

#endif
