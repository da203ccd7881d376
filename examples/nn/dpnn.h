/* dpnn: a small neural-network framework for the examples (dense, ReLU, BatchNorm, softmax
 * cross-entropy, SGD with momentum, IDX data, checkpoints). It knows nothing of ranks: it calls
 * the dpshim hook ABI through weak references at its natural points, and runs alone when no
 * shim is preloaded. */
#ifndef DPNN_H
#define DPNN_H

#include <stddef.h>
#include <stdint.h>

/* A labelled image set, pixels kept as bytes and scaled to [0,1] when a batch is gathered. */
typedef struct dpnn_data {
    uint8_t *pixels; /* n * dim */
    uint8_t *labels; /* n */
    size_t n, dim;
} dpnn_data_t;

/* Reads a pair of IDX files (gzipped or not). On error returns -1 with a message naming the
 * file and what is wrong. */
int dpnn_data_load(const char *images, const char *labels, dpnn_data_t *out, char *err, size_t errlen);
void dpnn_data_free(dpnn_data_t *d);

#define DPNN_MAX_HIDDEN 8

typedef struct dpnn_config {
    size_t in_dim, nclass;
    int nhidden;
    size_t hidden[DPNN_MAX_HIDDEN];
    int batchnorm; /* BatchNorm after each hidden dense layer */
    float lr, momentum;
    uint64_t seed;
} dpnn_config_t;

typedef struct dpnn_model dpnn_model_t;

dpnn_model_t *dpnn_create(const dpnn_config_t *cfg);
void dpnn_free(dpnn_model_t *m);

typedef struct dpnn_epoch_stats {
    double loss;    /* mean cross-entropy over the epoch's samples */
    uint64_t steps; /* optimizer steps taken in the epoch */
} dpnn_epoch_stats_t;

/* One epoch of shuffled mini-batch SGD; stops early once the model has taken max_steps steps
 * in total (0: no limit). Returns 0, or -1 on error. */
int dpnn_train_epoch(dpnn_model_t *m, const dpnn_data_t *d, size_t batch, uint64_t max_steps,
                     dpnn_epoch_stats_t *stats);
uint64_t dpnn_steps(const dpnn_model_t *m);

/* Classification accuracy in [0,1] on d, BatchNorm in inference mode. */
double dpnn_evaluate(dpnn_model_t *m, const dpnn_data_t *d, size_t batch);

/* Checkpoints: every parameter and BatchNorm running statistic, written with plain stdio
 * (under dpshim, [files] rank0_only makes the write rank 0's alone and atomic). */
int dpnn_save(const dpnn_model_t *m, const char *path, char *err, size_t errlen);
int dpnn_load(dpnn_model_t *m, const char *path, char *err, size_t errlen);

/* Reading checkpoints without a model (for comparison tools). */
typedef struct dpnn_ckpt_tensor {
    char name[64];
    uint64_t count;
    float *data;
} dpnn_ckpt_tensor_t;
int dpnn_ckpt_read(const char *path, dpnn_ckpt_tensor_t **tensors_p, size_t *n_p, char *err, size_t errlen);
void dpnn_ckpt_free(dpnn_ckpt_tensor_t *t, size_t n);

#endif
