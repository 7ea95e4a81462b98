/*
 * cpu_unary.c: CPU kernels of the unary math and activations (forward and
 * fused backward), of silu(gate) * up, and of dropout.
 *
 * Values are computed in f32 (f64 for f64 tensors, i64 for the integer
 * forms of abs/relu/square/clamp), through the strided iterator: dense f32
 * chunks are computed in place, others are loaded into scratch buffers,
 * computed and stored back converted, as cpu_binary.c does.
 *
 * [Note: vector math]
 * The loops are `omp simd` loops. On x86-64 glibc (2.35 and later) the f32
 * transcendental functions are declared below with GCC's simd attribute,
 * which is what <math.h> itself does under -ffast-math: the vectoriser then
 * calls libmvec's 4-wide expf/logf/tanhf/erff/powf (within 4 ulp, glibc's
 * documented bound) instead of one scalar call per element, about 2.5x
 * faster for silu, without fast-math's other licences (NaN and infinity
 * handling, reassociation) anywhere else. libm.so's linker script pulls in
 * libmvec as needed. Other platforms get the scalar calls.
 */
#include "cpu_elementwise.h"
#include "cpu_isa_dispatch.h"
#include "cpu_iter.h"
#include "cpu_rows_avx512.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define FL_SIMD_MATH __attribute__((simd("notinbranch")))
FL_SIMD_MATH float expf(float);
FL_SIMD_MATH float logf(float);
FL_SIMD_MATH float tanhf(float);
FL_SIMD_MATH float erff(float);
FL_SIMD_MATH float powf(float, float);
#endif

static const double SQRT_2_OVER_PI = 0.79788456080286535588; /* sqrt(2/pi), gelu tanh form */
static const double GELU_TANH_C = 0.044715;
static const double INV_SQRT_2 = 0.70710678118654752440;
static const double INV_SQRT_2PI = 0.39894228040143267794;    /* the normal density at 0 */

static fl_dtype compute_dtype(fl_dtype d) {
    if (d == FL_F64) return FL_F64;
    if (fl_dtype_is_float(d)) return FL_F32;
    return FL_I64;
}

/* ---- forward ------------------------------------------------------------------ */

/* One body for f32 and f64: T is the type, F suffixes the libm names. */
#define UNARY_FORWARD(T, EXP, LOG, SQRT, TANH, ERF, POW)                                      \
    switch (op) {                                                                           \
    case FL_EXP:                                                                            \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = EXP(x[i]);               \
        break;                                                                              \
    case FL_LOG:                                                                            \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = LOG(x[i]);               \
        break;                                                                              \
    case FL_SQRT:                                                                           \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = SQRT(x[i]);              \
        break;                                                                              \
    case FL_RSQRT:                                                                          \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = (T)1 / SQRT(x[i]);       \
        break;                                                                              \
    case FL_TANH:                                                                           \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = TANH(x[i]);              \
        break;                                                                              \
    case FL_SIGMOID:                                                                        \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = (T)1 / ((T)1 + EXP(-x[i])); \
        break;                                                                              \
    case FL_ABS:                                                                            \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = x[i] < 0 ? -x[i] : x[i]; \
        break;                                                                              \
    case FL_RELU: /* NaN stays NaN, as in PyTorch */                                        \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = x[i] < 0 ? (T)0 : x[i];  \
        break;                                                                              \
    case FL_GELU:                                                                           \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
            o[i] = (T)0.5 * x[i] * ((T)1 + ERF(x[i] * (T)INV_SQRT_2));                      \
        break;                                                                              \
    case FL_GELU_TANH:                                                                      \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                               \
            T v = x[i];                                                                     \
            T u = (T)SQRT_2_OVER_PI * (v + (T)GELU_TANH_C * v * v * v);                     \
            o[i] = (T)0.5 * v * ((T)1 + TANH(u));                                           \
        }                                                                                   \
        break;                                                                              \
    case FL_SILU:                                                                           \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = x[i] / ((T)1 + EXP(-x[i])); \
        break;                                                                              \
    case FL_SQUARE:                                                                         \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = x[i] * x[i];             \
        break;                                                                              \
    case FL_UNARY_POW: {                                                                    \
        T e = (T)p0;                                                                        \
        if (p0 == 2) {                                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = x[i] * x[i];         \
        } else if (p0 == 1) {                                                               \
            memcpy(o, x, (size_t)n * sizeof(T));                                            \
        } else if (p0 == 0.5) {                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = SQRT(x[i]);          \
        } else {                                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = POW(x[i], e);        \
        }                                                                                   \
        break;                                                                              \
    }                                                                                       \
    case FL_UNARY_CLAMP: {                                                                  \
        T lo = (T)p0, hi = (T)p1;                                                           \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                               \
            T v = x[i] < lo ? lo : x[i];                                                    \
            o[i] = v > hi ? hi : v;                                                         \
        }                                                                                   \
        break;                                                                              \
    }                                                                                       \
    default: FL_ASSERT(!"unary op");                                                        \
    }

