/*
 * cpu_fused_math.h: what the fused CPU kernels (norms, softmax, losses,
 * rotary, attention) share: lane addressing, the per-thread scratch
 * convention, and an exp for f32 that the compiler can vectorise.
 *
 * Why a hand-written expf: softmax, cross-entropy and attention spend
 * most of their non-GEMM time in exp, and glibc's expf is a scalar call
 * (its vector variants are only declared under -ffast-math), so the loops
 * around it cannot vectorise. This one is Cephes' expf (range reduction by
 * ln 2 in two parts, degree-6 polynomial, the power of two built in the
 * exponent bits): relative error below 2 ulp, written with selects and
 * integer arithmetic only so a loop of it becomes SIMD code.
 */
#ifndef FL_CPU_FUSED_MATH_H
#define FL_CPU_FUSED_MATH_H

#include "cpu_isa_dispatch.h"
#include "cpu_iter.h"
#include "cpu_rows_avx512.h"
#include "backend.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* Hot row loops (cpu_fused_rows.h) get an AVX2+FMA variant next to the
 * baseline x86-64 code, run from the avx2 level ([Note: ISA clones],
 * FL_ISA_CLONES with AVX2 the widest): 8-wide exp instead of 4-wide
 * SSE2. Measured on attention forward+backward at B=4, H=8, T=256, D=64:
 * 1.2x. No AVX-512 variant as the other families have: as a GCC clone it
 * made attention's forward only 8% faster, and a sharded tiny Llama then
 * drifted from the same model on
 * one rank by 1.3e-5 after a few AdamW steps instead of 1.6e-6
 * (tests/mpi/fsdp_equivalence.lua). Probably not a dependence on the
 * split but the exp's rounding: an AVX-512 exp in another order of
 * operations moved tests/mpi/fsdp_api.lua's drift from 3.9e-6 to 1.1e-5,
 * and in fl_fast_expf's order to 5.1e-6 (cpu_avx512.h's fl_exp16, which
 * the AVX-512 row loops of cpu_rows_avx512.c use instead of this variant). */

/* Below this many elements an op runs on the calling thread. */
enum { FL_FUSED_PARALLEL_MIN = 1 << 15 };

/* e^x in f32 for x <= 88 (softmax and friends call it on x - max <= 0):
 * x >= 88 gives e^88, x below -87.33 (e^x < FLT_MIN) gives 0, -inf gives
 * 0, nan gives nan. */
static inline float fl_fast_expf(float x) {
    const float lo = -87.3365478515625f, hi = 88.0f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    float t = xc * 1.44269504088896341f + shifter;
    float n = t - shifter; /* round(x / ln 2) */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n from the integer sitting in t's low mantissa bits; unsigned so
     * that a nan's arbitrary bits wrap instead of overflowing. */
    uint32_t tb, sb;
    memcpy(&tb, &t, sizeof tb);
    memcpy(&sb, &shifter, sizeof sb);
    uint32_t eb = (tb - sb + 127u) << 23;
    float scale;
    memcpy(&scale, &eb, sizeof scale);
    float res = p * scale;
    return x < lo ? 0.0f : res;
}

/* Element offset of lane `lane` of t along dim: lanes are numbered
 * row-major over all dims but dim. A 0-d tensor has one lane. */
static inline int64_t fl_fused_lane_offset(const fl_tensor *t, int dim, int64_t lane) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0 && lane > 0; d--) {
        if (d == dim) continue;
        off += (lane % t->shape[d]) * t->stride[d];
        lane /= t->shape[d];
    }
    return off;
}

/* Address of a lane's first element, its length and its element stride. */
static inline char *fl_fused_lane(const fl_tensor *t, int dim, int64_t lane) {
    return (char *)t->data + fl_fused_lane_offset(t, dim, lane) * (int64_t)fl_dtype_size(t->dtype);
}
static inline int64_t fl_fused_lane_len(const fl_tensor *t, int dim) {
    return t->ndim ? t->shape[dim] : 1;
}
static inline int64_t fl_fused_lane_stride(const fl_tensor *t, int dim) {
    return t->ndim ? t->stride[dim] : 1;
}

/* The attention kernels (cpu_attention.c), entries of the family's table. */
int fl_cpu_attention(const fl_attention_args *a);
int fl_cpu_attention_backward(const fl_attention_args *a);

/* Whether an attention kernel spreads its work items over threads: only
 * when there are several and the whole job is worth a parallel region
 * (work: multiply-adds of the products); the small attentions of tests and
 * gradient checks stay on one thread. Shared by the f32 kernels and the
 * bf16 ones. */
static inline bool fl_attention_parallel(int64_t items, int64_t work) {
    return items > 1 && work >= (1 << 20) && omp_get_max_threads() > 1;
}
/* bf16 attention on AMX tiles or AVX512-BF16 dot products where the CPU
 * has them (cpu_attention_native.c): the table's attention_native entries. */
int fl_cpu_attention_native(const fl_attention_args *a, bool *done);
int fl_cpu_attention_native_backward(const fl_attention_args *a, bool *done);

#endif /* FL_CPU_FUSED_MATH_H */
