/*
 * attention.c: scaled dot-product attention, flash-attention style on the
 * CPU: softmax(scale * q k^T + bias, causal mask) v, forward and backward.
 *
 * Shapes: q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] ->
 * [B, Hq, Tq, Dv]. Grouped-query attention: Hq is a multiple of Hkv and
 * query head h reads kv head h / (Hq / Hkv). bias is additive and
 * broadcasts to [B, Hq, Tq, Tk] (T5's relative position bias, or a mask of
 * 0 and -inf); it may require grad (T5 trains it) and then gets dS summed
 * over the dims it was broadcast along. scale multiplies q k^T (PyTorch's
 * default is 1/sqrt(D); T5 uses 1, the caller passes it).
 *
 * causal masks key j for query i when j > i (PyTorch's is_causal: the
 * mask is aligned top-left, so with Tq != Tk query 0 sees key 0 only; for
 * decoding with a cache pass causal = false or an explicit bias). A row
 * whose every key is masked (bias -inf everywhere) outputs zeros and gets
 * zero gradients, as FlashAttention does (PyTorch's math path gives nan).
 *
 * Memory: the kernels work on blocks of query rows and never hold all of
 * the B*H*Tq*Tk scores; only q, k, v, the output and the per-row
 * logsumexp [B, Hq, Tq] are saved, and the backward recomputes each
 * block's probabilities from the logsumexp. Math is f32 (f64 for f64
 * inputs) through BLAS GEMMs; q, k, v must share one dtype.
 *
 * A device may offer a library path (fused.h: attention_native; on CUDA
 * cuDNN's fused flash attention, core/cuda/cuda_sdpa.cu): bf16/f16 q, k, v
 * (and a bias of their dtype) go to it as they are, gradients come back in
 * that dtype, and whatever it declines runs the kernels on f32 copies.
 *
 * FLOPs (the FlashAttention/PyTorch convention: matrix products only):
 * forward 2*B*Hq*Tq*Tk*(D + Dv), halved when causal; with a sliding window
 * that hides keys (window < Tq) the exact count of visible (query, key)
 * pairs instead of Tq*Tk; backward 2.5 times the forward (five products to
 * the forward's two: S recomputed, dV, dP, dQ, dK).
 *
 * [Note: attention window and softcap]
 * fl_attention_options (fsdp.h) adds two things to every kernel (CPU f32
 * and f64 blocks, CPU bf16 tiles and dot products, CUDA's flash-style
 * kernels), in transformers' order:
 *   s = scale * q.k;  s = softcap * tanh(s / softcap) when softcap > 0;
 *   s += bias;  key j masked for query i when j > i (causal) or
 *   j <= i - window (window > 0): the last `window` keys, itself included.
 * Backward: dS (the gradient at the capped score, which is also dbias) is
 * multiplied by 1 - tanh^2 (recomputed from the scores) before dQ and dK.
 * The window is a band below the causal diagonal, aligned top-left like
 * the causal flag, so it is refused without causal: for decoding with a
 * cache (queries at positions past 0) the caller's mask carries causality
 * and the window (lua/fsdp/nn/attention.lua). No kernel builds a [Tq, Tk]
 * mask: each block of query rows multiplies only the keys its rows can see
 * (from the first row's window start to the last row's diagonal), so a
 * window makes the work O(Tq * window). cuDNN's graphs (cuda_sdpa.cu) are
 * not given either option: such calls take the flash-style kernels.
 *
 * [Note: packed sequences]
 * Several short examples trained in one sequence (lua/fsdp/data/packing.lua
 * packs them) must not see each other: fl_attention_options.segments is an
 * i64/i32 [B, T] tensor of document ids, and key j is visible from query i
 * only when i and j lie in one maximal run of equal ids (and j <= i:
 * segments need causal, and Tq == Tk; the window, softcap and a bias still
 * apply). A run is a document, so ids need only differ between neighbours
 * (the packer numbers them 0, 1, ... per row); negative ids are padding:
 * a padding query sees no key (zeros out, lse -inf, zero gradients, as any
 * row with every key masked) and no query sees a padding key.
 * - The op reads the ids to the host (a device-to-host copy, a sync on a
 *   GPU, as the MoE routing's) and turns them into starts [B, T] (i64, on
 *   q's device, saved for the backward): query i's document begins at key
 *   starts[b, i] (i + 1 for padding: an empty range). Causal attention
 *   within contiguous documents is then exactly "keys starts[i] ... i", a
 *   per-row lower bound like the window's, so every kernel (CPU f32/f64
 *   blocks, CPU bf16 tiles and dot products, CUDA's flash-style kernels)
 *   masks key j < max(starts[i], i - window + 1), and no [Tq, Tk] mask
 *   exists anywhere. starts never decreases along i (a run's rows share
 *   one; padding's i + 1 is at least any earlier row's), so a block of
 *   rows i0 ... i1 sees keys from starts[i0] (its first row's) to i1: a
 *   block that begins inside a document skips every key before that
 *   document, and one key block (CUDA's dK/dV) stops at the first query
 *   tile whose first row starts past its keys. Work follows each
 *   document's own causal triangle, up to one block's rectangle at each
 *   boundary.
 * - FLOPs count each document as its own causal attention: L * L / 2 pairs
 *   for L tokens (the causal convention above), the exact pairs of a
 *   window shorter than the document; 2.5 times that for the backward.
 *   Padding counts nothing, and one document filling the row counts what
 *   the unpacked call does. On meta (no ids to read) the count is the
 *   unpacked call's (one document per row: the bound).
 * - cuDNN's graphs (cuda_sdpa.cu) are not given segments (its ragged
 *   offsets were never checked on a GPU here): packed calls take the
 *   flash-style kernels.
 */
