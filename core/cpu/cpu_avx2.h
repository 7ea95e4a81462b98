/*
 * cpu_avx2.h: 8-lane helpers for the kernels built for AVX2 + FMA (the
 * avx2 level of [Note: CPU ISA levels], cpu_isa.c): the counterparts of
 * cpu_avx512.h's 16-lane ones, for the same kernels written once over
 * the vector width (cpu_block_gemm.c, cpu_rows_avx512.c). Include only
 * from a file whose including functions are compiled for AVX2 and FMA
 * (a `#pragma GCC target` region) and run only at that level or above.
 */
#ifndef FL_CPU_AVX2_H
#define FL_CPU_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* All lanes below `left` (0 ... 8) set, as AVX2's masked loads and
 * stores take them (the top bit of each 32-bit lane). */
static inline __m256i fl_lanes_below8(int64_t left) {
    static const int32_t ones_then_zeros[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                0,  0,  0,  0,  0,  0,  0,  0};
    left = left < 0 ? 0 : left > 8 ? 8 : left;
    return _mm256_loadu_si256((const __m256i *)(ones_then_zeros + 8 - left));
}

/* The 8 x 8 block of floats at x (rows ld apart) loaded transposed: r[i]
 * holds column i. Rows i and i + 4 are loaded as the two 128-bit halves of
 * one register (the half insert reads memory), so only the in-lane 4 x 4
 * transposes need shuffles: 16 for the block instead of the 24 of a
 * transpose in registers; the block products' packing of a transposed B
 * (cpu_block_gemm.c) took a fifth of an x B^T product with those. Always
 * inlined: as a call its registers went through memory. */
static inline __attribute__((always_inline)) void fl_load_transposed8(__m256 r[8], const float *x,
                                                                      int64_t ld) {
    __m256 t[8];
    for (int i = 0; i < 4; i++)
        for (int h = 0; h < 2; h++) /* h: columns 4h ... 4h + 3 */
            t[4 * h + i] =
                _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(x + i * ld + 4 * h)),
                                     _mm_loadu_ps(x + (i + 4) * ld + 4 * h), 1);
    /* t[4h + i]: row i's columns 4h..4h+3 (low) and row i + 4's (high) */
    for (int h = 0; h < 2; h++) {
        __m256 *q = t + 4 * h;
        __m256 a = _mm256_unpacklo_ps(q[0], q[1]), b = _mm256_unpackhi_ps(q[0], q[1]);
        __m256 c = _mm256_unpacklo_ps(q[2], q[3]), d = _mm256_unpackhi_ps(q[2], q[3]);
        r[4 * h] = _mm256_shuffle_ps(a, c, 0x44);
        r[4 * h + 1] = _mm256_shuffle_ps(a, c, 0xee);
        r[4 * h + 2] = _mm256_shuffle_ps(b, d, 0x44);
        r[4 * h + 3] = _mm256_shuffle_ps(b, d, 0xee);
    }
}

/* e^x 8 lanes wide, fl_fast_expf's method and order of operations as GCC
 * compiles it with FMA (cpu_fused_math.h; fl_exp16 in cpu_avx512.h is
 * the same 16 wide): x >= 88 gives e^88, x below -87.34 (and -inf) gives
 * 0, nan stays nan. 2^n is built in the exponent bits as the scalar code
 * builds it (AVX2 has no scalef; for n in [-126, 127] both are exact). */
static inline __m256 fl_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365478515625f), shifter = _mm256_set1_ps(12582912.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));
    __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
    __m256 n = _mm256_sub_ps(t, shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(shifter)),
                         _mm256_set1_epi32(127)),
        23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* The sum and the max of 8 lanes: halves, then quarters, then pairs. */
static inline float fl_reduce_add8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float fl_reduce_max8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* 8 bf16 (raw bits) as f32. */
static inline __m256 fl_load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* x rounded to bf16 as fl_convert rounds (ties to even, subnormals kept,
 * a nan quieted with its top bits), as fl_bf16_bits16 does 16 wide: the
 * 8 bf16 in a 128-bit register. */
static inline __m128i fl_bf16_bits8(__m256 x) {
    __m256i b = _mm256_castps_si256(x), top = _mm256_srli_epi32(b, 16);
    __m256i odd = _mm256_and_si256(top, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
    /* every lane holds at most 0xffff: the unsigned saturating pack keeps it */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

static inline void fl_store_bf16x8_exact(uint16_t *p, __m256 x) {
    _mm_storeu_si128((__m128i *)p, fl_bf16_bits8(x));
}

#endif /* FL_CPU_AVX2_H */
