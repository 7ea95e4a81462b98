/*
 * sim_cublas.c: cudasim's stand-in for the vendor BLAS libraries: host
 * implementations of exactly the cuBLASLt and cuBLAS entry points that
 * core/cuda/cuda_gemm.cu calls (plus their Destroy and status-name
 * companions), so that the CUDA backend's products run on the CPU in tests.
 *
 * The point is not speed but catching mistakes in how the backend describes
 * its matrices to the library (column-major layouts, leading dimensions,
 * transposes, batch strides, the bias epilogue, dtypes): everything follows
 * the documented semantics (the comments in the real cublasLt.h and the
 * cuBLAS guide), validates like the library where that is cheap, and
 * refuses loudly what the real library would refuse, so a wrong call fails
 * instead of computing garbage that the comparison with the CPU backend
 * would then have to explain.
 *
 * "Device memory" is host memory in cudasim, so every call computes at once
 * on the calling thread and alpha/beta may be read the same way whether
 * the pointer mode says host or device. Computing at once keeps stream
 * order on stream 0 (the blocking streams' queued work runs first); work
 * on a deferred stream of sim_runtime.cc is refused with
 * CUBLAS_STATUS_NOT_SUPPORTED, never run early.
 *
 * The real headers are included so that the compiler checks every
 * definition here against the real prototype (the cublasCreate family are
 * macros for their _v2 names; the definitions below use the macro names and
 * so get the versioned symbols, as a program compiled against the headers
 * expects).
 *
 * Environment:
 *   SIM_CUBLAS_LOG=1   print why a call was refused (as CUBLASLT_LOG_LEVEL
 *                      would); refusals of features this simulation lacks
 *                      but the real library has are always printed.
 *   SIM_CUBLASLT_BIAS_ANY_FLOAT=1   accept a bias of any of f32/bf16/f16
 *                      with an f32-scale product; by default the bias dtype
 *                      must be D's, as cublasLt.h documents for non-fp8
 *                      kernels (see check_bias_type).
 *
 * Build: gcc -std=c11 -O2 -fPIC -I/usr/local/cuda/include -c sim_cublas.c
 * Test:  tests/cudasim/check_sim_cublas.c
 */
#include <cublasLt.h>
#include <cublas_v2.h>

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_half.h"
#include "sim_internal.h"

/* Weak, so check_sim_cublas links without the simulated runtime. */
#pragma weak fl_sim_stream_now

/* ---- logging --------------------------------------------------------------------- */

static bool log_enabled(void) {
    const char *e = getenv("SIM_CUBLAS_LOG");
    return e && *e && strcmp(e, "0") != 0;
}

/* A refusal with its reason: printed when SIM_CUBLAS_LOG is set. */
/* Work is done when called, which keeps stream order on a stream that
 * runs its work at once (stream 0 first runs the blocking streams' queued
 * work, sim_runtime.cc). On a deferred stream it would run early, hiding
 * the missing waits the stream model is there to show, so it is refused,
 * always loudly. */
static cublasStatus_t on_stream(const char *fn, cudaStream_t s) {
    int r = fl_sim_stream_now ? fl_sim_stream_now(s) : 0;
    if (r == 0) return CUBLAS_STATUS_SUCCESS;
    fprintf(stderr, "sim_cublas: %s: %s\n", fn,
            r > 0 ? "work on a deferred stream (from cudaStreamCreate*) is not simulated; "
                    "stream 0 is, or FSDP_CUDASIM_STREAMS=eager runs every stream at once"
                  : "not a CUDA stream");
    return r > 0 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE;
}

static cublasStatus_t refuse(cublasStatus_t st, const char *fn, const char *fmt, ...) {
    if (log_enabled()) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "sim_cublas: %s: %s: ", fn,
                st == CUBLAS_STATUS_NOT_SUPPORTED ? "NOT_SUPPORTED" : "INVALID_VALUE");
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    return st;
}

/* Something the real library would do but this simulation does not: always
 * printed, so that a test failing on it is not mistaken for a backend bug. */
static cublasStatus_t not_simulated(const char *fn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "sim_cublas: %s: not simulated: ", fn);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* ---- 16-bit floats: sim_half.h ---- */

/* ---- data types ------------------------------------------------------------------- */

static size_t type_size(int t) {
    switch (t) {
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    default: return 0;
    }
}

static const char *type_name(int t) {
    switch (t) {
    case CUDA_R_16F: return "R_16F";
    case CUDA_R_16BF: return "R_16BF";
    case CUDA_R_32F: return "R_32F";
    case CUDA_R_64F: return "R_64F";
    case CUDA_R_8I: return "R_8I";
    case CUDA_R_32I: return "R_32I";
    default: return "(other)";
    }
}

static double load(const void *p, int t, int64_t i) {
    switch (t) {
    case CUDA_R_16F: return f16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_16BF: return bf16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_32F: return ((const float *)p)[i];
    default: return ((const double *)p)[i];
    }
}

