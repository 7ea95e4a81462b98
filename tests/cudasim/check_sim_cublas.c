/*
 * check_sim_cublas.c: checks sim_cublas.c, cudasim's host cuBLASLt/cuBLAS,
 * against a CPU BLAS (cblas_sgemm/cblas_dgemm), so that the simulation the
 * CUDA backend's tests lean on is itself known to be right: every
 * transpose combination, non-square shapes with ld > rows, strided and
 * broadcast batches, alpha/beta in and out of place, the bias epilogue,
 * bf16/f16 inputs and outputs, TF32, row order, f64 through both libraries,
 * the exact call sequence of core/cuda/cuda_gemm.cu, the refusals (bad
 * shapes, bad combinations, bad attribute sizes, broken alignment
 * promises), and the 16-bit conversions bit for bit.
 *
 * It includes sim_cublas.c itself rather than linking it, to reach the
 * private conversion helpers; the public functions are still defined
 * against the real headers exactly as in the library build.
 *
 * Padding (ld beyond rows, gaps between batches) is filled with NaN: a read
 * of it poisons the result, and a write to it is caught by comparing the
 * padding afterwards. C is all NaN whenever beta == 0 (it must not be read).
 *
 * Build and run (from the repository root; falls back to the reference BLAS
 * when pkg-config knows no openblas):
 *   gcc -std=c11 -O2 -Wall -Wextra -I/usr/local/cuda/include tests/cudasim/check_sim_cublas.c -o /tmp/check_sim_cublas $(pkg-config --cflags --libs openblas 2>/dev/null || echo -lblas) -lm && /tmp/check_sim_cublas
 *
 * Prints one line per case and exits 1 if any failed.
 */
#define _POSIX_C_SOURCE 200112L /* setenv */

#include "sim_cublas.c"

#include <cblas.h>

#include <float.h>

static int failures, cases;

static void report(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s  ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    cases++;
    if (!ok) failures++;
}

/* ---- random values ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1p-52 - 1.0;
}

/* ---- matrices in any dtype -------------------------------------------------------- */

/* A matrix (or batch of them) of `type`: rows x cols, order col or row,
 * leading dimension ld, `batch` matrices `stride` elements apart, in a
 * buffer of `total` elements filled with NaN outside the matrices. */
typedef struct {
    int type, order;
    int64_t rows, cols, ld, stride, batch, total;
    void *data;
    unsigned char *used; /* 1 where an element belongs to some matrix */
} mat;

static int64_t mat_at(const mat *x, int64_t b, int64_t r, int64_t c) {
    return b * x->stride + (x->order == CUBLASLT_ORDER_ROW ? r * x->ld + c : r + c * x->ld);
}

static void put(mat *x, int64_t i, double v) { store(x->data, x->type, i, v); }
static double get(const mat *x, int64_t i) { return load(x->data, x->type, i); }

static void fill_nan(void *p, int type, int64_t n) {
    for (int64_t i = 0; i < n; i++) store(p, type, i, NAN);
}

/* stride 0 broadcasts one matrix; stride < 0 means packed plus a gap. */
static mat mat_new(int type, int order, int64_t rows, int64_t cols, int64_t pad, int64_t batch,
                   int64_t stride) {
    mat x;
    memset(&x, 0, sizeof x);
    x.type = type;
    x.order = order;
    x.rows = rows;
    x.cols = cols;
    x.ld = (order == CUBLASLT_ORDER_ROW ? cols : rows) + pad;
    if (x.ld < 1) x.ld = 1;
    int64_t span = (order == CUBLASLT_ORDER_ROW ? rows : cols) * x.ld;
    x.stride = stride < 0 ? span + 3 : stride;
    x.batch = batch;
    x.total = (batch - 1) * x.stride + span + 5;
    /* 256-byte aligned, as cudaMalloc */
    x.data = aligned_alloc(256, (size_t)((x.total * (int64_t)type_size(type) + 255) / 256 * 256));
    x.used = calloc((size_t)x.total, 1);
    fill_nan(x.data, type, x.total);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) x.used[mat_at(&x, b, r, c)] = 1;
    return x;
}

static void mat_random(mat *x) {
    for (int64_t b = 0; b < x->batch; b++)
        for (int64_t r = 0; r < x->rows; r++)
            for (int64_t c = 0; c < x->cols; c++) put(x, mat_at(x, b, r, c), urand());
}

static void mat_free(mat *x) {
    free(x->data);
    free(x->used);
}

/* Whether the elements outside the matrices are still NaN. */
static bool padding_intact(const mat *x) {
    for (int64_t i = 0; i < x->total; i++)
        if (!x->used[i] && !isnan(get(x, i))) return false;
    return true;
}

static cublasLtMatrixLayout_t layout_of(const mat *x) {
    cublasLtMatrixLayout_t l = NULL;
    cublasLtMatrixLayoutCreate(&l, (cudaDataType)x->type, (uint64_t)x->rows, (uint64_t)x->cols,
                               x->ld);
    int32_t order = x->order, batch = (int32_t)x->batch;
    int64_t stride = x->stride;
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order);
    if (x->batch > 1) {
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                         sizeof batch);
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                         sizeof stride);
    }
    return l;
}

/* One matrix of a batch as a packed f32 (or f64) array in x's order with
 * x's ld, for the CPU BLAS. */
static double *to_f64(const mat *x, int64_t b) {
    int64_t span = (x->order == CUBLASLT_ORDER_ROW ? x->rows : x->cols) * x->ld;
    double *d = malloc((size_t)span * sizeof *d);
    for (int64_t i = 0; i < span; i++) d[i] = 0;
    for (int64_t r = 0; r < x->rows; r++)
        for (int64_t c = 0; c < x->cols; c++) {
            int64_t o = x->order == CUBLASLT_ORDER_ROW ? r * x->ld + c : r + c * x->ld;
            d[o] = get(x, mat_at(x, b, r, c));
        }
    return d;
}

static float *to_f32(const mat *x, int64_t b) {
    int64_t span = (x->order == CUBLASLT_ORDER_ROW ? x->rows : x->cols) * x->ld;
    double *d = to_f64(x, b);
    float *f = malloc((size_t)span * sizeof *f);
    for (int64_t i = 0; i < span; i++) f[i] = (float)d[i];
    free(d);
    return f;
}

