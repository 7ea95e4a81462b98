/*
 * cpu_elementwise.h: the CPU kernels of the elementwise family, defined in
 * cpu_unary.c (unary math, silu_mul, dropout), cpu_reduce.c (sum, max/min,
 * scatter along a dim) and cpu_compare.c (comparisons, where), and gathered
 * into fl_cpu_elementwise_kernels by cpu_elementwise.c. Contracts are those
 * of the table in core/backend/backend.h.
 */
#ifndef FL_CPU_ELEMENTWISE_H
#define FL_CPU_ELEMENTWISE_H

#include "cpu_kernels.h"

fl_unary_kernel fl_cpu_unary;
fl_unary_backward_kernel fl_cpu_unary_backward;
fl_silu_mul_kernel fl_cpu_silu_mul;
fl_silu_mul_backward_kernel fl_cpu_silu_mul_backward;
fl_dropout_kernel fl_cpu_dropout;

fl_sum_kernel fl_cpu_sum;
fl_minmax_kernel fl_cpu_minmax;
fl_scatter_dim_kernel fl_cpu_scatter_dim;

fl_compare_kernel fl_cpu_compare;
fl_where_kernel fl_cpu_where;

fl_moe_route_kernel fl_cpu_moe_route;
fl_moe_route_backward_kernel fl_cpu_moe_route_backward;

#endif /* FL_CPU_ELEMENTWISE_H */
