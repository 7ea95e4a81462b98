/*
 * norm.c: RMSNorm and LayerNorm over the last dim, forward and backward.
 *
 * Both keep per-row statistics from the forward (1/rms, or mean and
 * 1/std: [rows] in the compute dtype) so the backward reads x once more
 * instead of recomputing reductions from scratch.
 *
 * RMSNorm follows Hugging Face's LlamaRMSNorm exactly: the normalised
 * value is computed in f32 and cast back to x's dtype before it meets the
 * weight, so bf16 models get the same rounding as the reference. The
 * result dtype is x's when weight has the same dtype (the normal case), or
 * their promotion as PyTorch's `weight * x` would give. T5LayerNorm is the
 * same math (eps 1e-6); with mixed dtypes it would cast to the weight's
 * dtype instead, which only matters when x and weight differ. The
 * backward treats that cast as the identity, as autograd does, and uses
 * the unrounded normalised value for dweight (a difference at the level
 * of one bf16 rounding).
 *
 * FLOPs (per element of x): rms_norm 3 (square-add, scale) + 1 with a
 * weight; backward 6 for dx + 2 for dweight; add_rms_norm one more each
 * way (the add; backward only with h's own gradient). layer_norm 5 (+1 weight, +1
 * bias); backward 8 for dx, +2 for dweight, +1 for dbias.
 */
#include "fused.h"
#include "shape.h"
#include "flops.h"
#include "storage.h"

#include <math.h>

/* Shared argument checks: x float with at least one dim, optional
 * parameter vectors of x's last size on x's device. */
static int check_param(const char *op, const char *what, const fl_tensor *x, const fl_tensor *p) {
    if (!p) return FL_OK;
    if (fl_fused_check_float(op, what, p) || fl_fused_check_device(op, what, p, x->device))
        return fl_last_status();
    if (p->ndim != 1 || p->shape[0] != x->shape[x->ndim - 1]) {
        char a[128], b[128];
        return fl_fail(FL_ERR_ARG, "%s: %s of shape %s does not match the last dim of input %s",
                       op, what, fl_shape_str(p, a, sizeof a), fl_shape_str(x, b, sizeof b));
    }
    return FL_OK;
}

static int check_input(const char *op, const fl_tensor *x, double eps) {
    if (fl_fused_check_float(op, "input", x)) return fl_last_status();
    if (x->ndim < 1)
        return fl_fail(FL_ERR_ARG, "%s: input must have at least 1 dim, got a 0-d tensor", op);
    if (!(eps >= 0) || !isfinite(eps))
        return fl_fail(FL_ERR_ARG, "%s: eps must be a finite number >= 0, got %g", op, eps);
    return FL_OK;
}

/* Result dtype of weight * x: x's when equal, else the wider (f32 for
 * f16 with bf16, f64 with f64), as PyTorch promotes. */
static fl_dtype promote(fl_dtype x, const fl_tensor *w) {
    if (!w || w->dtype == x) return x;
    if (x == FL_F64 || w->dtype == FL_F64) return FL_F64;
    return FL_F32;
}

static int64_t rows_of(const fl_tensor *x) {
    int64_t n = x->shape[x->ndim - 1];
    return n ? x->numel / n : 0;
}

/* Per-row statistics: [rows] in the compute dtype of the output (the
 * kernels pick f32 or f64 math from it). */
static fl_tensor *stats(const fl_tensor *x, const fl_tensor *out, bool no_storage) {
    int64_t rows = rows_of(x);
    return fl_fused_output(1, &rows, fl_fused_compute_dtype(out->dtype), x->device, no_storage);
}

/* ---- rms_norm ------------------------------------------------------------- */

static const fl_node_type rms_norm_type;