/* The largest power of two (at most 256) dividing the address of every
 * matrix of a batch, as cuda_gemm.cu computes its alignment promises. */
static uint32_t alignment(const void *p, int64_t batch_stride, size_t es) {
    uint64_t bits = (uint64_t)(uintptr_t)p | 256u;
    if (batch_stride) bits |= (uint64_t)batch_stride * es;
    return (uint32_t)(bits & (~bits + 1));
}

/* ---- one cuBLASLt case ------------------------------------------------------------- */

typedef struct {
    const char *name;
    int ab, cd;         /* dtypes of A and B, of C and D */
    int compute, scale; /* 0: 32F / R_32F (64F / R_64F for f64) */
    bool ta, tb;
    int64_t m, n, k, batch;
    int64_t pad;  /* added to every ld */
    bool bcast_b; /* B's stride 0 */
    double alpha, beta;
    bool inplace; /* C == D (else D has its own, larger ld) */
    bool bias;
    int64_t bias_stride; /* elements between the batches' bias vectors */
    bool row;            /* every layout in row order */
} lt_case;

/* Tolerance: the error a correct f32 (or f64) product may carry, relative
 * to the sum of the absolute terms, plus one unit in the last place of the
 * output dtype (the rounding of the sim and of the rounded reference may
 * fall on either side). */
static double tolerance(const lt_case *t, double ref, double mag) {
    double acc = t->cd == CUDA_R_64F ? 1e-13 : 1e-5;
    if (t->compute == CUBLAS_COMPUTE_32F_FAST_TF32) acc = 0x1p-10;
    double out = t->cd == CUDA_R_16BF ? 0x1p-7 : t->cd == CUDA_R_16F ? 0x1p-10 : 0;
    double tiny = t->cd == CUDA_R_16F ? 0x1p-24 : 0;
    return mag * acc + fabs(ref) * out + tiny;
}

static void run_lt_case(cublasLtHandle_t h, const lt_case *t) {
    bool f64 = t->cd == CUDA_R_64F;
    int order = t->row ? CUBLASLT_ORDER_ROW : CUBLASLT_ORDER_COL;
    int compute = t->compute ? t->compute : f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    int scale = t->scale ? t->scale : f64 ? CUDA_R_64F : CUDA_R_32F;
    int64_t m = t->m, n = t->n, k = t->k;
    mat A = mat_new(t->ab, order, t->ta ? k : m, t->ta ? m : k, t->pad, t->batch, -1);
    mat B = mat_new(t->ab, order, t->tb ? n : k, t->tb ? k : n, t->pad + 1, t->batch,
                    t->bcast_b ? 0 : -1);
    mat C = mat_new(t->cd, order, m, n, t->pad, t->batch, -1);
    mat D = t->inplace ? C : mat_new(t->cd, order, m, n, t->pad + 2, t->batch, -1);
    mat_random(&A);
    mat_random(&B);
    if (t->beta != 0) mat_random(&C); /* else all NaN: must not be read */
    int64_t nbias = t->bias ? m + (t->batch - 1) * t->bias_stride : 0;
    void *bias = NULL;
    if (t->bias) {
        bias = aligned_alloc(256, 256 + (size_t)nbias * 8);
        for (int64_t i = 0; i < nbias; i++) store(bias, t->cd, i, urand());
    }
    mat C0 = C; /* C's values before the call, kept for the reference */
    C0.data = malloc((size_t)C.total * type_size(t->cd));
    memcpy(C0.data, C.data, (size_t)C.total * type_size(t->cd));

    /* the call */
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatmulDescCreate(&desc, (cublasComputeType_t)compute, (cudaDataType_t)scale);
    cublasOperation_t opa = t->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      opb = t->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (t->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = t->cd;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                       &t->bias_stride, sizeof t->bias_stride);
    }
    cublasLtMatrixLayout_t la = layout_of(&A), lb = layout_of(&B), lc = layout_of(&C),
                           ld = layout_of(&D);
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t ws = 1 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    /* The alignment every matrix of each batch really has (the default
     * promise, 256 bytes, would be broken by the odd batch strides here). */
    const mat *ms[4] = {&A, &B, &C, &D};
    for (int i = 0; i < 4; i++) {
        uint32_t al =
            alignment(ms[i]->data, ms[i]->batch > 1 ? ms[i]->stride : 0, type_size(ms[i]->type));
        cublasLtMatmulPreferenceSetAttribute(
            pref,
            (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
            &al, sizeof al);
    }
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 1, &res, &nres);
    float af = (float)t->alpha, bf = (float)t->beta;
    const void *alpha = f64 ? (const void *)&t->alpha : (const void *)&af;
    const void *beta = f64 ? (const void *)&t->beta : (const void *)&bf;
    if (st == CUBLAS_STATUS_SUCCESS && nres == 1)
        st = cublasLtMatmul(h, desc, alpha, A.data, la, B.data, lb, beta, C.data, lc, D.data, ld,
                            &res.algo, NULL, 0, NULL);
    else if (st == CUBLAS_STATUS_SUCCESS)
        st = CUBLAS_STATUS_INTERNAL_ERROR;

    /* the reference, batch by batch */
    double worst = 0; /* largest error / tolerance */
    bool bad = false;
    CBLAS_LAYOUT lay = t->row ? CblasRowMajor : CblasColMajor;
    CBLAS_TRANSPOSE cta = t->ta ? CblasTrans : CblasNoTrans,
                    ctb = t->tb ? CblasTrans : CblasNoTrans;
    for (int64_t b = 0; st == CUBLAS_STATUS_SUCCESS && b < t->batch; b++) {
        double *ref = malloc((size_t)(m * n) * sizeof *ref),
               *mag = malloc((size_t)(m * n) * sizeof *mag);
        /* packed col-major (or row-major) m x n results */
        int64_t ldr = t->row ? n : m;
        {
            double *a = to_f64(&A, b), *bb = to_f64(&B, b), *c = to_f64(&C0, b);
            int64_t sa = (t->row ? A.rows : A.cols) * A.ld, sb = (t->row ? B.rows : B.cols) * B.ld;
            if (!f64) { /* f32 reference through sgemm, as the GPU would accumulate */
                float *fa = to_f32(&A, b), *fb = to_f32(&B, b), *fr = calloc((size_t)(m * n), 4);
                for (int64_t r = 0; r < m; r++)
                    for (int64_t cc = 0; cc < n; cc++) {
                        int64_t o = t->row ? r * C0.ld + cc : r + cc * C0.ld;
                        fr[t->row ? r * ldr + cc : r + cc * ldr] = t->beta != 0 ? (float)c[o] : 0;
                    }
                cblas_sgemm(lay, cta, ctb, (int)m, (int)n, (int)k, (float)t->alpha, fa, (int)A.ld,
                            fb, (int)B.ld, (float)t->beta, fr, (int)ldr);
                for (int64_t i = 0; i < m * n; i++) ref[i] = fr[i];
                free(fa);
                free(fb);
                free(fr);
            } else {
                for (int64_t r = 0; r < m; r++)
                    for (int64_t cc = 0; cc < n; cc++) {
                        int64_t o = t->row ? r * C0.ld + cc : r + cc * C0.ld;
                        ref[t->row ? r * ldr + cc : r + cc * ldr] = t->beta != 0 ? c[o] : 0;
                    }
                cblas_dgemm(lay, cta, ctb, (int)m, (int)n, (int)k, t->alpha, a, (int)A.ld, bb,
                            (int)B.ld, t->beta, ref, (int)ldr);
            }
            /* magnitudes: |alpha| |A| |B| + |beta| |C| */
            for (int64_t i = 0; i < sa; i++) a[i] = fabs(a[i]);
            for (int64_t i = 0; i < sb; i++) bb[i] = fabs(bb[i]);
            for (int64_t r = 0; r < m; r++)
                for (int64_t cc = 0; cc < n; cc++) {
                    int64_t o = t->row ? r * C0.ld + cc : r + cc * C0.ld;
                    mag[t->row ? r * ldr + cc : r + cc * ldr] = t->beta != 0 ? fabs(c[o]) : 0;
                }
            cblas_dgemm(lay, cta, ctb, (int)m, (int)n, (int)k, fabs(t->alpha), a, (int)A.ld, bb,
                        (int)B.ld, fabs(t->beta), mag, (int)ldr);
            free(a);
            free(bb);
            free(c);
        }
        for (int64_t r = 0; r < m; r++)
            for (int64_t cc = 0; cc < n; cc++) {
                int64_t i = t->row ? r * ldr + cc : r + cc * ldr;
                double want = ref[i], size = mag[i];
                if (t->bias) {
                    double bv = load(bias, t->cd, b * t->bias_stride + r);
                    want += bv;
                    size += fabs(bv);
                }
                double got = get(&D, mat_at(&D, b, r, cc));
                double tol = tolerance(t, want, size);
                double err = fabs(got - want);
                if (!(err <= tol)) bad = true; /* NaN fails too */
                if (tol > 0 && err / tol > worst) worst = err / tol;
            }
        free(ref);
        free(mag);
    }
    bool pad_ok = padding_intact(&D);
    bool ok = st == CUBLAS_STATUS_SUCCESS && !bad && pad_ok;
    report(ok, "lt   %-44s m%lld n%lld k%lld b%lld %s%s  worst err/tol %.3f%s", t->name,
           (long long)m, (long long)n, (long long)k, (long long)t->batch, t->ta ? "T" : "N",
           t->tb ? "T" : "N", worst,
           st != CUBLAS_STATUS_SUCCESS ? "  (status not SUCCESS)"
           : !pad_ok                   ? "  (padding written)"
                                       : "");
    if (st != CUBLAS_STATUS_SUCCESS) printf("      status %s\n", cublasGetStatusName(st));

    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    mat_free(&A);
    mat_free(&B);
    if (!t->inplace) mat_free(&D);
    mat_free(&C);
    free(C0.data);
    free(bias);
}

