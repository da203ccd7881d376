/* The parts of dpshim-bench in files of their own. */
#ifndef DPS_BENCH_H
#define DPS_BENCH_H

/* SET gpu[:MiB] (bench_gpu.c): 1 when every result was bitwise right (or no GPU: 1, said). */
int bench_gpu(const char *mib, int rank, int size);

#endif
