/*
 * cuda_gemm.cu: one strided-batched matrix product on the GPU through the
 * vendor libraries: cuBLASLt for f32/bf16/f16 with f32 accumulation (bf16
 * and f16 on the tensor cores; f32 in full precision unless
 * FSDP_ALLOW_TF32=1 allows TF32), cublasDgemmStridedBatched for f64. One
 * handle of each per device, made on first use.
 *
 * Both libraries are column-major: the row-major C = A @ B is computed as
 * the column-major C^T = B^T A^T, which reads the same memory with the
 * operands swapped (the library's first operand is our B) and the
 * transposition flags of the stored matrices unchanged.
 */
#include "cuda_linear.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_DEVICES = 64 };

/* ---- handles ---------------------------------------------------------------- */

static pthread_mutex_t handles_mutex = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t lt_handles[MAX_DEVICES];
static cublasHandle_t blas_handles[MAX_DEVICES];

static int blas_fail(const char *op, const char *what, cublasStatus_t st) {
    return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s failed: %s (cuBLAS status %d)", op, what,
                   cublasGetStatusString(st), (int)st);
}

/* The device's cuBLASLt handle, made on first use (the device is current). */
static int lt_handle(const char *op, int dev, cublasLtHandle_t *h) {
    if (dev < 0 || dev >= MAX_DEVICES)
        return fl_fail(FL_ERR_DEVICE, "%s on cuda:%d: device index out of range", op, dev);
    fl_cu_lock lock(&handles_mutex);
    if (!lt_handles[dev]) {
        cublasStatus_t st = cublasLtCreate(&lt_handles[dev]);
        if (st != CUBLAS_STATUS_SUCCESS) {
            lt_handles[dev] = NULL;
            return blas_fail(op, "cublasLtCreate", st);
        }
    }
    *h = lt_handles[dev];
    return FL_OK;
}

/* The device's cuBLAS handle (f64 products), made on first use. */
static int blas_handle(const char *op, int dev, cublasHandle_t *h) {
    if (dev < 0 || dev >= MAX_DEVICES)
        return fl_fail(FL_ERR_DEVICE, "%s on cuda:%d: device index out of range", op, dev);
    fl_cu_lock lock(&handles_mutex);
    if (!blas_handles[dev]) {
        cublasStatus_t st = cublasCreate(&blas_handles[dev]);
        if (st != CUBLAS_STATUS_SUCCESS) {
            blas_handles[dev] = NULL;
            return blas_fail(op, "cublasCreate", st);
        }
    }
    *h = blas_handles[dev];
    cublasStatus_t st = cublasSetStream(*h, fl_cu_stream());
    return st == CUBLAS_STATUS_SUCCESS ? FL_OK : blas_fail(op, "cublasSetStream", st);
}

static cudaDataType_t cuda_type(fl_dtype d) {
    switch (d) {
    case FL_BF16: return CUDA_R_16BF;
    case FL_F16: return CUDA_R_16F;
    case FL_F64: return CUDA_R_64F;
    default: return CUDA_R_32F;
    }
}

/* The largest power of two (at most 16) dividing the address of every
 * matrix of a batch: what the heuristic must assume of the pointers.
 *
 * [Note: the GEMM algorithm does not depend on where a buffer lies]
 * Capped at 16 bytes, not cuBLASLt's 256: the heuristic's choice (and so
 * the bits of the product: tile shapes and split-K change the order of the
 * sums) then depends only on whether a pointer is 16-byte aligned, which
 * every block of the caching pool is. With 256, the same product gave
 * other bits on a real H100 when one operand was an offloaded activation
 * restored at offset 0 of a fresh block rather than a view into a larger
 * one (cuda_offload_spec's bit-for-bit cases); 16 bytes is what the
 * tensor-core kernels' vector and TMA loads need. */
static uint32_t alignment(const void *p, int64_t batch_stride, size_t es) {
    uint64_t bits = (uint64_t)(uintptr_t)p | 16u;
    if (batch_stride) bits |= (uint64_t)batch_stride * es;
    return (uint32_t)(bits & (~bits + 1));
}


/* Whether the environment variable name is "1", read once into *cached
 * (-1: not read yet). */
static bool env_is_one(const char *name, int *cached) {
    if (*cached < 0) {
        const char *e = getenv(name);
        *cached = e && strcmp(e, "1") == 0;
    }
    return *cached == 1;
}

static bool allow_tf32(void) {
    static int cached = -1;
    return env_is_one("FSDP_ALLOW_TF32", &cached);
}

/* FSDP_CUBLAS_DEBUG=1: a line for each product cuBLASLt has no algorithm for. */
static bool gemm_debug(void) {
    static int cached = -1;
    return env_is_one("FSDP_CUBLAS_DEBUG", &cached);
}

