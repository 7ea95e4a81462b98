/*
 * linear_cross_entropy.c: a language model's head and its cross-entropy as
 * one op, over chunks of rows, so that neither the [N, V] logits nor their
 * gradient ever exist whole (Liger-Kernel's fused linear cross-entropy,
 * made of this project's GEMMs and fused cross-entropy kernels).
 *
 * [Note: the fused head and loss] For each chunk of rows r:
 *   logits_r = h_r @ W^T                      (the linear family's GEMM)
 *   lse_r, loss rows                          (the cross_entropy kernel, sum)
 * and, when a gradient is wanted, while the chunk's logits are at hand:
 *   dlogits_r = softmax_r - (1 - ls) onehot - ls / C, 0 at ignored rows
 *                                             (the cross_entropy backward kernel, g = 1)
 *   dh_r = dlogits_r @ W                      (written into dh's rows)
 *   dW  += dlogits_r^T @ h_r                  (matmul_acc, in f32 for 16-bit W)
 * The chunk's temporaries are freed before the next, so a step holds one
 * chunk's logits and gradient (rows * V each) instead of N * V twice. The
 * node saves dh and dW; its backward only scales them by the incoming
 * gradient (divided by the count of targets for 'mean'), which is exact
 * because the loss is linear in that scalar. Reductions 'mean' and 'sum'
 * (a per-row loss needs per-row gradients: use fl_cross_entropy).
 *
 * Exactness against head-then-fl_cross_entropy: the loss is the same sum
 * in the same f64 total, row by row; dh is the same products per row; dW
 * differs only in the order of its sum over rows (chunk by chunk onto an
 * f32 accumulator rounded once to W's dtype; one chunk: one product, as
 * unfused). With 16-bit data, dlogits are rounded before the gradient's
 * scale is applied rather than after, which moves results by an ulp.
 *
 * Costs: the GEMMs count their FLOPs (2 N V D forward, 2 N V D each for dh
 * and dW); the loss pass counts 4 FLOPs per logit and its chunk's bytes
 * (logits, targets, lse) as "linear_cross_entropy", the gradient pass
 * 4 FLOPs per logit and (logits, targets, lse, dlogits) as
 * "linear_cross_entropy grad", per chunk, on meta too.
 */
#include "fused.h"
#include "linear.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"

#include <math.h>

/* A chunk's logits of about this many bytes when the caller leaves the
 * size to the op: large enough for efficient GEMMs, small next to a
 * model's activations. */
enum { AUTO_CHUNK_BYTES = 256 << 20 };

static const fl_node_type linear_cross_entropy_type;

static int check_args(const char *op, const fl_tensor *h, const fl_tensor *w,
                      const fl_tensor *targets, fl_loss_reduction reduction, double ls) {
    if (fl_fused_check_float(op, "hidden", h) || fl_fused_check_float(op, "weight", w) ||
        fl_check_tensor(op, targets, false))
        return fl_last_status();
    char a[128], b[128];
    if (h->ndim != 2 || w->ndim != 2 || h->shape[1] != w->shape[1])
        return fl_fail(FL_ERR_ARG, "%s: hidden %s and weight %s must be [N, D] and [V, D]", op,
                       fl_shape_str(h, a, sizeof a), fl_shape_str(w, b, sizeof b));
    if (h->dtype != w->dtype)
        return fl_fail(FL_ERR_ARG, "%s: hidden is %s but weight is %s", op,
                       fl_dtype_name(h->dtype), fl_dtype_name(w->dtype));
    if (fl_fused_check_device(op, "weight", w, h->device) ||
        fl_fused_check_device(op, "targets", targets, h->device))
        return fl_last_status();
    if (targets->dtype != FL_I64 && targets->dtype != FL_I32)
        return fl_fail(FL_ERR_ARG, "%s: targets must be i64 (or i32) class indices, got %s", op,
                       fl_dtype_name(targets->dtype));
    if (targets->ndim != 1 || targets->shape[0] != h->shape[0])
        return fl_fail(FL_ERR_ARG, "%s: targets of shape %s do not match hidden %s (expected [%lld])",
                       op, fl_shape_str(targets, a, sizeof a), fl_shape_str(h, b, sizeof b),
                       (long long)h->shape[0]);
    if (reduction != FL_LOSS_MEAN && reduction != FL_LOSS_SUM)
        return fl_fail(FL_ERR_ARG, "%s: reduction must be mean (1) or sum (2), got %d (per-row "
                                   "losses: cross_entropy)",
                       op, (int)reduction);
    if (!(ls >= 0 && ls <= 1))
        return fl_fail(FL_ERR_ARG, "%s: label_smoothing must be in [0, 1], got %g", op, ls);
    return FL_OK;
}

