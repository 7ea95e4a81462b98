/*
 * moe.c: a mixture of experts as transformers 5 computes it (Mixtral's and
 * Qwen3-MoE's sparse MoE blocks): the router's top-k (fl_moe_route) and
 * the experts' SwiGLU MLPs over the tokens routed to them (fl_moe_experts),
 * each with its backward.
 *
 * Routing, per token row of logits [N, E]: p = softmax(logits) in f32 (f64
 * for f64), the k largest p in descending order, weights = those p, divided
 * by their sum when normalize (Mixtral always; Qwen3-MoE when
 * norm_topk_prob). Ties go to the lower expert: torch.topk's order among
 * equal values is whatever its selection algorithm leaves (on the CPU
 * std::nth_element's), not a rule anyone can rely on, and the CPU and CUDA
 * kernels here must agree. Gradients flow to the logits through the
 * weights; the ids are constants.
 *
 * Experts, with transformers 5's fused layout: gate_up [E, 2ff, h] (gate
 * rows first), down [E, h, ff]; for each token n and each of its k picks
 * (expert e_j, weight w_j): y[n] += w_j * down_e(silu(gate_e x) * up_e x).
 * [Note: experts as grouped products] The k*N (token, pick) rows are
 * sorted by expert on the host (a counting sort of the ids, stable in token
 * order; on a GPU the ids come to the host once per call, as the expert
 * sizes must for the products anyway), the tokens' rows gathered into that
 * order (xs [M, h], M = N*k), and each expert with tokens runs one product
 * per projection over its contiguous rows through the linear kernel table
 * (BLAS, cuBLAS): H = xs_e gate_up_e^T [n_e, 2ff], act = silu(H_gate) *
 * H_up, O = act down_e^T [n_e, h]. O's rows are weighted (rounded to x's
 * dtype, as transformers' index_add_ into a tensor of x's dtype rounds),
 * gathered back into (token, pick) order and summed over the k picks in
 * f64, rounded once. Nothing loops over tokens or experts outside C, and
 * the products run only for the experts that have tokens: FLOPs counted
 * are the active ones (2 * M * 3 * ff * h forward, twice that backward),
 * the same on meta, where no routing is known, as on a device.
 *
 * Saved for backward: x, the weights, the two weight tensors (the inputs),
 * H [M, 2ff] (the gate/up product, the costly part to recompute) and the
 * three index vectors; xs and act are recomputed (a gather and one
 * elementwise pass). Backward, per expert: dAu = gys_e down_e (gys = the
 * output gradient's rows in sorted order), dw = rowsum(dAu * act), dA =
 * w * dAu, ddown_e = gys_e^T (w * act)_e, dH = silu_mul's backward,
 * dgate_up_e = dH_e^T xs_e, dxs_e = dH_e gate_up_e; dx sums each token's k
 * rows of dxs as the forward sums O.
 */
#include "elementwise.h"
#include "binary.h"
#include "linear.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"

#include <stdlib.h>
#include <string.h>

/* ---- routing ------------------------------------------------------------------ */

static const fl_node_type route_type;

static fl_dtype compute_dtype(fl_dtype d) { return d == FL_F64 ? FL_F64 : FL_F32; }

/* The status of the error recorded by what failed, or a generic one. */
static int failed(const char *op) {
    int rc = (int)fl_last_status();
    return rc ? rc : fl_fail(FL_ERR_UNSUPPORTED, "%s failed", op);
}

/* A private contiguous copy of t (or t itself retained), outside autograd. */
static fl_tensor *dense(const fl_tensor *t) {
    if (fl_tensor_is_contiguous(t)) return fl_tensor_retain((fl_tensor *)t);
    bool was = fl_set_grad_enabled(false);
    fl_tensor *c = fl_contiguous(t);
    fl_set_grad_enabled(was);
    return c;
}

static bool has_storage(int n, const fl_tensor *const *ts) {
    for (int i = 0; i < n; i++)
        if (ts[i] && !fl_tensor_has_storage(ts[i])) return false;
    return true;
}

static fl_tensor *new_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                             bool storage) {
    return storage ? fl_empty(ndim, shape, dtype, device) : fl_fake(ndim, shape, dtype, device);
}

