/*
 * cuda_sdpa.cu: scaled dot-product attention forward and backward through
 * cuDNN's fused flash attention, built on cuDNN's graph (backend) API
 * directly (cudnnBackendCreateDescriptor / SetAttribute / Finalize /
 * Execute); the flash-style kernels (cuda_attention*.cu) run whatever this
 * declines.
 *
 * cuDNN has no "attention" call: its fused attention engines recognise an
 * operation graph of matmuls, pointwise ops and reductions. So the graphs
 * below are the ones NVIDIA's cudnn-frontend builds for its composite `sdpa`
 * (training: O and the softmax stats) and `sdpa_backward` nodes on cuDNN
 * 9.x before 9.21 (where the causal mask and the softmax are still spelled
 * out as pointwise ops), node for node; [Note: the graphs] lists them.
 * Semantics are the op's (core/ops/attention.c): S = scale * Q K^T + bias,
 * key j masked for query i when causal and j > i (top-left aligned),
 * O = softmax(S) V, stats = max + log(sum exp) per row (natural log), which
 * is exactly our lse, so a forward through cuDNN and a backward through the
 * kernels (or the reverse) agree. Grouped-query attention is K and V with
 * fewer heads, as the frontend passes it.
 *
 * Eligibility: bf16/f16 q, k, v (a bias of the same dtype), head dims that
 * are multiples of 8, the last dim dense, 16-byte aligned pointers and row
 * strides, the bias not broadcast along keys, no dbias (the frontend routes
 * dbias to another engine variant; T5's trained bias keeps the kernels), no
 * empty dims, no sliding window and no softcap (the graphs spell out
 * neither), and the frontend's version rules for the cuDNN found at run
 * time (9.0 or later; not 9.10.0/9.10.1 forward; backward before 9.16 only
 * with Tk a multiple of 128; no single causal query up to 9.9; dQ's f32
 * accumulator zeroed before 9.6). Anything else, and any configuration cuDNN
 * refuses while the graph or the plan is built (no engine, an unsupported
 * head dim on this GPU), goes to the kernels. The outcome is cached per
 * configuration (shapes, strides, dtype, causal, bias layout, device; keyed
 * separately for forward and backward), so a graph is built once and a
 * refusal is not retried.
 * FSDP_CUDNN_SDPA=0 turns this path off; FSDP_CUDNN_DEBUG=1 prints one
 * line on stderr per refused configuration saying why.
 *
 * One cuDNN handle per device, made on first use (separate from
 * cuda_conv.cu's: handles are cheap and this keeps the files independent);
 * workspaces are tensors from the caching pool.
 */
#include "cuda_sdpa.cuh"

