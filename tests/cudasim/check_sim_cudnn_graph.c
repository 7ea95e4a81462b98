/*
 * check_sim_cudnn_graph.c: checks sim_cudnn_graph.c (cuDNN's graph API in
 * cudasim) through the backend API only, the way a caller builds graphs:
 * tensors, operations, operation graph, heuristics, engine config,
 * execution plan, variant pack, execute. Each case compares with a direct
 * host computation:
 *   a. matmul with broadcast batch dims and a transposed (strided) B;
 *   b. pointwise chains with size-1 broadcasting, a by-value scalar,
 *      alphas, unary modes;
 *   c. reductions (max, add, min) over different dims, strided output;
 *   d. GEN_INDEX + CMP_GE + BINARY_SELECT (the causal mask);
 *   e. the attention forward graph (Q K^T * scale, causal mask, softmax by
 *      max/sub/exp/sum/div, stats = max + log(sum), P V) with f32 and bf16
 *      I/O in the BSHD layout, against softmax attention computed in double;
 *   f. error cases: wrong attribute type or count, missing attributes,
 *      duplicate and inconsistent unique ids, unsupported modes, types and
 *      attributes, shape mismatches, set after finalize, execute without a
 *      pointer or with a misaligned one, cycles.
 * Prints "ok   ..." or "FAIL ..." per case and a summary last line.
 *
 * Build: gcc -std=c11 -I/usr/local/cuda/include check_sim_cudnn_graph.c
 *        sim_cudnn_graph.c sim_cudnn.c -lm
 */

#include <cudnn.h>

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_half.h"

static int failures, passes;
static cudnnHandle_t handle;

static void result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void result(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) passes++;
    else failures++;
}

/* A call that must succeed: a failure is reported and the case abandoned. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudnnStatus_t st_ = (call);                                                                \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                         \
            char msg_[512];                                                                        \
            cudnnGetLastErrorString(msg_, sizeof msg_);                                            \
            printf("FAIL %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,                       \
                   cudnnGetErrorString(st_), msg_);                                                \
            failures++;                                                                            \
            return;                                                                                \
        }                                                                                          \
    } while (0)

typedef cudnnBackendDescriptor_t bd_t;

/* Descriptors made by the helpers, destroyed together at the end of a case. */
static bd_t made[4096];
static int nmade;

static void destroy_all(void) {
    for (int i = nmade - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(made[i]);
    nmade = 0;
}

static bd_t create(cudnnBackendDescriptorType_t t) {
    bd_t d = NULL;
    if (cudnnBackendCreateDescriptor(t, &d) != CUDNN_STATUS_SUCCESS) return NULL;
    made[nmade++] = d;
    return d;
}

static cudnnStatus_t set_i64(bd_t d, cudnnBackendAttributeName_t a, int64_t v) {
    return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_INT64, 1, &v);
}

static cudnnStatus_t set_desc(bd_t d, cudnnBackendAttributeName_t a, bd_t v) {
    return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static cudnnStatus_t set_dtype(bd_t d, cudnnBackendAttributeName_t a, cudnnDataType_t v) {
    return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_DATA_TYPE, 1, &v);
}

/* Packed strides of dims in the order perm (perm[0] outermost). */
static void strides_for(int nd, const int64_t *dims, const int *perm, int64_t *str) {
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        int d = perm ? perm[i] : i;
        str[d] = s;
        s *= dims[d];
    }
}

enum { VIRT = 1, BYVAL = 2 };

/* The tensors below declare 16-byte alignment, so their buffers have it. */
#define AL _Alignas(16)

/* A finalized tensor; strides NULL: packed row major. NULL on failure. */
static bd_t tensor(int64_t uid, cudnnDataType_t dt, int nd, const int64_t *dims, const int64_t *strides, int flags) {
    int64_t str[8];
    if (strides) memcpy(str, strides, (size_t)nd * sizeof *str);
    else strides_for(nd, dims, NULL, str);
    bd_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool virt = flags & VIRT, byval = (flags & BYVAL) != 0;
    if (!t || set_dtype(t, CUDNN_ATTR_TENSOR_DATA_TYPE, dt) ||
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims) ||
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, str) ||
        set_i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, uid) || set_i64(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16) ||
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt) ||
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval) ||
        cudnnBackendFinalize(t))
        return NULL;
    return t;
}

/* A finalized pointwise operation y = mode(x, b, t); b, t may be NULL. */
static bd_t pointwise(cudnnPointwiseMode_t mode, bd_t x, bd_t b, bd_t t, bd_t y, int64_t axis) {
    bd_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    if (!pw || cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode) ||
        set_dtype(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT))
        return NULL;
    if (mode == CUDNN_POINTWISE_GEN_INDEX && set_i64(pw, CUDNN_ATTR_POINTWISE_AXIS, axis)) return NULL;
    if (cudnnBackendFinalize(pw)) return NULL;
    bd_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw) ||
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x) ||
        (b && set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b)) ||
        (t && set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t)) ||
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y) || cudnnBackendFinalize(op))
        return NULL;
    return op;
}

static bd_t matmul(bd_t a, bd_t b, bd_t c) {
    bd_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    if (!mm || set_dtype(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT) || cudnnBackendFinalize(mm))
        return NULL;
    bd_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a) || set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b) ||
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c) || set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm) ||
        cudnnBackendFinalize(op))
        return NULL;
    return op;
}

static bd_t reduction(cudnnReduceTensorOp_t how, bd_t x, bd_t y) {
    bd_t r = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    if (!r || cudnnBackendSetAttribute(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how) ||
        set_dtype(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT) || cudnnBackendFinalize(r))
        return NULL;
    bd_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x) ||
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y) || set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r) ||
        cudnnBackendFinalize(op))
        return NULL;
    return op;
}

/* Graph, heuristics, engine config, plan: the plan, or NULL with *st set. */
static bd_t plan_for(bd_t *ops, int nops, cudnnStatus_t *st) {
    bd_t g = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    *st = cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    if (!*st) *st = cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops);
    if (!*st) *st = cudnnBackendFinalize(g);
    if (*st) return NULL;
    bd_t h = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    *st = set_desc(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
    if (!*st) *st = cudnnBackendSetAttribute(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (!*st) *st = cudnnBackendFinalize(h);
    if (*st) return NULL;
    int64_t count = -1;
    *st = cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
    if (*st || count < 1) {
        if (!*st) *st = CUDNN_STATUS_NOT_SUPPORTED;
        return NULL;
    }
    bd_t cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    *st = cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &cfg);
    if (*st) return NULL;
    bd_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    *st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    if (!*st) *st = set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    if (!*st) *st = cudnnBackendFinalize(plan);
    return *st ? NULL : plan;
}

static cudnnStatus_t execute(bd_t plan, int n, const int64_t *uids, void **ptrs) {
    bd_t vp = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    cudnnStatus_t st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    void *ws = NULL;
    if (!st) st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (!st) st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (!st) st = cudnnBackendFinalize(vp);
    if (!st) st = cudnnBackendExecute(handle, plan, vp);
    return st;
}

