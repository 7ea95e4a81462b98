/*
 * softmax.c: softmax and log-softmax along one dim, forward and backward.
 *
 * Stable: the lane's max is subtracted before exp. The backward needs
 * only the forward's output y (saved as an alias, no copy):
 *   softmax:     dx = y * (g - sum(g * y))
 *   log_softmax: dx = g - exp(y) * sum(g)
 * Math in f32 (f64 for f64), result in x's dtype, as PyTorch computes
 * bf16 softmax. FLOPs per element: 5 forward (max, subtract, exp, sum,
 * scale), 4 backward.
 */
#include "fused.h"
#include "shape.h"
#include "flops.h"
#include "storage.h"

static const fl_node_type softmax_types[2];

static fl_tensor *softmax_impl(const fl_tensor *x, int dim, bool log) {
    const char *op = log ? "log_softmax" : "softmax";
    if (fl_fused_check_float(op, "input", x)) return NULL;
    /* A 0-d tensor is one lane of one element, as in PyTorch (dim 0 or -1). */
    int d = x->ndim == 0 && (dim == 0 || dim == -1) ? 0 : fl_wrap_dim(op, x, dim, 0);
    if (d < 0) return NULL;
    bool no_storage = fl_fused_no_storage(1, &x);
    fl_tensor *out = fl_fused_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
    if (!out) return NULL;
    fl_flops_add(5 * x->numel);
    fl_count_bytes(op, 2, (const fl_tensor *[]){x, out});
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of(op, x->device);
        if (!k || k->softmax(out, x, d, log) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    if (fl_needs_grad(1, &x)) {
        fl_node *node;
        const fl_tensor *saved[1] = {out};
        out = fl_fused_record(&softmax_types[log], 1, &x, out, 1, saved, &node);
        if (out) node->i[0] = d;
    }
    return out;
}

fl_tensor *fl_softmax(const fl_tensor *x, int dim) {
    return softmax_impl(x, dim, false);
}

fl_tensor *fl_log_softmax(const fl_tensor *x, int dim) {
    return softmax_impl(x, dim, true);
}

static int softmax_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    bool log = node->type == &softmax_types[1];
    const fl_tensor *y = node->saved[0], *g = go[0];
    bool no_storage = fl_fused_no_storage(1, &g) || !y->storage;
    fl_tensor *dx = fl_fused_output(y->ndim, y->shape, y->dtype, y->device, no_storage);
    if (!dx) return fl_last_status();
    fl_flops_add(4 * y->numel);
    fl_count_bytes(log ? "log_softmax backward" : "softmax backward", 3, (const fl_tensor *[]){g, y, dx});
    if (!no_storage) {
        const fl_fused_kernels *k =
            fl_fused_kernels_of(log ? "log_softmax backward" : "softmax backward", y->device);
        if (!k || k->softmax_backward(dx, g, y, (int)node->i[0], log) != FL_OK) {
            fl_tensor_release(dx);
            return fl_last_status();
        }
    }
    gi[0] = dx;
    return FL_OK;
}

static const fl_node_type softmax_types[2] = {
    {.name = "SoftmaxBackward", .backward = softmax_backward},
    {.name = "LogSoftmaxBackward", .backward = softmax_backward},
};
