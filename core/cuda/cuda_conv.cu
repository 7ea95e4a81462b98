/*
 * cuda_conv.cu: conv2d and its backward on the GPU through cuDNN's
 * convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter,
 * libcudnn_cnn of cuDNN 9), one handle per device made on first use.
 *
 * - Math: f32/bf16/f16 accumulate in f32 (cuDNN's FLOAT compute type), f64
 *   in double. f32 stays in full precision (CUDNN_FMA_MATH, no TF32)
 *   unless FSDP_ALLOW_TF32=1, as for the GEMMs.
 * - Algorithms: cuDNN's heuristics (cudnnGet*Algorithm_v7), the first one
 *   that is supported, fits the workspace limit and uses an allowed math
 *   type; when none qualifies, the implicit GEMM (forward) or algorithm 0
 *   (backward), which work everywhere without a workspace.
 * - Workspaces are tensors from the caching pool.
 * - Bias and its gradient are own kernels: the bias is added to the
 *   convolution's output (for bf16/f16 that rounds twice where the CPU
 *   rounds once: within one unit of the last place), and the bias gradient
 *   is a per-channel sum in double in a fixed order, as the CPU's.
 */
#include "cuda_linear.cuh"

#include <cudnn.h>

#include <stdlib.h>
#include <string.h>

enum { MAX_DEVICES = 64 };
static const size_t WORKSPACE_LIMIT = (size_t)512 << 20;

static pthread_mutex_t handles_mutex = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t handles[MAX_DEVICES];

static int dnn_fail(const char *op, const char *what, cudnnStatus_t st) {
    return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s failed: %s (cuDNN status %d)", op, what,
                   cudnnGetErrorString(st), (int)st);
}

static int dnn_handle(const char *op, int dev, cudnnHandle_t *h) {
    if (dev < 0 || dev >= MAX_DEVICES)
        return fl_fail(FL_ERR_DEVICE, "%s on cuda:%d: device index out of range", op, dev);
    fl_cu_lock lock(&handles_mutex);
    if (!handles[dev]) {
        cudnnStatus_t st = cudnnCreate(&handles[dev]);
        if (st != CUDNN_STATUS_SUCCESS) {
            handles[dev] = NULL;
            return dnn_fail(op, "cudnnCreate", st);
        }
    }
    *h = handles[dev];
    cudnnStatus_t st = cudnnSetStream(*h, fl_cu_stream());
    return st == CUDNN_STATUS_SUCCESS ? FL_OK : dnn_fail(op, "cudnnSetStream", st);
}

static bool allow_tf32(void) {
    const char *e = getenv("FSDP_ALLOW_TF32");
    return e && strcmp(e, "1") == 0;
}

/* The descriptors of one convolution: x [N, C, H, W], w [O, C, kh, kw],
 * y [N, O, Ho, Wo], all dense NCHW of one dtype. */
struct conv_descs {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    bool strict_f32; /* f32 without TF32: only FMA kernels */
};

static void destroy_descs(conv_descs *d) {
    if (d->x) cudnnDestroyTensorDescriptor(d->x);
    if (d->y) cudnnDestroyTensorDescriptor(d->y);
    if (d->w) cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
}

static bool fits_int(const fl_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > INT32_MAX) return false;
    return true;
}

