/*
 * cuda_pool2d.cu: GPU kernels of max_pool2d: the window maxima with their
 * indices (one thread per output), and the backward that adds each output
 * gradient at its index.
 *
 * The window is scanned as the CPU scans it (cpu_pool2d.c): row by row,
 * starting from its first valid element, taking a later element when it
 * is greater or NaN, so ties keep the first maximum and a NaN wins; a
 * window wholly in the padding gives -inf and index -1. bf16/f16 compare
 * in f32, whose maxima convert back exactly.
 *
 * The backward adds with atomics (windows overlap when the stride is
 * smaller than the kernel): f32 in place, f64 in double, bf16/f16 into an
 * f32 scratch rounded once at the end, as the CPU accumulates.
 */
#include "cuda_linear.cuh"

#include <math.h>

struct pool_geometry {
    int64_t H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw;
};

/* First and one-past-last window offsets k in [0, kn) whose position
 * start + k * d lies inside [0, n). */
__device__ __forceinline__ void valid_range(int64_t start, int64_t d, int64_t kn, int64_t n,
                                            int64_t *lo, int64_t *hi) {
    int64_t a = start < 0 ? (-start + d - 1) / d : 0;
    int64_t b = n - start <= 0 ? 0 : (n - start + d - 1) / d;
    if (b < a) b = a;
    *lo = a;
    *hi = b < kn ? b : kn;
}

/* T: float for f32/bf16/f16, double for f64. */
template <typename T>
__global__ void max_pool_kernel(void *out, long long *idx, const void *x, int xd,
                                pool_geometry g, int64_t total) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t q = e % (g.Ho * g.Wo), p = e / (g.Ho * g.Wo);
        int64_t oh = q / g.Wo, ow = q - oh * g.Wo;
        int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw, klo, khi, jlo, jhi;
        valid_range(h0, g.dh, g.kh, g.H, &klo, &khi);
        valid_range(w0, g.dw, g.kw, g.W, &jlo, &jhi);
        int64_t plane = p * g.H * g.W;
        T best = (T)-INFINITY;
        int64_t bi = -1;
        if (klo < khi && jlo < jhi) {
            bi = (h0 + klo * g.dh) * g.W + w0 + jlo * g.dw;
            best = sizeof(T) == 8 ? (T)fl_cu_get_f64(x, plane + bi, xd) : (T)fl_cu_get_f32(x, plane + bi, xd);
        }
        for (int64_t ki = klo; ki < khi; ki++) {
            int64_t base = (h0 + ki * g.dh) * g.W + w0;
            for (int64_t kj = jlo; kj < jhi; kj++) {
                int64_t at = base + kj * g.dw;
                T v = sizeof(T) == 8 ? (T)fl_cu_get_f64(x, plane + at, xd) : (T)fl_cu_get_f32(x, plane + at, xd);
                if (v > best || isnan(v)) {
                    best = v;
                    bi = at;
                }
            }
        }
        fl_cu_put_f64(out, e, xd, (double)best);
        idx[e] = bi;
    }
}

int fl_cuda_max_pool2d(fl_tensor *out, fl_tensor *indices, const fl_tensor *x, int64_t kh,
                       int64_t kw, const fl_conv2d_options *o) {
    const char *op = "max_pool2d";
    fl_dtype xd = x->dtype;
    if (xd != FL_F32 && xd != FL_F64 && xd != FL_BF16 && xd != FL_F16)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for dtype %s", op, fl_dtype_name(xd));
    if (out->numel == 0) return FL_OK;
    int rc = fl_cu_use_device(op, x);
    if (rc != FL_OK) return rc;
    pool_geometry g = {x->shape[1], x->shape[2], out->shape[1], out->shape[2], kh, kw,
                       o->stride[0], o->stride[1], o->padding[0], o->padding[1],
                       o->dilation[0], o->dilation[1]};
    unsigned blocks = fl_cu_blocks(out->numel, 256);
    if (xd == FL_F64)
        max_pool_kernel<double><<<blocks, 256, 0, fl_cu_stream()>>>(
            out->data, (long long *)indices->data, x->data, xd, g, out->numel);
    else
        max_pool_kernel<float><<<blocks, 256, 0, fl_cu_stream()>>>(
            out->data, (long long *)indices->data, x->data, xd, g, out->numel);
    return fl_cu_check(op);
}

/* acc[p, idx] += gy[p, q] for every output (p, q) with an index. */
__global__ void max_pool_backward_kernel(void *acc, int acc64, const void *gy, int gd,
                                         const long long *idx, int64_t Q, int64_t HW,
                                         int64_t total) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        long long at = idx[e];
        if (at < 0) continue;
        int64_t dst = (e / Q) * HW + at;
        if (acc64) atomicAdd((double *)acc + dst, fl_cu_get_f64(gy, e, gd));
        else atomicAdd((float *)acc + dst, fl_cu_get_f32(gy, e, gd));
    }
}

__global__ void pool_round_kernel(void *dst, int dd, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        fl_cu_put_f32(dst, i, dd, src[i]);
}

int fl_cuda_max_pool2d_backward(fl_tensor *gx, const fl_tensor *gy, const fl_tensor *indices) {
    const char *op = "max_pool2d backward";
    fl_dtype xd = gx->dtype;
    if (xd != FL_F32 && xd != FL_F64 && xd != FL_BF16 && xd != FL_F16)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for dtype %s", op, fl_dtype_name(xd));
    if (gy->numel == 0 || gx->numel == 0) return FL_OK;
    int rc = fl_cu_use_device(op, gx);
    if (rc != FL_OK) return rc;
    int64_t HW = gx->shape[1] * gx->shape[2], Q = gy->shape[1] * gy->shape[2];
    cudaStream_t s = fl_cu_stream();
    fl_tensor *scratch = NULL;
    void *acc = gx->data;
    if (xd == FL_BF16 || xd == FL_F16) {
        scratch = fl_empty(3, gx->shape, FL_F32, gx->device);
        if (!scratch) return fl_last_status();
        cudaError_t e = cudaMemsetAsync(scratch->data, 0, (size_t)gx->numel * sizeof(float), s);
        if (e != cudaSuccess) {
            fl_tensor_release(scratch);
            return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
        }
        acc = scratch->data;
    }
    max_pool_backward_kernel<<<fl_cu_blocks(gy->numel, 256), 256, 0, s>>>(
        acc, xd == FL_F64, gy->data, gy->dtype, (const long long *)indices->data, Q, HW, gy->numel);
    rc = fl_cu_check(op);
    if (rc == FL_OK && scratch) {
        pool_round_kernel<<<fl_cu_blocks(gx->numel, 256), 256, 0, s>>>(
            gx->data, xd, (const float *)scratch->data, gx->numel);
        rc = fl_cu_check(op);
    }
    fl_tensor_release(scratch);
    return rc;
}