#define NONNULL(x)                                                                                 \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            char msg_[512];                                                                        \
            cudnnGetLastErrorString(msg_, sizeof msg_);                                            \
            printf("FAIL %s:%d: building %s failed (%s)\n", __FILE__, __LINE__, #x, msg_);         \
            failures++;                                                                            \
            destroy_all();                                                                         \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define PLAN(var, ...)                                                                             \
    bd_t ops_##var[] = {__VA_ARGS__};                                                              \
    cudnnStatus_t pst_##var;                                                                       \
    for (size_t i_ = 0; i_ < sizeof ops_##var / sizeof *ops_##var; i_++) NONNULL(ops_##var[i_]);   \
    bd_t var = plan_for(ops_##var, (int)(sizeof ops_##var / sizeof *ops_##var), &pst_##var);       \
    NONNULL(var)

/* Small integers, so f32 products and sums are exact whatever the order. */
static void fill_ints(float *p, int64_t n, int seed, int lo, int hi) {
    uint32_t s = 2463534242u + (uint32_t)seed * 7919u;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        p[i] = (float)(lo + (int)(s % (uint32_t)(hi - lo + 1)));
    }
}

static double uniform(uint32_t *s) {
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return (double)(*s >> 8) / (double)(1u << 24) * 2.0 - 1.0;
}

/* ------------------------------------------------------------- a. matmul */

static void matmul_case(void) {
    /* C[b,h,m,n] = sum_k A[b,0,m,k] * B[0,h,k,n]; B is stored as [h][n][k]
     * (a transposed view given by strides). */
    enum { Bt = 2, H = 3, M = 4, K = 5, N = 6 };
    int64_t ad[] = {Bt, 1, M, K}, bd[] = {1, H, K, N}, cd[] = {Bt, H, M, N};
    int64_t bs[] = {H * N * K, N * K, 1, K};
    AL float A[Bt * M * K], Bm[H * N * K], C[Bt * H * M * N];
    fill_ints(A, Bt * M * K, 1, -3, 3);
    fill_ints(Bm, H * N * K, 2, -3, 3);
    for (int i = 0; i < Bt * H * M * N; i++) C[i] = NAN;
    bd_t ta, tb, tc;
    NONNULL(ta = tensor(1, CUDNN_DATA_FLOAT, 4, ad, NULL, 0));
    NONNULL(tb = tensor(2, CUDNN_DATA_FLOAT, 4, bd, bs, 0));
    NONNULL(tc = tensor(3, CUDNN_DATA_FLOAT, 4, cd, NULL, 0));
    PLAN(plan, matmul(ta, tb, tc));
    int64_t uids[] = {1, 2, 3};
    void *ptrs[] = {A, Bm, C};
    CHECK(execute(plan, 3, uids, ptrs));
    int bad = 0;
    for (int b = 0; b < Bt; b++)
        for (int h = 0; h < H; h++)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    float ref = 0;
                    for (int k = 0; k < K; k++) ref += A[(b * M + m) * K + k] * Bm[(h * N + n) * K + k];
                    bad += C[((b * H + h) * M + m) * N + n] != ref;
                }
    result(!bad, "matmul [2,1,4,5] x [1,3,5,6] (batch broadcast, B transposed by strides) = [2,3,4,6]: %d wrong", bad);

    /* Workspace size of the plan: the simulation needs none. */
    int64_t ws = -1, cnt = -1;
    CHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws));
    result(ws == 0 && cnt == 1, "execution plan workspace size reads 0 (got %lld, count %lld)", (long long)ws,
           (long long)cnt);
    destroy_all();

    /* bf16 in, f32 out; bf16 out rounds to nearest even. */
    int64_t d2a[] = {1, 2}, d2b[] = {2, 1}, d2c[] = {1, 1};
    AL uint16_t a2[2] = {f32_to_bf16(1.0f), f32_to_bf16(1.0f)};
    AL uint16_t b2[2] = {f32_to_bf16(1.0f), f32_to_bf16(0x1p-8f * 3.0f)}; /* 1 + 3*2^-8 -> tie region */
    AL uint16_t c2 = 0;
    NONNULL(ta = tensor(1, CUDNN_DATA_BFLOAT16, 2, d2a, NULL, 0));
    NONNULL(tb = tensor(2, CUDNN_DATA_BFLOAT16, 2, d2b, NULL, 0));
    NONNULL(tc = tensor(3, CUDNN_DATA_BFLOAT16, 2, d2c, NULL, 0));
    PLAN(plan2, matmul(ta, tb, tc));
    void *ptrs2[] = {a2, b2, &c2};
    CHECK(execute(plan2, 3, uids, ptrs2));
    /* 1 + 3/256 = 1.01171875: bf16 neighbours 1.0078125 and 1.015625, it is
     * their midpoint; to even: 1.015625 (0x3f82). */
    result(c2 == 0x3f82, "bf16 matmul output rounds to nearest even (1 + 3*2^-8 -> 0x3f82, got 0x%04x)", c2);
    destroy_all();
}

/* ------------------------------------------------------------ b. pointwise */

static void pointwise_case(void) {
    /* y = ((x + b) * c - s) / 2 with x [2,3,4], b [1,3,1], c [2,1,4],
     * s by value; then z = neg(abs(y)) and w = max(y, z). */
    enum { P = 2, Q = 3, R = 4 };
    int64_t xd[] = {P, Q, R}, bdm[] = {1, Q, 1}, cdm[] = {P, 1, R}, sd[] = {1, 1, 1};
    AL float x[P * Q * R], b[Q], c[P * R], two = 2.0f, s = 5.0f, y[P * Q * R], w[P * Q * R];
    fill_ints(x, P * Q * R, 3, -4, 4);
    fill_ints(b, Q, 4, -4, 4);
    fill_ints(c, P * R, 5, -4, 4);
    /* y stored transposed ([R][Q][P] in memory) to check strided writes. */
    int perm[] = {2, 1, 0};
    int64_t ys[3];
    strides_for(3, xd, perm, ys);
    bd_t tx, tb, tc, ts, t2, v1, v2, v3, ty, vz, tw;
    NONNULL(tx = tensor(10, CUDNN_DATA_FLOAT, 3, xd, NULL, 0));
    NONNULL(tb = tensor(11, CUDNN_DATA_FLOAT, 3, bdm, NULL, 0));
    NONNULL(tc = tensor(12, CUDNN_DATA_FLOAT, 3, cdm, NULL, 0));
    NONNULL(ts = tensor(13, CUDNN_DATA_FLOAT, 3, sd, sd, BYVAL));
    NONNULL(t2 = tensor(14, CUDNN_DATA_FLOAT, 3, sd, sd, BYVAL));
    NONNULL(v1 = tensor(100, CUDNN_DATA_FLOAT, 3, xd, NULL, VIRT));
    NONNULL(v2 = tensor(101, CUDNN_DATA_FLOAT, 3, xd, NULL, VIRT));
    NONNULL(v3 = tensor(102, CUDNN_DATA_FLOAT, 3, xd, NULL, VIRT));
    NONNULL(ty = tensor(20, CUDNN_DATA_FLOAT, 3, xd, ys, 0));
    NONNULL(vz = tensor(103, CUDNN_DATA_FLOAT, 3, xd, NULL, VIRT));
    bd_t vabs;
    NONNULL(vabs = tensor(104, CUDNN_DATA_FLOAT, 3, xd, NULL, VIRT));
    NONNULL(tw = tensor(21, CUDNN_DATA_FLOAT, 3, xd, NULL, 0));
    /* Ops listed out of order on purpose: the graph orders them. */
    PLAN(plan, pointwise(CUDNN_POINTWISE_MAX, ty, vz, NULL, tw, 0),
         pointwise(CUDNN_POINTWISE_DIV, v3, t2, NULL, ty, 0),
         pointwise(CUDNN_POINTWISE_ADD, tx, tb, NULL, v1, 0),
         pointwise(CUDNN_POINTWISE_MUL, v1, tc, NULL, v2, 0),
         pointwise(CUDNN_POINTWISE_SUB, v2, ts, NULL, v3, 0),
         pointwise(CUDNN_POINTWISE_NEG, vabs, NULL, NULL, vz, 0),
         pointwise(CUDNN_POINTWISE_ABS, ty, NULL, NULL, vabs, 0));
    int64_t uids[] = {10, 11, 12, 13, 14, 20, 21};
    void *ptrs[] = {x, b, c, &s, &two, y, w};
    CHECK(execute(plan, 7, uids, ptrs));
    int bad = 0, badw = 0;
    for (int p = 0; p < P; p++)
        for (int q = 0; q < Q; q++)
            for (int r = 0; r < R; r++) {
                float ref = ((x[(p * Q + q) * R + r] + b[q]) * c[p * R + r] - s) / 2.0f;
                bad += y[r * Q * P + q * P + p] != ref;
                badw += w[(p * Q + q) * R + r] != fmaxf(ref, -fabsf(ref));
            }
    result(!bad, "pointwise chain ((x + b[1,3,1]) * c[2,1,4] - s) / 2 into a transposed output: %d wrong", bad);
    result(!badw, "pointwise max(y, neg(abs(y))) reading a strided tensor: %d wrong", badw);
    destroy_all();

    /* alpha1/alpha2: y = alpha1*x + alpha2*b. */
    int64_t d1[] = {1, 4};
    AL float xa[4] = {1, 2, 3, 4}, ba[4] = {10, 20, 30, 40}, ya[4];
    NONNULL(tx = tensor(1, CUDNN_DATA_FLOAT, 2, d1, NULL, 0));
    NONNULL(tb = tensor(2, CUDNN_DATA_FLOAT, 2, d1, NULL, 0));
    NONNULL(ty = tensor(3, CUDNN_DATA_FLOAT, 2, d1, NULL, 0));
    bd_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR), op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    cudnnPointwiseMode_t add = CUDNN_POINTWISE_ADD;
    float a1 = 2.0f;
    double a2 = -0.5;
    CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &add));
    CHECK(set_dtype(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT));
    CHECK(cudnnBackendFinalize(pw));
    CHECK(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
    CHECK(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tx));
    CHECK(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tb));
    CHECK(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, ty));
    CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &a1));
    CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_DOUBLE, 1, &a2));
    CHECK(cudnnBackendFinalize(op));
    PLAN(plan2, op);
    int64_t u2[] = {1, 2, 3};
    void *p2[] = {xa, ba, ya};
    CHECK(execute(plan2, 3, u2, p2));
    bad = 0;
    for (int i = 0; i < 4; i++) bad += ya[i] != 2.0f * xa[i] - 0.5f * ba[i];
    result(!bad, "pointwise alpha1 (float) and alpha2 (double): y = 2x - b/2: %d wrong", bad);
    destroy_all();

    /* Unary modes on positive inputs, against libm in f32. */
    static const struct {
        cudnnPointwiseMode_t m;
        const char *name;
    } un[] = {{CUDNN_POINTWISE_EXP, "EXP"}, {CUDNN_POINTWISE_LOG, "LOG"}, {CUDNN_POINTWISE_SQRT, "SQRT"},
              {CUDNN_POINTWISE_RSQRT, "RSQRT"}, {CUDNN_POINTWISE_RECIPROCAL, "RECIPROCAL"},
              {CUDNN_POINTWISE_IDENTITY, "IDENTITY"}};
    for (size_t i = 0; i < sizeof un / sizeof *un; i++) {
        AL float in[4] = {0.25f, 1.0f, 2.5f, 7.0f}, out[4];
        NONNULL(tx = tensor(1, CUDNN_DATA_FLOAT, 2, d1, NULL, 0));
        NONNULL(ty = tensor(2, CUDNN_DATA_FLOAT, 2, d1, NULL, 0));
        PLAN(p, pointwise(un[i].m, tx, NULL, NULL, ty, 0));
        int64_t u[] = {1, 2};
        void *pp[] = {in, out};
        CHECK(execute(p, 2, u, pp));
        bad = 0;
        for (int j = 0; j < 4; j++) {
            float v = in[j], ref = un[i].m == CUDNN_POINTWISE_EXP ? expf(v) : un[i].m == CUDNN_POINTWISE_LOG ? logf(v)
                                   : un[i].m == CUDNN_POINTWISE_SQRT ? sqrtf(v) : un[i].m == CUDNN_POINTWISE_RSQRT
                                   ? 1.0f / sqrtf(v) : un[i].m == CUDNN_POINTWISE_RECIPROCAL ? 1.0f / v : v;
            bad += out[j] != ref;
        }
        result(!bad, "pointwise %s: %d wrong", un[i].name, bad);
        destroy_all();
    }
}

