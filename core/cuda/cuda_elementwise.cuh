/*
 * cuda_elementwise.cuh: the GPU kernels of the elementwise family, defined
 * in cuda_unary.cu (unary math, silu_mul, dropout), cuda_reduce.cu (sum,
 * max/min, scatter along a dim) and cuda_compare.cu (comparisons, where,
 * and the table fl_cuda_elementwise_kernels). Contracts are those of the
 * table in core/backend/backend.h.
 */
#ifndef FL_CUDA_ELEMENTWISE_CUH
#define FL_CUDA_ELEMENTWISE_CUH

extern "C" {
#include "backend.h"
}

fl_unary_kernel fl_cuda_unary;
fl_unary_backward_kernel fl_cuda_unary_backward;
fl_silu_mul_kernel fl_cuda_silu_mul;
fl_silu_mul_backward_kernel fl_cuda_silu_mul_backward;
fl_dropout_kernel fl_cuda_dropout;

fl_sum_kernel fl_cuda_sum;
fl_minmax_kernel fl_cuda_minmax;
fl_scatter_dim_kernel fl_cuda_scatter_dim;

fl_compare_kernel fl_cuda_compare;
fl_where_kernel fl_cuda_where;

/* cuda_moe.cu */
fl_moe_route_kernel fl_cuda_moe_route;
fl_moe_route_backward_kernel fl_cuda_moe_route_backward;

#endif /* FL_CUDA_ELEMENTWISE_CUH */