#include "fused.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"

#include <math.h>
#include <stdlib.h>

static const fl_node_type attention_type;

static const char *OP = "scaled_dot_product_attention";

/* (query, key) pairs a causal window leaves visible: query i sees
 * keys max(0, i - window + 1) ... min(i, tk - 1). */
static int64_t window_pairs(int64_t tq, int64_t tk, int64_t window) {
    int64_t n = 0;
    for (int64_t i = 0; i < tq; i++) {
        int64_t lo = i - window + 1 > 0 ? i - window + 1 : 0, hi = i < tk - 1 ? i : tk - 1;
        if (hi >= lo) n += hi - lo + 1;
    }
    return n;
}

static int64_t forward_flops(int64_t b, int64_t hq, int64_t tq, int64_t tk, int64_t d, int64_t dv,
                             bool causal, int64_t window) {
    /* A window no shorter than the queries hides nothing the causal mask
     * does not: the causal convention (half) holds. */
    if (causal && window > 0 && window < tq)
        return fl_flops_mul(fl_flops_mul(2 * b, hq), fl_flops_mul(window_pairs(tq, tk, window), d + dv));
    int64_t f = fl_flops_mul(fl_flops_mul(fl_flops_mul(2 * b, hq), fl_flops_mul(tq, tk)), d + dv);
    return causal ? f / 2 : f;
}

/* Twice the (query, key) pairs a document of n tokens counts: causal
 * attention's convention (n * n / 2, as forward_flops), or the exact pairs
 * of a window shorter than the document (as forward_flops). */
static int64_t document_pairs2(int64_t n, int64_t window) {
    return window > 0 && window < n ? 2 * window_pairs(n, n, window) : n * n;
}

/* The packed sequences' segment ids: integer [B, T] on q's device, with
 * causal attention of Tq == Tk queries and keys. */
static int check_segments(const fl_tensor *seg, const fl_tensor *q, const fl_tensor *k,
                          bool causal) {
    if (fl_check_tensor(OP, seg, false) || fl_fused_check_device(OP, "segments", seg, q->device))
        return fl_last_status();
    char a[128], b[128];
    fl_shape_str(seg, a, sizeof a);
    fl_shape_str(q, b, sizeof b);
    if (seg->dtype != FL_I64 && seg->dtype != FL_I32)
        return fl_fail(FL_ERR_ARG, "%s: segments must be i64 (or i32) document ids, got %s", OP,
                       fl_dtype_name(seg->dtype));
    if (!causal)
        return fl_fail(FL_ERR_ARG, "%s: segments (packed sequences) need causal attention", OP);
    if (k->shape[2] != q->shape[2])
        return fl_fail(FL_ERR_ARG, "%s: segments need as many keys as queries (self-attention), "
                                   "got %lld queries and %lld keys",
                       OP, (long long)q->shape[2], (long long)k->shape[2]);
    if (seg->ndim != 2 || seg->shape[0] != q->shape[0] || seg->shape[1] != q->shape[2])
        return fl_fail(FL_ERR_ARG, "%s: segments of shape %s must be [batch, seq] = [%lld, %lld] "
                                   "for q %s",
                       OP, a, (long long)q->shape[0], (long long)q->shape[2], b);
    return FL_OK;
}

