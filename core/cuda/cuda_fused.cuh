/*
 * cuda_fused.cuh: what the CUDA kernels of the fused family (cuda_norm.cu,
 * cuda_softmax.cu, cuda_loss.cu, cuda_rotary.cu, cuda_attention*.cu) share:
 * loads and stores in the compute type R (float for f32/f16/bf16 tensors,
 * double for f64, as the CPU kernels of cpu_fused_gen.h), the addressing of
 * lanes (the rows a reduction runs along), and warp and block reductions.
 *
 * A lane is numbered row-major over every dim but the reduced one, as
 * fl_fused_lane_offset does on the CPU. Kernels get a fl_cu_lanes by value:
 * the layout, the reduced dim, and, when the lanes sit at a constant
 * distance from each other (every contiguous or row-strided tensor), that
 * distance, so that the common case costs one multiply instead of a
 * division per dim.
 */
#ifndef FL_CUDA_FUSED_CUH
#define FL_CUDA_FUSED_CUH

#include "cuda_common.cuh"
#include "cuda_vec.cuh"

extern "C" {
#include "backend.h"
}

#include <math.h>

/* ---- loads and stores in the compute type --------------------------------- */

template <typename R> __device__ __forceinline__ R fl_cu_ld(const void *p, int64_t i, int dt);
template <> __device__ __forceinline__ float fl_cu_ld<float>(const void *p, int64_t i, int dt) {
    return fl_cu_get_f32(p, i, dt);
}
template <> __device__ __forceinline__ double fl_cu_ld<double>(const void *p, int64_t i, int dt) {
    return fl_cu_get_f64(p, i, dt);
}

__device__ __forceinline__ void fl_cu_st(void *p, int64_t i, int dt, float v) {
    fl_cu_put_f32(p, i, dt, v);
}
__device__ __forceinline__ void fl_cu_st(void *p, int64_t i, int dt, double v) {
    fl_cu_put_f64(p, i, dt, v);
}

/* An integer element (targets, positions) without going through float. */
__device__ __forceinline__ int64_t fl_cu_ld_i64(const void *p, int64_t i, int dt) {
    switch (dt) {
    case FL_I64: return ((const long long *)p)[i];
    case FL_I32: return ((const int *)p)[i];
    case FL_I16: return ((const short *)p)[i];
    case FL_I8: return ((const signed char *)p)[i];
    case FL_U32: return ((const unsigned *)p)[i];
    case FL_U16: return ((const unsigned short *)p)[i];
    case FL_U8:
    case FL_BOOL: return ((const unsigned char *)p)[i];
    default: return (int64_t)fl_cu_get_f64(p, i, dt);
    }
}

/* v rounded through a 16-bit dtype (Llama's RMSNorm cast), or v itself. */
__device__ __forceinline__ float fl_cu_round_to(float v, int dt) {
    if (dt == FL_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (dt == FL_F16) return __half2float(__float2half_rn(v));
    return v;
}
__device__ __forceinline__ double fl_cu_round_to(double v, int dt) {
    return dt == FL_BF16 || dt == FL_F16 ? (double)fl_cu_round_to((float)v, dt) : v;
}

__device__ __forceinline__ float fl_cu_exp(float x) { return expf(x); }
__device__ __forceinline__ double fl_cu_exp(double x) { return exp(x); }
__device__ __forceinline__ float fl_cu_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double fl_cu_tanh(double x) { return tanh(x); }

/* ---- lanes ------------------------------------------------------------------ */

struct fl_cu_lanes {
    fl_cu_layout l;
    int dim;       /* the reduced dim (-1: a 0-d tensor, one lane of one element) */
    int64_t step;  /* element stride along dim */
    int64_t flat;  /* distance between consecutive lanes, or -1: walk the dims */
};

/* The lanes of t along dim (host side). */
static inline fl_cu_lanes fl_cu_lanes_of(const fl_tensor *t, int dim) {
    fl_cu_lanes s;
    s.l = fl_cu_layout_of(t);
    s.dim = t->ndim ? dim : -1;
    s.step = t->ndim ? t->stride[dim] : 1;
    /* Flat when the other dims, in order, nest like one dim: each stride
     * is the next one's times its size (size-1 dims are free). */
    int64_t expect = -1;
    bool flat = true;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (d == dim || t->shape[d] == 1) continue;
        if (expect >= 0 && t->stride[d] != expect) flat = false;
        if (expect < 0) s.flat = t->stride[d];
        expect = t->stride[d] * t->shape[d];
    }
    if (expect < 0) s.flat = 0; /* one lane */
    if (!flat) s.flat = -1;
    return s;
}

/* True when t's lanes along dim suit 16-byte vector loads (cuda_vec.cuh):
 * t of a dtype the vector path serves, contiguous along dim, and every lane
 * starting a vector (the data aligned, every other dim's stride a whole
 * number of vectors; size-1 dims are free). A lane's length need not be
 * whole vectors: kernels finish it element by element. */
