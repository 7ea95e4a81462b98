/*
 * check_sim_cudnn.c: checks the cudasim cuDNN stand-in (sim_cudnn.c) on its
 * own, before the CUDA backend is trusted to it: forward against hand-worked
 * sums and an independent f64 reference, backward data and backward filter
 * through the adjoint identity
 *     <conv(x, w), dy> = <x, convT(w, dy)> = <w, dW(x, dy)>   (in f64),
 * plus alpha/beta blending, rounding to bf16/f16, TF32 under non-FMA math,
 * and the statuses wrong descriptors must get. One line per case; exits
 * non-zero if any case fails.
 *
 * Build and run (from the repository root):
 *   gcc -std=c11 -O2 -Wall -Wextra -I/usr/local/cuda/include tests/cudasim/check_sim_cudnn.c tests/cudasim/sim_cudnn.c -lm -o /tmp/check_sim_cudnn && /tmp/check_sim_cudnn
 */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <cudnn.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static cudnnHandle_t handle;

static void report(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok) failures++;
}

#define CHECK_DNN(call)                                                                            \
    do {                                                                                           \
        cudnnStatus_t st_ = (call);                                                                \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                         \
            printf("FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudnnGetErrorString(st_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------ host-side values */

/* The test's own conversions, written independently of the simulation's:
 * through the FPU where it can do the rounding (f32 <-> double), by bits
 * only for bf16 (truncation of a value already exact in bf16). Test data
 * are generated already representable, so no rounding is needed here. */
static uint16_t bf16_exact(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (u & 0xffffu) {
        printf("FAIL test data %g not exact in bf16\n", f);
        exit(1);
    }
    return (uint16_t)(u >> 16);
}

static double bf16_val(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary16 value by formula (no bit tricks shared with the simulation). */
static double f16_val(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Encode a value that is exact in binary16 (normal range, as test data are). */
static uint16_t f16_exact(double v) {
    if (v == 0) return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    double a = fabs(v);
    int e;
    double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    int m = (int)ldexp(fr, 11) - 1024;
    uint16_t h = (uint16_t)(sign | ((e + 14) << 10) | m);
    if (f16_val(h) != v) {
        printf("FAIL test data %g not exact in f16\n", v);
        exit(1);
    }
    return h;
}

typedef struct {
    cudnnDataType_t dt;
    size_t n;
    void *p;
} buf;

static size_t elem_size(cudnnDataType_t dt) {
    return dt == CUDNN_DATA_DOUBLE ? 8 : dt == CUDNN_DATA_FLOAT ? 4 : 2;
}

static buf buf_new(cudnnDataType_t dt, size_t n) {
    buf b = {dt, n, calloc(n ? n : 1, elem_size(dt))};
    return b;
}

static double get(const buf *b, size_t i) {
    switch (b->dt) {
    case CUDNN_DATA_DOUBLE: return ((double *)b->p)[i];
    case CUDNN_DATA_FLOAT: return ((float *)b->p)[i];
    case CUDNN_DATA_HALF: return f16_val(((uint16_t *)b->p)[i]);
    default: return bf16_val(((uint16_t *)b->p)[i]);
    }
}

/* v must be exact in the buffer's type (checked for 16-bit types). */
static void put(buf *b, size_t i, double v) {
    switch (b->dt) {
    case CUDNN_DATA_DOUBLE: ((double *)b->p)[i] = v; break;
    case CUDNN_DATA_FLOAT: ((float *)b->p)[i] = (float)v; break;
    case CUDNN_DATA_HALF: ((uint16_t *)b->p)[i] = f16_exact(v); break;
    default: ((uint16_t *)b->p)[i] = bf16_exact((float)v); break;
    }
}

/* Small integers over 16 or 32 keep every test value exact in all four
 * types; a deterministic LCG keeps runs reproducible. */
static uint32_t rng = 12345;
static double rnd_val(void) {
    rng = rng * 1664525u + 1013904223u;
    int k = (int)((rng >> 16) % 31) - 15; /* -15 .. 15 */
    return k / 16.0;
}

static void fill_random(buf *b) {
    for (size_t i = 0; i < b->n; i++) put(b, i, rnd_val());
}

static void fill_raw(buf *b, unsigned char byte) { memset(b->p, byte, b->n * elem_size(b->dt)); }

/* ---------------------------------------------------------- descriptors */

typedef struct {
    int N, C, H, W, K, R, S, G;
    int pad[2], stride[2], dil[2];
    cudnnConvolutionMode_t mode;
    cudnnDataType_t dt;
    cudnnMathType_t math;
    int P, Q; /* output size, computed */
} conv_case;

typedef struct {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t cv;
} descs;

static int out_size(int in, int pad, int k, int dil, int stride) {
    return (in + 2 * pad - ((k - 1) * dil + 1)) / stride + 1;
}

static descs make(conv_case *c) {
    descs d;
    c->P = out_size(c->H, c->pad[0], c->R, c->dil[0], c->stride[0]);
    c->Q = out_size(c->W, c->pad[1], c->S, c->dil[1], c->stride[1]);
    cudnnDataType_t ct = c->dt == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    CHECK_DNN(cudnnCreateTensorDescriptor(&d.x));
    CHECK_DNN(cudnnCreateTensorDescriptor(&d.y));
    CHECK_DNN(cudnnCreateFilterDescriptor(&d.w));
    CHECK_DNN(cudnnCreateConvolutionDescriptor(&d.cv));
    CHECK_DNN(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, c->dt, c->N, c->C, c->H, c->W));
    CHECK_DNN(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, c->dt, c->N, c->K, c->P, c->Q));
    CHECK_DNN(cudnnSetFilter4dDescriptor(d.w, c->dt, CUDNN_TENSOR_NCHW, c->K, c->C / c->G, c->R, c->S));
    CHECK_DNN(cudnnSetConvolution2dDescriptor(d.cv, c->pad[0], c->pad[1], c->stride[0], c->stride[1],
                                              c->dil[0], c->dil[1], c->mode, ct));
    CHECK_DNN(cudnnSetConvolutionMathType(d.cv, c->math));
    if (c->G != 1) CHECK_DNN(cudnnSetConvolutionGroupCount(d.cv, c->G));
    return d;
}

static void destroy(descs *d) {
    cudnnDestroyTensorDescriptor(d->x);
    cudnnDestroyTensorDescriptor(d->y);
    cudnnDestroyFilterDescriptor(d->w);
    cudnnDestroyConvolutionDescriptor(d->cv);
}

/* alpha/beta in the type cuDNN reads them as: double for DOUBLE data. */
typedef struct {
    float f;
    double d;
} scal;

static const void *sp(const scal *s, cudnnDataType_t dt) {
    return dt == CUDNN_DATA_DOUBLE ? (const void *)&s->d : (const void *)&s->f;
}

static scal S(double v) {
    scal s = {(float)v, v};
    return s;
}

static cudnnStatus_t fwd(const descs *d, const conv_case *c, double alpha, const buf *x,
                         const buf *w, double beta, buf *y) {
    scal a = S(alpha), b = S(beta);
    return cudnnConvolutionForward(handle, sp(&a, c->dt), d->x, x->p, d->w, w->p, d->cv,
                                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, sp(&b, c->dt),
                                   d->y, y->p);
}

static cudnnStatus_t bwd_data(const descs *d, const conv_case *c, double alpha, const buf *w,
                              const buf *dy, double beta, buf *dx) {
    scal a = S(alpha), b = S(beta);
    return cudnnConvolutionBackwardData(handle, sp(&a, c->dt), d->w, w->p, d->y, dy->p, d->cv,
                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, NULL, 0, sp(&b, c->dt),
                                        d->x, dx->p);
}

static cudnnStatus_t bwd_filter(const descs *d, const conv_case *c, double alpha, const buf *x,
                                const buf *dy, double beta, buf *dw) {
    scal a = S(alpha), b = S(beta);
    return cudnnConvolutionBackwardFilter(handle, sp(&a, c->dt), d->x, x->p, d->y, dy->p, d->cv,
                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, NULL, 0,
                                          sp(&b, c->dt), d->w, dw->p);
}

/* ---------------------------------------------------- reference forward */

/* Straight from the definition in f64, packed NCHW/KCRS, taking the filter
 * tap as stored (cross-correlation) or mirrored (convolution). */
static void ref_forward(const conv_case *c, const buf *x, const buf *w, double *y) {
    int Cg = c->C / c->G, Kg = c->K / c->G;
    for (int n = 0; n < c->N; n++)
        for (int k = 0; k < c->K; k++)
            for (int p = 0; p < c->P; p++)
                for (int q = 0; q < c->Q; q++) {
                    double acc = 0;
                    for (int ci = 0; ci < Cg; ci++)
                        for (int r = 0; r < c->R; r++)
                            for (int s = 0; s < c->S; s++) {
                                int h = p * c->stride[0] - c->pad[0] + r * c->dil[0];
                                int ww = q * c->stride[1] - c->pad[1] + s * c->dil[1];
                                if (h < 0 || h >= c->H || ww < 0 || ww >= c->W) continue;
                                int cx = (k / Kg) * Cg + ci;
                                int rr = c->mode == CUDNN_CONVOLUTION ? c->R - 1 - r : r;
                                int ss = c->mode == CUDNN_CONVOLUTION ? c->S - 1 - s : s;
                                acc += get(x, (((size_t)n * c->C + cx) * c->H + h) * c->W + ww) *
                                       get(w, (((size_t)k * Cg + ci) * c->R + rr) * c->S + ss);
                            }
                    y[(((size_t)n * c->K + k) * c->P + p) * c->Q + q] = acc;
                }
}

static double dot(const buf *a, const buf *b) {
    double s = 0;
    for (size_t i = 0; i < a->n; i++) s += get(a, i) * get(b, i);
    return s;
}

static double absdot(const buf *a, const buf *b) {
    double s = 0;
    for (size_t i = 0; i < a->n; i++) s += fabs(get(a, i) * get(b, i));
    return s;
}

/* Relative tolerance of one rounding to the data type, padded for the
 * accumulation in the compute type. */
static double tol(cudnnDataType_t dt) {
    switch (dt) {
    case CUDNN_DATA_DOUBLE: return 1e-12;
    case CUDNN_DATA_FLOAT: return 1e-5;
    case CUDNN_DATA_HALF: return 2e-3;
    default: return 1.6e-2;
    }
}

static const char *dt_name(cudnnDataType_t dt) {
    switch (dt) {
    case CUDNN_DATA_DOUBLE: return "f64";
    case CUDNN_DATA_FLOAT: return "f32";
    case CUDNN_DATA_HALF: return "f16";
    default: return "bf16";
    }
}

/* ------------------------------------------------------------- the cases */

/* Forward (against the reference, elementwise), then the adjoint identity
 * for backward data and backward filter, then alpha/beta on all three. */
static void adjoint_case(const char *name, conv_case c) {
    descs d = make(&c);
    size_t nx = (size_t)c.N * c.C * c.H * c.W, nw = (size_t)c.K * (c.C / c.G) * c.R * c.S;
    size_t ny = (size_t)c.N * c.K * c.P * c.Q;
    buf x = buf_new(c.dt, nx), w = buf_new(c.dt, nw), y = buf_new(c.dt, ny), dy = buf_new(c.dt, ny);
    buf dx = buf_new(c.dt, nx), dw = buf_new(c.dt, nw);
    fill_random(&x), fill_random(&w), fill_random(&dy);
    /* NaN in every output: beta = 0 must not read them. */
    fill_raw(&y, 0xff), fill_raw(&dx, 0xff), fill_raw(&dw, 0xff);
    cudnnStatus_t s1 = fwd(&d, &c, 1, &x, &w, 0, &y);
    cudnnStatus_t s2 = bwd_data(&d, &c, 1, &w, &dy, 0, &dx);
    cudnnStatus_t s3 = bwd_filter(&d, &c, 1, &x, &dy, 0, &dw);
    if (s1 || s2 || s3) {
        report(0, "%s [%s]: statuses %s %s %s", name, dt_name(c.dt), cudnnGetErrorString(s1),
               cudnnGetErrorString(s2), cudnnGetErrorString(s3));
        goto out;
    }
    double *ref = malloc(ny * sizeof *ref), worst = 0;
    ref_forward(&c, &x, &w, ref);
    for (size_t i = 0; i < ny; i++) {
        double e = fabs(get(&y, i) - ref[i]) / (fabs(ref[i]) + 1e-3);
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    free(ref);
    report(worst <= tol(c.dt), "%s [%s] forward vs f64 reference: worst rel err %.3g (P=%d Q=%d)",
           name, dt_name(c.dt), worst, c.P, c.Q);

    double a = dot(&y, &dy), b = dot(&x, &dx), cc = dot(&w, &dw);
    double scale = absdot(&y, &dy) + absdot(&x, &dx) + absdot(&w, &dw) + 1e-30;
    double e1 = fabs(a - b) / scale, e2 = fabs(a - cc) / scale;
    report(e1 <= tol(c.dt) && e2 <= tol(c.dt),
           "%s [%s] adjoint: <y,dy>=%.9g <x,dx>=%.9g <w,dW>=%.9g (rel %.2g, %.2g)", name,
           dt_name(c.dt), a, b, cc, e1, e2);

    /* Blending: out = 2*result + 0.5*prior, with the results above as the
     * priors; every value involved is a multiple of a power of two small
     * enough that f32 represents it, so compare against 2.5*prior (up to
     * the final rounding for 16-bit types). */
    buf y0 = buf_new(c.dt, ny), dx0 = buf_new(c.dt, nx), dw0 = buf_new(c.dt, nw);
    memcpy(y0.p, y.p, ny * elem_size(c.dt));
    memcpy(dx0.p, dx.p, nx * elem_size(c.dt));
    memcpy(dw0.p, dw.p, nw * elem_size(c.dt));
    s1 = fwd(&d, &c, 2, &x, &w, 0.5, &y);
    s2 = bwd_data(&d, &c, 2, &w, &dy, 0.5, &dx);
    s3 = bwd_filter(&d, &c, 2, &x, &dy, 0.5, &dw);
    double wb = 0;
    const buf *outs[3] = {&y, &dx, &dw}, *priors[3] = {&y0, &dx0, &dw0};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < outs[t]->n; i++) {
            double want = 2.5 * get(priors[t], i), e = fabs(get(outs[t], i) - want) / (fabs(want) + 1e-3);
            if (!(e <= wb)) wb = e;
        }
    report(!s1 && !s2 && !s3 && wb <= tol(c.dt),
           "%s [%s] alpha=2 beta=0.5 on all three: worst rel err %.3g", name, dt_name(c.dt), wb);
    free(y0.p), free(dx0.p), free(dw0.p);
out:
    free(x.p), free(w.p), free(y.p), free(dy.p), free(dx.p), free(dw.p);
    destroy(&d);
}

static conv_case base(cudnnDataType_t dt) {
    conv_case c;
    memset(&c, 0, sizeof c);
    c.N = 2, c.C = 3, c.H = 7, c.W = 6, c.K = 4, c.R = 3, c.S = 2, c.G = 1;
    c.pad[0] = 1, c.pad[1] = 2, c.stride[0] = 2, c.stride[1] = 1, c.dil[0] = 1, c.dil[1] = 2;
    c.mode = CUDNN_CROSS_CORRELATION, c.dt = dt;
    c.math = dt == CUDNN_DATA_FLOAT || dt == CUDNN_DATA_DOUBLE ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    return c;
}

/* 4x4 image 1..16, 3x3 all-ones filter: each output is the sum of the
 * 3x3 neighbourhood, worked out by hand below. */
static void hand_case(void) {
    conv_case c = base(CUDNN_DATA_FLOAT);
    c.N = 1, c.C = 1, c.H = 4, c.W = 4, c.K = 1, c.R = 3, c.S = 3;
    c.pad[0] = c.pad[1] = 1, c.stride[0] = c.stride[1] = 1, c.dil[0] = c.dil[1] = 1;
    static const double want[16] = {14, 24, 30, 22, 33, 54, 63, 45, 57, 90, 99, 69, 46, 72, 78, 54};
    descs d = make(&c);
    buf x = buf_new(c.dt, 16), w = buf_new(c.dt, 9), y = buf_new(c.dt, 16);
    for (int i = 0; i < 16; i++) put(&x, i, i + 1);
    for (int i = 0; i < 9; i++) put(&w, i, 1);
    cudnnStatus_t st = fwd(&d, &c, 1, &x, &w, 0, &y);
    int ok = st == CUDNN_STATUS_SUCCESS && c.P == 4 && c.Q == 4;
    for (int i = 0; ok && i < 16; i++) ok = get(&y, i) == want[i];
    report(ok, "hand: 3x3 ones over 1..16, pad 1 -> neighbourhood sums (y[1][1]=%g, want 54)",
           get(&y, 5));
    destroy(&d);

    /* Same image, stride 2 and no padding: one output, the top-left 3x3. */
    c.pad[0] = c.pad[1] = 0, c.stride[0] = c.stride[1] = 2;
    d = make(&c);
    st = fwd(&d, &c, 1, &x, &w, 0, &y);
    report(st == CUDNN_STATUS_SUCCESS && c.P == 1 && c.Q == 1 && get(&y, 0) == 54,
           "hand: stride 2, no pad -> 1x1 output = 54 (got %g)", get(&y, 0));
    destroy(&d);

    /* Dilation 2 on 1..16 with a 2x2 ones filter, no pad: taps (0,0) (0,2)
     * (2,0) (2,2) of each window: 1+3+9+11=24, 2+4+10+12=28, 5+7+13+15=40,
     * 6+8+14+16=44. */
    c.R = c.S = 2, c.stride[0] = c.stride[1] = 1, c.dil[0] = c.dil[1] = 2;
    d = make(&c);
    st = fwd(&d, &c, 1, &x, &w, 0, &y);
    ok = st == CUDNN_STATUS_SUCCESS && c.P == 2 && c.Q == 2 && get(&y, 0) == 24 && get(&y, 1) == 28 &&
         get(&y, 2) == 40 && get(&y, 3) == 44;
    report(ok, "hand: dilation 2, 2x2 ones -> 24 28 40 44 (got %g %g %g %g)", get(&y, 0),
           get(&y, 1), get(&y, 2), get(&y, 3));
    destroy(&d);
    free(x.p), free(w.p), free(y.p);
}

/* w = [[1,2],[3,4]] over x = [[1,10],[100,1000]]: cross-correlation reads
 * the digits in order (4321), convolution mirrors the filter (1234). */
static void mode_case(void) {
    for (int m = 0; m < 2; m++) {
        conv_case c = base(CUDNN_DATA_DOUBLE);
        c.N = c.C = c.K = 1, c.H = c.W = c.R = c.S = 2;
        c.pad[0] = c.pad[1] = 0, c.stride[0] = c.stride[1] = c.dil[0] = c.dil[1] = 1;
        c.mode = m ? CUDNN_CONVOLUTION : CUDNN_CROSS_CORRELATION;
        descs d = make(&c);
        buf x = buf_new(c.dt, 4), w = buf_new(c.dt, 4), y = buf_new(c.dt, 1);
        double xv[4] = {1, 10, 100, 1000};
        for (int i = 0; i < 4; i++) put(&x, i, xv[i]), put(&w, i, i + 1);
        cudnnStatus_t st = fwd(&d, &c, 1, &x, &w, 0, &y);
        double want = m ? 1234 : 4321;
        report(st == CUDNN_STATUS_SUCCESS && get(&y, 0) == want, "mode %s: %g (want %g)",
               m ? "CUDNN_CONVOLUTION" : "CUDNN_CROSS_CORRELATION", get(&y, 0), want);
        destroy(&d);
        free(x.p), free(w.p), free(y.p);
    }
}

/* A 1x1 conv over two channels with unit weights computes alpha*(x0 + x1)
 * in f32 and rounds that once to the data type: ties go to even (also
 * among f16 subnormals), overflow to infinity, NaN stays NaN. Raw 16-bit
 * patterns are compared. */
static void rounding_case(cudnnDataType_t dt, double x0, double x1, double alpha, uint16_t want,
                          const char *what) {
    conv_case c = base(dt);
    c.N = 1, c.C = 2, c.H = c.W = 1, c.K = 1, c.R = c.S = 1;
    c.pad[0] = c.pad[1] = 0, c.stride[0] = c.stride[1] = c.dil[0] = c.dil[1] = 1;
    descs d = make(&c);
    buf x = buf_new(dt, 2), w = buf_new(dt, 2), y = buf_new(dt, 1);
    if (isnan(x0)) {
        ((uint16_t *)x.p)[0] = dt == CUDNN_DATA_HALF ? 0x7e00 : 0x7fc0;
    } else {
        put(&x, 0, x0);
    }
    put(&x, 1, x1), put(&w, 0, 1), put(&w, 1, 1);
    cudnnStatus_t st = fwd(&d, &c, alpha, &x, &w, 0, &y);
    uint16_t got = ((uint16_t *)y.p)[0];
    int ok = st == CUDNN_STATUS_SUCCESS &&
             (isnan(x0) ? isnan(dt == CUDNN_DATA_HALF ? f16_val(got) : bf16_val(got)) : got == want);
    if (isnan(x0))
        report(ok, "round to %s: %s -> 0x%04x (want a NaN)", dt_name(dt), what, got);
    else
        report(ok, "round to %s: %s -> 0x%04x (want 0x%04x)", dt_name(dt), what, got, want);
    destroy(&d);
    free(x.p), free(w.p), free(y.p);
}

/* FLOAT data: under CUDNN_FMA_MATH products are exact f32 ones; under the
 * default math type the operands go through TF32 (10-bit mantissa), so
 * 1 + 2^-20 times 1 comes out as 1. */
static void tf32_case(void) {
    for (int m = 0; m < 2; m++) {
        conv_case c = base(CUDNN_DATA_FLOAT);
        c.N = c.C = c.K = 1, c.H = c.W = c.R = c.S = 1;
        c.pad[0] = c.pad[1] = 0, c.stride[0] = c.stride[1] = c.dil[0] = c.dil[1] = 1;
        c.math = m ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
        descs d = make(&c);
        buf x = buf_new(c.dt, 1), w = buf_new(c.dt, 1), y = buf_new(c.dt, 1);
        double v = 1 + ldexp(1, -20);
        put(&x, 0, v), put(&w, 0, 1);
        cudnnStatus_t st = fwd(&d, &c, 1, &x, &w, 0, &y);
        double want = m ? 1.0 : v;
        report(st == CUDNN_STATUS_SUCCESS && get(&y, 0) == want,
               "f32 under %s: (1+2^-20)*1 = 1+%g*2^-20 (want %s)", m ? "DEFAULT_MATH" : "FMA_MATH",
               (get(&y, 0) - 1) * ldexp(1, 20), m ? "TF32: 1" : "exact");
        destroy(&d);
        free(x.p), free(w.p), free(y.p);
    }
}

/* Explicit strides (Ex): x stored with 3 spare elements after each row
 * must give the same forward result as the packed x. */
static void strided_case(void) {
    conv_case c = base(CUDNN_DATA_FLOAT);
    descs d = make(&c);
    size_t nx = (size_t)c.N * c.C * c.H * c.W, ny = (size_t)c.N * c.K * c.P * c.Q;
    size_t nw = (size_t)c.K * c.C * c.R * c.S;
    int rs = c.W + 3;
    buf x = buf_new(c.dt, nx), xs = buf_new(c.dt, (size_t)c.N * c.C * c.H * rs);
    buf w = buf_new(c.dt, nw), y = buf_new(c.dt, ny), ys = buf_new(c.dt, ny);
    fill_random(&x), fill_random(&w);
    fill_raw(&xs, 0xff); /* NaN in the gaps: must never be read */
    for (int i = 0; i < c.N * c.C * c.H; i++)
        for (int j = 0; j < c.W; j++) put(&xs, (size_t)i * rs + j, get(&x, (size_t)i * c.W + j));
    cudnnTensorDescriptor_t xd;
    CHECK_DNN(cudnnCreateTensorDescriptor(&xd));
    CHECK_DNN(cudnnSetTensor4dDescriptorEx(xd, c.dt, c.N, c.C, c.H, c.W, c.C * c.H * rs, c.H * rs, rs, 1));
    cudnnStatus_t s1 = fwd(&d, &c, 1, &x, &w, 0, &y);
    scal one = S(1), zero = S(0);
    cudnnStatus_t s2 = cudnnConvolutionForward(handle, &one.f, xd, xs.p, d.w, w.p, d.cv,
                                               CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                               &zero.f, d.y, ys.p);
    report(!s1 && !s2 && memcmp(y.p, ys.p, ny * 4) == 0,
           "Ex strides: padded rows give the packed result bit for bit");
    cudnnDestroyTensorDescriptor(xd);
    destroy(&d);
    free(x.p), free(xs.p), free(w.p), free(y.p), free(ys.p);
}

/* The v7 heuristics: one result, SUCCESS, no workspace, the descriptor's
 * math type; workspace queries give 0. */
static void heuristics_case(void) {
    conv_case c = base(CUDNN_DATA_FLOAT);
    descs d = make(&c);
    cudnnConvolutionFwdAlgoPerf_t pf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t pw[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int nf = -1, nd = -1, nw = -1;
    cudnnStatus_t s1 = cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x, d.w, d.cv, d.y,
                                                              CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nf, pf);
    cudnnStatus_t s2 = cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, d.w, d.y, d.cv, d.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, pd);
    cudnnStatus_t s3 = cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, d.x, d.y, d.cv, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nw, pw);
    int ok = !s1 && !s2 && !s3 && nf == 1 && nd == 1 && nw == 1 && pf[0].status == 0 &&
             pd[0].status == 0 && pw[0].status == 0 && pf[0].memory == 0 && pd[0].memory == 0 &&
             pw[0].memory == 0 && pf[0].mathType == CUDNN_FMA_MATH;
    size_t ws = 1;
    ok = ok && cudnnGetConvolutionForwardWorkspaceSize(handle, d.x, d.w, d.cv, d.y, pf[0].algo, &ws) == 0 &&
         ws == 0;
    report(ok, "_v7 heuristics: one SUCCESS result each, memory 0, math type kept; workspace 0");

    /* Bad descriptors fail the query itself; an unsupported configuration
     * gives a SUCCESS query whose entry says NOT_SUPPORTED. */
    cudnnTensorDescriptor_t bad;
    CHECK_DNN(cudnnCreateTensorDescriptor(&bad));
    CHECK_DNN(cudnnSetTensor4dDescriptor(bad, CUDNN_TENSOR_NCHW, c.dt, c.N, c.K, c.P + 1, c.Q));
    s1 = cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x, d.w, d.cv, bad, 8, &nf, pf);
    CHECK_DNN(cudnnSetConvolution2dDescriptor(d.cv, c.pad[0], c.pad[1], c.stride[0], c.stride[1],
                                              c.dil[0], c.dil[1], c.mode, CUDNN_DATA_DOUBLE));
    s2 = cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x, d.w, d.cv, d.y, 8, &nf, pf);
    report(s1 == CUDNN_STATUS_BAD_PARAM && s2 == CUDNN_STATUS_SUCCESS && nf == 1 &&
               pf[0].status == CUDNN_STATUS_NOT_SUPPORTED,
           "_v7 heuristics: wrong y -> %s; f32 data + f64 compute -> entry %s",
           cudnnGetErrorString(s1), cudnnGetErrorString(s2 ? s2 : pf[0].status));
    cudnnDestroyTensorDescriptor(bad);
    destroy(&d);
}