FL_ISA_BODY void forward_f32_body(int op, float *restrict o, const float *restrict x, int64_t n,
                                  double p0, double p1) {
    UNARY_FORWARD(float, expf, logf, sqrtf, tanhf, erff, powf)
}
FL_ISA_CLONES_VOID(AVX512, forward_f32,
                   (int op, float *restrict o, const float *restrict x, int64_t n, double p0,
                    double p1),
                   (op, o, x, n, p0, p1))

static void forward_f64(int op, double *restrict o, const double *restrict x, int64_t n,
                        double p0, double p1) {
    UNARY_FORWARD(double, exp, log, sqrt, tanh, erf, pow)
}

/* A double bound -> int64, saturating (the infinities of absent bounds). */
static int64_t bound_i64(double v) {
    if (v <= -0x1p63) return INT64_MIN;
    if (v >= 0x1p63) return INT64_MAX;
    return (int64_t)v;
}

/* The ops that keep integers (unary.c sends no others here). */
static void forward_i64(int op, int64_t *restrict o, const int64_t *restrict x, int64_t n,
                        double p0, double p1) {
    switch (op) {
    case FL_ABS:
        for (int64_t i = 0; i < n; i++) o[i] = x[i] < 0 ? -x[i] : x[i];
        break;
    case FL_RELU:
        for (int64_t i = 0; i < n; i++) o[i] = x[i] < 0 ? 0 : x[i];
        break;
    case FL_SQUARE:
        for (int64_t i = 0; i < n; i++) o[i] = x[i] * x[i];
        break;
    case FL_UNARY_CLAMP: {
        int64_t lo = bound_i64(p0), hi = bound_i64(p1);
        for (int64_t i = 0; i < n; i++) {
            int64_t v = x[i] < lo ? lo : x[i];
            o[i] = v > hi ? hi : v;
        }
        break;
    }
    default: FL_ASSERT(!"integer unary op");
    }
}

/* [Note: every element through the vector path]
 * A vectorised loop leaves a remainder to scalar code, and libmvec's vector
 * functions and libm's scalar ones may differ in the last bit. Then an
 * element's result would depend on where it falls in a chunk (a row of a
 * tensor computed alone would differ from the same row computed within the
 * tensor). So the f32 kernels run on whole multiples of VEC_PAD elements
 * (a multiple of any vector length) and the rest goes through a padded
 * copy: every element takes the same path wherever it lies. */
enum { VEC_PAD = 16 };

static int64_t vec_main(int64_t n) { return n - n % VEC_PAD; }