static int make_descs(const char *op, const fl_tensor *x, const fl_tensor *w, const fl_tensor *y,
                      const fl_conv2d_options *o, conv_descs *d) {
    memset(d, 0, sizeof *d);
    fl_dtype dt = x->dtype;
    cudnnDataType_t t, ct = dt == FL_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    switch (dt) {
    case FL_F32: t = CUDNN_DATA_FLOAT; break;
    case FL_F64: t = CUDNN_DATA_DOUBLE; break;
    case FL_F16: t = CUDNN_DATA_HALF; break;
    case FL_BF16: t = CUDNN_DATA_BFLOAT16; break;
    default:
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for dtype %s", op, fl_dtype_name(dt));
    }
    if (!fits_int(x) || !fits_int(w) || !fits_int(y))
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: sizes beyond cuDNN's 32-bit dims", op);
    int rc = fl_cu_use_device(op, x);
    if (rc != FL_OK || (rc = dnn_handle(op, fl_device_index(x->device), &d->h)) != FL_OK) return rc;
    d->strict_f32 = dt == FL_F32 && !allow_tf32();
    cudnnMathType_t math = dt == FL_F64 || d->strict_f32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
    if (dt == FL_BF16 || dt == FL_F16) math = CUDNN_TENSOR_OP_MATH;
    cudnnStatus_t st;
    const char *what;
#define DNN(call, name)                                                                            \
    do {                                                                                           \
        what = name;                                                                               \
        if ((st = (call)) != CUDNN_STATUS_SUCCESS) goto fail;                                      \
    } while (0)
    DNN(cudnnCreateTensorDescriptor(&d->x), "cudnnCreateTensorDescriptor");
    DNN(cudnnCreateTensorDescriptor(&d->y), "cudnnCreateTensorDescriptor");
    DNN(cudnnCreateFilterDescriptor(&d->w), "cudnnCreateFilterDescriptor");
    DNN(cudnnCreateConvolutionDescriptor(&d->conv), "cudnnCreateConvolutionDescriptor");
    DNN(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, t, (int)x->shape[0], (int)x->shape[1],
                                   (int)x->shape[2], (int)x->shape[3]),
        "describing x");
    DNN(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, t, (int)y->shape[0], (int)y->shape[1],
                                   (int)y->shape[2], (int)y->shape[3]),
        "describing the output");
    DNN(cudnnSetFilter4dDescriptor(d->w, t, CUDNN_TENSOR_NCHW, (int)w->shape[0], (int)w->shape[1],
                                   (int)w->shape[2], (int)w->shape[3]),
        "describing w");
    DNN(cudnnSetConvolution2dDescriptor(d->conv, (int)o->padding[0], (int)o->padding[1],
                                        (int)o->stride[0], (int)o->stride[1], (int)o->dilation[0],
                                        (int)o->dilation[1], CUDNN_CROSS_CORRELATION, ct),
        "describing the convolution");
    DNN(cudnnSetConvolutionMathType(d->conv, math), "setting the math type");
#undef DNN
    return FL_OK;
fail:
    destroy_descs(d);
    memset(d, 0, sizeof *d);
    return dnn_fail(op, what, st);
}

/* Pick from the heuristics' list (best first): supported, within the
 * workspace limit, an allowed math type. Its math type is set on the
 * descriptor, as cuDNN requires for the algorithm to run as listed. */
template <typename Perf, typename Algo>
static Algo pick(const conv_descs *d, const Perf *perf, int n, Algo fallback, size_t *ws) {
    for (int i = 0; i < n; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > WORKSPACE_LIMIT) continue;
        if (d->strict_f32 && perf[i].mathType != CUDNN_FMA_MATH) continue;
        if (cudnnSetConvolutionMathType(d->conv, perf[i].mathType) != CUDNN_STATUS_SUCCESS) continue;
        *ws = perf[i].memory;
        return perf[i].algo;
    }
    cudnnSetConvolutionMathType(d->conv, d->strict_f32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH);
    *ws = 0;
    return fallback;
}

/* out[n, o, :, :] = round(out + bias[o]) over P pixels per channel. */
__global__ void add_bias_kernel(void *out, int od, const void *bias, int bd, int64_t O, int64_t P,
                                int64_t total) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = (i / P) % O;
        if (od == FL_F64) fl_cu_put_f64(out, i, od, fl_cu_get_f64(out, i, od) + fl_cu_get_f64(bias, o, bd));
        else fl_cu_put_f32(out, i, od, fl_cu_get_f32(out, i, od) + fl_cu_get_f32(bias, o, bd));
    }
}

int fl_cuda_conv2d(fl_tensor *out, const fl_tensor *x, const fl_tensor *w, const fl_tensor *bias,
                   const fl_conv2d_options *o) {
    const char *op = "conv2d";
    if (out->numel == 0) return FL_OK;
    conv_descs d;
    int rc = make_descs(op, x, w, out, o, &d);
    if (rc != FL_OK) return rc;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int found = 0;
    size_t ws_bytes = 0;
    fl_tensor *ws = NULL;
    cudnnStatus_t st = cudnnGetConvolutionForwardAlgorithm_v7(
        d.h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf);
    if (st != CUDNN_STATUS_SUCCESS) found = 0;
    cudnnConvolutionFwdAlgo_t algo =
        pick(&d, perf, found, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &ws_bytes);
    ws = fl_cu_workspace(out, (int64_t)ws_bytes);
    if (!ws) {
        rc = fl_last_status();
    } else {
        /* alpha/beta are float for every dtype but f64 (cuDNN's rule). */
        double one64 = 1, zero64 = 0;
        float one32 = 1, zero32 = 0;
        bool f64 = x->dtype == FL_F64;
        st = cudnnConvolutionForward(d.h, f64 ? (void *)&one64 : (void *)&one32, d.x, x->data, d.w,
                                     w->data, d.conv, algo, ws->data, ws_bytes,
                                     f64 ? (void *)&zero64 : (void *)&zero32, d.y, out->data);
        rc = st == CUDNN_STATUS_SUCCESS ? FL_OK : dnn_fail(op, "cudnnConvolutionForward", st);
    }
    if (rc == FL_OK && bias) {
        int64_t O = out->shape[1], P = out->shape[2] * out->shape[3];
        add_bias_kernel<<<fl_cu_blocks(out->numel, 256), 256, 0, fl_cu_stream()>>>(
            out->data, out->dtype, bias->data, bias->dtype, O, P, out->numel);
        rc = fl_cu_check(op);
    }
    fl_tensor_release(ws);
    destroy_descs(&d);
    return rc;
}

