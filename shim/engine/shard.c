/* Data-sharding arithmetic (see shard.h). */
#include "shard.h"

void dps_split_range(uint64_t n, int rank, int size, uint64_t *start_p, uint64_t *count_p)
{
    uint64_t base = n / (uint64_t)size, extra = n % (uint64_t)size, r = (uint64_t)rank;
    *count_p = base + (r < extra);
    *start_p = r * base + (r < extra ? r : extra);
}

double dps_split_weight(uint64_t share, uint64_t n)
{
    return n ? (double)share / (double)n : 0.0;
}

uint64_t dps_epoch_count(uint64_t n, int rank, int size, dps_uneven_t uneven)
{
    uint64_t s = (uint64_t)size;
    switch (uneven) {
    case DPS_UNEVEN_PAD:
        return n ? (n + s - 1) / s : 0;
    case DPS_UNEVEN_DROP:
        return n / s;
    case DPS_UNEVEN_JOIN:
        return n / s + ((uint64_t)rank < n % s);
    }
    return 0;
}

uint64_t dps_epoch_shard(uint64_t *idx, uint64_t n, int rank, int size, dps_uneven_t uneven,
                         uint64_t *scratch)
{
    uint64_t keep = dps_epoch_count(n, rank, size, uneven), s = (uint64_t)size;
    /* Padding positions p >= n read idx[p - n] < size: save the head before it is overwritten.
     * The in-place gather is safe otherwise: output j reads position rank + j*size >= j. */
    uint64_t head = n < s ? n : s;
    if (uneven == DPS_UNEVEN_PAD)
        for (uint64_t i = 0; i < head; i++)
            scratch[i] = idx[i];
    for (uint64_t j = 0; j < keep; j++) {
        uint64_t p = (uint64_t)rank + j * s;
        idx[j] = p < n ? idx[p] : scratch[(p - n) % head];
    }
    return keep;
}