static void forward_f32_all(int op, float *o, const float *x, int64_t n, double p0, double p1) {
    int64_t m = vec_main(n);
    if (m > 0) forward_f32(op, o, x, m, p0, p1);
    if (m == n) return;
    float xt[VEC_PAD] = {0}, ot[VEC_PAD];
    memcpy(xt, x + m, (size_t)(n - m) * sizeof(float));
    forward_f32(op, ot, xt, VEC_PAD, p0, p1);
    memcpy(o + m, ot, (size_t)(n - m) * sizeof(float));
}

static void forward(int op, fl_dtype t, void *o, const void *x, int64_t n, double p0, double p1) {
    switch (t) {
    case FL_F32: forward_f32_all(op, o, x, n, p0, p1); break;
    case FL_F64: forward_f64(op, o, x, n, p0, p1); break;
    case FL_I64: forward_i64(op, o, x, n, p0, p1); break;
    default: FL_ASSERT(!"unary compute dtype");
    }
}

typedef struct unary_ctx {
    int op;
    double p0, p1;
    fl_dtype out_dtype, x_dtype, compute;
} unary_ctx;

static void unary_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                        int64_t index) {
    (void)index;
    const unary_ctx *c = vctx;
    if (c->out_dtype == c->compute && c->x_dtype == c->compute && inner[0] == 1 && inner[1] == 1) {
        forward(c->op, c->compute, ptrs[0], ptrs[1], count, c->p0, c->p1);
        return;
    }
    _Alignas(8) char x[FL_CPU_SCRATCH * 8], o[FL_CPU_SCRATCH * 8];
    int64_t so = (int64_t)fl_dtype_size(c->out_dtype), sx = (int64_t)fl_dtype_size(c->x_dtype);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_cpu_load(x, c->compute, ptrs[1] + i * inner[1] * sx, c->x_dtype, inner[1], n);
        forward(c->op, c->compute, o, x, n, c->p0, c->p1);
        fl_cpu_store(ptrs[0] + i * inner[0] * so, c->out_dtype, inner[0], o, c->compute, n);
    }
}

int fl_cpu_unary(int op, fl_tensor *out, const fl_tensor *x, double p0, double p1) {
    unary_ctx c = {op, p0, p1, out->dtype, x->dtype, compute_dtype(out->dtype)};
    const fl_tensor *ts[2] = {out, x};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 2, ts);
    fl_cpu_iter_run(&it, unary_chunk, &c);
    return FL_OK;
}

/* ---- backward: gx = gy * f'(s), s = x or y (fl_unary_saves_output) ------------------ */

