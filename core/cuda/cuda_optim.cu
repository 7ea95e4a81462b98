/*
 * cuda_optim.cu: the fused optimizer updates (AdamW, AnyPrecisionAdamW,
 * SGD, Adadelta) and the two kernels of clip-by-global-norm on the GPU.
 *
 * Each update is one kernel launch over a flat shard (or one per batch of
 * tensors of a multi-tensor step: [Note: multi-tensor updates]), doing
 * exactly the CPU loop's operations (the .c files of core/optim) on the
 * same f32 constants (backend.h): every
 * operand is read as f32, each value is rounded once when stored (nearest
 * even), and the arithmetic is written with the _rn intrinsics, which nvcc
 * never contracts into fused multiply-adds. The CPU build has no FMA
 * either (x86-64 baseline), IEEE division and square roots are correctly
 * rounded on both, so a GPU step gives the CPU's bits.
 *
 * The sum of squares keeps grad_norm.c's chunks and its order of additions
 * (four interleaved accumulators per chunk, chunks in order): one thread
 * per accumulator on the device, the chunks added on the host, so the GPU
 * gives the CPU's bits there too.
 */
#include "cuda_common.cuh"
#include "cuda_vec.cuh"

extern "C" {
#include "backend.h"
}

#include <stdlib.h>

#define ADD __fadd_rn
#define SUB __fsub_rn
#define MUL __fmul_rn
#define DIV __fdiv_rn

/* The operands by value: data and stored dtype (NULL and f32 when
 * absent), and bit k of `read` / `write` set when operand k is read /
 * stored by this update. */
struct operands {
    void *p[FL_OPTIM_MAX_OPERANDS];
    int dt[FL_OPTIM_MAX_OPERANDS];
    unsigned read, write;
};