enum { BIAS_THREADS = 256 };

/* gb[o] = the sum of gy[n, o, p] over n and p, in double: block o, each
 * thread a fixed strided share, then a tree in shared memory. */
__global__ void bias_grad_kernel(void *gb, int bd, const void *gy, int gd, int64_t N, int64_t O,
                                 int64_t P) {
    __shared__ double part[BIAS_THREADS];
    int64_t o = blockIdx.x, count = N * P;
    double acc = 0;
    for (int64_t i = threadIdx.x; i < count; i += BIAS_THREADS) {
        int64_t n = i / P, p = i - n * P;
        acc += fl_cu_get_f64(gy, (n * O + o) * P + p, gd);
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = BIAS_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) fl_cu_put_f64(gb, o, bd, part[0]);
}

int fl_cuda_conv2d_backward(fl_tensor *gx, fl_tensor *gw, fl_tensor *gb, const fl_tensor *gy,
                            const fl_tensor *x, const fl_tensor *w, const fl_conv2d_options *o) {
    const char *op = "conv2d backward";
    conv_descs d;
    int rc = make_descs(op, x, w, gy, o, &d);
    if (rc != FL_OK) return rc;
    double one64 = 1, zero64 = 0;
    float one32 = 1, zero32 = 0;
    bool f64 = x->dtype == FL_F64;
    const void *one = f64 ? (void *)&one64 : (void *)&one32;
    const void *zero = f64 ? (void *)&zero64 : (void *)&zero32;
    cudnnStatus_t st;
    if (gx && gx->numel > 0) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int found = 0;
        size_t ws_bytes = 0;
        st = cudnnGetConvolutionBackwardDataAlgorithm_v7(
            d.h, d.w, d.y, d.conv, d.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf);
        if (st != CUDNN_STATUS_SUCCESS) found = 0;
        cudnnConvolutionBwdDataAlgo_t algo =
            pick(&d, perf, found, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, &ws_bytes);
        fl_tensor *ws = fl_cu_workspace(gx, (int64_t)ws_bytes);
        if (!ws) {
            rc = fl_last_status();
        } else {
            st = cudnnConvolutionBackwardData(d.h, one, d.w, w->data, d.y, gy->data, d.conv, algo,
                                              ws->data, ws_bytes, zero, d.x, gx->data);
            rc = st == CUDNN_STATUS_SUCCESS ? FL_OK : dnn_fail(op, "cudnnConvolutionBackwardData", st);
            fl_tensor_release(ws);
        }
    }
    if (rc == FL_OK && gw && gw->numel > 0) {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int found = 0;
        size_t ws_bytes = 0;
        st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            d.h, d.x, d.y, d.conv, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf);
        if (st != CUDNN_STATUS_SUCCESS) found = 0;
        cudnnConvolutionBwdFilterAlgo_t algo =
            pick(&d, perf, found, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, &ws_bytes);
        fl_tensor *ws = fl_cu_workspace(gw, (int64_t)ws_bytes);
        if (!ws) {
            rc = fl_last_status();
        } else {
            st = cudnnConvolutionBackwardFilter(d.h, one, d.x, x->data, d.y, gy->data, d.conv, algo,
                                                ws->data, ws_bytes, zero, d.w, gw->data);
            rc = st == CUDNN_STATUS_SUCCESS ? FL_OK
                                            : dnn_fail(op, "cudnnConvolutionBackwardFilter", st);
            fl_tensor_release(ws);
        }
    }
    if (rc == FL_OK && gb && gb->numel > 0) {
        int64_t N = gy->shape[0], O = gy->shape[1], P = gy->shape[2] * gy->shape[3];
        bias_grad_kernel<<<(unsigned)O, BIAS_THREADS, 0, fl_cu_stream()>>>(gb->data, gb->dtype,
                                                                           gy->data, gy->dtype, N, O, P);
        rc = fl_cu_check(op);
    }
    destroy_descs(&d);
    return rc;
}