#define UNARY_BACKWARD(T, EXP, SQRT, TANH, ERF, POW)                                         \
    switch (op) {                                                                           \
    case FL_EXP: /* s = y */                                                                \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] = gy[i] * s[i];           \
        break;                                                                              \
    case FL_LOG:                                                                            \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] = gy[i] / s[i];           \
        break;                                                                              \
    case FL_SQRT: /* s = y: 1 / (2 y) */                                                    \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] = gy[i] / ((T)2 * s[i]);  \
        break;                                                                              \
    case FL_RSQRT: /* s = y: -y^3 / 2 */                                                    \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
            gx[i] = (T)-0.5 * gy[i] * s[i] * s[i] * s[i];                                   \
        break;                                                                              \
    case FL_TANH: /* s = y */                                                               \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
            gx[i] = gy[i] * ((T)1 - s[i] * s[i]);                                           \
        break;                                                                              \
    case FL_SIGMOID: /* s = y */                                                            \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
            gx[i] = gy[i] * s[i] * ((T)1 - s[i]);                                           \
        break;                                                                              \
    case FL_ABS: /* sign(x), 0 at 0 */                                                      \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
            gx[i] = s[i] > 0 ? gy[i] : (s[i] < 0 ? -gy[i] : (T)0);                          \
        break;                                                                              \
    case FL_RELU: /* s = y; PyTorch's threshold_backward: zero where y <= 0 */              \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] = s[i] <= 0 ? (T)0 : gy[i]; \
        break;                                                                              \
    case FL_GELU: /* Phi(x) + x phi(x) */                                                   \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                               \
            T v = s[i];                                                                     \
            T cdf = (T)0.5 * ((T)1 + ERF(v * (T)INV_SQRT_2));                               \
            T pdf = (T)INV_SQRT_2PI * EXP((T)-0.5 * v * v);                                 \
            gx[i] = gy[i] * (cdf + v * pdf);                                                \
        }                                                                                   \
        break;                                                                              \
    case FL_GELU_TANH: {                                                                    \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                               \
            T v = s[i];                                                                     \
            T t = TANH((T)SQRT_2_OVER_PI * (v + (T)GELU_TANH_C * v * v * v));               \
            T du = (T)SQRT_2_OVER_PI * ((T)1 + (T)(3 * GELU_TANH_C) * v * v);               \
            gx[i] = gy[i] * ((T)0.5 * ((T)1 + t) + (T)0.5 * v * ((T)1 - t * t) * du);      \
        }                                                                                   \
        break;                                                                              \
    }                                                                                       \
    case FL_SILU: /* sigma (1 + x (1 - sigma)) */                                           \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                               \
            T sg = (T)1 / ((T)1 + EXP(-s[i]));                                              \
            gx[i] = gy[i] * sg * ((T)1 + s[i] * ((T)1 - sg));                               \
        }                                                                                   \
        break;                                                                              \
    case FL_SQUARE:                                                                         \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] = (T)2 * s[i] * gy[i];    \
        break;                                                                              \
    case FL_UNARY_POW: {                                                                    \
        T e = (T)p0, em1 = (T)(p0 - 1);                                                     \
        if (p0 == 0) {                                                                      \
            memset(gx, 0, (size_t)n * sizeof(T));                                           \
        } else if (p0 == 2) {                                                               \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] = (T)2 * s[i] * gy[i]; \
        } else {                                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                             \
                gx[i] = gy[i] * e * POW(s[i], em1);                                         \
        }                                                                                   \
        break;                                                                              \
    }                                                                                       \
    case FL_UNARY_CLAMP: { /* lo <= x <= hi, boundaries included (NaN: 0) */                \
        T lo = (T)p0, hi = (T)p1;                                                           \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
            gx[i] = s[i] >= lo && s[i] <= hi ? gy[i] : (T)0;                                \
        break;                                                                              \
    }                                                                                       \
    default: FL_ASSERT(!"unary backward op");                                               \
    }

FL_ISA_BODY void backward_f32_body(int op, float *restrict gx, const float *restrict gy,
                                   const float *restrict s, int64_t n, double p0, double p1) {
    UNARY_BACKWARD(float, expf, sqrtf, tanhf, erff, powf)
}
FL_ISA_CLONES_VOID(AVX512, backward_f32,
                   (int op, float *restrict gx, const float *restrict gy, const float *restrict s,
                    int64_t n, double p0, double p1),
                   (op, gx, gy, s, n, p0, p1))

static void backward_f64(int op, double *restrict gx, const double *restrict gy,
                         const double *restrict s, int64_t n, double p0, double p1) {
    UNARY_BACKWARD(double, exp, sqrt, tanh, erf, pow)
}

typedef struct unary_bw_ctx {
    int op;
    double p0, p1;
    fl_dtype gx_dtype, gy_dtype, s_dtype, compute;
} unary_bw_ctx;

static void backward(const unary_bw_ctx *c, void *gx, const void *gy, const void *s, int64_t n) {
    if (c->compute == FL_F64) {
        backward_f64(c->op, gx, gy, s, n, c->p0, c->p1);
        return;
    }
    int64_t m = vec_main(n); /* see [Note: every element through the vector path] */
    if (m > 0) backward_f32(c->op, gx, gy, s, m, c->p0, c->p1);
    if (m == n) return;
    float gt[VEC_PAD] = {0}, st[VEC_PAD] = {0}, ot[VEC_PAD];
    memcpy(gt, (const float *)gy + m, (size_t)(n - m) * sizeof(float));
    memcpy(st, (const float *)s + m, (size_t)(n - m) * sizeof(float));
    backward_f32(c->op, ot, gt, st, VEC_PAD, c->p0, c->p1);
    memcpy((float *)gx + m, ot, (size_t)(n - m) * sizeof(float));
}