/* x as it reads back after being stored as dtype d (fl_optim_round). */
__device__ __forceinline__ float rounded(int d, float x) {
    if (d == FL_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    if (d == FL_F16) return __half2float(__float2half_rn(x));
    return x;
}

/* Threads per block of every kernel here. */
enum { THREADS = 256 };

#define FOR_EACH_ELEMENT(i, n)                                                                     \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                     \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- the updates of one element ---------------------------------------------------
 * Each takes x[k], operand k's value as f32 (0 for one not read), and
 * leaves there the values of the operands it writes, unrounded: storing
 * rounds them. The scalar and the vector kernels below run the same
 * functor, so the path taken never changes a bit. */

/* adamw.c: decay, lerp of m (PyTorch's two branches), v, then the param.
 * (fixed<PD, SD>: the functor for the vector kernel of those dtypes; only
 * AnyPrecisionAdamW's depends on them.) */
struct adamw_op {
    fl_adamw_ctx c;
    template <int PD, int SD> adamw_op fixed() const { return *this; }
    __device__ __forceinline__ void operator()(float *x) const {
        float w = c.weight1, one_minus_w = SUB(1.0f, c.weight1);
        bool far = !(w < 0.5f);
        float p = x[0], g = x[1], m = x[2], v = x[3];
        m = far ? SUB(g, MUL(SUB(g, m), one_minus_w)) : ADD(m, MUL(w, SUB(g, m)));
        v = ADD(MUL(v, c.beta2), MUL(MUL(c.one_minus_beta2, g), g));
        float denom = ADD(DIV(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
        x[0] = ADD(MUL(p, c.decay), DIV(MUL(c.neg_step_size, m), denom));
        x[2] = m;
        x[3] = v;
    }
};

/* anyprecision_adamw.c: EMA moments rounded to their dtypes, the step from
 * the rounded values, Kahan-compensated when operand 4 is present. pd, md,
 * vd: the stored dtypes of param, exp_avg and exp_avg_sq, unless PD (the
 * param's) and SD (both moments') fix them at compile time, which keeps
 * the unrolled vector kernel free of their branches. */
template <int PD = -1, int SD = -1> struct anyprecision_op {
    fl_anyprecision_ctx c;
    int pd, md, vd;
    template <int P, int S> anyprecision_op<P, S> fixed() const { return {c, pd, md, vd}; }
    __device__ __forceinline__ void operator()(float *x) const {
        int pd = PD >= 0 ? PD : this->pd, md = SD >= 0 ? SD : this->md, vd = SD >= 0 ? SD : this->vd;
        float p = x[0], g = x[1];
        float m = rounded(md, ADD(MUL(x[2], c.beta1), MUL(c.one_minus_beta1, g)));
        float v = rounded(vd, ADD(MUL(x[3], c.beta2), MUL(MUL(c.one_minus_beta2, g), g)));
        x[2] = m;
        x[3] = v;
        float denom = ADD(DIV(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
        float step = DIV(MUL(c.neg_step_size, m), denom);
        if (c.kahan) {
            float comp = ADD(x[4], ADD(MUL(c.neg_lr_wd, p), step));
            float next = rounded(pd, ADD(p, comp));
            x[4] = SUB(comp, SUB(next, p));
            x[0] = next;
        } else {
            x[0] = ADD(MUL(p, ADD(1.0f, c.neg_lr_wd)), step);
        }
    }
};

/* sgd.c: weight decay, the momentum buffer (a copy of d on the first
 * step, when the buffer is not read), nesterov, then the param. */
struct sgd_op {
    fl_sgd_ctx c;
    template <int PD, int SD> sgd_op fixed() const { return *this; }
    __device__ __forceinline__ void operator()(float *x) const {
        float p = x[0], g = x[1];
        float d = c.weight_decay != 0 ? ADD(g, MUL(c.weight_decay, p)) : g;
        if (c.use_momentum) {
            float b = c.first ? d : ADD(MUL(x[2], c.momentum), MUL(c.one_minus_dampening, d));
            x[2] = b;
            d = c.nesterov ? ADD(d, MUL(c.momentum, b)) : b;
        }
        x[0] = ADD(p, MUL(-c.lr, d));
    }
};

/* adadelta.c: square_avg, delta from both square roots, acc_delta, param. */
struct adadelta_op {
    fl_adadelta_ctx c;
    template <int PD, int SD> adadelta_op fixed() const { return *this; }
    __device__ __forceinline__ void operator()(float *x) const {
        float p = x[0], g = x[1], s = x[2], a = x[3];
        float d = c.weight_decay != 0 ? ADD(g, MUL(c.weight_decay, p)) : g;
        s = ADD(MUL(s, c.rho), MUL(MUL(c.one_minus_rho, d), d));
        float delta = MUL(DIV(__fsqrt_rn(ADD(a, c.eps)), __fsqrt_rn(ADD(s, c.eps))), d);
        a = ADD(MUL(a, c.rho), MUL(MUL(c.one_minus_rho, delta), delta));
        x[2] = s;
        x[3] = a;
        x[0] = ADD(p, MUL(-c.lr, delta));
    }
};

/* ---- the kernels -------------------------------------------------------------------- */

/* Any dtypes: one element per thread, each operand through the run-time
 * dtype switch. */
template <class Op> __global__ void update_kernel(operands o, Op op, int64_t n) {
    FOR_EACH_ELEMENT(i, n) {
        float x[FL_OPTIM_MAX_OPERANDS];
#pragma unroll
        for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++)
            x[k] = o.read >> k & 1 ? fl_cu_get_f32(o.p[k], i, o.dt[k]) : 0.0f;
        op(x);
#pragma unroll
        for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++)
            if (o.write >> k & 1) fl_cu_put_f32(o.p[k], i, o.dt[k], x[k]);
    }
}

/* N consecutive elements of dtype DT (f32, bf16 or f16) held as N / V::N
 * 16-byte vectors: an operand's share of one thread's elements in the
 * vector kernel, loaded and stored whole. */
template <int DT, int N> struct pack {
    typedef fl_cu_vec<DT> V;
    static constexpr int W = N / V::N;
    static_assert(W >= 1 && W * V::N == N, "a pack is whole vectors");
    V v[W];
    /* Pack i of p (elements i * N ... i * N + N - 1). */
    __device__ __forceinline__ void load(const void *p, int64_t i) {
#pragma unroll
        for (int w = 0; w < W; w++) v[w] = V::load(p, i * W + w);
    }
    __device__ __forceinline__ void store(void *p, int64_t i) const {
#pragma unroll
        for (int w = 0; w < W; w++) v[w].store(p, i * W + w);
    }
    __device__ __forceinline__ float get(int j) const { return v[j / V::N].get(j % V::N); }
    __device__ __forceinline__ void set(int j, float x) { v[j / V::N].set(j % V::N, x); }
};

/* Elements per thread of the vector kernel: a 16-byte vector of the
 * narrowest operand (8 when any is bf16, else 4), so each bf16 operand
 * moves 16 bytes per thread and each f32 one 16 or 32. */
__host__ __device__ constexpr int vec_width_of(int pd, int gd, int sd) {
    return pd == FL_BF16 || gd == FL_BF16 || sd == FL_BF16 ? 8 : 4;
}
template <int PD, int GD, int SD> struct vec_width {
    static constexpr int N = vec_width_of(PD, GD, SD);
};

/* The vector kernels' work, shared so that every path runs the same
 * operations: dense operands with the dtypes fixed at compile time (param
 * PD, grad GD, every state operand SD, each f32 or bf16), every pointer
 * 16-byte aligned; the param is written, the grad is not. vec_pack updates
 * pack i (N consecutive elements, N = vec_width) with vector loads and
 * stores per operand; vec_one updates element i alone (the n % N elements
 * past the last whole pack), by the same functor. */
template <int PD, int GD, int SD, class Op>
__device__ __forceinline__ void vec_pack(void *const *ptr, unsigned rd, unsigned wr, const Op &op, int64_t i) {
    constexpr int N = vec_width<PD, GD, SD>::N;
    pack<PD, N> p = {};
    pack<GD, N> g = {};
    pack<SD, N> s2 = {}, s3 = {}, s4 = {};
    if (rd & 1) p.load(ptr[0], i);
    if (rd & 2) g.load(ptr[1], i);
    if (rd & 4) s2.load(ptr[2], i);
    if (rd & 8) s3.load(ptr[3], i);
    if (rd & 16) s4.load(ptr[4], i);
#pragma unroll
    for (int j = 0; j < N; j++) {
        float x[FL_OPTIM_MAX_OPERANDS] = {p.get(j), g.get(j), s2.get(j), s3.get(j), s4.get(j)};
        op(x);
        p.set(j, x[0]);
        if (wr & 4) s2.set(j, x[2]);
        if (wr & 8) s3.set(j, x[3]);
        if (wr & 16) s4.set(j, x[4]);
    }
    p.store(ptr[0], i);
    if (wr & 4) s2.store(ptr[2], i);
    if (wr & 8) s3.store(ptr[3], i);
    if (wr & 16) s4.store(ptr[4], i);
}

template <int PD, int GD, int SD, class Op>
__device__ __forceinline__ void vec_one(void *const *ptr, unsigned rd, unsigned wr, const Op &op, int64_t i) {
    float x[FL_OPTIM_MAX_OPERANDS];
#pragma unroll
    for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++) {
        int dt = k == 0 ? PD : k == 1 ? GD : SD;
        x[k] = !(rd >> k & 1) ? 0.0f
               : dt == FL_F32 ? fl_cu_vget<FL_F32>(ptr[k], i)
                              : fl_cu_vget<FL_BF16>(ptr[k], i);
    }
    op(x);
#pragma unroll
    for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++) {
        int dt = k == 0 ? PD : k == 1 ? GD : SD;
        if (!(wr >> k & 1)) continue;
        if (dt == FL_F32)
            fl_cu_vput<FL_F32>(ptr[k], i, x[k]);
        else
            fl_cu_vput<FL_BF16>(ptr[k], i, x[k]);
    }
}

/* One tensor's update by vectors: grid-stride over the whole packs, then
 * the tail one by one. */
template <int PD, int GD, int SD, class Op>
__global__ void update_vec_kernel(operands o, Op op, int64_t n) {
    constexpr int N = vec_width<PD, GD, SD>::N;
    int64_t np = n / N, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = t; i < np; i += stride) vec_pack<PD, GD, SD>(o.p, o.read, o.write, op, i);
    for (int64_t i = np * N + t; i < n; i += stride) vec_one<PD, GD, SD>(o.p, o.read, o.write, op, i);
}