#include <cudnn.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* [Note: the graphs]
 * Tensors are 4-d, io = the inputs' dtype (bf16/f16), f32 = FLOAT; [B, H,
 * Tq, Tk] virtual tensors are packed, row tensors [B, Hq, Tq, 1] packed.
 *
 * Forward (non-virtual: Q, K^T, V, O, Stats, scale and -inf by value, Bias):
 *   S = matmul(Q, K^T)            K^T = K's memory as [B, Hkv, D, Tk]
 *   S = S * scale                 pointwise MUL, scale a by-value f32
 *   S = S + Bias                  pointwise ADD (bias given)
 *   causal (bias-free or not):    row = GEN_INDEX(S, axis 2), col = GEN_INDEX
 *                                 (S, axis 3) (int32), keep = CMP_GE(row, col)
 *                                 (bool), S = BINARY_SELECT(S, -inf, keep)
 *   M = reduce MAX(S), E = EXP(S - M), L = reduce ADD(E),
 *   Stats = M + LOG(L)            f32 [B, Hq, Tq, 1]
 *   P = E / L                     io dtype (the second matmul's A)
 *   O = matmul(P, V)
 * Backward (non-virtual: Q, K^T, V^T, O, dO, Stats, scale, -inf, one by
 * value, Bias, dQ, dK, dV, and two f32 buffers in our workspace: softmax_sum
 * [B, Hq, Tq, 1] and dQ_accum [B, Hq, Tq, D]):
 *   softmax_sum = reduce ADD(dO * O) * 1
 *   S = matmul(Q, K^T) * scale (+ Bias) - Stats, causal mask as above,
 *   E = EXP(S)                    the probabilities P
 *   P^T = RESHAPE(E)              [B, Hq, Tk, Tq], strides swapped, io dtype
 *   dV = matmul(P^T, dO)          GQA: into [B, Hq, Tk, Dv], then reduce ADD
 *                                 over each group of query heads into dV
 *   dP = matmul(dO, V^T)          V^T = V's memory as [B, Hkv, Dv, Tk]
 *   dS = (dP - softmax_sum) * E * scale
 *   dS^T = RESHAPE(dS), dK = matmul(dS^T, Q)   (GQA as dV)
 *   K = RESHAPE(K^T), dQ_accum = matmul(dS, K), dQ = IDENTITY(dQ_accum)
 * Pointwise math is f32 (the masks' compare in bool), matmuls and
 * reductions compute in f32. */

namespace {

enum { MAX_DEVICES = 64, MAX_DESCS = 160, MAX_OPS = 48, MAX_CACHE = 4096 };

/* Non-virtual tensor ids (the variant pack's keys). */
enum : int64_t {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_BIAS, UID_NEG_INF,
    UID_DO, UID_DQ, UID_DK, UID_DV, UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_ONE,
    UID_FIRST_VIRTUAL = 100,
};

/* ---- counts of the paths taken (fsdp.h: fl_attention_paths) -------- */

int64_t path_counts[4];

/* ---- handles ----------------------------------------------------------- */

pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER; /* handles and the plan cache */
cudnnHandle_t handles[MAX_DEVICES];

bool env_is(const char *name, const char *value) {
    const char *e = getenv(name);
    return e && strcmp(e, value) == 0;
}

/* ---- the configuration a plan is built for ------------------------------ */

struct sdpa_key {
    int32_t device, backward, causal, has_bias;
    int32_t dtype, pad_;
    int64_t B, Hq, Hkv, Tq, Tk, D, Dv;
    /* strides of q, k, v, out (forward) or o (backward), dout, dq, dk, dv */
    int64_t q[4], k[4], v[4], o[4], dout[4], dq[4], dk[4], dv[4];
    int64_t bias_dim[4], bias_stride[4];
};

struct sdpa_plan {
    sdpa_key key;
    bool ok;                          /* false: cuDNN refused, use the kernels */
    cudnnBackendDescriptor_t plan;    /* the execution plan */
    cudnnBackendDescriptor_t *descs;  /* everything the plan was built from */
    int n_descs;
    int64_t workspace;                /* the plan's, in bytes */
};

/* Entries are allocated one by one and never freed or moved: callers use
 * them after the lock is released. */
sdpa_plan *cache[MAX_CACHE];
int n_cache;
/* What every configuration beyond MAX_CACHE gets, and one refused for lack
 * of memory this time (not cached): the kernels. */
sdpa_plan cache_full;

void copy_strides(int64_t *dst, const fl_tensor *t) {
    for (int d = 0; d < 4; d++) dst[d] = t ? t->stride[d] : 0;
}

/* The key of a call; bias dims are 1 where the op's view broadcasts
 * (stride 0), with packed strides there so the descriptor is well formed. */
void key_of(const fl_attention_args *a, bool backward, sdpa_key *k) {
    memset(k, 0, sizeof *k); /* padding too: keys are compared with memcmp */
    k->device = fl_device_index(a->q->device);
    k->backward = backward;
    k->causal = a->causal;
    k->dtype = a->q->dtype;
    k->B = a->q->shape[0];
    k->Hq = a->q->shape[1];
    k->Tq = a->q->shape[2];
    k->D = a->q->shape[3];
    k->Hkv = a->k->shape[1];
    k->Tk = a->k->shape[2];
    k->Dv = a->v->shape[3];
    copy_strides(k->q, a->q);
    copy_strides(k->k, a->k);
    copy_strides(k->v, a->v);
    copy_strides(k->o, backward ? a->o : a->out);
    if (backward) {
        copy_strides(k->dout, a->dout);
        copy_strides(k->dq, a->dq);
        copy_strides(k->dk, a->dk);
        copy_strides(k->dv, a->dv);
    }
    if (a->bias) {
        k->has_bias = 1;
        int64_t inner = 1;
        for (int d = 3; d >= 0; d--) {
            bool broadcast = a->bias->stride[d] == 0 || a->bias->shape[d] == 1;
            k->bias_dim[d] = broadcast ? 1 : a->bias->shape[d];
            k->bias_stride[d] = broadcast ? inner : a->bias->stride[d];
            inner = k->bias_dim[d] * (broadcast ? inner : a->bias->stride[d]);
        }
    }
}

/* A one-line description of the configuration for messages. */
void describe(const sdpa_key *k, char *buf, size_t n) {
    snprintf(buf, n, "%s %s B=%lld Hq=%lld Hkv=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld%s%s",
             k->backward ? "backward" : "forward", fl_dtype_name((fl_dtype)k->dtype),
             (long long)k->B, (long long)k->Hq, (long long)k->Hkv, (long long)k->Tq,
             (long long)k->Tk, (long long)k->D, (long long)k->Dv, k->causal ? " causal" : "",
             k->has_bias ? " bias" : "");
}

void debug_line(const sdpa_key *k, const char *why) {
    if (!env_is("FSDP_CUDNN_DEBUG", "1")) return;
    char cfg[256];
    describe(k, cfg, sizeof cfg);
    fprintf(stderr, "fsdp-lua: scaled_dot_product_attention on cuda:%d: cuDNN declines %s: %s; "
                    "the flash-style kernels run it\n",
            k->device, cfg, why);
}

/* ---- what the fused engines can take, before asking cuDNN ---------------- */

/* Row strides (every dim but the last) in whole 16-byte units. */
bool strides16(const fl_tensor *t) {
    size_t es = fl_dtype_size(t->dtype);
    for (int d = 0; d < 3; d++)
        if (t->shape[d] > 1 && (t->stride[d] * (int64_t)es) % 16) return false;
    return true;
}

bool dense_last(const fl_tensor *t) { return t->stride[3] == 1 || t->shape[3] == 1; }

/* NULL when the configuration fits the fused engines' layout rules, else
 * why not (the same for every call with this key, so it is cached). */
const char *layout_refusal(const fl_attention_args *a, bool backward, const sdpa_key *k) {
    fl_dtype dt = a->q->dtype;
    if (dt != FL_BF16 && dt != FL_F16) return "only bf16 and f16 inputs";
    if (k->B == 0 || k->Hq == 0 || k->Tq == 0 || k->Tk == 0 || k->D == 0 || k->Dv == 0)
        return "an empty dimension";
    if (k->D % 8 || k->Dv % 8) return "head dims must be multiples of 8";
    const fl_tensor *io[9] = {a->q, a->k, a->v, backward ? a->o : a->out, a->dout,
                              a->dq, a->dk, a->dv, NULL};
    for (int i = 0; i < 8; i++) {
        if (!io[i]) continue;
        if (io[i]->dtype != dt) return "q, k, v and outputs in different dtypes";
        if (!dense_last(io[i])) return "a tensor whose last dim is strided";
        for (int d = 0; d < 3; d++)
            if (io[i]->shape[d] > 1 && io[i]->stride[d] == 0)
                return "a broadcast (stride 0) dimension in q, k, v, an output or a gradient";
        if (!strides16(io[i])) return "a row stride that is not a multiple of 16 bytes";
    }
    if (a->bias) {
        if (a->bias->dtype != dt) return "a bias in another dtype than q";
        if (k->bias_dim[3] != k->Tk || a->bias->stride[3] != 1)
            return "a bias broadcast along keys or strided along them";
        for (int d = 0; d < 3; d++)
            if (k->bias_dim[d] > 1 && (k->bias_stride[d] * 2) % 16)
                return "a bias row stride not a multiple of 16 bytes";
        /* Seen on an H100 with cuDNN 9.19: a [B, 1, 1, Tk] bias with 4
         * query heads per kv head gave a wrong dq (normalised error 1)
         * while its forward and per-head biases ([1, H, Tq, Tk]) were
         * right. Until a GPU session tells which broadcast is at fault,
         * every backward with a bias broadcast along heads or queries goes
         * to the kernels: slower there, never wrong. */
        if (backward && ((k->bias_dim[1] == 1 && k->Hq > 1) || (k->bias_dim[2] == 1 && k->Tq > 1)))
            return "a bias broadcast along heads or queries in the backward (cuDNN 9.19 gave a "
                   "wrong dq for one on an H100)";
    }
    /* Version rules from cudnn-frontend's support checks, for the library
     * found at run time (the GPU machine's may be older than our headers). */
    size_t version = cudnnGetVersion();
    if (version < 90000) return "cuDNN before 9.0 (the graphs are cuDNN 9's)";
    if (!backward && (version == 91000 || version == 91001))
        return "cuDNN 9.10.0/9.10.1 (known bugs in the bf16/f16 forward)";
    if (backward && version < 91600 && k->Tk % 128)
        return "cuDNN before 9.16 with Tk not a multiple of 128 (its backward then needs a "
               "padding mask)";
    if (version <= 90900 && k->Tq == 1 && k->causal)
        return "cuDNN 9.9 or older with one query and a causal mask";
    return NULL;
}

/* What depends on this call and is not in the key (so never cached): the
 * plans read and write lse as a dense f32 [B, Hq, Tq], and compute no
 * dbias. */
const char *call_refusal(const fl_attention_args *a, bool backward, const sdpa_key *k) {
    const fl_tensor *lse = a->lse;
    if (lse->dtype != FL_F32 || lse->stride[0] != k->Hq * k->Tq || lse->stride[1] != k->Tq ||
        lse->stride[2] != 1)
        return "lse not a dense f32 [B, Hq, Tq]";
    if (backward && a->dbias) return "dbias is computed by the kernels";
    /* ([Note: attention window and softcap], core/ops/attention.c) cuDNN
     * could express both as pointwise nodes, but no GPU session has yet
     * checked such a graph against the kernels: until one does, they take
     * the kernels, which compute them exactly. */
    if (a->window > 0) return "a sliding window (computed by the flash-style kernels)";
    if (a->softcap > 0) return "a logit softcap (computed by the flash-style kernels)";
    /* ([Note: packed sequences], core/ops/attention.c) cuDNN's ragged
     * offsets and padding masks were never checked against the kernels on a
     * GPU here: packed calls take the kernels. */
    if (a->starts) return "packed sequences (computed by the flash-style kernels)";
    return NULL;
}

/* The engines read and write with 16-byte vector accesses: every pointer
 * must be aligned. That depends on the call (a view's offset), not on the
 * configuration, so it is checked every time and never cached. */
bool pointers_aligned(const fl_attention_args *a) {
    const fl_tensor *all[11] = {a->q, a->k, a->v, a->bias, a->out, a->lse,
                                a->o, a->dout, a->dq, a->dk, a->dv};
    for (int i = 0; i < 11; i++)
        if (all[i] && (uintptr_t)all[i]->data % 16) return false;
    return true;
}

/* ---- building a graph ----------------------------------------------------- */

/* Descriptors made so far and the first failure; after one, every helper
 * does nothing, so the graph code reads as a straight list. */
struct builder {
    cudnnBackendDescriptor_t descs[MAX_DESCS];
    int n;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int n_ops;
    int64_t next_uid;
    cudnnStatus_t st;
    char why[512];
    cudnnDataType_t io;
    bool transient; /* refused for lack of memory: ask again next time */
};

bool failed(const builder *b) { return b->why[0] != 0; }

void fail(builder *b, const char *what, cudnnStatus_t st) {
    if (failed(b)) return;
    b->st = st;
    if (st == CUDNN_STATUS_ALLOC_FAILED) b->transient = true;
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail); /* cuDNN's own words, if any */
    snprintf(b->why, sizeof b->why, "%s: %s (cuDNN status %d)%s%s", what,
             cudnnGetErrorString(st), (int)st, detail[0] ? ": " : "", detail);
}

cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t type, const char *what) {
    if (failed(b)) return NULL;
    if (b->n == MAX_DESCS) {
        snprintf(b->why, sizeof b->why, "more than %d descriptors", (int)MAX_DESCS);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(b, what, st);
        return NULL;
    }
    b->descs[b->n++] = d;
    return d;
}

void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
         cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what) {
    if (failed(b)) return;
    cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) fail(b, what, st);
}

