/*
 * cpu_elementwise.c: the CPU kernel table of the elementwise family (the
 * kernels themselves live in cpu_unary.c, cpu_reduce.c, cpu_compare.c,
 * cpu_moe.c).
 */
#include "cpu_elementwise.h"

const fl_elementwise_kernels fl_cpu_elementwise_kernels = {
    .unary = fl_cpu_unary,
    .unary_backward = fl_cpu_unary_backward,
    .silu_mul = fl_cpu_silu_mul,
    .silu_mul_backward = fl_cpu_silu_mul_backward,
    .dropout = fl_cpu_dropout,
    .sum = fl_cpu_sum,
    .minmax = fl_cpu_minmax,
    .scatter_dim = fl_cpu_scatter_dim,
    .compare = fl_cpu_compare,
    .where = fl_cpu_where,
    .moe_route = fl_cpu_moe_route,
    .moe_route_backward = fl_cpu_moe_route_backward,
};