static const char *tname(int t) {
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "f16" : t == CUDA_R_64F ? "f64" : "f32";
}

static void lt_cases(cublasLtHandle_t h) {
    char names[64][80];
    int ni = 0;
    /* every transpose pair, in and out of place, alpha/beta, batches with
     * strides, a broadcast B, the bias epilogue, for each dtype pair */
    static const int pairs[][2] = {{CUDA_R_32F, CUDA_R_32F},  {CUDA_R_16BF, CUDA_R_16BF},
                                   {CUDA_R_16BF, CUDA_R_32F}, {CUDA_R_16F, CUDA_R_16F},
                                   {CUDA_R_16F, CUDA_R_32F},  {CUDA_R_64F, CUDA_R_64F}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (int tr = 0; tr < 4; tr++) {
            lt_case t;
            memset(&t, 0, sizeof t);
            t.ab = pairs[p][0];
            t.cd = pairs[p][1];
            t.ta = tr & 1;
            t.tb = tr & 2;
            t.m = 5;
            t.n = 7;
            t.k = 3 + tr;
            t.pad = 2;
            t.alpha = 1.5;
            t.beta = 0;
            t.batch = 1;
            snprintf(names[ni % 64], 80, "%s x %s -> %s, beta 0", tname(t.ab), tname(t.ab),
                     tname(t.cd));
            t.name = names[ni++ % 64];
            run_lt_case(h, &t);

            t.beta = -0.75;
            t.inplace = true;
            t.m = 9;
            t.n = 4;
            t.k = 17;
            snprintf(names[ni % 64], 80, "%s -> %s, in place, beta -0.75", tname(t.ab),
                     tname(t.cd));
            t.name = names[ni++ % 64];
            run_lt_case(h, &t);

            t.inplace = false;
            t.batch = 3;
            t.alpha = -0.5;
            t.beta = 2;
            t.m = 6;
            t.n = 11;
            t.k = 8;
            snprintf(names[ni % 64], 80, "%s -> %s, batch 3 strided, ldd != ldc", tname(t.ab),
                     tname(t.cd));
            t.name = names[ni++ % 64];
            run_lt_case(h, &t);

            t.bcast_b = true;
            t.bias = true;
            t.bias_stride = 0;
            t.beta = 0;
            t.alpha = 1;
            snprintf(names[ni % 64], 80, "%s -> %s, batch 3, B broadcast, bias", tname(t.ab),
                     tname(t.cd));
            t.name = names[ni++ % 64];
            run_lt_case(h, &t);

            t.bcast_b = false;
            t.bias_stride = t.m + 1;
            t.beta = 0.5;
            t.row = true;
            snprintf(names[ni % 64], 80, "%s -> %s, row order, batched bias", tname(t.ab),
                     tname(t.cd));
            t.name = names[ni++ % 64];
            run_lt_case(h, &t);
        }
    /* TF32: within TF32's error of the f32 product */
    for (int tr = 0; tr < 4; tr++) {
        lt_case t;
        memset(&t, 0, sizeof t);
        t.name = "f32 compute 32F_FAST_TF32";
        t.ab = t.cd = CUDA_R_32F;
        t.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        t.ta = tr & 1;
        t.tb = tr & 2;
        t.m = 8;
        t.n = 3;
        t.k = 40;
        t.batch = 2;
        t.pad = 1;
        t.alpha = 1;
        t.beta = 1;
        run_lt_case(h, &t);
    }
    /* a larger one, to see the loops at more than toy sizes */
    lt_case big = {"f32 larger, TN, batch 2",
                   CUDA_R_32F,
                   CUDA_R_32F,
                   0,
                   0,
                   true,
                   false,
                   67,
                   45,
                   129,
                   2,
                   3,
                   false,
                   1.0,
                   0.25,
                   false,
                   true,
                   0,
                   false};
    run_lt_case(h, &big);
}

/* ---- TF32 really rounds -------------------------------------------------------------- */

static void tf32_rounds(cublasLtHandle_t h) {
    /* 1 x 1 x 1: (1 + 2^-20) * 1 is 1 in TF32 and itself in f32 */
    float a = 1.0f + 0x1p-20f, b = 1.0f, d = 0, one = 1, zero = 0;
    float results[2];
    for (int i = 0; i < 2; i++) {
        cublasLtMatmulDesc_t desc;
        cublasLtMatmulDescCreate(&desc, i ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                 CUDA_R_32F);
        cublasLtMatrixLayout_t l;
        cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 1, 1, 1);
        cublasStatus_t st =
            cublasLtMatmul(h, desc, &one, &a, l, &b, l, &zero, &d, l, &d, l, NULL, NULL, 0, NULL);
        results[i] = st == CUBLAS_STATUS_SUCCESS ? d : NAN;
        cublasLtMatrixLayoutDestroy(l);
        cublasLtMatmulDescDestroy(desc);
    }
    report(results[0] == a && results[1] == 1.0f,
           "tf32 (1 + 2^-20) * 1: 32F gives exactly, FAST_TF32 gives 1 (algo NULL)");
}

