/*
 * cpu_block_gemm.c: the f32 products of attention's blocks
 * (cpu_attention_gen.h) on AVX-512 FMA, one thread each.
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
 * backend_ops_spec against the other backends). Elsewhere, and for f64,
 * BLAS runs them as before.
 */
#include "cpu_rows_avx512.h"

#if FL_ROWS_AVX512_BUILD

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

#include "cpu_avx512.h"

/* R rows by V vectors of 16 columns of C = alpha A B + beta C, the last
 * vector masked by `last` when `tail`. A(r, k) is A[r * ar + k * ak]; B's
 * row k (the columns of this block) starts at B + k * ldb. R V sums stay
 * in registers over all of K. */
static inline __attribute__((always_inline)) void
block(int R, int V, bool tail, __mmask16 last, int64_t K, const float *A, int64_t ar, int64_t ak,
      const float *B, int64_t ldb, float *C, int64_t ldc, float alpha, float beta) {
    __m512 c[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) c[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            bv[v] = tail && v == V - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v)
                                       : _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m512 a = _mm512_set1_ps(A[r * ar + k * ak]);
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) c[r][v] = _mm512_fmadd_ps(a, bv[v], c[r][v]);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) {
            float *p = C + r * ldc + 16 * v;
            bool masked = tail && v == V - 1;
            __m512 x = _mm512_mul_ps(va, c[r][v]);
            if (beta != 0)
                x = _mm512_fmadd_ps(
                    vb, masked ? _mm512_maskz_loadu_ps(last, p) : _mm512_loadu_ps(p), x);
            if (masked)
                _mm512_mask_storeu_ps(p, last, x);
            else
                _mm512_storeu_ps(p, x);
        }
}

/* R rows of a slab of at most 64 columns: four vectors, or what is left
 * (the last vector masked). */
static inline __attribute__((always_inline)) void rows(int R, int64_t N, int64_t K, const float *A,
                                                       int64_t ar, int64_t ak, const float *B,
                                                       int64_t ldb, float *C, int64_t ldc,
                                                       float alpha, float beta) {
    __mmask16 last = fl_lanes_below(0, N - (N - 1) / 16 * 16);
    switch ((N + 15) / 16) {
    case 4:
        if (last == 0xffff)
            block(R, 4, false, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta);
        else
            block(R, 4, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta);
        break;
    case 3: block(R, 3, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta); break;
    case 2: block(R, 2, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta); break;
    case 1: block(R, 1, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta); break;
    default: break;
    }
}

/* Rows [0, m) of one slab, 6 at a time then the rest. */
static void slab(int64_t m, int64_t N, int64_t K, const float *A, int64_t ar, int64_t ak,
                 const float *B, int64_t ldb, float *C, int64_t ldc, float alpha, float beta) {
    int64_t r = 0;
    for (; r + 6 <= m; r += 6)
        rows(6, N, K, A + r * ar, ar, ak, B, ldb, C + r * ldc, ldc, alpha, beta);
    const float *ap = A + r * ar;
    float *cp = C + r * ldc;
    switch (m - r) {
    case 5: rows(5, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 4: rows(4, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 3: rows(3, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 2: rows(2, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 1: rows(1, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    default: break;
    }
}

/* X [n, k] (row stride ld) transposed into dst [k, n] (dense): 16 x 16
 * blocks through registers, the edges element by element. */
static void pack_transposed(float *dst, const float *X, int64_t ld, int64_t n, int64_t k) {
    int64_t n16 = n / 16 * 16, k16 = k / 16 * 16;
    for (int64_t i0 = 0; i0 < n16; i0 += 16)
        for (int64_t j0 = 0; j0 < k16; j0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(X + (i0 + i) * ld + j0);
            fl_transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + (j0 + j) * n + i0, r[j]);
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i < n16 ? k16 : 0; j < k; j++) dst[j * n + i] = X[i * ld + j];
}

bool fl_cpu_block_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc, float *pack) {
    if (!fl_cpu_avx512()) return false;
    if (m == 0 || n == 0) return true;
    if (trans_b) { /* B [n, k] as stored: its rows become B's columns */
        pack_transposed(pack, b, ldb, n, k);
        b = pack, ldb = n;
    }
    int64_t ar = trans_a ? 1 : lda, ak = trans_a ? lda : 1;
    /* Slab by slab of 64 columns, so that the slab's rows of B (k x 64)
     * stay in L1 while every block of rows passes over them. */
    for (int64_t n0 = 0; n0 < n; n0 += 64)
        slab(m, n - n0 < 64 ? n - n0 : 64, k, a, ar, ak, b + n0, ldb, c + n0, ldc, alpha, beta);
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
