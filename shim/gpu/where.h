/* Where a DP_HOST tensor really lives. A framework may pass device memory without saying so;
 * the CUDA driver knows, and it is asked only when the program has loaded it already: a
 * CPU-only program pays one RTLD_NOLOAD probe per collective hook call, and no CUDA context is
 * ever created for the question. */
#ifndef DPS_GPU_WHERE_H
#define DPS_GPU_WHERE_H

/* Once per hook call, before dps_gpu_where: 1 when the driver is loaded (so asking can help). */
int dps_gpu_driver_loaded(void);
/* The CUDA ordinal of the device memory at p, or -1 (host memory, or no driver). */
int dps_gpu_where(const void *p);

#endif