void finalize(builder *b, cudnnBackendDescriptor_t d, const char *what) {
    if (failed(b)) return;
    cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) fail(b, what, st);
}

typedef cudnnBackendDescriptor_t tdesc;

/* A 4-d tensor descriptor; a virtual one gets the next free id. */
tdesc tensor(builder *b, int64_t uid, cudnnDataType_t dt, const int64_t *dim,
             const int64_t *stride, bool is_virtual, bool by_value, const char *name) {
    tdesc t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    if (is_virtual) uid = b->next_uid++;
    const int64_t align = 16;
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, name);
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, name);
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, name);
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, name);
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, name);
    set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, name);
    if (by_value) set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, name);
    finalize(b, t, name);
    return t;
}

void packed(const int64_t *dim, int64_t *stride) {
    stride[3] = 1;
    for (int d = 2; d >= 0; d--) stride[d] = stride[d + 1] * dim[d + 1];
}

/* A virtual intermediate, packed. */
tdesc virt(builder *b, cudnnDataType_t dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
           const char *name) {
    int64_t dim[4] = {d0, d1, d2, d3}, stride[4];
    packed(dim, stride);
    return tensor(b, 0, dt, dim, stride, true, false, name);
}

/* A by-value f32 scalar [1, 1, 1, 1]. */
tdesc scalar(builder *b, int64_t uid, const char *name) {
    const int64_t one[4] = {1, 1, 1, 1};
    return tensor(b, uid, CUDNN_DATA_FLOAT, one, one, false, true, name);
}

