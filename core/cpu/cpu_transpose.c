/*
 * cpu_transpose.c: copies of transposed matrices into dense rows
 * (x:t():contiguous(), copy_ from a transposed view), the one strided copy
 * that element-by-element gathers do badly: every element a cache line of
 * its own. cpu_backend.c's copy hands it views whose last two dims are
 * swapped. Measured on this project's 2-core machine, bf16: 1024 x 512
 * 0.35 -> 0.12 ms, 1024 x 32000 24 -> 11-12 ms (a plain copy of it takes
 * 2.8: reads of source rows 64 KB apart wait on memory, which prefetches
 * ahead of the block only partly hide).
 *
 * The matrix goes in 16 x 16 blocks: 16 source rows loaded, the block
 * transposed in registers (2-byte elements: AVX2 interleaves of 16, 32
 * and 64 bits and a lane swap, where the CPU has AVX2; otherwise, and for
 * 4- and 8-byte elements, element by element within the block, which
 * keeps both sides in cache), 16 destination rows stored. On the Zen 5
 * machine, 3072 x 768: bf16 0.22-0.26 ms, f32 0.8, f64 1.9.
 */
#include "cpu_iter.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* dst rows r (16 of them, ldd apart) = src column r: src rows c (16,
 * lds apart) hold block column c. 16-bit elements. */
__attribute__((target("avx2"))) static void block16_avx2(uint16_t *dst, int64_t ldd,
                                                         const uint16_t *src, int64_t lds) {
    __m256i a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = _mm256_loadu_si256((const __m256i *)(src + i * lds));
    /* Interleaves of 16, 32 and 64 bits work within 128-bit lanes: after
     * them b[j] holds column j (low lane) and column j + 8 (high lane) of
     * rows 0-7, b[8 + j] the same of rows 8-15; the lane swap pairs them. */
    for (int i = 0; i < 8; i++) {
        b[2 * i] = _mm256_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        b[2 * i + 1] = _mm256_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    for (int q = 0; q < 4; q++) { /* rows 4q ... 4q + 3 */
        __m256i *p = b + 4 * q;
        a[4 * q] = _mm256_unpacklo_epi32(p[0], p[2]);
        a[4 * q + 1] = _mm256_unpackhi_epi32(p[0], p[2]);
        a[4 * q + 2] = _mm256_unpacklo_epi32(p[1], p[3]);
        a[4 * q + 3] = _mm256_unpackhi_epi32(p[1], p[3]);
    }
    for (int h = 0; h < 2; h++) /* rows 8h ... 8h + 7 */
        for (int j = 0; j < 4; j++) {
            b[8 * h + 2 * j] = _mm256_unpacklo_epi64(a[8 * h + j], a[8 * h + 4 + j]);
            b[8 * h + 2 * j + 1] = _mm256_unpackhi_epi64(a[8 * h + j], a[8 * h + 4 + j]);
        }
    for (int j = 0; j < 8; j++) {
        _mm256_storeu_si256((__m256i *)(dst + j * ldd),
                            _mm256_permute2x128_si256(b[j], b[8 + j], 0x20));
        _mm256_storeu_si256((__m256i *)(dst + (j + 8) * ldd),
                            _mm256_permute2x128_si256(b[j], b[8 + j], 0x31));
    }
}
#define HAVE_BLOCK16_AVX2 1
#endif

/* The same for any element size, on a block of r x c (edges), one
 * element at a time. Typed for the common sizes: a memcpy of a size only
 * known at run time is a call per element (an f32 3072 x 768 transpose
 * took 2.5 ms with it). */
#define BLOCK_TYPED(T)                                                                             \
    do {                                                                                           \
        T *d = (T *)(void *)dst;                                                                   \
        const T *s = (const T *)(const void *)src;                                                 \
        for (int64_t i = 0; i < r; i++)                                                            \
            for (int64_t j = 0; j < c; j++) d[i * ldd + j] = s[j * lds + i];                       \
    } while (0)

static void block_scalar(char *dst, int64_t ldd, const char *src, int64_t lds, int64_t r, int64_t c,
                         size_t es) {
    switch (es) {
    case 2: BLOCK_TYPED(uint16_t); return;
    case 4: BLOCK_TYPED(uint32_t); return;
    case 8: BLOCK_TYPED(uint64_t); return;
    default: break;
    }
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++)
            memcpy(dst + (i * ldd + j) * (int64_t)es, src + (j * lds + i) * (int64_t)es, es);
}

void fl_cpu_transpose(void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                      int64_t cols, size_t es) {
    enum { B = 16 };
#ifdef HAVE_BLOCK16_AVX2
    bool avx2 = es == 2 && fl_cpu_isa_level() >= FL_CPU_ISA_AVX2;
#else
    bool avx2 = false;
#endif
    /* A band is 64 destination rows: each source row gives it whole cache
     * lines (64 2-byte elements), read once. */
    enum { BAND = 64 };
    int64_t bands = (rows + BAND - 1) / BAND;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 18))
    for (int64_t band = 0; band < bands; band++) {
        int64_t end = band * BAND + BAND < rows ? band * BAND + BAND : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += B) {
            int64_t c = cols - c0 < B ? cols - c0 : B;
            /* Source rows are far apart (no hardware prefetch follows
             * them): ask for the band's lines of the rows two steps on. */
            if (c0 + 3 * B <= cols)
                for (int64_t i = 2 * B; i < 3 * B; i++) {
                    const char *p =
                        (const char *)src + ((c0 + i) * lds + band * BAND) * (int64_t)es;
                    __builtin_prefetch(p);
                    __builtin_prefetch(p + 64);
                }
            for (int64_t r0 = band * BAND; r0 < end; r0 += B) {
                int64_t r = end - r0 < B ? end - r0 : B;
                char *d = (char *)dst + (r0 * ldd + c0) * (int64_t)es;
                const char *s = (const char *)src + (c0 * lds + r0) * (int64_t)es;
#ifdef HAVE_BLOCK16_AVX2
                if (avx2 && r == B && c == B) {
                    block16_avx2((uint16_t *)d, ldd, (const uint16_t *)s, lds);
                    continue;
                }
#endif
                block_scalar(d, ldd, s, lds, r, c, es);
            }
        }
    }
}
