/* Data-sharding arithmetic: which samples each rank keeps and how its gradient is weighted.
 * Pure functions of (n, rank, size), unit-tested alone. */
#ifndef DPS_SHARD_H
#define DPS_SHARD_H

#include <stddef.h>
#include <stdint.h>

typedef enum { DPS_UNEVEN_PAD, DPS_UNEVEN_DROP, DPS_UNEVEN_JOIN } dps_uneven_t;

/* split mode: rank's contiguous share of a batch of n; shares differ by at most one and the
 * larger ones go to the lower ranks. */
void dps_split_range(uint64_t n, int rank, int size, uint64_t *start_p, uint64_t *count_p);

/* split mode: weight of a rank's locally averaged gradient in the global mean (share / n). */
double dps_split_weight(uint64_t share, uint64_t n);

/* scale mode: how many samples of an epoch of n this rank keeps. */
uint64_t dps_epoch_count(uint64_t n, int rank, int size, dps_uneven_t uneven);

/* scale mode: this rank's shard of the epoch permutation idx[0..n), strided like PyTorch's
 * DistributedSampler (positions rank, rank+size, ...), written to idx[0..ret). pad repeats the
 * permutation's head so every rank gets ceil(n/size); drop cuts to floor(n/size); join keeps the
 * natural uneven shares. scratch must hold min(n, size) elements (used by pad only). */
uint64_t dps_epoch_shard(uint64_t *idx, uint64_t n, int rank, int size, dps_uneven_t uneven,
                         uint64_t *scratch);

#endif