void add_op(builder *b, cudnnBackendDescriptor_t op) {
    if (failed(b)) return;
    if (b->n_ops == MAX_OPS) {
        snprintf(b->why, sizeof b->why, "more than %d operations", (int)MAX_OPS);
        return;
    }
    b->ops[b->n_ops++] = op;
}

/* y = mode(x[, x2[, t]]); axis >= 0 for GEN_INDEX. */
void pointwise(builder *b, cudnnPointwiseMode_t mode, cudnnDataType_t prec, tdesc x, tdesc x2,
               tdesc t, tdesc y, int64_t axis, const char *name) {
    cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name);
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, name);
    if (axis >= 0) set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, name);
    finalize(b, pw, name);
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw,
        name);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    if (x2) set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x2, name);
    if (t) set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, name);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    finalize(b, op, name);
    add_op(b, op);
}

/* The common f32 pointwise ops, returning a new virtual f32 output shaped
 * like `shape` (a [B, H, Tq, Tk] or row tensor, given as dims). */
tdesc pw_f32(builder *b, cudnnPointwiseMode_t mode, tdesc x, tdesc x2, const int64_t *dim,
             const char *name) {
    tdesc y = virt(b, CUDNN_DATA_FLOAT, dim[0], dim[1], dim[2], dim[3], name);
    pointwise(b, mode, CUDNN_DATA_FLOAT, x, x2, NULL, y, -1, name);
    return y;
}

void matmul(builder *b, tdesc a, tdesc bm, tdesc c, const char *name) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, name);
    finalize(b, mm, name);
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, name);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm, name);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, name);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, name);
    finalize(b, op, name);
    add_op(b, op);
}

void reduction(builder *b, cudnnReduceTensorOp_t mode, tdesc x, tdesc y, const char *name) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, name);
    set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, name);
    finalize(b, rd, name);
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, name);
    finalize(b, op, name);
    add_op(b, op);
}

/* y views x's elements under another shape and strides (the frontend's
 * way to say "transposed"). */
void reshape(builder *b, tdesc x, tdesc y, const char *name) {
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    finalize(b, op, name);
    add_op(b, op);
}

/* S with key j masked (-inf) for query i when j > i. */
tdesc causal_mask(builder *b, tdesc s, tdesc neg_inf, const int64_t *sdim) {
    tdesc row = virt(b, CUDNN_DATA_INT32, sdim[0], sdim[1], sdim[2], sdim[3], "causal row index");
    pointwise(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, NULL, NULL, row, 2,
              "causal row index");
    tdesc col = virt(b, CUDNN_DATA_INT32, sdim[0], sdim[1], sdim[2], sdim[3], "causal column index");
    pointwise(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, NULL, NULL, col, 3,
              "causal column index");
    tdesc keep = virt(b, CUDNN_DATA_BOOLEAN, sdim[0], sdim[1], sdim[2], sdim[3], "causal compare");
    pointwise(b, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1,
              "causal compare");
    tdesc out = virt(b, CUDNN_DATA_FLOAT, sdim[0], sdim[1], sdim[2], sdim[3], "causal select");
    pointwise(b, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, out, -1,
              "causal select");
    return out;
}