int fl_moe_route(const fl_tensor *logits, int64_t k, bool normalize, fl_tensor **weights_out,
                 fl_tensor **ids_out) {
    const char *op = "moe_route";
    if (!weights_out || !ids_out) return fl_fail(FL_ERR_ARG, "%s: NULL output pointer", op);
    *weights_out = *ids_out = NULL;
    if (fl_check_tensor(op, logits, false)) return fl_last_status();
    char s[128];
    if (!fl_dtype_is_float(logits->dtype) || logits->ndim != 2)
        return fl_fail(FL_ERR_ARG, "%s: logits must be a floating point [tokens, experts] tensor, "
                                   "got %s %s",
                       op, fl_dtype_name(logits->dtype), fl_shape_str(logits, s, sizeof s));
    int64_t N = logits->shape[0], E = logits->shape[1];
    if (k < 1 || k > E)
        return fl_fail(FL_ERR_ARG, "%s: top_k %lld must be in [1, %lld] for logits %s", op,
                       (long long)k, (long long)E, fl_shape_str(logits, s, sizeof s));
    bool storage = has_storage(1, &logits);
    int64_t shape[2] = {N, k};
    fl_tensor *w = new_output(2, shape, compute_dtype(logits->dtype), logits->device, storage);
    fl_tensor *ids = w ? new_output(2, shape, FL_I64, logits->device, storage) : NULL;
    fl_tensor *l = ids && storage ? dense(logits) : NULL;
    if (!ids || (storage && !l)) goto fail;
    fl_flops_add(fl_flops_mul(4, fl_flops_mul(N, E)));
    if (storage) {
        const fl_elementwise_kernels *kt = fl_elementwise_kernels_of(op, logits->device);
        if (!kt || !kt->moe_route ||
            (kt->moe_route(w, ids, l, normalize) != FL_OK))
            goto fail;
    }
    fl_tensor_release(l);
    l = NULL;
    if (fl_needs_grad(1, &logits)) {
        const fl_tensor *saved[2] = {logits, ids};
        fl_node *node = NULL;
        if (fl_record(&route_type, 1, &logits, w, 2, saved, &node) != FL_OK) goto fail;
        node->i[0] = normalize;
    }
    *weights_out = w;
    *ids_out = ids;
    return FL_OK;
fail:
    fl_tensor_release(l);
    fl_tensor_release(w);
    fl_tensor_release(ids);
    return failed(op);
}

static int route_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const char *op = "moe_route backward";
    const fl_tensor *logits = node->saved[0], *ids = node->saved[1];
    const fl_tensor *all[3] = {go[0], logits, ids};
    bool storage = has_storage(3, all);
    fl_tensor *dl = new_output(2, logits->shape, logits->dtype, logits->device, storage);
    if (!dl) return fl_last_status();
    fl_flops_add(fl_flops_mul(4, logits->numel));
    if (storage) {
        fl_tensor *l = dense(logits), *g = l ? fl_to(go[0], compute_dtype(logits->dtype), dl->device)
                                              : NULL;
        fl_tensor *gd = g ? dense(g) : NULL;
        const fl_elementwise_kernels *kt = gd ? fl_elementwise_kernels_of(op, dl->device) : NULL;
        int rc = kt && kt->moe_route_backward
                     ? kt->moe_route_backward(dl, gd, l, ids, node->i[0] != 0)
                     : failed(op);
        fl_tensor_release(l);
        fl_tensor_release(g);
        fl_tensor_release(gd);
        if (rc != FL_OK) {
            fl_tensor_release(dl);
            return rc;
        }
    }
    gi[0] = dl;
    return FL_OK;
}

static const fl_node_type route_type = {.name = "MoeRouteBackward", .backward = route_backward};

/* ---- experts ------------------------------------------------------------------- */

/* Stack views (not reference counted) the kernels read and write. */
static void plain(const fl_tensor *t, fl_tensor *v) {
    *v = *t;
    v->grad = NULL;
    v->grad_fn = NULL;
    v->flags &= ~(uint32_t)FL_TENSOR_REQUIRES_GRAD;
}

/* Rows [r0, r0 + n) of 2-d t, columns [c0, c0 + cols). */
static void block_view(const fl_tensor *t, int64_t r0, int64_t n, int64_t c0, int64_t cols,
                       fl_tensor *v) {
    plain(t, v);
    int64_t off = r0 * t->stride[0] + c0 * t->stride[1];
    v->shape[0] = n;
    v->shape[1] = cols;
    v->numel = n * cols;
    v->offset += off;
    if (v->data) v->data = (char *)t->data + off * (int64_t)fl_dtype_size(t->dtype);
}

static void rows_view(const fl_tensor *t, int64_t r0, int64_t n, fl_tensor *v) {
    block_view(t, r0, n, 0, t->shape[1], v);
}

