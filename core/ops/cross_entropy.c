/*
 * cross_entropy.c: cross-entropy fused with log-softmax, and NLL loss over
 * log-probabilities (the MNIST tutorial's log_softmax + nll_loss).
 *
 * Classes are on the LAST dim: logits [..., C] with targets [...] (the
 * language-model layout [B, T, V] with [B, T]). PyTorch puts classes on
 * dim 1 for inputs of more than 2 dims; for [N, C] both agree.
 *
 * The forward keeps one float per row, the logsumexp, and no log-softmax:
 * the backward recomputes softmax = exp(x - lse) while it writes
 *   dlogits = g_r * (softmax - (1 - ls) * onehot(target) - ls / C)
 * so the only [N, C] tensor it allocates is the gradient itself.
 *
 * Reductions follow PyTorch: 'mean' divides by the number of targets that
 * are not ignore_index, so when every target is ignored the mean is 0/0 =
 * nan (PyTorch returns nan too); 'sum' gives 0 then; 'none' gives a loss
 * per target with 0 at ignored ones. Label smoothing ls mixes in the loss
 * against the uniform distribution: (1 - ls) * nll + ls * (lse - mean(x)).
 * A target outside [0, C) that is not ignore_index is an error naming it.
 *
 * [Note: losses in f32] The cross-entropy is returned in the compute dtype,
 * f32 for bf16 and f16 logits (f64 for f64), as transformers computes it
 * (it upcasts the logits before the loss): a bf16 loss moves in steps of
 * 1/32 near 5, so every logged and validation loss would be rounded. No
 * f32 copy of the logits is made: the kernels read the bf16 logits and
 * accumulate in f32 (the per-row logsumexp, the total in f64); the
 * gradient to the logits stays in the logits' dtype, reading the f32
 * incoming gradient. f32 and f64 runs are unchanged bit for bit.
 * fl_nll_loss keeps its input's dtype (PyTorch's; its input is already
 * log-probabilities the caller computed in the dtype it chose).
 *
 * FLOPs: cross_entropy 4 per logit forward (max, subtract, exp, sum) and
 * 4 backward (subtract, exp, scale, subtract); nll_loss 1 per row each way.
 */
#include "fused.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"

#include <math.h>

/* Checks shared by both losses; fills the output shape (the targets'
 * shape for 'none', 0-d otherwise). */
static int check_loss(const char *op, const char *what, const fl_tensor *x,
                      const fl_tensor *targets, fl_loss_reduction reduction, int *out_ndim,
                      int64_t *out_shape) {
    if (fl_fused_check_float(op, what, x) || fl_check_tensor(op, targets, false))
        return fl_last_status();
    if (x->ndim < 1)
        return fl_fail(FL_ERR_ARG, "%s: %s must have a class dim, got a 0-d tensor", op, what);
    if (targets->dtype != FL_I64 && targets->dtype != FL_I32)
        return fl_fail(FL_ERR_ARG, "%s: targets must be i64 (or i32) class indices, got %s", op,
                       fl_dtype_name(targets->dtype));
    if (fl_fused_check_device(op, "targets", targets, x->device)) return fl_last_status();
    bool match = targets->ndim == x->ndim - 1;
    for (int d = 0; match && d < targets->ndim; d++) match = targets->shape[d] == x->shape[d];
    if (!match) {
        char a[128], b[128];
        return fl_fail(FL_ERR_ARG, "%s: targets of shape %s do not match %s of shape %s (expected "
                                   "its shape without the last, class, dim)",
                       op, fl_shape_str(targets, a, sizeof a), what, fl_shape_str(x, b, sizeof b));
    }
    if (reduction != FL_LOSS_NONE && reduction != FL_LOSS_MEAN && reduction != FL_LOSS_SUM)
        return fl_fail(FL_ERR_ARG, "%s: invalid reduction %d (none 0, mean 1, sum 2)", op,
                       (int)reduction);
    *out_ndim = reduction == FL_LOSS_NONE ? targets->ndim : 0;
    for (int d = 0; d < *out_ndim; d++) out_shape[d] = targets->shape[d];
    return FL_OK;
}

/* The reduced value of a mean/sum loss into the 0-d output. */
static int finish(fl_tensor *out, fl_loss_reduction reduction, double total, int64_t count) {
    if (reduction == FL_LOSS_NONE) return FL_OK;
    /* count == 0 under 'mean' gives 0/0 = nan, as PyTorch. */
    double value = reduction == FL_LOSS_MEAN ? total / (double)count : total;
    return fl_fill_(out, value);
}

/* A contiguous view of the targets for the kernels (a copy only when
 * strided). */
