/*
 * cpu_matmul.c: the CPU matrix product behind matmul, linear and their
 * backward (batched, broadcast, with an optional bias), the row sums of the
 * bias gradient, and the CPU kernel table of the linear family.
 *
 * Every product is one GEMM call per matrix (f32: fl_cpu_sgemm or
 * oneDNN, f64: dgemm, large bf16 with bf16 dot products: oneDNN). Operands
 * are read in place whenever one axis of the matrix has unit stride, the
 * other axis then being the library's leading dimension (with the
 * transposition flag for a transposed view); only other strides are
 * copied. Large products that oneDNN takes ([Note: GEMM libraries],
 * cpu_gemm.c) read their operands in their own dtype (bf16 or f32) and
 * write out directly, the bias added in f32 before oneDNN's single
 * rounding. The rest of the 16-bit products (f16, bf16 without bf16 dot
 * products, small ones, oneDNN absent or switched off) are converted to
 * f32 once per call (Debian's OpenBLAS has no bf16 GEMM), take the route
 * an f32 product of their layout takes, accumulate into an f32 buffer and
 * are rounded once to the output dtype ([Note: the bf16 routes]). The
 * choice is made from dtypes, shapes and strides before anything is
 * copied, and matmul_scratch reports what each way stages, for the
 * planner's meta model ([Note: virtual storage], core/ops/matmul.c).
 */
#include "cpu_iter.h"
#include "cpu_linear.h"
#include "gemm_operand.h"
#include "shape.h"
#include "cpu_blas.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

/* Below this many elements, memory-bound loops stay on one thread. */
enum { PARALLEL_MIN = 1 << 16 };

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

void fl_cpu_gemm_ct(fl_dtype ct, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                    int64_t ldc) {
    if (ct == FL_F32) {
        fl_cpu_sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, (float)beta, c, ldc);
        return;
    }
    FL_ASSERT(ct == FL_F64);
    FL_ASSERT(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && lda <= INT32_MAX &&
              ldb <= INT32_MAX && ldc <= INT32_MAX);
    if (m == 0 || n == 0) return;
    /* f64 is for gradient checks and reference runs, so its one BLAS call
     * lives here rather than in the shared cpu_gemm.c. */
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* ---- operands ---------------------------------------------------------------- */

/* How an operand reaches the library: read in place; its whole memory span
 * converted to the compute dtype, strides kept; or its distinct elements
 * (broadcast batch dims collapsed, never expanded) compacted row-major. */
typedef enum { IN_PLACE, CONVERT_SPAN, COMPACT } operand_way;

/* The way t (a batch of matrices, stride 0 on broadcast batch dims) is
 * made readable in dtype ct, with the layout the library then sees in op
 * (trans, ld, bstride; not base or owned) and the elements of the copy in
 * *elems. From shapes, strides and dtypes only: the meta model asks too. */
static operand_way operand_plan(const fl_tensor *t, fl_dtype ct, fl_gemm_operand *op,
                                int64_t *elems, fl_tensor *distinct) {
    int nd = t->ndim, nb = nd - 2;
    int64_t r = t->shape[nd - 2], c = t->shape[nd - 1];
    memset(op, 0, sizeof *op);
    bool in_place = fl_gemm_layout(r, c, t->stride[nd - 2], t->stride[nd - 1], &op->trans, &op->ld);
    fl_tensor d = *t; /* the distinct elements */
    d.numel = 1;
    for (int i = 0; i < nd; i++) {
        if (i < nb && t->stride[i] == 0) d.shape[i] = 1;
        d.numel *= d.shape[i];
    }
    if (distinct) *distinct = d;
    for (int i = 0; i < nb; i++) op->bstride[i] = t->stride[i];
    *elems = 0;
    if (in_place && t->dtype == ct) return IN_PLACE;
    if (in_place) {
        /* Convert the whole memory span the view covers, keeping its
         * strides, when it is not much larger than the elements themselves
         * (dense or transposed operands): one vectorised pass, no gather. */
        int64_t span = 1;
        for (int i = 0; i < nd; i++) span += (d.shape[i] - 1) * d.stride[i];
        if (span <= 2 * d.numel + 4096) {
            *elems = span;
            return CONVERT_SPAN;
        }
    }
    int64_t cstride[FL_MAX_DIMS];
    fl_contiguous_strides(nd, d.shape, cstride);
    op->trans = false;
    op->ld = max1(c);
    for (int i = 0; i < nb; i++) op->bstride[i] = t->stride[i] == 0 ? 0 : cstride[i];
    *elems = d.numel;
    return COMPACT;
}