/* ---- multi-tensor updates ------------------------------------------------------------
 * [Note: multi-tensor updates]
 * An optimizer step over many tensors (fl_adamw_step_multi_) is one launch
 * per batch of up to MULTI_MAX tensors whose operands fit the vector
 * kernel with the same dtypes, instead of one launch per tensor (146 for
 * Llama-3.2-1B). The batch's table goes by value, as PyTorch's
 * multi_tensor_apply passes its own: kernel parameters stay within 4 KiB, so
 * there is nothing to allocate, copy or keep alive until the kernel runs.
 * Tensor j owns blocks first[j] ... first[j+1] - 1, each covering
 * THREADS * MULTI_PACKS whole packs of it; its last block also does its
 * tail. A block finds its tensor by binary search over first[]. Each
 * element gets vec_pack's or vec_one's operations, as in the one-tensor
 * kernel, so the result is the same bit for bit. Tensors that do not fit
 * (f16, misaligned, mixed state dtypes) are launched one by one. */

/* Tensors per launch: the table below and the largest functor stay within
 * the 4 KiB of kernel parameters (static_assert below). */
enum { MULTI_MAX = 76 };
/* Packs per thread of a block: a block covers THREADS * MULTI_PACKS of its
 * tensor's packs (8192 elements when N = 8). */
