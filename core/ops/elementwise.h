/*
 * elementwise.h: the kernel table of the elementwise family: unary math and
 * activations (and their fused backward), silu(a) * b, dropout,
 * reductions (sum/mean, max/min with indices), comparisons, where, and the
 * top-k routing of a mixture of experts (core/ops/moe.c). One
 * table per device kind; the op files (unary.c, reduce.c, compare.c) do
 * the validation, shapes, FLOPs and autograd, and reach kernels only
 * through fl_elementwise_kernels_of.
 */
#ifndef FL_OPS_ELEMENTWISE_H
#define FL_OPS_ELEMENTWISE_H

#include "internal.h"

/* Unary kernel op codes beyond the public fl_unary_op ones: the ops with
 * scalar parameters (p0, p1 below). */
enum {
    FL_UNARY_POW = FL_UNARY_OP_COUNT, /* x ^ p0 */
    FL_UNARY_CLAMP,                   /* min(max(x, p0), p1); +-inf for no bound */
    FL_UNARY_KERNEL_COUNT
};

/* Does the backward of op read the op's output (rather than its input)?
 * exp, sqrt, rsqrt, tanh, sigmoid and relu express their derivative through
 * y, which the next op usually keeps anyway, so saving y costs no memory. */
static inline bool fl_unary_saves_output(int op) {
    return op == FL_EXP || op == FL_SQRT || op == FL_RSQRT || op == FL_TANH ||
           op == FL_SIGMOID || op == FL_RELU;
}

typedef struct fl_elementwise_kernels {
    /* out = f(x); x has out's shape, any strides and dtype. */
    int (*unary)(int op, fl_tensor *out, const fl_tensor *x, double p0, double p1);
    /* gx = gy * f'(.) where s is the op's input, or its output when
     * fl_unary_saves_output(op); all of gx's shape, any strides. */
    int (*unary_backward)(int op, fl_tensor *gx, const fl_tensor *gy, const fl_tensor *s,
                          double p0, double p1);
    /* out = silu(gate) * up, all of one shape. */
    int (*silu_mul)(fl_tensor *out, const fl_tensor *gate, const fl_tensor *up);
    /* g_gate = gy * up * silu'(gate), g_up = gy * silu(gate); either output
     * may be NULL. Every tensor contiguous. */
    int (*silu_mul_backward)(fl_tensor *g_gate, fl_tensor *g_up, const fl_tensor *gy,
                             const fl_tensor *gate, const fl_tensor *up);
    /* out = x * keep_i / (1 - p), keep_i = (uniform value i of key >= p);
     * out and x of one shape (x any strides). Backward is the same call on
     * the output gradient. */
    int (*dropout)(fl_tensor *out, const fl_tensor *x, double p, const fl_random_spec *key);
    /* out = sum over the dims d of `in` with reduce[d], divided by divisor
     * (1 for a sum); in contiguous, out contiguous with the kept dims in
     * order. */
    int (*sum)(fl_tensor *out, const fl_tensor *in, const bool *reduce, double divisor);
    /* values/indices = max (or min) of contiguous `in` along dim; outputs
     * contiguous, of in's shape without dim. */
    int (*minmax)(bool is_max, fl_tensor *values, fl_tensor *indices, const fl_tensor *in,
                  int dim);
    /* out = 0 except out[..., indices[...], ...] = src[...] along dim (out
     * contiguous; src and indices contiguous, of out's shape without dim). */
    int (*scatter_dim)(fl_tensor *out, const fl_tensor *src, const fl_tensor *indices, int dim);
    /* out (bool) = a op b; a and b are views with out's shape. */
    int (*compare)(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b);
    /* out = cond ? a : b; cond, a, b are views with out's shape. */
    int (*where)(fl_tensor *out, const fl_tensor *cond, const fl_tensor *a, const fl_tensor *b);
    /* Mixture-of-experts routing, row by row of logits [N, E] (contiguous,
     * any float dtype): p = softmax(logits) in the compute dtype (f64 for
     * f64, else f32), the k = ids->shape[1] largest p in descending order
     * (ties: the lower expert first), weights [N, k] (compute dtype) = those
     * p, divided by their sum when `normalize`; ids [N, k] i64. Outputs
     * contiguous. */
    int (*moe_route)(fl_tensor *weights, fl_tensor *ids, const fl_tensor *logits, bool normalize);
    /* Its backward: dlogits [N, E] (logits' dtype) from dweights [N, k]
     * (compute dtype), p recomputed from logits; all contiguous. */
    int (*moe_route_backward)(fl_tensor *dlogits, const fl_tensor *dweights,
                              const fl_tensor *logits, const fl_tensor *ids, bool normalize);
} fl_elementwise_kernels;

extern const fl_elementwise_kernels fl_cpu_elementwise_kernels;

/* The table for a device, or NULL with an error naming the op. */
const fl_elementwise_kernels *fl_elementwise_kernels_of(const char *op, fl_device device);

#endif /* FL_OPS_ELEMENTWISE_H */
