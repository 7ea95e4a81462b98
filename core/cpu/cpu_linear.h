/*
 * cpu_linear.h: the CPU kernels of the linear family, spread over
 * cpu_matmul.c (GEMM, row sums, and the table itself), cpu_embedding.c,
 * cpu_conv2d.c and cpu_pool2d.c. Their contracts are the fields of
 * fl_linear_kernels (core/backend/backend.h).
 */
#ifndef FL_CPU_LINEAR_H
#define FL_CPU_LINEAR_H

#include "cpu_kernels.h"

fl_embedding_kernel fl_cpu_embedding;
fl_embedding_backward_kernel fl_cpu_embedding_backward;
fl_conv2d_kernel fl_cpu_conv2d;
fl_conv2d_backward_kernel fl_cpu_conv2d_backward;
fl_max_pool2d_kernel fl_cpu_max_pool2d;
fl_max_pool2d_backward_kernel fl_cpu_max_pool2d_backward;

/* C = A @ B (+ beta * C) in the compute dtype ct (f32: fl_cpu_sgemm; f64:
 * BLAS dgemm), row-major, with the BLAS transposition flags: what every
 * kernel of the family multiplies with (conv2d's im2col products too). */
void fl_cpu_gemm_ct(fl_dtype ct, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                    int64_t ldc);

/* Products of at most this many multiply-adds run on one thread inside
 * OpenBLAS (0.3.x: GEMM_MULTITHREAD_THRESHOLD 4 x SMP_THRESHOLD_MIN 65536),
 * so a batch of them is better spread over OpenMP threads, one product per
 * thread, than run one after another. */
enum { FL_CPU_SMALL_GEMM = 1 << 18 };

#endif /* FL_CPU_LINEAR_H */