enum { MULTI_PACKS = 4 };

struct multi_table {
    int count;
    unsigned read, write;    /* as operands' (the same for all tensors of a batch) */
    unsigned first[MULTI_MAX]; /* tensor j's first block */
    int64_t n[MULTI_MAX];     /* tensor j's elements */
    void *p[MULTI_MAX][FL_OPTIM_MAX_OPERANDS];
};
static_assert(sizeof(multi_table) + 64 <= 4096, "a batch and its functor fit the kernel parameters");

template <int PD, int GD, int SD, class Op> __global__ void update_multi_kernel(multi_table tab, Op op) {
    constexpr int N = vec_width<PD, GD, SD>::N;
    unsigned b = blockIdx.x;
    int lo = 0, hi = tab.count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (tab.first[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    void *ptr[FL_OPTIM_MAX_OPERANDS];
#pragma unroll
    for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++) ptr[k] = tab.p[lo][k];
    int64_t n = tab.n[lo], np = n / N;
    int64_t base = (int64_t)(b - tab.first[lo]) * (THREADS * MULTI_PACKS) + threadIdx.x;
#pragma unroll
    for (int u = 0; u < MULTI_PACKS; u++) {
        int64_t i = base + u * THREADS;
        if (i < np) vec_pack<PD, GD, SD>(ptr, tab.read, tab.write, op, i);
    }
    bool last = lo + 1 == tab.count ? b + 1 == gridDim.x : b + 1 == tab.first[lo + 1];
    int64_t i = np * N + threadIdx.x;
    if (last && i < n) vec_one<PD, GD, SD>(ptr, tab.read, tab.write, op, i);
}

/* Bind the compile-time NAME to dt, FL_F32 or FL_BF16. */
#define BIND_F32_BF16(dt, NAME, ...)                                                               \
    do {                                                                                           \
        if ((dt) == FL_F32) {                                                                      \
            constexpr int NAME = FL_F32;                                                           \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            constexpr int NAME = FL_BF16;                                                          \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

/* The dtype of every operand from 2 on that is present (param's when there
 * is none), or -1 when they differ. */
static int state_dtype(const operands &o) {
    int sd = -1;
    for (int k = 2; k < FL_OPTIM_MAX_OPERANDS; k++) {
        if (!o.p[k]) continue;
        if (sd >= 0 && o.dt[k] != sd) return -1;
        sd = o.dt[k];
    }
    return sd < 0 ? o.dt[0] : sd;
}

static bool f32_or_bf16(int dt) { return dt == FL_F32 || dt == FL_BF16; }

/* The operands of one set, with the bits of those the update reads and
 * writes (the first SGD step copies d into its buffer without reading it). */
static operands operands_of(fl_optim_kind kind, const void *ctx, int n, const fl_optim_operand *ops) {
    operands o;
    o.read = o.write = 0;
    for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++) {
        bool present = k < n && ops[k].t;
        o.p[k] = present ? ops[k].t->data : NULL;
        o.dt[k] = present ? (int)ops[k].t->dtype : (int)FL_F32;
        if (present) o.read |= 1u << k;
        if (present && ops[k].write) o.write |= 1u << k;
    }
    if (kind == FL_OPTIM_SGD && ((const fl_sgd_ctx *)ctx)->first) o.read &= ~4u;
    return o;
}

/* Whether the vector kernels take o: the param, the grad and the (common)
 * state dtype each f32 or bf16, every operand 16-byte aligned (the
 * operands are dense: fl_optim_run checked), the param written and the
 * grad not. */
static bool vec_fits(const operands &o) {
    bool vec = f32_or_bf16(o.dt[0]) && f32_or_bf16(o.dt[1]) && f32_or_bf16(state_dtype(o)) &&
               (o.write & 3) == 1;
    for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++) vec = vec && fl_cu_vec_aligned(o.p[k]);
    return vec;
}

/* f(functor) with the functor of kind for operands o (the result of f),
 * or an error for a kind without a kernel. */
template <class F>
static int with_functor(const char *op, fl_optim_kind kind, const void *ctx, const operands &o, F f) {
    switch (kind) {
    case FL_OPTIM_ADAMW:
        return f(adamw_op{*(const fl_adamw_ctx *)ctx});
    case FL_OPTIM_ANYPRECISION_ADAMW:
        return f(anyprecision_op<>{*(const fl_anyprecision_ctx *)ctx, o.dt[0], o.dt[2], o.dt[3]});
    case FL_OPTIM_SGD:
        return f(sgd_op{*(const fl_sgd_ctx *)ctx});
    case FL_OPTIM_ADADELTA:
        return f(adadelta_op{*(const fl_adadelta_ctx *)ctx});
    default:
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for update kind %d", op, (int)kind);
    }
}

/* Launch the update of op over the n elements of o: the vector kernel
 * when it fits, else the per-element one. */
template <class Op>
static int launch(const char *name, const operands &o, const Op &op, int64_t n, cudaStream_t s) {
    if (!vec_fits(o)) {
        update_kernel<Op><<<fl_cu_blocks(n, THREADS), THREADS, 0, s>>>(o, op, n);
        return fl_cu_check(name);
    }
    int pd = o.dt[0], gd = o.dt[1], sd = state_dtype(o);
    BIND_F32_BF16(pd, PD, BIND_F32_BF16(gd, GD, BIND_F32_BF16(sd, SD, {
        unsigned blocks = fl_cu_vec_blocks(n, vec_width<PD, GD, SD>::N, THREADS);
        auto vop = op.template fixed<PD, SD>();
        update_vec_kernel<PD, GD, SD, decltype(vop)><<<blocks, THREADS, 0, s>>>(o, vop, n);
    })));
    return fl_cu_check(name);
}

static int cuda_optim_update(const char *op, fl_optim_kind kind, const void *ctx, int n,
                             const fl_optim_operand *ops) {
    const fl_tensor *param = ops[0].t;
    int64_t numel = param->numel;
    if (numel == 0) return FL_OK;
    int rc = fl_cu_use_device(op, param);
    if (rc != FL_OK) return rc;
    operands o = operands_of(kind, ctx, n, ops);
    return with_functor(op, kind, ctx, o, [&](const auto &f) { return launch(op, o, f, numel, fl_cu_stream()); });
}

/* Launch one batch of the multi-tensor kernel (all its tensors with o's
 * dtypes and read/write bits) over `blocks` blocks. */
template <class Op>
static int launch_multi(const char *name, const multi_table &tab, unsigned blocks, const operands &o,
                        const Op &op, cudaStream_t s) {
    BIND_F32_BF16(o.dt[0], PD, BIND_F32_BF16(o.dt[1], GD, BIND_F32_BF16(state_dtype(o), SD, {
        auto vop = op.template fixed<PD, SD>();
        update_multi_kernel<PD, GD, SD, decltype(vop)><<<blocks, THREADS, 0, s>>>(tab, vop);
    })));
    return fl_cu_check(name);
}

/* Whether the vector kernel treats a and b alike (one batch may hold both). */
static bool same_batch(const operands &a, const operands &b) {
    return a.dt[0] == b.dt[0] && a.dt[1] == b.dt[1] && state_dtype(a) == state_dtype(b) &&
           a.read == b.read && a.write == b.write;
}

/* Blocks of a batch at most (a grid's x dimension allows 2^31 - 1). */
static const int64_t MULTI_BLOCKS_MAX = (int64_t)1 << 30;

/* [Note: multi-tensor updates]: the sets that fit the vector kernel in
 * batches of equal dtypes, the others one launch each. */
static int cuda_optim_update_multi(const char *op, fl_optim_kind kind, const void *ctx, int count, int n,
                                   const fl_optim_operand *ops) {
    int rc = fl_cu_use_device(op, ops[0].t);
    if (rc != FL_OK) return rc;
    operands *os = (operands *)malloc((size_t)count * sizeof *os);
    unsigned char *done = (unsigned char *)calloc((size_t)count, 1);
    if (!os || !done) {
        free(os);
        free(done);
        return fl_fail(FL_ERR_OOM, "%s on cuda: no host memory for the operands of %d tensors", op, count);
    }
    cudaStream_t s = fl_cu_stream();
    for (int i = 0; i < count && rc == FL_OK; i++) {
        os[i] = operands_of(kind, ctx, n, ops + (size_t)i * n);
        int64_t numel = ops[(size_t)i * n].t->numel;
        int64_t nb = (numel / vec_width_of(os[i].dt[0], os[i].dt[1], state_dtype(os[i])) +
                      THREADS * MULTI_PACKS - 1) / (THREADS * MULTI_PACKS);
        if (vec_fits(os[i]) && nb < MULTI_BLOCKS_MAX) continue;
        done[i] = 1;
        rc = with_functor(op, kind, ctx, os[i], [&](const auto &f) { return launch(op, os[i], f, numel, s); });
    }
    for (int i = 0; i < count && rc == FL_OK; i++) {
        if (done[i]) continue;
        int width = vec_width_of(os[i].dt[0], os[i].dt[1], state_dtype(os[i]));
        multi_table tab = {};
        tab.count = 0;
        tab.read = os[i].read;
        tab.write = os[i].write;
        int64_t blocks = 0;
        for (int j = i; j <= count && rc == FL_OK; j++) {
            bool member = j < count && !done[j] && same_batch(os[i], os[j]);
            int64_t numel = member ? ops[(size_t)j * n].t->numel : 0;
            int64_t nb = (numel / width + THREADS * MULTI_PACKS - 1) / (THREADS * MULTI_PACKS);
            if (nb < 1) nb = 1;
            bool full = tab.count == MULTI_MAX || (member && blocks + nb > MULTI_BLOCKS_MAX);
            if (tab.count > 0 && (j == count || full)) {
                rc = with_functor(op, kind, ctx, os[i], [&](const auto &f) {
                    return launch_multi(op, tab, (unsigned)blocks, os[i], f, s);
                });
                tab.count = 0;
                blocks = 0;
            }
            if (!member) continue;
            tab.first[tab.count] = (unsigned)blocks;
            tab.n[tab.count] = numel;
            for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++) tab.p[tab.count][k] = os[j].p[k];
            tab.count++;
            blocks += nb;
            done[j] = 1;
        }
    }
    free(os);
    free(done);
    return rc;
}

