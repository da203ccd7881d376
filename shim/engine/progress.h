/* The progress thread of [comm] overlap (progress.c). */
#ifndef DPS_PROGRESS_H
#define DPS_PROGRESS_H

#include <stddef.h>

#include "engine.h"

/* 1 when gradients can be reduced in the background on be (policy on, the backend has a
 * background channel, the thread runs; started at the first call). */
int dps_progress_available(const dps_backend_t *be);
/* Queue tensors t[0..n) as one group (fused like dps_fused); they must stay untouched until
 * dps_progress_wait returns. 0, or -1 after logging. */
int dps_progress_submit(const dp_tensor *t, size_t n, dps_weight_t w);
/* Until every queued group is reduced: 0, or -1 with the first failure described in err. */
int dps_progress_wait(char *err, size_t errlen);
/* At exit or before the program's MPI_Finalize. */
void dps_progress_stop(void);

#endif