/* K^T (or V^T): the [B, H, T, X] tensor's memory seen as [B, H, X, T]. */
tdesc transposed_input(builder *b, int64_t uid, int64_t B, int64_t H, int64_t T, int64_t X,
                       const int64_t *s, const char *name) {
    int64_t dim[4] = {B, H, X, T}, stride[4] = {s[0], s[1], s[3], s[2]};
    return tensor(b, uid, b->io, dim, stride, false, false, name);
}

tdesc io_tensor(builder *b, int64_t uid, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                const int64_t *stride, const char *name) {
    int64_t dim[4] = {d0, d1, d2, d3};
    return tensor(b, uid, b->io, dim, stride, false, false, name);
}

tdesc bias_tensor(builder *b, const sdpa_key *k) {
    return k->has_bias ? tensor(b, UID_BIAS, b->io, k->bias_dim, k->bias_stride, false, false, "bias")
                       : NULL;
}

void build_forward(builder *b, const sdpa_key *k) {
    const int64_t sdim[4] = {k->B, k->Hq, k->Tq, k->Tk}, rdim[4] = {k->B, k->Hq, k->Tq, 1};
    int64_t rstride[4];
    packed(rdim, rstride);
    tdesc q = io_tensor(b, UID_Q, k->B, k->Hq, k->Tq, k->D, k->q, "q");
    tdesc kt = transposed_input(b, UID_K, k->B, k->Hkv, k->Tk, k->D, k->k, "k");
    tdesc v = io_tensor(b, UID_V, k->B, k->Hkv, k->Tk, k->Dv, k->v, "v");
    tdesc o = io_tensor(b, UID_O, k->B, k->Hq, k->Tq, k->Dv, k->o, "out");
    tdesc stats = tensor(b, UID_STATS, CUDNN_DATA_FLOAT, rdim, rstride, false, false, "stats");
    tdesc scale = scalar(b, UID_SCALE, "scale");
    tdesc bias = bias_tensor(b, k);

    tdesc s = virt(b, CUDNN_DATA_FLOAT, k->B, k->Hq, k->Tq, k->Tk, "q k^T");
    matmul(b, q, kt, s, "q k^T");
    s = pw_f32(b, CUDNN_POINTWISE_MUL, s, scale, sdim, "scale");
    if (bias) s = pw_f32(b, CUDNN_POINTWISE_ADD, s, bias, sdim, "bias add");
    if (k->causal) s = causal_mask(b, s, scalar(b, UID_NEG_INF, "-inf"), sdim);

    tdesc m = virt(b, CUDNN_DATA_FLOAT, k->B, k->Hq, k->Tq, 1, "row max");
    reduction(b, CUDNN_REDUCE_TENSOR_MAX, s, m, "row max");
    tdesc z = pw_f32(b, CUDNN_POINTWISE_SUB, s, m, sdim, "minus max");
    tdesc e = pw_f32(b, CUDNN_POINTWISE_EXP, z, NULL, sdim, "exp");
    tdesc l = virt(b, CUDNN_DATA_FLOAT, k->B, k->Hq, k->Tq, 1, "row sum");
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, e, l, "row sum");
    tdesc logl = pw_f32(b, CUDNN_POINTWISE_LOG, l, NULL, rdim, "log sum");
    pointwise(b, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, m, logl, NULL, stats, -1, "stats");
    tdesc p = virt(b, b->io, k->B, k->Hq, k->Tq, k->Tk, "probabilities");
    pointwise(b, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, l, NULL, p, -1, "probabilities");
    matmul(b, p, v, o, "p v");
}

/* dX = matmul(a, bm) for kv-side gradients: straight into dX with as many
 * heads as q, else per query head and summed over each group. */
void kv_grad(builder *b, const sdpa_key *k, tdesc a, tdesc bm, tdesc dx, int64_t X,
             const char *name) {
    if (k->Hq == k->Hkv) {
        matmul(b, a, bm, dx, name);
        return;
    }
    tdesc full = virt(b, b->io, k->B, k->Hq, k->Tk, X, name);
    matmul(b, a, bm, full, name);
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, full, dx, name);
}

