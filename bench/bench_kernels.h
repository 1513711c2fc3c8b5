/* Kernel micro-benchmarks (bench/bench_kernels.c): sgemm, attention fwd+bwd,
 * and the elementwise layers at Llama-ish sizes, printed one line each.
 * Meant for `baton bench kernels`; the training-throughput benchmark lives
 * in bench/cmd_bench.c. */
#ifndef BT_BENCH_BENCH_KERNELS_H
#define BT_BENCH_BENCH_KERNELS_H

#include <stdio.h>

/* Runs every benchmark whose name contains filter (NULL: all), printing to
 * out. threads: OpenBLAS threads (<= 0: all cores). Returns 0. */
int bench_kernels_run(FILE *out, const char *filter, int threads);

#endif
