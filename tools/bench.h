/* The parts of dpshim-bench in files of their own. Include after <dpshim/hooks.h>. */
#ifndef DPS_BENCH_H
#define DPS_BENCH_H

#include <stddef.h>

/* SET gpu[:MiB] (bench_gpu.c): 1 when every result was bitwise right (or no GPU: 1, said). */
int bench_gpu(const char *mib, int rank, int size);
/* SET gpu-sweep[:MiB,...]: dp_grads on device buffers against NCCL called directly. */
int bench_gpu_sweep(const char *list, int rank, int size);
/* SET gpu-overlap: the overlap set (dpshim_bench.c) with its tensors in GPU memory. */
int bench_gpu_overlap(int rank, int size);

/* From dpshim_bench.c: ResNet-50's parameter tensor sizes (161 of them) into sz, and one
 * simulated step of backward (tensors announced last to first with dp_grad_ready when
 * `announce`, a sleep per tensor in proportion to its size, compute_ns in all) ended by dp_grads:
 * the slowest rank's seconds. */
size_t bench_resnet50(size_t *sz);
double bench_backward_step(dp_tensor *t, size_t nt, size_t total, double compute_ns, int announce);

#endif
