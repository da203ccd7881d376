#define _GNU_SOURCE
/* A single-process Fashion-MNIST trainer on dpnn. It has no notion of ranks: under
 * `mpirun -np N env LD_PRELOAD=libdpshim.so` the same binary trains data-parallel. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nn/dpnn.h"

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

static void usage(FILE *f)
{
    fprintf(f, "usage: fmnist_train [options]\n"
               "  --data DIR         IDX files (default " DEFAULT_DATA ",\n"
               "                     from Debian's dataset-fashion-mnist package)\n"
               "  --epochs N         epochs (default 2)\n"
               "  --steps N          stop after N optimizer steps in total (default: no limit)\n"
               "  --batch N          mini-batch size (default 100)\n"
               "  --lr X             learning rate (default 0.05)\n"
               "  --momentum X       SGD momentum (default 0.9)\n"
               "  --hidden A,B,...   hidden layer widths (default 256,128)\n"
               "  --no-bn            no BatchNorm\n"
               "  --seed N           initialization and shuffling seed (default 1)\n"
               "  --train-limit N    use only the first N training samples\n"
               "  --no-eval          skip the test-set evaluation\n"
               "  --save PATH        write a checkpoint at the end\n"
               "  --log PATH         append each epoch's figures to PATH\n"
               "  --load PATH        start from a checkpoint\n");
}

static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || !*s) return -1;
    *out = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int load_set(const char *dir, const char *prefix, dpnn_data_t *d)
{
    char img[4096], lab[4096], err[8192];
    snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    if (dpnn_data_load(img, lab, d, err, sizeof err) == 0) return 0;
    fprintf(stderr, "fmnist_train: %s\n", err);
    if (access(img, R_OK) != 0 || access(lab, R_OK) != 0)
        fprintf(stderr,
                "fmnist_train: install Debian's dataset-fashion-mnist package (apt-get install "
                "dataset-fashion-mnist), which provides " DEFAULT_DATA ", or pass --data DIR "
                "holding %s-images-idx3-ubyte.gz and %s-labels-idx1-ubyte.gz\n",
                prefix, prefix);
    return -1;
}

int main(int argc, char **argv)
{
    const char *data = DEFAULT_DATA, *save = NULL, *load = NULL, *log_path = NULL;
    unsigned long long epochs = 2, steps = 0, batch = 100, seed = 1, limit = 0;
    int eval = 1;
    dpnn_config_t cfg = {.in_dim = 784,
                         .nclass = 10,
                         .nhidden = 2,
                         .hidden = {256, 128},
                         .batchnorm = 1,
                         .lr = 0.05f,
                         .momentum = 0.9f};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes = 1;
        if (!strcmp(a, "--data"))
            data = v, bad = !v;
        else if (!strcmp(a, "--epochs"))
            bad = parse_u64(v, &epochs);
        else if (!strcmp(a, "--steps"))
            bad = parse_u64(v, &steps);
        else if (!strcmp(a, "--batch"))
            bad = parse_u64(v, &batch) || batch == 0;
        else if (!strcmp(a, "--seed"))
            bad = parse_u64(v, &seed);
        else if (!strcmp(a, "--train-limit"))
            bad = parse_u64(v, &limit);
        else if (!strcmp(a, "--lr"))
            bad = !v || (cfg.lr = strtof(v, NULL)) <= 0;
        else if (!strcmp(a, "--momentum"))
            bad = !v || (cfg.momentum = strtof(v, NULL)) < 0;
        else if (!strcmp(a, "--save"))
            save = v, bad = !v;
        else if (!strcmp(a, "--load"))
            load = v, bad = !v;
        else if (!strcmp(a, "--log"))
            log_path = v, bad = !v;
        else if (!strcmp(a, "--hidden")) {
            cfg.nhidden = 0;
            for (char *s = v ? strdup(v) : NULL, *save_p = NULL, *tok = s ? strtok_r(s, ",", &save_p) : NULL;
                 tok; tok = strtok_r(NULL, ",", &save_p)) {
                unsigned long long w;
                if (cfg.nhidden == DPNN_MAX_HIDDEN || parse_u64(tok, &w) || w == 0)
                    bad = 1;
                else
                    cfg.hidden[cfg.nhidden++] = (size_t)w;
            }
            bad |= !v;
        } else {
            takes = 0;
            if (!strcmp(a, "--no-bn"))
                cfg.batchnorm = 0;
            else if (!strcmp(a, "--no-eval"))
                eval = 0;
            else if (!strcmp(a, "--help") || !strcmp(a, "-h"))
                return usage(stdout), 0;
            else
                bad = 1;
        }
        if (bad) {
            fprintf(stderr, "fmnist_train: bad or missing value for %s\n", a);
            usage(stderr);
            return 2;
        }
        i += takes;
    }
    cfg.seed = seed;

    dpnn_data_t train, test = {0};
    if (load_set(data, "train", &train) != 0) return 1;
    if (eval && load_set(data, "t10k", &test) != 0) return 1;
    if (limit && limit < train.n) train.n = (size_t)limit;

    dpnn_model_t *m = dpnn_create(&cfg);
    if (!m) {
        fprintf(stderr, "fmnist_train: cannot build the model\n");
        return 1;
    }
    char err[8192];
    if (load && dpnn_load(m, load, err, sizeof err) != 0) {
        fprintf(stderr, "fmnist_train: %s\n", err);
        return 1;
    }
    printf("fmnist_train: %zu training samples, model 784", train.n);
    for (int h = 0; h < cfg.nhidden; h++)
        printf("-%zu", cfg.hidden[h]);
    printf("-10%s, batch %llu, lr %g, momentum %g\n", cfg.batchnorm ? " with batchnorm" : "", batch,
           (double)cfg.lr, (double)cfg.momentum);
    FILE *log = log_path ? fopen(log_path, "a") : NULL;
    if (log_path && !log) {
        fprintf(stderr, "fmnist_train: cannot open %s: %s\n", log_path, strerror(errno));
        return 1;
    }
    double acc = -1.0;
    for (unsigned long long e = 1; e <= epochs && !(steps && dpnn_steps(m) >= steps); e++) {
        double t0 = now();
        dpnn_epoch_stats_t st;
        if (dpnn_train_epoch(m, &train, (size_t)batch, steps, &st) != 0) {
            fprintf(stderr, "fmnist_train: training failed (out of memory?)\n");
            return 1;
        }
        printf("epoch %llu: %llu steps, loss %.4f", e, (unsigned long long)st.steps, st.loss);
        if (eval) printf(", test accuracy %.2f%%", 100.0 * (acc = dpnn_evaluate(m, &test, 1000)));
        printf(" (%.2f s)\n", now() - t0);
        fflush(stdout);
        if (log)
            fprintf(log, "epoch %llu steps %llu loss %.6f accuracy %.6f\n", e, (unsigned long long)st.steps,
                    st.loss, acc),
                fflush(log);
    }
    if (save) {
        if (dpnn_save(m, save, err, sizeof err) != 0) {
            fprintf(stderr, "fmnist_train: %s\n", err);
            return 1;
        }
        printf("saved %s after %llu steps\n", save, (unsigned long long)dpnn_steps(m));
    }
    if (acc >= 0) printf("final test accuracy %.2f%%\n", 100.0 * acc);
    if (log) fclose(log);
    dpnn_free(m);
    dpnn_data_free(&train);
    dpnn_data_free(&test);
    return 0;
}
