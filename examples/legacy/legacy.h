/* liblegacy: a small training library of the kind many in-house trainers are built on. It knows
 * nothing of dpshim or of any other process: plain exported C functions. legacy.conf, a policy
 * file of [hook] sections, distributes a program built on it without changing either. */
#ifndef LEGACY_H
#define LEGACY_H

#include <stddef.h>
#include <stdint.h>

/* Softmax regression on 28x28 images: 10 x 784 weights, then 10 biases. */
#define LEGACY_CLASSES 10
#define LEGACY_PIXELS 784
#define LEGACY_PARAMS (LEGACY_CLASSES * LEGACY_PIXELS + LEGACY_CLASSES)

/* Small random weights from a seed. */
void legacy_init_weights(float *w, size_t n, unsigned seed);
/* perm = a random permutation of 0..n-1 from a seed. */
void legacy_shuffle(int64_t *perm, size_t n, uint64_t seed);
/* The batch starting at perm[start]: up to bs indices into idx; returns how many. */
size_t legacy_batch(const int64_t *perm, size_t n, size_t start, size_t bs, int64_t *idx);
/* Mean cross-entropy over the count samples idx[] of (pixels, labels), and its gradient in g. */
float legacy_gradient(const float *w, const uint8_t *pixels, const uint8_t *labels, const int64_t *idx,
                      size_t count, float *g);
/* w -= lr * g */
void legacy_sgd_update(float *w, const float *g, size_t n, float lr);
/* Writes the weights to path; 0 on success. */
int legacy_save_model(const char *path, const float *w, size_t n);
/* Fraction of the n samples classified right. */
double legacy_accuracy(const float *w, const uint8_t *pixels, const uint8_t *labels, size_t n);

#endif