static void unary_bw_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                           int64_t index) {
    (void)index;
    const unary_bw_ctx *c = vctx;
    if (c->gx_dtype == c->compute && c->gy_dtype == c->compute && c->s_dtype == c->compute &&
        inner[0] == 1 && inner[1] == 1 && inner[2] == 1) {
        backward(c, ptrs[0], ptrs[1], ptrs[2], count);
        return;
    }
    _Alignas(8) char g[FL_CPU_SCRATCH * 8], s[FL_CPU_SCRATCH * 8], o[FL_CPU_SCRATCH * 8];
    int64_t so = (int64_t)fl_dtype_size(c->gx_dtype), sg = (int64_t)fl_dtype_size(c->gy_dtype),
            ss = (int64_t)fl_dtype_size(c->s_dtype);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_cpu_load(g, c->compute, ptrs[1] + i * inner[1] * sg, c->gy_dtype, inner[1], n);
        fl_cpu_load(s, c->compute, ptrs[2] + i * inner[2] * ss, c->s_dtype, inner[2], n);
        backward(c, o, g, s, n);
        fl_cpu_store(ptrs[0] + i * inner[0] * so, c->gx_dtype, inner[0], o, c->compute, n);
    }
}

int fl_cpu_unary_backward(int op, fl_tensor *gx, const fl_tensor *gy, const fl_tensor *s,
                          double p0, double p1) {
    unary_bw_ctx c = {op, p0, p1, gx->dtype, gy->dtype, s->dtype,
                      gx->dtype == FL_F64 ? FL_F64 : FL_F32};
    const fl_tensor *ts[3] = {gx, gy, s};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 3, ts);
    fl_cpu_iter_run(&it, unary_bw_chunk, &c);
    return FL_OK;
}

/* ---- silu(gate) * up ------------------------------------------------------------------ */

#define SILU_MUL(T, EXP)                                                                     \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = a[i] / ((T)1 + EXP(-a[i])) * b[i];

FL_ISA_BODY void silu_mul_f32_body(float *restrict o, const float *restrict a,
                                   const float *restrict b, int64_t n) {
    SILU_MUL(float, expf)
}
FL_ISA_CLONES_VOID(AVX512, silu_mul_f32,
                   (float *restrict o, const float *restrict a, const float *restrict b, int64_t n),
                   (o, a, b, n))

static void silu_mul_f64(double *restrict o, const double *restrict a, const double *restrict b,
                         int64_t n) {
    SILU_MUL(double, exp)
}

typedef struct silu_mul_ctx {
    fl_dtype dtype, compute;
} silu_mul_ctx;

static void silu_mul_compute(fl_dtype t, void *o, const void *a, const void *b, int64_t n) {
    if (t == FL_F64) {
        silu_mul_f64(o, a, b, n);
        return;
    }
    int64_t m = vec_main(n); /* see [Note: every element through the vector path] */
    if (m > 0) silu_mul_f32(o, a, b, m);
    if (m == n) return;
    float at[VEC_PAD] = {0}, bt[VEC_PAD] = {0}, ot[VEC_PAD];
    memcpy(at, (const float *)a + m, (size_t)(n - m) * sizeof(float));
    memcpy(bt, (const float *)b + m, (size_t)(n - m) * sizeof(float));
    silu_mul_f32(ot, at, bt, VEC_PAD);
    memcpy((float *)o + m, ot, (size_t)(n - m) * sizeof(float));
}