/* ---- the call sequence of core/cuda/cuda_gemm.cu ------------------------------------------ */

/* Row-major C[i] = op(A[i]) @ op(B[i]) (+ bias), through cuBLASLt exactly as
 * lt_gemm in cuda_gemm.cu calls it: the library's first operand is our B,
 * C^T = B^T A^T column-major, alpha 1, beta 0, C and D the same. Compared
 * with a row-major cblas_sgemm. */

static cublasStatus_t lead_gemm(cublasLtHandle_t h, int64_t m, int64_t n, int64_t k, int64_t batch,
                                const void *a, bool ta, int64_t lda, int64_t sa, const void *b,
                                bool tb, int64_t ldb, int64_t sb, void *c, int64_t ldc, int64_t sc,
                                cudaDataType_t tab, cudaDataType_t tcd, const void *bias,
                                cudaDataType_t bt) {
    size_t ea = type_size(tab), ec = type_size(tcd);
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t b_rows = tb ? (uint64_t)k : (uint64_t)n, b_cols = tb ? (uint64_t)n : (uint64_t)k;
    uint64_t a_rows = ta ? (uint64_t)m : (uint64_t)k, a_cols = ta ? (uint64_t)k : (uint64_t)m;
    int32_t bat = (int32_t)batch;
    cublasLtMatmulHeuristicResult_t result;
    int returned = 0;
    float alpha = 1, beta = 0;
    memset(&result, 0, sizeof result);
    cublasStatus_t st;
#define LT(call)                                                                                   \
    do {                                                                                           \
        if ((st = (call)) != CUBLAS_STATUS_SUCCESS) goto done;                                     \
    } while (0)
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
    if (bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                          sizeof bt));
    }
    LT(cublasLtMatrixLayoutCreate(&la, tab, b_rows, b_cols, ldb));
    LT(cublasLtMatrixLayoutCreate(&lb, tab, a_rows, a_cols, lda));
    LT(cublasLtMatrixLayoutCreate(&lc, tcd, (uint64_t)n, (uint64_t)m, ldc));
    if (bat > 1) {
        LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bat,
                                            sizeof bat));
        LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb,
                                            sizeof sb));
        LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bat,
                                            sizeof bat));
        LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa,
                                            sizeof sa));
        LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bat,
                                            sizeof bat));
        LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc,
                                            sizeof sc));
    }
    {
        uint64_t wsb = 32u << 20;
        uint32_t al_b = alignment(b, sb, ea), al_a = alignment(a, sa, ea),
                 al_c = alignment(c, sc, ec);
        LT(cublasLtMatmulPreferenceCreate(&pref));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &wsb, sizeof wsb));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &al_b, sizeof al_b));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &al_a, sizeof al_a));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &al_c, sizeof al_c));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &al_c, sizeof al_c));
    }
    LT(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &result, &returned));
    if (returned != 1) {
        st = CUBLAS_STATUS_INTERNAL_ERROR;
        goto done;
    }
    LT(cublasLtMatmul(h, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &result.algo, NULL, 0,
                      NULL));
#undef LT
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return st;
}

/* Row-major operands for lead_gemm: x is R x K as stored (already
 * transposed when t), row stride ld, `batch` of them `stride` apart. */