/* The starts of a packed call ([Note: packed sequences]) on q's device, and
 * in *pairs2 twice the (query, key) pairs its documents count. */
static fl_tensor *segment_starts(const fl_tensor *seg, fl_device device, int64_t window,
                                 int64_t *pairs2) {
    int64_t B = seg->shape[0], T = seg->shape[1], n = seg->numel;
    int64_t *ids = malloc((size_t)(n ? 2 * n : 1) * sizeof *ids);
    if (!ids)
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of CPU memory for %lld segment ids", OP,
                            (long long)n);
    int64_t *st = ids + n;
    fl_tensor *out = NULL;
    if (fl_to_host(seg, ids, FL_I64, n) == FL_OK) {
        *pairs2 = 0;
        for (int64_t b = 0; b < B; b++) {
            const int64_t *id = ids + b * T;
            int64_t *s = st + b * T;
            for (int64_t i = 0; i < T; i++) {
                s[i] = id[i] < 0 ? i + 1 : i > 0 && id[i] == id[i - 1] ? s[i - 1] : i;
                /* a document ends at i: count it */
                if (id[i] >= 0 && (i == T - 1 || id[i + 1] != id[i]))
                    *pairs2 += document_pairs2(i - s[i] + 1, window);
            }
        }
        int64_t shape[2] = {B, T};
        out = fl_from_host(2, shape, FL_I64, device, st, FL_I64, n);
    }
    free(ids);
    return out;
}

static int check_qkv(const fl_tensor *q, const fl_tensor *k, const fl_tensor *v) {
    if (fl_fused_check_float(OP, "q", q) || fl_fused_check_float(OP, "k", k) ||
        fl_fused_check_float(OP, "v", v) || fl_fused_check_device(OP, "k", k, q->device) ||
        fl_fused_check_device(OP, "v", v, q->device))
        return fl_last_status();
    char a[128], b[128], c[128];
    fl_shape_str(q, a, sizeof a);
    fl_shape_str(k, b, sizeof b);
    fl_shape_str(v, c, sizeof c);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return fl_fail(FL_ERR_ARG, "%s: q %s, k %s and v %s must be 4-d [batch, heads, seq, dim]",
                       OP, a, b, c);
    if (q->dtype != k->dtype || q->dtype != v->dtype)
        return fl_fail(FL_ERR_ARG, "%s: q, k and v must have one dtype, got %s, %s and %s", OP,
                       fl_dtype_name(q->dtype), fl_dtype_name(k->dtype), fl_dtype_name(v->dtype));
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != v->shape[1] ||
        k->shape[2] != v->shape[2] || k->shape[3] != q->shape[3])
        return fl_fail(FL_ERR_ARG, "%s: shapes q %s, k %s, v %s do not fit q [B, Hq, Tq, D], "
                                   "k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]",
                       OP, a, b, c);
    if (k->shape[1] == 0 || q->shape[1] % k->shape[1])
        return fl_fail(FL_ERR_ARG, "%s: %lld query heads (q %s) are not a multiple of %lld kv "
                                   "heads (k %s)",
                       OP, (long long)q->shape[1], a, (long long)k->shape[1], b);
    return FL_OK;
}

static int check_bias(const fl_tensor *bias, const int64_t *target) {
    if (fl_fused_check_float(OP, "bias", bias)) return fl_last_status();
    bool ok = bias->ndim <= 4;
    for (int d = 0; ok && d < bias->ndim; d++) {
        int64_t s = bias->shape[d], t = target[4 - bias->ndim + d];
        ok = s == t || s == 1;
    }
    if (!ok) {
        char a[128], b[128];
        fl_shape_format(4, target, b, sizeof b);
        return fl_fail(FL_ERR_ARG, "%s: bias of shape %s does not broadcast to the scores %s", OP,
                       fl_shape_str(bias, a, sizeof a), b);
    }
    return FL_OK;
}

/* bias's shape seen as 4-d: leading 1s. */
static void bias_shape4(const fl_tensor *bias, int64_t *shape4) {
    for (int d = 0; d < 4; d++) {
        int bd = d - (4 - bias->ndim);
        shape4[d] = bd >= 0 ? bias->shape[bd] : 1;
    }
}

/* A [B, Hq, Tq, Tk] header over bias's storage with stride 0 where it
 * broadcasts (a struct on the caller's stack: kernels only read it). */