int64_t fl_linear_cross_entropy_chunk_rows(int64_t vocab, fl_dtype dtype, int64_t rows) {
    int64_t per_row = vocab * (int64_t)fl_dtype_size(dtype);
    int64_t auto_rows = per_row > 0 ? AUTO_CHUNK_BYTES / per_row : rows;
    if (auto_rows < 1) auto_rows = 1;
    return rows > 0 && rows < auto_rows ? rows : auto_rows;
}

/* The state of one call while it walks its chunks. */
typedef struct lce_run {
    const char *op;
    const fl_tensor *h, *w, *tg;
    fl_tensor wt;                   /* W^T [D, V], a view */
    const fl_fused_kernels *fk;     /* NULL on meta */
    const fl_linear_kernels *lk;
    fl_loss_params p;
    bool no_storage, want_dh, want_dw, one_chunk;
    fl_tensor *dh, *dw;             /* dw: W's dtype with one chunk, else the wide accumulator */
    double total;
    int64_t count;
} lce_run;

static int run_chunk(lce_run *r, int64_t r0, int64_t rows) {
    const char *op = r->op;
    int64_t V = r->w->shape[0], D = r->w->shape[1];
    fl_dtype ct = fl_fused_compute_dtype(r->h->dtype);
    int rc = FL_OK;
    fl_tensor *hc = fl_narrow(r->h, 0, r0, rows), *tc = fl_narrow(r->tg, 0, r0, rows);
    fl_tensor *logits = hc && tc ? fl_linear_bmm(op, hc, &r->wt, NULL, NULL) : NULL;
    fl_tensor *lse = logits ? fl_fused_output(1, &rows, ct, r->h->device, r->no_storage) : NULL;
    fl_tensor *dl = NULL, *dhc = NULL;
    if (!lse) {
        rc = fl_last_status();
        goto done;
    }
    fl_flops_add(4 * logits->numel);
    fl_count_bytes(op, 3, (const fl_tensor *[]){logits, tc, lse});
    if (!r->no_storage) {
        double total = 0;
        int64_t count = 0;
        if ((rc = r->fk->cross_entropy(NULL, lse, logits, tc, &r->p, &total, &count))) goto done;
        r->total += total;
        r->count += count;
    }
    if (!r->want_dh && !r->want_dw) goto done;
    int64_t shape[2] = {rows, V};
    if (!(dl = fl_fused_output(2, shape, r->h->dtype, r->h->device, r->no_storage))) {
        rc = fl_last_status();
        goto done;
    }
    fl_flops_add(4 * logits->numel);
    fl_count_bytes("linear_cross_entropy grad", 4, (const fl_tensor *[]){logits, tc, lse, dl});
    if (!r->no_storage && (rc = r->fk->cross_entropy_backward(dl, NULL, 1.0, logits, tc, lse, &r->p)))
        goto done;
    /* the logits are spent: free them before the products allocate */
    fl_tensor_release(logits);
    logits = NULL;
    if (r->want_dh) {
        fl_tensor *got = (dhc = fl_narrow(r->dh, 0, r0, rows)) ? fl_linear_bmm(op, dl, r->w, NULL, dhc)
                                                                : NULL;
        if (!got) {
            rc = fl_last_status();
            goto done;
        }
        fl_tensor_release(got);
    }
    if (r->want_dw) {
        fl_tensor dlt;
        fl_linear_swap_view(dl, 0, 1, &dlt); /* [V, rows] */
        if (r->one_chunk) {
            if (!(r->dw = fl_linear_bmm(op, &dlt, hc, NULL, NULL))) rc = fl_last_status();
        } else {
            fl_flops_add(2 * V * D * rows);
            if (!r->no_storage) rc = r->lk->matmul_acc(r->dw, &dlt, hc);
        }
    }
done:
    fl_tensor_release(dhc);
    fl_tensor_release(dl);
    fl_tensor_release(lse);
    fl_tensor_release(logits);
    fl_tensor_release(tc);
    fl_tensor_release(hc);
    return rc ? rc : (int)FL_OK;
}