static void silu_mul_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                           int64_t index) {
    (void)index;
    const silu_mul_ctx *c = vctx;
    if (c->dtype == c->compute && inner[0] == 1 && inner[1] == 1 && inner[2] == 1) {
        silu_mul_compute(c->compute, ptrs[0], ptrs[1], ptrs[2], count);
        return;
    }
#if FL_ROWS_AVX512_BUILD
    if (c->dtype == FL_BF16 && inner[0] == 1 && inner[1] == 1 && inner[2] == 1 && fl_cpu_avx512()) {
        fl_avx512_silu_mul_bf16((uint16_t *)ptrs[0], (const uint16_t *)ptrs[1],
                                (const uint16_t *)ptrs[2], count);
        return;
    }
#endif
    _Alignas(8) char a[FL_CPU_SCRATCH * 8], b[FL_CPU_SCRATCH * 8], o[FL_CPU_SCRATCH * 8];
    int64_t sz = (int64_t)fl_dtype_size(c->dtype);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_cpu_load(a, c->compute, ptrs[1] + i * inner[1] * sz, c->dtype, inner[1], n);
        fl_cpu_load(b, c->compute, ptrs[2] + i * inner[2] * sz, c->dtype, inner[2], n);
        silu_mul_compute(c->compute, o, a, b, n);
        fl_cpu_store(ptrs[0] + i * inner[0] * sz, c->dtype, inner[0], o, c->compute, n);
    }
}

int fl_cpu_silu_mul(fl_tensor *out, const fl_tensor *gate, const fl_tensor *up) {
    silu_mul_ctx c = {out->dtype, compute_dtype(out->dtype)};
    const fl_tensor *ts[3] = {out, gate, up};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 3, ts);
    fl_cpu_iter_run(&it, silu_mul_chunk, &c);
    return FL_OK;
}

/* dgate = gy * up * sigma (1 + a (1 - sigma)), dup = gy * silu(a); either
 * output may be absent (NULL). */
#define SILU_MUL_BACKWARD(T, EXP)                                                            \
    if (ga && gb) {                                                                         \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                               \
            T sg = (T)1 / ((T)1 + EXP(-a[i]));                                              \
            ga[i] = g[i] * b[i] * sg * ((T)1 + a[i] * ((T)1 - sg));                         \
            gb[i] = g[i] * a[i] * sg;                                                       \
        }                                                                                   \
    } else if (ga) {                                                                        \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                               \
            T sg = (T)1 / ((T)1 + EXP(-a[i]));                                              \
            ga[i] = g[i] * b[i] * sg * ((T)1 + a[i] * ((T)1 - sg));                         \
        }                                                                                   \
    } else if (gb) {                                                                        \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
            gb[i] = g[i] * a[i] / ((T)1 + EXP(-a[i]));                                      \
    }

FL_ISA_BODY void silu_mul_bw_f32_body(float *restrict ga, float *restrict gb,
                                      const float *restrict g, const float *restrict a,
                                      const float *restrict b, int64_t n) {
    SILU_MUL_BACKWARD(float, expf)
}
FL_ISA_CLONES_VOID(AVX512, silu_mul_bw_f32,
                   (float *restrict ga, float *restrict gb, const float *restrict g,
                    const float *restrict a, const float *restrict b, int64_t n),
                   (ga, gb, g, a, b, n))

static void silu_mul_bw_f64(double *restrict ga, double *restrict gb, const double *restrict g,
                            const double *restrict a, const double *restrict b, int64_t n) {
    SILU_MUL_BACKWARD(double, exp)
}