static void bias_view(const fl_tensor *bias, const int64_t *target, fl_tensor *view) {
    *view = *bias;
    for (int d = 0; d < 4; d++) {
        int bd = d - (4 - bias->ndim);
        view->shape[d] = target[d];
        view->stride[d] = bd >= 0 && bias->shape[bd] == target[d] ? bias->stride[bd] : 0;
    }
    view->ndim = 4;
    view->numel = target[0] * target[1] * target[2] * target[3];
}

/* The kernel's copies of the inputs: compute dtype, contiguous last dim. */
typedef struct prepared {
    fl_tensor *q, *k, *v, *bias;
    fl_tensor bias4;
} prepared;

static int prepare(prepared *p, const fl_tensor *q, const fl_tensor *k, const fl_tensor *v,
                   const fl_tensor *bias, const int64_t *scores) {
    fl_dtype r = fl_fused_compute_dtype(q->dtype);
    p->q = fl_fused_prepare(q, r);
    p->k = p->q ? fl_fused_prepare(k, r) : NULL;
    p->v = p->k ? fl_fused_prepare(v, r) : NULL;
    p->bias = NULL;
    if (p->v && bias) {
        bool was = fl_set_grad_enabled(false);
        p->bias = fl_to(bias, r, bias->device);
        fl_set_grad_enabled(was);
        if (p->bias) bias_view(p->bias, scores, &p->bias4);
    }
    return p->v && (!bias || p->bias) ? FL_OK : (int)fl_last_status();
}

static void release_prepared(prepared *p) {
    fl_tensor_release(p->q);
    fl_tensor_release(p->k);
    fl_tensor_release(p->v);
    fl_tensor_release(p->bias);
}

/* Whether to offer the device's library path (fused.h: attention_native)
 * the inputs as they are: 16-bit q, k, v and a bias of the same dtype. */
static bool native_wanted(int (*entry)(const fl_attention_args *, bool *), const fl_tensor *q,
                          const fl_tensor *bias) {
    return entry && q->dtype != fl_fused_compute_dtype(q->dtype) &&
           (!bias || bias->dtype == q->dtype);
}

static int check_options(const fl_attention_options *o) {
    if (!o) return fl_fail(FL_ERR_ARG, "%s: options must be given (causal, scale, window, softcap)", OP);
    if (!isfinite(o->scale)) return fl_fail(FL_ERR_ARG, "%s: scale must be finite, got %g", OP, o->scale);
    if (o->window < 0)
        return fl_fail(FL_ERR_ARG, "%s: window must be 0 (none) or positive, got %lld", OP,
                       (long long)o->window);
    if (o->window > 0 && !o->causal)
        return fl_fail(FL_ERR_ARG, "%s: window %lld needs causal attention (the window is a band "
                                   "below the causal diagonal; with a kv cache put it in the mask)",
                       OP, (long long)o->window);
    if (!(isfinite(o->softcap) && o->softcap >= 0))
        return fl_fail(FL_ERR_ARG, "%s: softcap must be 0 (none) or positive and finite, got %g",
                       OP, o->softcap);
    return FL_OK;
}

fl_tensor *fl_scaled_dot_product_attention(const fl_tensor *q, const fl_tensor *k,
                                           const fl_tensor *v, const fl_tensor *bias, bool causal,
                                           double scale) {
    fl_attention_options o = {.causal = causal, .scale = scale, .window = 0, .softcap = 0,
                              .segments = NULL};
    return fl_attention(q, k, v, bias, &o);
}

