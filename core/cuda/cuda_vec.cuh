/*
 * cuda_vec.cuh: 16-byte loads and stores for the memory-bound kernels.
 *
 * Why: a kernel that moves one 2-byte element per thread through a
 * run-time dtype switch reaches a fraction of HBM bandwidth (the H100
 * profile of 2026-12-06: SiLU-multiply at about a quarter of it). Reading
 * and writing 16 bytes per thread per operand (8 bf16/f16 or 4 f32
 * elements) with the dtype fixed at compile time is what the hardware
 * wants. The arithmetic per element is unchanged, and the conversions are
 * cuda_dtype.cuh's (bit-exact with dtype.c), so a vectorised kernel gives
 * the bits of the scalar one.
 *
 * A kernel uses the vector path only where fl_cu_vec_ok says so (every
 * operand dense, of the one dtype, 16-byte aligned); elements past the last
 * whole vector are done one by one by the same functor. fl_cu_vec_dispatch
 * turns a run-time float dtype into the compile-time one.
 */
#ifndef FL_CUDA_VEC_CUH
#define FL_CUDA_VEC_CUH

#include "cuda_common.cuh"

/* Bytes per vector access: one 128-bit load or store. */
enum { FL_CU_VEC_BYTES = 16 };

/* Storage of dtype DT (FL_F32, FL_BF16 or FL_F16), FL_CU_VEC_BYTES of it.
 * The lanes are a union with the 16-byte word, not pointer casts of it: a
 * host compiler (cudasim's g++) may drop stores made through a cast
 * pointer of another type (strict aliasing), and GCC and nvcc define
 * reading a union member other than the one last written. */
template <int DT> struct fl_cu_vec {
    static constexpr int SIZE = DT == FL_F32 ? 4 : 2;  /* bytes per element */
    static constexpr int N = FL_CU_VEC_BYTES / SIZE;   /* elements per vector */
    union {
        uint4 raw;
        float f[4];
        uint16_t h[8];
    } u;

    /* Vector v of p (elements v * N ... v * N + N - 1). */
    __device__ __forceinline__ static fl_cu_vec load(const void *p, int64_t v) {
        fl_cu_vec r;
        r.u.raw = ((const uint4 *)p)[v];
        return r;
    }
    __device__ __forceinline__ void store(void *p, int64_t v) const { ((uint4 *)p)[v] = u.raw; }

    /* Element k as f32, and f32 stored with dtype.c's rounding. */
    __device__ __forceinline__ float get(int k) const {
        if (DT == FL_F32) return u.f[k];
        return DT == FL_BF16 ? fl_f32_from_bf16(u.h[k]) : fl_f32_from_f16(u.h[k]);
    }
    __device__ __forceinline__ void set(int k, float v) {
        if (DT == FL_F32)
            u.f[k] = v;
        else
            u.h[k] = DT == FL_BF16 ? fl_bf16_from_f32(v) : fl_f16_from_f32(v);
    }
};

