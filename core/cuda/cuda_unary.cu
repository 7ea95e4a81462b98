/*
 * cuda_unary.cu: the GPU kernels of unary math and activations (forward
 * and fused backward), silu(gate) * up (and its backward), and dropout: the
 * twins of core/cpu/cpu_unary.c, with the same formulas and compute types
 * (f64 for f64 tensors, f32 for the other floats, int64 for the integer
 * forms of abs/relu/square/clamp).
 *
 * Transcendentals come from CUDA's libdevice (expf, erff, tanhf, powf
 * within 1-4 ulp, as glibc's are), so results agree with the CPU to a few
 * ulp of f32, not bit for bit. Dropout's keep mask is integer arithmetic
 * on rng.c's Philox words and equals the CPU's exactly.
 *
 * Unary ops (forward and backward) and silu_mul (forward and backward)
 * have a dense path: every operand contiguous, of one float dtype, 16-byte
 * aligned (fl_cu_vec_ok), read and written 16 bytes per operand per thread
 * step (cuda_vec.cuh) with the dtype fixed at compile time. The arithmetic
 * per element is the generic kernels' own (the same inline functions), so
 * both paths give the same bits; the host picks one per call.
 */
#include "cuda_elem.cuh"
#include "cuda_vec.cuh"

extern "C" {
#include "backend.h"
}
#include "cuda_elementwise.cuh"

/* f32 and f64 spellings of the math functions, so one template serves both. */
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_pow(float x, float e) { return powf(x, e); }
__device__ __forceinline__ double m_pow(double x, double e) { return pow(x, e); }

__device__ __forceinline__ float load_c(float, const void *p, int64_t i, int d) { return fl_cu_get_f32(p, i, d); }
__device__ __forceinline__ double load_c(double, const void *p, int64_t i, int d) { return fl_cu_get_f64(p, i, d); }
__device__ __forceinline__ void store_c(void *p, int64_t i, int d, float v) { fl_cu_put_f32(p, i, d, v); }
__device__ __forceinline__ void store_c(void *p, int64_t i, int d, double v) { fl_cu_put_f64(p, i, d, v); }

#define SQRT_2_OVER_PI 0.79788456080286535588
#define GELU_TANH_C 0.044715
#define INV_SQRT_2 0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794

/* ---- forward ------------------------------------------------------------------------ */

template <typename T>
__device__ __forceinline__ T unary_fwd(int op, T x, T p0, T p1, double p0d) {
    switch (op) {
    case FL_EXP: return m_exp(x);
    case FL_LOG: return m_log(x);
    case FL_SQRT: return m_sqrt(x);
    case FL_RSQRT: return (T)1 / m_sqrt(x);
    case FL_TANH: return m_tanh(x);
    case FL_SIGMOID: return (T)1 / ((T)1 + m_exp(-x));
    case FL_ABS: return x < 0 ? -x : x;
    case FL_RELU: return x < 0 ? (T)0 : x; /* NaN stays NaN */
    case FL_GELU: return (T)0.5 * x * ((T)1 + m_erf(x * (T)INV_SQRT_2));
    case FL_GELU_TANH: {
        T u = (T)SQRT_2_OVER_PI * (x + (T)GELU_TANH_C * x * x * x);
        return (T)0.5 * x * ((T)1 + m_tanh(u));
    }
    case FL_SILU: return x / ((T)1 + m_exp(-x));
    case FL_SQUARE: return x * x;
    case FL_UNARY_POW:
        if (p0d == 2) return x * x;
        if (p0d == 1) return x;
        if (p0d == 0.5) return m_sqrt(x);
        return m_pow(x, p0);
    case FL_UNARY_CLAMP: {
        T v = x < p0 ? p0 : x;
        return v > p1 ? p1 : v;
    }
    default: return x;
    }
}

template <typename T>
__global__ void unary_kernel(fl_cu_iter it, int op, T p0, T p1, double p0d, void *out, int od,
                             const void *x, int xd) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        store_c(out, off[0], od, unary_fwd<T>(op, load_c(T(), x, off[1], xd), p0, p1, p0d));
    }
}

/* The dense path of unary_kernel<float> (out and x of dtype DT): its op as
 * an f32 functor for cuda_vec.cuh's map. */
