/*
 * pool2d.c: max_pool2d over [N, C, H, W] or [C, H, W] inputs, keeping the
 * index of each window's maximum: the backward routes each output
 * gradient to exactly that input element.
 *
 * FLOPs: one comparison per window element (Ho * Wo * kh * kw per plane);
 * the backward counts one addition per output element.
 */
#include "linear.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"

#include <string.h>

static const fl_node_type max_pool2d_type;

static int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t span = in + 2 * p - d * (k - 1) - 1;
    return span < 0 ? -1 : span / s + 1;
}

/* x as [planes, H, W], a plain stack view of a contiguous tensor. */
static void as_planes(const fl_tensor *t, fl_tensor *v) {
    *v = *t;
    v->grad = NULL;
    v->grad_fn = NULL;
    v->flags &= ~(uint32_t)FL_TENSOR_REQUIRES_GRAD;
    int nd = t->ndim;
    v->ndim = 3;
    v->shape[0] = nd == 4 ? t->shape[0] * t->shape[1] : t->shape[0];
    v->shape[1] = t->shape[nd - 2];
    v->shape[2] = t->shape[nd - 1];
    fl_contiguous_strides(3, v->shape, v->stride);
}

fl_tensor *fl_max_pool2d(const fl_tensor *x, int64_t kh, int64_t kw,
                         const fl_conv2d_options *opts, fl_tensor **indices) {
    const char *op = "max_pool2d";
    if (indices) *indices = NULL;
    if (fl_check_tensor(op, x, false)) return NULL;
    char s[128];
    if (!fl_dtype_is_float(x->dtype))
        return FL_FAIL_NULL(FL_ERR_ARG, "max_pool2d: input must be a floating point tensor, got %s",
                            fl_dtype_name(x->dtype));
    if (x->ndim != 4 && x->ndim != 3)
        return FL_FAIL_NULL(FL_ERR_ARG, "max_pool2d: input must be [N, C, H, W] or [C, H, W], got shape %s",
                            fl_shape_str(x, s, sizeof s));
    if (kh < 1 || kw < 1)
        return FL_FAIL_NULL(FL_ERR_ARG, "max_pool2d: kernel size (%lld, %lld) must be >= 1",
                            (long long)kh, (long long)kw);
    fl_conv2d_options o = {{kh, kw}, {0, 0}, {1, 1}};
    if (opts) o = *opts;
    int64_t k[2] = {kh, kw};
    for (int i = 0; i < 2; i++) {
        if (o.stride[i] < 1 || o.padding[i] < 0 || o.dilation[i] < 1)
            return FL_FAIL_NULL(FL_ERR_ARG,
                                "max_pool2d: stride (%lld, %lld) and dilation (%lld, %lld) must be "
                                ">= 1 and padding (%lld, %lld) >= 0",
                                (long long)o.stride[0], (long long)o.stride[1],
                                (long long)o.dilation[0], (long long)o.dilation[1],
                                (long long)o.padding[0], (long long)o.padding[1]);
        if (o.padding[i] > k[i] / 2)
            return FL_FAIL_NULL(FL_ERR_ARG,
                                "max_pool2d: padding %lld must be at most half the kernel size %lld",
                                (long long)o.padding[i], (long long)k[i]);
    }
    int nd = x->ndim;
    int64_t H = x->shape[nd - 2], W = x->shape[nd - 1];
    int64_t Ho = window_out(H, kh, o.stride[0], o.padding[0], o.dilation[0]);
    int64_t Wo = window_out(W, kw, o.stride[1], o.padding[1], o.dilation[1]);
    if (Ho < 1 || Wo < 1)
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "max_pool2d: kernel %lldx%lld with dilation (%lld, %lld) does not fit "
                            "input of shape %s padded by (%lld, %lld)",
                            (long long)kh, (long long)kw, (long long)o.dilation[0],
                            (long long)o.dilation[1], fl_shape_str(x, s, sizeof s),
                            (long long)o.padding[0], (long long)o.padding[1]);
    int64_t shape[4];
    memcpy(shape, x->shape, sizeof shape);
    shape[nd - 2] = Ho;
    shape[nd - 1] = Wo;
    bool no_storage = !x->storage;
    fl_tensor *out = fl_linear_output(nd, shape, x->dtype, x->device, no_storage);
    fl_tensor *idx = out ? fl_linear_output(nd, shape, FL_I64, x->device, no_storage) : NULL;
    if (!idx) {
        fl_tensor_release(out);
        return NULL;
    }
    fl_flops_add(fl_flops_mul(out->numel, fl_flops_mul(kh, kw)));
    fl_count_bytes(op, 3, (const fl_tensor *[]){x, out, idx});
    int rc = FL_OK;
    if (!no_storage) {
        bool was = fl_set_grad_enabled(false);
        fl_tensor *xc = fl_contiguous(x);
        const fl_linear_kernels *kern = xc ? fl_linear_kernels_of(op, x->device) : NULL;
        if (kern) {
            fl_tensor xv, ov, iv;
            as_planes(xc, &xv);
            as_planes(out, &ov);
            as_planes(idx, &iv);
            rc = kern->max_pool2d(&ov, &iv, &xv, kh, kw, &o);
        } else {
            rc = fl_last_status();
        }
        fl_tensor_release(xc);
        fl_set_grad_enabled(was);
    }
    if (rc == FL_OK && fl_needs_grad(1, &x)) {
        fl_tensor *xshape = fl_shape_carrier(nd, x->shape, x->dtype);
        const fl_tensor *saved[2] = {idx, xshape};
        rc = xshape ? fl_record(&max_pool2d_type, 1, &x, out, 2, saved, NULL) : (int)fl_last_status();
        fl_tensor_release(xshape);
    }
    if (rc != FL_OK) {
        fl_tensor_release(out);
        fl_tensor_release(idx);
        return NULL;
    }
    if (indices) *indices = idx;
    else fl_tensor_release(idx);
    return out;
}

static int max_pool2d_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const char *op = "max_pool2d backward";
    const fl_tensor *idx = node->saved[0], *xshape = node->saved[1];
    bool no_storage = !go[0]->storage || !idx->storage;
    fl_tensor *gx = no_storage ? fl_fake(xshape->ndim, xshape->shape, xshape->dtype, go[0]->device)
                               : fl_zeros(xshape->ndim, xshape->shape, xshape->dtype, go[0]->device);
    if (!gx) return fl_last_status();
    fl_flops_add(go[0]->numel);
    fl_count_bytes(op, 3, (const fl_tensor *[]){gx, go[0], idx}); /* gx zeroed, then rows added */
    int rc = FL_OK;
    if (!no_storage) {
        fl_tensor *g = fl_contiguous(go[0]);
        const fl_linear_kernels *kern = g ? fl_linear_kernels_of(op, g->device) : NULL;
        if (kern) {
            fl_tensor gxv, gv, iv;
            as_planes(gx, &gxv);
            as_planes(g, &gv);
            as_planes(idx, &iv);
            rc = kern->max_pool2d_backward(&gxv, &gv, &iv);
        } else {
            rc = fl_last_status();
        }
        fl_tensor_release(g);
    }
    if (rc != FL_OK) {
        fl_tensor_release(gx);
        return rc;
    }
    gi[0] = gx;
    return FL_OK;
}

static const fl_node_type max_pool2d_type = {.name = "MaxPool2dBackward",
                                             .backward = max_pool2d_backward};