/* v is already a value of the scale type (f32 or f64); the only rounding
 * here is to the 16-bit types. */
static void store(void *p, int t, int64_t i, double v) {
    switch (t) {
    case CUDA_R_16F: ((uint16_t *)p)[i] = f32_to_f16((float)v); break;
    case CUDA_R_16BF: ((uint16_t *)p)[i] = f32_to_bf16((float)v); break;
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    default: ((double *)p)[i] = v; break;
    }
}

/* ---- handles and descriptors -------------------------------------------------------- */
/* The descriptors are heap structs of our own behind the opaque handle
 * types: nothing outside this file looks inside them. (The Init variants
 * that place a descriptor in caller-provided space are not provided.) A
 * magic number per kind catches a handle of the wrong kind or one already
 * destroyed (the magic is cleared first). */

enum {
    LT_MAGIC = 0x4c544831,     /* "LTH1" */
    BLAS_MAGIC = 0x424c4831,   /* "BLH1" */
    DESC_MAGIC = 0x44455343,   /* "DESC" */
    LAYOUT_MAGIC = 0x4c41594f, /* "LAYO" */
    PREF_MAGIC = 0x50524546,   /* "PREF" */
    ALGO_MAGIC = 0x53494d41,   /* "SIMA" */
};

struct cublasLtContext {
    uint32_t magic;
};

struct cublasContext {
    uint32_t magic;
    cudaStream_t stream; /* work runs at once: stream 0 only (on_stream) */
};

typedef struct {
    uint32_t magic;
    int32_t type, order, batch;
    uint32_t batch_mode;
    uint64_t rows, cols;
    int64_t ld, stride, plane;
} sim_layout;

typedef struct {
    uint32_t magic;
    int32_t compute, scale, pointer_mode, transa, transb, transc, fill;
    uint32_t epilogue;
    int32_t bias_type; /* -1: D's type */
    const void *bias;
    int64_t bias_stride;
    /* fp8-only or feature attributes: a non-default value is refused when
     * the problem is checked (see check_problem). */
    bool fp8_only_set;  /* scale pointers, amax pointers, scale modes */
    bool emulation_set; /* EMULATION_DESCRIPTOR */
} sim_desc;

typedef struct {
    uint32_t magic;
    uint32_t search_mode;
    uint64_t max_workspace;
    uint32_t align[4]; /* promised alignment of A, B, C, D in bytes */
} sim_pref;

/* What cublasLtMatmulAlgoGetHeuristic puts into cublasLtMatmulAlgo_t: the
 * problem it was chosen for and the pointer alignment it relies on. */
typedef struct {
    uint32_t magic;
    int32_t compute, types[4]; /* A, B, C, D */
    uint32_t need_align[4];
} sim_algo;

_Static_assert(sizeof(sim_algo) <= sizeof(cublasLtMatmulAlgo_t), "sim_algo must fit the algo");

static sim_layout *as_layout(cublasLtMatrixLayout_t l) {
    sim_layout *p = (sim_layout *)(void *)l;
    return p && p->magic == LAYOUT_MAGIC ? p : NULL;
}

static sim_desc *as_desc(cublasLtMatmulDesc_t d) {
    sim_desc *p = (sim_desc *)(void *)d;
    return p && p->magic == DESC_MAGIC ? p : NULL;
}

static sim_pref *as_pref(cublasLtMatmulPreference_t d) {
    sim_pref *p = (sim_pref *)(void *)d;
    return p && p->magic == PREF_MAGIC ? p : NULL;
}

static bool lt_ok(cublasLtHandle_t h) { return h && h->magic == LT_MAGIC; }

/* ---- status strings ------------------------------------------------------------------ */

const char *cublasGetStatusName(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "<unknown>";
    }
}

const char *cublasGetStatusString(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    default: return "unknown error";
    }
}

const char *cublasLtGetStatusName(cublasStatus_t st) { return cublasGetStatusName(st); }

const char *cublasLtGetStatusString(cublasStatus_t st) { return cublasGetStatusString(st); }

/* ---- cuBLASLt: handle and descriptors ------------------------------------------------ */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    if (!h) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "NULL handle pointer");
    struct cublasLtContext *c = calloc(1, sizeof *c);
    if (!c) return CUBLAS_STATUS_ALLOC_FAILED;
    c->magic = LT_MAGIC;
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!lt_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *out, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    if (!out) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "NULL");
    sim_desc *d = calloc(1, sizeof *d);
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    d->magic = DESC_MAGIC;
    d->compute = (int32_t)compute;
    d->scale = (int32_t)scale;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->fill = CUBLAS_FILL_MODE_FULL;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = -1;
    *out = (cublasLtMatmulDesc_t)(void *)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    sim_desc *d = as_desc(desc);
    if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy", "not a desc");
    d->magic = 0;
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

/* Whether `size` bytes at buf are all zero: the default of the attributes
 * that are accepted only at their default. */