static fl_tensor *dense_targets(const fl_tensor *t) {
    return fl_contiguous(t);
}

/* The scalar gradient of a reduced loss: g, divided by the count for
 * 'mean'; reads the 0-d gradient (from a device: one element's copy to the
 * host, which waits for the kernels that made it). */
static int scalar_grad(const fl_tensor *g, fl_loss_reduction reduction, int64_t count,
                       double *out) {
    int64_t zero[1] = {0};
    fl_tensor *host = NULL;
    if (fl_device_kind_of(g->device) != FL_DEVICE_CPU) {
        host = fl_to(g, g->dtype, fl_device_make(FL_DEVICE_CPU, 0));
        if (!host) return fl_last_status();
        g = host;
    }
    int rc = fl_get(g, zero, out);
    fl_tensor_release(host);
    if (rc) return fl_last_status();
    if (reduction == FL_LOSS_MEAN) *out /= (double)count;
    return FL_OK;
}

/* The incoming gradient of a loss in the form the backward kernels take:
 * per row (reduction 'none': a contiguous tensor in the compute dtype) or
 * one scalar (already divided by the count for 'mean'). */
static int loss_grad(const fl_tensor *g, int reduction, int64_t count, fl_dtype dtype,
                     fl_tensor **g_rows, double *g_scalar) {
    if (reduction != FL_LOSS_NONE) return scalar_grad(g, reduction, count, g_scalar);
    fl_tensor *gc = fl_fused_prepare(g, fl_fused_compute_dtype(dtype));
    *g_rows = gc ? fl_contiguous(gc) : NULL;
    fl_tensor_release(gc);
    return *g_rows ? FL_OK : (int)fl_last_status();
}

/* ---- cross_entropy --------------------------------------------------------- */

static const fl_node_type cross_entropy_type;

fl_tensor *fl_cross_entropy(const fl_tensor *logits, const fl_tensor *targets,
                            int64_t ignore_index, fl_loss_reduction reduction,
                            double label_smoothing) {
    const char *op = "cross_entropy";
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    if (check_loss(op, "logits", logits, targets, reduction, &ndim, shape)) return NULL;
    if (!(label_smoothing >= 0 && label_smoothing <= 1))
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: label_smoothing must be in [0, 1], got %g", op,
                            label_smoothing);
    const fl_tensor *both[2] = {logits, targets};
    bool no_storage = fl_fused_no_storage(2, both);
    int64_t rows = targets->numel;
    /* [Note: losses in f32] the loss is in the compute dtype (f32 for bf16/f16 logits). */
    fl_dtype loss_dtype = fl_fused_compute_dtype(logits->dtype);
    fl_tensor *out = fl_fused_output(ndim, shape, loss_dtype, logits->device, no_storage);
    fl_tensor *lse = out ? fl_fused_output(1, &rows, loss_dtype, logits->device, no_storage) : NULL;
    fl_tensor *tg = lse ? dense_targets(targets) : NULL;
    if (!tg) {
        fl_tensor_release(out);
        fl_tensor_release(lse);
        return NULL;
    }
    fl_flops_add(4 * logits->numel);
    fl_count_bytes(op, 3, (const fl_tensor *[]){logits, targets, lse});
    fl_loss_params p = {ignore_index, label_smoothing};
    int64_t count = 0;
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of(op, logits->device);
        double total = 0;
        fl_tensor *rows_out = NULL;
        if (reduction == FL_LOSS_NONE) rows_out = fl_view(out, 1, &rows);
        int rc = !k || (reduction == FL_LOSS_NONE && !rows_out)
                     ? (int)fl_last_status()
                     : k->cross_entropy(rows_out, lse, logits, tg, &p, &total, &count);
        fl_tensor_release(rows_out);
        if (rc || finish(out, reduction, total, count)) {
            fl_tensor_release(out);
            out = NULL;
        }
    }
    if (out && fl_needs_grad(1, &logits)) {
        fl_node *node;
        const fl_tensor *saved[3] = {logits, tg, lse};
        out = fl_fused_record(&cross_entropy_type, 1, &logits, out, 3, saved, &node);
        if (out) {
            node->i[0] = ignore_index;
            node->i[1] = reduction;
            node->i[2] = count;
            node->f[0] = label_smoothing;
        }
    }
    fl_tensor_release(lse);
    fl_tensor_release(tg);
    return out;
}