/* Wrong descriptions must fail, with the status the docs give. */
static void status_case(const char *what, cudnnStatus_t got, cudnnStatus_t want) {
    report(got == want, "status: %s -> %s (want %s)", what, cudnnGetErrorString(got),
           cudnnGetErrorString(want));
}

/* f16 data with HALF compute: a documented configuration whose half
 * accumulation the simulation refuses (NOT_SUPPORTED) rather than fakes. */
static cudnnStatus_t true_half_status(buf *x, buf *w, buf *y) {
    cudnnTensorDescriptor_t hx, hy;
    cudnnFilterDescriptor_t hw;
    cudnnConvolutionDescriptor_t hc;
    float one = 1, zero = 0;
    CHECK_DNN(cudnnCreateTensorDescriptor(&hx));
    CHECK_DNN(cudnnCreateTensorDescriptor(&hy));
    CHECK_DNN(cudnnCreateFilterDescriptor(&hw));
    CHECK_DNN(cudnnCreateConvolutionDescriptor(&hc));
    CHECK_DNN(cudnnSetTensor4dDescriptor(hx, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 1, 2, 2));
    CHECK_DNN(cudnnSetTensor4dDescriptor(hy, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 1, 1, 1));
    CHECK_DNN(cudnnSetFilter4dDescriptor(hw, CUDNN_DATA_HALF, CUDNN_TENSOR_NCHW, 1, 1, 2, 2));
    CHECK_DNN(cudnnSetConvolution2dDescriptor(hc, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_HALF));
    cudnnStatus_t s = cudnnConvolutionForward(handle, &one, hx, x->p, hw, w->p, hc,
                                              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                              &zero, hy, y->p);
    cudnnDestroyTensorDescriptor(hx);
    cudnnDestroyTensorDescriptor(hy);
    cudnnDestroyFilterDescriptor(hw);
    cudnnDestroyConvolutionDescriptor(hc);
    return s;
}