struct unary_fn {
    int op;
    float p0, p1;
    double p0d;
    __device__ __forceinline__ float operator()(float x) const { return unary_fwd<float>(op, x, p0, p1, p0d); }
};

/* The integer forms (abs, relu, square, clamp; unary.c sends no others). */
__global__ void unary_i64_kernel(fl_cu_iter it, int op, int64_t lo, int64_t hi, void *out, int od,
                                 const void *x, int xd) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        int64_t v = fl_cu_get_i64(x, off[1], xd), r;
        switch (op) {
        case FL_ABS: r = v < 0 ? (int64_t)(0 - (uint64_t)v) : v; break;
        case FL_RELU: r = v < 0 ? 0 : v; break;
        case FL_SQUARE: r = (int64_t)((uint64_t)v * (uint64_t)v); break;
        default: r = v < lo ? lo : v; r = r > hi ? hi : r; break;
        }
        fl_cu_put_i64(out, off[0], od, r);
    }
}

static const char *unary_name(int op) {
    static const char *names[FL_UNARY_KERNEL_COUNT] = {
        "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "abs", "relu",
        "gelu", "gelu_tanh", "silu", "square", "pow", "clamp",
    };
    return op >= 0 && op < FL_UNARY_KERNEL_COUNT ? names[op] : "unary";
}

/* cpu_unary.c's bound_i64: a double bound -> int64, saturating. */
static int64_t bound_i64(double v) {
    if (v <= -0x1p63) return INT64_MIN;
    if (v >= 0x1p63) return INT64_MAX;
    return (int64_t)v;
}

int fl_cuda_unary(int op, fl_tensor *out, const fl_tensor *x, double p0, double p1) {
    const char *name = unary_name(op);
    if (op < 0 || op >= FL_UNARY_KERNEL_COUNT)
        return fl_fail(FL_ERR_ARG, "unary on cuda: invalid op %d", op);
    bool ints = !fl_dtype_is_float(out->dtype);
    if (ints && op != FL_ABS && op != FL_RELU && op != FL_SQUARE && op != FL_UNARY_CLAMP)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no integer form (output %s)", name,
                       fl_dtype_name(out->dtype));
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device(name, out)) return fl_last_status();
    const fl_tensor *ts[2] = {out, x};
    cudaStream_t s = fl_cu_stream();
    if (fl_cu_vec_ok(out->dtype, 2, ts)) {
        unary_fn f = {op, (float)p0, (float)p1, p0};
        fl_cu_vec_dispatch(out->dtype, VDT,
                           fl_cu_vec_map_kernel<VDT, 1, unary_fn><<<fl_cu_vec_map_blocks(out, FL_CU_THREADS), FL_CU_THREADS,
                                                         0, s>>>(out->numel, out->data, x->data, (const void *)NULL, f));
        return fl_cu_check(name);
    }
    fl_cu_iter it;
    fl_cu_iter_init(&it, 2, ts);
    unsigned blocks = fl_cu_blocks(it.numel, FL_CU_THREADS);
    if (ints)
        unary_i64_kernel<<<blocks, FL_CU_THREADS, 0, s>>>(it, op, bound_i64(p0), bound_i64(p1),
                                                          out->data, out->dtype, x->data, x->dtype);
    else if (out->dtype == FL_F64)
        unary_kernel<double><<<blocks, FL_CU_THREADS, 0, s>>>(it, op, p0, p1, p0, out->data,
                                                              out->dtype, x->data, x->dtype);
    else
        unary_kernel<float><<<blocks, FL_CU_THREADS, 0, s>>>(it, op, (float)p0, (float)p1, p0,
                                                             out->data, out->dtype, x->data,
                                                             x->dtype);
    return fl_cu_check(name);
}

/* ---- backward: gx = gy * f'(s), s = x or y (fl_unary_saves_output) ------------------- */

