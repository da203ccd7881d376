/* [gpu] bind: each local rank sees only its own GPU, through CUDA_VISIBLE_DEVICES, set in the
 * shim's constructor before the program can make its first CUDA call. No CUDA library is
 * loaded for this: the devices are counted in /dev, or taken from the user's own list. */
#ifndef DPS_GPU_BIND_H
#define DPS_GPU_BIND_H

#include <stddef.h>

/* NVIDIA devices this process can open (/dev/nvidia0, /dev/nvidia1, ...). */
int dps_gpu_count(void);

/* The device entry for a local rank: entry local_rank % n of the user's CUDA_VISIBLE_DEVICES
 * list (indices, GPU-/MIG- UUIDs; spaces around entries ignored) when it is set, else of
 * 0 .. ngpus-1. Returns the number of devices n (0: nothing to bind, out untouched); *shared
 * is 1 when local ranks outnumber them. */
int dps_gpu_pick(const char *user_list, int ngpus, int local_rank, int local_size, char *out, size_t outlen,
                 int *shared);

/* In the constructor of a rank process: applies [gpu] bind = auto. */
struct dps_state;
void dps_gpu_bind(struct dps_state *s);

#endif
