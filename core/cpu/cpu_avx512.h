/*
 * cpu_avx512.h: 16-lane helpers for the kernels built for AVX-512
 * (cpu_rows_avx512.c, cpu_attention_bf16.c, cpu_block_gemm.c): e^x, bf16
 * loads and stores, a 16 x 16 transpose. Include only from a file
 * compiled for AVX-512 (its own `#pragma GCC target`), whose functions
 * run only where the CPU has it.
 */
#ifndef FL_CPU_AVX512_H
#define FL_CPU_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* e^x, fl_fast_expf's method and order of operations (cpu_fused_math.h,
 * as GCC compiles it with FMA: the rounding to an integer by adding 1.5 *
 * 2^23, the polynomial's last step as (p r) r + r, then + 1) 16 lanes wide:
 * x >= 88 gives e^88, x below -87.34 (and -inf) gives 0, nan stays nan
 * (the clamps take their constant first: max and min return their second
 * operand when one is nan). The order matters beyond an ulp: with the
 * integer part from roundscale and 1 + r added first, a sharded tiny
 * Llama drifted from one rank by 1.1e-5 after two AdamW steps (over the
 * 1e-5 bound of tests/mpi/fsdp_api.lua); in this order 5.1e-6, against
 * 3.9e-6 on the AVX2 clone of fl_fast_expf. */
static inline __m512 fl_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3365478515625f), shifter = _mm512_set1_ps(12582912.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lo, x));
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter);
    __m512 n = _mm512_sub_ps(t, shifter);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps((__mmask16)~under, p, n);
}

/* A 16 x 16 block of 32-bit lanes transposed in registers: r[i] holds
 * row i, and afterwards column i (pairs, then quads, then 128-bit lanes
 * swapped). Transposes move 32-bit units with it: a pair of bf16
 * values (cpu_attention_bf16.c), or one f32 (cpu_block_gemm.c). On AMD's
 * Zen 5 a gather (one f32 per lane) or an element loop took about a fifth
 * of bf16 attention's backward time. Always inlined: as a call its 16
 * registers went through memory. */
static inline __attribute__((always_inline)) void fl_transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(u[i], u[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(u[i], u[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(u[i + 8], u[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(u[i + 8], u[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* The lanes j ... j+15 below n. */
static inline __mmask16 fl_lanes_below(int64_t j, int64_t n) {
    int64_t left = n - j;
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* 16 bf16 (raw bits) as f32, and back rounded to nearest even. */
static inline __m512 fl_load_bf16x16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* x rounded to bf16 as fl_convert rounds (dtype.c's bf16_from_f32: ties
 * to even, subnormals kept, a nan quieted with its top bits), as the bits
 * of the bf16 in each lane's low half; AVX-512F only. (fl_store_bf16x16
 * below is one instruction of AVX512-BF16, which flushes subnormals.) */
static inline __m512i fl_bf16_bits16(__m512 x) {
    __m512i b = _mm512_castps_si512(x), top = _mm512_srli_epi32(b, 16);
    __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, top, _mm512_set1_epi32(0x40));
}

static inline void fl_store_bf16x16_exact(uint16_t *p, __m512 x) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(fl_bf16_bits16(x)));
}

/* x through bf16 and back: the value a bf16 tensor would hold. */
static inline __m512 fl_round_bf16x16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(fl_bf16_bits16(x), 16));
}

static inline void fl_store_bf16x16(uint16_t *p, __m512 x) {
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(x));
}

#endif /* FL_CPU_AVX512_H */