fl_tensor *fl_rms_norm(const fl_tensor *x, const fl_tensor *weight, double eps) {
    const char *op = "rms_norm";
    if (check_input(op, x, eps) || check_param(op, "weight", x, weight)) return NULL;
    const fl_tensor *ins[2] = {x, weight};
    bool no_storage = fl_fused_no_storage(2, ins);
    fl_tensor *out =
        fl_fused_output(x->ndim, x->shape, promote(x->dtype, weight), x->device, no_storage);
    fl_tensor *rstd = out ? stats(x, out, no_storage) : NULL;
    if (!rstd) {
        fl_tensor_release(out);
        return NULL;
    }
    fl_flops_add(x->numel * (weight ? 4 : 3));
    fl_count_bytes(op, 4, (const fl_tensor *[]){x, weight, out, rstd});
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of(op, x->device);
        if (!k || k->rms_norm(out, rstd, x, weight, eps) != FL_OK) {
            fl_tensor_release(out);
            fl_tensor_release(rstd);
            return NULL;
        }
    }
    if (fl_needs_grad(2, ins)) {
        const fl_tensor *saved[3] = {x, weight, rstd};
        out = fl_fused_record(&rms_norm_type, 2, ins, out, 3, saved, NULL);
    }
    fl_tensor_release(rstd);
    return out;
}

static int rms_norm_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *x = node->saved[0], *w = node->saved[1], *rstd = node->saved[2];
    const fl_tensor *g = go[0];
    bool no_storage = fl_fused_no_storage(1, &g) || !x->storage;
    fl_tensor *dx = NULL, *dw = NULL;
    int rc = FL_OK;
    if (fl_node_wants(node, 0)) {
        dx = fl_fused_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
        if (!dx) rc = fl_last_status();
    }
    if (!rc && fl_node_wants(node, 1)) {
        dw = fl_fused_output(1, w->shape, w->dtype, w->device, no_storage);
        if (!dw) rc = fl_last_status();
    }
    if (!rc) {
        fl_flops_add(x->numel * ((dx ? 6 : 0) + (dw ? 2 : 0)));
        fl_count_bytes("rms_norm backward", 6, (const fl_tensor *[]){g, x, w, rstd, dx, dw});
        if (!no_storage) {
            const fl_fused_kernels *k = fl_fused_kernels_of("rms_norm backward", x->device);
            rc = !k ? (int)fl_last_status() : k->rms_norm_backward(dx, dw, g, x, w, rstd);
        }
    }
    if (rc) {
        fl_tensor_release(dx);
        fl_tensor_release(dw);
        return rc;
    }
    gi[0] = dx;
    gi[1] = dw;
    return FL_OK;
}

static const fl_node_type rms_norm_type = {.name = "RmsNormBackward",
                                           .backward = rms_norm_backward};

/* ---- add_rms_norm ---------------------------------------------------------- */

/* [Note: residual add fused with RMSNorm]
 * A pre-norm decoder layer computes h = x + attn(...) and then
 * post_attention_layernorm(h); as two ops the add writes h and the norm
 * reads it back, and in backward h's gradient is the sum of two (the
 * residual's and the norm's dx), one more add. fl_add_rms_norm does both
 * in one kernel: it writes h (rounded to x's dtype exactly as the add
 * would) and normalises the rounded h as fl_rms_norm would, so h, y and
 * rstd are the bits of the two ops. Its backward writes
 * dh = g_h + rms_norm's dx(g_y) in one pass (in f32, rounded once to h's
 * dtype: for 16-bit h one rounding where the two ops had two) and dw as
 * rms_norm's, and gives dh to both x and a. A gradient that reaches only
 * one of h, y comes as NULL (fl_node_type.null_grads): no zeros are made or
 * read for the other. Bytes: x, a, w read and h, y, rstd written forward;
 * g_h, g_y, h, w, rstd read and dh, dw written backward. */

static const fl_node_type add_rms_norm_type;