void build_backward(builder *b, const sdpa_key *k) {
    const int64_t sdim[4] = {k->B, k->Hq, k->Tq, k->Tk}, rdim[4] = {k->B, k->Hq, k->Tq, 1};
    const int64_t odim[4] = {k->B, k->Hq, k->Tq, k->Dv};
    int64_t rstride[4], accdim[4] = {k->B, k->Hq, k->Tq, k->D}, accstride[4];
    packed(rdim, rstride);
    packed(accdim, accstride);
    tdesc q = io_tensor(b, UID_Q, k->B, k->Hq, k->Tq, k->D, k->q, "q");
    tdesc kt = transposed_input(b, UID_K, k->B, k->Hkv, k->Tk, k->D, k->k, "k");
    tdesc vt = transposed_input(b, UID_V, k->B, k->Hkv, k->Tk, k->Dv, k->v, "v");
    tdesc o = io_tensor(b, UID_O, k->B, k->Hq, k->Tq, k->Dv, k->o, "o");
    tdesc dout = io_tensor(b, UID_DO, k->B, k->Hq, k->Tq, k->Dv, k->dout, "dout");
    tdesc stats = tensor(b, UID_STATS, CUDNN_DATA_FLOAT, rdim, rstride, false, false, "stats");
    tdesc dq = io_tensor(b, UID_DQ, k->B, k->Hq, k->Tq, k->D, k->dq, "dq");
    tdesc dk = io_tensor(b, UID_DK, k->B, k->Hkv, k->Tk, k->D, k->dk, "dk");
    tdesc dv = io_tensor(b, UID_DV, k->B, k->Hkv, k->Tk, k->Dv, k->dv, "dv");
    tdesc scale = scalar(b, UID_SCALE, "scale");
    tdesc bias = bias_tensor(b, k);

    /* softmax_sum = rowsum(dO * O), kept in our workspace */
    tdesc doo = pw_f32(b, CUDNN_POINTWISE_MUL, dout, o, odim, "dout * o");
    tdesc rs = virt(b, CUDNN_DATA_FLOAT, k->B, k->Hq, k->Tq, 1, "rowsum(dout * o)");
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, doo, rs, "rowsum(dout * o)");
    tdesc ssum = tensor(b, UID_SOFTMAX_SUM, CUDNN_DATA_FLOAT, rdim, rstride, false, false,
                        "softmax_sum");
    pointwise(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rs, scalar(b, UID_ONE, "one"), NULL, ssum,
              -1, "softmax_sum");

    /* P recomputed from the stats */
    tdesc s = virt(b, CUDNN_DATA_FLOAT, k->B, k->Hq, k->Tq, k->Tk, "q k^T");
    matmul(b, q, kt, s, "q k^T");
    s = pw_f32(b, CUDNN_POINTWISE_MUL, s, scale, sdim, "scale");
    if (bias) s = pw_f32(b, CUDNN_POINTWISE_ADD, s, bias, sdim, "bias add");
    s = pw_f32(b, CUDNN_POINTWISE_SUB, s, stats, sdim, "minus stats");
    if (k->causal) s = causal_mask(b, s, scalar(b, UID_NEG_INF, "-inf"), sdim);
    tdesc p = pw_f32(b, CUDNN_POINTWISE_EXP, s, NULL, sdim, "probabilities");

    /* dV = P^T dO */
    int64_t tdim[4] = {k->B, k->Hq, k->Tk, k->Tq};
    int64_t tstride[4] = {k->Hq * k->Tq * k->Tk, k->Tq * k->Tk, 1, k->Tk};
    tdesc pt = tensor(b, 0, b->io, tdim, tstride, true, false, "p^T");
    reshape(b, p, pt, "p^T");
    kv_grad(b, k, pt, dout, dv, k->Dv, "dv");

    /* dS = (dO V^T - softmax_sum) * P * scale */
    tdesc dp = virt(b, CUDNN_DATA_FLOAT, k->B, k->Hq, k->Tq, k->Tk, "dout v^T");
    matmul(b, dout, vt, dp, "dout v^T");
    tdesc ds = pw_f32(b, CUDNN_POINTWISE_SUB, dp, ssum, sdim, "minus softmax_sum");
    ds = pw_f32(b, CUDNN_POINTWISE_MUL, ds, p, sdim, "times p");
    ds = pw_f32(b, CUDNN_POINTWISE_MUL, ds, scale, sdim, "ds scale");

    /* dK = dS^T Q */
    tdesc dst = tensor(b, 0, b->io, tdim, tstride, true, false, "ds^T");
    reshape(b, ds, dst, "ds^T");
    kv_grad(b, k, dst, q, dk, k->D, "dk");

    /* dQ = dS K, accumulated in f32 in our workspace, then rounded */
    int64_t kdim[4] = {k->B, k->Hkv, k->Tk, k->D};
    tdesc kk = tensor(b, 0, b->io, kdim, k->k, true, false, "k from k^T");
    reshape(b, kt, kk, "k from k^T");
    tdesc acc = tensor(b, UID_DQ_ACCUM, CUDNN_DATA_FLOAT, accdim, accstride, false, false,
                       "dq_accum");
    matmul(b, ds, kk, acc, "ds k");
    pointwise(b, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, NULL, NULL, dq, -1, "dq");
}

/* The operation graph, the heuristics' engine configurations, and the
 * first execution plan that finalizes. */
cudnnBackendDescriptor_t build_plan(builder *b, cudnnHandle_t h, int64_t *workspace) {
    cudnnBackendDescriptor_t graph = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->n_ops, b->ops,
        "operation graph");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "operation graph");
    finalize(b, graph, "operation graph");
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char last[512] = "no engine configuration";
    for (int m = 0; m < 2 && !failed(b); m++) {
        cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
        set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
            "heuristics");
        set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m], "heuristics");
        finalize(b, heur, "heuristics");
        if (failed(b)) break;
        int64_t count = 0;
        cudnnStatus_t st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
        if (st != CUDNN_STATUS_SUCCESS) {
            fail(b, "heuristics results", st);
            break;
        }
        if (count > 8) count = 8;
        cudnnBackendDescriptor_t cfgs[8];
        for (int64_t i = 0; i < count; i++)
            cfgs[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
        if (failed(b)) break;
        int64_t got = 0;
        if (count > 0) {
            st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
            if (st != CUDNN_STATUS_SUCCESS) {
                fail(b, "heuristics results", st);
                break;
            }
        }
        for (int64_t i = 0; i < got && i < count; i++) {
            cudnnBackendDescriptor_t plan = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                                 "execution plan");
            set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "execution plan");
            set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                &cfgs[i], "execution plan");
            if (failed(b)) return NULL;
            st = cudnnBackendFinalize(plan);
            if (st != CUDNN_STATUS_SUCCESS) {
                /* This engine does not take the graph (or could not get
                 * the memory to compile it); try the next one. */
                if (st == CUDNN_STATUS_ALLOC_FAILED) b->transient = true;
                char detail[256] = "";
                cudnnGetLastErrorString(detail, sizeof detail);
                snprintf(last, sizeof last, "execution plan: %s (cuDNN status %d)%s%s",
                         cudnnGetErrorString(st), (int)st, detail[0] ? ": " : "", detail);
                continue;
            }
            st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                          CUDNN_TYPE_INT64, 1, &count, workspace);
            if (st != CUDNN_STATUS_SUCCESS) {
                fail(b, "execution plan workspace size", st);
                return NULL;
            }
            return plan;
        }
    }
    if (!failed(b)) snprintf(b->why, sizeof b->why, "%s", last);
    return NULL;
}