/* Make t readable by the library in dtype ct as operand_plan says: in
 * place, or a converted or compacted copy (op->owned). */
static int prepare(const fl_tensor *t, fl_dtype ct, fl_gemm_operand *op) {
    int64_t elems;
    fl_tensor d;
    operand_way way = operand_plan(t, ct, op, &elems, &d);
    if (way == IN_PLACE) {
        op->base = t->data;
        return FL_OK;
    }
    if (way == CONVERT_SPAN) {
        op->owned = fl_empty(1, &elems, ct, t->device);
        if (!op->owned) return fl_last_status();
        int rc = fl_convert(op->owned->data, ct, t->data, t->dtype, elems);
        if (rc != FL_OK) return rc;
        op->base = op->owned->data;
        return FL_OK;
    }
    op->owned = fl_empty(t->ndim, d.shape, ct, t->device);
    if (!op->owned) return fl_last_status();
    int rc = fl_cpu_backend.copy(op->owned, &d);
    if (rc != FL_OK) return rc;
    op->base = op->owned->data;
    return FL_OK;
}

/* How a product reaches its library ([Note: the bf16 routes]): */
typedef enum {
    ON_ONEDNN,   /* oneDNN reads the operands in their dtype (bf16 or f32), writes out directly */
    F32_ONEDNN,  /* 16-bit operands converted to f32, oneDNN's f32 kernels, an f32 result */
    F32_LIBRARY, /* operands converted to the compute dtype, fl_cpu_sgemm (MKL, OpenBLAS) or dgemm */
} route;

/* Whether oneDNN takes the product out = a @ b (+ bias) with a and b read
 * in dtype dt (bf16 or f32: their own, or f32 after conversion), written
 * in c_dtype; *p is the product it is asked about, with the layouts
 * prepare will give the operands in dt (compacted ones row-major), folded
 * into one product when fl_gemm_fold_rows folds them.
 * A whole batch shares one answer: its products share dtypes, sizes and
 * layout (only the base pointers differ). */
static bool onednn_plan(const fl_tensor *out, const fl_tensor *a, const fl_tensor *b, bool bias,
                        fl_dtype dt, fl_dtype c_dtype, fl_onednn_product *p) {
    memset(p, 0, sizeof *p);
    if ((dt != FL_BF16 && dt != FL_F32) || b->dtype != a->dtype || out->numel == 0 ||
        (c_dtype != FL_BF16 && c_dtype != FL_F32))
        return false;
    int nd = out->ndim;
    int64_t k = a->shape[nd - 1], elems, rows, lda;
    if (k == 0) return false;
    fl_gemm_operand A, B;
    operand_plan(a, dt, &A, &elems, NULL);
    operand_plan(b, dt, &B, &elems, NULL);
    p->dtype = dt, p->c_dtype = c_dtype, p->bias = bias;
    p->n = out->shape[nd - 1], p->k = k, p->ldb = B.ld, p->ldc = p->n, p->trans_b = B.trans;
    if (fl_gemm_fold_rows(&A, &B, out, k, &rows, &lda)) {
        p->m = rows, p->lda = lda, p->trans_a = false;
    } else {
        p->m = out->shape[nd - 2], p->lda = A.ld, p->trans_a = A.trans;
    }
    return fl_cpu_onednn_takes(p);
}