fl_tensor *fl_attention(const fl_tensor *q, const fl_tensor *k, const fl_tensor *v,
                        const fl_tensor *bias, const fl_attention_options *opts) {
    if (check_qkv(q, k, v) || check_options(opts)) return NULL;
    bool causal = opts->causal;
    double scale = opts->scale, softcap = opts->softcap;
    int64_t window = opts->window;
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    int64_t Tk = k->shape[2], Dv = v->shape[3];
    int64_t scores[4] = {B, Hq, Tq, Tk};
    if (bias && (check_bias(bias, scores) || fl_fused_check_device(OP, "bias", bias, q->device)))
        return NULL;
    const fl_tensor *seg = opts->segments;
    if (seg && check_segments(seg, q, k, causal)) return NULL;
    const fl_tensor *ins[4] = {q, k, v, bias};
    bool no_storage = fl_fused_no_storage(4, ins) || (seg && !fl_tensor_has_storage(seg));
    int64_t flops = forward_flops(B, Hq, Tq, Tk, D, Dv, causal, window), pairs2 = 0;
    fl_tensor *starts = NULL;
    if (seg && !no_storage) {
        if (!(starts = segment_starts(seg, q->device, window, &pairs2))) return NULL;
        flops = fl_flops_mul(fl_flops_mul(Hq, pairs2), D + Dv);
    }
    fl_dtype r = fl_fused_compute_dtype(q->dtype);
    int64_t out_shape[4] = {B, Hq, Tq, Dv};
    fl_tensor *out = fl_fused_output(4, out_shape, q->dtype, q->device, no_storage);
    fl_tensor *lse = out ? fl_fused_output(3, scores, r, q->device, no_storage) : NULL;
    if (!lse) {
        fl_tensor_release(out);
        fl_tensor_release(starts);
        return NULL;
    }
    fl_flops_add(flops);
    if (!no_storage) {
        const fl_fused_kernels *kern = fl_fused_kernels_of(OP, q->device);
        prepared p = {0};
        fl_tensor *out_c = NULL;
        bool done = false;
        int rc = kern ? FL_OK : (int)fl_last_status();
        if (!rc && native_wanted(kern->attention_native, q, bias)) {
            fl_tensor b4;
            if (bias) bias_view(bias, scores, &b4);
            fl_attention_args a = {.q = q, .k = k, .v = v, .bias = bias ? &b4 : NULL,
                                   .causal = causal, .scale = scale, .window = window,
                                   .softcap = softcap, .starts = starts, .out = out, .lse = lse};
            rc = kern->attention_native(&a, &done);
        }
        if (!rc && !done) rc = prepare(&p, q, k, v, bias, scores);
        if (!rc && !done) {
            out_c = q->dtype == r ? fl_tensor_retain(out) : fl_empty(4, out_shape, r, q->device);
            rc = out_c ? FL_OK : (int)fl_last_status();
        }
        if (!rc && !done) {
            fl_attention_args a = {.q = p.q, .k = p.k, .v = p.v, .bias = bias ? &p.bias4 : NULL,
                                   .causal = causal, .scale = scale, .window = window,
                                   .softcap = softcap, .starts = starts, .out = out_c,
                                   .lse = lse};
            rc = kern->attention(&a);
        }
        if (!rc && !done && out_c != out) rc = fl_copy_(out, out_c);
        fl_tensor_release(out_c);
        release_prepared(&p);
        if (rc) {
            fl_tensor_release(out);
            fl_tensor_release(lse);
            fl_tensor_release(starts);
            return NULL;
        }
    }
    if (fl_needs_grad(4, ins)) {
        fl_node *node;
        const fl_tensor *saved[7] = {q, k, v, bias, out, lse, starts};
        out = fl_fused_record(&attention_type, 4, ins, out, 7, saved, &node);
        if (out) {
            node->f[0] = scale;
            node->f[1] = softcap;
            node->i[0] = causal;
            node->i[1] = window;
            node->i[2] = flops; /* the forward's, exact for packed calls */
        }
    }
    fl_tensor_release(lse);
    fl_tensor_release(starts);
    return out;
}

/* dq, dk and dv through the library path (fused.h: attention_native_backward)
 * in q's own dtype; *done tells whether it ran. The library computes all
 * three, so a gradient the node does not want lands in scratch. */
static int backward_native(const fl_fused_kernels *kern, fl_node *node, const fl_tensor *g,
                           const int64_t *scores, fl_tensor **grads, bool *done) {
    const fl_tensor *q = node->saved[0], *bias = node->saved[3], *o = node->saved[4];
    fl_tensor *d[3] = {NULL, NULL, NULL}, *oc = NULL, *gc = NULL, b4;
    int rc = FL_OK;
    for (int i = 0; i < 3 && !rc; i++)
        if (!(d[i] = fl_empty(4, node->saved[i]->shape, q->dtype, q->device))) rc = fl_last_status();
    if (!rc) {
        oc = fl_fused_prepare(o, q->dtype);
        gc = oc ? fl_fused_prepare(g, q->dtype) : NULL;
        rc = gc ? FL_OK : (int)fl_last_status();
    }
    if (!rc) {
        if (bias) bias_view(bias, scores, &b4);
        fl_attention_args a = {.q = q, .k = node->saved[1], .v = node->saved[2],
                               .bias = bias ? &b4 : NULL, .causal = node->i[0] != 0,
                               .scale = node->f[0], .window = node->i[1], .softcap = node->f[1],
                               .starts = node->saved[6], .lse = (fl_tensor *)node->saved[5],
                               .dout = gc, .o = oc, .dq = d[0], .dk = d[1], .dv = d[2]};
        rc = kern->attention_native_backward(&a, done);
    }
    for (int i = 0; i < 3; i++) {
        if (!rc && *done && fl_node_wants(node, i)) grads[i] = d[i];
        else fl_tensor_release(d[i]);
    }
    fl_tensor_release(oc);
    fl_tensor_release(gc);
    return rc;
}

