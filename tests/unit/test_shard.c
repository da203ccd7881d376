/* Sharding and weighting arithmetic: split shares cover each batch once and weight to one;
 * epoch shards cover each sample exactly once (join), at least once (pad), at most once (drop). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard.h"

static void test_split(void)
{
    for (int size = 1; size <= 9; size++)
        for (uint64_t n = 0; n <= 70; n++) {
            uint64_t next = 0, lo = n, hi = 0;
            double wsum = 0;
            for (int r = 0; r < size; r++) {
                uint64_t start, count;
                dps_split_range(n, r, size, &start, &count);
                CHECK(start == next, "n=%llu size=%d rank=%d not contiguous", (unsigned long long)n, size, r);
                next = start + count;
                lo = count < lo ? count : lo, hi = count > hi ? count : hi;
                wsum += dps_split_weight(count, n);
            }
            CHECK(next == n, "n=%llu size=%d covers %llu", (unsigned long long)n, size,
                  (unsigned long long)next);
            CHECK(hi - lo <= 1, "n=%llu size=%d shares differ by %llu", (unsigned long long)n, size,
                  (unsigned long long)(hi - lo));
            if (n) CHECK(wsum > 1 - 1e-12 && wsum < 1 + 1e-12, "weights sum to %.17g", wsum);
        }
    /* the case of the acceptance tests: batch 100 on 3 ranks */
    uint64_t s, c;
    dps_split_range(100, 0, 3, &s, &c);
    CHECK(s == 0 && c == 34, "rank 0 of 3: %llu+%llu", (unsigned long long)s, (unsigned long long)c);
    dps_split_range(100, 2, 3, &s, &c);
    CHECK(s == 67 && c == 33, "rank 2 of 3: %llu+%llu", (unsigned long long)s, (unsigned long long)c);
}

static void test_epoch(dps_uneven_t mode)
{
    for (int size = 1; size <= 5; size++)
        for (uint64_t n = 0; n <= 41; n++) {
            int *seen = calloc(n + 1, sizeof *seen);
            uint64_t *idx = malloc((n + 1) * sizeof *idx), scratch[8];
            uint64_t total = 0, per0 = dps_epoch_count(n, 0, size, mode);
            for (int r = 0; r < size; r++) {
                /* the reversed order: a permutation for every n */
                for (uint64_t i = 0; i < n; i++)
                    idx[i] = n - 1 - i;
                uint64_t k = dps_epoch_shard(idx, n, r, size, mode, scratch);
                CHECK(k == dps_epoch_count(n, r, size, mode), "count mismatch");
                if (mode != DPS_UNEVEN_JOIN)
                    CHECK(k == per0, "mode %d: rank %d gets %llu, rank 0 %llu", mode, r,
                          (unsigned long long)k, (unsigned long long)per0);
                for (uint64_t j = 0; j < k; j++) {
                    CHECK(idx[j] < n, "index out of range");
                    if (idx[j] < n) seen[idx[j]]++;
                }
                total += k;
            }
            for (uint64_t i = 0; i < n; i++) {
                if (mode == DPS_UNEVEN_JOIN)
                    CHECK(seen[i] == 1, "join: sample %llu seen %d times", (unsigned long long)i, seen[i]);
                if (mode ==
                    DPS_UNEVEN_PAD) /* padding repeats the head evenly, more than once when n < size */
                    CHECK(seen[i] >= 1 && (uint64_t)seen[i] <= (total + n - 1) / n,
                          "pad: sample seen %d times", seen[i]);
                if (mode == DPS_UNEVEN_DROP) CHECK(seen[i] <= 1, "drop: sample seen %d times", seen[i]);
            }
            if (mode == DPS_UNEVEN_PAD)
                CHECK(total == (n + size - 1) / size * size && total - n < (uint64_t)size, "pad total");
            if (mode == DPS_UNEVEN_DROP) CHECK(total == n / size * size, "drop total");
            if (mode == DPS_UNEVEN_JOIN) CHECK(total == n, "join total");
            free(seen);
            free(idx);
        }
}

static void test_strided(void)
{
    /* DistributedSampler's layout: rank r takes positions r, r+N, ... */
    uint64_t idx[10], scratch[4];
    for (int i = 0; i < 10; i++)
        idx[i] = 100 + i;
    uint64_t k = dps_epoch_shard(idx, 10, 1, 4, DPS_UNEVEN_PAD, scratch);
    CHECK(k == 3 && idx[0] == 101 && idx[1] == 105 && idx[2] == 109, "strided rank 1: %llu %llu %llu",
          (unsigned long long)idx[0], (unsigned long long)idx[1], (unsigned long long)idx[2]);
    for (int i = 0; i < 10; i++)
        idx[i] = 100 + i;
    k = dps_epoch_shard(idx, 10, 3, 4, DPS_UNEVEN_PAD, scratch);
    CHECK(k == 3 && idx[2] == 101, "pad wraps to the head: %llu", (unsigned long long)idx[2]);
}

int main(void)
{
    test_split();
    test_epoch(DPS_UNEVEN_PAD);
    test_epoch(DPS_UNEVEN_DROP);
    test_epoch(DPS_UNEVEN_JOIN);
    test_strided();
    return check_report("test_shard");
}