/* Matrix e of 3-d t, transposed when `t_` (stride swap, no copy). */
static void expert_view(const fl_tensor *t, int64_t e, bool transpose, fl_tensor *v) {
    plain(t, v);
    int64_t off = e * t->stride[0];
    v->ndim = 2;
    v->shape[0] = t->shape[transpose ? 2 : 1];
    v->shape[1] = t->shape[transpose ? 1 : 2];
    v->stride[0] = t->stride[transpose ? 2 : 1];
    v->stride[1] = t->stride[transpose ? 1 : 2];
    v->numel = v->shape[0] * v->shape[1];
    v->offset += off;
    if (v->data) v->data = (char *)t->data + off * (int64_t)fl_dtype_size(t->dtype);
}

static void transposed(const fl_tensor *t, fl_tensor *v) {
    plain(t, v);
    v->shape[0] = t->shape[1];
    v->shape[1] = t->shape[0];
    v->stride[0] = t->stride[1];
    v->stride[1] = t->stride[0];
}

/* The sort of the (token, pick) rows by expert ([Note: experts as grouped
 * products]): offsets [E + 1] on the host; on the device tok [M] (the token
 * of each sorted row), slot [M] (its flat (token, pick) index) and inv [M]
 * (the sorted row of each slot). */
typedef struct routing {
    int64_t *offsets;
    fl_tensor *tok, *slot, *inv;
} routing;

static void routing_free(routing *r) {
    free(r->offsets);
    fl_tensor_release(r->tok);
    fl_tensor_release(r->slot);
    fl_tensor_release(r->inv);
    memset(r, 0, sizeof *r);
}

static int sort_by_expert(const char *op, const fl_tensor *ids, int64_t E, bool storage,
                          routing *r) {
    int64_t M = ids->numel, k = ids->shape[1];
    memset(r, 0, sizeof *r);
    if (!storage) {
        r->tok = fl_fake(1, &M, FL_I64, ids->device);
        r->slot = r->tok ? fl_fake(1, &M, FL_I64, ids->device) : NULL;
        r->inv = r->slot ? fl_fake(1, &M, FL_I64, ids->device) : NULL;
        if (!r->inv) routing_free(r);
        return r->inv ? FL_OK : fl_last_status();
    }
    int64_t *h = malloc((size_t)(M ? M : 1) * 4 * sizeof *h);
    r->offsets = calloc((size_t)E + 1, sizeof *r->offsets);
    if (!h || !r->offsets) {
        free(h);
        routing_free(r);
        return fl_fail(FL_ERR_OOM, "%s: out of CPU memory to sort %lld routed rows", op,
                       (long long)M);
    }
    int64_t *tok = h + M, *slot = tok + M, *inv = slot + M;
    if (fl_to_host(ids, h, FL_I64, M) != FL_OK) goto fail;
    for (int64_t s = 0; s < M; s++) {
        if (h[s] < 0 || h[s] >= E) {
            fl_fail(FL_ERR_ARG, "%s: expert id %lld (token %lld, pick %lld) is outside [0, %lld)",
                    op, (long long)h[s], (long long)(s / k), (long long)(s % k), (long long)E);
            goto fail;
        }
        r->offsets[h[s] + 1]++;
    }
    for (int64_t e = 0; e < E; e++) r->offsets[e + 1] += r->offsets[e];
    /* Stable: within an expert, rows stay in (token, pick) order. */
    int64_t *cursor = malloc((size_t)E * sizeof *cursor);
    if (!cursor) {
        fl_fail(FL_ERR_OOM, "%s: out of CPU memory for %lld experts", op, (long long)E);
        goto fail;
    }
    memcpy(cursor, r->offsets, (size_t)E * sizeof *cursor);
    for (int64_t s = 0; s < M; s++) {
        int64_t pos = cursor[h[s]]++;
        tok[pos] = s / k;
        slot[pos] = s;
        inv[s] = pos;
    }
    free(cursor);
    r->tok = fl_from_host(1, &M, FL_I64, ids->device, tok, FL_I64, M);
    r->slot = r->tok ? fl_from_host(1, &M, FL_I64, ids->device, slot, FL_I64, M) : NULL;
    r->inv = r->slot ? fl_from_host(1, &M, FL_I64, ids->device, inv, FL_I64, M) : NULL;
    if (!r->inv) goto fail;
    free(h);
    return FL_OK;
fail:
    free(h);
    routing_free(r);
    return fl_last_status();
}

static const fl_node_type experts_type;