static int attention_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *q = node->saved[0], *k = node->saved[1], *v = node->saved[2];
    const fl_tensor *bias = node->saved[3], *o = node->saved[4], *lse = node->saved[5];
    const fl_tensor *g = go[0];
    double scale = node->f[0], softcap = node->f[1];
    bool causal = node->i[0] != 0;
    int64_t window = node->i[1];
    const fl_tensor *starts = node->saved[6];
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2];
    int64_t Tk = k->shape[2];
    int64_t scores[4] = {B, Hq, Tq, Tk};
    const fl_tensor *all[7] = {q, k, v, bias, o, lse, g};
    bool no_storage = fl_fused_no_storage(7, all);
    fl_dtype r = fl_fused_compute_dtype(q->dtype);
    fl_flops_add(fl_flops_mul(node->i[2] / 2, 5));

    bool want_bias = bias && fl_node_wants(node, 3);
    int64_t b4[4] = {1, 1, 1, 1};
    if (bias) bias_shape4(bias, b4);
    const fl_tensor *src[4] = {q, k, v, bias};
    fl_tensor *grads[4] = {NULL, NULL, NULL, NULL};
    const fl_fused_kernels *kern = NULL;
    if (!no_storage &&
        !(kern = fl_fused_kernels_of("scaled_dot_product_attention backward", q->device)))
        return fl_last_status();
    bool done = false;
    int rc = FL_OK;
    if (kern && !want_bias && native_wanted(kern->attention_native_backward, q, bias))
        rc = backward_native(kern, node, g, scores, grads, &done);
    /* Otherwise gradients in the compute dtype; dk, dv and dbias accumulate. */
    for (int i = 0; i < 4 && !rc && !done; i++) {
        if (!fl_node_wants(node, i) || (i == 3 && !want_bias)) continue;
        const int64_t *shape = i == 3 ? b4 : src[i]->shape;
        grads[i] = no_storage ? fl_fake(4, shape, r, q->device)
                 : i == 0     ? fl_empty(4, shape, r, q->device)
                              : fl_zeros(4, shape, r, q->device);
        if (!grads[i]) rc = fl_last_status();
    }
    if (!rc && !done && !no_storage) {
        prepared p = {0};
        fl_tensor *oc = NULL, *gc = NULL;
        rc = prepare(&p, q, k, v, bias, scores);
        if (!rc) {
            oc = fl_fused_prepare(o, r);
            gc = oc ? fl_fused_prepare(g, r) : NULL;
            rc = gc ? FL_OK : (int)fl_last_status();
        }
        if (!rc) {
            fl_attention_args a = {.q = p.q, .k = p.k, .v = p.v, .bias = bias ? &p.bias4 : NULL,
                                   .causal = causal, .scale = scale, .window = window,
                                   .softcap = softcap, .starts = starts, .lse = (fl_tensor *)lse,
                                   .dout = gc, .o = oc, .dq = grads[0], .dk = grads[1],
                                   .dv = grads[2], .dbias = grads[3]};
            rc = kern->attention_backward(&a);
        }
        fl_tensor_release(oc);
        fl_tensor_release(gc);
        release_prepared(&p);
    }
    /* To each input's shape (dbias: from 4-d back to bias's own dims) and
     * dtype. */
    for (int i = 0; i < 4 && !rc; i++) {
        if (!grads[i]) continue;
        if (i == 3 && bias->ndim != 4) {
            fl_tensor *shaped = fl_view(grads[3], bias->ndim, bias->shape);
            fl_tensor_release(grads[3]);
            grads[3] = shaped;
        }
        grads[i] = grads[i] ? fl_fused_as_dtype(grads[i], src[i]->dtype) : NULL;
        if (!grads[i]) rc = fl_last_status();
    }
    for (int i = 0; i < 4; i++) {
        if (rc) fl_tensor_release(grads[i]);
        else gi[i] = grads[i];
    }
    return rc;
}

static const fl_node_type attention_type = {.name = "ScaledDotProductAttentionBackward",
                                            .backward = attention_backward};