static void *rm_alloc(int type, int64_t rows, int64_t ld, int64_t stride, int64_t batch,
                      int64_t cols) {
    int64_t total = (batch - 1) * stride + rows * ld + 8;
    void *p = aligned_alloc(256, (size_t)((total * (int64_t)type_size(type) + 255) / 256 * 256));
    fill_nan(p, type, total);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) store(p, type, b * stride + r * ld + c, urand());
    return p;
}

static void lead_cases(cublasLtHandle_t h) {
    static const int types[][2] = {{CUDA_R_32F, CUDA_R_32F},
                                   {CUDA_R_16BF, CUDA_R_16BF},
                                   {CUDA_R_16F, CUDA_R_16F},
                                   {CUDA_R_16BF, CUDA_R_32F}};
    for (size_t ty = 0; ty < sizeof types / sizeof types[0]; ty++)
        for (int tr = 0; tr < 4; tr++)
            for (int variant = 0; variant < 3; variant++) {
                /* variant 0: one product; 1: batch 3 with B broadcast; 2: bias (f32 out) */
                int tab = types[ty][0], tcd = types[ty][1];
                bool ta = tr & 1, tb = tr & 2;
                int64_t m = 7, n = 5, k = 6, batch = variant == 1 ? 3 : 1;
                bool use_bias = variant == 2 && tcd == CUDA_R_32F;
                if (variant == 2 && !use_bias) continue;
                int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                int64_t lda = ac + 3, ldb = bc + 1, ldc = n;
                int64_t sa = ar * lda + 2, sb = variant == 1 ? 0 : br * ldb, sc = m * n;
                void *a = rm_alloc(tab, ar, lda, sa, batch, ac);
                void *b = rm_alloc(tab, br, ldb, sb, batch, bc);
                void *c = rm_alloc(tcd, m, ldc, sc, batch, 0); /* all NaN: beta 0 */
                float bias[16];
                for (int i = 0; i < 16; i++) bias[i] = (float)urand();
                cublasStatus_t st =
                    lead_gemm(h, m, n, k, batch, a, ta, lda, sa, b, tb, ldb, sb, c, ldc, sc, tab,
                              tcd, use_bias ? bias : NULL, CUDA_R_32F);
                double worst = 0;
                bool bad = st != CUBLAS_STATUS_SUCCESS;
                for (int64_t bi = 0; !bad && bi < batch; bi++) {
                    float *fa = malloc((size_t)(ar * lda) * 4),
                          *fb = malloc((size_t)(br * ldb) * 4);
                    float *fr = calloc((size_t)(m * n), 4), *fm = calloc((size_t)(m * n), 4);
                    for (int64_t i = 0; i < ar * lda; i++) fa[i] = (float)load(a, tab, bi * sa + i);
                    for (int64_t i = 0; i < br * ldb; i++) fb[i] = (float)load(b, tab, bi * sb + i);
                    for (int64_t i = 0; i < ar * lda; i++) fa[i] = isnan(fa[i]) ? 0 : fa[i];
                    for (int64_t i = 0; i < br * ldb; i++) fb[i] = isnan(fb[i]) ? 0 : fb[i];
                    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                                tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, fa,
                                (int)lda, fb, (int)ldb, 0.0f, fr, (int)n);
                    for (int64_t i = 0; i < ar * lda; i++) fa[i] = fabsf(fa[i]);
                    for (int64_t i = 0; i < br * ldb; i++) fb[i] = fabsf(fb[i]);
                    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                                tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, fa,
                                (int)lda, fb, (int)ldb, 0.0f, fm, (int)n);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            double want = fr[i * n + j], mag = fm[i * n + j];
                            if (use_bias) {
                                want += bias[j]; /* row-major: one bias per column of C */
                                mag += fabsf(bias[j]);
                            }
                            double got = load(c, tcd, bi * sc + i * ldc + j);
                            lt_case t;
                            memset(&t, 0, sizeof t);
                            t.cd = tcd;
                            double tol = tolerance(&t, want, mag), err = fabs(got - want);
                            if (!(err <= tol)) bad = true;
                            if (err / tol > worst) worst = err / tol;
                        }
                    free(fa);
                    free(fb);
                    free(fr);
                    free(fm);
                }
                report(!bad, "lead %s x %s -> %s %s%s %s  worst err/tol %.3f%s", tname(tab),
                       tname(tab), tname(tcd), ta ? "T" : "N", tb ? "T" : "N",
                       variant == 0   ? "single"
                       : variant == 1 ? "batch 3, B broadcast"
                                      : "bias",
                       worst, st != CUBLAS_STATUS_SUCCESS ? "  (status not SUCCESS)" : "");
                free(a);
                free(b);
                free(c);
            }

    /* bf16 output with the f32 bias cuda_matmul.cu passes: not D's type, so
     * no algorithm (cuda_matmul.cu then takes its unfused route); with
     * SIM_CUBLASLT_BIAS_ANY_FLOAT=1 the fused bias runs and is right. */
    for (int lenient = 0; lenient < 2; lenient++) {
        if (lenient) setenv("SIM_CUBLASLT_BIAS_ANY_FLOAT", "1", 1);
        int64_t m = 4, n = 6, k = 5;
        void *a = rm_alloc(CUDA_R_16BF, m, k, 0, 1, k), *b = rm_alloc(CUDA_R_16BF, k, n, 0, 1, n);
        void *c = rm_alloc(CUDA_R_16BF, m, n, 0, 1, 0);
        float bias[6] = {1, -2, 0.5f, 3, -0.25f, 8};
        cublasStatus_t st = lead_gemm(h, m, n, k, 1, a, false, k, 0, b, false, n, 0, c, n, 0,
                                      CUDA_R_16BF, CUDA_R_16BF, bias, CUDA_R_32F);
        bool ok;
        if (!lenient) {
            ok = st == CUBLAS_STATUS_NOT_SUPPORTED;
        } else {
            ok = st == CUBLAS_STATUS_SUCCESS;
            for (int64_t i = 0; ok && i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double want = bias[j], mag = fabs(bias[j]);
                    for (int64_t p = 0; p < k; p++) {
                        double x =
                            load(a, CUDA_R_16BF, i * k + p) * load(b, CUDA_R_16BF, p * n + j);
                        want += x;
                        mag += fabs(x);
                    }
                    double got = load(c, CUDA_R_16BF, i * n + j);
                    if (!(fabs(got - want) <= mag * 1e-5 + fabs(want) * 0x1p-7)) ok = false;
                }
            unsetenv("SIM_CUBLASLT_BIAS_ANY_FLOAT");
        }
        report(ok, "lead bf16 out with f32 bias: %s (status %s)",
               lenient ? "SIM_CUBLASLT_BIAS_ANY_FLOAT=1 runs it" : "NOT_SUPPORTED by default",
               cublasGetStatusName(st));
        free(a);
        free(b);
        free(c);
    }
}