template <typename T>
__device__ __forceinline__ T unary_bwd(int op, T g, T s, T p0, T p1, double p0d) {
    switch (op) {
    case FL_EXP: return g * s;
    case FL_LOG: return g / s;
    case FL_SQRT: return g / ((T)2 * s);
    case FL_RSQRT: return (T)-0.5 * g * s * s * s;
    case FL_TANH: return g * ((T)1 - s * s);
    case FL_SIGMOID: return g * s * ((T)1 - s);
    case FL_ABS: return s > 0 ? g : (s < 0 ? -g : (T)0);
    case FL_RELU: return s <= 0 ? (T)0 : g; /* threshold_backward: zero where y <= 0 */
    case FL_GELU: {
        T cdf = (T)0.5 * ((T)1 + m_erf(s * (T)INV_SQRT_2));
        T pdf = (T)INV_SQRT_2PI * m_exp((T)-0.5 * s * s);
        return g * (cdf + s * pdf);
    }
    case FL_GELU_TANH: {
        T t = m_tanh((T)SQRT_2_OVER_PI * (s + (T)GELU_TANH_C * s * s * s));
        T du = (T)SQRT_2_OVER_PI * ((T)1 + (T)(3 * GELU_TANH_C) * s * s);
        return g * ((T)0.5 * ((T)1 + t) + (T)0.5 * s * ((T)1 - t * t) * du);
    }
    case FL_SILU: {
        T sg = (T)1 / ((T)1 + m_exp(-s));
        return g * sg * ((T)1 + s * ((T)1 - sg));
    }
    case FL_SQUARE: return (T)2 * s * g;
    case FL_UNARY_POW:
        if (p0d == 0) return (T)0;
        if (p0d == 2) return (T)2 * s * g;
        return g * p0 * m_pow(s, (T)(p0d - 1));
    case FL_UNARY_CLAMP: return s >= p0 && s <= p1 ? g : (T)0; /* boundaries included, NaN: 0 */
    default: return g;
    }
}

template <typename T>
__global__ void unary_bw_kernel(fl_cu_iter it, int op, T p0, T p1, double p0d, void *gx, int gxd,
                                const void *gy, int gyd, const void *s, int sd) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        T g = load_c(T(), gy, off[1], gyd), v = load_c(T(), s, off[2], sd);
        store_c(gx, off[0], gxd, unary_bwd<T>(op, g, v, p0, p1, p0d));
    }
}

/* The dense path of unary_bw_kernel<float> (gx, gy and s of dtype DT). */
struct unary_bw_fn {
    int op;
    float p0, p1;
    double p0d;
    __device__ __forceinline__ float operator()(float g, float v) const {
        return unary_bwd<float>(op, g, v, p0, p1, p0d);
    }
};

int fl_cuda_unary_backward(int op, fl_tensor *gx, const fl_tensor *gy, const fl_tensor *s,
                           double p0, double p1) {
    const char *name = unary_name(op);
    if (op < 0 || op >= FL_UNARY_KERNEL_COUNT)
        return fl_fail(FL_ERR_ARG, "unary backward on cuda: invalid op %d", op);
    if (gx->numel == 0) return FL_OK;
    if (fl_cu_use_device(name, gx)) return fl_last_status();
    const fl_tensor *ts[3] = {gx, gy, s};
    cudaStream_t st = fl_cu_stream();
    if (fl_cu_vec_ok(gx->dtype, 3, ts)) {
        unary_bw_fn f = {op, (float)p0, (float)p1, p0};
        fl_cu_vec_dispatch(gx->dtype, VDT,
                           fl_cu_vec_map_kernel<VDT, 2, unary_bw_fn><<<fl_cu_vec_map_blocks(gx, FL_CU_THREADS), FL_CU_THREADS,
                                                         0, st>>>(gx->numel, gx->data, gy->data, s->data, f));
        return fl_cu_check(name);
    }
    fl_cu_iter it;
    fl_cu_iter_init(&it, 3, ts);
    unsigned blocks = fl_cu_blocks(it.numel, FL_CU_THREADS);
    /* Compute type from gx as on the CPU: f64 for f64, f32 otherwise. */
    if (gx->dtype == FL_F64)
        unary_bw_kernel<double><<<blocks, FL_CU_THREADS, 0, st>>>(
            it, op, p0, p1, p0, gx->data, gx->dtype, gy->data, gy->dtype, s->data, s->dtype);
    else
        unary_bw_kernel<float><<<blocks, FL_CU_THREADS, 0, st>>>(
            it, op, (float)p0, (float)p1, p0, gx->data, gx->dtype, gy->data, gy->dtype, s->data,
            s->dtype);
    return fl_cu_check(name);
}