/* ----------------------------------------------------------- c. reductions */

static void reduction_case(void) {
    enum { P = 2, Q = 3, R = 5 };
    int64_t xd[] = {P, Q, R}, d_last[] = {P, Q, 1}, d_mid[] = {P, 1, R}, d_all[] = {1, 1, 1};
    AL float x[P * Q * R], mx[P * Q], sm[P * R], mn = NAN, all = NAN;
    fill_ints(x, P * Q * R, 7, -9, 9);
    int64_t smstr[] = {1, 1, P}; /* [P,1,R] stored column major */
    bd_t tx, tmx, tsm, tall, tmn;
    NONNULL(tx = tensor(1, CUDNN_DATA_FLOAT, 3, xd, NULL, 0));
    NONNULL(tmx = tensor(2, CUDNN_DATA_FLOAT, 3, d_last, NULL, 0));
    NONNULL(tsm = tensor(3, CUDNN_DATA_FLOAT, 3, d_mid, smstr, 0));
    NONNULL(tall = tensor(4, CUDNN_DATA_FLOAT, 3, d_all, NULL, 0));
    NONNULL(tmn = tensor(5, CUDNN_DATA_FLOAT, 3, d_all, NULL, 0));
    PLAN(plan, reduction(CUDNN_REDUCE_TENSOR_MAX, tx, tmx), reduction(CUDNN_REDUCE_TENSOR_ADD, tx, tsm),
         reduction(CUDNN_REDUCE_TENSOR_ADD, tx, tall), reduction(CUDNN_REDUCE_TENSOR_MIN, tx, tmn));
    int64_t uids[] = {1, 2, 3, 4, 5};
    void *ptrs[] = {x, mx, sm, &all, &mn};
    CHECK(execute(plan, 5, uids, ptrs));
    int badmax = 0, badsum = 0;
    float rall = 0, rmn = INFINITY;
    for (int p = 0; p < P; p++)
        for (int q = 0; q < Q; q++) {
            float m = -INFINITY;
            for (int r = 0; r < R; r++) {
                float v = x[(p * Q + q) * R + r];
                m = fmaxf(m, v);
                rall += v;
                rmn = fminf(rmn, v);
            }
            badmax += mx[p * Q + q] != m;
        }
    for (int p = 0; p < P; p++)
        for (int r = 0; r < R; r++) {
            float s = 0;
            for (int q = 0; q < Q; q++) s += x[(p * Q + q) * R + r];
            badsum += sm[r * P + p] != s;
        }
    result(!badmax, "reduction MAX [2,3,5] -> [2,3,1]: %d wrong", badmax);
    result(!badsum, "reduction ADD [2,3,5] -> [2,1,5] into a column-major output: %d wrong", badsum);
    result(all == rall, "reduction ADD [2,3,5] -> [1,1,1]: %g (expected %g)", all, rall);
    result(mn == rmn, "reduction MIN [2,3,5] -> [1,1,1]: %g (expected %g)", mn, rmn);
    destroy_all();

    /* MAX of all-negative rows and MIN of all-positive ones: a reduction
     * that starts from 0 instead of -inf/+inf shows here (softmax and the
     * attention stats cannot see it: they are invariant to the shift). */
    int64_t d4[] = {2, 4}, d41[] = {2, 1};
    AL float neg[8] = {-5, -3, -7, -4, -2.5f, -9, -1.5f, -8}, pos[8] = {5, 3, 7, 4, 2.5f, 9, 1.5f, 8};
    AL float nmax[2] = {NAN, NAN}, pmin[2] = {NAN, NAN};
    bd_t tn, tp, tnm, tpm;
    NONNULL(tn = tensor(1, CUDNN_DATA_FLOAT, 2, d4, NULL, 0));
    NONNULL(tp = tensor(2, CUDNN_DATA_FLOAT, 2, d4, NULL, 0));
    NONNULL(tnm = tensor(3, CUDNN_DATA_FLOAT, 2, d41, NULL, 0));
    NONNULL(tpm = tensor(4, CUDNN_DATA_FLOAT, 2, d41, NULL, 0));
    PLAN(plan2, reduction(CUDNN_REDUCE_TENSOR_MAX, tn, tnm), reduction(CUDNN_REDUCE_TENSOR_MIN, tp, tpm));
    int64_t u2[] = {1, 2, 3, 4};
    void *p2[] = {neg, pos, nmax, pmin};
    CHECK(execute(plan2, 4, u2, p2));
    result(nmax[0] == -3 && nmax[1] == -1.5f, "reduction MAX of negative rows: %g %g (expected -3 -1.5)", nmax[0],
           nmax[1]);
    result(pmin[0] == 3 && pmin[1] == 1.5f, "reduction MIN of positive rows: %g %g (expected 3 1.5)", pmin[0], pmin[1]);
    destroy_all();
}

/* ------------------------------------------------------- d. causal masking */

static void mask_case(void) {
    enum { S = 4, T = 6 };
    int64_t sd[] = {1, 1, S, T}, one[] = {1, 1, 1, 1};
    AL float s[S * T], y[S * T], neg = -INFINITY;
    AL int32_t rows[S * T], cols[S * T];
    fill_ints(s, S * T, 9, -5, 5);
    bd_t ts, tneg, vrow, vcol, vmask, ty, trow, tcol;
    NONNULL(ts = tensor(1, CUDNN_DATA_FLOAT, 4, sd, NULL, 0));
    NONNULL(tneg = tensor(2, CUDNN_DATA_FLOAT, 4, one, one, BYVAL));
    NONNULL(vrow = tensor(100, CUDNN_DATA_INT32, 4, sd, NULL, VIRT));
    NONNULL(vcol = tensor(101, CUDNN_DATA_INT32, 4, sd, NULL, VIRT));
    NONNULL(vmask = tensor(102, CUDNN_DATA_BOOLEAN, 4, sd, NULL, VIRT));
    NONNULL(ty = tensor(3, CUDNN_DATA_FLOAT, 4, sd, NULL, 0));
    NONNULL(trow = tensor(4, CUDNN_DATA_INT32, 4, sd, NULL, 0));
    NONNULL(tcol = tensor(5, CUDNN_DATA_INT32, 4, sd, NULL, 0));
    PLAN(plan, pointwise(CUDNN_POINTWISE_GEN_INDEX, ts, NULL, NULL, vrow, 2),
         pointwise(CUDNN_POINTWISE_GEN_INDEX, ts, NULL, NULL, vcol, 3),
         pointwise(CUDNN_POINTWISE_CMP_GE, vrow, vcol, NULL, vmask, 0),
         pointwise(CUDNN_POINTWISE_BINARY_SELECT, ts, tneg, vmask, ty, 0),
         pointwise(CUDNN_POINTWISE_GEN_INDEX, ts, NULL, NULL, trow, 2),
         pointwise(CUDNN_POINTWISE_GEN_INDEX, ts, NULL, NULL, tcol, 3));
    int64_t uids[] = {1, 2, 3, 4, 5};
    void *ptrs[] = {s, &neg, y, rows, cols};
    CHECK(execute(plan, 5, uids, ptrs));
    int bad = 0, badidx = 0;
    for (int i = 0; i < S; i++)
        for (int j = 0; j < T; j++) {
            float ref = i >= j ? s[i * T + j] : -INFINITY;
            bad += y[i * T + j] != ref;
            badidx += rows[i * T + j] != i || cols[i * T + j] != j;
        }
    result(!badidx, "GEN_INDEX axis 2 and 3 of [1,1,4,6] into INT32 tensors: %d wrong", badidx);
    result(!bad, "causal mask: BINARY_SELECT(s, -inf, CMP_GE(row, col)) keeps s where row >= col: %d wrong", bad);
    destroy_all();
}