/* Element i of p (dtype DT) as f32, and f32 stored there: the scalar tail. */
template <int DT> __device__ __forceinline__ float fl_cu_vget(const void *p, int64_t i) {
    if (DT == FL_F32) return ((const float *)p)[i];
    uint16_t b = ((const uint16_t *)p)[i];
    return DT == FL_BF16 ? fl_f32_from_bf16(b) : fl_f32_from_f16(b);
}
template <int DT> __device__ __forceinline__ void fl_cu_vput(void *p, int64_t i, float v) {
    if (DT == FL_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = DT == FL_BF16 ? fl_bf16_from_f32(v) : fl_f16_from_f32(v);
}

/* K consecutive elements of p (dtype DT) from element i, as f32, and K f32
 * stored there: whole 16-byte vectors, so (i * element size) and K * element
 * size are multiples of 16 bytes. For kernels whose operands differ in
 * dtype (a bf16 row with f32 weights: 8 elements are one bf16 vector and
 * two f32 ones). */
template <int DT, int K> __device__ __forceinline__ void fl_cu_vload(const void *p, int64_t i, float (&v)[K]) {
    typedef fl_cu_vec<DT> V;
    static_assert(K % V::N == 0, "K must be whole vectors");
    const char *b = (const char *)p + i * V::SIZE;
#pragma unroll
    for (int j = 0; j < K / V::N; j++) {
        V a = V::load(b, j);
#pragma unroll
        for (int k = 0; k < V::N; k++) v[j * V::N + k] = a.get(k);
    }
}
template <int DT, int K> __device__ __forceinline__ void fl_cu_vstore(void *p, int64_t i, const float (&v)[K]) {
    typedef fl_cu_vec<DT> V;
    static_assert(K % V::N == 0, "K must be whole vectors");
    char *b = (char *)p + i * V::SIZE;
#pragma unroll
    for (int j = 0; j < K / V::N; j++) {
        V a;
#pragma unroll
        for (int k = 0; k < V::N; k++) a.set(k, v[j * V::N + k]);
        a.store(b, j);
    }
}

/* A dtype the vector path serves. */
static inline bool fl_cu_vec_dtype(fl_dtype dt) {
    return dt == FL_F32 || dt == FL_BF16 || dt == FL_F16;
}

/* True when p (an operand's first element) starts a 16-byte vector; NULL
 * (an absent operand) is fine. */
static inline bool fl_cu_vec_aligned(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* True when the vector path may serve these tensors: all of dtype dt (one
 * the path serves) and of ts[0]'s element count, contiguous in row-major
 * order (so no broadcast view), 16-byte aligned. NULL entries (absent
 * operands) are skipped. */
static inline bool fl_cu_vec_ok(fl_dtype dt, int n, const fl_tensor *const *ts) {
    if (!fl_cu_vec_dtype(dt)) return false;
    int64_t numel = -1;
    for (int k = 0; k < n; k++) {
        const fl_tensor *t = ts[k];
        if (!t) continue;
        if (numel < 0) numel = t->numel;
        if (t->dtype != dt || t->numel != numel || !fl_tensor_is_contiguous(t) ||
            !fl_cu_vec_aligned(t->data))
            return false;
    }
    return true;
}

/* Blocks for a grid-stride loop over n elements taken N per thread. */
static inline unsigned fl_cu_vec_blocks(int64_t n, int per_thread, int threads) {
    return fl_cu_blocks((n + per_thread - 1) / per_thread, threads);
}

/* out[i] = f(a[i]) (NIN 1) or f(a[i], b[i]) (NIN 2) over n elements, all
 * of dtype DT and dense and aligned (fl_cu_vec_ok): a vector per operand per
 * thread step, the elements past the last whole vector one by one, the same
 * f (a functor computing in f32) for both. The elementwise ops' dense paths. */
template <int DT, int NIN, typename F>
__global__ void fl_cu_vec_map_kernel(int64_t n, void *out, const void *a, const void *b, F f) {
    typedef fl_cu_vec<DT> V;
    int64_t nv = n / V::N, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = t; v < nv; v += stride) {
        V x = V::load(a, v), r;
        if constexpr (NIN == 2) {
            V y = V::load(b, v);
#pragma unroll
            for (int k = 0; k < V::N; k++) r.set(k, f(x.get(k), y.get(k)));
        } else {
#pragma unroll
            for (int k = 0; k < V::N; k++) r.set(k, f(x.get(k)));
        }
        r.store(out, v);
    }
    for (int64_t i = nv * V::N + t; i < n; i += stride) {
        if constexpr (NIN == 2)
            fl_cu_vput<DT>(out, i, f(fl_cu_vget<DT>(a, i), fl_cu_vget<DT>(b, i)));
        else
            fl_cu_vput<DT>(out, i, f(fl_cu_vget<DT>(a, i)));
    }
}

/* Blocks for fl_cu_vec_map_kernel over t's elements (threads per block). */
static inline unsigned fl_cu_vec_map_blocks(const fl_tensor *t, int threads) {
    return fl_cu_vec_blocks(t->numel, FL_CU_VEC_BYTES / (int)fl_dtype_size(t->dtype), threads);
}

/* Run BODY with the compile-time constant VDT bound to the run-time float
 * dtype dt (FL_F32, FL_BF16 or FL_F16; the caller checked fl_cu_vec_dtype). */
#define fl_cu_vec_dispatch(dt, VDT, ...)                                                          \
    do {                                                                                           \
        if ((dt) == FL_F32) {                                                                      \
            constexpr int VDT = FL_F32;                                                            \
            __VA_ARGS__;                                                                           \
        } else if ((dt) == FL_BF16) {                                                              \
            constexpr int VDT = FL_BF16;                                                           \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            constexpr int VDT = FL_F16;                                                            \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

#endif /* FL_CUDA_VEC_CUH */