static bool all_zero(const void *buf, size_t size) {
    const unsigned char *p = buf;
    for (size_t i = 0; i < size; i++)
        if (p[i]) return false;
    return true;
}

/* The library checks sizeInBytes against the attribute's own size (the
 * header: "INVALID_VALUE if buf is NULL or sizeInBytes doesn't match size of
 * internal storage"); that catches an enum passed where a 64-bit value is
 * expected and the like. */
#define ATTR(field, type)                                                                          \
    do {                                                                                           \
        if (size != sizeof(type))                                                                  \
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d: %zu bytes, not %zu",     \
                          (int)attr, size, sizeof(type));                                          \
        type v_;                                                                                   \
        memcpy(&v_, buf, sizeof v_);                                                               \
        field = v_;                                                                                \
    } while (0)

/* An attribute this simulation keeps only at its default: its size is
 * checked, a value other than zero sets `flag`. */
#define ATTR_FLAG(flag, type)                                                                      \
    do {                                                                                           \
        if (size != sizeof(type))                                                                  \
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d: %zu bytes, not %zu",     \
                          (int)attr, size, sizeof(type));                                          \
        if (!all_zero(buf, size)) flag = true;                                                     \
    } while (0)

/* An attribute that changes nothing here (a tuning hint, or one only read
 * by epilogues and pointer modes refused elsewhere): size checked only. */
#define ATTR_IGNORED(type)                                                                         \
    do {                                                                                           \
        if (size != sizeof(type))                                                                  \
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d: %zu bytes, not %zu",     \
                          (int)attr, size, sizeof(type));                                          \
    } while (0)

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size) {
    static const char fn[] = "cublasLtMatmulDescSetAttribute";
    sim_desc *d = as_desc(desc);
    if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "not a matmul desc");
    if (!buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL buf");
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: ATTR(d->compute, int32_t); break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: ATTR(d->scale, int32_t); break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: ATTR(d->pointer_mode, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: ATTR(d->transa, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ATTR(d->transb, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSC: ATTR(d->transc, int32_t); break;
    case CUBLASLT_MATMUL_DESC_FILL_MODE: ATTR(d->fill, int32_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ATTR(d->epilogue, uint32_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ATTR(d->bias, const void *); break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: ATTR(d->bias_stride, int64_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ATTR(d->bias_type, int32_t); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER:
    case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER: ATTR_FLAG(d->fp8_only_set, void *); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_C_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_D_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE: ATTR_FLAG(d->fp8_only_set, int32_t); break;
    case CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR: ATTR_FLAG(d->emulation_set, void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ATTR_IGNORED(void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
    case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE: ATTR_IGNORED(int64_t); break;
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: ATTR_IGNORED(int32_t); break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: ATTR_IGNORED(int8_t); break; /* fp8 only */
    default: return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "unknown attribute %d", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *out, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (!out) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "NULL");
    sim_layout *l = calloc(1, sizeof *l);
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    /* Values are checked when the layout is used (the real Create only
     * reports allocation failures), since attributes may still change. */
    l->magic = LAYOUT_MAGIC;
    l->type = (int32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->batch = 1;
    l->batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    *out = (cublasLtMatrixLayout_t)(void *)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    sim_layout *l = as_layout(layout);
    if (!l)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy", "not a layout");
    l->magic = 0;
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    static const char fn[] = "cublasLtMatrixLayoutSetAttribute";
    sim_layout *l = as_layout(layout);
    if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "not a layout");
    if (!buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL buf");
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
        uint32_t t = 0;
        ATTR(t, uint32_t);
        l->type = (int32_t)t;
        break;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ATTR(l->order, int32_t); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: ATTR(l->rows, uint64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: ATTR(l->cols, uint64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: ATTR(l->ld, int64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ATTR(l->batch, int32_t); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ATTR(l->stride, int64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: ATTR(l->plane, int64_t); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: ATTR(l->batch_mode, uint32_t); break;
    default: return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "unknown attribute %d", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *out) {
    if (!out) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "NULL");
    sim_pref *p = calloc(1, sizeof *p);
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = PREF_MAGIC;
    p->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    p->max_workspace = 0;
    for (int i = 0; i < 4; i++) p->align[i] = 256; /* the documented default */
    *out = (cublasLtMatmulPreference_t)(void *)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    sim_pref *p = as_pref(pref);
    if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy", "bad");
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    static const char fn[] = "cublasLtMatmulPreferenceSetAttribute";
    sim_pref *p = as_pref(pref);
    if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "not a preference");
    if (!buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL buf");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: ATTR(p->search_mode, uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ATTR(p->max_workspace, uint64_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: ATTR(p->align[0], uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: ATTR(p->align[1], uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: ATTR(p->align[2], uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: ATTR(p->align[3], uint32_t); break;
    /* Filters that never exclude the one algorithm here: it uses no split-K
     * reduction, one wave, and plain FMA. */
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: ATTR_IGNORED(uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: ATTR_IGNORED(float); break;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: ATTR_IGNORED(uint64_t); break;
    default: return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "unknown attribute %d", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

#undef ATTR
#undef ATTR_FLAG
#undef ATTR_IGNORED

/* ---- the product ----------------------------------------------------------------------- */

/* How inputs are rounded before the multiply under the FAST compute types
 * (the header: "allows down-converting inputs"). */
enum { ROUND_NONE, ROUND_TF32, ROUND_F16, ROUND_BF16 };

/* One checked problem, in the terms of the computation. */
typedef struct {
    int64_t m, n, k, batch;
    const sim_layout *l[4]; /* A, B, C, D */
    bool ta, tb;            /* op(A) = A^T, op(B) = B^T */
    int compute, round;
    bool f64;        /* scale type (and accumulation) double, else f32 */
    bool bias, relu; /* epilogue */
    int bias_type;
    int64_t bias_stride;
    bool blas; /* BLAS rules: alpha == 0 reads neither A nor B */
} sim_problem;

/* Element (r, c) of a matrix of layout l, in elements from its start. */
static int64_t at(const sim_layout *l, int64_t r, int64_t c) {
    return l->order == CUBLASLT_ORDER_ROW ? r * l->ld + c : r + c * l->ld;
}

static double round_input(double v, int mode) {
    switch (mode) {
    case ROUND_TF32: {
        /* 10 explicit mantissa bits, to nearest with ties away from zero
         * (as cvt.rna.tf32.f32); inf and NaN unchanged. */
        uint32_t u = f32_bits((float)v);
        if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
        return bits_f32(u);
    }
    case ROUND_F16: return f16_to_f32(f32_to_f16((float)v));
    case ROUND_BF16: return bf16_to_f32(f32_to_bf16((float)v));
    default: return v;
    }
}

/* dst[i * K + p] = X(i, p), or X(p, i) when trans, for i < R and p < K: the
 * operand as rows of K contiguous values, so that every output element is
 * one contiguous dot product. */
static void pack(double *dst, const void *x, const sim_layout *l, bool trans, int64_t R, int64_t K,
                 int round) {
    for (int64_t i = 0; i < R; i++)
        for (int64_t p = 0; p < K; p++)
            dst[i * K + p] =
                round_input(load(x, l->type, trans ? at(l, p, i) : at(l, i, p)), round);
}

static const void *batch_ptr(const void *base, const sim_layout *l, int64_t b) {
    return (const char *)base + b * l->stride * (int64_t)type_size(l->type);
}

/* D = epilogue(alpha * op(A) op(B) + beta * C), batch by batch. The product
 * accumulates in double (exact for 16-bit inputs, closer than f32
 * accumulation otherwise); the accumulator is then converted to the scale
 * type, scaled, C and the bias added in that type, and the result rounded
 * once to D's type, which is the order the header describes ("Accumulator
 * and value from matrix C are typically converted to scale type before
 * final scaling. Value is then converted from scale type to type of matrix
 * D"). beta == 0 does not read C, so C may hold garbage, as in BLAS. */
static cublasStatus_t run(const sim_problem *pb, double alpha, double beta, const void *A,
                          const void *B, const void *C, void *D, const void *bias) {
    int64_t m = pb->m, n = pb->n, k = pb->k;
    bool product = k > 0 && !(pb->blas && alpha == 0);
    double *pa = NULL, *pbm = NULL;
    if (product && m > 0 && n > 0) {
        pa = malloc((size_t)(m * k) * sizeof *pa);
        pbm = malloc((size_t)(n * k) * sizeof *pbm);
        if (!pa || !pbm) {
            free(pa);
            free(pbm);
            return CUBLAS_STATUS_ALLOC_FAILED;
        }
    }
    const sim_layout *la = pb->l[0], *lb = pb->l[1], *lc = pb->l[2], *ld = pb->l[3];
    size_t bias_es = pb->bias ? type_size(pb->bias_type) : 0;
    for (int64_t b = 0; b < pb->batch; b++) {
        const void *a = batch_ptr(A, la, b), *bm = batch_ptr(B, lb, b);
        const void *c = C ? batch_ptr(C, lc, b) : NULL;
        void *d = (void *)batch_ptr(D, ld, b);
        const void *bv =
            pb->bias ? (const char *)bias + b * pb->bias_stride * (int64_t)bias_es : NULL;
        if (pa) {
            pack(pa, a, la, pb->ta, m, k, pb->round);    /* op(A): m rows of k */
            pack(pbm, bm, lb, !pb->tb, n, k, pb->round); /* op(B)^T: n rows of k */
        }
        for (int64_t j = 0; j < n; j++) {
            for (int64_t i = 0; i < m; i++) {
                double acc = 0;
                if (pa) {
                    const double *x = pa + i * k, *y = pbm + j * k;
                    for (int64_t p = 0; p < k; p++) acc += x[p] * y[p];
                }
                double v;
                if (pb->f64) {
                    v = product ? alpha * acc : 0.0;
                    if (beta != 0) v += beta * load(c, lc->type, at(lc, i, j));
                    if (bv) v += load(bv, pb->bias_type, i);
                    if (pb->relu) v = v > 0 ? v : 0.0;
                } else {
                    float f = product ? (float)alpha * (float)acc : 0.0f;
                    if (beta != 0) f += (float)beta * (float)load(c, lc->type, at(lc, i, j));
                    if (bv) f += (float)load(bv, pb->bias_type, i);
                    if (pb->relu) f = fmaxf(f, 0.0f);
                    v = f;
                }
                store(d, ld->type, at(ld, i, j), v);
            }
        }
    }
    free(pa);
    free(pbm);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt: checking a problem ---------------------------------------------------- */

static bool env_flag(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

/* One layout on its own: order, batch mode and leading dimension. */
static cublasStatus_t check_layout(const char *fn, const char *name, const sim_layout *l) {
    if (l->order != CUBLASLT_ORDER_COL && l->order != CUBLASLT_ORDER_ROW)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                      "%s: order %d (the tiled orders are for integer kernels)", name, l->order);
    if (l->batch_mode != CUBLASLT_BATCH_MODE_STRIDED)
        return not_simulated(fn, "%s: pointer-array batch mode", name);
    if (l->plane)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%s: plane offset on a real type", name);
    if (l->batch < 1)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s: batch count %d", name, l->batch);
    if (l->rows > INT64_MAX / 2 || l->cols > INT64_MAX / 2)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s: absurd size", name);
    /* "must be large enough so that matrix memory locations are not
     * overlapping (e.g. greater or equal to ROWS in case of ORDER_COL)" */
    uint64_t minor = l->order == CUBLASLT_ORDER_ROW ? l->cols : l->rows;
    if (l->ld < 1 || (uint64_t)l->ld < minor)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s: ld %lld < %s %llu", name,
                      (long long)l->ld, l->order == CUBLASLT_ORDER_ROW ? "cols" : "rows",
                      (unsigned long long)minor);
    return CUBLAS_STATUS_SUCCESS;
}

/* The bias dtype against D's. cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
 * "Bias vector elements are the same type as the elements of output matrix
 * (Dtype)", the exceptions being IMMA and fp8 kernels, none of which are
 * simulated; so a bias of another type has no algorithm. */
static cublasStatus_t check_bias_type(const char *fn, sim_problem *pb, int dtype) {
    if (pb->bias_type == dtype) return CUBLAS_STATUS_SUCCESS;
    if (!pb->f64 && env_flag("SIM_CUBLASLT_BIAS_ANY_FLOAT") &&
        (pb->bias_type == CUDA_R_32F || pb->bias_type == CUDA_R_16BF ||
         pb->bias_type == CUDA_R_16F))
        return CUBLAS_STATUS_SUCCESS;
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias of %s with D of %s",
                  type_name(pb->bias_type), type_name(dtype));
}

/* Everything about the problem that does not depend on the pointers: the
 * type combination (the cuBLAS guide's table of cublasLtMatmul data types,
 * rows for the regular float kernels), the shapes, the batch and the
 * epilogue. Shared by the heuristic and the product. */
static cublasStatus_t check_problem(const char *fn, const sim_desc *d, const sim_layout *A,
                                    const sim_layout *B, const sim_layout *C, const sim_layout *D,
                                    sim_problem *pb) {
    memset(pb, 0, sizeof *pb);
    cublasStatus_t st;
    const sim_layout *ls[4] = {A, B, C, D};
    static const char *names[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++) {
        pb->l[i] = ls[i];
        if ((st = check_layout(fn, names[i], ls[i])) != CUBLAS_STATUS_SUCCESS) return st;
    }
    if (d->fp8_only_set)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "scale/amax pointers or scale modes set on a non-fp8 problem");
    if (d->emulation_set) return not_simulated(fn, "emulation descriptor");

    /* types */
    int ta = A->type, tb = B->type, tc = C->type, td = D->type;
    pb->compute = d->compute;
    switch (d->compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
        if (d->scale != CUDA_R_32F)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute 32F with scale %s",
                          type_name(d->scale));
        if (ta == CUDA_R_8I && tb == CUDA_R_8I)
            return not_simulated(fn, "8-bit integer inputs with compute 32F");
        if (!(ta == tb && tc == td &&
              ((ta == CUDA_R_32F && tc == CUDA_R_32F) ||
               ((ta == CUDA_R_16BF || ta == CUDA_R_16F) && (tc == ta || tc == CUDA_R_32F)))))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                          "compute 32F with A %s, B %s, C %s, D %s", type_name(ta), type_name(tb),
                          type_name(tc), type_name(td));
        pb->round = ROUND_NONE;
        break;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
        if (d->scale != CUDA_R_32F)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "fast compute with scale %s",
                          type_name(d->scale));
        if (!(ta == CUDA_R_32F && tb == CUDA_R_32F && tc == CUDA_R_32F && td == CUDA_R_32F))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                          "fast compute type %d needs f32 A, B, C, D (A %s, B %s, C %s, D %s)",
                          d->compute, type_name(ta), type_name(tb), type_name(tc), type_name(td));
        /* The most lossy conversion each allows, so that a test tolerant
         * of it is tolerant of what the hardware picks. */
        pb->round = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32  ? ROUND_TF32
                    : d->compute == CUBLAS_COMPUTE_32F_FAST_16F ? ROUND_F16
                                                                : ROUND_BF16;
        break;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
        if (d->scale != CUDA_R_64F)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute 64F with scale %s",
                          type_name(d->scale));
        if (!(ta == CUDA_R_64F && tb == CUDA_R_64F && tc == CUDA_R_64F && td == CUDA_R_64F))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute 64F needs f64 matrices");
        pb->f64 = true;
        break;
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: return not_simulated(fn, "compute type %d", d->compute);
    default: return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute type %d", d->compute);
    }

    /* the operation */
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST &&
        d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
        return not_simulated(fn, "pointer mode %d (vector alpha)", d->pointer_mode);
    if (d->transc != CUBLAS_OP_N)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "TRANSC must be N");
    if (d->fill != CUBLAS_FILL_MODE_FULL)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "fill mode %d", d->fill);
    for (int i = 0; i < 2; i++) {
        int t = i ? d->transb : d->transa;
        if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "TRANS%c = %d", i ? 'B' : 'A', t);
    }
    pb->ta = d->transa != CUBLAS_OP_N; /* C is T for real types */
    pb->tb = d->transb != CUBLAS_OP_N;

    /* shapes: op(A) m x k, op(B) k x n, C and D m x n */
    int64_t m = (int64_t)(pb->ta ? A->cols : A->rows), ka = (int64_t)(pb->ta ? A->rows : A->cols);
    int64_t kb = (int64_t)(pb->tb ? B->cols : B->rows), n = (int64_t)(pb->tb ? B->rows : B->cols);
    if (ka != kb)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "op(A) is %lld x %lld but op(B) %lld x %lld",
                      (long long)m, (long long)ka, (long long)kb, (long long)n);
    for (int i = 2; i < 4; i++)
        if ((int64_t)ls[i]->rows != m || (int64_t)ls[i]->cols != n)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s is %llu x %llu, not %lld x %lld",
                          names[i], (unsigned long long)ls[i]->rows,
                          (unsigned long long)ls[i]->cols, (long long)m, (long long)n);
    /* One batch count for all four; a broadcast operand has stride 0. */
    for (int i = 0; i < 3; i++)
        if (ls[i]->batch != D->batch)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "batch count of %s is %d, D's %d",
                          names[i], ls[i]->batch, D->batch);
    /* The guide: out of place, C and D "must have the same data type, number
     * of rows, number of columns, batch size, and memory order" (ld may
     * differ); in place (C == D) the layouts must be the same, checked in
     * cublasLtMatmul where the pointers are known. */
    if (C->order != D->order)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "C and D differ in memory order");
    pb->m = m;
    pb->n = n;
    pb->k = ka;
    pb->batch = D->batch;

    /* epilogue */
    switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_RELU: pb->relu = true; break;
    case CUBLASLT_EPILOGUE_BIAS: pb->bias = true; break;
    case CUBLASLT_EPILOGUE_RELU_BIAS: pb->bias = pb->relu = true; break;
    default: return not_simulated(fn, "epilogue %u", d->epilogue);
    }
    if (pb->bias) {
        pb->bias_type = d->bias_type == -1 ? td : d->bias_type;
        if ((st = check_bias_type(fn, pb, td)) != CUBLAS_STATUS_SUCCESS) return st;
        pb->bias_stride = d->bias_stride;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt: heuristic and product -------------------------------------------------- */

/* The pointer alignment the one algorithm relies on, from what the caller
 * promised: the largest power of two up to 16 bytes (a 128-bit vector load)
 * that the promise covers. A promise below one element has no algorithm. */
static uint32_t needed_alignment(uint32_t promised, size_t es) {
    uint32_t need = 16;
    while (need > promised && need > 1) need >>= 1;
    return need < es ? 0 : need;
}

cublasStatus_t
cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                               cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                               cublasLtMatmulPreference_t preference, int requested,
                               cublasLtMatmulHeuristicResult_t results[], int *returned) {
    static const char fn[] = "cublasLtMatmulAlgoGetHeuristic";
    if (!lt_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (returned) *returned = 0;
    sim_desc *d = as_desc(desc);
    sim_layout *A = as_layout(Adesc), *B = as_layout(Bdesc), *C = as_layout(Cdesc),
               *D = as_layout(Ddesc);
    sim_pref *p = as_pref(preference);
    if (!d || !A || !B || !C || !D || !p || !results || !returned)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL or invalid descriptor");
    if (requested <= 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "requested %d", requested);
    if (p->search_mode != CUBLASLT_SEARCH_BEST_FIT)
        return not_simulated(fn, "search mode %u", p->search_mode);
    sim_problem pb;
    cublasStatus_t st = check_problem(fn, d, A, B, C, D, &pb);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    /* cuBLASLt 13 on an H100 answered INVALID_VALUE (not NOT_SUPPORTED) to
     * BIAS epilogues of small linears; which ones is not documented, so the
     * caller's way around it is tested by refusing them all on request. */
    if (pb.bias && env_flag("FSDP_CUDASIM_LT_REFUSE_BIAS"))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "BIAS epilogue refused (FSDP_CUDASIM_LT_REFUSE_BIAS)");
    sim_algo algo;
    memset(&algo, 0, sizeof algo);
    algo.magic = ALGO_MAGIC;
    algo.compute = d->compute;
    const sim_layout *ls[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) {
        algo.types[i] = ls[i]->type;
        algo.need_align[i] = needed_alignment(p->align[i], type_size(ls[i]->type));
        if (!algo.need_align[i])
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                          "matrix %c promised only %u-byte alignment for %zu-byte elements",
                          "ABCD"[i], p -> align[i], type_size(ls[i]->type));
    }
    memset(&results[0], 0, sizeof results[0]);
    memcpy(&results[0].algo, &algo, sizeof algo);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* Whether every matrix of a batch starts on a multiple of `align` bytes. */
static bool batch_aligned(const void *base, const sim_layout *l, int64_t batch, uint32_t align) {
    uintptr_t bits = (uintptr_t)base;
    if (batch > 1) bits |= (uintptr_t)(l->stride * (int64_t)type_size(l->type));
    return (bits & (align - 1)) == 0;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    static const char fn[] = "cublasLtMatmul";
    (void)workspace;
    (void)workspace_bytes; /* the algorithm needs none */
    if (!lt_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    sim_desc *d = as_desc(desc);
    sim_layout *la = as_layout(Adesc), *lb = as_layout(Bdesc), *lc = as_layout(Cdesc),
               *ld = as_layout(Ddesc);
    if (!d || !la || !lb || !lc || !ld)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL or invalid descriptor");
    sim_problem pb;
    cublasStatus_t st = check_problem(fn, d, la, lb, lc, ld, &pb);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL alpha or beta");
    /* Host and device pointers read alike: device memory is host memory. */
    double a = pb.f64 ? *(const double *)alpha : *(const float *)alpha;
    double b = pb.f64 ? *(const double *)beta : *(const float *)beta;

    const void *ptrs[4] = {A, B, C, D};
    const sim_layout *ls[4] = {la, lb, lc, ld};
    bool used[4] = {pb.m > 0 && pb.k > 0, pb.n > 0 && pb.k > 0, b != 0 && pb.m > 0 && pb.n > 0,
                    pb.m > 0 && pb.n > 0};
    for (int i = 0; i < 4; i++)
        if (used[i] && !ptrs[i])
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "matrix %c is NULL", "ABCD"[i]);

    /* In place needs the same layout for C and D; out of place, the same
     * type, shape, batch and order (checked with the problem). */
    if (C == D && C && (lc->ld != ld->ld || (pb.batch > 1 && lc->stride != ld->stride)))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "C == D with different layouts (ld %lld vs %lld, stride %lld vs %lld)",
                      (long long)lc->ld, (long long)ld->ld, (long long)lc->stride,
                      (long long)ld->stride);

    /* The algorithm: one from the heuristic for this problem, whose
     * alignment assumptions the pointers must meet (a kernel built on
     * vector loads would fault or misread otherwise); NULL runs the implicit
     * heuristic, which sees the pointers and needs only whole elements. */
    uint32_t need[4];
    if (algo) {
        sim_algo al;
        memcpy(&al, algo, sizeof al);
        if (al.magic != ALGO_MAGIC)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "algo not from the heuristic");
        if (al.compute != d->compute)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "algo chosen for another compute type");
        for (int i = 0; i < 4; i++) {
            if (al.types[i] != ls[i]->type)
                return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "algo chosen for another %c type",
                              "ABCD"[i]);
            need[i] = al.need_align[i];
        }
    } else {
        for (int i = 0; i < 4; i++) need[i] = (uint32_t)type_size(ls[i]->type);
    }
    for (int i = 0; i < 4; i++)
        if (used[i] && !batch_aligned(ptrs[i], ls[i], pb.batch, need[i]))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                          "matrix %c (or one of its batch) is not %u-byte aligned as the "
                          "algorithm assumes",
                          "ABCD"[i], need[i]);

    const void *bias = pb.bias ? d->bias : NULL;
    if (pb.bias && pb.m > 0 && pb.n > 0) {
        /* "Bias vector length must match matrix D rows, it must be packed" */
        if (!bias) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "BIAS epilogue without a bias");
        size_t es = type_size(pb.bias_type);
        if (((uintptr_t)bias | (uintptr_t)(pb.batch > 1 ? pb.bias_stride * (int64_t)es : 0)) % es)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "bias not aligned to its elements");
    }
    if (pb.m == 0 || pb.n == 0) return CUBLAS_STATUS_SUCCESS;
    if ((st = on_stream(fn, stream)) != CUBLAS_STATUS_SUCCESS) return st;
    return run(&pb, a, b, A, B, b != 0 ? C : NULL, D, bias);
}