/* -------------------------------------------------------- e. attention fwd */

/* Q, K, V, O in BSHD memory ([b][s][h][d]), described as [B,H,S,D]. */
static void attention_case(cudnnDataType_t io) {
    enum { B = 2, H = 2, S = 5, D = 8 };
    const int n = B * S * H * D;
    const char *name = io == CUDNN_DATA_FLOAT ? "f32" : "bf16";
    size_t esz = io == CUDNN_DATA_FLOAT ? 4 : 2;
    void *q = malloc(n * esz), *k = malloc(n * esz), *v = malloc(n * esz), *o = malloc(n * esz);
    float *stats = malloc(B * H * S * sizeof *stats);
    double *qd = malloc(n * sizeof *qd), *kd = malloc(n * sizeof *kd), *vd = malloc(n * sizeof *vd);
    uint32_t seed = 12345;
    for (int i = 0; i < n; i++) {
        double *dst[3] = {qd, kd, vd};
        void *raw[3] = {q, k, v};
        for (int t = 0; t < 3; t++) {
            float f = (float)uniform(&seed);
            if (io == CUDNN_DATA_FLOAT) ((float *)raw[t])[i] = f;
            else ((uint16_t *)raw[t])[i] = f32_to_bf16(f), f = bf16_to_f32(f32_to_bf16(f));
            dst[t][i] = f;
        }
    }
    AL float scale = 1.0f / sqrtf((float)D), neg = -INFINITY;
    int64_t qdim[] = {B, H, S, D}, qstr[] = {S * H * D, D, H * D, 1};
    int64_t ktdim[] = {B, H, D, S}, ktstr[] = {S * H * D, D, 1, H * D}; /* K^T by strides */
    int64_t sdim[] = {B, H, S, S}, rdim[] = {B, H, S, 1}, one[] = {1, 1, 1, 1};
    enum { UQ = 1, UK, UV, UO, USTATS, USCALE, UNEG };
    bd_t tq, tk, tv, to, tst, tsc, tneg;
    NONNULL(tq = tensor(UQ, io, 4, qdim, qstr, 0));
    NONNULL(tk = tensor(UK, io, 4, ktdim, ktstr, 0));
    NONNULL(tv = tensor(UV, io, 4, qdim, qstr, 0));
    NONNULL(to = tensor(UO, io, 4, qdim, qstr, 0));
    NONNULL(tst = tensor(USTATS, CUDNN_DATA_FLOAT, 4, rdim, NULL, 0));
    NONNULL(tsc = tensor(USCALE, CUDNN_DATA_FLOAT, 4, one, one, BYVAL));
    NONNULL(tneg = tensor(UNEG, CUDNN_DATA_FLOAT, 4, one, one, BYVAL));
    bd_t s1, s2, row, col, mask, s3, mx, sub, ex, sum, lg, p;
    NONNULL(s1 = tensor(100, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(s2 = tensor(101, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(row = tensor(102, CUDNN_DATA_INT32, 4, sdim, NULL, VIRT));
    NONNULL(col = tensor(103, CUDNN_DATA_INT32, 4, sdim, NULL, VIRT));
    NONNULL(mask = tensor(104, CUDNN_DATA_BOOLEAN, 4, sdim, NULL, VIRT));
    NONNULL(s3 = tensor(105, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(mx = tensor(106, CUDNN_DATA_FLOAT, 4, rdim, NULL, VIRT));
    NONNULL(sub = tensor(107, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(ex = tensor(108, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(sum = tensor(109, CUDNN_DATA_FLOAT, 4, rdim, NULL, VIRT));
    NONNULL(lg = tensor(110, CUDNN_DATA_FLOAT, 4, rdim, NULL, VIRT));
    /* P in the I/O type, as cudnn-frontend declares the second matmul's A. */
    NONNULL(p = tensor(111, io, 4, sdim, NULL, VIRT));
    PLAN(plan, matmul(tq, tk, s1), pointwise(CUDNN_POINTWISE_MUL, s1, tsc, NULL, s2, 0),
         pointwise(CUDNN_POINTWISE_GEN_INDEX, s2, NULL, NULL, row, 2),
         pointwise(CUDNN_POINTWISE_GEN_INDEX, s2, NULL, NULL, col, 3),
         pointwise(CUDNN_POINTWISE_CMP_GE, row, col, NULL, mask, 0),
         pointwise(CUDNN_POINTWISE_BINARY_SELECT, s2, tneg, mask, s3, 0),
         reduction(CUDNN_REDUCE_TENSOR_MAX, s3, mx), pointwise(CUDNN_POINTWISE_SUB, s3, mx, NULL, sub, 0),
         pointwise(CUDNN_POINTWISE_EXP, sub, NULL, NULL, ex, 0), reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum),
         pointwise(CUDNN_POINTWISE_LOG, sum, NULL, NULL, lg, 0), pointwise(CUDNN_POINTWISE_ADD, mx, lg, NULL, tst, 0),
         pointwise(CUDNN_POINTWISE_DIV, ex, sum, NULL, p, 0), matmul(p, tv, to));
    int64_t uids[] = {UQ, UK, UV, UO, USTATS, USCALE, UNEG};
    void *ptrs[] = {q, k, v, o, stats, &scale, &neg};
    CHECK(execute(plan, 7, uids, ptrs));
    double maxerr = 0, maxstat = 0, maxo = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                double sc[S], m = -INFINITY, z = 0;
                for (int j = 0; j <= i; j++) {
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += qd[((b * S + i) * H + h) * D + d] * kd[((b * S + j) * H + h) * D + d];
                    sc[j] = dot * (double)scale;
                    if (sc[j] > m) m = sc[j];
                }
                for (int j = 0; j <= i; j++) z += exp(sc[j] - m);
                double st = m + log(z);
                maxstat = fmax(maxstat, fabs(stats[(b * H + h) * S + i] - st));
                for (int d = 0; d < D; d++) {
                    double ref = 0;
                    for (int j = 0; j <= i; j++) ref += exp(sc[j] - m) / z * vd[((b * S + j) * H + h) * D + d];
                    int64_t at = ((b * S + i) * H + h) * D + d;
                    double got = io == CUDNN_DATA_FLOAT ? ((float *)o)[at] : bf16_to_f32(((uint16_t *)o)[at]);
                    maxerr = fmax(maxerr, fabs(got - ref));
                    maxo = fmax(maxo, fabs(ref));
                }
            }
    /* f32: rounding of a few dozen f32 operations; bf16: P and O rounded
     * to 8 significant bits (relative 2^-9 each). */
    double tol = io == CUDNN_DATA_FLOAT ? 1e-5 : 8e-3;
    result(maxerr <= tol * fmax(1.0, maxo), "attention forward %s (B2 H2 S5 D8, BSHD, causal): max |O - ref| %.3g "
           "(tolerance %.3g)", name, maxerr, tol);
    result(maxstat <= 1e-5, "attention forward %s stats = max + log(sum): max error %.3g", name, maxstat);
    /* The bf16 P must really be rounded: with f32 P the error is far smaller. */
    if (io == CUDNN_DATA_BFLOAT16)
        result(maxerr > 1e-6, "attention forward bf16: the bf16 P and O are rounded (error %.3g > 1e-6)", maxerr);
    destroy_all();
    free(q), free(k), free(v), free(o), free(stats), free(qd), free(kd), free(vd);
}

/* ----------------------------------------------------------- f. errors */

static void expect_status(cudnnStatus_t got, cudnnStatus_t want, const char *needle, const char *what) {
    char msg[512];
    cudnnGetLastErrorString(msg, sizeof msg);
    int ok = got == want && (!needle || strstr(msg, needle));
    result(ok, "%s: %s (expected %s)%s%s", what, cudnnGetErrorString(got), cudnnGetErrorString(want),
           needle ? ", message: " : "", needle ? msg : "");
}

static void error_cases(void) {
    int64_t d2[] = {2, 3}, s2[] = {3, 1}, d3[] = {3, 3}, d4[] = {4, 2};
    bd_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int32_t uid32 = 1;
    cudnnDataType_t two_types[2] = {CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT};
    expect_status(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT32, 1, &uid32),
                  CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_TENSOR_UNIQUE_ID", "UNIQUE_ID set as INT32");
    expect_status(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 2, two_types),
                  CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_TENSOR_DATA_TYPE", "DATA_TYPE with 2 elements");
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    expect_status(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 9, nine),
                  CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_TENSOR_DIMENSIONS", "9 dimensions");
    /* Missing strides. */
    set_dtype(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 2, d2);
    set_i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, 1);
    set_i64(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    expect_status(cudnnBackendFinalize(t), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_TENSOR_STRIDES",
                  "tensor finalized without strides");
    int64_t s3[] = {3, 1, 1};
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 3, s3);
    expect_status(cudnnBackendFinalize(t), CUDNN_STATUS_BAD_PARAM, "strides", "2 dims with 3 strides");
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 2, s2);
    expect_status(cudnnBackendFinalize(t), CUDNN_STATUS_SUCCESS, NULL, "the same tensor completed");
    expect_status(set_i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, 2), CUDNN_STATUS_NOT_INITIALIZED, "finalized",
                  "set on a finalized tensor");
    bd_t u = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t got = 0, cnt = 0;
    expect_status(cudnnBackendGetAttribute(u, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &cnt, &got),
                  CUDNN_STATUS_NOT_INITIALIZED, "not finalized", "get on an unfinalized tensor");
    CHECK(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 0, &cnt, NULL));
    result(cnt == 2, "get DIMENSIONS with 0 requested reports the count 2 (got %lld)", (long long)cnt);

    /* Unsupported things. */
    bd_t conv = NULL;
    expect_status(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv),
                  CUDNN_STATUS_NOT_SUPPORTED, "not modelled", "CONVOLUTION descriptor");
    bd_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnPointwiseMode_t tanh_mode = CUDNN_POINTWISE_TANH_FWD;
    cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &tanh_mode);
    set_dtype(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
    expect_status(cudnnBackendFinalize(pw), CUDNN_STATUS_NOT_SUPPORTED, "mode", "pointwise TANH_FWD");
    bd_t pw2 = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnPointwiseMode_t gi = CUDNN_POINTWISE_GEN_INDEX;
    cudnnBackendSetAttribute(pw2, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &gi);
    set_dtype(pw2, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
    expect_status(cudnnBackendFinalize(pw2), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_POINTWISE_AXIS",
                  "GEN_INDEX without an axis");
    bd_t red = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnReduceTensorOp_t amax = CUDNN_REDUCE_TENSOR_AMAX;
    cudnnBackendSetAttribute(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &amax);
    set_dtype(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    expect_status(cudnnBackendFinalize(red), CUDNN_STATUS_NOT_SUPPORTED, "operator", "reduction AMAX");
    bd_t mmd = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set_dtype(mmd, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_HALF);
    expect_status(cudnnBackendFinalize(mmd), CUDNN_STATUS_NOT_SUPPORTED, "compute type", "matmul HALF compute");
    bd_t opm = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    expect_status(set_desc(opm, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, t), CUDNN_STATUS_NOT_SUPPORTED,
                  "GEMM_M_OVERRIDE", "matmul M override");
    bd_t tu = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    cudnnDataType_t fp8 = CUDNN_DATA_FP8_E4M3;
    expect_status(cudnnBackendSetAttribute(tu, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &fp8),
                  CUDNN_STATUS_NOT_SUPPORTED, "data type", "FP8 tensor");
    expect_status(set_i64(tu, CUDNN_ATTR_MATMUL_COMP_TYPE, 0), CUDNN_STATUS_NOT_SUPPORTED, "TENSOR",
                  "a MATMUL attribute on a TENSOR");

    /* Operation checks. */
    bd_t ta, tb, tc, tbad;
    NONNULL(ta = tensor(1, CUDNN_DATA_FLOAT, 2, d2, NULL, 0));
    NONNULL(tb = tensor(2, CUDNN_DATA_FLOAT, 2, d3, NULL, 0));
    NONNULL(tc = tensor(3, CUDNN_DATA_FLOAT, 2, d4, NULL, 0));
    bd_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set_dtype(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    cudnnBackendFinalize(mm);
    bd_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, ta);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, tb);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    expect_status(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_OPERATION_MATMUL_CDESC",
                  "matmul without CDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, tc);
    expect_status(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM, "does not give", "matmul [2,3]x[3,3] -> [4,2]");
    expect_status(set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, u), CUDNN_STATUS_BAD_PARAM, "not finalized",
                  "an unfinalized tensor as ADESC");
    expect_status(set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, mm), CUDNN_STATUS_BAD_PARAM, "MATMUL descriptor",
                  "a MATMUL descriptor as ADESC");
    int64_t d23[] = {2, 3}, d33[] = {3, 3};
    NONNULL(tbad = tensor(4, CUDNN_DATA_FLOAT, 2, d23, NULL, 0));
    bd_t ty33;
    NONNULL(ty33 = tensor(5, CUDNN_DATA_FLOAT, 2, d33, NULL, 0));
    bd_t padd = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnPointwiseMode_t addm = CUDNN_POINTWISE_ADD;
    cudnnBackendSetAttribute(padd, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &addm);
    set_dtype(padd, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
    cudnnBackendFinalize(padd);
    bd_t opp = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, padd);
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, ty33);
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, ty33);
    expect_status(cudnnBackendFinalize(opp), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_OPERATION_POINTWISE_BDESC",
                  "ADD without BDESC");
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tbad);
    expect_status(cudnnBackendFinalize(opp), CUDNN_STATUS_BAD_PARAM, "broadcast", "ADD of [3,3] and [2,3] into [3,3]");
    int64_t d31[] = {3, 1};
    bd_t t31;
    NONNULL(t31 = tensor(6, CUDNN_DATA_FLOAT, 2, d31, NULL, 0));
    bd_t opr = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    bd_t rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnReduceTensorOp_t addr = CUDNN_REDUCE_TENSOR_ADD;
    cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &addr);
    set_dtype(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    cudnnBackendFinalize(rd);
    set_desc(opr, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tbad);
    set_desc(opr, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, t31);
    set_desc(opr, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    expect_status(cudnnBackendFinalize(opr), CUDNN_STATUS_BAD_PARAM, "reduction", "reduce [2,3] to [3,1]");
    destroy_all();

    /* Graph checks: duplicate uids, two writers, cycles, virtual inputs. */
    int64_t d22[] = {2, 2}, d12[] = {1, 2};
    bd_t x1, x1other, y1, y2, v1, v2;
    NONNULL(x1 = tensor(1, CUDNN_DATA_FLOAT, 2, d22, NULL, 0));
    NONNULL(x1other = tensor(1, CUDNN_DATA_FLOAT, 2, d12, NULL, 0)); /* same uid, other shape */
    NONNULL(y1 = tensor(2, CUDNN_DATA_FLOAT, 2, d22, NULL, 0));
    NONNULL(y2 = tensor(3, CUDNN_DATA_FLOAT, 2, d22, NULL, 0));
    NONNULL(v1 = tensor(10, CUDNN_DATA_FLOAT, 2, d22, NULL, VIRT));
    NONNULL(v2 = tensor(11, CUDNN_DATA_FLOAT, 2, d22, NULL, VIRT));
    cudnnStatus_t st;
    {
        bd_t ops[] = {pointwise(CUDNN_POINTWISE_ADD, x1, x1other, NULL, y1, 0)};
        plan_for(ops, 1, &st);
        expect_status(st, CUDNN_STATUS_BAD_PARAM, "unique id 1", "two different tensors with unique id 1");
    }
    {
        bd_t ops[] = {pointwise(CUDNN_POINTWISE_NEG, x1, NULL, NULL, y1, 0),
                      pointwise(CUDNN_POINTWISE_EXP, x1, NULL, NULL, y1, 0)};
        plan_for(ops, 2, &st);
        expect_status(st, CUDNN_STATUS_BAD_PARAM, "output of operations", "two operations writing tensor 2");
    }
    {
        bd_t ops[] = {pointwise(CUDNN_POINTWISE_NEG, v1, NULL, NULL, v2, 0),
                      pointwise(CUDNN_POINTWISE_EXP, v2, NULL, NULL, v1, 0),
                      pointwise(CUDNN_POINTWISE_EXP, v2, NULL, NULL, y2, 0)};
        plan_for(ops, 3, &st);
        expect_status(st, CUDNN_STATUS_BAD_PARAM, "cycle", "a cycle of virtual tensors");
    }
    {
        bd_t ops[] = {pointwise(CUDNN_POINTWISE_NEG, v1, NULL, NULL, y2, 0)};
        plan_for(ops, 1, &st);
        expect_status(st, CUDNN_STATUS_BAD_PARAM, "virtual tensor 10", "reading a virtual tensor nobody writes");
    }
    {
        bd_t g = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        expect_status(cudnnBackendFinalize(g), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_OPERATIONGRAPH_OPS",
                      "graph without operations");
        bd_t e = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        expect_status(cudnnBackendFinalize(e), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_ENGINE_OPERATION_GRAPH",
                      "engine without a graph");
        bd_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        expect_status(cudnnBackendFinalize(plan), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG",
                      "plan without an engine config");
    }
    {
        /* Engine by global index (the frontend's other path), and execute
         * errors: missing pointer, misaligned pointer. */
        bd_t ops[] = {pointwise(CUDNN_POINTWISE_NEG, x1, NULL, NULL, y1, 0)};
        bd_t g = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        CHECK(cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops));
        CHECK(cudnnBackendFinalize(g));
        int64_t engines = 0;
        CHECK(cudnnBackendGetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &cnt,
                                       &engines));
        result(engines == 1, "graph reports 1 engine (got %lld)", (long long)engines);
        bd_t e = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        CHECK(set_desc(e, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, g));
        CHECK(set_i64(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 3));
        expect_status(cudnnBackendFinalize(e), CUDNN_STATUS_BAD_PARAM, "global index", "engine global index 3");
        bd_t e0 = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        CHECK(set_desc(e0, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, g));
        CHECK(set_i64(e0, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 0));
        CHECK(cudnnBackendFinalize(e0));
        bd_t cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        CHECK(set_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, e0));
        CHECK(cudnnBackendFinalize(cfg));
        bd_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        CHECK(set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg));
        CHECK(cudnnBackendFinalize(plan));
        /* The graph's descriptors may go before the plan runs. */
        AL float xin[5] = {1, 2, 3, 4, 0}, yout[4];
        int64_t uid1[] = {1};
        void *p1[] = {xin};
        expect_status(execute(plan, 1, uid1, p1), CUDNN_STATUS_BAD_PARAM, "tensor 2", "execute without tensor 2");
        int64_t uids[] = {1, 2};
        void *mis[] = {(char *)xin + 4, yout};
        expect_status(execute(plan, 2, uids, mis), CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "aligned",
                      "execute with a pointer off its 16-byte alignment");
        bd_t vp = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
        CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 2, uids));
        CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 2, mis));
        expect_status(cudnnBackendFinalize(vp), CUDNN_STATUS_BAD_PARAM, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE",
                      "variant pack without a workspace");
        float *xa = aligned_alloc(16, 16), *ya = aligned_alloc(16, 16);
        memcpy(xa, xin, 16);
        void *ok[] = {xa, ya};
        CHECK(execute(plan, 2, uids, ok));
        result(ya[0] == -1 && ya[3] == -4, "engine by global index 0 with a manual engine config runs NEG");
        free(xa), free(ya);
    }
    destroy_all();
}