int dnn_fail(const char *op, const char *what, cudnnStatus_t st) {
    return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s failed: %s (cuDNN status %d)", op, what,
                   cudnnGetErrorString(st), (int)st);
}

/* The device's handle on the compute stream, or NULL with why not in b (a
 * library that cannot start on this GPU is a refusal like any other). */
cudnnHandle_t handle_of(builder *b, int dev) {
    if (dev < 0 || dev >= MAX_DEVICES) {
        snprintf(b->why, sizeof b->why, "device index %d beyond %d", dev, (int)MAX_DEVICES);
        return NULL;
    }
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (!handles[dev] && (st = cudnnCreate(&handles[dev])) != CUDNN_STATUS_SUCCESS) {
        handles[dev] = NULL;
        fail(b, "cudnnCreate", st);
        return NULL;
    }
    if ((st = cudnnSetStream(handles[dev], fl_cu_stream())) != CUDNN_STATUS_SUCCESS) {
        fail(b, "cudnnSetStream", st);
        return NULL;
    }
    return handles[dev];
}

/* The cached outcome for key k, building it on first sight (under the
 * lock); `refusal` says why the configuration cannot go to cuDNN at all.
 * NULL only with the core's error set (out of memory). */
const sdpa_plan *plan_for(const char *op, const sdpa_key *k, const char *refusal) {
    for (int i = 0; i < n_cache; i++)
        if (memcmp(&cache[i]->key, k, sizeof *k) == 0) return cache[i];
    if (n_cache == MAX_CACHE) {
        debug_line(k, "the plan cache is full");
        return &cache_full;
    }
    sdpa_plan *e = (sdpa_plan *)calloc(1, sizeof *e);
    if (!e) {
        fl_fail(FL_ERR_OOM, "%s on cuda: no memory for the cuDNN plan cache", op);
        return NULL;
    }
    e->key = *k;
    if (refusal) {
        debug_line(k, refusal);
        cache[n_cache++] = e;
        return e;
    }
    builder *b = (builder *)calloc(1, sizeof(builder));
    if (!b) {
        free(e);
        fl_fail(FL_ERR_OOM, "%s on cuda: no memory to build a cuDNN graph", op);
        return NULL;
    }
    b->next_uid = UID_FIRST_VIRTUAL;
    b->io = k->dtype == FL_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    cudnnHandle_t h = handle_of(b, k->device);
    if (h && k->backward) build_backward(b, k);
    else if (h) build_forward(b, k);
    if (!failed(b)) e->plan = build_plan(b, h, &e->workspace);
    e->ok = e->plan != NULL;
    if (e->ok) {
        e->descs = (cudnnBackendDescriptor_t *)malloc((size_t)b->n * sizeof *e->descs);
        if (!e->descs) e->ok = false;
        else memcpy(e->descs, b->descs, (size_t)b->n * sizeof *e->descs);
        e->n_descs = b->n;
    }
    bool no_memory = e->plan && !e->descs;
    if (!e->ok) {
        debug_line(k, b->why[0] ? b->why : "no memory to keep the plan");
        for (int i = b->n - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(b->descs[i]);
        e->plan = NULL;
        if (b->transient || no_memory) {
            /* Out of memory now is no verdict on the configuration. */
            free(e->descs);
            free(e);
            free(b);
            return &cache_full;
        }
    }
    free(b);
    cache[n_cache++] = e;
    return e;
}

/* Runs a cached plan. ptrs[i] is the device (or, by value, host) address of
 * uids[i]. */
int execute(const char *op, cudnnHandle_t h, const sdpa_plan *e, int n, const int64_t *uids,
            void *const *ptrs, void *workspace) {
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    const char *what = "variant pack";
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                      uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                      1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS) {
        what = "cudnnBackendExecute";
        st = cudnnBackendExecute(h, e->plan, pack);
    }
    if (pack) cudnnBackendDestroyDescriptor(pack);
    return st == CUDNN_STATUS_SUCCESS ? FL_OK : dnn_fail(op, what, st);
}

int64_t round_up(int64_t n) { return (n + 255) / 256 * 256; }

/* Both directions: the key, the cached plan, a workspace of the plan's size
 * plus `extra` bytes (the backward's f32 buffers), then run(). */