/* [Note: the bf16 routes]
 * A 16-bit product (bf16 or f16 operands) goes one of three ways, chosen
 * from dtypes, layouts, sizes, the level in force and the library chosen
 * (never a timing), before anything is copied:
 * - oneDNN reads bf16 as it is (ON_ONEDNN) where fl_cpu_onednn_takes says
 *   so: large bf16 products from the avx512_bf16 level, where the CPU has
 *   bf16 dot products (cpu_onednn.c's routed() has the measurements).
 * - Else its operands are converted to f32 and the product takes the f32
 *   route an f32 product of that layout and size takes: oneDNN's f32
 *   kernels where fl_cpu_onednn_takes would take that f32 product
 *   (F32_ONEDNN), else fl_cpu_sgemm (F32_LIBRARY: MKL or OpenBLAS). Either
 *   accumulates into an f32 result rounded once to the output dtype, so
 *   a bf16 product below avx512_bf16 costs its f32 product plus the
 *   conversions: 5-12% more than the f32 product alone at GPT-2's and
 *   the small Llama's linear shapes (oneDNN's f32 kernels at the avx512
 *   level, one thread; before, these products ran on fl_cpu_sgemm, at
 *   OpenBLAS's Haswell rate on the Zen 5 machines, about half oneDNN's).
 * cpu_matmul_scratch counts what each way stages ([Note: virtual
 * storage], core/ops/matmul.c): ON_ONEDNN only the f32 bias, strided
 * operands' copies and a long sum's accumulator; the f32 ways the f32
 * result (16-bit outputs), the bias and the operands' f32 copies. */
static route route_of(const fl_tensor *out, const fl_tensor *a, const fl_tensor *b, bool bias,
                      fl_onednn_product *p) {
    if (onednn_plan(out, a, b, bias, a->dtype, out->dtype, p)) return ON_ONEDNN;
    bool half = a->dtype == FL_BF16 || a->dtype == FL_F16;
    if (half && out->dtype != FL_F64 && onednn_plan(out, a, b, bias, FL_F32, FL_F32, p))
        return F32_ONEDNN;
    return F32_LIBRARY;
}

/* Bytes cpu_matmul allocates for a while beyond out, as it would for these
 * views ([Note: the bf16 routes]): on oneDNN in the operands' dtype the
 * f32 bias, copies of strided operands and a long sum's f32 accumulator
 * (fl_cpu_onednn_scratch); else the f32 result of a 16-bit product, the
 * bias and the operands' f32 conversions. The planner's meta model counts
 * them ([Note: virtual storage], core/ops/matmul.c). */
static int64_t cpu_matmul_scratch(const fl_tensor *out, const fl_tensor *a, const fl_tensor *b,
                                  const fl_tensor *bias) {
    if (out->numel == 0) return 0;
    int nd = out->ndim;
    int64_t n = out->shape[nd - 1], k = a->shape[nd - 1];
    fl_dtype ct = out->dtype == FL_F64 ? FL_F64 : FL_F32;
    fl_onednn_product p;
    route r = route_of(out, a, b, bias != NULL, &p);
    fl_dtype ot = r == ON_ONEDNN ? p.dtype : ct;
    /* F32_ONEDNN's product writes f32: fl_cpu_onednn_scratch is 0 there */
    int64_t bytes = r != F32_LIBRARY ? fl_cpu_onednn_scratch(&p) : 0, ea = 0, eb = 0;
    if (r != ON_ONEDNN && out->dtype != ct) bytes += out->numel * (int64_t)fl_dtype_size(ct);
    if (bias) bytes += n * (int64_t)fl_dtype_size(ct);
    if (k > 0) {
        fl_gemm_operand A, B;
        operand_plan(a, ot, &A, &ea, NULL);
        operand_plan(b, ot, &B, &eb, NULL);
    }
    return bytes + (ea + eb) * (int64_t)fl_dtype_size(ot);
}

/* ---- the product ---------------------------------------------------------------- */

/* Element offsets into A and B of the i-th matrix of out's batch (batch
 * dims row-major; broadcast ones have stride 0). */
static void batch_offsets(const fl_tensor *out, const fl_gemm_operand *A, const fl_gemm_operand *B,
                          int64_t i, int64_t *oa, int64_t *ob) {
    int64_t rem = i;
    *oa = *ob = 0;
    for (int d = out->ndim - 3; d >= 0; d--) {
        int64_t idx = rem % out->shape[d];
        rem /= out->shape[d];
        *oa += idx * A->bstride[d];
        *ob += idx * B->bstride[d];
    }
}