/* ------------------------------------------- g. reshape, grouped batches */

static float io_load(const void *p, int64_t i, cudnnDataType_t t) {
    return t == CUDNN_DATA_FLOAT ? ((const float *)p)[i]
           : t == CUDNN_DATA_HALF ? f16_to_f32(((const uint16_t *)p)[i]) : bf16_to_f32(((const uint16_t *)p)[i]);
}

static void io_store(void *p, int64_t i, cudnnDataType_t t, float v) {
    if (t == CUDNN_DATA_FLOAT) ((float *)p)[i] = v;
    else if (t == CUDNN_DATA_HALF) ((uint16_t *)p)[i] = f32_to_f16(v);
    else ((uint16_t *)p)[i] = f32_to_bf16(v);
}

static void reshape_and_group_case(void) {
    /* RESHAPE as cudnn-frontend's sdpa_backward uses it: an f32 [1,2,3,4]
     * seen transposed as a bf16 [1,2,4,3] (strides permuted), then copied
     * out packed by IDENTITY. */
    int64_t xd[] = {1, 2, 3, 4}, yd[] = {1, 2, 4, 3}, ys[] = {24, 12, 1, 4};
    AL float x[24];
    AL uint16_t out[24];
    for (int i = 0; i < 24; i++) x[i] = 1.0f + (float)i / 256.0f + (i % 3 ? 0x1p-9f : 0.0f);
    bd_t tx, vy, to;
    NONNULL(tx = tensor(1, CUDNN_DATA_FLOAT, 4, xd, NULL, 0));
    NONNULL(vy = tensor(100, CUDNN_DATA_BFLOAT16, 4, yd, ys, VIRT));
    NONNULL(to = tensor(2, CUDNN_DATA_BFLOAT16, 4, yd, NULL, 0));
    bd_t rs = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    CHECK(set_desc(rs, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tx));
    CHECK(set_desc(rs, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, vy));
    CHECK(cudnnBackendFinalize(rs));
    PLAN(plan, rs, pointwise(CUDNN_POINTWISE_IDENTITY, vy, NULL, NULL, to, 0));
    int64_t uids[] = {1, 2};
    void *ptrs[] = {x, out};
    CHECK(execute(plan, 2, uids, ptrs));
    int bad = 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) bad += out[(h * 4 + j) * 3 + i] != f32_to_bf16(x[(h * 3 + i) * 4 + j]);
    result(!bad, "RESHAPE f32 [1,2,3,4] -> bf16 [1,2,4,3] by permuted strides (a transposed view, rounded): %d wrong",
           bad);
    destroy_all();

    /* Reshapes that are not views of the same memory. */
    int64_t d12[] = {1, 12}, d13[] = {1, 13}, s_gap[] = {1, 2, 8, 24};
    bd_t a, b2;
    NONNULL(a = tensor(1, CUDNN_DATA_FLOAT, 2, d12, NULL, 0));
    NONNULL(b2 = tensor(2, CUDNN_DATA_FLOAT, 2, d13, NULL, 0));
    bd_t rs2 = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(rs2, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, a);
    set_desc(rs2, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, b2);
    expect_status(cudnnBackendFinalize(rs2), CUDNN_STATUS_BAD_PARAM, "element counts", "RESHAPE [1,12] -> [1,13]");
    bd_t g1, g2;
    NONNULL(g1 = tensor(3, CUDNN_DATA_FLOAT, 4, xd, NULL, 0));
    NONNULL(g2 = tensor(4, CUDNN_DATA_FLOAT, 4, xd, s_gap, 0));
    bd_t rs3 = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(rs3, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, g1);
    set_desc(rs3, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, g2);
    expect_status(cudnnBackendFinalize(rs3), CUDNN_STATUS_NOT_SUPPORTED, "view",
                  "RESHAPE between a packed and a gapped layout");
    destroy_all();

    /* Grouped batch dims (grouped-query attention): C[h] = A[h] x B[h / 2]
     * for 4 query heads on 2 kv heads, and a reduction of 4 heads onto 2
     * summing consecutive pairs. */
    enum { H = 4, G = 2, M = 2, K = 3, N = 2 };
    int64_t ad[] = {1, H, M, K}, bd[] = {1, H / G, K, N}, cd[] = {1, H, M, N}, rd[] = {1, H / G, M, N};
    AL float A[H * M * K], B[H / G * K * N], C[H * M * N], R[H / G * M * N];
    fill_ints(A, H * M * K, 11, -3, 3);
    fill_ints(B, H / G * K * N, 12, -3, 3);
    bd_t ta, tb, tc, tr;
    NONNULL(ta = tensor(1, CUDNN_DATA_FLOAT, 4, ad, NULL, 0));
    NONNULL(tb = tensor(2, CUDNN_DATA_FLOAT, 4, bd, NULL, 0));
    NONNULL(tc = tensor(3, CUDNN_DATA_FLOAT, 4, cd, NULL, 0));
    NONNULL(tr = tensor(4, CUDNN_DATA_FLOAT, 4, rd, NULL, 0));
    PLAN(plan2, matmul(ta, tb, tc), reduction(CUDNN_REDUCE_TENSOR_ADD, tc, tr));
    int64_t u2[] = {1, 2, 3, 4};
    void *p2[] = {A, B, C, R};
    CHECK(execute(plan2, 4, u2, p2));
    int badc = 0, badr = 0;
    for (int h = 0; h < H; h++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                float ref = 0;
                for (int k = 0; k < K; k++) ref += A[(h * M + m) * K + k] * B[((h / G) * K + k) * N + n];
                badc += C[(h * M + m) * N + n] != ref;
            }
    for (int hk = 0; hk < H / G; hk++)
        for (int i = 0; i < M * N; i++) {
            float ref = 0;
            for (int g = 0; g < G; g++) ref += C[(hk * G + g) * M * N + i];
            badr += R[hk * M * N + i] != ref;
        }
    result(!badc, "matmul with grouped batch: 4 heads of A on 2 heads of B (head h uses h / 2): %d wrong", badc);
    result(!badr, "reduction ADD of 4 heads onto 2 (consecutive pairs summed): %d wrong", badr);
    destroy_all();

    int64_t b3[] = {1, 3, K, N};
    NONNULL(ta = tensor(1, CUDNN_DATA_FLOAT, 4, ad, NULL, 0));
    NONNULL(tb = tensor(2, CUDNN_DATA_FLOAT, 4, b3, NULL, 0));
    NONNULL(tc = tensor(3, CUDNN_DATA_FLOAT, 4, cd, NULL, 0));
    bd_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set_dtype(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    cudnnBackendFinalize(mm);
    bd_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, ta);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, tb);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, tc);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    expect_status(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM, "does not give",
                  "matmul batch of 4 heads on 3 (not a divisor)");
    /* Pointwise broadcasting stays 1-vs-n. */
    int64_t x2[] = {1, 2, M, N};
    bd_t t2;
    NONNULL(t2 = tensor(5, CUDNN_DATA_FLOAT, 4, x2, NULL, 0));
    bd_t addpw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnPointwiseMode_t addm = CUDNN_POINTWISE_ADD;
    cudnnBackendSetAttribute(addpw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &addm);
    set_dtype(addpw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
    cudnnBackendFinalize(addpw);
    bd_t opp = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, addpw);
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tc);
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, t2);
    set_desc(opp, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tc);
    expect_status(cudnnBackendFinalize(opp), CUDNN_STATUS_BAD_PARAM, "broadcast",
                  "pointwise ADD of [1,4,2,2] and [1,2,2,2] (no grouped broadcast)");
    /* Math precisions: BOOLEAN/INT32 for compares, not for arithmetic. */
    bd_t cmp = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnPointwiseMode_t ge = CUDNN_POINTWISE_CMP_GE;
    cudnnBackendSetAttribute(cmp, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &ge);
    set_dtype(cmp, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_BOOLEAN);
    expect_status(cudnnBackendFinalize(cmp), CUDNN_STATUS_SUCCESS, NULL, "CMP_GE with BOOLEAN math precision");
    bd_t addb = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnBackendSetAttribute(addb, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &addm);
    set_dtype(addb, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_INT32);
    expect_status(cudnnBackendFinalize(addb), CUDNN_STATUS_NOT_SUPPORTED, "math precision",
                  "ADD with INT32 math precision");
    destroy_all();
}