/* ---- cublasDgemmStridedBatched ------------------------------------------------------------- */

static void dgemm_cases(cublasHandle_t h) {
    for (int tr = 0; tr < 4; tr++)
        for (int variant = 0; variant < 3; variant++) {
            bool ta = tr & 1, tb = tr & 2;
            int m = 6 + tr, n = 4, k = 9, batch = variant == 0 ? 1 : 3;
            double alpha = variant == 2 ? 0.0 : 1.25, beta = variant == 0 ? 0.0 : -0.5;
            int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
            int lda = ar + 2, ldb = br + 1, ldc = m + 3;
            long long sa = (long long)lda * ac + 5, sb = variant == 1 ? 0 : (long long)ldb * bc,
                      sc = (long long)ldc * n + 1;
            mat A = mat_new(CUDA_R_64F, CUBLASLT_ORDER_COL, ar, ac, 2, batch, sa);
            mat B = mat_new(CUDA_R_64F, CUBLASLT_ORDER_COL, br, bc, 1, batch, sb);
            mat C = mat_new(CUDA_R_64F, CUBLASLT_ORDER_COL, m, n, 3, batch, sc);
            mat_random(&A);
            mat_random(&B);
            if (variant == 2) /* alpha == 0: A and B are not read (BLAS) */
                fill_nan(A.data, CUDA_R_64F, A.total);
            if (beta != 0) mat_random(&C);
            double *c0 = malloc((size_t)C.total * 8);
            memcpy(c0, C.data, (size_t)C.total * 8);
            cublasStatus_t st = cublasDgemmStridedBatched(
                h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                A.data, lda, sa, B.data, ldb, sb, &beta, C.data, ldc, sc, batch);
            bool bad = st != CUBLAS_STATUS_SUCCESS;
            double worst = 0;
            for (int b = 0; !bad && b < batch; b++) {
                double *ref = calloc((size_t)ldc * (size_t)n, 8);
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < m; i++)
                        ref[i + j * ldc] = beta != 0 ? c0[b * sc + i + j * ldc] : 0;
                if (alpha != 0)
                    cblas_dgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans,
                                tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                                (const double *)A.data + b * sa, lda,
                                (const double *)B.data + b * sb, ldb, beta, ref, ldc);
                else
                    for (int j = 0; j < n; j++)
                        for (int i = 0; i < m; i++) ref[i + j * ldc] *= beta;
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < m; i++) {
                        double got = ((double *)C.data)[b * sc + i + j * ldc],
                               want = ref[i + j * ldc];
                        double err = fabs(got - want);
                        if (!(err <= 1e-12 * (1 + fabs(want)))) bad = true;
                        if (err / 1e-12 > worst) worst = err / 1e-12;
                    }
                free(ref);
            }
            bool pad_ok = padding_intact(&C);
            report(!bad && pad_ok,
                   "dgemm %s%s m%d n%d k%d batch %d%s alpha %g beta %g  worst err/1e-12 %.3f%s",
                   ta ? "T" : "N", tb ? "T" : "N", m, n, k, batch,
                   variant == 1 ? " (B broadcast)" : "", alpha, beta, worst,
                   !pad_ok ? "  (padding written)" : "");
            free(c0);
            mat_free(&A);
            mat_free(&B);
            mat_free(&C);
        }
}

/* ---- refusals ------------------------------------------------------------------------------- */

typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t l[4];
    cublasLtMatmulPreference_t pref;
} lt_setup;

/* A plain 4x3 = (4x2)(2x3) f32 problem to spoil in one way per check. */
static void setup(lt_setup *s, int ta, int tb, int tc, int td) {
    cublasLtMatmulDescCreate(&s->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&s->l[0], (cudaDataType)ta, 4, 2, 4);
    cublasLtMatrixLayoutCreate(&s->l[1], (cudaDataType)tb, 2, 3, 2);
    cublasLtMatrixLayoutCreate(&s->l[2], (cudaDataType)tc, 4, 3, 4);
    cublasLtMatrixLayoutCreate(&s->l[3], (cudaDataType)td, 4, 3, 4);
    cublasLtMatmulPreferenceCreate(&s->pref);
}

static void teardown(lt_setup *s) {
    cublasLtMatmulDescDestroy(s->desc);
    for (int i = 0; i < 4; i++) cublasLtMatrixLayoutDestroy(s->l[i]);
    cublasLtMatmulPreferenceDestroy(s->pref);
}

static cublasStatus_t heur(cublasLtHandle_t h, lt_setup *s, cublasLtMatmulHeuristicResult_t *r) {
    int n = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, s->desc, s->l[0], s->l[1], s->l[2],
                                                       s->l[3], s->pref, 1, r, &n);
    if (st == CUBLAS_STATUS_SUCCESS && n != 1) return CUBLAS_STATUS_INTERNAL_ERROR;
    return st;
}

static void expect(const char *what, cublasStatus_t got, cublasStatus_t want) {
    report(got == want, "refuse %-58s %s%s%s", what, cublasGetStatusName(got),
           got == want ? "" : ", expected ", got == want ? "" : cublasGetStatusName(want));
}