static bool same_shape(const fl_tensor *a, const fl_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

int fl_add_rms_norm(const fl_tensor *x, const fl_tensor *a, const fl_tensor *weight, double eps,
                    fl_tensor **h_out, fl_tensor **y_out) {
    const char *op = "add_rms_norm";
    if (!h_out || !y_out) return fl_fail(FL_ERR_ARG, "%s: h and y must not be NULL", op);
    *h_out = *y_out = NULL;
    if (check_input(op, x, eps) || fl_fused_check_float(op, "branch", a) ||
        fl_fused_check_device(op, "branch", a, x->device) || check_param(op, "weight", x, weight))
        return fl_last_status();
    if (a->dtype != x->dtype || !same_shape(a, x)) {
        char sa[128], sx[128];
        return fl_fail(FL_ERR_ARG, "%s: branch %s %s must have the input's shape and dtype, %s %s", op,
                       fl_shape_str(a, sa, sizeof sa), fl_dtype_name(a->dtype),
                       fl_shape_str(x, sx, sizeof sx), fl_dtype_name(x->dtype));
    }
    const fl_tensor *ins[3] = {x, a, weight};
    bool no_storage = fl_fused_no_storage(3, ins);
    fl_tensor *h = fl_fused_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
    fl_tensor *y = h ? fl_fused_output(x->ndim, x->shape, promote(x->dtype, weight), x->device,
                                       no_storage)
                     : NULL;
    fl_tensor *rstd = y ? stats(x, y, no_storage) : NULL;
    int rc = rstd ? FL_OK : (int)fl_last_status();
    if (!rc) {
        fl_flops_add(x->numel * (weight ? 5 : 4));
        fl_count_bytes(op, 6, (const fl_tensor *[]){x, a, weight, h, y, rstd});
        if (!no_storage) {
            const fl_fused_kernels *k = fl_fused_kernels_of(op, x->device);
            rc = !k ? (int)fl_last_status() : k->add_rms_norm(h, y, rstd, x, a, weight, eps);
        }
    }
    if (!rc && fl_needs_grad(3, ins)) {
        fl_node *node = fl_node_new(&add_rms_norm_type, 3, ins, 2);
        if (!node) {
            rc = fl_last_status();
        } else {
            fl_node_save(node, h);
            fl_node_save(node, weight);
            fl_node_save(node, rstd);
            fl_node_set_output(node, 0, h);
            fl_node_set_output(node, 1, y);
            fl_node_release(node);
        }
    }
    fl_tensor_release(rstd);
    if (rc) {
        fl_tensor_release(h);
        fl_tensor_release(y);
        return rc;
    }
    *h_out = h;
    *y_out = y;
    return FL_OK;
}

static int add_rms_norm_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *h = node->saved[0], *w = node->saved[1], *rstd = node->saved[2];
    const fl_tensor *gh = go[0], *gy = go[1];
    bool want_h = fl_node_wants(node, 0) || fl_node_wants(node, 1);
    bool want_w = fl_node_wants(node, 2);
    fl_tensor *dh = NULL, *dw = NULL;
    int rc = FL_OK;
    if (!gy) {
        /* Only h was used: its gradient passes to x and a as an add's, and
         * the weight gets none (as with the two ops, where the norm never
         * ran backward). */
        if (want_h && gh) dh = fl_tensor_retain((fl_tensor *)gh);
    } else {
        const fl_tensor *gs[2] = {gh, gy};
        bool no_storage = fl_fused_no_storage(2, gs) || !h->storage;
        if (want_h) {
            dh = fl_fused_output(h->ndim, h->shape, h->dtype, h->device, no_storage);
            if (!dh) rc = fl_last_status();
        }
        if (!rc && want_w) {
            dw = fl_fused_output(1, w->shape, w->dtype, w->device, no_storage);
            if (!dw) rc = fl_last_status();
        }
        if (!rc && (dh || dw)) {
            fl_flops_add(h->numel * ((dh ? 6 + (gh ? 1 : 0) : 0) + (dw ? 2 : 0)));
            fl_count_bytes("add_rms_norm backward", 7, (const fl_tensor *[]){gh, gy, h, w, rstd, dh, dw});
            if (!no_storage) {
                const fl_fused_kernels *k = fl_fused_kernels_of("add_rms_norm backward", h->device);
                rc = !k ? (int)fl_last_status() : k->add_rms_norm_backward(dh, dw, gh, gy, h, w, rstd);
            }
        }
    }
    if (rc) {
        fl_tensor_release(dh);
        fl_tensor_release(dw);
        return rc;
    }
    if (dh && fl_node_wants(node, 0)) gi[0] = fl_tensor_retain(dh);
    if (dh && fl_node_wants(node, 1)) gi[1] = fl_tensor_retain(dh);
    fl_tensor_release(dh);
    gi[2] = dw;
    return FL_OK;
}

