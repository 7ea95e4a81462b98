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
 * weight; backward 6 for dx + 2 for dweight. layer_norm 5 (+1 weight, +1
 * bias); backward 8 for dx, +2 for dweight, +1 for dbias.
 */
#include "fused.h"

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