static void refusal_cases(cublasLtHandle_t h, cublasHandle_t bh) {
    lt_setup s;
    cublasLtMatmulHeuristicResult_t r;
    float one = 1, zero = 0;
    float *buf = aligned_alloc(256, 4096);
    for (int i = 0; i < 1024; i++) buf[i] = 1;

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    expect("(control) a valid problem", heur(h, &s, &r), CUBLAS_STATUS_SUCCESS);
    expect("(control) and its product",
           cublasLtMatmul(h, s.desc, &one, buf, s.l[0], buf + 64, s.l[1], &zero, buf + 128, s.l[2],
                          buf + 128, s.l[3], &r.algo, NULL, 0, NULL),
           CUBLAS_STATUS_SUCCESS);
    {
        uint64_t k3 = 3;
        cublasLtMatrixLayoutSetAttribute(s.l[1], CUBLASLT_MATRIX_LAYOUT_ROWS, &k3, sizeof k3);
        expect("k of op(A) != k of op(B)", heur(h, &s, &r), CUBLAS_STATUS_INVALID_VALUE);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        cublasOperation_t t = CUBLAS_OP_T;
        cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
        expect("TRANSA without reshaping A (op(A) 2 x 4)", heur(h, &s, &r),
               CUBLAS_STATUS_INVALID_VALUE);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        uint64_t cols = 4;
        cublasLtMatrixLayoutSetAttribute(s.l[2], CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols);
        expect("C of the wrong shape", heur(h, &s, &r), CUBLAS_STATUS_INVALID_VALUE);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        int64_t ld = 3;
        cublasLtMatrixLayoutSetAttribute(s.l[0], CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld);
        expect("ld < rows", heur(h, &s, &r), CUBLAS_STATUS_INVALID_VALUE);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        int32_t order = CUBLASLT_ORDER_COL32;
        cublasLtMatrixLayoutSetAttribute(s.l[0], CUBLASLT_MATRIX_LAYOUT_ORDER, &order,
                                         sizeof order);
        expect("order COL32", heur(h, &s, &r), CUBLAS_STATUS_NOT_SUPPORTED);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        int32_t batch = 2;
        int64_t stride = 8;
        cublasLtMatrixLayoutSetAttribute(s.l[0], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                         sizeof batch);
        cublasLtMatrixLayoutSetAttribute(s.l[0], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &stride, sizeof stride);
        expect("batch count of A only", heur(h, &s, &r), CUBLAS_STATUS_INVALID_VALUE);
    }
    teardown(&s);

    setup(&s, CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F, CUDA_R_32F);
    expect("A bf16 with B f16", heur(h, &s, &r), CUBLAS_STATUS_NOT_SUPPORTED);
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF);
    expect("f32 inputs with bf16 output", heur(h, &s, &r), CUBLAS_STATUS_NOT_SUPPORTED);
    teardown(&s);

    setup(&s, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F);
    expect("C bf16 with D f32", heur(h, &s, &r), CUBLAS_STATUS_NOT_SUPPORTED);
    teardown(&s);

    setup(&s, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF);
    {
        int32_t c = CUBLAS_COMPUTE_32F_FAST_TF32;
        cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &c, sizeof c);
        expect("FAST_TF32 with bf16 inputs", heur(h, &s, &r), CUBLAS_STATUS_NOT_SUPPORTED);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        int32_t sc = CUDA_R_64F;
        cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &sc, sizeof sc);
        expect("compute 32F with scale 64F", heur(h, &s, &r), CUBLAS_STATUS_NOT_SUPPORTED);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        int64_t wide = CUBLAS_OP_T;
        expect(
            "TRANSA given as 8 bytes",
            cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide),
            CUBLAS_STATUS_INVALID_VALUE);
        int32_t narrow = 2;
        expect("STRIDED_BATCH_OFFSET given as 4 bytes",
               cublasLtMatrixLayoutSetAttribute(s.l[0], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &narrow, sizeof narrow),
               CUBLAS_STATUS_INVALID_VALUE);
        uint32_t ws32 = 1024;
        expect("MAX_WORKSPACE_BYTES given as 4 bytes",
               cublasLtMatmulPreferenceSetAttribute(
                   s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws32, sizeof ws32),
               CUBLAS_STATUS_INVALID_VALUE);
        int n = 0;
        expect("requestedAlgoCount 0",
               cublasLtMatmulAlgoGetHeuristic(h, s.desc, s.l[0], s.l[1], s.l[2], s.l[3], s.pref, 0,
                                              &r, &n),
               CUBLAS_STATUS_INVALID_VALUE);
    }
    teardown(&s);

    setup(&s, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF);
    {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = CUDA_R_32F;
        cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
        expect("bias f32 with D bf16 (must be D's type)", heur(h, &s, &r),
               CUBLAS_STATUS_NOT_SUPPORTED);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        heur(h, &s, &r);
        expect("BIAS epilogue with no bias pointer",
               cublasLtMatmul(h, s.desc, &one, buf, s.l[0], buf + 64, s.l[1], &zero, buf + 128,
                              s.l[2], buf + 128, s.l[3], &r.algo, NULL, 0, NULL),
               CUBLAS_STATUS_INVALID_VALUE);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        int64_t ld = 5;
        cublasLtMatrixLayoutSetAttribute(s.l[3], CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld);
        heur(h, &s, &r);
        expect("C == D with ldc != ldd",
               cublasLtMatmul(h, s.desc, &one, buf, s.l[0], buf + 64, s.l[1], &one, buf + 128,
                              s.l[2], buf + 128, s.l[3], &r.algo, NULL, 0, NULL),
               CUBLAS_STATUS_INVALID_VALUE);
        expect("(control) C != D with ldc != ldd",
               cublasLtMatmul(h, s.desc, &one, buf, s.l[0], buf + 64, s.l[1], &one, buf + 128,
                              s.l[2], buf + 256, s.l[3], &r.algo, NULL, 0, NULL),
               CUBLAS_STATUS_SUCCESS);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    {
        uint32_t al = 16;
        cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &al, sizeof al);
        heur(h, &s, &r);
        expect("A promised 16-byte aligned, given 4",
               cublasLtMatmul(h, s.desc, &one, buf + 1, s.l[0], buf + 64, s.l[1], &zero, buf + 128,
                              s.l[2], buf + 128, s.l[3], &r.algo, NULL, 0, NULL),
               CUBLAS_STATUS_INVALID_VALUE);
        al = 2;
        cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &al, sizeof al);
        expect("A promised 2-byte aligned for f32", heur(h, &s, &r), CUBLAS_STATUS_NOT_SUPPORTED);
        al = 4;
        cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &al, sizeof al);
        heur(h, &s, &r);
        expect("(control) A promised 4-byte aligned, given 4",
               cublasLtMatmul(h, s.desc, &one, buf + 1, s.l[0], buf + 64, s.l[1], &zero, buf + 128,
                              s.l[2], buf + 128, s.l[3], &r.algo, NULL, 0, NULL),
               CUBLAS_STATUS_SUCCESS);
    }
    teardown(&s);

    setup(&s, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    expect("NULL cuBLASLt handle", heur(NULL, &s, &r), CUBLAS_STATUS_NOT_INITIALIZED);
    teardown(&s);

    /* cuBLAS */
    double d1 = 1, d0 = 0, *dbuf = aligned_alloc(256, 4096);
    for (int i = 0; i < 512; i++) dbuf[i] = 1;
    expect("dgemm lda < m (N)",
           cublasDgemmStridedBatched(bh, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &d1, dbuf, 3, 0, dbuf,
                                     2, 0, &d0, dbuf + 64, 4, 0, 1),
           CUBLAS_STATUS_INVALID_VALUE);
    expect("dgemm lda < k (T)",
           cublasDgemmStridedBatched(bh, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 5, &d1, dbuf, 4, 0, dbuf,
                                     5, 0, &d0, dbuf + 64, 4, 0, 1),
           CUBLAS_STATUS_INVALID_VALUE);
    expect("dgemm ldc < m",
           cublasDgemmStridedBatched(bh, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &d1, dbuf, 4, 0, dbuf,
                                     2, 0, &d0, dbuf + 64, 3, 0, 1),
           CUBLAS_STATUS_INVALID_VALUE);
    expect("dgemm m < 0",
           cublasDgemmStridedBatched(bh, CUBLAS_OP_N, CUBLAS_OP_N, -1, 3, 2, &d1, dbuf, 4, 0, dbuf,
                                     2, 0, &d0, dbuf + 64, 4, 0, 1),
           CUBLAS_STATUS_INVALID_VALUE);
    expect("dgemm NULL handle",
           cublasDgemmStridedBatched(NULL, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &d1, dbuf, 4, 0, dbuf,
                                     2, 0, &d0, dbuf + 64, 4, 0, 1),
           CUBLAS_STATUS_NOT_INITIALIZED);
    expect("(control) dgemm valid",
           cublasDgemmStridedBatched(bh, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &d1, dbuf, 4, 0, dbuf,
                                     2, 0, &d0, dbuf + 64, 4, 0, 1),
           CUBLAS_STATUS_SUCCESS);
    free(dbuf);
    free(buf);
}

