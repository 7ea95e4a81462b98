/*
 * cpu_pool2d.c: CPU kernels of max_pool2d: the window maxima with their
 * indices, and the backward that adds each output gradient at its index.
 * Planes are independent, so both run in parallel over planes (windows of
 * one plane may overlap and pick the same input: the backward adds within
 * a plane on one thread). NaN wins, as in PyTorch.
 */
#include "cpu_iter.h"
#include "cpu_linear.h"

#include <math.h>
#include <string.h>

enum { PARALLEL_MIN = 1 << 16 };

/* First and one-past-last window offsets k in [0, kn) whose position
 * start + k * d lies inside [0, n). */
static inline void valid_range(int64_t start, int64_t d, int64_t kn, int64_t n, int64_t *lo,
                               int64_t *hi) {
    int64_t a, b;
    if (d == 1) { /* the usual case, without divisions */
        a = start < 0 ? -start : 0;
        b = n - start;
    } else {
        a = start < 0 ? (-start + d - 1) / d : 0;
        b = n - start <= 0 ? 0 : (n - start + d - 1) / d;
    }
    if (b < a) b = a;
    *lo = a;
    *hi = b < kn ? b : kn;
}

/* One plane. The window's valid rows and columns are computed once per
 * output, so the inner loop has no bounds checks; the geometry is copied
 * to locals (stores to out and idx could otherwise alias it). */
#define DEFINE_POOL_PLANE(T, NAME)                                                            \
    static void NAME(const T *x, T *out, int64_t *idx, int64_t H, int64_t W, int64_t Ho,      \
                     int64_t Wo, int64_t kh, int64_t kw, const fl_conv2d_options *o) {        \
        const int64_t sh = o->stride[0], sw = o->stride[1], ph = o->padding[0];               \
        const int64_t pw = o->padding[1], dh = o->dilation[0], dw = o->dilation[1];           \
        for (int64_t oh = 0; oh < Ho; oh++) {                                                 \
            int64_t h0 = oh * sh - ph, klo, khi;                                              \
            valid_range(h0, dh, kh, H, &klo, &khi);                                           \
            for (int64_t ow = 0; ow < Wo; ow++) {                                             \
                int64_t w0 = ow * sw - pw, jlo, jhi;                                          \
                valid_range(w0, dw, kw, W, &jlo, &jhi);                                       \
                T best = (T)-INFINITY;                                                        \
                int64_t bi = -1;                                                              \
                if (klo < khi && jlo < jhi) {                                                 \
                    bi = (h0 + klo * dh) * W + w0 + jlo * dw;                                 \
                    best = x[bi];                                                             \
                }                                                                             \
                for (int64_t ki = klo; ki < khi; ki++) {                                      \
                    int64_t base = (h0 + ki * dh) * W + w0;                                   \
                    for (int64_t kj = jlo; kj < jhi; kj++) {                                  \
                        /* branch-free select: maxima of random data are unpredictable */     \
                        T v = x[base + kj * dw];                                              \
                        bool take = v > best || isnan(v);                                     \
                        best = take ? v : best;                                               \
                        bi = take ? base + kj * dw : bi;                                      \
                    }                                                                         \
                }                                                                             \
                out[oh * Wo + ow] = best;                                                     \
                idx[oh * Wo + ow] = bi;                                                       \
            }                                                                                 \
        }                                                                                     \
    }
DEFINE_POOL_PLANE(float, pool_plane_f32)
DEFINE_POOL_PLANE(double, pool_plane_f64)

int fl_cpu_max_pool2d(fl_tensor *out, fl_tensor *indices, const fl_tensor *x, int64_t kh,
                      int64_t kw, const fl_conv2d_options *o) {
    int64_t P = x->shape[0], H = x->shape[1], W = x->shape[2];
    int64_t Ho = out->shape[1], Wo = out->shape[2];
    fl_dtype ct = x->dtype == FL_F64 ? FL_F64 : FL_F32;
    fl_tensor *xo = NULL, *oo = NULL;
    const void *xd = x->data;
    void *od = out->data;
    int rc = FL_OK;
    if (x->dtype != ct) { /* bf16/f16: compare in f32; the maxima convert back exactly */
        xo = fl_empty(3, x->shape, ct, x->device);
        oo = xo ? fl_empty(3, out->shape, ct, out->device) : NULL;
        rc = oo ? fl_convert(xo->data, ct, x->data, x->dtype, x->numel) : (int)fl_last_status();
        if (rc == FL_OK) {
            xd = xo->data;
            od = oo->data;
        }
    }
    if (rc == FL_OK) {
        int64_t *id = indices->data;
#pragma omp parallel for schedule(static) if (P * Ho * Wo * kh * kw >= PARALLEL_MIN)
        for (int64_t p = 0; p < P; p++) {
            if (ct == FL_F32)
                pool_plane_f32((const float *)xd + p * H * W, (float *)od + p * Ho * Wo,
                               id + p * Ho * Wo, H, W, Ho, Wo, kh, kw, o);
            else
                pool_plane_f64((const double *)xd + p * H * W, (double *)od + p * Ho * Wo,
                               id + p * Ho * Wo, H, W, Ho, Wo, kh, kw, o);
        }
        if (oo) rc = fl_convert(out->data, out->dtype, oo->data, ct, out->numel);
    }
    fl_tensor_release(xo);
    fl_tensor_release(oo);
    return rc;
}

int fl_cpu_max_pool2d_backward(fl_tensor *gx, const fl_tensor *gy, const fl_tensor *indices) {
    int64_t P = gx->shape[0], HW = gx->shape[1] * gx->shape[2];
    int64_t Q = gy->shape[1] * gy->shape[2];
    fl_dtype ct = gx->dtype == FL_F64 ? FL_F64 : FL_F32;
    fl_tensor *go = NULL, *gyo = NULL;
    void *gxd = gx->data;
    const void *gyd = gy->data;
    int rc = FL_OK;
    if (gx->dtype != ct || gy->dtype != ct) { /* accumulate in f32, round once */
        go = fl_zeros(3, gx->shape, ct, gx->device);
        gyo = go ? fl_empty(3, gy->shape, ct, gy->device) : NULL;
        rc = gyo ? fl_convert(gyo->data, ct, gy->data, gy->dtype, gy->numel) : (int)fl_last_status();
        if (rc == FL_OK) {
            gxd = go->data;
            gyd = gyo->data;
        }
    }
    if (rc == FL_OK) {
        const int64_t *id = indices->data;
#pragma omp parallel for schedule(static) if (P * Q >= PARALLEL_MIN)
        for (int64_t p = 0; p < P; p++) {
            const int64_t *ip = id + p * Q;
            if (ct == FL_F32) {
                float *dst = (float *)gxd + p * HW;
                const float *src = (const float *)gyd + p * Q;
                for (int64_t q = 0; q < Q; q++)
                    if (ip[q] >= 0) dst[ip[q]] += src[q];
            } else {
                double *dst = (double *)gxd + p * HW;
                const double *src = (const double *)gyd + p * Q;
                for (int64_t q = 0; q < Q; q++)
                    if (ip[q] >= 0) dst[ip[q]] += src[q];
            }
        }
        if (go) rc = fl_convert(gx->data, gx->dtype, go->data, ct, gx->numel);
    }
    fl_tensor_release(go);
    fl_tensor_release(gyo);
    return rc;
}
