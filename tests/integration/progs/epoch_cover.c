/* Hook-level check of scale-mode epoch sharding under a real launcher: every rank shards the
 * same permutation with dp_epoch, the per-sample counts are summed with dp_metric, and rank 0
 * checks them against the policy's uneven mode.  usage: epoch_cover MODE N...  (MODE: pad|drop) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

int main(int argc, char **argv)
{
    if (argc < 3 || !dp_epoch) {
        fprintf(stderr, "usage: epoch_cover pad|drop N... (under LD_PRELOAD=libdpshim.so)\n");
        return 2;
    }
    int pad = strcmp(argv[1], "pad") == 0, size = dp_world_size(), bad = 0;
    for (int a = 2; a < argc; a++) {
        size_t n = strtoul(argv[a], NULL, 10);
        uint64_t *idx = malloc((n + 1) * sizeof *idx);
        double *count = calloc(n + 2, sizeof *count);
        for (size_t i = 0; i < n; i++)
            idx[i] = n - 1 - i;
        size_t k = dp_epoch(idx, n);
        for (size_t j = 0; j < k; j++)
            count[idx[j] < n ? idx[j] : n] += 1; /* count[n]: out of range */
        count[n + 1] = (double)k;
        double kmax = (double)k, kmin = (double)k;
        dp_metric(count, n + 2, DP_SUM);
        dp_metric(&kmax, 1, DP_MAX);
        dp_metric(&kmin, 1, DP_MIN);
        if (dp_rank() == 0) {
            size_t expect_each = pad ? (n + size - 1) / size : n / size;
            int ok = count[n] == 0 && kmin == kmax && kmax == (double)expect_each;
            for (size_t i = 0; i < n; i++)
                ok &= pad ? count[i] >= 1 : count[i] <= 1;
            ok &= count[n + 1] == (double)(expect_each * size);
            printf("epoch_cover %s n=%zu size=%d per_rank=%.0f total=%.0f %s\n", argv[1], n, size, kmax,
                   count[n + 1], ok ? "ok" : "WRONG");
            bad |= !ok;
        }
        free(idx);
        free(count);
    }
    return bad;
}