static inline bool fl_cu_lanes_vec_ok(const fl_tensor *t, int dim) {
    if (!fl_cu_vec_dtype(t->dtype) || !t->ndim || !fl_cu_vec_aligned(t->data)) return false;
    if (t->stride[dim] != 1 && t->shape[dim] > 1) return false;
    int64_t size = (int64_t)fl_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++)
        if (d != dim && t->shape[d] > 1 && (t->stride[d] * size) % FL_CU_VEC_BYTES) return false;
    return true;
}

/* True when a contiguous output of `lanes` lanes of n elements (dtype dt,
 * data p) has every lane starting a vector. */
static inline bool fl_cu_rows_vec_ok(const void *p, fl_dtype dt, int64_t lanes, int64_t n) {
    return fl_cu_vec_dtype(dt) && fl_cu_vec_aligned(p) &&
           (lanes <= 1 || (n * (int64_t)fl_dtype_size(dt)) % FL_CU_VEC_BYTES == 0);
}

/* Element offset of lane `lane`'s first element. */
__device__ __forceinline__ int64_t fl_cu_lane_offset(const fl_cu_lanes &s, int64_t lane) {
    if (s.flat >= 0) return lane * s.flat;
    int64_t off = 0;
    for (int d = s.l.ndim - 1; d >= 0 && lane > 0; d--) {
        if (d == s.dim) continue;
        off += (lane % s.l.shape[d]) * s.l.stride[d];
        lane /= s.l.shape[d];
    }
    return off;
}

/* ---- reductions ------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ T fl_cu_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T fl_cu_warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) over the block, returned to every thread. blockDim.x is a
 * multiple of 32; every thread of the block must call it. */
template <typename T, bool MAX> __device__ T fl_cu_block_reduce(T v) {
    __shared__ T part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = MAX ? fl_cu_warp_max(v) : fl_cu_warp_sum(v);
    __syncthreads(); /* the previous call's readers are done with part */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T ident = MAX ? (T)-INFINITY : (T)0;
        v = lane < warps ? part[lane] : ident;
        v = MAX ? fl_cu_warp_max(v) : fl_cu_warp_sum(v);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

template <typename T> __device__ __forceinline__ T fl_cu_block_sum(T v) {
    return fl_cu_block_reduce<T, false>(v);
}
template <typename T> __device__ __forceinline__ T fl_cu_block_max(T v) {
    return fl_cu_block_reduce<T, true>(v);
}

/* Threads for one block per lane of n elements: a power of two from 32 to
 * 1024, no more than the lane can use. Kernels launched with it declare
 * __launch_bounds__(1024), so they never need more registers than a
 * 1024-thread block can have. */
static inline int fl_cu_row_threads(int64_t n) {
    int t = 32;
    while (t < 1024 && t < n) t *= 2;
    return t;
}

/* Threads for one block per lane of the vector kernels (a thread per
 * `units` 16-byte chunks at most), which declare
 * __launch_bounds__(FL_CU_VEC_ROW_THREADS): half the usual block, so each
 * thread may hold 128 registers (its chunks of the row) without spilling. */
enum { FL_CU_VEC_ROW_THREADS = 512 };
static inline int fl_cu_vec_row_threads(int64_t units) {
    int t = fl_cu_row_threads(units);
    return t < FL_CU_VEC_ROW_THREADS ? t : FL_CU_VEC_ROW_THREADS;
}

/* Blocks for one block per lane, grid-striding beyond the limit. */
static inline unsigned fl_cu_row_blocks(int64_t lanes) {
    return lanes < 1 ? 1u : lanes > 65535LL * 16 ? 65535u * 16 : (unsigned)lanes;
}

/* A contiguous scratch tensor of n elements on t's device (through the
 * caching pool); NULL with the core's error set. */
static inline fl_tensor *fl_cu_scratch(int64_t n, fl_dtype dtype, const fl_tensor *like) {
    int64_t shape[1] = {n > 0 ? n : 1};
    return fl_empty(1, shape, dtype, like->device);
}

/* ---- the entries of fl_cuda_fused_kernels (cuda_fused.cu) ----------------- */

fl_rms_norm_kernel fl_cuda_rms_norm;
fl_rms_norm_backward_kernel fl_cuda_rms_norm_backward;
fl_add_rms_norm_kernel fl_cuda_add_rms_norm;
fl_add_rms_norm_backward_kernel fl_cuda_add_rms_norm_backward;
fl_layer_norm_kernel fl_cuda_layer_norm;
fl_layer_norm_backward_kernel fl_cuda_layer_norm_backward;
fl_softmax_kernel fl_cuda_softmax;
fl_softmax_backward_kernel fl_cuda_softmax_backward;
fl_cross_entropy_kernel fl_cuda_cross_entropy;
fl_cross_entropy_backward_kernel fl_cuda_cross_entropy_backward;
fl_nll_loss_kernel fl_cuda_nll_loss;
fl_nll_loss_backward_kernel fl_cuda_nll_loss_backward;
fl_rotary_kernel fl_cuda_rotary;
fl_attention_kernel fl_cuda_attention;
fl_attention_backward_kernel fl_cuda_attention_backward;

#endif /* FL_CUDA_FUSED_CUH */