/* ---- silu(gate) * up ------------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ T silu_mul_one(T a, T b) {
    return a / ((T)1 + m_exp(-a)) * b;
}

template <typename T>
__global__ void silu_mul_kernel(fl_cu_iter it, void *out, const void *gate, const void *up, int d) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        T a = load_c(T(), gate, off[1], d), b = load_c(T(), up, off[2], d);
        store_c(out, off[0], d, silu_mul_one<T>(a, b));
    }
}

/* The dense path of silu_mul_kernel<float> (out, gate and up of dtype DT). */
struct silu_mul_fn {
    __device__ __forceinline__ float operator()(float a, float b) const { return silu_mul_one<float>(a, b); }
};

static int float_only(const char *op, const fl_tensor *t) {
    return fl_dtype_is_float(t->dtype)
               ? FL_OK
               : fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: expects float tensors, got %s", op,
                         fl_dtype_name(t->dtype));
}

int fl_cuda_silu_mul(fl_tensor *out, const fl_tensor *gate, const fl_tensor *up) {
    if (float_only("silu_mul", out)) return fl_last_status();
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device("silu_mul", out)) return fl_last_status();
    const fl_tensor *ts[3] = {out, gate, up};
    if (fl_cu_vec_ok(out->dtype, 3, ts)) {
        fl_cu_vec_dispatch(out->dtype, VDT,
                           fl_cu_vec_map_kernel<VDT, 2, silu_mul_fn><<<fl_cu_vec_map_blocks(out, FL_CU_THREADS), FL_CU_THREADS,
                                                         0, fl_cu_stream()>>>(out->numel, out->data, gate->data,
                                                                              up->data, silu_mul_fn()));
        return fl_cu_check("silu_mul");
    }
    fl_cu_iter it;
    fl_cu_iter_init(&it, 3, ts);
    unsigned blocks = fl_cu_blocks(it.numel, FL_CU_THREADS);
    if (out->dtype == FL_F64)
        silu_mul_kernel<double><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            it, out->data, gate->data, up->data, out->dtype);
    else
        silu_mul_kernel<float><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            it, out->data, gate->data, up->data, out->dtype);
    return fl_cu_check("silu_mul");
}

/* dgate = gy * up * sigma (1 + a (1 - sigma)), dup = gy * silu(a); all
 * contiguous; either output may be NULL. */
template <typename T> __device__ __forceinline__ T silu_sigma(T a) { return (T)1 / ((T)1 + m_exp(-a)); }
template <typename T> __device__ __forceinline__ T silu_mul_dgate(T g, T a, T b, T sg) {
    return g * b * sg * ((T)1 + a * ((T)1 - sg));
}
template <typename T> __device__ __forceinline__ T silu_mul_dup(T g, T a, T sg) { return g * a * sg; }

template <typename T>
__global__ void silu_mul_bw_kernel(int64_t n, void *ga, void *gb, const void *g, int gd,
                                   const void *a, const void *b, int d) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        T gv = load_c(T(), g, i, gd), av = load_c(T(), a, i, d), bv = load_c(T(), b, i, d);
        T sg = silu_sigma<T>(av);
        if (ga) store_c(ga, i, d, silu_mul_dgate<T>(gv, av, bv, sg));
        if (gb) store_c(gb, i, d, silu_mul_dup<T>(gv, av, sg));
    }
}

/* The dense path of silu_mul_bw_kernel<float>: every operand (gy
 * included) of dtype DT; up is read only when dgate is wanted. */
template <int DT>
__global__ void silu_mul_bw_vec_kernel(int64_t n, void *ga, void *gb, const void *g,
                                       const void *a, const void *b) {
    typedef fl_cu_vec<DT> V;
    int64_t nv = n / V::N, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = t; v < nv; v += stride) {
        V gv = V::load(g, v), av = V::load(a, v), ra, rb;
        if (ga) {
            V bv = V::load(b, v);
#pragma unroll
            for (int k = 0; k < V::N; k++) {
                float x = av.get(k), sg = silu_sigma<float>(x);
                ra.set(k, silu_mul_dgate<float>(gv.get(k), x, bv.get(k), sg));
                if (gb) rb.set(k, silu_mul_dup<float>(gv.get(k), x, sg));
            }
            ra.store(ga, v);
            if (gb) rb.store(gb, v);
        } else {
#pragma unroll
            for (int k = 0; k < V::N; k++) {
                float x = av.get(k);
                rb.set(k, silu_mul_dup<float>(gv.get(k), x, silu_sigma<float>(x)));
            }
            rb.store(gb, v);
        }
    }
    for (int64_t i = nv * V::N + t; i < n; i += stride) {
        float gv = fl_cu_vget<DT>(g, i), av = fl_cu_vget<DT>(a, i), sg = silu_sigma<float>(av);
        if (ga) fl_cu_vput<DT>(ga, i, silu_mul_dgate<float>(gv, av, fl_cu_vget<DT>(b, i), sg));
        if (gb) fl_cu_vput<DT>(gb, i, silu_mul_dup<float>(gv, av, sg));
    }
}

