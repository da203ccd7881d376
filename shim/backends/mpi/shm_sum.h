/* Small all-reduces through shared memory, for a communicator whose ranks all run on one machine
 * (shm_sum.c). Open MPI's own paths for a few bytes (point-to-point messages through its
 * shared-memory transport, or its coll/sm component) cost more than the shim's whole call. */
#ifndef DPS_SHM_SUM_H
#define DPS_SHM_SUM_H

#include <stddef.h>

#include <mpi.h>

typedef struct dps_shm_sum dps_shm_sum_t;

/* Collective over comm: every rank gets a mapping, or every rank gets NULL (ranks on several
 * machines, no shared memory, max_bytes 0); why not, in why_p (for the log). */
dps_shm_sum_t *dps_shm_sum_open(MPI_Comm comm, size_t max_bytes, const char **why_p);

/* The largest buffer dps_shm_sum takes, in bytes (0 without a mapping). */
size_t dps_shm_sum_max(const dps_shm_sum_t *s);

/* buf = (the ranks' pre * buf combined by o in rank order) * post, the same bits on every rank,
 * for count * es <= dps_shm_sum_max(s); op names o for the check that every rank reduces alike.
 * 0, or -1 with err filled (a rank reducing another count, dtype or operation). */
int dps_shm_sum(dps_shm_sum_t *s, void *buf, int count, int dtype, MPI_Datatype t, MPI_Op o, int op,
                size_t es, double pre, double post, char *err, size_t errlen);

void dps_shm_sum_close(dps_shm_sum_t *s);

/* Where set (elastic mode), a wait for another rank gives up when it returns non-zero:
 * dps_shm_sum returns -2 with buf as it was, and the segment takes no more sums. */
extern int (*dps_shm_abandon)(void);

#endif