/* ---- clip-by-global-norm --------------------------------------------------------- */

enum { CHUNK = FL_GRAD_NORM_CHUNK };

/* part[4c + k] = accumulator k of chunk c, as chunk_sum_squares in
 * grad_norm.c: squares of elements 4j + k of the chunk's whole quads, in
 * order, in double; accumulator 0 then adds the tail elements. */
__global__ void sum_squares_kernel(double *part, const void *x, int dt, int64_t numel,
                                   int64_t chunks) {
    FOR_EACH_ELEMENT(t, chunks * 4) {
        int64_t c = t >> 2, k = t & 3, start = c * CHUNK;
        int64_t len = numel - start < CHUNK ? numel - start : CHUNK, quads = len / 4;
        double s = 0;
        for (int64_t j = 0; j < quads; j++) {
            double d = fl_cu_get_f64(x, start + 4 * j + k, dt);
            s = __dadd_rn(s, __dmul_rn(d, d));
        }
        if (k == 0)
            for (int64_t i = quads * 4; i < len; i++) {
                double d = fl_cu_get_f64(x, start + i, dt);
                s = __dadd_rn(s, __dmul_rn(d, d));
            }
        part[t] = s;
    }
}

/* The same partial sums for a 16-byte aligned f32, bf16 or f16 tensor:
 * one thread per chunk keeps its four accumulators and reads the chunk 8
 * elements (two quads) at a time with vector loads (32 bytes of f32, 16 of
 * bf16), adding element 8v + j into accumulator j % 4 in the order above;
 * a last whole quad and the tail are read one by one. (The accumulators'
 * order leaves one thread per chunk at most 4 chains; the unrolled loop
 * keeps several loads in flight per thread instead.) (The per-accumulator
 * kernel above reads 4 strided bytes per thread per step.) */