/* ---- the 16-bit conversions, bit for bit ---------------------------------------------------- */

/* bf16 by a second route: the two neighbours of f and the nearer one, ties
 * to the even one, distances in double. */
static uint16_t bf16_reference(float f) {
    uint32_t u = f32_bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    uint32_t lo = u & 0xffff0000u;
    if (lo == u) return (uint16_t)(u >> 16);
    double x = fabs((double)f), dl = fabs((double)bits_f32(lo));
    int e = (int)((lo >> 23) & 0xff);
    double ulp = ldexp(1.0, (e ? e : 1) - 127 - 7);
    double dh = dl + ulp; /* may be 2^128: rounds to infinity */
    uint32_t hi = lo + 0x10000u;
    if (x - dl < dh - x) return (uint16_t)(lo >> 16);
    if (x - dl > dh - x) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

static void conversion_cases(void) {
    /* f16 -> f32: all 65536 against the compiler's _Float16 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 x;
        uint16_t hb = (uint16_t)h;
        memcpy(&x, &hb, 2);
        float want = (float)x, got = f16_to_f32(hb);
        if (isnan(want) ? !isnan(got) || signbit(got) != signbit(want)
                        : f32_bits(got) != f32_bits(want))
            bad++;
    }
    report(bad == 0, "f16 -> f32, all 65536 values against _Float16 (%d differ)", bad);

    /* f32 -> f16 and f32 -> bf16 over a spread of bit patterns and the edges */
    int bad16 = 0, badbf = 0;
    long n = 0;
    uint32_t edges[] = {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x38800000u,
                        0x387fffffu, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33800000u,
                        0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x7f800000u, 0x7fc00000u,
                        0x7f800001u, 0x00000001u, 0x3f808000u, 0x3f818000u, 0x3f800fffu};
    for (int pass = 0; pass < 2; pass++) {
        uint64_t count = pass ? 2 * sizeof edges / sizeof edges[0] : (1ull << 32) / 1021 + 1;
        for (uint64_t i = 0; i < count; i++) {
            uint32_t u = pass ? edges[i / 2] | (uint32_t)(i & 1) << 31 : (uint32_t)(i * 1021u);
            float f = bits_f32(u);
            _Float16 hx = (_Float16)f;
            uint16_t want16, got16 = f32_to_f16(f);
            memcpy(&want16, &hx, 2);
            if (isnan(f) ? (got16 & 0x7fff) <= 0x7c00 || (got16 >> 15) != (u >> 31)
                         : got16 != want16)
                bad16++;
            if (f32_to_bf16(f) != bf16_reference(f)) badbf++;
            n++;
        }
    }
    report(bad16 == 0, "f32 -> f16, %ld values against _Float16 (%d differ)", n, bad16);
    report(badbf == 0, "f32 -> bf16, %ld values against a nearest-neighbour reference (%d differ)",
           n, badbf);
    report(f32_to_bf16(bf16_to_f32(0x7fa1)) == 0x7fe1 && f32_to_f16(f16_to_f32(0xfd01)) == 0xff01,
           "NaN payloads survive a round trip, quieted");
}

int main(void) {
    cublasLtHandle_t h = NULL;
    cublasHandle_t bh = NULL;
    if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasCreate(&bh) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(bh, NULL) != CUBLAS_STATUS_SUCCESS) {
        printf("FAIL  handles\n");
        return 1;
    }
    conversion_cases();
    lt_cases(h);
    tf32_rounds(h);
    lead_cases(h);
    dgemm_cases(bh);
    refusal_cases(h, bh);
    cublasLtDestroy(h);
    cublasDestroy(bh);
    printf("%d of %d cases passed%s\n", cases - failures, cases, failures ? "" : ": all ok");
    return failures ? 1 : 0;
}