template <typename Run>
int run_cudnn(const char *op, const fl_attention_args *a, bool backward, bool *done, Run run) {
    *done = false;
    if (env_is("FSDP_CUDNN_SDPA", "0")) return FL_OK;
    sdpa_key k;
    key_of(a, backward, &k);
    if (!pointers_aligned(a)) {
        debug_line(&k, "a tensor whose data is not aligned to 16 bytes");
        return FL_OK;
    }
    if (const char *why = call_refusal(a, backward, &k)) {
        debug_line(&k, why);
        return FL_OK;
    }
    const char *refusal = layout_refusal(a, backward, &k);
    if (fl_cu_use_device(op, a->q)) return fl_last_status();
    const sdpa_plan *e;
    {
        fl_cu_lock lock(&mutex);
        e = plan_for(op, &k, refusal);
        if (!e) return fl_last_status();
    }
    if (!e->ok) return FL_OK;
    cudnnHandle_t h = handles[k.device]; /* made with the plan */
    cudnnStatus_t st = cudnnSetStream(h, fl_cu_stream());
    if (st != CUDNN_STATUS_SUCCESS) return dnn_fail(op, "cudnnSetStream", st);
    int64_t extra = backward ? round_up(k.B * k.Hq * k.Tq * 4) + k.B * k.Hq * k.Tq * k.D * 4 : 0;
    int64_t ws_bytes = round_up(e->workspace) + extra;
    fl_tensor *ws = fl_cu_scratch(ws_bytes, FL_U8, a->q);
    if (!ws) return fl_last_status();
    char *base = (char *)ws->data;
    int rc = run(h, e, base, base + round_up(e->workspace));
    fl_tensor_release(ws);
    if (!rc) {
        *done = true;
        __atomic_fetch_add(&path_counts[backward ? FL_ATT_PATH_CUDNN_BACKWARD
                                                 : FL_ATT_PATH_CUDNN_FORWARD],
                           1, __ATOMIC_RELAXED);
    }
    return rc;
}

/* The causal mask's fill: -inf, or the lowest float before cuDNN 9.10 (the
 * frontend's choice: older engines misbehave on -inf). */
float mask_fill(void) { return cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY; }

} // namespace

/* The inputs both directions take when present: the bias, and the fill
 * of masked scores for causal attention. Returns the new count. */
static int add_mask_inputs(const fl_attention_args *a, float *neg_inf, int64_t *uids, void **ptrs, int n) {
    if (a->bias) {
        uids[n] = UID_BIAS;
        ptrs[n++] = a->bias->data;
    }
    if (a->causal) {
        uids[n] = UID_NEG_INF;
        ptrs[n++] = neg_inf;
    }
    return n;
}

int fl_cuda_attention_cudnn(const fl_attention_args *a, bool *done) {
    const char *op = "scaled_dot_product_attention";
    float scale = (float)a->scale, neg_inf = mask_fill();
    return run_cudnn(op, a, false, done,
                     [&](cudnnHandle_t h, const sdpa_plan *e, void *ws, void *) {
        int64_t uids[8] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE};
        void *ptrs[8] = {a->q->data, a->k->data, a->v->data, a->out->data, a->lse->data, &scale};
        int n = 6;
        n = add_mask_inputs(a, &neg_inf, uids, ptrs, n);
        return execute(op, h, e, n, uids, ptrs, ws);
    });
}

int fl_cuda_attention_cudnn_backward(const fl_attention_args *a, bool *done) {
    const char *op = "scaled_dot_product_attention backward";
    float scale = (float)a->scale, neg_inf = mask_fill(), one = 1.0f;
    return run_cudnn(op, a, true, done,
                     [&](cudnnHandle_t h, const sdpa_plan *e, void *ws, void *extra) {
        const int64_t rows = e->key.B * e->key.Hq * e->key.Tq;
        char *softmax_sum = (char *)extra, *dq_accum = softmax_sum + round_up(rows * 4);
        if (cudnnGetVersion() < 90600) {
            /* Older engines add into dQ_accum (the frontend zeroes it). */
            cudaError_t ce = cudaMemsetAsync(dq_accum, 0, rows * e->key.D * 4, fl_cu_stream());
            if (ce != cudaSuccess)
                return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(ce));
        }
        int64_t uids[16] = {UID_Q,  UID_K,  UID_V,  UID_O,           UID_DO,       UID_STATS,
                            UID_DQ, UID_DK, UID_DV, UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_SCALE,
                            UID_ONE};
        void *ptrs[16] = {a->q->data,  a->k->data,  a->v->data,  a->o->data, a->dout->data,
                          a->lse->data, a->dq->data, a->dk->data, a->dv->data, softmax_sum,
                          dq_accum,     &scale,      &one};
        int n = 13;
        n = add_mask_inputs(a, &neg_inf, uids, ptrs, n);
        return execute(op, h, e, n, uids, ptrs, ws);
    });
}

void fl_cuda_attention_count(int path) {
    __atomic_fetch_add(&path_counts[path], 1, __ATOMIC_RELAXED);
}

/* fsdp.h: fl_device_library_version. The cuDNN found at run time, which
 * may be older than the headers we built with. */
extern "C" int64_t fl_cuda_library_version(const char *library) {
    return strcmp(library, "cudnn") == 0 ? (int64_t)cudnnGetVersion() : -1;
}

extern "C" void fl_cuda_attention_paths(int64_t counts[4]) {
    for (int i = 0; i < 4; i++) counts[i] = __atomic_load_n(&path_counts[i], __ATOMIC_RELAXED);
}
