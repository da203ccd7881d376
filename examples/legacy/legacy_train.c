/* legacy_train: a single-process trainer on liblegacy, unchanged for dpshim. legacy.conf makes
 * it data-parallel: mpirun -np N env DPSHIM_POLICY=legacy.conf LD_PRELOAD=libdpshim.so legacy_train */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "legacy.h"
#include "nn/dpnn.h" /* only its IDX file reader */

int main(int argc, char **argv)
{
    const char *data = "/usr/share/datasets/fashion-mnist", *save = NULL;
    size_t steps = 0, bs = 100, limit = 0;
    unsigned seed = 1;
    int epochs = 1;
    float lr = 0.1f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto usage;
        if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--save"))
            save = v;
        else if (!strcmp(a, "--steps"))
            steps = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--batch"))
            bs = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--epochs"))
            epochs = atoi(v);
        else if (!strcmp(a, "--seed"))
            seed = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--lr"))
            lr = strtof(v, NULL);
        else if (!strcmp(a, "--train-limit"))
            limit = strtoul(v, NULL, 10);
        else
            goto usage;
        i++;
    }
    if (!bs) goto usage;
    char img[1100], lab[1100], err[512];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", data);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", data);
    dpnn_data_t d;
    if (dpnn_data_load(img, lab, &d, err, sizeof err) != 0) {
        fprintf(stderr, "legacy_train: %s\n", err);
        return 1;
    }
    size_t n = limit && limit < d.n ? limit : d.n;
    float *w = malloc(LEGACY_PARAMS * sizeof *w), *g = malloc(LEGACY_PARAMS * sizeof *g);
    int64_t *perm = malloc(n * sizeof *perm), *idx = malloc(bs * sizeof *idx);
    if (!w || !g || !perm || !idx) return 1;
    legacy_init_weights(w, LEGACY_PARAMS, seed);
    size_t step = 0;
    for (int e = 1; e <= epochs && (!steps || step < steps); e++) {
        legacy_shuffle(perm, n, seed * 1000003ull + (uint64_t)e);
        double loss = 0;
        size_t batches = 0;
        for (size_t start = 0; start < n && (!steps || step < steps); start += bs) {
            size_t k = legacy_batch(perm, n, start, bs, idx);
            loss += legacy_gradient(w, d.pixels, d.labels, idx, k, g);
            legacy_sgd_update(w, g, LEGACY_PARAMS, lr);
            batches++, step++;
        }
        printf("epoch %d: %zu steps, mean loss %.4f, training accuracy %.2f%%\n", e, batches,
               loss / (double)batches, 100.0 * legacy_accuracy(w, d.pixels, d.labels, n));
    }
    if (save && legacy_save_model(save, w, LEGACY_PARAMS) != 0) {
        fprintf(stderr, "legacy_train: cannot write %s\n", save);
        return 1;
    }
    dpnn_data_free(&d);
    free(w), free(g), free(perm), free(idx);
    return 0;
usage:
    fprintf(stderr,
            "usage: legacy_train [--data DIR] [--epochs N] [--steps N] [--batch N] [--lr X] [--seed N] "
            "[--train-limit N] [--save PATH]\n");
    return 2;
}