/* The batch's products one after another on oneDNN, into c (out's shape
 * in p->c_dtype: out itself, or cpu_matmul's f32 result), the bias added
 * in f32 before oneDNN's one rounding. */
static int matmul_onednn(const fl_tensor *out, const fl_onednn_product *p,
                         const fl_gemm_operand *A, const fl_gemm_operand *B, const float *bias,
                         bool folded, char *c) {
    int nb = out->ndim - 2;
    int64_t m = out->shape[nb], n = out->shape[nb + 1];
    int64_t nbatch = folded ? 1 : out->numel / (m * n), os = fl_dtype_size(p->dtype);
    size_t cs = fl_dtype_size(p->c_dtype);
    /* A long sum in pieces wants an f32 accumulator ([Note: long sums in
     * pieces], cpu_onednn.c), one for the whole batch. */
    int64_t scratch_elems = fl_cpu_onednn_scratch(p) / (int64_t)sizeof(float);
    fl_tensor *scratch = scratch_elems ? fl_empty(1, &scratch_elems, FL_F32, out->device) : NULL;
    if (scratch_elems && !scratch) return fl_last_status();
    int rc = FL_OK;
    for (int64_t i = 0; i < nbatch && rc == FL_OK; i++) {
        int64_t oa, ob; /* folded: one product, offsets 0 */
        batch_offsets(out, A, B, i, &oa, &ob);
        rc = fl_cpu_onednn_gemm(p, A->base + oa * os, B->base + ob * os, bias,
                                c + i * m * n * (int64_t)cs, scratch ? scratch->data : NULL);
    }
    fl_tensor_release(scratch);
    return rc;
}

/* [Note: no library call inside an idle OpenMP region]
 * `#pragma omp parallel ... if (false)` still opens a region, of one
 * thread. A threaded library called inside it (OpenBLAS's OpenMP build,
 * oneDNN, MKL) then starts a nested team, and libgomp keeps no pool for
 * nested teams: it creates and joins fresh threads for every call. In a
 * GPT-2 step at the avx2 level that was ~100 thread creations a step, one
 * per large gradient product. Code that may call a library serially
 * branches around the region instead of passing `if (...)` to it. */

/* Product i of a batch: c[i] = beta c[i] + A[i] B[i] (sums of k), in ct. */
static void gemm_batch_item(const fl_tensor *out, const fl_gemm_operand *A,
                            const fl_gemm_operand *B, int64_t k, fl_dtype ct, int64_t i,
                            double beta, char *c) {
    int nb = out->ndim - 2;
    int64_t m = out->shape[nb], n = out->shape[nb + 1];
    size_t cs = fl_dtype_size(ct);
    int64_t oa, ob;
    batch_offsets(out, A, B, i, &oa, &ob);
    fl_cpu_gemm_ct(ct, A->trans, B->trans, m, n, k, A->base + oa * (int64_t)cs, A->ld,
                   B->base + ob * (int64_t)cs, B->ld, beta, c + i * m * n * (int64_t)cs, n);
}

