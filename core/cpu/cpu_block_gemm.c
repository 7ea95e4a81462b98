/*
 * cpu_block_gemm.c: the f32 products of attention's blocks
 * (cpu_attention_gen.h) on AVX-512 or AVX2 FMA, one thread each: one
 * kernel written over the vector width (cpu_block_gemm_gen.h), built
 * twice.
 *
 * [Note: attention's f32 block products]
 * Attention multiplies a 64-row block of queries against one head's keys:
 * products of 64 x Tk x 64 and the like, a few hundred microseconds
 * each, run one per thread inside the kernel's parallel region. A BLAS
 * call there is single-threaded and its set-up (packing both operands,
 * picking kernels) is paid per block; on the Zen 5 machines, whose
 * OPENBLAS_CORETYPE=Haswell gives OpenBLAS 256-bit kernels, the small
 * Llama's f32 attention ran at 140-150 GFLOP/s (a sixth of the step
 * above its FLOPs at the GEMM rate), and oneDNN's matmul primitive costs
 * more to look up than such a product takes. So where the CPU has
 * AVX-512 these products run here: 6 rows by 64 columns of sums held in
 * registers over the whole sum, A's elements broadcast, B's rows read as
 * stored (a transposed B is first packed into rows by 16 x 16 register
 * transposes). Sums are f32 in k order; results agree with BLAS's to f32
 * rounding (tests/lua/fused_spec.lua's attention references, and
 * backend_ops_spec against the other backends).
 * At the avx2 level (AVX2 + FMA, e.g. AMD Zen 3) the same kernel runs 8
 * lanes wide: 6 rows by 16 columns, 12 of the 16 ymm registers holding
 * sums (the shape of BLIS's Haswell kernel), a transposed B packed by
 * 8 x 8 transposes. There single-threaded OpenBLAS calls ran the small
 * Llama's f32 attention at 40-60% of the sgemm rate. Below avx2, and for
 * f64, BLAS runs them.
 */
#include "cpu_rows_avx512.h"

#if FL_ROWS_AVX512_BUILD

/* Outside both target regions: included first inside one, the intrinsics
 * would take that region's target and refuse to inline into the other. */
#include <immintrin.h>

/* ---- AVX-512: 16 lanes, slabs of 4 vectors (64 columns) ---- */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#include "cpu_avx512.h"
#define W 16
#define NV 4
#define VEC __m512
#define VECI __m512i
#define MASK __mmask16
#define MASK_OF(left) fl_lanes_below(0, left)
#define ZERO() _mm512_setzero_ps()
#define SET1(x) _mm512_set1_ps(x)
#define LOAD(p) _mm512_loadu_ps(p)
#define LOADM(m, p) _mm512_maskz_loadu_ps(m, p)
#define STORE(p, x) _mm512_storeu_ps(p, x)
#define STOREM(p, m, x) _mm512_mask_storeu_ps(p, m, x)
#define FMADD(a, b, c) _mm512_fmadd_ps(a, b, c)
#define MUL(a, b) _mm512_mul_ps(a, b)
#define STOREI(p, x) _mm512_storeu_si512(p, x)
#define TRANSPOSE_LOAD(r, x, ld)                                                                   \
    do {                                                                                           \
        for (int i_ = 0; i_ < 16; i_++) r[i_] = _mm512_loadu_si512((x) + i_ * (ld));               \
        fl_transpose16(r);                                                                         \
    } while (0)
#define FN(name) name##_avx512
#include "cpu_block_gemm_gen.h"
#pragma GCC pop_options

/* ---- AVX2: 8 lanes, slabs of 2 vectors (16 columns) ---- */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "cpu_avx2.h"
#define W 8
#define NV 2
#define VEC __m256
#define VECI __m256
#define MASK __m256i
#define MASK_OF(left) fl_lanes_below8(left)
#define ZERO() _mm256_setzero_ps()
#define SET1(x) _mm256_set1_ps(x)
#define LOAD(p) _mm256_loadu_ps(p)
#define LOADM(m, p) _mm256_maskload_ps(p, m)
#define STORE(p, x) _mm256_storeu_ps(p, x)
#define STOREM(p, m, x) _mm256_maskstore_ps(p, m, x)
#define FMADD(a, b, c) _mm256_fmadd_ps(a, b, c)
#define MUL(a, b) _mm256_mul_ps(a, b)
#define STOREI(p, x) _mm256_storeu_ps(p, x)
#define TRANSPOSE_LOAD(r, x, ld) fl_load_transposed8(r, x, ld)
#define FN(name) name##_avx2
#include "cpu_block_gemm_gen.h"
#pragma GCC pop_options

bool fl_cpu_block_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc, float *pack) {
    fl_cpu_isa isa = fl_cpu_isa_level();
    if (isa < FL_CPU_ISA_AVX2) return false;
    if (m == 0 || n == 0) return true;
    if (isa >= FL_CPU_ISA_AVX512)
        block_sgemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pack);
    else
        block_sgemm_avx2(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pack);
    return true;
}

#else /* not x86-64 with GCC: BLAS runs every block */

bool fl_cpu_block_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc, float *pack) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
    (void)b, (void)ldb, (void)beta, (void)c, (void)ldc, (void)pack;
    return false;
}

#endif
