/*
 * sim_cudnn.c: a host implementation of the subset of cuDNN 9's legacy
 * convolution API that core/cuda/cuda_conv.cu calls, for cudasim (the CPU
 * simulation that runs the CUDA backend in tests: "device memory" is host
 * memory, so every call here computes at once on the pointers it is given;
 * that keeps stream order on stream 0, after the blocking streams' queued
 * work, and a handle on a deferred stream is refused with
 * CUDNN_STATUS_NOT_SUPPORTED: sim_runtime.cc).
 *
 * The point is to check how the backend DESCRIBES its convolutions, so this
 * follows cuDNN's documented semantics rather than whatever would make the
 * backend pass:
 * - Tensors are 4-d with the strides the descriptor implies (packed NCHW or
 *   NHWC from cudnnSetTensor4dDescriptor, explicit ones from the Ex
 *   variant); filters are KCRS (format NCHW) or KRSC (format NHWC).
 * - Output size per spatial dim: 1 + (in + 2*pad - ((k-1)*dil + 1)) / stride;
 *   descriptors that disagree with it, with each other's channel or batch
 *   counts, or with each other's data type fail with CUDNN_STATUS_BAD_PARAM.
 * - CUDNN_CONVOLUTION flips the filter, CUDNN_CROSS_CORRELATION does not.
 * - Group count from cudnnSetConvolutionGroupCount (1 unless set).
 * - Supported configurations, as the docs list them for these routines:
 *   FLOAT data / FLOAT compute, DOUBLE / DOUBLE, HALF / FLOAT (pseudo half),
 *   BFLOAT16 / FLOAT (pseudo bf16). Anything else is NOT_SUPPORTED; that
 *   includes TRUE_HALF (HALF compute), which the library does support but
 *   whose half-precision accumulation this simulation does not model.
 * - Products and sums are done in the compute type (f32 or f64) in a fixed
 *   loop order; the blend dst = alpha*result + beta*prior is done in the
 *   compute type, then rounded once to the data type (round to nearest even,
 *   NaN kept). alpha/beta are host floats, host doubles for DOUBLE data.
 *   beta == 0 means the destination is not read (it may hold NaN).
 * - FLOAT data under a math type other than CUDNN_FMA_MATH may run on TF32
 *   tensor cores on real GPUs (Ampere and later), which round the FP32
 *   operands to a 10-bit mantissa before multiplying. That is modelled
 *   (operands rounded to TF32, nearest even) so that a backend that forgets
 *   to ask for FMA math sees TF32-sized errors here as it would on a GPU;
 *   NVIDIA_TF32_OVERRIDE=0, the driver's documented switch, turns it off.
 * - The _v7 heuristics return one algorithm (implicit GEMM forward, ALGO_1
 *   backward: deterministic ones), status SUCCESS, no workspace, with the
 *   descriptor's math type; every algorithm computes the same thing here.
 *
 * Build: gcc -std=c11 -O2 -fPIC -I/usr/local/cuda/include -c sim_cudnn.c
 */

/* cuDNN 9 marks the whole legacy convolution API deprecated (warnings only
 * with CUDNN_WARN_DEPRECATED); implementing it is the point of this file. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <cudnn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_half.h"
#include "sim_internal.h"

/* Weak, so check_sim_cudnn links without the simulated runtime. */
#pragma weak fl_sim_stream_now

/* ---------------------------------------------------------------- objects */

struct cudnnContext {
    cudaStream_t stream;
};

struct cudnnTensorStruct {
    int set; /* 0 until a Set call succeeded: using it unset is BAD_PARAM */
    cudnnDataType_t dtype;
    int dim[4];       /* n, c, h, w */
    int64_t str[4];   /* element strides of n, c, h, w */
};

struct cudnnFilterStruct {
    int set;
    cudnnDataType_t dtype;
    cudnnTensorFormat_t format;
    int dim[4];     /* k, c, r, s whatever the format */
    int64_t str[4]; /* element strides of k, c, r, s implied by the format */
};