/* ------------------------------------------------------- h. attention bwd */

/* The sdpa_backward graph as cudnn-frontend composes it (9.x before the
 * native SDPA operations): softmax_sum = rowsum(dO * O) * 1; P = exp(Q K^T *
 * scale - stats) causally masked; dV = P^T dO; dS = (dO V^T - softmax_sum)
 * * P * scale; dK = dS^T Q; dQ_accum = dS K, dQ = IDENTITY(dQ_accum); with
 * Hq != Hkv the kv gradients go through [B, Hq, ..] and a head reduction.
 * Against attention's gradients in double. */
static void attention_backward_case(cudnnDataType_t io, int Hq, int Hkv) {
    enum { B = 1, S = 6, D = 8 };
    const int G = Hq / Hkv;
    const char *name = io == CUDNN_DATA_HALF ? "f16" : "bf16";
    const int64_t nq = (int64_t)B * S * Hq * D, nk = (int64_t)B * S * Hkv * D;
    uint16_t *q = aligned_alloc(16, nq * 2), *o = aligned_alloc(16, nq * 2), *dout = aligned_alloc(16, nq * 2);
    uint16_t *dq = aligned_alloc(16, nq * 2), *k = aligned_alloc(16, nk * 2), *v = aligned_alloc(16, nk * 2);
    uint16_t *dk = aligned_alloc(16, nk * 2), *dv = aligned_alloc(16, nk * 2);
    float *stats = aligned_alloc(16, (size_t)B * Hq * S * 4 + 16), *ssum = aligned_alloc(16, (size_t)B * Hq * S * 4 + 16);
    float *acc = aligned_alloc(16, nq * 4);
    double *P = malloc((size_t)B * Hq * S * S * sizeof *P), *dref_q = calloc(nq, sizeof(double));
    double *dref_k = calloc(nk, sizeof(double)), *dref_v = calloc(nk, sizeof(double));
    uint32_t seed = 777;
    for (int64_t i = 0; i < nq; i++) io_store(q, i, io, (float)uniform(&seed)), io_store(dout, i, io, (float)uniform(&seed));
    for (int64_t i = 0; i < nk; i++) io_store(k, i, io, (float)uniform(&seed)), io_store(v, i, io, (float)uniform(&seed));
    const float scale = 1.0f / sqrtf((float)D);
    /* BSHD memory: element (b, h, s, d) of a tensor with H heads. */
#define AT(H_, b_, h_, s_, d_) ((((int64_t)(b_) * S + (s_)) * (H_) + (h_)) * D + (d_))
    /* Forward in double: P, O (rounded to io, as the forward would store
     * it) and stats (f32). */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < S; i++) {
                double sc[S], m = -INFINITY, z = 0;
                for (int j = 0; j <= i; j++) {
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += io_load(q, AT(Hq, b, h, i, d), io) * (double)io_load(k, AT(Hkv, b, h / G, j, d), io);
                    sc[j] = dot * scale;
                    m = fmax(m, sc[j]);
                }
                for (int j = 0; j <= i; j++) z += exp(sc[j] - m);
                stats[(b * Hq + h) * S + i] = (float)(m + log(z));
                for (int j = 0; j < S; j++) P[((b * Hq + h) * S + i) * S + j] = j <= i ? exp(sc[j] - m) / z : 0;
                for (int d = 0; d < D; d++) {
                    double od = 0;
                    for (int j = 0; j <= i; j++)
                        od += P[((b * Hq + h) * S + i) * S + j] * io_load(v, AT(Hkv, b, h / G, j, d), io);
                    io_store(o, AT(Hq, b, h, i, d), io, (float)od);
                }
            }
    /* Gradients in double from the rounded O. */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < S; i++) {
                double Di = 0;
                for (int d = 0; d < D; d++) Di += io_load(dout, AT(Hq, b, h, i, d), io) * (double)io_load(o, AT(Hq, b, h, i, d), io);
                for (int j = 0; j <= i; j++) {
                    double p = P[((b * Hq + h) * S + i) * S + j], dp = 0;
                    for (int d = 0; d < D; d++) dp += io_load(dout, AT(Hq, b, h, i, d), io) * (double)io_load(v, AT(Hkv, b, h / G, j, d), io);
                    double ds = p * (dp - Di) * scale;
                    for (int d = 0; d < D; d++) {
                        dref_q[AT(Hq, b, h, i, d)] += ds * io_load(k, AT(Hkv, b, h / G, j, d), io);
                        dref_k[AT(Hkv, b, h / G, j, d)] += ds * io_load(q, AT(Hq, b, h, i, d), io);
                        dref_v[AT(Hkv, b, h / G, j, d)] += p * io_load(dout, AT(Hq, b, h, i, d), io);
                    }
                }
            }
    enum { UQ = 1, UK, UV, UO, UDO, USTATS, USCALE, UNEG, UONE, UDQ, UDK, UDV, USSUM, UACC };
    int64_t qdim[] = {B, Hq, S, D}, qstr[] = {S * Hq * D, D, Hq * D, 1};
    int64_t kdim[] = {B, Hkv, S, D}, kstr[] = {S * Hkv * D, D, Hkv * D, 1};
    int64_t ktdim[] = {B, Hkv, D, S}, ktstr[] = {S * Hkv * D, D, 1, Hkv * D};
    int64_t sdim[] = {B, Hq, S, S}, rdim[] = {B, Hq, S, 1}, one4[] = {1, 1, 1, 1};
    int64_t tstr[] = {Hq * S * S, S * S, 1, S}, accstr[] = {Hq * S * D, S * D, D, 1};
    bd_t tq, tkt, tvt, to, tdo, tst, tsc, tneg, tone, tdq, tdk, tdv, tss, tacc;
    NONNULL(tq = tensor(UQ, io, 4, qdim, qstr, 0));
    NONNULL(tkt = tensor(UK, io, 4, ktdim, ktstr, 0));
    NONNULL(tvt = tensor(UV, io, 4, ktdim, ktstr, 0));
    NONNULL(to = tensor(UO, io, 4, qdim, qstr, 0));
    NONNULL(tdo = tensor(UDO, io, 4, qdim, qstr, 0));
    NONNULL(tst = tensor(USTATS, CUDNN_DATA_FLOAT, 4, rdim, NULL, 0));
    NONNULL(tsc = tensor(USCALE, CUDNN_DATA_FLOAT, 4, one4, one4, BYVAL));
    NONNULL(tneg = tensor(UNEG, CUDNN_DATA_FLOAT, 4, one4, one4, BYVAL));
    NONNULL(tone = tensor(UONE, CUDNN_DATA_FLOAT, 4, one4, one4, BYVAL));
    NONNULL(tdq = tensor(UDQ, io, 4, qdim, qstr, 0));
    NONNULL(tdk = tensor(UDK, io, 4, kdim, kstr, 0));
    NONNULL(tdv = tensor(UDV, io, 4, kdim, kstr, 0));
    NONNULL(tss = tensor(USSUM, CUDNN_DATA_FLOAT, 4, rdim, NULL, 0));
    NONNULL(tacc = tensor(UACC, CUDNN_DATA_FLOAT, 4, qdim, accstr, 0));
    int64_t u = 100;
    bd_t doo, rs, s1, s2, s3, row, col, keep, s4, p, pt, dp, ds1, ds2, ds, dst, kk, dvf = NULL, dkf = NULL;
    NONNULL(doo = tensor(u++, CUDNN_DATA_FLOAT, 4, qdim, NULL, VIRT));
    NONNULL(rs = tensor(u++, CUDNN_DATA_FLOAT, 4, rdim, NULL, VIRT));
    NONNULL(s1 = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(s2 = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(s3 = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(row = tensor(u++, CUDNN_DATA_INT32, 4, sdim, NULL, VIRT));
    NONNULL(col = tensor(u++, CUDNN_DATA_INT32, 4, sdim, NULL, VIRT));
    NONNULL(keep = tensor(u++, CUDNN_DATA_BOOLEAN, 4, sdim, NULL, VIRT));
    NONNULL(s4 = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(p = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(pt = tensor(u++, io, 4, sdim, tstr, VIRT));
    NONNULL(dp = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(ds1 = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(ds2 = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(ds = tensor(u++, CUDNN_DATA_FLOAT, 4, sdim, NULL, VIRT));
    NONNULL(dst = tensor(u++, io, 4, sdim, tstr, VIRT));
    NONNULL(kk = tensor(u++, io, 4, kdim, kstr, VIRT));
    if (G > 1) {
        NONNULL(dvf = tensor(u++, io, 4, qdim, accstr, VIRT));
        NONNULL(dkf = tensor(u++, io, 4, qdim, accstr, VIRT));
    }
    bd_t rs_pt = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR), rs_dst = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    bd_t rs_k = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    CHECK(set_desc(rs_pt, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, p));
    CHECK(set_desc(rs_pt, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, pt));
    CHECK(cudnnBackendFinalize(rs_pt));
    CHECK(set_desc(rs_dst, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, ds));
    CHECK(set_desc(rs_dst, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, dst));
    CHECK(cudnnBackendFinalize(rs_dst));
    CHECK(set_desc(rs_k, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tkt));
    CHECK(set_desc(rs_k, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, kk));
    CHECK(cudnnBackendFinalize(rs_k));
    bd_t ops[32];
    int n = 0;
    ops[n++] = pointwise(CUDNN_POINTWISE_MUL, tdo, to, NULL, doo, 0);
    ops[n++] = reduction(CUDNN_REDUCE_TENSOR_ADD, doo, rs);
    ops[n++] = pointwise(CUDNN_POINTWISE_MUL, rs, tone, NULL, tss, 0);
    ops[n++] = matmul(tq, tkt, s1);
    ops[n++] = pointwise(CUDNN_POINTWISE_MUL, s1, tsc, NULL, s2, 0);
    ops[n++] = pointwise(CUDNN_POINTWISE_SUB, s2, tst, NULL, s3, 0);
    ops[n++] = pointwise(CUDNN_POINTWISE_GEN_INDEX, s3, NULL, NULL, row, 2);
    ops[n++] = pointwise(CUDNN_POINTWISE_GEN_INDEX, s3, NULL, NULL, col, 3);
    ops[n++] = pointwise(CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, 0);
    ops[n++] = pointwise(CUDNN_POINTWISE_BINARY_SELECT, s3, tneg, keep, s4, 0);
    ops[n++] = pointwise(CUDNN_POINTWISE_EXP, s4, NULL, NULL, p, 0);
    ops[n++] = rs_pt;
    if (G > 1) {
        ops[n++] = matmul(pt, tdo, dvf);
        ops[n++] = reduction(CUDNN_REDUCE_TENSOR_ADD, dvf, tdv);
    } else {
        ops[n++] = matmul(pt, tdo, tdv);
    }
    ops[n++] = matmul(tdo, tvt, dp);
    ops[n++] = pointwise(CUDNN_POINTWISE_SUB, dp, tss, NULL, ds1, 0);
    ops[n++] = pointwise(CUDNN_POINTWISE_MUL, ds1, p, NULL, ds2, 0);
    ops[n++] = pointwise(CUDNN_POINTWISE_MUL, ds2, tsc, NULL, ds, 0);
    ops[n++] = rs_dst;
    if (G > 1) {
        ops[n++] = matmul(dst, tq, dkf);
        ops[n++] = reduction(CUDNN_REDUCE_TENSOR_ADD, dkf, tdk);
    } else {
        ops[n++] = matmul(dst, tq, tdk);
    }
    ops[n++] = rs_k;
    ops[n++] = matmul(ds, kk, tacc);
    ops[n++] = pointwise(CUDNN_POINTWISE_IDENTITY, tacc, NULL, NULL, tdq, 0);
    for (int i = 0; i < n; i++) NONNULL(ops[i]);
    cudnnStatus_t st;
    bd_t plan = plan_for(ops, n, &st);
    NONNULL(plan);
    AL float neg = -INFINITY, onef = 1.0f, sc = scale;
    int64_t uids[] = {UQ, UK, UV, UO, UDO, USTATS, USCALE, UNEG, UONE, UDQ, UDK, UDV, USSUM, UACC};
    void *ptrs[] = {q, k, v, o, dout, stats, &sc, &neg, &onef, dq, dk, dv, ssum, acc};
    CHECK(execute(plan, 14, uids, ptrs));
    double eq = 0, ek = 0, ev = 0, mq = 0, mk = 0, mv = 0;
    for (int64_t i = 0; i < nq; i++)
        eq = fmax(eq, fabs(io_load(dq, i, io) - dref_q[i])), mq = fmax(mq, fabs(dref_q[i]));
    for (int64_t i = 0; i < nk; i++) {
        ek = fmax(ek, fabs(io_load(dk, i, io) - dref_k[i])), mk = fmax(mk, fabs(dref_k[i]));
        ev = fmax(ev, fabs(io_load(dv, i, io) - dref_v[i])), mv = fmax(mv, fabs(dref_v[i]));
    }
    /* P^T and dS^T are rounded to the I/O type before their matmuls, and
     * the outputs are: bf16 errors of a few 2^-9 relative. */
    double tol = io == CUDNN_DATA_HALF ? 1e-3 : 8e-3;
    result(eq <= tol * mq && ek <= tol * mk && ev <= tol * mv,
           "attention backward %s Hq=%d Hkv=%d (causal, BSHD): max error dQ %.3g of %.3g, dK %.3g of %.3g, dV %.3g "
           "of %.3g (tolerance %.0e relative)", name, Hq, Hkv, eq, mq, ek, mk, ev, mv, tol);
    int badsum = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < S; i++) {
                double Di = 0;
                for (int d = 0; d < D; d++) Di += io_load(dout, AT(Hq, b, h, i, d), io) * (double)io_load(o, AT(Hq, b, h, i, d), io);
                badsum += fabs(ssum[(b * Hq + h) * S + i] - Di) > 1e-5;
            }
    result(!badsum, "attention backward %s Hq=%d Hkv=%d: softmax_sum = rowsum(dO * O) written: %d wrong", name, Hq,
           Hkv, badsum);
#undef AT
    destroy_all();
    free(q), free(o), free(dout), free(dq), free(k), free(v), free(dk), free(dv), free(stats), free(ssum), free(acc);
    free(P), free(dref_q), free(dref_k), free(dref_v);
}

int main(void) {
    if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
        printf("FAIL cudnnCreate\n");
        return 1;
    }
    result(cudnnGetVersion() == CUDNN_VERSION, "cudnnGetVersion() = CUDNN_VERSION (%zu)", cudnnGetVersion());
    matmul_case();
    pointwise_case();
    reduction_case();
    mask_case();
    attention_case(CUDNN_DATA_FLOAT);
    attention_case(CUDNN_DATA_BFLOAT16);
    reshape_and_group_case();
    attention_backward_case(CUDNN_DATA_BFLOAT16, 2, 2);
    attention_backward_case(CUDNN_DATA_HALF, 4, 2);
    error_cases();
    cudnnDestroy(handle);
    if (failures) {
        printf("%d of %d cases FAILED\n", failures, failures + passes);
        return 1;
    }
    printf("all %d cases passed\n", passes);
    return 0;
}
