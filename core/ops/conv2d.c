/*
 * conv2d.c: 2-d convolution (PyTorch's conv2d: cross-correlation, NCHW,
 * zero padding, stride, dilation) and its backward.
 *
 * FLOPs: 2 * N * O * Ho * Wo * C * kh * kw for the product (plus one per
 * output element for the bias); the backward counts the same product once
 * for dx and once for dw, and N * O * Ho * Wo additions for db.
 */
#include "linear.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"

#include <string.h>

static const fl_node_type conv2d_type;

static const fl_conv2d_options conv_defaults = {{1, 1}, {0, 0}, {1, 1}};

/* Output size of a window op along one dim, or -1 when the (dilated)
 * kernel does not fit the padded input. */
static int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t span = in + 2 * p - d * (k - 1) - 1;
    return span < 0 ? -1 : span / s + 1;
}

/* x with 4 dims: an unbatched [C, H, W] input is one image. */
static void as_batch(const fl_tensor *t, fl_tensor *v) {
    *v = *t;
    v->grad = NULL;
    v->grad_fn = NULL;
    v->flags &= ~(uint32_t)FL_TENSOR_REQUIRES_GRAD;
    if (t->ndim == 4) return;
    v->ndim = 4;
    memmove(v->shape + 1, t->shape, 3 * sizeof *t->shape);
    memmove(v->stride + 1, t->stride, 3 * sizeof *t->stride);
    v->shape[0] = 1;
    v->stride[0] = t->shape[0] * t->stride[0];
}

static int check_options(const char *op, const fl_conv2d_options *o) {
    for (int i = 0; i < 2; i++) {
        if (o->stride[i] < 1 || o->padding[i] < 0 || o->dilation[i] < 1)
            return fl_fail(FL_ERR_ARG,
                           "%s: stride (%lld, %lld) and dilation (%lld, %lld) must be >= 1 and "
                           "padding (%lld, %lld) >= 0",
                           op, (long long)o->stride[0], (long long)o->stride[1],
                           (long long)o->dilation[0], (long long)o->dilation[1],
                           (long long)o->padding[0], (long long)o->padding[1]);
    }
    return FL_OK;
}