/* ---- cuBLAS: the f64 product --------------------------------------------------------- */

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    if (!h) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "NULL handle pointer");
    struct cublasContext *c = calloc(1, sizeof *c);
    if (!c) return CUBLAS_STATUS_ALLOC_FAILED;
    c->magic = BLAS_MAGIC;
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!h || h->magic != BLAS_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream) {
    if (!h || h->magic != BLAS_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *stream) {
    if (!h || h->magic != BLAS_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* C[i] = alpha op(A[i]) op(B[i]) + beta C[i], column-major, with the BLAS
 * argument checks (the guide, cublas<t>gemm: INVALID_VALUE "if m, n, k < 0"
 * or a leading dimension below max(1, rows of the stored matrix)) and the
 * BLAS special cases: beta == 0 does not read C, alpha == 0 reads neither A
 * nor B. */
static cublasStatus_t dgemm_strided(cublasHandle_t h, cublasOperation_t transa,
                                    cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                                    const double *alpha, const double *A, int64_t lda, long long sa,
                                    const double *B, int64_t ldb, long long sb, const double *beta,
                                    double *C, int64_t ldc, long long sc, int64_t batch) {
    static const char fn[] = "cublasDgemmStridedBatched";
    if (!h || h->magic != BLAS_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T && transa != CUBLAS_OP_C) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T && transb != CUBLAS_OP_C))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "transa %d, transb %d", transa, transb);
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "m %lld, n %lld, k %lld, batch %lld",
                      (long long)m, (long long)n, (long long)k, (long long)batch);
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    int64_t arows = ta ? k : m, brows = tb ? n : k;
    if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "lda %lld (A has %lld rows), ldb %lld (B has %lld rows), ldc %lld (m %lld)",
                      (long long)lda, (long long)arows, (long long)ldb, (long long)brows,
                      (long long)ldc, (long long)m);
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL alpha or beta");
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    if ((*alpha == 0 || k == 0) && *beta == 1) return CUBLAS_STATUS_SUCCESS;
    bool product = *alpha != 0 && k > 0;
    if (!C || (product && (!A || !B)))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL matrix");
    if (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) % sizeof(double))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "matrix not aligned to its elements");

    sim_layout la = {LAYOUT_MAGIC,
                     CUDA_R_64F,
                     CUBLASLT_ORDER_COL,
                     1,
                     0,
                     (uint64_t)arows,
                     (uint64_t)(ta ? m : k),
                     lda,
                     sa,
                     0};
    sim_layout lb = {LAYOUT_MAGIC,
                     CUDA_R_64F,
                     CUBLASLT_ORDER_COL,
                     1,
                     0,
                     (uint64_t)brows,
                     (uint64_t)(tb ? k : n),
                     ldb,
                     sb,
                     0};
    sim_layout lc = {
        LAYOUT_MAGIC, CUDA_R_64F, CUBLASLT_ORDER_COL, 1, 0, (uint64_t)m, (uint64_t)n, ldc, sc, 0};
    sim_problem pb;
    memset(&pb, 0, sizeof pb);
    pb.m = m;
    pb.n = n;
    pb.k = k;
    pb.batch = batch;
    pb.l[0] = &la;
    pb.l[1] = &lb;
    pb.l[2] = pb.l[3] = &lc;
    pb.ta = ta;
    pb.tb = tb;
    pb.compute = CUBLAS_COMPUTE_64F;
    pb.f64 = true;
    pb.blas = true;
    cublasStatus_t st = on_stream(fn, h->stream);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    return run(&pb, *alpha, *beta, A, B, *beta != 0 ? C : NULL, C, NULL);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t h, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double *alpha, const double *A, int lda,
                                         long long int sa, const double *B, int ldb,
                                         long long int sb, const double *beta, double *C, int ldc,
                                         long long int sc, int batch) {
    return dgemm_strided(h, transa, transb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc,
                         sc, batch);
}

cublasStatus_t cublasDgemmStridedBatched_64(cublasHandle_t h, cublasOperation_t transa,
                                            cublasOperation_t transb, int64_t m, int64_t n,
                                            int64_t k, const double *alpha, const double *A,
                                            int64_t lda, long long int sa, const double *B,
                                            int64_t ldb, long long int sb, const double *beta,
                                            double *C, int64_t ldc, long long int sc,
                                            int64_t batch) {
    return dgemm_strided(h, transa, transb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc,
                         sc, batch);
}