template <int DT> __global__ void sum_squares_vec_kernel(double *part, const void *x, int64_t numel,
                                                         int64_t chunks) {
    constexpr int N = 8;
    static_assert(CHUNK % N == 0, "a chunk is whole packs");
    FOR_EACH_ELEMENT(c, chunks) {
        int64_t start = c * CHUNK;
        int64_t len = numel - start < CHUNK ? numel - start : CHUNK, quads = len / 4;
        int64_t packs = quads * 4 / N, first = start / N;
        double s[4] = {0, 0, 0, 0};
#pragma unroll 4
        for (int64_t v = 0; v < packs; v++) {
            pack<DT, N> a;
            a.load(x, first + v);
#pragma unroll
            for (int j = 0; j < N; j++) {
                double d = a.get(j);
                s[j % 4] = __dadd_rn(s[j % 4], __dmul_rn(d, d));
            }
        }
        if (packs * N < quads * 4) /* the last whole quad: one of the pack's two */
#pragma unroll
            for (int k = 0; k < 4; k++) {
                double d = fl_cu_vget<DT>(x, start + packs * N + k);
                s[k] = __dadd_rn(s[k], __dmul_rn(d, d));
            }
        for (int64_t i = quads * 4; i < len; i++) {
            double d = fl_cu_vget<DT>(x, start + i);
            s[0] = __dadd_rn(s[0], __dmul_rn(d, d));
        }
#pragma unroll
        for (int k = 0; k < 4; k++) part[4 * c + k] = s[k];
    }
}

