/*
 * cudasim.h: what a CUDA kernel file of core/cuda needs to compile as plain
 * C++ and run on the CPU, for the cudasim test build (see README.md here).
 *
 * The build force-includes this header into every .cu file after
 * rewrite.lua has turned `kernel<<<grid, block, smem, stream>>>(args)`
 * into `fl_sim_launch(kernel, grid, block, smem, stream)(args)` (which
 * hands the launch to the runtime: sim_internal.h). The real
 * CUDA headers supply the types (dim3, cudaStream_t, __nv_bfloat16, ...)
 * and the host half of the bf16/f16 conversions; this header supplies the
 * device half of the language:
 *
 * - threadIdx, blockIdx, blockDim, gridDim of the fiber now running
 *   (sim_fiber.cc runs a block's threads as fibers, one block at a time);
 * - __shared__ as `static`: one block runs at a time, so a function-local
 *   static IS the block's shared memory;
 * - __syncthreads and the warp collectives (__shfl*_sync, __syncwarp,
 *   __ballot_sync), which suspend the fiber until every thread that must
 *   take part has arrived, and report divergence instead of hanging;
 * - atomics as plain read-modify-write (fibers never preempt each other);
 * - the rounding intrinsics the kernels use, as the IEEE operations they
 *   name (the build turns off FMA contraction, so a*b is __fmul_rn).
 */
#ifndef FL_CUDASIM_H
#define FL_CUDASIM_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "sim_internal.h" /* fl_sim_site, fl_sim_launch_kernel */

/* ---- the scheduler's interface (sim_fiber.cc) ------------------------------ */

struct fl_sim_thread {
    uint3 idx;    /* threadIdx */
    int lane;     /* linear thread index % 32 */
    int warp;     /* linear thread index / 32 */
};

extern fl_sim_thread *fl_sim_self;         /* the fiber now running */
extern uint3 fl_sim_block_idx;
extern dim3 fl_sim_block_dim, fl_sim_grid_dim;

void fl_sim_syncthreads(void);
unsigned char *fl_sim_dynamic_smem(void);

enum fl_sim_warp_op { FL_SIM_SHFL, FL_SIM_BALLOT, FL_SIM_SYNCWARP };
/* Wait for the lanes of mask, then: FL_SIM_SHFL returns the value of lane
 * src (or this lane's own when src < 0); FL_SIM_BALLOT the mask of lanes
 * whose value is non-zero. */
uint64_t fl_sim_warp(enum fl_sim_warp_op op, unsigned mask, uint64_t value, int src);

/* ---- the language ------------------------------------------------------------ */

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef warpSize
#define warpSize 32
#define threadIdx (fl_sim_self->idx)
#define blockIdx fl_sim_block_idx
#define blockDim fl_sim_block_dim
#define gridDim fl_sim_grid_dim

static inline void __syncthreads(void) { fl_sim_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { fl_sim_warp(FL_SIM_SYNCWARP, mask, 0, -1); }
static inline void __threadfence(void) {}

template <class T> static inline uint64_t fl_sim_bits(T v) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T fl_sim_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* Lanes are grouped in segments of `width`; a source outside the caller's
 * segment returns the caller's own value (the CUDA programming guide's
 * rule for __shfl_xor_sync and __shfl_down_sync). */
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    int base = fl_sim_self->lane & ~(width - 1);
    return fl_sim_from_bits<T>(fl_sim_warp(FL_SIM_SHFL, mask, fl_sim_bits(v), base + (src & (width - 1))));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    int lane = fl_sim_self->lane, base = lane & ~(width - 1), src = lane ^ lane_mask;
    return fl_sim_from_bits<T>(
        fl_sim_warp(FL_SIM_SHFL, mask, fl_sim_bits(v), src >= base + width ? -1 : src));
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int lane = fl_sim_self->lane, base = lane & ~(width - 1), src = lane + (int)delta;
    return fl_sim_from_bits<T>(
        fl_sim_warp(FL_SIM_SHFL, mask, fl_sim_bits(v), src >= base + width ? -1 : src));
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int lane = fl_sim_self->lane, base = lane & ~(width - 1), src = lane - (int)delta;
    return fl_sim_from_bits<T>(fl_sim_warp(FL_SIM_SHFL, mask, fl_sim_bits(v), src < base ? -1 : src));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)fl_sim_warp(FL_SIM_BALLOT, mask, pred != 0, -1);
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) == __ballot_sync(mask, 1);
}

