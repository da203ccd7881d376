/* Epochs in scale mode on the hook ABI, as a C framework runs them, for the elastic tests: each
 * epoch a permutation of N samples (every rank draws the same), this rank's shard from dp_epoch,
 * batches of B, then its share of what ranks lost in the epoch had not trained (dp_epoch_rest),
 * asked again after each share until there is none.
 *   elastic_epochs EPOCHS N B [KILL_RANK KILL_STEP]...
 * Each KILL_RANK dies with SIGKILL as step KILL_STEP (counted from 1 over the whole run) starts.
 * TRACE=PREFIX: each rank appends "EPOCH SAMPLE..." to PREFIX.RANK for each batch whose step
 * ended, so that the lines of every rank, the lost one's included, say what was trained. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

enum { MAX_KILLS = 4 };
static int trace = -1, kill_rank[MAX_KILLS], kills, start_rank;
static uint64_t kill_step[MAX_KILLS], step;

/* One step per batch of idx[0..n): the batch told (dp_batch), a gradient sum, then the step's end
 * and its trace line. */
static void train(int epoch, uint64_t *idx, size_t n, size_t batch)
{
    static float g[16];
    dp_tensor t = {g, 16, DP_F32, DP_HOST, "grad"};
    for (size_t s = 0; s < n; s += batch) {
        size_t b = n - s < batch ? n - s : batch;
        for (int k = 0; k < kills; k++)
            if (start_rank == kill_rank[k] && step + 1 == kill_step[k]) raise(SIGKILL);
        if (dp_batch(idx + s, b) != b) exit(1); /* scale mode: the batch as it is, counted */
        for (int i = 0; i < 16; i++)
            g[i] = 1.0f;
        if (dp_grads(&t, 1) != 0) exit(1);
        dp_step_end(++step);
        char line[1 << 16];
        size_t o = (size_t)snprintf(line, sizeof line, "%d", epoch);
        for (size_t i = 0; i < b && o + 24 < sizeof line; i++)
            o += (size_t)snprintf(line + o, sizeof line - o, " %llu", (unsigned long long)idx[s + i]);
        line[o++] = '\n';
        if (trace >= 0 && write(trace, line, o) != (ssize_t)o) exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4 || !dp_epoch || !dp_epoch_rest) {
        fprintf(
            stderr,
            "usage: elastic_epochs EPOCHS N BATCH [KILL_RANK KILL_STEP]..., under LD_PRELOAD=libdpshim.so "
            "(hook ABI version 5)\n");
        return 2;
    }
    int epochs = atoi(argv[1]);
    size_t n = strtoul(argv[2], NULL, 10), batch = strtoul(argv[3], NULL, 10);
    for (int a = 4; a + 1 < argc && kills < MAX_KILLS; a += 2, kills++)
        kill_rank[kills] = atoi(argv[a]), kill_step[kills] = strtoull(argv[a + 1], NULL, 10);
    start_rank = dp_rank();
    if (getenv("TRACE")) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", getenv("TRACE"), start_rank);
        trace = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    }
    uint64_t *idx = malloc(n * sizeof *idx);
    if (!idx || batch == 0) return 2;
    for (int e = 0; e < epochs; e++) {
        uint64_t seed = 7 + (uint64_t)e;
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        for (size_t i = n; i > 1; i--) { /* the same draw on every rank */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t j = (size_t)((seed >> 33) % i);
            uint64_t t = idx[i - 1];
            idx[i - 1] = idx[j], idx[j] = t;
        }
        train(e, idx, dp_epoch(idx, n), batch);
        for (size_t rest; (rest = dp_epoch_rest(idx, n)) != 0;)
            train(e, idx, rest < n ? rest : n, batch);
    }
    double ranks = 1;
    dp_metric(&ranks, 1, DP_SUM);
    printf("rank %d of %d (started as %d): %llu steps, %.0f ranks\n", dp_rank(), dp_world_size(), start_rank,
           (unsigned long long)step, ranks);
    free(idx);
    return 0;
}
