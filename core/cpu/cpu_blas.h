/*
 * cpu_blas.h: the CPU's GEMM libraries: the f32 entry over MKL or OpenBLAS
 * (cpu_gemm.c, cpu_mkl.c), the library choice, and oneDNN's products
 * (cpu_onednn.c).
 */
#ifndef FL_CPU_BLAS_H
#define FL_CPU_BLAS_H

#include "fsdp.h"

/* C = alpha * op(A) @ op(B) + beta * C in f32, row-major: op(A) is [m, k],
 * op(B) is [k, n], C is [m, n]; lda/ldb/ldc are row strides in elements
 * (of A and B as stored, before transposition). MKL or OpenBLAS
 * underneath ([Note: GEMM libraries], core/cpu/cpu_gemm.c). */
void fl_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc);
/* From this many multiply-adds (m * n * k) on, oneDNN and MKL take a
 * product; below, OpenBLAS does. */
enum { FL_CPU_LARGE_PRODUCT = 1 << 20 };
/* The GEMM libraries FSDP_CPU_GEMM / fl_cpu_gemm_use choose among, in the
 * order of their names there ("auto": each where installed). */
typedef enum fl_gemm_library {
    FL_GEMM_AUTO,
    FL_GEMM_OPENBLAS,
    FL_GEMM_ONEDNN,
    FL_GEMM_MKL
} fl_gemm_library;
/* Whether the choice lets `lib` run the products it takes. */
bool fl_cpu_gemm_allows(fl_gemm_library lib);
/* Whether oneDNN / MKL opened (once, at the first question): true with
 * *version, or false with *why (either may be NULL). */
bool fl_cpu_onednn_available(const char **version, const char **why);
bool fl_cpu_mkl_available(const char **version, const char **why);
/* Whether OpenBLAS runs kernels for narrower vectors than the CPU has (its
 * Haswell or Zen kernels on a CPU with AVX-512, as OPENBLAS_CORETYPE can
 * force), and the name of its kernels ([Note: GEMM libraries]). */
bool fl_cpu_openblas_narrow(const char **core);
/* Whether OpenBLAS runs one of its AVX-512 kernel sets (chosen when it
 * loaded: fl_cpu_isa_openblas_coretype caps it below the avx512 level). */
bool fl_cpu_openblas_wide(void);
/* Whether oneDNN opened and runs AVX-512 kernels (avx512_core or later). */
bool fl_cpu_onednn_wide(void);
/* fl_cpu_sgemm on MKL when it takes the product (B as stored, at least
 * FL_CPU_LARGE_PRODUCT multiply-adds, outside a parallel region, allowed
 * and installed): true when it ran it, false when the caller should. */
bool fl_cpu_mkl_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc);
/* One product for oneDNN: C [m, n] (row stride ldc, in c_dtype: f32 or
 * bf16) = op(A) @ op(B), plus bias [n] (f32) on every row when `bias`;
 * A and B in `dtype` (bf16, or f32 as x W^T), laid out as for
 * fl_cpu_sgemm. Accumulation is f32 and the bias joins it before the one
 * rounding to c_dtype. Zero unused fields: it is also a cache key. */
typedef struct fl_onednn_product {
    fl_dtype dtype, c_dtype;
    bool trans_a, trans_b, bias;
    bool accumulate; /* C += the product (cpu_onednn.c's pieces of a long sum) */
    int64_t m, n, k, lda, ldb, ldc;
} fl_onednn_product;
/* Whether oneDNN takes the product ([Note: GEMM libraries],
 * core/cpu/cpu_gemm.c). A pure function of *p and the library chosen:
 * the CPU matmul and its meta model ask it alike. */
bool fl_cpu_onednn_takes(const fl_onednn_product *p);
/* The f32 scratch bytes fl_cpu_onednn_gemm needs for p: an [m, n]
 * accumulator when it sums a long K in pieces into a bf16 C, else 0. */
int64_t fl_cpu_onednn_scratch(const fl_onednn_product *p);
/* Run on oneDNN a product that fl_cpu_onednn_takes accepted (bias NULL
 * unless p->bias; scratch f32 of fl_cpu_onednn_scratch(p) bytes, or NULL
 * when that is 0); FL_OK, or an error naming the product. */
int fl_cpu_onednn_gemm(const fl_onednn_product *p, const void *a, const void *b, const float *bias,
                       void *c, float *scratch);

#endif /* FL_CPU_BLAS_H */