int fl_cuda_silu_mul_backward(fl_tensor *g_gate, fl_tensor *g_up, const fl_tensor *gy,
                              const fl_tensor *gate, const fl_tensor *up) {
    const char *op = "silu_mul backward";
    if (float_only(op, gate)) return fl_last_status();
    if ((!g_gate && !g_up) || gate->numel == 0) return FL_OK;
    if (fl_cu_use_device(op, gate)) return fl_last_status();
    void *ga = g_gate ? g_gate->data : NULL, *gb = g_up ? g_up->data : NULL;
    /* gy's dtype is its own (the op layer passes the incoming gradient as
     * it is): the dense path needs it of gate's dtype too. */
    const fl_tensor *ts[5] = {gate, up, gy, g_gate, g_up};
    if (fl_cu_vec_ok(gate->dtype, 5, ts)) {
        fl_cu_vec_dispatch(gate->dtype, VDT,
                           silu_mul_bw_vec_kernel<VDT><<<fl_cu_vec_map_blocks(gate, FL_CU_THREADS), FL_CU_THREADS, 0,
                                                         fl_cu_stream()>>>(
                               gate->numel, ga, gb, gy->data, gate->data, up->data));
        return fl_cu_check(op);
    }
    unsigned blocks = fl_cu_blocks(gate->numel, FL_CU_THREADS);
    if (gate->dtype == FL_F64)
        silu_mul_bw_kernel<double><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            gate->numel, ga, gb, gy->data, gy->dtype, gate->data, up->data, gate->dtype);
    else
        silu_mul_bw_kernel<float><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            gate->numel, ga, gb, gy->data, gy->dtype, gate->data, up->data, gate->dtype);
    return fl_cu_check(op);
}

/* ---- dropout --------------------------------------------------------------------------- */

/* Element i keeps iff (word >> 8) >= threshold, word = w[g & 3] of block
 * g >> 2, g = first_index + i (the uniform contract of rng.c, as
 * cpu_unary.c's dropout_keep). One thread per element: a block's words are
 * recomputed by its 4 elements, cheap next to the memory traffic. */
template <typename T>
__global__ void dropout_kernel(fl_cu_iter it, void *out, int od, const void *x, int xd,
                               uint64_t seed, uint64_t stream, uint64_t g0, uint32_t threshold,
                               T scale) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        uint64_t g = g0 + (uint64_t)i;
        uint32_t w[4];
        fl_cu_philox(g >> 2, stream, seed, w);
        bool keep = (w[g & 3] >> 8) >= threshold;
        T v = load_c(T(), x, off[1], xd);
        store_c(out, off[0], od, v * (keep ? scale : (T)0)); /* inf * 0 = NaN, as PyTorch */
    }
}

int fl_cuda_dropout(fl_tensor *out, const fl_tensor *x, double p, const fl_random_spec *key) {
    if (float_only("dropout", out)) return fl_last_status();
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device("dropout", out)) return fl_last_status();
    uint32_t threshold = (uint32_t)ceil(p * 0x1p24);
    double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
    const fl_tensor *ts[2] = {out, x};
    fl_cu_iter it;
    fl_cu_iter_init(&it, 2, ts);
    unsigned blocks = fl_cu_blocks(it.numel, FL_CU_THREADS);
    if (out->dtype == FL_F64)
        dropout_kernel<double><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            it, out->data, out->dtype, x->data, x->dtype, key->seed, key->stream,
            key->first_index, threshold, scale);
    else
        dropout_kernel<float><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            it, out->data, out->dtype, x->data, x->dtype, key->seed, key->stream,
            key->first_index, threshold, (float)scale);
    return fl_cu_check("dropout");
}
