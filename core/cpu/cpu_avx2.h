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
            t[4 * h + i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(x + i * ld + 4 * h)),
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

#endif /* FL_CPU_AVX2_H */