struct cudnnConvolutionStruct {
    int set;
    int pad[2], stride[2], dil[2];
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math;
    int groups;
};

/* ------------------------------------------------------- number formats */

/* TF32: an f32 with the low 13 mantissa bits rounded away (nearest even). */
static float round_tf32(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u += 0xfffu + ((u >> 13) & 1u);
    return bits_f32(u & ~0x1fffu);
}

static double load(const void *p, int64_t i, cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_DOUBLE: return ((const double *)p)[i];
    case CUDNN_DATA_FLOAT: return ((const float *)p)[i];
    case CUDNN_DATA_HALF: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

static void store(void *p, int64_t i, cudnnDataType_t t, double v) {
    switch (t) {
    case CUDNN_DATA_DOUBLE: ((double *)p)[i] = v; break;
    case CUDNN_DATA_FLOAT: ((float *)p)[i] = (float)v; break;
    /* v holds an f32 value for these (f32 compute), so (float)v is exact
     * and the only rounding is the one to 16 bits. */
    case CUDNN_DATA_HALF: ((uint16_t *)p)[i] = f32_to_f16((float)v); break;
    default: ((uint16_t *)p)[i] = f32_to_bf16((float)v); break;
    }
}

/* ----------------------------------------------------------- handle, misc */

const char *cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
#define NAME(s)                                                                                    \
    case s: return #s;
        NAME(CUDNN_STATUS_SUCCESS)
        NAME(CUDNN_STATUS_NOT_INITIALIZED)
        NAME(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
        NAME(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
        NAME(CUDNN_STATUS_DEPRECATED)
        NAME(CUDNN_STATUS_LICENSE_ERROR)
        NAME(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
        NAME(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
        NAME(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
        NAME(CUDNN_STATUS_BAD_PARAM)
        NAME(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
        NAME(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
        NAME(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
        NAME(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
        NAME(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
        NAME(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
        NAME(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
        NAME(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
        NAME(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
        NAME(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
        NAME(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
        NAME(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE)
        NAME(CUDNN_STATUS_INTERNAL_ERROR)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
        NAME(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
        NAME(CUDNN_STATUS_EXECUTION_FAILED)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
        NAME(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
#undef NAME
    case 2001: return "CUDNN_STATUS_INVALID_VALUE"; /* deprecated alias, no other name */
    default: return "CUDNN_UNKNOWN_STATUS_FOUND";
    }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    if (!handle) return CUDNN_STATUS_BAD_PARAM;
    struct cudnnContext *h = calloc(1, sizeof *h);
    if (!h) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

/* The work below is done when the call returns: in order on stream 0 (the
 * blocking streams' queued work runs first, sim_runtime.cc), refused on a
 * deferred stream (on_stream). */
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
    if (!handle) return CUDNN_STATUS_BAD_PARAM;
    handle->stream = streamId;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId) {
    if (!handle || !streamId) return CUDNN_STATUS_BAD_PARAM;
    *streamId = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------ descriptors */

/* The enumerants cudnnDataType_t has in cuDNN 9.x; others are BAD_PARAM. */
static int valid_dtype(cudnnDataType_t t) {
    return (int)t >= (int)CUDNN_DATA_FLOAT && (int)t <= (int)CUDNN_DATA_COMPLEX_FP64;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc) {
    if (!tensorDesc) return CUDNN_STATUS_BAD_PARAM;
    *tensorDesc = calloc(1, sizeof **tensorDesc);
    return *tensorDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
    free(tensorDesc);
    return CUDNN_STATUS_SUCCESS;
}

/* Shared by both setters. cuDNN describes no tensor with a zero or negative
 * extent (the docs: negative is BAD_PARAM; the Nd setter: "negative or
 * zero"), and caps a tensor at 2^31 elements (NOT_SUPPORTED). */
static cudnnStatus_t set_tensor(cudnnTensorDescriptor_t d, cudnnDataType_t t, const int dim[4],
                                const int64_t str[4]) {
    if (!d || !valid_dtype(t)) return CUDNN_STATUS_BAD_PARAM;
    int64_t numel = 1;
    for (int i = 0; i < 4; i++) {
        if (dim[i] <= 0 || str[i] < 0) return CUDNN_STATUS_BAD_PARAM;
        numel *= dim[i];
    }
    if (numel > INT32_MAX) return CUDNN_STATUS_NOT_SUPPORTED;
    d->dtype = t;
    memcpy(d->dim, dim, sizeof d->dim);
    memcpy(d->str, str, sizeof d->str);
    d->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                         cudnnTensorFormat_t format, cudnnDataType_t dataType,
                                         int n, int c, int h, int w) {
    int dim[4] = {n, c, h, w};
    int64_t str[4];
    switch (format) {
    case CUDNN_TENSOR_NCHW:
        str[3] = 1, str[2] = w, str[1] = (int64_t)h * w, str[0] = (int64_t)c * h * w;
        break;
    case CUDNN_TENSOR_NHWC:
        str[1] = 1, str[3] = c, str[2] = (int64_t)w * c, str[0] = (int64_t)h * w * c;
        break;
    case CUDNN_TENSOR_NCHW_VECT_C: return CUDNN_STATUS_NOT_SUPPORTED; /* int8x4/x32 only */
    default: return CUDNN_STATUS_BAD_PARAM;
    }
    return set_tensor(tensorDesc, dataType, dim, str);
}

cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc,
                                           cudnnDataType_t dataType, int n, int c, int h, int w,
                                           int nStride, int cStride, int hStride, int wStride) {
    int dim[4] = {n, c, h, w};
    int64_t str[4] = {nStride, cStride, hStride, wStride};
    return set_tensor(tensorDesc, dataType, dim, str);
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc) {
    if (!filterDesc) return CUDNN_STATUS_BAD_PARAM;
    *filterDesc = calloc(1, sizeof **filterDesc);
    return *filterDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
    free(filterDesc);
    return CUDNN_STATUS_SUCCESS;
}

/* Note the argument order: data type first, then format (the opposite of
 * cudnnSetTensor4dDescriptor). Format NCHW means KCRS, NHWC means KRSC. */
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc,
                                         cudnnDataType_t dataType, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
    if (!filterDesc || !valid_dtype(dataType)) return CUDNN_STATUS_BAD_PARAM;
    if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    int64_t *s = filterDesc->str;
    switch (format) {
    case CUDNN_TENSOR_NCHW: s[3] = 1, s[2] = w, s[1] = (int64_t)h * w, s[0] = (int64_t)c * h * w; break;
    case CUDNN_TENSOR_NHWC: s[1] = 1, s[3] = c, s[2] = (int64_t)w * c, s[0] = (int64_t)h * w * c; break;
    case CUDNN_TENSOR_NCHW_VECT_C: return CUDNN_STATUS_NOT_SUPPORTED;
    default: return CUDNN_STATUS_BAD_PARAM;
    }
    filterDesc->dtype = dataType;
    filterDesc->format = format;
    filterDesc->dim[0] = k, filterDesc->dim[1] = c, filterDesc->dim[2] = h, filterDesc->dim[3] = w;
    filterDesc->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc) {
    if (!convDesc) return CUDNN_STATUS_BAD_PARAM;
    struct cudnnConvolutionStruct *d = calloc(1, sizeof *d);
    if (!d) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    d->math = CUDNN_DEFAULT_MATH; /* the library's defaults */
    d->groups = 1;
    *convDesc = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
    free(convDesc);
    return CUDNN_STATUS_SUCCESS;
}

/* BAD_PARAM per the docs: a negative pad, a stride or dilation <= 0, an
 * invalid mode. The compute type is only checked against the data when a
 * convolution runs (that is where the docs list the configurations). */
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
    if (!convDesc || pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 ||
        dilation_w <= 0 || !valid_dtype(computeType))
        return CUDNN_STATUS_BAD_PARAM;
    if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_BAD_PARAM;
    convDesc->pad[0] = pad_h, convDesc->pad[1] = pad_w;
    convDesc->stride[0] = u, convDesc->stride[1] = v;
    convDesc->dil[0] = dilation_h, convDesc->dil[1] = dilation_w;
    convDesc->mode = mode;
    convDesc->compute = computeType;
    convDesc->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                          cudnnMathType_t mathType) {
    if (!convDesc) return CUDNN_STATUS_BAD_PARAM;
    switch (mathType) {
    case CUDNN_DEFAULT_MATH:
    case CUDNN_TENSOR_OP_MATH:
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
    case CUDNN_FMA_MATH: convDesc->math = mathType; return CUDNN_STATUS_SUCCESS;
    default: return CUDNN_STATUS_BAD_PARAM;
    }
}

cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                          cudnnMathType_t *mathType) {
    if (!convDesc || !mathType) return CUDNN_STATUS_BAD_PARAM;
    *mathType = convDesc->math;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int groupCount) {
    if (!convDesc || groupCount < 1) return CUDNN_STATUS_BAD_PARAM;
    convDesc->groups = groupCount;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int *groupCount) {
    if (!convDesc || !groupCount) return CUDNN_STATUS_BAD_PARAM;
    *groupCount = convDesc->groups;
    return CUDNN_STATUS_SUCCESS;
}

/* --------------------------------------------------------- the geometry */

/* One convolution, checked: x [N, C, H, W], w [K, C/G, R, S], y [N, K, P, Q]. */
typedef struct {
    const struct cudnnTensorStruct *x, *y;
    const struct cudnnFilterStruct *w;
    const struct cudnnConvolutionStruct *cv;
    cudnnDataType_t dt;
    int f64;  /* compute in double (DOUBLE_CONFIG), else in f32 */
    int tf32; /* f32 operands rounded to TF32 before multiplying */
} conv_geom;

static int out_dim(int in, int pad, int k, int dil, int stride) {
    int span = (k - 1) * dil + 1;
    if (in + 2 * pad < span) return -1; /* filter larger than the padded input */
    return 1 + (in + 2 * pad - span) / stride;
}

static int tf32_allowed(void) {
    const char *e = getenv("NVIDIA_TF32_OVERRIDE");
    return !(e && strcmp(e, "0") == 0);
}

/* The checks the docs list for the three routines, in one place. Which
 * failure is NOT_SUPPORTED rather than BAD_PARAM differs a little between
 * them (the group divisibility of K); `groups_status` carries that. */
static cudnnStatus_t check(conv_geom *g, cudnnHandle_t h, cudnnTensorDescriptor_t x,
                           cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t cv,
                           cudnnTensorDescriptor_t y, cudnnStatus_t groups_status) {
    if (!h || !x || !w || !cv || !y) return CUDNN_STATUS_BAD_PARAM;
    if (!x->set || !w->set || !cv->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
    if (x->dtype != w->dtype || x->dtype != y->dtype) return CUDNN_STATUS_BAD_PARAM;
    cudnnDataType_t dt = x->dtype, ct = cv->compute;
    int ok = (dt == CUDNN_DATA_FLOAT && ct == CUDNN_DATA_FLOAT) ||
             (dt == CUDNN_DATA_DOUBLE && ct == CUDNN_DATA_DOUBLE) ||
             (dt == CUDNN_DATA_HALF && ct == CUDNN_DATA_FLOAT) ||
             (dt == CUDNN_DATA_BFLOAT16 && ct == CUDNN_DATA_FLOAT);
    if (!ok) return CUDNN_STATUS_NOT_SUPPORTED;
    int G = cv->groups;
    if (x->dim[1] != w->dim[1] * G) return CUDNN_STATUS_BAD_PARAM;
    if (w->dim[0] % G != 0) return groups_status;
    if (y->dim[0] != x->dim[0] || y->dim[1] != w->dim[0]) return CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < 2; i++) {
        int o = out_dim(x->dim[2 + i], cv->pad[i], w->dim[2 + i], cv->dil[i], cv->stride[i]);
        if (o < 1 || y->dim[2 + i] != o) return CUDNN_STATUS_BAD_PARAM;
    }
    g->x = x, g->w = w, g->y = y, g->cv = cv, g->dt = dt;
    g->f64 = dt == CUDNN_DATA_DOUBLE;
    g->tf32 = dt == CUDNN_DATA_FLOAT && cv->math != CUDNN_FMA_MATH && tf32_allowed();
    return CUDNN_STATUS_SUCCESS;
}

/* acc + a*b in the compute type. For f32 each operation is rounded to f32:
 * done in double and then rounded, which gives the f32 result exactly
 * (double has more than 2*24+2 bits, so the double rounding is harmless). */
static double mac(const conv_geom *g, double acc, double a, double b) {
    if (g->f64) return acc + a * b;
    if (g->tf32) a = round_tf32((float)a), b = round_tf32((float)b);
    return (float)(acc + (double)(float)(a * b));
}

/* dst = alpha*result + beta*prior in the compute type; prior not read when
 * beta is 0 ("the output is not read and may contain uninitialized data"). */
static void blend(const conv_geom *g, void *dst, int64_t i, double result, const void *alpha,
                  const void *beta) {
    double v;
    if (g->f64) {
        double a = *(const double *)alpha, b = *(const double *)beta;
        v = a * result;
        if (b != 0) v += b * load(dst, i, g->dt);
    } else {
        float a = *(const float *)alpha, b = *(const float *)beta;
        float r = a * (float)result;
        if (b != 0) r += b * (float)load(dst, i, g->dt);
        v = r;
    }
    store(dst, i, g->dt, v);
}

static int64_t toff(const struct cudnnTensorStruct *t, int64_t n, int64_t c, int64_t h, int64_t w) {
    return n * t->str[0] + c * t->str[1] + h * t->str[2] + w * t->str[3];
}

/* The filter element a cross-correlation tap (r, s) multiplies: the same
 * one, or the mirrored one for a true convolution. */
static int64_t woff(const conv_geom *g, int64_t k, int64_t c, int64_t r, int64_t s) {
    const struct cudnnFilterStruct *w = g->w;
    if (g->cv->mode == CUDNN_CONVOLUTION) r = w->dim[2] - 1 - r, s = w->dim[3] - 1 - s;
    return k * w->str[0] + c * w->str[1] + r * w->str[2] + s * w->str[3];
}

/* ------------------------------------------------------ the computations */

/* y[n, k, p, q] = sum over c (of k's group), r, s of
 *   x[n, g*Cg + c, p*u - pad_h + r*dil_h, q*v - pad_w + s*dil_w] * w[k, c, r, s]
 * with x zero outside the image. */
static void forward(const conv_geom *g, const void *alpha, const void *x, const void *w,
                    const void *beta, void *y) {
    const struct cudnnTensorStruct *X = g->x, *Y = g->y;
    const struct cudnnConvolutionStruct *cv = g->cv;
    int N = X->dim[0], H = X->dim[2], W = X->dim[3];
    int K = Y->dim[1], P = Y->dim[2], Q = Y->dim[3];
    int Cg = g->w->dim[1], R = g->w->dim[2], S = g->w->dim[3], Kg = K / cv->groups;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    double acc = 0;
                    int c0 = (k / Kg) * Cg;
                    for (int c = 0; c < Cg; c++)
                        for (int r = 0; r < R; r++) {
                            int ih = p * cv->stride[0] - cv->pad[0] + r * cv->dil[0];
                            if (ih < 0 || ih >= H) continue;
                            for (int s = 0; s < S; s++) {
                                int iw = q * cv->stride[1] - cv->pad[1] + s * cv->dil[1];
                                if (iw < 0 || iw >= W) continue;
                                acc = mac(g, acc, load(x, toff(X, n, c0 + c, ih, iw), g->dt),
                                          load(w, woff(g, k, c, r, s), g->dt));
                            }
                        }
                    blend(g, y, toff(Y, n, k, p, q), acc, alpha, beta);
                }
}

/* The adjoint of forward in x: dx[n, c, h, w] = sum over the k of c's group
 * and the taps (r, s) whose output position (p, q) lands on (h, w):
 *   h = p*u - pad_h + r*dil_h, so p = (h + pad_h - r*dil_h) / u when exact. */
static void backward_data(const conv_geom *g, const void *alpha, const void *w, const void *dy,
                          const void *beta, void *dx) {
    const struct cudnnTensorStruct *X = g->x, *Y = g->y;
    const struct cudnnConvolutionStruct *cv = g->cv;
    int N = X->dim[0], C = X->dim[1], H = X->dim[2], W = X->dim[3];
    int K = Y->dim[1], P = Y->dim[2], Q = Y->dim[3];
    int Cg = g->w->dim[1], R = g->w->dim[2], S = g->w->dim[3], Kg = K / cv->groups;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int h = 0; h < H; h++)
                for (int wi = 0; wi < W; wi++) {
                    double acc = 0;
                    int grp = c / Cg, cl = c % Cg;
                    for (int k = grp * Kg; k < (grp + 1) * Kg; k++)
                        for (int r = 0; r < R; r++) {
                            int ph = h + cv->pad[0] - r * cv->dil[0];
                            if (ph < 0 || ph % cv->stride[0]) continue;
                            int p = ph / cv->stride[0];
                            if (p >= P) continue;
                            for (int s = 0; s < S; s++) {
                                int qw = wi + cv->pad[1] - s * cv->dil[1];
                                if (qw < 0 || qw % cv->stride[1]) continue;
                                int q = qw / cv->stride[1];
                                if (q >= Q) continue;
                                acc = mac(g, acc, load(dy, toff(Y, n, k, p, q), g->dt),
                                          load(w, woff(g, k, cl, r, s), g->dt));
                            }
                        }
                    blend(g, dx, toff(X, n, c, h, wi), acc, alpha, beta);
                }
}

/* The adjoint of forward in w: dw at the element that tap (r, s) of
 * (k, c) multiplies = sum over n, p, q of x[...] * dy[n, k, p, q]. For a
 * true convolution the tap (r, s) is stored mirrored, which woff handles. */
static void backward_filter(const conv_geom *g, const void *alpha, const void *x, const void *dy,
                            const void *beta, void *dw) {
    const struct cudnnTensorStruct *X = g->x, *Y = g->y;
    const struct cudnnConvolutionStruct *cv = g->cv;
    int N = X->dim[0], H = X->dim[2], W = X->dim[3];
    int K = Y->dim[1], P = Y->dim[2], Q = Y->dim[3];
    int Cg = g->w->dim[1], R = g->w->dim[2], S = g->w->dim[3], Kg = K / cv->groups;
    for (int k = 0; k < K; k++)
        for (int c = 0; c < Cg; c++)
            for (int r = 0; r < R; r++)
                for (int s = 0; s < S; s++) {
                    double acc = 0;
                    int c0 = (k / Kg) * Cg;
                    for (int n = 0; n < N; n++)
                        for (int p = 0; p < P; p++) {
                            int ih = p * cv->stride[0] - cv->pad[0] + r * cv->dil[0];
                            if (ih < 0 || ih >= H) continue;
                            for (int q = 0; q < Q; q++) {
                                int iw = q * cv->stride[1] - cv->pad[1] + s * cv->dil[1];
                                if (iw < 0 || iw >= W) continue;
                                acc = mac(g, acc, load(x, toff(X, n, c0 + c, ih, iw), g->dt),
                                          load(dy, toff(Y, n, k, p, q), g->dt));
                            }
                        }
                    blend(g, dw, woff(g, k, c, r, s), acc, alpha, beta);
                }
}

/* ---------------------------------------------------- heuristics, sizes */

/* One heuristic result. A configuration the routine rejects as unsupported
 * still gets a SUCCESS query with the entry marked NOT_SUPPORTED, as the
 * real heuristics report per-algorithm status; bad descriptors fail the
 * query itself. */
#define FILL_PERF(perf, st, algo_value, cv)                                                        \
    do {                                                                                           \
        memset(&(perf)[0], 0, sizeof(perf)[0]);                                                    \
        (perf)[0].algo = (algo_value);                                                             \
        (perf)[0].status = (st);                                                                   \
        (perf)[0].time = 0;                                                                        \
        (perf)[0].memory = 0;                                                                      \
        (perf)[0].determinism = CUDNN_DETERMINISTIC;                                               \
        (perf)[0].mathType = (cv) ? (cv)->math : CUDNN_DEFAULT_MATH;                               \
    } while (0)

static cudnnStatus_t query_status(cudnnStatus_t st, int requested, int *returned, const void *perf) {
    if (requested < 1 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
    return st == CUDNN_STATUS_BAD_PARAM ? st : CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnFilterDescriptor_t filterDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionFwdAlgoPerf_t *perfResults) {
    conv_geom g;
    cudnnStatus_t st = check(&g, handle, srcDesc, filterDesc, convDesc, destDesc, CUDNN_STATUS_BAD_PARAM);
    cudnnStatus_t q = query_status(st, requestedAlgoCount, returnedAlgoCount, perfResults);
    if (q != CUDNN_STATUS_SUCCESS) return q;
    FILL_PERF(perfResults, st, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, convDesc);
    *returnedAlgoCount = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults) {
    conv_geom g;
    cudnnStatus_t st = check(&g, handle, gradDesc, filterDesc, convDesc, diffDesc, CUDNN_STATUS_NOT_SUPPORTED);
    cudnnStatus_t q = query_status(st, requestedAlgoCount, returnedAlgoCount, perfResults);
    if (q != CUDNN_STATUS_SUCCESS) return q;
    FILL_PERF(perfResults, st, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, convDesc);
    *returnedAlgoCount = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnFilterDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults) {
    conv_geom g;
    cudnnStatus_t st = check(&g, handle, srcDesc, gradDesc, convDesc, diffDesc, CUDNN_STATUS_BAD_PARAM);
    cudnnStatus_t q = query_status(st, requestedAlgoCount, returnedAlgoCount, perfResults);
    if (q != CUDNN_STATUS_SUCCESS) return q;
    FILL_PERF(perfResults, st, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, convDesc);
    *returnedAlgoCount = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
                                                      const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *sizeInBytes) {
    conv_geom g;
    if (!sizeInBytes || (int)algo < 0 || algo >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check(&g, handle, xDesc, wDesc, convDesc, yDesc, CUDNN_STATUS_BAD_PARAM);
    if (st == CUDNN_STATUS_SUCCESS) *sizeInBytes = 0;
    return st;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes) {
    conv_geom g;
    if (!sizeInBytes || (int)algo < 0 || algo >= CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check(&g, handle, dxDesc, wDesc, convDesc, dyDesc, CUDNN_STATUS_NOT_SUPPORTED);
    if (st == CUDNN_STATUS_SUCCESS) *sizeInBytes = 0;
    return st;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes) {
    conv_geom g;
    if (!sizeInBytes || (int)algo < 0 || algo >= CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check(&g, handle, xDesc, gradDesc, convDesc, dyDesc, CUDNN_STATUS_BAD_PARAM);
    if (st == CUDNN_STATUS_SUCCESS) *sizeInBytes = 0;
    return st;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc, int *n,
                                                    int *c, int *h, int *w) {
    if (!convDesc || !inputTensorDesc || !filterDesc || !n || !c || !h || !w)
        return CUDNN_STATUS_BAD_PARAM;
    if (!convDesc->set || !inputTensorDesc->set || !filterDesc->set) return CUDNN_STATUS_BAD_PARAM;
    if (inputTensorDesc->dim[1] != filterDesc->dim[1] * convDesc->groups) return CUDNN_STATUS_BAD_PARAM;
    int oh = out_dim(inputTensorDesc->dim[2], convDesc->pad[0], filterDesc->dim[2], convDesc->dil[0],
                     convDesc->stride[0]);
    int ow = out_dim(inputTensorDesc->dim[3], convDesc->pad[1], filterDesc->dim[3], convDesc->dil[1],
                     convDesc->stride[1]);
    if (oh < 1 || ow < 1) return CUDNN_STATUS_BAD_PARAM;
    *n = inputTensorDesc->dim[0], *c = filterDesc->dim[0], *h = oh, *w = ow;
    return CUDNN_STATUS_SUCCESS;
}

/* ---------------------------------------------------------- the routines */

/* Work done when called keeps stream order only on a stream that runs its
 * work at once; on a deferred stream it would run early and hide missing
 * waits, so it is refused, loudly. */
static cudnnStatus_t on_stream(const char *fn, cudnnHandle_t h) {
    int r = fl_sim_stream_now ? fl_sim_stream_now(h->stream) : 0;
    if (r == 0) return CUDNN_STATUS_SUCCESS;
    fprintf(stderr, "sim_cudnn: %s: %s\n", fn,
            r > 0 ? "work on a deferred stream (from cudaStreamCreate*) is not simulated; "
                    "stream 0 is, or FSDP_CUDASIM_STREAMS=eager runs every stream at once"
                  : "not a CUDA stream");
    return r > 0 ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_BAD_PARAM;
}

/* Arguments every routine checks alike: data pointers, scaling factors, an
 * algorithm that exists, a workspace pointer when a size is claimed. */
static cudnnStatus_t check_args(const void *alpha, const void *beta, const void *a, const void *b,
                                const void *out, int algo, int algo_count, const void *ws,
                                size_t ws_bytes) {
    if (!alpha || !beta || !a || !b || !out) return CUDNN_STATUS_BAD_PARAM;
    if (algo < 0 || algo >= algo_count) return CUDNN_STATUS_BAD_PARAM;
    if (ws_bytes > 0 && !ws) return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                      const cudnnTensorDescriptor_t xDesc, const void *x,
                                      const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc,
                                      cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                      size_t workSpaceSizeInBytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y) {
    conv_geom g;
    cudnnStatus_t st = check_args(alpha, beta, x, w, y, (int)algo, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                  workSpace, workSpaceSizeInBytes);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check(&g, handle, xDesc, wDesc, convDesc, yDesc, CUDNN_STATUS_BAD_PARAM);
    if (st == CUDNN_STATUS_SUCCESS) st = on_stream("cudnnConvolutionForward", handle);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    forward(&g, alpha, x, w, beta, y);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                           const cudnnFilterDescriptor_t wDesc, const void *w,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                           size_t workSpaceSizeInBytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx) {
    conv_geom g;
    cudnnStatus_t st = check_args(alpha, beta, w, dy, dx, (int)algo,
                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, workSpace, workSpaceSizeInBytes);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check(&g, handle, dxDesc, wDesc, convDesc, dyDesc, CUDNN_STATUS_NOT_SUPPORTED);
    if (st == CUDNN_STATUS_SUCCESS) st = on_stream("cudnnConvolutionBackwardData", handle);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    backward_data(&g, alpha, w, dy, beta, dx);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwDesc, void *dw) {
    conv_geom g;
    cudnnStatus_t st = check_args(alpha, beta, x, dy, dw, (int)algo,
                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, workSpace, workSpaceSizeInBytes);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check(&g, handle, xDesc, dwDesc, convDesc, dyDesc, CUDNN_STATUS_BAD_PARAM);
    if (st == CUDNN_STATUS_SUCCESS) st = on_stream("cudnnConvolutionBackwardFilter", handle);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    backward_filter(&g, alpha, x, dy, beta, dw);
    return CUDNN_STATUS_SUCCESS;
}

#pragma GCC diagnostic pop