/* One cuBLASLt call (see fl_cu_gemm). */
static int lt_gemm(const char *op, int dev, const fl_cu_gemm_args *g, void *ws, int64_t ws_bytes) {
    cublasLtHandle_t h = NULL;
    int rc = lt_handle(op, dev, &h);
    if (rc != FL_OK) return rc;
    size_t ea = fl_dtype_size(g->ab), ec = fl_dtype_size(g->cd);
    cublasComputeType_t compute = g->ab == FL_F32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                  : CUBLAS_COMPUTE_32F;
    cudaDataType_t tab = cuda_type(g->ab), tcd = cuda_type(g->cd);
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t st;
    const char *what = "cublasLtMatmulDescCreate";
    /* Column-major C^T (n x m) = op(B)^T-as-stored (n x k) * op(A) (k x m):
     * the library's first operand is our B, its second our A. */
    cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t b_rows = g->tb ? g->k : g->n, b_cols = g->tb ? g->n : g->k;
    uint64_t a_rows = g->ta ? g->m : g->k, a_cols = g->ta ? g->k : g->m;
    int32_t batch = (int32_t)g->batch;
    cublasLtMatmulHeuristicResult_t result;
    int returned = 0;
    float alpha = 1, beta = (float)g->beta;
    memset(&result, 0, sizeof result);

#define LT(call, name)                                                                             \
    do {                                                                                           \
        what = name;                                                                               \
        if ((st = (call)) != CUBLAS_STATUS_SUCCESS) goto fail;                                     \
    } while (0)
    LT(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb),
       "setting TRANSA");
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa),
       "setting TRANSB");
    if (g->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = cuda_type(g->bias_dtype);
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
           "setting the BIAS epilogue");
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                          sizeof g->bias),
           "setting the bias pointer");
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
           "setting the bias dtype");
    }
    LT(cublasLtMatrixLayoutCreate(&la, tab, b_rows, b_cols, g->ldb), "creating B's layout");
    LT(cublasLtMatrixLayoutCreate(&lb, tab, a_rows, a_cols, g->lda), "creating A's layout");
    LT(cublasLtMatrixLayoutCreate(&lc, tcd, (uint64_t)g->n, (uint64_t)g->m, g->ldc),
       "creating C's layout");
    if (batch > 1) {
        LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
           "setting B's batch");
        LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g->sb,
                                            sizeof g->sb),
           "setting B's batch stride");
        LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
           "setting A's batch");
        LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g->sa,
                                            sizeof g->sa),
           "setting A's batch stride");
        LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
           "setting C's batch");
        LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g->sc,
                                            sizeof g->sc),
           "setting C's batch stride");
    }
    {
        uint64_t wsb = (uint64_t)ws_bytes;
        uint32_t al_b = alignment(g->b, g->sb, ea), al_a = alignment(g->a, g->sa, ea);
        uint32_t al_c = alignment(g->c, g->sc, ec);
        LT(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                sizeof wsb),
           "setting the workspace size");
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &al_b, sizeof al_b),
           "setting B's alignment");
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &al_a, sizeof al_a),
           "setting A's alignment");
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &al_c, sizeof al_c),
           "setting C's alignment");
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &al_c, sizeof al_c),
           "setting D's alignment");
    }
    st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &result, &returned);
    /* With the BIAS epilogue, cuBLASLt 13 on an H100 answered
     * CUBLAS_STATUS_INVALID_VALUE (not NOT_SUPPORTED) for small linears
     * (f32 [6, 8] x [8, 6] + bias, DeepViT's 32-wide patch embedding);
     * the caller then computes the product without the epilogue and adds
     * the bias itself, the same math. */
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && returned == 0) ||
        (st == CUBLAS_STATUS_INVALID_VALUE && g->bias)) {
        if (gemm_debug())
            fprintf(stderr, "fsdp-lua: %s: cuBLASLt has no algorithm for %s x %s -> %s, m %lld n %lld "
                    "k %lld batch %d, ld %lld/%lld/%lld%s (status %d, %d returned)\n", op,
                    fl_dtype_name(g->ab), fl_dtype_name(g->ab), fl_dtype_name(g->cd), (long long)g->m,
                    (long long)g->n, (long long)g->k, (int)batch, (long long)g->lda, (long long)g->ldb,
                    (long long)g->ldc, g->bias ? ", bias epilogue" : "", (int)st, returned);
        rc = FL_CU_NO_ALGORITHM;
        goto done;
    }
    what = "cublasLtMatmulAlgoGetHeuristic";
    if (st != CUBLAS_STATUS_SUCCESS) goto fail;
    LT(cublasLtMatmul(h, desc, &alpha, g->b, la, g->a, lb, &beta, g->c, lc, g->c, lc, &result.algo,
                      ws, (size_t)ws_bytes, fl_cu_stream()),
       "cublasLtMatmul");
#undef LT
    rc = FL_OK;
    goto done;
fail:
    rc = blas_fail(op, what, st);
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return rc;
}

/* The f64 product: cublasDgemmStridedBatched, beta = 1 when C already
 * holds the bias (as the CPU's dgemm). */
static int dgemm(const char *op, int dev, const fl_cu_gemm_args *g) {
    cublasHandle_t h = NULL;
    int rc = blas_handle(op, dev, &h);
    if (rc != FL_OK) return rc;
    if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX || g->batch > INT32_MAX)
        return fl_fail(FL_ERR_UNSUPPORTED, "matmul on cuda: f64 product of %lld x %lld x %lld is "
                       "too large for cuBLAS's 32-bit sizes", (long long)g->m, (long long)g->n,
                       (long long)g->k);
    double alpha = 1, beta = g->beta;
    cublasStatus_t st = cublasDgemmStridedBatched(
        h, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n,
        (int)g->m, (int)g->k, &alpha, (const double *)g->b, (int)g->ldb, g->sb,
        (const double *)g->a, (int)g->lda, g->sa, &beta, (double *)g->c, (int)g->ldc, g->sc,
        (int)g->batch);
    return st == CUBLAS_STATUS_SUCCESS ? FL_OK : blas_fail(op, "cublasDgemmStridedBatched", st);
}

int fl_cu_gemm(const char *op, int dev, const fl_cu_gemm_args *g, void *ws, int64_t ws_bytes) {
    return g->ab == FL_F64 ? dgemm(op, dev, g) : lt_gemm(op, dev, g, ws, ws_bytes);
}
