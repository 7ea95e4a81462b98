/*
 * cpu_rows_avx512.c: the f32 row loops of cpu_fused_rows.h (max,
 * exp-and-sum, exp-affine) written for AVX-512, which those loops call
 * where the CPU has it (fl_cpu_avx512, cpu_fused_math.h).
 *
 * Why by hand rather than GCC's AVX-512 clone of the same C: that clone
 * was kept out after a sharded tiny Llama drifted further from one rank
 * with it (see FL_FUSED_CLONES; the cause was not found, and GCC reports
 * no alignment peeling for these loops). These loops fix their order of
 * summation themselves: they start at the row's first element whatever its
 * address and take the tail with a mask, so a row's result depends on its
 * values and length only; with them the drift stayed where it was
 * (tests/mpi/fsdp_equivalence.lua, f32: 1.4e-6). 16 lanes also run the exp
 * of softmax, cross-entropy and attention about twice as fast as the AVX2
 * clone's 8.
 */
#include "cpu_fused_math.h"

#if FL_ROWS_AVX512_BUILD

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

#include "cpu_avx512.h"

#include <math.h>

float fl_avx512_row_max(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, fl_lanes_below(i, n), x + i));
    return _mm512_reduce_max_ps(m);
}

float fl_avx512_row_exp(float *dst, const float *x, int64_t n, float shift) {
    __m512 sum = _mm512_setzero_ps(), s = _mm512_set1_ps(shift);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = fl_lanes_below(i, n);
        __m512 e = _mm512_maskz_mov_ps(k, fl_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s)));
        if (dst) _mm512_mask_storeu_ps(dst + i, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

void fl_avx512_row_exp_affine(float *dst, const float *x, int64_t n, float shift, float a, float b,
                              const float *c) {
    __m512 s = _mm512_set1_ps(shift), va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = fl_lanes_below(i, n);
        __m512 e = fl_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s));
        __m512 y = _mm512_fmadd_ps(va, e, vb);
        if (c) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(k, c + i));
        _mm512_mask_storeu_ps(dst + i, k, y);
    }
}

#endif