static int cuda_grad_sq_norm(const fl_tensor *t, double *out) {
    const char *op = "grad_sq_norm";
    *out = 0;
    int64_t numel = t->numel, chunks = (numel + CHUNK - 1) / CHUNK;
    if (chunks == 0) return FL_OK;
    int rc = fl_cu_use_device(op, t);
    if (rc != FL_OK) return rc;
    int64_t nparts = chunks * 4;
    fl_tensor *part = fl_empty(1, &nparts, FL_F64, t->device);
    if (!part) return fl_last_status();
    double *host = (double *)malloc((size_t)nparts * sizeof *host);
    if (!host) {
        fl_tensor_release(part);
        return fl_fail(FL_ERR_OOM, "%s: no host memory for %lld partial sums", op, (long long)nparts);
    }
    cudaStream_t s = fl_cu_stream();
    if (fl_cu_vec_dtype(t->dtype) && fl_cu_vec_aligned(t->data))
        fl_cu_vec_dispatch(t->dtype, VDT,
                           sum_squares_vec_kernel<VDT><<<fl_cu_blocks(chunks, THREADS), THREADS, 0, s>>>(
                               (double *)part->data, t->data, numel, chunks));
    else
        sum_squares_kernel<<<fl_cu_blocks(nparts, THREADS), THREADS, 0, s>>>(
            (double *)part->data, t->data, t->dtype, numel, chunks);
    rc = fl_cu_check(op);
    if (rc == FL_OK) rc = fl_cuda_nccl_settle();
    if (rc == FL_OK) {
        /* Synchronous on the legacy stream: waits for the kernel. */
        cudaError_t e = cudaMemcpy(host, part->data, (size_t)nparts * sizeof *host,
                                   cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            rc = fl_fail(FL_ERR_DEVICE, "%s on cuda: reading the partial sums: %s", op,
                         cudaGetErrorString(e));
    }
    if (rc == FL_OK) {
        double sum = 0;
        for (int64_t c = 0; c < chunks; c++) {
            const double *s = host + 4 * c;
            sum += (s[0] + s[1]) + (s[2] + s[3]);
        }
        *out = sum;
    }
    free(host);
    fl_tensor_release(part);
    return rc;
}

/* t *= alpha: in double for f64, else in f32 rounded once per element. */
__global__ void scale_kernel(void *x, int dt, double alpha, int64_t n) {
    float a = (float)alpha;
    FOR_EACH_ELEMENT(i, n) {
        if (dt == FL_F64) ((double *)x)[i] = __dmul_rn(((double *)x)[i], alpha);
        else fl_cu_put_f32(x, i, dt, MUL(fl_cu_get_f32(x, i, dt), a));
    }
}

/* The same for a 16-byte aligned f32, bf16 or f16 tensor, a 16-byte
 * vector per thread; the tail one by one. */
template <int DT> __global__ void scale_vec_kernel(void *x, float a, int64_t n) {
    typedef fl_cu_vec<DT> V;
    int64_t nv = n / V::N, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = t; v < nv; v += stride) {
        V r = V::load(x, v);
#pragma unroll
        for (int k = 0; k < V::N; k++) r.set(k, MUL(r.get(k), a));
        r.store(x, v);
    }
    for (int64_t i = nv * V::N + t; i < n; i += stride) fl_cu_vput<DT>(x, i, MUL(fl_cu_vget<DT>(x, i), a));
}

static int cuda_grad_scale_(fl_tensor *t, double alpha) {
    const char *op = "grad_scale_";
    if (t->numel == 0) return FL_OK;
    int rc = fl_cu_use_device(op, t);
    if (rc != FL_OK) return rc;
    cudaStream_t s = fl_cu_stream();
    if (fl_cu_vec_dtype(t->dtype) && fl_cu_vec_aligned(t->data)) {
        unsigned blocks = fl_cu_vec_blocks(t->numel, FL_CU_VEC_BYTES / (int)fl_dtype_size(t->dtype),
                                           THREADS);
        fl_cu_vec_dispatch(t->dtype, VDT,
                           scale_vec_kernel<VDT><<<blocks, THREADS, 0, s>>>(t->data, (float)alpha,
                                                                            t->numel));
    } else {
        scale_kernel<<<fl_cu_blocks(t->numel, THREADS), THREADS, 0, s>>>(t->data, t->dtype, alpha,
                                                                         t->numel);
    }
    return fl_cu_check(op);
}

extern "C" const fl_optim_kernels fl_cuda_optim_kernels = {
    cuda_optim_update,
    cuda_optim_update_multi,
    cuda_grad_sq_norm,
    cuda_grad_scale_,
};