static const fl_node_type add_rms_norm_type = {
    .name = "AddRmsNormBackward", .backward = add_rms_norm_backward, .null_grads = true};

/* ---- layer_norm ------------------------------------------------------------ */

static const fl_node_type layer_norm_type;

fl_tensor *fl_layer_norm(const fl_tensor *x, const fl_tensor *weight, const fl_tensor *bias,
                         double eps) {
    const char *op = "layer_norm";
    if (check_input(op, x, eps) || check_param(op, "weight", x, weight) ||
        check_param(op, "bias", x, bias))
        return NULL;
    const fl_tensor *ins[3] = {x, weight, bias};
    bool no_storage = fl_fused_no_storage(3, ins);
    fl_tensor *out = fl_fused_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
    fl_tensor *mean = out ? stats(x, out, no_storage) : NULL;
    fl_tensor *rstd = mean ? stats(x, out, no_storage) : NULL;
    if (!rstd) {
        fl_tensor_release(out);
        fl_tensor_release(mean);
        return NULL;
    }
    fl_flops_add(x->numel * (5 + (weight ? 1 : 0) + (bias ? 1 : 0)));
    fl_count_bytes(op, 6, (const fl_tensor *[]){x, weight, bias, out, mean, rstd});
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of(op, x->device);
        if (!k || k->layer_norm(out, mean, rstd, x, weight, bias, eps) != FL_OK) {
            fl_tensor_release(out);
            out = NULL;
        }
    }
    if (out && fl_needs_grad(3, ins)) {
        const fl_tensor *saved[5] = {x, weight, bias, mean, rstd};
        out = fl_fused_record(&layer_norm_type, 3, ins, out, 5, saved, NULL);
    }
    fl_tensor_release(mean);
    fl_tensor_release(rstd);
    return out;
}

static int layer_norm_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    /* The bias is saved only for its dtype (an alias, no copy). */
    const fl_tensor *x = node->saved[0], *w = node->saved[1], *b = node->saved[2];
    const fl_tensor *mean = node->saved[3], *rstd = node->saved[4];
    const fl_tensor *g = go[0];
    bool no_storage = fl_fused_no_storage(1, &g) || !x->storage;
    int64_t n = x->shape[x->ndim - 1];
    fl_tensor *dx = NULL, *dw = NULL, *db = NULL;
    int rc = FL_OK;
    if (fl_node_wants(node, 0)) {
        dx = fl_fused_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
        if (!dx) rc = fl_last_status();
    }
    if (!rc && fl_node_wants(node, 1)) {
        dw = fl_fused_output(1, &n, w->dtype, x->device, no_storage);
        if (!dw) rc = fl_last_status();
    }
    if (!rc && fl_node_wants(node, 2)) {
        db = fl_fused_output(1, &n, b->dtype, x->device, no_storage);
        if (!db) rc = fl_last_status();
    }
    if (!rc) {
        fl_flops_add(x->numel * ((dx ? 8 : 0) + (dw ? 2 : 0) + (db ? 1 : 0)));
        fl_count_bytes("layer_norm backward", 8, (const fl_tensor *[]){g, x, w, mean, rstd, dx, dw, db});
        if (!no_storage) {
            const fl_fused_kernels *k = fl_fused_kernels_of("layer_norm backward", x->device);
            rc = !k ? (int)fl_last_status() : k->layer_norm_backward(dx, dw, db, g, x, w, mean, rstd);
        }
    }
    if (rc) {
        fl_tensor_release(dx);
        fl_tensor_release(dw);
        fl_tensor_release(db);
        return rc;
    }
    gi[0] = dx;
    gi[1] = dw;
    gi[2] = db;
    return FL_OK;
}

static const fl_node_type layer_norm_type = {.name = "LayerNormBackward",
                                             .backward = layer_norm_backward};