/* Atomics: a fiber runs until it waits, so a read-modify-write is atomic. */
template <class T, class U> static inline T atomicAdd(T *p, U v) { T old = *p; *p = (T)(old + v); return old; }
template <class T, class U> static inline T atomicMin(T *p, U v) { T old = *p; if ((T)v < old) *p = (T)v; return old; }
template <class T, class U> static inline T atomicMax(T *p, U v) { T old = *p; if ((T)v > old) *p = (T)v; return old; }
template <class T, class U> static inline T atomicExch(T *p, U v) { T old = *p; *p = (T)v; return old; }
template <class T, class U> static inline T atomicCAS(T *p, U cmp, U v) { T old = *p; if (old == (T)cmp) *p = (T)v; return old; }
template <class T, class U> static inline T atomicOr(T *p, U v) { T old = *p; *p = (T)(old | v); return old; }

/* Loads through the read-only cache are loads. */
template <class T> static inline T __ldg(const T *p) { return *p; }

/* Rounding intrinsics: the IEEE operation in the named rounding (the
 * host's default, round to nearest even); -ffp-contract=off keeps the
 * compiler from fusing them. */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __double2float_rn(double a) { return (float)a; }
static inline float __int2float_rn(int a) { return (float)a; }
static inline float __uint2float_rn(unsigned a) { return (float)a; }
static inline float __ll2float_rn(long long a) { return (float)a; }
static inline double __ll2double_rn(long long a) { return (double)a; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
#define __expf expf /* glibc declares its own __expf, __logf */
#define __logf logf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

/* Device min and max, overloaded for every arithmetic pair as CUDA's are. */
template <class A, class B> static inline typename std::common_type<A, B>::type min(A a, B b) {
    return b < a ? b : a;
}
template <class A, class B> static inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}

/* The runtime's template overload for kernel pointers (nvcc's headers
 * declare it only when compiling CUDA). */
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *kernel, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)kernel, attr, value);
}

/* ---- kernel launches ----------------------------------------------------------- */

/* `fl_sim_launch(site, k, grid, block, smem, stream)(args...)`: the
 * arguments are copied into a closure on the heap, as a launch copies them
 * to the device (by value, at the launch: a host variable changed after
 * the launch does not change a launch still queued on a stream), and
 * k(args...) runs once per thread, now or when the stream is forced
 * (sim_runtime.cc). */
template <class F> struct fl_sim_launcher {
    fl_sim_site site;
    F kernel;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    template <class... A> void operator()(A &&...args) const {
        struct closure {
            F kernel;
            std::tuple<typename std::decay<A>::type...> args;
        };
        closure *c = new closure{kernel, std::tuple<typename std::decay<A>::type...>(std::forward<A>(args)...)};
        fl_sim_launch_kernel(
            site, (const void *)kernel, grid, block, smem, stream,
            [](void *p) {
                closure *cl = (closure *)p;
                std::apply(cl->kernel, cl->args);
            },
            c, [](void *p) { delete (closure *)p; });
    }
};

template <class F>
static inline fl_sim_launcher<F> fl_sim_launch(const char *file, int line, const char *name, F kernel,
                                               dim3 grid, dim3 block, size_t smem = 0,
                                               cudaStream_t stream = 0) {
    return fl_sim_launcher<F>{{file, line, name}, kernel, grid, block, smem, stream};
}

#endif /* FL_CUDASIM_H */
