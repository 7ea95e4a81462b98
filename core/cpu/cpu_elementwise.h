/*
 * cpu_elementwise.h: the CPU kernels of the elementwise family, defined in
 * cpu_unary.c (unary math, silu_mul, dropout), cpu_reduce.c (sum, max/min,
 * scatter along a dim) and cpu_compare.c (comparisons, where), and gathered
 * into fl_cpu_elementwise_kernels by cpu_elementwise.c. Contracts are those
 * of the table in core/ops/elementwise.h.
 */
#ifndef FL_CPU_ELEMENTWISE_H
#define FL_CPU_ELEMENTWISE_H

#include "elementwise.h"

int fl_cpu_unary(int op, fl_tensor *out, const fl_tensor *x, double p0, double p1);
int fl_cpu_unary_backward(int op, fl_tensor *gx, const fl_tensor *gy, const fl_tensor *s,
                          double p0, double p1);
int fl_cpu_silu_mul(fl_tensor *out, const fl_tensor *gate, const fl_tensor *up);
int fl_cpu_silu_mul_backward(fl_tensor *g_gate, fl_tensor *g_up, const fl_tensor *gy,
                             const fl_tensor *gate, const fl_tensor *up);
int fl_cpu_dropout(fl_tensor *out, const fl_tensor *x, double p, const fl_random_spec *key);

int fl_cpu_sum(fl_tensor *out, const fl_tensor *in, const bool *reduce, double divisor);
int fl_cpu_minmax(bool is_max, fl_tensor *values, fl_tensor *indices, const fl_tensor *in,
                  int dim);
int fl_cpu_scatter_dim(fl_tensor *out, const fl_tensor *src, const fl_tensor *indices, int dim);

int fl_cpu_compare(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b);
int fl_cpu_where(fl_tensor *out, const fl_tensor *cond, const fl_tensor *a, const fl_tensor *b);

int fl_cpu_moe_route(fl_tensor *weights, fl_tensor *ids, const fl_tensor *logits, bool normalize);
int fl_cpu_moe_route_backward(fl_tensor *dlogits, const fl_tensor *dweights,
                              const fl_tensor *logits, const fl_tensor *ids, bool normalize);

#endif /* FL_CPU_ELEMENTWISE_H */