static void validation_cases(void) {
    conv_case c = base(CUDNN_DATA_FLOAT);
    descs d = make(&c);
    size_t big = 4096;
    buf x = buf_new(c.dt, big), w = buf_new(c.dt, big), y = buf_new(c.dt, big);
    cudnnTensorDescriptor_t t;
    cudnnFilterDescriptor_t f;
    CHECK_DNN(cudnnCreateTensorDescriptor(&t));
    CHECK_DNN(cudnnCreateFilterDescriptor(&f));
    scal one = S(1), zero = S(0);
#define FWD(xd, wd, yd)                                                                            \
    cudnnConvolutionForward(handle, &one.f, xd, x.p, wd, w.p, d.cv,                                \
                            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero.f, yd, y.p)

    status_case("forward, correct descriptors", FWD(d.x, d.w, d.y), CUDNN_STATUS_SUCCESS);
    CHECK_DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, c.dt, c.N, c.K, c.P, c.Q + 1));
    status_case("forward, y one column too wide", FWD(d.x, d.w, t), CUDNN_STATUS_BAD_PARAM);
    CHECK_DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, c.dt, c.N, c.K + 1, c.P, c.Q));
    status_case("forward, y channels != K", FWD(d.x, d.w, t), CUDNN_STATUS_BAD_PARAM);
    CHECK_DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, c.dt, c.N + 1, c.K, c.P, c.Q));
    status_case("forward, y batch != x batch", FWD(d.x, d.w, t), CUDNN_STATUS_BAD_PARAM);
    CHECK_DNN(cudnnSetFilter4dDescriptor(f, c.dt, CUDNN_TENSOR_NCHW, c.K, c.C + 1, c.R, c.S));
    status_case("forward, filter C != x C", FWD(d.x, f, d.y), CUDNN_STATUS_BAD_PARAM);
    CHECK_DNN(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_HALF, CUDNN_TENSOR_NCHW, c.K, c.C, c.R, c.S));
    status_case("forward, filter f16 with f32 tensors", FWD(d.x, f, d.y), CUDNN_STATUS_BAD_PARAM);
    CHECK_DNN(cudnnSetFilter4dDescriptor(f, c.dt, CUDNN_TENSOR_NCHW, c.K, c.C, 20, c.S));
    status_case("forward, filter taller than padded x", FWD(d.x, f, d.y), CUDNN_STATUS_BAD_PARAM);
    /* The argument-order slip cudnnSetFilter4dDescriptor invites: (format,
     * dtype) swapped passes CUDNN_TENSOR_NCHW (0) as the dtype, FLOAT (0)
     * as the format: it "works" for f32 only; for bf16 the swap makes
     * format 9, which is not a format. */
    status_case("set filter, dtype/format swapped for bf16",
                cudnnSetFilter4dDescriptor(f, (cudnnDataType_t)CUDNN_TENSOR_NCHW,
                                           (cudnnTensorFormat_t)CUDNN_DATA_BFLOAT16, 1, 1, 1, 1),
                CUDNN_STATUS_BAD_PARAM);
    cudnnTensorDescriptor_t unset;
    CHECK_DNN(cudnnCreateTensorDescriptor(&unset));
    status_case("forward, x descriptor never set", FWD(unset, d.w, d.y), CUDNN_STATUS_BAD_PARAM);
    cudnnDestroyTensorDescriptor(unset);
    status_case("set tensor, zero batch",
                cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, c.dt, 0, 1, 1, 1), CUDNN_STATUS_BAD_PARAM);
    status_case("set conv, negative pad",
                cudnnSetConvolution2dDescriptor(d.cv, -1, 0, 1, 1, 1, 1, c.mode, CUDNN_DATA_FLOAT),
                CUDNN_STATUS_BAD_PARAM);
    status_case("set conv, stride 0",
                cudnnSetConvolution2dDescriptor(d.cv, 0, 0, 0, 1, 1, 1, c.mode, CUDNN_DATA_FLOAT),
                CUDNN_STATUS_BAD_PARAM);
    status_case("set math type 7", cudnnSetConvolutionMathType(d.cv, (cudnnMathType_t)7),
                CUDNN_STATUS_BAD_PARAM);
    /* make() left d.cv valid: the failed Sets above must not have changed it. */
    status_case("forward after failed sets, descriptor unchanged", FWD(d.x, d.w, d.y),
                CUDNN_STATUS_SUCCESS);
    CHECK_DNN(cudnnSetConvolution2dDescriptor(d.cv, c.pad[0], c.pad[1], c.stride[0], c.stride[1],
                                              c.dil[0], c.dil[1], c.mode, CUDNN_DATA_DOUBLE));
    status_case("forward, f32 data with DOUBLE compute", FWD(d.x, d.w, d.y), CUDNN_STATUS_NOT_SUPPORTED);
    CHECK_DNN(cudnnSetConvolution2dDescriptor(d.cv, c.pad[0], c.pad[1], c.stride[0], c.stride[1],
                                              c.dil[0], c.dil[1], c.mode, CUDNN_DATA_FLOAT));
    status_case("forward, NULL alpha",
                cudnnConvolutionForward(handle, NULL, d.x, x.p, d.w, w.p, d.cv,
                                        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero.f,
                                        d.y, y.p),
                CUDNN_STATUS_BAD_PARAM);
    /* Backward data: dy of the wrong size is BAD_PARAM (documented). */
    CHECK_DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, c.dt, c.N, c.K, c.P - 1, c.Q));
    status_case("backward data, dy one row short",
                cudnnConvolutionBackwardData(handle, &one.f, d.w, w.p, t, y.p, d.cv,
                                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, NULL, 0, &zero.f, d.x, x.p),
                CUDNN_STATUS_BAD_PARAM);
    status_case("backward filter, dy one row short",
                cudnnConvolutionBackwardFilter(handle, &one.f, d.x, x.p, t, y.p, d.cv,
                                               CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, NULL, 0, &zero.f,
                                               d.w, w.p),
                CUDNN_STATUS_BAD_PARAM);
    /* Groups: K not a multiple of the group count. */
    CHECK_DNN(cudnnSetConvolutionGroupCount(d.cv, 3));
    CHECK_DNN(cudnnSetFilter4dDescriptor(f, c.dt, CUDNN_TENSOR_NCHW, c.K, 1, c.R, c.S));
    status_case("backward data, K=4 with 3 groups",
                cudnnConvolutionBackwardData(handle, &one.f, f, w.p, d.y, y.p, d.cv,
                                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, NULL, 0, &zero.f, d.x, x.p),
                CUDNN_STATUS_NOT_SUPPORTED);
    CHECK_DNN(cudnnSetConvolutionGroupCount(d.cv, 1));
    status_case("forward, TRUE_HALF (f16 compute) not modelled", true_half_status(&x, &w, &y),
                CUDNN_STATUS_NOT_SUPPORTED);