/* See [Note: every element through the vector path]. */
static void silu_mul_bw_f32_all(float *ga, float *gb, const float *g, const float *a,
                                const float *b, int64_t n) {
    int64_t m = vec_main(n);
    if (m > 0) silu_mul_bw_f32(ga, gb, g, a, b, m);
    if (m == n) return;
    float gt[VEC_PAD] = {0}, at[VEC_PAD] = {0}, bt[VEC_PAD] = {0}, oa[VEC_PAD], ob[VEC_PAD];
    size_t rest = (size_t)(n - m) * sizeof(float);
    memcpy(gt, g + m, rest);
    memcpy(at, a + m, rest);
    memcpy(bt, b + m, rest);
    silu_mul_bw_f32(ga ? oa : NULL, gb ? ob : NULL, gt, at, bt, VEC_PAD);
    if (ga) memcpy(ga + m, oa, rest);
    if (gb) memcpy(gb + m, ob, rest);
}

enum { FLAT_CHUNK = 4096, FLAT_PARALLEL_MIN = 1 << 16 };

int fl_cpu_silu_mul_backward(fl_tensor *g_gate, fl_tensor *g_up, const fl_tensor *gy,
                             const fl_tensor *gate, const fl_tensor *up) {
    fl_dtype dt = gate->dtype, gdt = gy->dtype, compute = compute_dtype(dt);
    int64_t n = gate->numel, sz = (int64_t)fl_dtype_size(dt), gsz = (int64_t)fl_dtype_size(gdt);
    const char *pg = gy->data, *pa = gate->data, *pb = up->data;
    char *pga = g_gate ? g_gate->data : NULL, *pgb = g_up ? g_up->data : NULL;
    bool direct = dt == compute && gdt == compute;
#if FL_ROWS_AVX512_BUILD
    /* bf16 read and written as such (cpu_rows_avx512.c), same bits */
    bool bf16_wide = dt == FL_BF16 && gdt == FL_BF16 && fl_cpu_avx512();
#endif
    int64_t chunks = (n + FLAT_CHUNK - 1) / FLAT_CHUNK;
#pragma omp parallel for schedule(static) if (n >= FLAT_PARALLEL_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t start = c * FLAT_CHUNK, len = n - start < FLAT_CHUNK ? n - start : FLAT_CHUNK;
        _Alignas(8) char g[FL_CPU_SCRATCH * 8], a[FL_CPU_SCRATCH * 8], b[FL_CPU_SCRATCH * 8],
            oa[FL_CPU_SCRATCH * 8], ob[FL_CPU_SCRATCH * 8];
        for (int64_t i = start; i < start + len; i += FL_CPU_SCRATCH) {
            int64_t m = start + len - i < FL_CPU_SCRATCH ? start + len - i : FL_CPU_SCRATCH;
            const void *xg = pg + i * gsz, *xa = pa + i * sz, *xb = pb + i * sz;
            void *ya = pga ? pga + i * sz : NULL, *yb = pgb ? pgb + i * sz : NULL;
#if FL_ROWS_AVX512_BUILD
            if (bf16_wide) {
                fl_avx512_silu_mul_backward_bf16(ya, yb, xg, xa, xb, m);
                continue;
            }
#endif
            if (!direct) {
                fl_cpu_load(g, compute, xg, gdt, 1, m);
                fl_cpu_load(a, compute, xa, dt, 1, m);
                fl_cpu_load(b, compute, xb, dt, 1, m);
                xg = g, xa = a, xb = b;
                ya = pga ? (void *)oa : NULL;
                yb = pgb ? (void *)ob : NULL;
            }
            if (compute == FL_F64)
                silu_mul_bw_f64(ya, yb, xg, xa, xb, m);
            else
                silu_mul_bw_f32_all(ya, yb, xg, xa, xb, m);
            if (!direct) {
                if (pga) fl_cpu_store(pga + i * sz, dt, 1, oa, compute, m);
                if (pgb) fl_cpu_store(pgb + i * sz, dt, 1, ob, compute, m);
            }
        }
    }
    return FL_OK;
}

/* ---- dropout ------------------------------------------------------------------------------ */

