/*
 * linear.h: the kernel table of the "linear" family (matmul, linear,
 * embedding, conv2d, max_pool2d; cat needs no kernel of its own, it copies
 * through the backend) and the helpers its op files share. One table per
 * device kind.
 */
#ifndef FL_OPS_LINEAR_H
#define FL_OPS_LINEAR_H

#include "internal.h"

typedef struct fl_linear_kernels {
    /* out[batch..., m, n] = a[batch..., m, k] @ b[batch..., k, n], plus
     * bias[n] on every row when bias is not NULL. a and b have out's ndim
     * (>= 2) and batch sizes, with stride 0 on broadcast batch dims, and any
     * strides otherwise; out is contiguous. a, b and out share one float
     * dtype; bias is 1-d of any float dtype. */
    int (*matmul)(fl_tensor *out, const fl_tensor *a, const fl_tensor *b, const fl_tensor *bias);
    /* Bytes matmul would allocate for a while beyond out for the same
     * views (staging copies, a wider result), from shapes, strides and
     * dtypes only: what a meta product imitating this device counts
     * ([Note: virtual storage], core/ops/matmul.c). NULL: none. */
    int64_t (*matmul_scratch)(const fl_tensor *out, const fl_tensor *a, const fl_tensor *b,
                              const fl_tensor *bias);
    /* out [m, n] (contiguous, f32 or f64) += a [m, k] @ b [k, n]: a and b
     * 2-d of one float dtype (any strides), the sum in out's dtype. The
     * chunked accumulation of a weight gradient (core/ops/linear_cross_entropy.c):
     * every chunk adds onto one wide sum, rounded once at the end. */
    int (*matmul_acc)(fl_tensor *out, const fl_tensor *a, const fl_tensor *b);
    /* out[n] = sum over the rows of in [rows, n] (any strides): the bias
     * gradient. out is contiguous, in's dtype. */
    int (*sum_rows)(fl_tensor *out, const fl_tensor *in);
    /* out[i, :] = w[ids[i], :] for the flattened contiguous ids (i64 or
     * i32); out is [numel(ids), D] contiguous. Fails, writing nothing, when
     * an id is outside [0, V). */
    int (*embedding)(fl_tensor *out, const fl_tensor *ids, const fl_tensor *w);
    /* gw ([V, D] contiguous: zeros, or a gradient to add to) += rows of gy
     * [numel(ids), D] at ids, skipping padding_idx (-1: none). */
    int (*embedding_backward)(fl_tensor *gw, const fl_tensor *ids, const fl_tensor *gy,
                              int64_t padding_idx);
    /* out [N, O, Ho, Wo] contiguous = conv2d(x [N, C, H, W], w [O, C, kh,
     * kw]) + bias [O] (or NULL); same float dtype. */
    int (*conv2d)(fl_tensor *out, const fl_tensor *x, const fl_tensor *w, const fl_tensor *bias,
                  const fl_conv2d_options *o);
    /* The gradients of conv2d for gy [N, O, Ho, Wo]: gx (x's shape), gw
     * (w's shape), gb [O]; each contiguous and may be NULL when not wanted;
     * they are written, not accumulated. */
    int (*conv2d_backward)(fl_tensor *gx, fl_tensor *gw, fl_tensor *gb, const fl_tensor *gy,
                           const fl_tensor *x, const fl_tensor *w, const fl_conv2d_options *o);
    /* out and indices [P, Ho, Wo] contiguous (P planes of x [P, H, W]). */
    int (*max_pool2d)(fl_tensor *out, fl_tensor *indices, const fl_tensor *x, int64_t kh,
                      int64_t kw, const fl_conv2d_options *o);
    /* gx [P, H, W] (zeros on entry) += gy [P, Ho, Wo] at indices. */
    int (*max_pool2d_backward)(fl_tensor *gx, const fl_tensor *gy, const fl_tensor *indices);
} fl_linear_kernels;

extern const fl_linear_kernels fl_cpu_linear_kernels;

/* The table for a device, or NULL with an error naming the op. */
const fl_linear_kernels *fl_linear_kernels_of(const char *op, fl_device device);

/* ---- shared by the op files of the family -------------------------------- */

/* A tensor for an op's result: no storage (fake, or meta on meta) when
 * `no_storage`, else fresh memory on device. */
fl_tensor *fl_linear_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                            bool no_storage);

/* The batched product behind matmul, linear and their backward:
 * out = a @ b (+ bias), for a [..., m, k] and b [..., k, n] (ndim >= 2,
 * batch dims broadcast; out has the broadcast batch dims). Validates (the
 * messages name `op`), counts FLOPs, runs the kernel unless an operand has
 * no storage. Not recorded for autograd. If `into` is not NULL it is the
 * contiguous output of the right shape to write; else a new tensor is
 * returned. */
fl_tensor *fl_linear_bmm(const char *op, const fl_tensor *a, const fl_tensor *b,
                         const fl_tensor *bias, fl_tensor *into);

/* A view (stack header sharing t's storage, not reference counted) of t
 * with dims d0 and d1 swapped: how transposed operands reach the kernels. */
void fl_linear_swap_view(const fl_tensor *t, int d0, int d1, fl_tensor *view);

/* Check that tensors share a device and a float dtype; messages name op and
 * `what[i]`. NULL entries are skipped. */
int fl_linear_check_same(const char *op, int n, const fl_tensor *const *ts,
                         const char *const *what);

#endif /* FL_OPS_LINEAR_H */
