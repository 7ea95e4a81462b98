/*
 * gemm_operand.h: how a GEMM library (OpenBLAS on the CPU, cuBLASLt on the
 * GPU) reads one operand of the batched matrix product behind matmul and
 * linear, shared by core/cpu/cpu_matmul.c and core/cuda/cuda_matmul.cu so
 * both backends read the same views in place and fold the same batches.
 */
#ifndef FL_GEMM_OPERAND_H
#define FL_GEMM_OPERAND_H

#include "error.h"

/* One operand as the library reads it. */
typedef struct fl_gemm_operand {
    const char *base;              /* element [0, ..., 0], in the compute dtype */
    bool trans;                    /* stored as the transpose of a row-major matrix */
    int64_t ld;                    /* row stride of the matrix as stored */
    int64_t bstride[FL_MAX_DIMS];  /* batch strides in elements, 0 where broadcast */
    fl_tensor *owned;              /* converted or compacted copy, or NULL */
} fl_gemm_operand;

/* Can the library read an r x c matrix with strides (sr, sc) without a
 * copy? Either row-major (unit column stride, ld = sr) or as the transpose
 * of a row-major c x r matrix (unit row stride, ld = sc). A size-1 axis has
 * no meaningful stride, so a strided row vector is read as a column of a
 * transpose. */
FL_PLUGIN_API bool fl_gemm_layout(int64_t r, int64_t c, int64_t sr, int64_t sc, bool *trans, int64_t *ld);

/* When B is the same matrix for the whole batch and A's batch rows are
 * evenly spaced (a dense [..., m, k] input times a weight), the batch is
 * one GEMM of *rows (batch * m) rows with leading dimension *lda: far
 * faster than many small ones. */
FL_PLUGIN_API bool fl_gemm_fold_rows(const fl_gemm_operand *A, const fl_gemm_operand *B, const fl_tensor *out,
                       int64_t k, int64_t *rows, int64_t *lda);

#endif /* FL_GEMM_OPERAND_H */