#undef FWD
    cudnnDestroyTensorDescriptor(t);
    cudnnDestroyFilterDescriptor(f);
    destroy(&d);
    free(x.p), free(w.p), free(y.p);
}

int main(void) {
    CHECK_DNN(cudnnCreate(&handle));
    CHECK_DNN(cudnnSetStream(handle, (cudaStream_t)0));

    hand_case();
    mode_case();

    cudnnDataType_t dts[4] = {CUDNN_DATA_DOUBLE, CUDNN_DATA_FLOAT, CUDNN_DATA_BFLOAT16, CUDNN_DATA_HALF};
    for (int i = 0; i < 4; i++) {
        /* pad (1, 2), stride (2, 1), dilation (1, 2), 3x2 kernel, batch 2 */
        adjoint_case("pad+stride+dil 3x2", base(dts[i]));
        conv_case c = base(dts[i]);
        c.mode = CUDNN_CONVOLUTION;
        adjoint_case("true convolution 3x2", c);
        c = base(dts[i]);
        c.C = 4, c.K = 6, c.G = 2, c.R = 2, c.S = 3, c.stride[1] = 3, c.pad[0] = 0;
        adjoint_case("2 groups 2x3 stride 3", c);
        c = base(dts[i]);
        c.H = 5, c.W = 9, c.R = 5, c.S = 1, c.stride[0] = 3, c.stride[1] = 2, c.dil[0] = 1, c.dil[1] = 1,
        c.pad[0] = 2, c.pad[1] = 0;
        adjoint_case("5x1 kernel stride (3,2)", c);
    }

    /* bf16: 7 stored mantissa bits, ulp(1) = 2^-7. */
    rounding_case(CUDNN_DATA_BFLOAT16, 1, ldexp(1, -8), 1, 0x3f80, "1 + 2^-8 (tie, to even: 1)");
    rounding_case(CUDNN_DATA_BFLOAT16, 1 + ldexp(1, -7), ldexp(1, -8), 1, 0x3f82,
                  "1 + 3*2^-8 (tie, to even: 1 + 2^-6)");
    rounding_case(CUDNN_DATA_BFLOAT16, 1, ldexp(1, -8) + ldexp(1, -12), 1, 0x3f81,
                  "1 + 2^-8 + 2^-12 (above the tie: up)");
    rounding_case(CUDNN_DATA_BFLOAT16, -1, -ldexp(1, -8), 1, 0xbf80, "-(1 + 2^-8) (tie: -1)");
    rounding_case(CUDNN_DATA_BFLOAT16, NAN, 1, 1, 0, "NaN + 1 (NaN)");
    /* f16: ulp(1) = 2^-10, largest finite 65504, smallest subnormal 2^-24. */
    rounding_case(CUDNN_DATA_HALF, 1, ldexp(1, -11), 1, 0x3c00, "1 + 2^-11 (tie, to even: 1)");
    rounding_case(CUDNN_DATA_HALF, 1 + ldexp(1, -10), ldexp(1, -11), 1, 0x3c02,
                  "1 + 3*2^-11 (tie, to even: 1 + 2^-9)");
    rounding_case(CUDNN_DATA_HALF, 65504, 16, 1, 0x7c00, "65504 + 16 = 65520 (tie past max: inf)");
    rounding_case(CUDNN_DATA_HALF, 65504, 8, 1, 0x7bff, "65504 + 8 (below the tie: 65504)");
    rounding_case(CUDNN_DATA_HALF, ldexp(1, -13), -(ldexp(1, -13) - ldexp(1, -24)), 1, 0x0001,
                  "2^-13 - (2^-13 - 2^-24) (smallest subnormal)");
    rounding_case(CUDNN_DATA_HALF, 1, 0, ldexp(1, -25), 0x0000, "alpha 2^-25 (subnormal tie: 0)");
    rounding_case(CUDNN_DATA_HALF, 1, 0, 3 * ldexp(1, -25), 0x0002,
                  "alpha 3*2^-25 (subnormal tie: 2*2^-24)");
    rounding_case(CUDNN_DATA_HALF, 1, 0, ldexp(1, -25) + ldexp(1, -30), 0x0001,
                  "alpha 2^-25 + 2^-30 (above the tie: 2^-24)");
    rounding_case(CUDNN_DATA_HALF, 1, 0, ldexp(1023, -24) + ldexp(1, -25), 0x0400,
                  "alpha 1023.5*2^-24 (tie, rounds up to the smallest normal)");
    rounding_case(CUDNN_DATA_HALF, NAN, 1, 1, 0, "NaN + 1 (NaN)");

    tf32_case();
    strided_case();
    heuristics_case();
    validation_cases();

    CHECK_DNN(cudnnDestroy(handle));
    if (failures) {
        printf("%d case(s) FAILED\n", failures);
        return 1;
    }
    printf("all cases passed\n");
    return 0;
}

#pragma GCC diagnostic pop