static int cpu_matmul(fl_tensor *out, const fl_tensor *a, const fl_tensor *b,
                      const fl_tensor *bias) {
    int nd = out->ndim, nb = nd - 2;
    int64_t m = out->shape[nb], n = out->shape[nb + 1], k = a->shape[nd - 1];
    if (out->numel == 0) return FL_OK;
    fl_dtype ct = out->dtype == FL_F64 ? FL_F64 : FL_F32;
    size_t cs = fl_dtype_size(ct);
    int64_t nbatch = out->numel / (m * n), nrows = nbatch * m;
    fl_gemm_operand A = {0}, B = {0};
    fl_tensor *cbuf = NULL, *bias_ct = NULL;
    char *c = out->data;
    int rc = FL_OK;
    /* Decided before anything is copied ([Note: the bf16 routes]): on
     * oneDNN in their dtype the operands are read as they are and the
     * result written straight into out; else through f32. */
    fl_onednn_product dp;
    route r = route_of(out, a, b, bias != NULL, &dp);
    if (bias) {
        bias_ct = fl_empty(1, &n, ct, out->device);
        rc = bias_ct ? fl_cpu_backend.copy(bias_ct, bias) : (int)fl_last_status();
        if (rc != FL_OK) goto done;
    }
    if (r != ON_ONEDNN && out->dtype != ct) {
        cbuf = fl_empty(1, &out->numel, ct, out->device);
        if (!cbuf) {
            rc = fl_last_status();
            goto done;
        }
        c = cbuf->data;
    }
    if (r != F32_LIBRARY) {
        if ((rc = prepare(a, dp.dtype, &A)) != FL_OK || (rc = prepare(b, dp.dtype, &B)) != FL_OK)
            goto done;
        int64_t rows, lda;
        bool folded = fl_gemm_fold_rows(&A, &B, out, k, &rows, &lda);
        rc = matmul_onednn(out, &dp, &A, &B, bias_ct ? bias_ct->data : NULL, folded, c);
        if (rc == FL_OK && cbuf) rc = fl_convert(out->data, out->dtype, cbuf->data, ct, out->numel);
        goto done;
    }
    /* The bias goes into C first and the GEMM adds to it (beta = 1). */
    double beta = 0;
    if (bias) {
        const char *row = bias_ct->data;
        /* Serial on purpose: libgomp's idle workers spin for a while after
         * a parallel region, and OpenBLAS's own threads, starting right
         * after, would share the cores with them (measured: a parallel fill
         * made the whole call 30% slower on 2 cores). */
        for (int64_t i = 0; i < nrows; i++) memcpy(c + i * n * (int64_t)cs, row, (size_t)n * cs);
        beta = 1;
    } else if (k == 0) {
        memset(c, 0, (size_t)out->numel * cs);
    }
    if (k > 0) {
        if ((rc = prepare(a, ct, &A)) != FL_OK || (rc = prepare(b, ct, &B)) != FL_OK) goto done;
        int64_t rows, lda;
        if (fl_gemm_fold_rows(&A, &B, out, k, &rows, &lda)) {
            fl_cpu_gemm_ct(ct, false, B.trans, rows, n, k, A.base, lda, B.base, B.ld, beta, c, n);
        } else {
            /* Small products (attention heads) go one per thread; large
             * ones one after another, each threaded by its library, and
             * outside any OpenMP region: [Note: no library call inside an
             * idle OpenMP region]. */
            if (nbatch > 1 && m * n * k <= FL_CPU_SMALL_GEMM) {
#pragma omp parallel for schedule(static)
                for (int64_t i = 0; i < nbatch; i++)
                    gemm_batch_item(out, &A, &B, k, ct, i, beta, c);
            } else {
                for (int64_t i = 0; i < nbatch; i++) gemm_batch_item(out, &A, &B, k, ct, i, beta, c);
            }
        }
    }
    if (cbuf) rc = fl_convert(out->data, out->dtype, cbuf->data, ct, out->numel);
done:
    fl_tensor_release(A.owned);
    fl_tensor_release(B.owned);
    fl_tensor_release(cbuf);
    fl_tensor_release(bias_ct);
    return rc;
}

/* out (f32/f64) += a @ b, 2-d: the operands in out's dtype (converted
 * when 16-bit), one GEMM with beta = 1 onto out. Always the BLAS route: a
 * oneDNN product writes its result rather than adding to it. */
static int cpu_matmul_acc(fl_tensor *out, const fl_tensor *a, const fl_tensor *b) {
    FL_ASSERT(out->ndim == 2 && a->ndim == 2 && b->ndim == 2 && fl_tensor_is_contiguous(out));
    FL_ASSERT(out->dtype == FL_F32 || out->dtype == FL_F64);
    int64_t m = out->shape[0], n = out->shape[1], k = a->shape[1];
    if (out->numel == 0 || k == 0) return FL_OK;
    fl_gemm_operand A = {0}, B = {0};
    int rc = prepare(a, out->dtype, &A);
    if (rc == FL_OK) rc = prepare(b, out->dtype, &B);
    if (rc == FL_OK)
        fl_cpu_gemm_ct(out->dtype, A.trans, B.trans, m, n, k, A.base, A.ld, B.base, B.ld, 1.0,
                       out->data, n);
    fl_tensor_release(A.owned);
    fl_tensor_release(B.owned);
    return rc;
}

