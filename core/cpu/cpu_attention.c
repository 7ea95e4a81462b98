/*
 * cpu_attention.c: the CPU kernels of scaled dot-product attention,
 * instantiated from cpu_attention_gen.h for f32 (fl_cpu_sgemm) and f64
 * (OpenBLAS dgemm, for gradient checks).
 *
 * Threading: the kernels run many small GEMMs (a 64-row block against the
 * keys of one head), too small for OpenBLAS to split well. They are spread
 * over OpenMP threads instead, with OpenBLAS held to one thread while they
 * run; letting each call fan out again oversubscribes the cores (measured
 * on this project's 2-core machines: 90 GFLOP/s against 50 for the same
 * 64x256x64 products). With fewer work items than threads, the loop runs
 * on one thread and OpenBLAS keeps its threads.
 */
/* The build's -O2 vectorises only loops without an epilogue and never
 * if-converts float selects (they could raise FP exceptions, which
 * nothing here reads): these loops are exp/max/sum over rows of arbitrary
 * length, so this file asks for both. */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")

#include "cpu_fused_math.h"
#include "cpu_blas.h"
#include "cpu_rows_avx512.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

/* Query rows per block: the score block is QBLOCK x Tk. */
enum { QBLOCK = 64 };

/* Hold OpenBLAS to one thread; returns the count to restore (-1: nothing
 * to restore). The empty product first makes fl_cpu_sgemm run its
 * one-time thread setup here rather than inside the parallel region,
 * where it would undo this. OpenBLAS's OpenMP build (the one the build
 * links where installed, premake5.lua) already runs serially inside a
 * parallel region, and its openblas_set_num_threads would set OpenMP's
 * own thread count: that region would get one thread. */
static int blas_serial_begin(void) {
    fl_cpu_sgemm(false, false, 0, 0, 0, 1.0f, NULL, 1, NULL, 1, 0.0f, NULL, 1);
    if (openblas_get_parallel() == 2) return -1;
    int n = openblas_get_num_threads();
    openblas_set_num_threads(1);
    return n;
}

static void blas_serial_end(int n) {
    if (n >= 0) openblas_set_num_threads(n);
}

/* The block products, with fl_cpu_sgemm's argument convention
 * (row-major, leading dims of A and B as stored) after `pack`, scratch of
 * k * n elements for a transposed B. f32: on AVX-512 where the CPU has it
 * ([Note: attention's f32 block products], cpu_block_gemm.c) when the
 * blocks are spread over threads (or there is one), else BLAS;
 * f64: OpenBLAS's dgemm. */
static void sgemm(float *pack, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                  float *c, int64_t ldc) {
    /* Outside any OpenMP region BLAS threads the product (see the top);
     * inside one, an idle one too, the block kernel keeps it on this
     * thread ([Note: no library call inside an idle OpenMP region],
     * cpu_matmul.c). */
    bool one_thread = omp_get_level() > 0 || omp_get_max_threads() == 1;
    if (!one_thread ||
        !fl_cpu_block_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pack))
        fl_cpu_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void dgemm(double *pack, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  double alpha, const double *a, int64_t lda, const double *b, int64_t ldb,
                  double beta, double *c, int64_t ldc) {
    (void)pack;
    FL_ASSERT(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && lda <= INT32_MAX &&
              ldb <= INT32_MAX && ldc <= INT32_MAX);
    if (m == 0 || n == 0) return;
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

#define R float
#if FL_ROWS_AVX512_BUILD /* (cpu_rows_avx512.h) */
#define FL_ROWS_F32
#endif
#define RT FL_F32
#define FN(name) name##_f32
#define EXP(x) fl_fast_expf(x)
#define GEMM sgemm
#include "cpu_attention_gen.h"
#undef FL_ROWS_F32
#undef R
#undef RT
#undef FN
#undef EXP
#undef GEMM

#define R double
#define RT FL_F64
#define FN(name) name##_f64
#define EXP(x) exp(x)
#define GEMM dgemm
#include "cpu_attention_gen.h"
#undef R
#undef RT
#undef FN
#undef EXP
#undef GEMM

int fl_cpu_attention(const fl_attention_args *a) {
    return a->q->dtype == FL_F64 ? attention_f64(a) : attention_f32(a);
}

int fl_cpu_attention_backward(const fl_attention_args *a) {
    return a->q->dtype == FL_F64 ? attention_backward_f64(a) : attention_backward_f32(a);
}