static int cross_entropy_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *logits = node->saved[0], *tg = node->saved[1], *lse = node->saved[2];
    fl_loss_reduction reduction = (fl_loss_reduction)node->i[1];
    fl_loss_params p = {node->i[0], node->f[0]};
    const fl_tensor *g = go[0];
    bool no_storage = fl_fused_no_storage(1, &g) || !logits->storage;
    fl_tensor *dx =
        fl_fused_output(logits->ndim, logits->shape, logits->dtype, logits->device, no_storage);
    if (!dx) return fl_last_status();
    fl_flops_add(4 * logits->numel);
    fl_count_bytes("cross_entropy backward", 4, (const fl_tensor *[]){logits, tg, lse, dx});
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of("cross_entropy backward", logits->device);
        fl_tensor *g_rows = NULL;
        double g_scalar = 0;
        int rc = k ? loss_grad(g, reduction, node->i[2], logits->dtype, &g_rows, &g_scalar)
                   : (int)fl_last_status();
        if (!rc) rc = k->cross_entropy_backward(dx, g_rows, g_scalar, logits, tg, lse, &p);
        fl_tensor_release(g_rows);
        if (rc) {
            fl_tensor_release(dx);
            return rc;
        }
    }
    gi[0] = dx;
    return FL_OK;
}

static const fl_node_type cross_entropy_type = {.name = "CrossEntropyBackward",
                                                .backward = cross_entropy_backward};

/* ---- nll_loss ---------------------------------------------------------------- */

static const fl_node_type nll_loss_type;

fl_tensor *fl_nll_loss(const fl_tensor *log_probs, const fl_tensor *targets, int64_t ignore_index,
                       fl_loss_reduction reduction) {
    const char *op = "nll_loss";
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    if (check_loss(op, "log_probs", log_probs, targets, reduction, &ndim, shape)) return NULL;
    const fl_tensor *both[2] = {log_probs, targets};
    bool no_storage = fl_fused_no_storage(2, both);
    int64_t rows = targets->numel;
    fl_tensor *out = fl_fused_output(ndim, shape, log_probs->dtype, log_probs->device, no_storage);
    fl_tensor *tg = out ? dense_targets(targets) : NULL;
    if (!tg) {
        fl_tensor_release(out);
        return NULL;
    }
    fl_flops_add(rows);
    fl_count_bytes(op, 2, (const fl_tensor *[]){targets, out}); /* one element per row read */
    fl_loss_params p = {ignore_index, 0};
    int64_t count = 0;
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of(op, log_probs->device);
        double total = 0;
        fl_tensor *rows_out = NULL;
        if (reduction == FL_LOSS_NONE) rows_out = fl_view(out, 1, &rows);
        int rc = !k || (reduction == FL_LOSS_NONE && !rows_out)
                     ? (int)fl_last_status()
                     : k->nll_loss(rows_out, log_probs, tg, &p, &total, &count);
        fl_tensor_release(rows_out);
        if (rc || finish(out, reduction, total, count)) {
            fl_tensor_release(out);
            out = NULL;
        }
    }
    if (out && fl_needs_grad(1, &log_probs)) {
        fl_node *node;
        /* log_probs is saved for its shape and dtype only (an alias). */
        const fl_tensor *saved[2] = {log_probs, tg};
        out = fl_fused_record(&nll_loss_type, 1, &log_probs, out, 2, saved, &node);
        if (out) {
            node->i[0] = ignore_index;
            node->i[1] = reduction;
            node->i[2] = count;
        }
    }
    fl_tensor_release(tg);
    return out;
}

static int nll_loss_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *lp = node->saved[0], *tg = node->saved[1];
    fl_loss_reduction reduction = (fl_loss_reduction)node->i[1];
    fl_loss_params p = {node->i[0], 0};
    const fl_tensor *g = go[0];
    bool no_storage = fl_fused_no_storage(1, &g) || !lp->storage;
    fl_tensor *dx = no_storage ? fl_fake(lp->ndim, lp->shape, lp->dtype, lp->device)
                               : fl_zeros(lp->ndim, lp->shape, lp->dtype, lp->device);
    if (!dx) return fl_last_status();
    fl_flops_add(tg->numel);
    fl_count_bytes("nll_loss backward", 2, (const fl_tensor *[]){tg, dx}); /* dx: zeroed, then rows */
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of("nll_loss backward", lp->device);
        fl_tensor *g_rows = NULL;
        double g_scalar = 0;
        int rc = k ? loss_grad(g, reduction, node->i[2], lp->dtype, &g_rows, &g_scalar)
                   : (int)fl_last_status();
        if (!rc) rc = k->nll_loss_backward(dx, g_rows, g_scalar, tg, &p);
        fl_tensor_release(g_rows);
        if (rc) {
            fl_tensor_release(dx);
            return rc;
        }
    }
    gi[0] = dx;
    return FL_OK;
}

static const fl_node_type nll_loss_type = {.name = "NllLossBackward",
                                           .backward = nll_loss_backward};

