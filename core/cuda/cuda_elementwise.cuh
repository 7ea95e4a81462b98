/*
 * cuda_elementwise.cuh: the GPU kernels of the elementwise family, defined
 * in cuda_unary.cu (unary math, silu_mul, dropout), cuda_reduce.cu (sum,
 * max/min, scatter along a dim) and cuda_compare.cu (comparisons, where,
 * and the table fl_cuda_elementwise_kernels). Contracts are those of the
 * table in core/ops/elementwise.h.
 */
#ifndef FL_CUDA_ELEMENTWISE_CUH
#define FL_CUDA_ELEMENTWISE_CUH

extern "C" {
#include "elementwise.h"
}

int fl_cuda_unary(int op, fl_tensor *out, const fl_tensor *x, double p0, double p1);
int fl_cuda_unary_backward(int op, fl_tensor *gx, const fl_tensor *gy, const fl_tensor *s,
                           double p0, double p1);
int fl_cuda_silu_mul(fl_tensor *out, const fl_tensor *gate, const fl_tensor *up);
int fl_cuda_silu_mul_backward(fl_tensor *g_gate, fl_tensor *g_up, const fl_tensor *gy,
                              const fl_tensor *gate, const fl_tensor *up);
int fl_cuda_dropout(fl_tensor *out, const fl_tensor *x, double p, const fl_random_spec *key);

int fl_cuda_sum(fl_tensor *out, const fl_tensor *in, const bool *reduce, double divisor);
int fl_cuda_minmax(bool is_max, fl_tensor *values, fl_tensor *indices, const fl_tensor *in,
                   int dim);
int fl_cuda_scatter_dim(fl_tensor *out, const fl_tensor *src, const fl_tensor *indices, int dim);

int fl_cuda_compare(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b);
int fl_cuda_where(fl_tensor *out, const fl_tensor *cond, const fl_tensor *a, const fl_tensor *b);

/* cuda_moe.cu */
int fl_cuda_moe_route(fl_tensor *weights, fl_tensor *ids, const fl_tensor *logits, bool normalize);
int fl_cuda_moe_route_backward(fl_tensor *dlogits, const fl_tensor *dweights,
                               const fl_tensor *logits, const fl_tensor *ids, bool normalize);

#endif /* FL_CUDA_ELEMENTWISE_CUH */