fl_tensor *fl_conv2d(const fl_tensor *x, const fl_tensor *w, const fl_tensor *bias,
                     const fl_conv2d_options *opts) {
    const char *op = "conv2d";
    if (fl_check_tensor(op, x, false) || fl_check_tensor(op, w, false)) return NULL;
    const fl_tensor *ins[3] = {x, w, bias};
    const char *what[3] = {"input", "weight", "bias"};
    if (fl_linear_check_same(op, 3, ins, what)) return NULL;
    const fl_conv2d_options *o = opts ? opts : &conv_defaults;
    if (check_options(op, o)) return NULL;
    char s[128], t[128];
    if (x->ndim != 4 && x->ndim != 3)
        return FL_FAIL_NULL(FL_ERR_ARG, "conv2d: input must be [N, C, H, W] or [C, H, W], got shape %s",
                            fl_shape_str(x, s, sizeof s));
    if (w->ndim != 4)
        return FL_FAIL_NULL(FL_ERR_ARG, "conv2d: weight must be [out, in, kh, kw], got shape %s",
                            fl_shape_str(w, s, sizeof s));
    fl_tensor xv;
    as_batch(x, &xv);
    int64_t C = xv.shape[1], H = xv.shape[2], W = xv.shape[3];
    int64_t O = w->shape[0], kh = w->shape[2], kw = w->shape[3];
    if (w->shape[1] != C)
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "conv2d: weight of shape %s expects %lld input channels but input of "
                            "shape %s has %lld",
                            fl_shape_str(w, s, sizeof s), (long long)w->shape[1],
                            fl_shape_str(x, t, sizeof t), (long long)C);
    if (bias && (bias->ndim != 1 || bias->shape[0] != O))
        return FL_FAIL_NULL(FL_ERR_ARG, "conv2d: bias of shape %s does not match %lld output channels",
                            fl_shape_str(bias, s, sizeof s), (long long)O);
    int64_t Ho = window_out(H, kh, o->stride[0], o->padding[0], o->dilation[0]);
    int64_t Wo = window_out(W, kw, o->stride[1], o->padding[1], o->dilation[1]);
    if (Ho < 1 || Wo < 1 || kh < 1 || kw < 1)
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "conv2d: kernel %lldx%lld with dilation (%lld, %lld) does not fit input "
                            "of shape %s padded by (%lld, %lld)",
                            (long long)kh, (long long)kw, (long long)o->dilation[0],
                            (long long)o->dilation[1], fl_shape_str(x, s, sizeof s),
                            (long long)o->padding[0], (long long)o->padding[1]);
    int64_t N = xv.shape[0];
    int64_t shape4[4] = {N, O, Ho, Wo};
    bool no_storage = !x->storage || !w->storage || (bias && !bias->storage);
    fl_tensor *out = x->ndim == 4
                         ? fl_linear_output(4, shape4, x->dtype, x->device, no_storage)
                         : fl_linear_output(3, shape4 + 1, x->dtype, x->device, no_storage);
    if (!out) return NULL;
    int64_t prod = N * O * Ho * Wo;
    fl_flops_add(fl_flops_sum(fl_flops_mul(fl_flops_mul(2 * prod, C), fl_flops_mul(kh, kw)), bias ? prod : 0));
    bool was = fl_set_grad_enabled(false);
    fl_tensor *xc = fl_contiguous(x), *wc = xc ? fl_contiguous(w) : NULL;
    int rc = wc ? FL_OK : (int)fl_last_status();
    if (rc == FL_OK && !no_storage && prod > 0) { /* an empty output needs no kernel */
        const fl_linear_kernels *k = fl_linear_kernels_of(op, x->device);
        fl_tensor xb, ob;
        as_batch(xc, &xb);
        as_batch(out, &ob);
        rc = k ? k->conv2d(&ob, &xb, wc, bias, o) : (int)fl_last_status();
    }
    fl_set_grad_enabled(was);
    if (rc == FL_OK && fl_needs_grad(3, ins)) {
        const fl_tensor *saved[2] = {xc, wc};
        fl_node *node = NULL;
        rc = fl_record(&conv2d_type, 3, ins, out, 2, saved, &node);
        if (node) {
            for (int i = 0; i < 2; i++) {
                node->i[i] = o->stride[i];
                node->i[2 + i] = o->padding[i];
                node->i[4 + i] = o->dilation[i];
            }
        }
    }
    fl_tensor_release(xc);
    fl_tensor_release(wc);
    if (rc != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

static int conv2d_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const char *op = "conv2d backward";
    const fl_tensor *x = node->saved[0], *w = node->saved[1];
    fl_conv2d_options o;
    for (int i = 0; i < 2; i++) {
        o.stride[i] = node->i[i];
        o.padding[i] = node->i[2 + i];
        o.dilation[i] = node->i[4 + i];
    }
    fl_tensor *g = fl_contiguous(go[0]);
    if (!g) return fl_last_status();
    fl_tensor gv, xv;
    as_batch(g, &gv);
    as_batch(x, &xv);
    int64_t prod = gv.numel, K = w->shape[1] * w->shape[2] * w->shape[3];
    bool no_storage = !g->storage || !x->storage || !w->storage;
    int64_t O = w->shape[0];
    fl_tensor *t[3] = {NULL, NULL, NULL};
    int rc = FL_OK;
    if (fl_node_wants(node, 0)) {
        t[0] = fl_linear_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
        fl_flops_add(fl_flops_mul(2 * prod, K));
    }
    if (fl_node_wants(node, 1)) {
        t[1] = fl_linear_output(4, w->shape, w->dtype, w->device, no_storage);
        fl_flops_add(fl_flops_mul(2 * prod, K));
    }
    if (fl_node_wants(node, 2)) {
        t[2] = fl_linear_output(1, &O, w->dtype, w->device, no_storage);
        fl_flops_add(prod);
    }
    for (int i = 0; i < 3; i++)
        if (fl_node_wants(node, i) && !t[i]) rc = fl_last_status();
    if (rc == FL_OK && !no_storage && prod == 0) {
        /* No output element (an empty batch): every gradient is zero, as in
         * PyTorch; cuDNN refuses to describe empty tensors. */
        for (int i = 0; i < 3 && rc == FL_OK; i++)
            if (t[i]) rc = fl_fill_(t[i], 0.0);
    } else if (rc == FL_OK && !no_storage) {
        const fl_linear_kernels *k = fl_linear_kernels_of(op, g->device);
        fl_tensor gxv;
        if (t[0]) as_batch(t[0], &gxv);
        rc = k ? k->conv2d_backward(t[0] ? &gxv : NULL, t[1], t[2], &gv, &xv, w, &o)
               : (int)fl_last_status();
    }
    fl_tensor_release(g);
    for (int i = 0; i < 3; i++) {
        if (rc == FL_OK) gi[i] = t[i];
        else fl_tensor_release(t[i]);
    }
    return rc;
}

static const fl_node_type conv2d_type = {.name = "Conv2dBackward", .backward = conv2d_backward};