fl_tensor *fl_linear_cross_entropy(const fl_tensor *h, const fl_tensor *w, const fl_tensor *targets,
                                   int64_t ignore_index, fl_loss_reduction reduction,
                                   double label_smoothing, int64_t chunk_rows) {
    const char *op = "linear_cross_entropy";
    if (check_args(op, h, w, targets, reduction, label_smoothing)) return NULL;
    const fl_tensor *all[3] = {h, w, targets};
    lce_run r = {.op = op, .h = h, .w = w, .p = {ignore_index, label_smoothing}};
    r.no_storage = fl_fused_no_storage(3, all);
    r.want_dh = fl_needs_grad(1, &h);
    r.want_dw = fl_needs_grad(1, &w);
    int64_t N = h->shape[0], V = w->shape[0], D = w->shape[1];
    int64_t rows = fl_linear_cross_entropy_chunk_rows(V, h->dtype, chunk_rows);
    r.one_chunk = rows >= N;
    fl_dtype ct = fl_fused_compute_dtype(h->dtype);
    fl_linear_swap_view(w, 0, 1, &r.wt);
    if (!r.no_storage) {
        r.fk = fl_fused_kernels_of(op, h->device);
        r.lk = r.fk ? fl_linear_kernels_of(op, h->device) : NULL;
        if (!r.lk) return NULL;
    }
    fl_tensor *out = fl_fused_output(0, NULL, ct, h->device, r.no_storage);
    fl_tensor *tg = out ? fl_contiguous(targets) : NULL;
    r.tg = tg;
    int rc = tg ? FL_OK : (int)fl_last_status();
    if (!rc && r.want_dh) {
        int64_t shape[2] = {N, D};
        if (!(r.dh = fl_fused_output(2, shape, h->dtype, h->device, r.no_storage))) rc = fl_last_status();
    }
    if (!rc && r.want_dw && !r.one_chunk) {
        int64_t shape[2] = {V, D};
        r.dw = r.no_storage ? fl_fake(2, shape, ct, h->device) : fl_zeros(2, shape, ct, h->device);
        if (!r.dw) rc = fl_last_status();
    }
    /* views, products and casts of the chunks are this op's own business */
    bool was = fl_set_grad_enabled(false);
    for (int64_t r0 = 0; !rc && r0 < N; r0 += rows) rc = run_chunk(&r, r0, N - r0 < rows ? N - r0 : rows);
    if (!rc && r.want_dw && !r.dw) { /* no rows: a zero gradient, as the unfused product's */
        r.dw = r.no_storage ? fl_fake(2, w->shape, w->dtype, w->device)
                            : fl_zeros(2, w->shape, w->dtype, w->device);
        if (!r.dw) rc = fl_last_status();
    }
    if (!rc && r.dw && r.dw->dtype != w->dtype) {
        /* the wide sum rounded once to W's dtype */
        fl_tensor *dw = fl_to(r.dw, w->dtype, w->device);
        fl_tensor_release(r.dw);
        r.dw = dw;
        if (!dw) rc = fl_last_status();
    }
    fl_set_grad_enabled(was);
    if (!rc && !r.no_storage) {
        /* count == 0 under 'mean' gives 0/0 = nan, as fl_cross_entropy */
        double value = reduction == FL_LOSS_MEAN ? r.total / (double)r.count : r.total;
        rc = fl_fill_(out, value);
    }
    if (!rc && (r.want_dh || r.want_dw)) {
        fl_node *node;
        const fl_tensor *inputs[2] = {h, w}, *saved[2] = {r.dh, r.dw};
        out = fl_fused_record(&linear_cross_entropy_type, 2, inputs, out, 2, saved, &node);
        if (out) {
            node->i[0] = reduction;
            node->i[1] = r.count;
        } else {
            rc = fl_last_status();
        }
    }
    fl_tensor_release(r.dh);
    fl_tensor_release(r.dw);
    fl_tensor_release(tg);
    if (rc) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

/* The factor on the saved gradients: the incoming 0-d gradient, divided by
 * the count for 'mean' (0 when nothing counted: every row's gradient is
 * then 0, as fl_cross_entropy's backward writes). Reads g on the host. */
static int grad_scale(const fl_tensor *g, fl_loss_reduction reduction, int64_t count, double *s) {
    int64_t zero[1] = {0};
    fl_tensor *host = NULL;
    if (fl_device_kind_of(g->device) != FL_DEVICE_CPU) {
        if (!(host = fl_to(g, g->dtype, fl_device_make(FL_DEVICE_CPU, 0)))) return fl_last_status();
        g = host;
    }
    int rc = fl_get(g, zero, s);
    fl_tensor_release(host);
    if (rc) return fl_last_status();
    if (reduction == FL_LOSS_MEAN) *s = count > 0 ? *s / (double)count : 0;
    return FL_OK;
}

static int linear_cross_entropy_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *g = go[0];
    double s = 1;
    bool no_storage = fl_fused_no_storage(1, &g);
    for (int k = 0; k < 2; k++)
        if (node->saved[k] && !node->saved[k]->storage) no_storage = true;
    if (!no_storage) {
        int rc = grad_scale(g, (fl_loss_reduction)node->i[0], node->i[1], &s);
        if (rc) return rc;
    }
    for (int k = 0; k < 2; k++) {
        if (!fl_node_wants(node, k) || !node->saved[k]) continue;
        /* a new tensor: the saved one stays as it was (retain_graph) */
        if (!(gi[k] = fl_binary_scalar(FL_MUL, node->saved[k], s, false))) return fl_last_status();
    }
    return FL_OK;
}

static const fl_node_type linear_cross_entropy_type = {.name = "LinearCrossEntropyBackward",
                                                       .backward = linear_cross_entropy_backward};