/* ---- row sums (bias gradients) ------------------------------------------------- */

/* Column sums of in [rows, n] accumulated in double. Threads own blocks of
 * columns; with fewer blocks than threads the rows are split too, each part
 * summed into its own row of partial sums, added up at the end in a fixed
 * order (so the result does not depend on scheduling). */
static int cpu_sum_rows(fl_tensor *out, const fl_tensor *in) {
    enum { BLOCK = FL_CPU_SCRATCH };
    int64_t rows = in->shape[0], n = in->shape[1], sr = in->stride[0], sc = in->stride[1];
    if (n == 0) return FL_OK;
    size_t es = fl_dtype_size(in->dtype);
    int64_t nblocks = (n + BLOCK - 1) / BLOCK;
    /* Threads only for very large sums: this runs between GEMMs, and after
     * a parallel region libgomp's workers spin for about a millisecond,
     * slowing the next GEMM's OpenBLAS threads by as much as they save. */
    bool big = rows * n >= (1 << 22);
    int64_t threads = omp_get_max_threads();
    int64_t parts = big && nblocks < threads ? threads : 1;
    if (parts > rows) parts = max1(rows);
    double *partial = malloc((size_t)(parts * n) * sizeof *partial);
    if (!partial) return fl_fail(FL_ERR_OOM, "linear backward: out of CPU memory for row sums");
    const char *base = in->data;
#pragma omp parallel for collapse(2) schedule(static) if (big)
    for (int64_t p = 0; p < parts; p++) {
        for (int64_t blk = 0; blk < nblocks; blk++) {
            int64_t r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
            int64_t c0 = blk * BLOCK, len = n - c0 < BLOCK ? n - c0 : BLOCK;
            double acc[BLOCK], tmp[BLOCK];
            float tmpf[BLOCK];
            for (int64_t j = 0; j < len; j++) acc[j] = 0;
            for (int64_t r = r0; r < r1; r++) {
                const char *src = base + (r * sr + c0 * sc) * (int64_t)es;
                if (sc == 1 && in->dtype == FL_F32) { /* the common case, without a call */
                    const float *f = (const float *)src;
                    for (int64_t j = 0; j < len; j++) acc[j] += f[j];
                } else if (es < 4) {
                    /* bf16 and f16 through f32 (exact, and a vector
                     * conversion: through f64 they took a call per
                     * element, most of a small bf16 linear's backward) */
                    fl_cpu_load(tmpf, FL_F32, src, in->dtype, sc, len);
                    for (int64_t j = 0; j < len; j++) acc[j] += tmpf[j];
                } else {
                    fl_cpu_load(tmp, FL_F64, src, in->dtype, sc, len);
                    for (int64_t j = 0; j < len; j++) acc[j] += tmp[j];
                }
            }
            memcpy(partial + p * n + c0, acc, (size_t)len * sizeof *acc);
        }
    }
    for (int64_t p = 1; p < parts; p++)
        for (int64_t j = 0; j < n; j++) partial[j] += partial[p * n + j];
    int rc = fl_convert(out->data, out->dtype, partial, FL_F64, n);
    free(partial);
    return rc;
}

const fl_linear_kernels fl_cpu_linear_kernels = {
    .matmul = cpu_matmul,
    .matmul_scratch = cpu_matmul_scratch,
    .matmul_acc = cpu_matmul_acc,
    .sum_rows = cpu_sum_rows,
    .embedding = fl_cpu_embedding,
    .embedding_backward = fl_cpu_embedding_backward,
    .conv2d = fl_cpu_conv2d,
    .conv2d_backward = fl_cpu_conv2d_backward,
    .max_pool2d = fl_cpu_max_pool2d,
    .max_pool2d_backward = fl_cpu_max_pool2d_backward,
};