static void release_offsets(fl_node *node) { free(node->extra); }

/* out = a @ b through the device's product kernel (views; out contiguous). */
static int product(const fl_linear_kernels *lk, fl_tensor *out, const fl_tensor *a,
                   const fl_tensor *b) {
    if (out->numel == 0) return FL_OK;
    if (a->shape[1] == 0) return fl_backend_of(out->device)->fill(out, 0);
    return lk->matmul(out, a, b, NULL);
}

/* Each expert's rows through its matrix: out_e = in_e w_e (w_e^T with
 * transpose) over expert e's sorted rows, one product per expert that has
 * tokens. */
static int expert_rows(const fl_linear_kernels *lk, fl_tensor *out, const fl_tensor *in,
                       const fl_tensor *w, bool transpose, const routing *r, int64_t E) {
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = r->offsets[e], n = r->offsets[e + 1] - r0;
        if (!n) continue;
        fl_tensor a, b, o;
        rows_view(in, r0, n, &a);
        expert_view(w, e, transpose, &b);
        rows_view(out, r0, n, &o);
        if (product(lk, &o, &a, &b)) return -1;
    }
    return 0;
}


/* out [rows, cols] = rows of src at idx (embedding's gather). */
static fl_tensor *gather(const char *op, const fl_tensor *src, const fl_tensor *idx) {
    int64_t shape[2] = {idx->numel, src->shape[1]};
    fl_tensor *out = fl_empty(2, shape, src->dtype, src->device);
    if (!out || out->numel == 0) return out;
    const fl_linear_kernels *lk = fl_linear_kernels_of(op, src->device);
    if (!lk || lk->embedding(out, idx, src) != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

/* out [N, D] (dtype) = sum over the k rows of each token of src [N*k, D]
 * taken in (token, pick) order through inv. */
static fl_tensor *sum_picks(const char *op, const fl_tensor *src, const fl_tensor *inv, int64_t N,
                            int64_t k) {
    fl_tensor *g = gather(op, src, inv);
    if (!g) return NULL;
    int64_t D = src->shape[1], shape[2] = {N, D};
    fl_tensor *out = fl_empty(2, shape, src->dtype, src->device);
    if (out && out->numel) {
        fl_tensor v;
        plain(g, &v);
        v.ndim = 3;
        v.shape[0] = N, v.shape[1] = k, v.shape[2] = D;
        v.stride[0] = k * D, v.stride[1] = D, v.stride[2] = 1;
        bool reduce[3] = {false, true, false};
        const fl_elementwise_kernels *ek = fl_elementwise_kernels_of(op, src->device);
        if (!ek || ek->sum(out, &v, reduce, 1.0) != FL_OK) {
            fl_tensor_release(out);
            out = NULL;
        }
    }
    fl_tensor_release(g);
    return out;
}

static int check_experts(const char *op, const fl_tensor *x, const fl_tensor *weights,
                         const fl_tensor *ids, const fl_tensor *gate_up, const fl_tensor *down) {
    const fl_tensor *ts[5] = {x, weights, ids, gate_up, down};
    static const char *what[5] = {"input", "weights", "ids", "gate_up_proj", "down_proj"};
    for (int i = 0; i < 5; i++) {
        if (fl_check_tensor(op, ts[i], false)) return fl_last_status();
        if (ts[i]->device != x->device)
            return fl_fail(FL_ERR_ARG, "%s: %s is on another device than the input", op, what[i]);
    }
    char a[128], b[128], c[128];
    if (!fl_dtype_is_float(x->dtype) || x->ndim < 1)
        return fl_fail(FL_ERR_ARG, "%s: input must be a floating point [..., hidden] tensor, got "
                                   "%s %s",
                       op, fl_dtype_name(x->dtype), fl_shape_str(x, a, sizeof a));
    if (gate_up->dtype != x->dtype || down->dtype != x->dtype)
        return fl_fail(FL_ERR_ARG, "%s: gate_up_proj (%s) and down_proj (%s) must have the "
                                   "input's dtype %s",
                       op, fl_dtype_name(gate_up->dtype), fl_dtype_name(down->dtype),
                       fl_dtype_name(x->dtype));
    int64_t h = x->shape[x->ndim - 1];
    bool ok = gate_up->ndim == 3 && down->ndim == 3 && gate_up->shape[0] >= 1 &&
              gate_up->shape[1] % 2 == 0 && gate_up->shape[2] == h &&
              down->shape[0] == gate_up->shape[0] && down->shape[1] == h &&
              down->shape[2] * 2 == gate_up->shape[1];
    if (!ok)
        return fl_fail(FL_ERR_ARG, "%s: gate_up_proj %s and down_proj %s must be [E, 2*ff, %lld] "
                                   "and [E, %lld, ff] for input %s",
                       op, fl_shape_str(gate_up, a, sizeof a), fl_shape_str(down, b, sizeof b),
                       (long long)h, (long long)h, fl_shape_str(x, c, sizeof c));
    int64_t N = h ? x->numel / h : 0;
    for (int d = 0; h == 0 && d < x->ndim - 1; d++) N = (d ? N : 1) * x->shape[d];
    if (ids->dtype != FL_I64 && ids->dtype != FL_I32)
        return fl_fail(FL_ERR_ARG, "%s: ids must be i64 or i32, got %s", op,
                       fl_dtype_name(ids->dtype));
    if (!fl_dtype_is_float(weights->dtype))
        return fl_fail(FL_ERR_ARG, "%s: weights must be a floating point tensor, got %s", op,
                       fl_dtype_name(weights->dtype));
    if (ids->ndim != 2 || ids->shape[0] != N || weights->ndim != 2 ||
        weights->shape[0] != ids->shape[0] || weights->shape[1] != ids->shape[1] ||
        ids->shape[1] < 1)
        return fl_fail(FL_ERR_ARG, "%s: weights %s and ids %s must both be [%lld tokens, top_k] "
                                   "for input %s",
                       op, fl_shape_str(weights, a, sizeof a), fl_shape_str(ids, b, sizeof b),
                       (long long)N, fl_shape_str(x, c, sizeof c));
    if (fl_requires_grad(ids) && fl_grad_enabled())
        return fl_fail(FL_ERR_ARG, "%s: ids require grad (they are integers)", op);
    return FL_OK;
}

/* FLOPs of the products of M routed rows: 3 products of ff x h, each
 * 2 * M * ff * h (forward). */
static int64_t product_flops(int64_t M, int64_t ff, int64_t h) {
    return fl_flops_mul(6, fl_flops_mul(M, fl_flops_mul(ff, h)));
}

fl_tensor *fl_moe_experts(const fl_tensor *x, const fl_tensor *weights, const fl_tensor *ids,
                          const fl_tensor *gate_up, const fl_tensor *down) {
    const char *op = "moe_experts";
    if (check_experts(op, x, weights, ids, gate_up, down)) return NULL;
    int64_t h = x->shape[x->ndim - 1], E = gate_up->shape[0], ff = down->shape[2];
    int64_t N = ids->shape[0], k = ids->shape[1], M = N * k;
    const fl_tensor *all[5] = {x, weights, ids, gate_up, down};
    bool storage = has_storage(5, all);
    fl_device dev = x->device;
    fl_flops_add(fl_flops_sum(product_flops(M, ff, h), fl_flops_mul(M, 2 * ff + 2 * h)));
    routing r;
    if (sort_by_expert(op, ids, E, storage, &r)) return NULL;
    fl_tensor *xd = NULL, *xs = NULL, *H = NULL, *act = NULL, *O = NULL, *ws = NULL, *wd = NULL,
              *y2 = NULL, *y = NULL;
    int64_t shapeH[2] = {M, 2 * ff};
    H = new_output(2, shapeH, x->dtype, dev, storage);
    if (!H) goto fail;
    if (!storage) {
        y = fl_fake(x->ndim, x->shape, x->dtype, dev);
        if (!y) goto fail;
        /* What the kernels would hold at once beside H: xs, act, O. */
        int64_t shapeA[2] = {M, ff}, shapeO[2] = {M, h};
        act = fl_fake(2, shapeA, x->dtype, dev);
        O = fl_fake(2, shapeO, x->dtype, dev);
        if (!act || !O) goto fail;
    } else {
        const fl_linear_kernels *lk = fl_linear_kernels_of(op, dev);
        const fl_elementwise_kernels *ek = fl_elementwise_kernels_of(op, dev);
        const fl_binary_kernels *bk = fl_binary_kernels_of(op, dev);
        if (!lk || !ek || !bk) goto fail;
        xd = dense(x);
        fl_tensor x2;
        if (!xd) goto fail;
        plain(xd, &x2);
        x2.ndim = 2, x2.shape[0] = N, x2.shape[1] = h, x2.stride[0] = h, x2.stride[1] = 1;
        xs = gather(op, &x2, r.tok);
        int64_t shapeA[2] = {M, ff}, shapeO[2] = {M, h};
        act = xs ? fl_empty(2, shapeA, x->dtype, dev) : NULL;
        O = act ? fl_empty(2, shapeO, x->dtype, dev) : NULL;
        if (!O) goto fail;
        if (expert_rows(lk, H, xs, gate_up, true, &r, E)) goto fail;
        fl_tensor g, u;
        block_view(H, 0, M, 0, ff, &g);
        block_view(H, 0, M, ff, ff, &u);
        if (M && ek->silu_mul(act, &g, &u)) goto fail;
        if (expert_rows(lk, O, act, down, true, &r, E)) goto fail;
        /* O *= the sorted weights, rounded to x's dtype. */
        wd = dense(weights);
        fl_tensor w2;
        if (!wd) goto fail;
        plain(wd, &w2);
        w2.shape[0] = M, w2.shape[1] = 1, w2.stride[0] = 1, w2.stride[1] = 1;
        ws = gather(op, &w2, r.slot);
        if (!ws) goto fail;
        fl_tensor wb;
        plain(ws, &wb);
        wb.shape[1] = h, wb.stride[1] = 0, wb.numel = M * h;
        if (M && h && bk->binary(FL_MUL, O, O, &wb, 0)) goto fail;
        y2 = sum_picks(op, O, r.inv, N, k);
        if (!y2) goto fail;
        y = fl_empty(x->ndim, x->shape, x->dtype, dev);
        if (!y) goto fail;
        if (y->numel) {
            fl_tensor yv;
            plain(y2, &yv);
            memcpy(yv.shape, y->shape, sizeof y->shape);
            memcpy(yv.stride, y->stride, sizeof y->stride);
            yv.ndim = y->ndim;
            if (fl_backend_of(dev)->copy(y, &yv)) goto fail;
        }
    }
    fl_tensor_release(xd);
    fl_tensor_release(xs);
    fl_tensor_release(act);
    fl_tensor_release(O);
    fl_tensor_release(ws);
    fl_tensor_release(wd);
    fl_tensor_release(y2);
    xd = xs = act = O = ws = wd = y2 = NULL;
    const fl_tensor *inputs[4] = {x, weights, gate_up, down};
    if (fl_needs_grad(4, inputs)) {
        const fl_tensor *saved[8] = {x, weights, gate_up, down, H, r.tok, r.slot, r.inv};
        fl_node *node = NULL;
        if (fl_record(&experts_type, 4, inputs, y, 8, saved, &node) != FL_OK) goto fail;
        node->extra = r.offsets;
        r.offsets = NULL;
        node->i[0] = k;
    }
    fl_tensor_release(H);
    routing_free(&r);
    return y;
fail:
    fl_tensor_release(xd);
    fl_tensor_release(xs);
    fl_tensor_release(act);
    fl_tensor_release(O);
    fl_tensor_release(ws);
    fl_tensor_release(wd);
    fl_tensor_release(y2);
    fl_tensor_release(y);
    fl_tensor_release(H);
    routing_free(&r);
    failed(op);
    return NULL;
}

/* Zero expert e's matrix of a 3-d gradient (an expert without tokens). */
static int zero_expert(fl_tensor *t, int64_t e) {
    fl_tensor v;
    expert_view(t, e, false, &v);
    return v.numel ? fl_backend_of(t->device)->fill(&v, 0) : FL_OK;
}

/* The weight gradient of every expert, g[e] = dy_e^T x_e over expert e's
 * sorted rows (an expert without tokens gets zeros): one product each. */
static int expert_weight_grads(const fl_linear_kernels *lk, fl_tensor *g, const fl_tensor *dy,
                               const fl_tensor *xr, const routing *r, int64_t E) {
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = r->offsets[e], n = r->offsets[e + 1] - r0;
        if (!n) {
            if (zero_expert(g, e)) return -1;
            continue;
        }
        fl_tensor a, at, b, o;
        rows_view(dy, r0, n, &a);
        transposed(&a, &at);
        rows_view(xr, r0, n, &b);
        expert_view(g, e, false, &o);
        if (product(lk, &o, &at, &b)) return -1;
    }
    return 0;
}

static int experts_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const char *op = "moe_experts backward";
    const fl_tensor *x = node->saved[0], *weights = node->saved[1], *gate_up = node->saved[2];
    const fl_tensor *down = node->saved[3], *H = node->saved[4];
    routing r = {node->extra, node->saved[5], node->saved[6], node->saved[7]};
    int64_t k = node->i[0], M = H->shape[0], N = M / k, h = down->shape[1], ff = down->shape[2];
    int64_t E = gate_up->shape[0];
    bool want_x = fl_node_wants(node, 0), want_w = fl_node_wants(node, 1);
    bool want_gu = fl_node_wants(node, 2), want_down = fl_node_wants(node, 3);
    fl_device dev = x->device;
    fl_flops_add(fl_flops_sum(fl_flops_mul(2, product_flops(M, ff, h)),
                              fl_flops_mul(M, 8 * ff + 2 * h)));
    const fl_tensor *all[9] = {go[0], x, weights, gate_up, down, H, r.tok, r.slot, r.inv};
    fl_tensor *gx = NULL, *gw = NULL, *ggu = NULL, *gdown = NULL;
    fl_tensor *gd = NULL, *gys = NULL, *Gc = NULL, *Uc = NULL, *act = NULL, *dA = NULL,
              *tmp = NULL, *dws = NULL, *wd = NULL, *ws = NULL, *dG = NULL, *dU = NULL,
              *dH = NULL, *xd = NULL, *xs = NULL, *dxs = NULL, *gx2 = NULL, *gw2 = NULL;
    if (!has_storage(9, all) || !r.offsets) {
        /* Shapes only (meta, fake): the gradients and the largest
         * intermediates the kernels would hold. */
        int64_t shapeA[2] = {M, ff};
        act = fl_fake(2, shapeA, x->dtype, dev);
        dH = act ? fl_fake(2, H->shape, x->dtype, dev) : NULL;
        if (!dH) goto fail;
        if (want_x && !(gx = fl_fake(x->ndim, x->shape, x->dtype, dev))) goto fail;
        if (want_w && !(gw = fl_fake(2, weights->shape, weights->dtype, dev))) goto fail;
        if (want_gu && !(ggu = fl_fake(3, gate_up->shape, gate_up->dtype, dev))) goto fail;
        if (want_down && !(gdown = fl_fake(3, down->shape, down->dtype, dev))) goto fail;
        goto done;
    }
    const fl_linear_kernels *lk = fl_linear_kernels_of(op, dev);
    const fl_elementwise_kernels *ek = fl_elementwise_kernels_of(op, dev);
    const fl_binary_kernels *bk = fl_binary_kernels_of(op, dev);
    const fl_backend *be = fl_backend_of(dev);
    if (!lk || !ek || !bk) goto fail;
    fl_dtype cd = compute_dtype(x->dtype);
    /* The output gradient's rows in sorted order. */
    gd = fl_to(go[0], x->dtype, dev);
    fl_tensor *gdd = gd ? dense(gd) : NULL;
    fl_tensor_release(gd);
    gd = gdd;
    if (!gd) goto fail;
    fl_tensor g2;
    plain(gd, &g2);
    g2.ndim = 2, g2.shape[0] = N, g2.shape[1] = h, g2.stride[0] = h, g2.stride[1] = 1;
    gys = gather(op, &g2, r.tok);
    int64_t shapeA[2] = {M, ff};
    Gc = gys ? fl_empty(2, shapeA, x->dtype, dev) : NULL;
    Uc = Gc ? fl_empty(2, shapeA, x->dtype, dev) : NULL;
    act = Uc ? fl_empty(2, shapeA, x->dtype, dev) : NULL;
    dA = act ? fl_empty(2, shapeA, x->dtype, dev) : NULL;
    if (!dA) goto fail;
    if (M && ff) {
        fl_tensor g, u;
        block_view(H, 0, M, 0, ff, &g);
        block_view(H, 0, M, ff, ff, &u);
        if (be->copy(Gc, &g) || be->copy(Uc, &u) || ek->silu_mul(act, Gc, Uc)) goto fail;
    }
    /* dAu = gys_e down_e (unweighted), into dA. */
    if (expert_rows(lk, dA, gys, down, false, &r, E)) goto fail;
    wd = dense(weights);
    if (!wd) goto fail;
    fl_tensor w2;
    plain(wd, &w2);
    w2.shape[0] = M, w2.shape[1] = 1, w2.stride[0] = 1, w2.stride[1] = 1;
    ws = gather(op, &w2, r.slot);
    if (!ws) goto fail;
    if (want_w) {
        /* dw of each sorted row = sum_f dAu * act, in the compute dtype. */
        tmp = fl_empty(2, shapeA, cd, dev);
        int64_t m1[2] = {M, 1};
        dws = tmp ? fl_empty(2, m1, cd, dev) : NULL;
        if (!dws) goto fail;
        bool reduce[2] = {false, true};
        if (M && ff && (bk->binary(FL_MUL, tmp, dA, act, 0) || ek->sum(dws, tmp, reduce, 1.0)))
            goto fail;
        if (M && !ff && be->fill(dws, 0)) goto fail;
        gw2 = gather(op, dws, r.inv);
        gw = gw2 ? fl_empty(2, weights->shape, weights->dtype, dev) : NULL;
        if (!gw) goto fail;
        if (gw->numel) {
            fl_tensor v;
            plain(gw2, &v);
            v.shape[0] = N, v.shape[1] = k, v.stride[0] = k, v.stride[1] = 1;
            if (be->copy(gw, &v)) goto fail;
        }
    }
    fl_tensor wb;
    plain(ws, &wb);
    wb.shape[1] = ff, wb.stride[1] = 0, wb.numel = M * ff;
    if (M && ff && bk->binary(FL_MUL, dA, dA, &wb, 0)) goto fail;
    if (want_down) {
        /* ddown_e = gys_e^T (w * act)_e; act is weighted in place (not needed after). */
        if (M && ff && bk->binary(FL_MUL, act, act, &wb, 0)) goto fail;
        gdown = fl_empty(3, down->shape, down->dtype, dev);
        if (!gdown || expert_weight_grads(lk, gdown, gys, act, &r, E)) goto fail;
    }
    fl_tensor_release(act);
    act = NULL;
    if (!want_x && !want_gu) goto done;
    dG = fl_empty(2, shapeA, x->dtype, dev);
    dU = dG ? fl_empty(2, shapeA, x->dtype, dev) : NULL;
    dH = dU ? fl_empty(2, H->shape, x->dtype, dev) : NULL;
    if (!dH) goto fail;
    if (M && ff) {
        fl_tensor g, u;
        block_view(dH, 0, M, 0, ff, &g);
        block_view(dH, 0, M, ff, ff, &u);
        if (ek->silu_mul_backward(dG, dU, dA, Gc, Uc) || be->copy(&g, dG) || be->copy(&u, dU))
            goto fail;
    }
    if (want_gu) {
        xd = dense(x);
        if (!xd) goto fail;
        fl_tensor x2;
        plain(xd, &x2);
        x2.ndim = 2, x2.shape[0] = N, x2.shape[1] = h, x2.stride[0] = h, x2.stride[1] = 1;
        xs = gather(op, &x2, r.tok);
        ggu = xs ? fl_empty(3, gate_up->shape, gate_up->dtype, dev) : NULL;
        if (!ggu || expert_weight_grads(lk, ggu, dH, xs, &r, E)) goto fail;
    }
    if (want_x) {
        int64_t shapeX[2] = {M, h};
        dxs = fl_empty(2, shapeX, x->dtype, dev);
        if (!dxs) goto fail;
        if (expert_rows(lk, dxs, dH, gate_up, false, &r, E)) goto fail;
        gx2 = sum_picks(op, dxs, r.inv, N, k);
        gx = gx2 ? fl_empty(x->ndim, x->shape, x->dtype, dev) : NULL;
        if (!gx) goto fail;
        if (gx->numel) {
            fl_tensor v;
            plain(gx2, &v);
            memcpy(v.shape, gx->shape, sizeof v.shape);
            memcpy(v.stride, gx->stride, sizeof v.stride);
            v.ndim = gx->ndim;
            if (be->copy(gx, &v)) goto fail;
        }
    }
done:;
    fl_tensor *tmps[] = {gd, gys, Gc, Uc, act, dA, tmp, dws, wd, ws, dG, dU, dH, xd, xs, dxs, gx2,
                         gw2};
    for (size_t i = 0; i < sizeof tmps / sizeof *tmps; i++) fl_tensor_release(tmps[i]);
    gi[0] = want_x ? gx : NULL;
    gi[1] = want_w ? gw : NULL;
    gi[2] = want_gu ? ggu : NULL;
    gi[3] = want_down ? gdown : NULL;
    return FL_OK;
fail:;
    fl_tensor *both[] = {gd, gys, Gc,  Uc, act, dA,  tmp, dws, wd,  ws,    dG,
                         dU, dH,  xd,  xs, dxs, gx2, gw2, gx,  gw,  ggu, gdown};
    for (size_t i = 0; i < sizeof both / sizeof *both; i++) fl_tensor_release(both[i]);
    return failed(op);
}

static const fl_node_type experts_type = {
    .name = "MoeExpertsBackward", .backward = experts_backward, .release = release_offsets};
