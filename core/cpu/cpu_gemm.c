/*
 * cpu_gemm.c: the one place the CPU backend calls BLAS. Every matrix
 * product of every op (matmul, linear, attention, convolution) comes here,
 * so threading and the library choice are decided once.
 *
 * OpenBLAS keeps its own thread pool next to OpenMP's. Both get the same
 * thread count (OMP_NUM_THREADS, or OPENBLAS_NUM_THREADS if set); they
 * never run at the same time, since ops run one after another.
 */
#include "internal.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

static void set_threads(void) {
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(omp_get_max_threads());
}

void fl_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc) {
    pthread_once(&threads_once, set_threads);
    FL_ASSERT(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && lda <= INT32_MAX &&
              ldb <= INT32_MAX && ldc <= INT32_MAX);
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}
