/*
 * gemm_operand.c: the in-place layout test and batch folding of GEMM
 * operands that the CPU and CUDA matrix products share (gemm_operand.h).
 */
#include "gemm_operand.h"

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

bool fl_gemm_layout(int64_t r, int64_t c, int64_t sr, int64_t sc, bool *trans, int64_t *ld) {
    if ((sc == 1 || c <= 1) && (r <= 1 || sr >= max1(c))) {
        *trans = false;
        *ld = r <= 1 ? max1(c) : sr;
    } else if ((sr == 1 || r <= 1) && (c <= 1 || sc >= max1(r))) {
        *trans = true;
        *ld = c <= 1 ? max1(r) : sc;
    } else {
        return false;
    }
    return *ld <= INT32_MAX;
}

bool fl_gemm_fold_rows(const fl_gemm_operand *A, const fl_gemm_operand *B, const fl_tensor *out,
                       int64_t k, int64_t *rows, int64_t *lda) {
    int nb = out->ndim - 2;
    if (nb == 0 || A->trans) return false;
    for (int i = 0; i < nb; i++)
        if (B->bstride[i] != 0 && out->shape[i] != 1) return false;
    int64_t inner = -1, expect = 0, total = 1;
    for (int i = nb; i >= 0; i--) {
        int64_t size = out->shape[i], stride = i == nb ? A->ld : A->bstride[i];
        if (size == 1) continue;
        if (inner < 0) inner = stride;
        else if (stride != expect) return false;
        expect = stride * size;
        total *= size;
    }
    *rows = total;
    *lda = inner < 0 ? max1(k) : inner;
    return total <= INT32_MAX && *lda >= max1(k) && *lda <= INT32_MAX;
}