/* The uniform contract of rng.c, restated for speed (rng.c's comment is the
 * authority; fsdp.rand with the same key gives the same u_i, which the
 * tests check): element g = first_index + i takes word g & 3 of Philox block
 * g >> 2 under counter {lo(b), hi(b), lo(stream), hi(stream)} and key
 * {lo(seed), hi(seed)}, and u = (word >> 8) 2^-24. Since u is a multiple
 * of 2^-24, u >= p exactly when (word >> 8) >= ceil(p 2^24): an integer
 * comparison. */
typedef struct dropout_ctx {
    const fl_random_spec *key;
    uint32_t threshold; /* keep iff (word >> 8) >= threshold */
    double scale;
    fl_dtype out_dtype, x_dtype, compute;
} dropout_ctx;

/* keep[j] for elements g0 ... g0 + n - 1 (n >= 1). */
static void dropout_keep(const dropout_ctx *c, uint64_t g0, int64_t n, uint8_t *keep) {
    uint64_t first = g0 >> 2, last = (g0 + (uint64_t)n - 1) >> 2;
    for (uint64_t b = first; b <= last; b += FL_PHILOX_LANES) {
        uint32_t w[4][FL_PHILOX_LANES];
        fl_philox_lanes(c->key, b, w);
        for (int l = 0; l < FL_PHILOX_LANES && b + (uint64_t)l <= last; l++) {
            for (int word = 0; word < 4; word++) {
                uint64_t g = (b + (uint64_t)l) * 4 + (uint64_t)word;
                if (g < g0 || g - g0 >= (uint64_t)n) continue;
                keep[g - g0] = (w[word][l] >> 8) >= c->threshold;
            }
        }
        if (last - b < FL_PHILOX_LANES) break; /* (b += 8 could wrap at the end of the counter) */
    }
}

/* o = x * m with m = keep ? scale : 0 (x * 0 keeps PyTorch's inf * 0 = NaN). */
#define DROPOUT_APPLY(T, o, x, keep, scale, n)                                               \
    do {                                                                                    \
        T s_ = (T)(scale);                                                                  \
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++)                                 \
            (o)[j] = (x)[j] * (keep[j] ? s_ : (T)0);                                        \
    } while (0)

static void dropout_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                          int64_t index) {
    const dropout_ctx *c = vctx;
    bool direct = c->out_dtype == c->compute && c->x_dtype == c->compute && inner[0] == 1 &&
                  inner[1] == 1;
    _Alignas(8) char x[FL_CPU_SCRATCH * 8];
    uint8_t keep[FL_CPU_SCRATCH];
    int64_t so = (int64_t)fl_dtype_size(c->out_dtype), sx = (int64_t)fl_dtype_size(c->x_dtype);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        dropout_keep(c, c->key->first_index + (uint64_t)(index + i), n, keep);
        char *o = ptrs[0] + i * inner[0] * so;
        const char *src = ptrs[1] + i * inner[1] * sx;
        if (!direct) {
            fl_cpu_load(x, c->compute, src, c->x_dtype, inner[1], n);
            src = x;
        }
        char *dst = direct ? o : x;
        if (c->compute == FL_F64)
            DROPOUT_APPLY(double, (double *)dst, (const double *)src, keep, c->scale, n);
        else
            DROPOUT_APPLY(float, (float *)dst, (const float *)src, keep, c->scale, n);
        if (!direct) fl_cpu_store(o, c->out_dtype, inner[0], x, c->compute, n);
    }
}

int fl_cpu_dropout(fl_tensor *out, const fl_tensor *x, double p, const fl_random_spec *key) {
    /* ceil(p 2^24) <= 2^24: at p = 1 no 24-bit word reaches it, all dropped. */
    dropout_ctx c = {key, (uint32_t)ceil(p * 0x1p24), p < 1 ? 1.0 / (1.0 - p) : 0.0,
                     out->dtype, x->dtype, compute_dtype(out->dtype)};
    const fl_tensor *ts[2] = {out, x};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 2, ts);
    fl_cpu_iter_run(&it, dropout_chunk, &c);
    return FL_OK;
}
