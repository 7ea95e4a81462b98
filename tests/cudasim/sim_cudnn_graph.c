/*
 * sim_cudnn_graph.c: a host implementation of cuDNN 9's graph (backend)
 * API for cudasim, covering the descriptors that the scaled-dot-product
 * attention graphs of cudnn-frontend (sdpa, sdpa_backward) are made of:
 * tensors, pointwise, matmul, reduction and reshape operations, the
 * operation graph, heuristics, engine, engine config, knob choice,
 * execution plan and variant pack. As in sim_cudnn.c, "device memory" is
 * host memory and the work is done when cudnnBackendExecute returns.
 *
 * What is modelled, from the documented semantics:
 * - Every attribute is checked for its documented attribute type and
 *   element count on Set (CUDNN_STATUS_BAD_PARAM otherwise, and
 *   cudnnGetLastErrorString names the attribute); setting a finalized
 *   descriptor is CUDNN_STATUS_NOT_INITIALIZED, reading an unfinalized one
 *   too; descriptor-valued attributes must be finalized descriptors of the
 *   documented type. Attributes, descriptor types, modes and data types
 *   this file does not model are CUDNN_STATUS_NOT_SUPPORTED, never ignored.
 * - Finalize checks that every required attribute is present (the list
 *   per descriptor is in a comment at the top of each finalize case) and
 *   that shapes agree:
 *   tensors have 1..8 positive dims and as many strides; pointwise inputs
 *   have the output's rank and each dim equal to the output's or 1;
 *   matmul is A[..,M,K] x B[..,K,N] = C[..,M,N] with batch dims of A and
 *   B equal to C's, 1 (broadcast) or dividing C's (grouped: A's batch
 *   index is C's / (C's dim / A's), the "b (hk g)" grouping of
 *   cudnn-frontend's grouped-query attention); a reduction's output dims
 *   are the input's, 1 (reduced) or divide the input's (consecutive groups
 *   summed: the frontend's dK/dV head reduction); a reshape's output
 *   covers the same element offsets as its input (a view: dims and strides
 *   permuted together, or both dense) and may change the data type. The
 *   operation graph identifies tensors by unique id: descriptors sharing
 *   an id must describe the same tensor, an id is produced by at most one
 *   operation, virtual tensors must be produced inside the graph, by-value
 *   tensors must not be outputs, and the graph must be acyclic.
 * - Execute interprets the graph on the host in a topological order:
 *   virtual tensors get host buffers of their declared data type (so a
 *   bf16 virtual tensor is rounded as on the GPU), all reads and writes go
 *   through each tensor's strides, size-1 dims broadcast, arithmetic is
 *   f32 (matmul accumulates in f32 over k in order), stores to f16/bf16
 *   round to nearest even (sim_half.h). By-value tensors are read from the
 *   variant pack pointer as a host scalar of their data type. Pointers of
 *   non-virtual tensors must satisfy the tensor's byte alignment.
 * - Pointwise y = op(alpha1 * x, alpha2 * b) (alphas default 1), math
 *   precision FLOAT (INT32 or BOOLEAN also for GEN_INDEX, CMP_*, LOGICAL_*,
 *   as the frontend's masks set it);
 *   BINARY_SELECT y = t ? x : b (t non-zero: x, as cudnn-frontend's causal
 *   and padding masks use it: x = scores, b = -inf, t = keep-mask);
 *   GEN_INDEX y = the index of the element along CUDNN_ATTR_POINTWISE_AXIS
 *   of the output (x only gives the shape); CMP_* and LOGICAL_* give 1 or 0.
 * - Reshape: y's element at each index is x's element at the same memory
 *   offset under y's strides (so permuted strides transpose), converted to
 *   y's data type.
 * - Heuristics return one engine (global index 0, no knobs, no notes) for
 *   every finalized graph; the execution plan needs no workspace (size 0).
 *
 * Not modelled (refused with CUDNN_STATUS_NOT_SUPPORTED): every other
 * descriptor type (convolution, normalisation, RNG/dropout, the fused
 * SDPA_FWD/SDPA_BWD operations, ...), matmul GEMM M/N/K override tensors
 * and padding value, dynamic shapes, variant pack intermediates,
 * vectorised or reordered tensors, non-NONE tensor reordering, ragged
 * offsets, kernel caches, device properties, serialisation, and the
 * fused-attention engine's own restrictions (head dim limits etc.: this
 * simulation runs any graph it can interpret, so a graph the real engine
 * would reject for its shape can pass here).
 *
 * FSDP_CUDASIM_CUDNN_VERBOSE=1 also prints each error message on stderr
 * as it happens (cudnnGetLastErrorString returns the last one).
 *
 * Build: gcc -std=c11 -O2 -fPIC -I/usr/local/cuda/include -c sim_cudnn_graph.c
 */

#include <cudnn.h>

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_half.h"

#define MAXD 8 /* CUDNN_DIM_MAX */

/* --------------------------------------------------------------- errors */

static _Thread_local char last_error[512];

static cudnnStatus_t fail(cudnnStatus_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudnnStatus_t fail(cudnnStatus_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (getenv("FSDP_CUDASIM_CUDNN_VERBOSE")) fprintf(stderr, "sim cudnn graph: %s\n", last_error);
    return st;
}

/* The headers' version, or FSDP_CUDASIM_CUDNN_VERSION's: the backend's
 * version rules (cuda_sdpa.cu) for an older library are tested with it. */
size_t cudnnGetVersion(void) {
    const char *v = getenv("FSDP_CUDASIM_CUDNN_VERSION");
    return v && *v ? (size_t)strtoull(v, NULL, 10) : CUDNN_VERSION;
}

/* The message of the last error of this thread, then cleared. */
void cudnnGetLastErrorString(char *message, size_t max_size) {
    if (!message || max_size == 0) return;
    snprintf(message, max_size, "%s", last_error);
    last_error[0] = '\0';
}

/* --------------------------------------------------------------- values */

typedef struct {
    int64_t uid;
    cudnnDataType_t dtype;
    int nd;
    int64_t dim[MAXD], str[MAXD];
    int64_t align;
    int is_virtual, by_value;
} tensor_t;

typedef struct {
    cudnnPointwiseMode_t mode;
    cudnnDataType_t prec;
    int64_t axis;
    int has_axis;
} pw_t;

typedef struct {
    cudnnDataType_t comp;
} mm_t;

typedef struct {
    cudnnReduceTensorOp_t op;
    cudnnDataType_t comp;
} red_t;

enum { OP_PW, OP_MM, OP_RED, OP_RESHAPE };

/* One operation as the graph keeps it: in[] is x, b, t (pointwise), a, b
 * (matmul) or x (reduction, reshape). */
typedef struct {
    int kind;
    int nin;
    tensor_t in[3], out;
    pw_t pw;
    mm_t mm;
    red_t red;
    float alpha1, alpha2;
} op_t;

/* A finalized operation graph's contents, shared (reference counted) by
 * the descriptors made from it, so descriptors can be destroyed in any
 * order. */
typedef struct {
    int refs;
    int nops;
    op_t *ops;
    int *order; /* topological order of ops */
} graph_t;

static void graph_release(graph_t *g) {
    if (g && --g->refs == 0) {
        free(g->ops);
        free(g->order);
        free(g);
    }
}

static graph_t *graph_retain(graph_t *g) {
    if (g) g->refs++;
    return g;
}

/* ---------------------------------------------------------- descriptors */

#define DESC_MAGIC 0x5ce9a9d1u

/* Attribute slots remembered as "set" (a bit each). */
enum {
    S_T_DTYPE, S_T_DIMS, S_T_STRIDES, S_T_UID, S_T_ALIGN,
    S_PW_MODE, S_PW_PREC,
    S_MM_COMP,
    S_RED_OP, S_RED_COMP,
    S_X, S_B, S_Y, S_T, S_DESC,
    S_OPS, S_HANDLE,
    S_GRAPH, S_MODE, S_ENGINE, S_INDEX, S_CFG,
    S_VP_UIDS, S_VP_PTRS, S_VP_WS,
    S_KNOB_TYPE, S_KNOB_VALUE,
};
#define HAS(d, s) (((d)->set >> (s)) & 1u)

typedef struct desc {
    uint32_t magic;
    cudnnBackendDescriptorType_t type;
    int finalized;
    uint64_t set;
    /* TENSOR */
    tensor_t t;
    int64_t vector_count, vector_dim;
    /* POINTWISE, MATMUL, REDUCTION */
    pw_t pw;
    mm_t mm;
    red_t red;
    /* OPERATION_*: tensors (copied at Set) and the operator descriptor */
    tensor_t x, b, y, tt;
    float alpha1, alpha2;
    /* OPERATIONGRAPH: the ops as set, then the finalized graph */
    int nops;
    op_t *ops;
    cudnnHandle_t handle;
    /* OPERATIONGRAPH, ENGINEHEUR, ENGINE, ENGINECFG, EXECUTION_PLAN */
    graph_t *graph;
    cudnnBackendHeurMode_t heur_mode;
    int64_t index;
    /* VARIANT_PACK */
    int64_t nvp, nvp_ptrs;
    int64_t *vp_uids;
    void **vp_ptrs;
    void *workspace;
    /* KNOB_CHOICE */
    cudnnBackendKnobType_t knob_type;
    int64_t knob_value;
} desc_t;

static const char *type_name(cudnnBackendDescriptorType_t t) {
    switch (t) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "POINTWISE";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return "KNOB_CHOICE";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "OPERATION_POINTWISE";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: return "MATMUL";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "OPERATION_MATMUL";
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: return "REDUCTION";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "OPERATION_REDUCTION";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "OPERATION_RESHAPE";
    default: return "?";
    }
}

static desc_t *as_desc(cudnnBackendDescriptor_t p) {
    desc_t *d = (desc_t *)p;
    return d && d->magic == DESC_MAGIC ? d : NULL;
}

static void reset(desc_t *d) {
    cudnnBackendDescriptorType_t type = d->type;
    free(d->ops);
    graph_release(d->graph);
    free(d->vp_uids);
    free(d->vp_ptrs);
    memset(d, 0, sizeof *d);
    d->magic = DESC_MAGIC;
    d->type = type;
    d->t.align = 0;
    d->vector_count = 1;
    d->vector_dim = -1;
    d->alpha1 = d->alpha2 = 1.0f;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t *descriptor) {
    if (!descriptor) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendCreateDescriptor: descriptor is NULL");
    switch (descriptorType) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: break;
    default:
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "cudnnBackendCreateDescriptor: descriptor type %d is not modelled by the simulation",
                    (int)descriptorType);
    }
    desc_t *d = calloc(1, sizeof *d);
    if (!d) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    d->type = descriptorType;
    reset(d);
    *descriptor = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
    desc_t *d = as_desc(descriptor);
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: not a backend descriptor");
    reset(d);
    d->magic = 0;
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

/* Deprecated in cuDNN 9: puts the descriptor back in its created state. */
cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor) {
    desc_t *d = as_desc(descriptor);
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendInitialize: not a backend descriptor");
    reset(d);
    return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------ data types */

static size_t dtype_size(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: return 4;
    case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_HALF: return 2;
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_INT64: return 8;
    case CUDNN_DATA_BOOLEAN: return 1;
    default: return 0; /* not modelled */
    }
}

static const char *dtype_name(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: return "FLOAT";
    case CUDNN_DATA_DOUBLE: return "DOUBLE";
    case CUDNN_DATA_HALF: return "HALF";
    case CUDNN_DATA_BFLOAT16: return "BFLOAT16";
    case CUDNN_DATA_INT32: return "INT32";
    case CUDNN_DATA_INT64: return "INT64";
    case CUDNN_DATA_BOOLEAN: return "BOOLEAN";
    default: return "unmodelled";
    }
}

static float load(const void *p, int64_t i, cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: return ((const float *)p)[i];
    case CUDNN_DATA_DOUBLE: return (float)((const double *)p)[i];
    case CUDNN_DATA_HALF: return f16_to_f32(((const uint16_t *)p)[i]);
    case CUDNN_DATA_BFLOAT16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case CUDNN_DATA_INT32: return (float)((const int32_t *)p)[i];
    case CUDNN_DATA_INT64: return (float)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f; /* BOOLEAN */
    }
}

static void store(void *p, int64_t i, cudnnDataType_t t, float v) {
    switch (t) {
    case CUDNN_DATA_FLOAT: ((float *)p)[i] = v; break;
    case CUDNN_DATA_DOUBLE: ((double *)p)[i] = v; break;
    case CUDNN_DATA_HALF: ((uint16_t *)p)[i] = f32_to_f16(v); break;
    case CUDNN_DATA_BFLOAT16: ((uint16_t *)p)[i] = f32_to_bf16(v); break;
    /* Integers: truncation toward zero, as a C conversion (the values
     * written here are indices and comparison results, exact). */
    case CUDNN_DATA_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case CUDNN_DATA_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: ((uint8_t *)p)[i] = v != 0.0f; break; /* BOOLEAN */
    }
}

/* ------------------------------------------------------------ attributes */

static const char *attr_name(cudnnBackendAttributeName_t a) {
    switch (a) {
#define A(n)                                                                                       \
    case n: return #n;
        A(CUDNN_ATTR_POINTWISE_MODE) A(CUDNN_ATTR_POINTWISE_MATH_PREC) A(CUDNN_ATTR_POINTWISE_AXIS)
        A(CUDNN_ATTR_POINTWISE_NAN_PROPAGATION) A(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP)
        A(CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP) A(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE)
        A(CUDNN_ATTR_POINTWISE_ELU_ALPHA) A(CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA)
        A(CUDNN_ATTR_POINTWISE_SWISH_BETA)
        A(CUDNN_ATTR_ENGINEHEUR_MODE) A(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)
        A(CUDNN_ATTR_ENGINEHEUR_RESULTS) A(CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET)
        A(CUDNN_ATTR_ENGINECFG_ENGINE) A(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES)
        A(CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) A(CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO)
        A(CUDNN_ATTR_EXECUTION_PLAN_HANDLE) A(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)
        A(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)
        A(CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS)
        A(CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS)
        A(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE) A(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)
        A(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR) A(CUDNN_ATTR_OPERATION_POINTWISE_XDESC)
        A(CUDNN_ATTR_OPERATION_POINTWISE_BDESC) A(CUDNN_ATTR_OPERATION_POINTWISE_YDESC)
        A(CUDNN_ATTR_OPERATION_POINTWISE_TDESC) A(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1)
        A(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2) A(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC)
        A(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC)
        A(CUDNN_ATTR_OPERATIONGRAPH_HANDLE) A(CUDNN_ATTR_OPERATIONGRAPH_OPS)
        A(CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)
        A(CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED)
        A(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT) A(CUDNN_ATTR_TENSOR_DATA_TYPE)
        A(CUDNN_ATTR_TENSOR_DIMENSIONS) A(CUDNN_ATTR_TENSOR_STRIDES)
        A(CUDNN_ATTR_TENSOR_VECTOR_COUNT) A(CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION)
        A(CUDNN_ATTR_TENSOR_UNIQUE_ID) A(CUDNN_ATTR_TENSOR_IS_VIRTUAL)
        A(CUDNN_ATTR_TENSOR_IS_BY_VALUE) A(CUDNN_ATTR_TENSOR_REORDERING_MODE)
        A(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) A(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)
        A(CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES) A(CUDNN_ATTR_VARIANT_PACK_WORKSPACE)
        A(CUDNN_ATTR_ENGINE_OPERATION_GRAPH) A(CUDNN_ATTR_ENGINE_GLOBAL_INDEX)
        A(CUDNN_ATTR_ENGINE_KNOB_INFO) A(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE)
        A(CUDNN_ATTR_ENGINE_LAYOUT_INFO) A(CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE)
        A(CUDNN_ATTR_ENGINE_SM_COUNT_TARGET)
        A(CUDNN_ATTR_MATMUL_COMP_TYPE) A(CUDNN_ATTR_MATMUL_PADDING_VALUE)
        A(CUDNN_ATTR_OPERATION_MATMUL_ADESC) A(CUDNN_ATTR_OPERATION_MATMUL_BDESC)
        A(CUDNN_ATTR_OPERATION_MATMUL_CDESC) A(CUDNN_ATTR_OPERATION_MATMUL_DESC)
        A(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC)
        A(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC)
        A(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC)
        A(CUDNN_ATTR_REDUCTION_OPERATOR) A(CUDNN_ATTR_REDUCTION_COMP_TYPE)
        A(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC)
        A(CUDNN_ATTR_OPERATION_REDUCTION_XDESC) A(CUDNN_ATTR_OPERATION_REDUCTION_YDESC)
        A(CUDNN_ATTR_OPERATION_REDUCTION_DESC)
        A(CUDNN_ATTR_OPERATION_RESHAPE_XDESC) A(CUDNN_ATTR_OPERATION_RESHAPE_YDESC)
#undef A
    default: return "an attribute";
    }
}

/* The attribute's type and element count against the documented ones:
 * exactly `count` elements, or between lo and hi for arrays. */
static cudnnStatus_t expect(const desc_t *d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t got,
                            cudnnBackendAttributeType_t want, int64_t n, int64_t lo, int64_t hi,
                            const void *arr) {
    if (got != want)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, %s): attribute type %d, expected %d",
                    type_name(d->type), attr_name(a), (int)got, (int)want);
    if (n < lo || n > hi) {
        if (lo == hi)
            return fail(CUDNN_STATUS_BAD_PARAM,
                        "cudnnBackendSetAttribute(%s, %s): element count %lld, expected %lld",
                        type_name(d->type), attr_name(a), (long long)n, (long long)lo);
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "cudnnBackendSetAttribute(%s, %s): element count %lld, expected %lld to %lld",
                    type_name(d->type), attr_name(a), (long long)n, (long long)lo, (long long)hi);
    }
    if (n > 0 && !arr)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, %s): arrayOfElements is NULL",
                    type_name(d->type), attr_name(a));
    return CUDNN_STATUS_SUCCESS;
}

#define EXPECT(want, lo, hi)                                                                       \
    do {                                                                                           \
        cudnnStatus_t st_ = expect(d, a, type, want, n, lo, hi, arr);                              \
        if (st_ != CUDNN_STATUS_SUCCESS) return st_;                                               \
    } while (0)

/* A descriptor-valued attribute: one finalized descriptor of type `want`. */
static cudnnStatus_t get_ref(const desc_t *d, cudnnBackendAttributeName_t a, const void *arr,
                             cudnnBackendDescriptorType_t want, desc_t **out) {
    desc_t *r = as_desc(((cudnnBackendDescriptor_t const *)arr)[0]);
    if (!r)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, %s): not a backend descriptor",
                    type_name(d->type), attr_name(a));
    if (r->type != want)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, %s): a %s descriptor, expected %s",
                    type_name(d->type), attr_name(a), type_name(r->type), type_name(want));
    if (!r->finalized)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute(%s, %s): the %s descriptor is not finalized",
                    type_name(d->type), attr_name(a), type_name(r->type));
    *out = r;
    return CUDNN_STATUS_SUCCESS;
}

#define REF(want, var)                                                                             \
    do {                                                                                           \
        cudnnStatus_t st_ = get_ref(d, a, arr, want, &var);                                        \
        if (st_ != CUDNN_STATUS_SUCCESS) return st_;                                               \
    } while (0)

static int supported_pw_mode(cudnnPointwiseMode_t m) {
    switch (m) {
    case CUDNN_POINTWISE_ADD: case CUDNN_POINTWISE_SUB: case CUDNN_POINTWISE_MUL:
    case CUDNN_POINTWISE_DIV: case CUDNN_POINTWISE_MAX: case CUDNN_POINTWISE_MIN:
    case CUDNN_POINTWISE_EXP: case CUDNN_POINTWISE_LOG: case CUDNN_POINTWISE_NEG:
    case CUDNN_POINTWISE_ABS: case CUDNN_POINTWISE_SQRT: case CUDNN_POINTWISE_RSQRT:
    case CUDNN_POINTWISE_RECIPROCAL: case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ: case CUDNN_POINTWISE_CMP_GT:
    case CUDNN_POINTWISE_CMP_GE: case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE:
    case CUDNN_POINTWISE_LOGICAL_AND: case CUDNN_POINTWISE_LOGICAL_OR:
    case CUDNN_POINTWISE_LOGICAL_NOT: case CUDNN_POINTWISE_GEN_INDEX:
    case CUDNN_POINTWISE_BINARY_SELECT: return 1;
    default: return 0;
    }
}

static int pw_is_compare_or_logical(cudnnPointwiseMode_t m) {
    switch (m) {
    case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ: case CUDNN_POINTWISE_CMP_GT:
    case CUDNN_POINTWISE_CMP_GE: case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE:
    case CUDNN_POINTWISE_LOGICAL_AND: case CUDNN_POINTWISE_LOGICAL_OR:
    case CUDNN_POINTWISE_LOGICAL_NOT: return 1;
    default: return 0;
    }
}

/* Inputs of a pointwise mode: 1 (x), 2 (x, b) or 3 (x, b, t). */
static int pw_inputs(cudnnPointwiseMode_t m) {
    switch (m) {
    case CUDNN_POINTWISE_ADD: case CUDNN_POINTWISE_SUB: case CUDNN_POINTWISE_MUL:
    case CUDNN_POINTWISE_DIV: case CUDNN_POINTWISE_MAX: case CUDNN_POINTWISE_MIN:
    case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ: case CUDNN_POINTWISE_CMP_GT:
    case CUDNN_POINTWISE_CMP_GE: case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE:
    case CUDNN_POINTWISE_LOGICAL_AND: case CUDNN_POINTWISE_LOGICAL_OR: return 2;
    case CUDNN_POINTWISE_BINARY_SELECT: return 3;
    default: return 1;
    }
}

static cudnnStatus_t set_float_scalar(desc_t *d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t type,
                                      int64_t n, const void *arr, float *out) {
    if (type == CUDNN_TYPE_FLOAT) {
        EXPECT(CUDNN_TYPE_FLOAT, 1, 1);
        *out = *(const float *)arr;
    } else {
        EXPECT(CUDNN_TYPE_DOUBLE, 1, 1);
        *out = (float)*(const double *)arr;
    }
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t unsupported_attr(const desc_t *d, cudnnBackendAttributeName_t a, const char *what) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackend%sAttribute(%s, %s (%d)): not modelled by the simulation",
                what, type_name(d->type), attr_name(a), (int)a);
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t elementCount, const void *arrayOfElements) {
    desc_t *d = as_desc(descriptor);
    cudnnBackendAttributeName_t a = attributeName;
    cudnnBackendAttributeType_t type = attributeType;
    int64_t n = elementCount;
    const void *arr = arrayOfElements;
    desc_t *r = NULL;
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: not a backend descriptor");
    if (d->finalized)
        return fail(CUDNN_STATUS_NOT_INITIALIZED, "cudnnBackendSetAttribute(%s, %s): the descriptor is finalized",
                    type_name(d->type), attr_name(a));

    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_TENSOR_DATA_TYPE:
            EXPECT(CUDNN_TYPE_DATA_TYPE, 1, 1);
            d->t.dtype = *(const cudnnDataType_t *)arr;
            if (!dtype_size(d->t.dtype))
                return fail(CUDNN_STATUS_NOT_SUPPORTED, "TENSOR data type %d is not modelled", (int)d->t.dtype);
            d->set |= 1u << S_T_DTYPE;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_DIMENSIONS:
        case CUDNN_ATTR_TENSOR_STRIDES:
            EXPECT(CUDNN_TYPE_INT64, 1, MAXD);
            if (a == CUDNN_ATTR_TENSOR_DIMENSIONS) {
                memcpy(d->t.dim, arr, (size_t)n * sizeof(int64_t));
                d->t.nd = (int)n;
                d->set |= 1u << S_T_DIMS;
            } else {
                memcpy(d->t.str, arr, (size_t)n * sizeof(int64_t));
                d->x.nd = (int)n; /* the strides' count, compared at finalize */
                d->set |= 1u << S_T_STRIDES;
            }
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_UNIQUE_ID:
            EXPECT(CUDNN_TYPE_INT64, 1, 1);
            d->t.uid = *(const int64_t *)arr;
            d->set |= 1u << S_T_UID;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
            EXPECT(CUDNN_TYPE_INT64, 1, 1);
            d->t.align = *(const int64_t *)arr;
            d->set |= 1u << S_T_ALIGN;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
        case CUDNN_ATTR_TENSOR_IS_BY_VALUE:
            EXPECT(CUDNN_TYPE_BOOLEAN, 1, 1);
            if (a == CUDNN_ATTR_TENSOR_IS_VIRTUAL) d->t.is_virtual = *(const bool *)arr;
            else d->t.by_value = *(const bool *)arr;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_VECTOR_COUNT:
        case CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION:
            EXPECT(CUDNN_TYPE_INT64, 1, 1);
            if (a == CUDNN_ATTR_TENSOR_VECTOR_COUNT) d->vector_count = *(const int64_t *)arr;
            else d->vector_dim = *(const int64_t *)arr;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_REORDERING_MODE:
            EXPECT(CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, 1);
            if (*(const cudnnBackendTensorReordering_t *)arr != CUDNN_TENSOR_REORDERING_NONE)
                return fail(CUDNN_STATUS_NOT_SUPPORTED, "TENSOR reordering mode %d is not modelled",
                            (int)*(const cudnnBackendTensorReordering_t *)arr);
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_POINTWISE_MODE:
            EXPECT(CUDNN_TYPE_POINTWISE_MODE, 1, 1);
            d->pw.mode = *(const cudnnPointwiseMode_t *)arr;
            d->set |= 1u << S_PW_MODE;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_POINTWISE_MATH_PREC:
            EXPECT(CUDNN_TYPE_DATA_TYPE, 1, 1);
            d->pw.prec = *(const cudnnDataType_t *)arr;
            d->set |= 1u << S_PW_PREC;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_POINTWISE_AXIS:
            EXPECT(CUDNN_TYPE_INT64, 1, 1);
            d->pw.axis = *(const int64_t *)arr;
            d->pw.has_axis = 1;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_POINTWISE_NAN_PROPAGATION:
            /* Deprecated; only meaningful for the ReLU modes, not modelled. */
            EXPECT(CUDNN_TYPE_NAN_PROPOGATION, 1, 1);
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP:
        case CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP:
        case CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE:
        case CUDNN_ATTR_POINTWISE_ELU_ALPHA:
        case CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA:
        case CUDNN_ATTR_POINTWISE_SWISH_BETA:
            /* Parameters of activation modes this simulation refuses at
             * finalize; their type is still checked. */
            EXPECT(CUDNN_TYPE_DOUBLE, 1, 1);
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_MATMUL_COMP_TYPE:
            EXPECT(CUDNN_TYPE_DATA_TYPE, 1, 1);
            d->mm.comp = *(const cudnnDataType_t *)arr;
            d->set |= 1u << S_MM_COMP;
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_REDUCTION_OPERATOR:
            EXPECT(CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, 1);
            d->red.op = *(const cudnnReduceTensorOp_t *)arr;
            d->set |= 1u << S_RED_OP;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_REDUCTION_COMP_TYPE:
            EXPECT(CUDNN_TYPE_DATA_TYPE, 1, 1);
            d->red.comp = *(const cudnnDataType_t *)arr;
            d->set |= 1u << S_RED_COMP;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC:
            EXPECT(CUDNN_TYPE_BOOLEAN, 1, 1); /* the simulation is always deterministic */
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, r);
            d->pw = r->pw;
            d->set |= 1u << S_DESC;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_OPERATION_POINTWISE_XDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_BDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_YDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_TDESC:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_TENSOR_DESCRIPTOR, r);
            if (a == CUDNN_ATTR_OPERATION_POINTWISE_XDESC) d->x = r->t, d->set |= 1u << S_X;
            else if (a == CUDNN_ATTR_OPERATION_POINTWISE_BDESC) d->b = r->t, d->set |= 1u << S_B;
            else if (a == CUDNN_ATTR_OPERATION_POINTWISE_YDESC) d->y = r->t, d->set |= 1u << S_Y;
            else d->tt = r->t, d->set |= 1u << S_T;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1:
            return set_float_scalar(d, a, type, n, arr, &d->alpha1);
        case CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2:
            return set_float_scalar(d, a, type, n, arr, &d->alpha2);
        default: return unsupported_attr(d, a, "Set"); /* DXDESC/DYDESC: backward activations */
        }

    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_OPERATION_MATMUL_DESC:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_MATMUL_DESCRIPTOR, r);
            d->mm = r->mm;
            d->set |= 1u << S_DESC;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_OPERATION_MATMUL_ADESC:
        case CUDNN_ATTR_OPERATION_MATMUL_BDESC:
        case CUDNN_ATTR_OPERATION_MATMUL_CDESC:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_TENSOR_DESCRIPTOR, r);
            if (a == CUDNN_ATTR_OPERATION_MATMUL_ADESC) d->x = r->t, d->set |= 1u << S_X;
            else if (a == CUDNN_ATTR_OPERATION_MATMUL_BDESC) d->b = r->t, d->set |= 1u << S_B;
            else d->y = r->t, d->set |= 1u << S_Y;
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set"); /* M/N/K overrides, irregular batches */
        }

    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_OPERATION_REDUCTION_DESC:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, r);
            d->red = r->red;
            d->set |= 1u << S_DESC;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_OPERATION_REDUCTION_XDESC:
        case CUDNN_ATTR_OPERATION_REDUCTION_YDESC:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_TENSOR_DESCRIPTOR, r);
            if (a == CUDNN_ATTR_OPERATION_REDUCTION_XDESC) d->x = r->t, d->set |= 1u << S_X;
            else d->y = r->t, d->set |= 1u << S_Y;
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_OPERATION_RESHAPE_XDESC:
        case CUDNN_ATTR_OPERATION_RESHAPE_YDESC:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_TENSOR_DESCRIPTOR, r);
            if (a == CUDNN_ATTR_OPERATION_RESHAPE_XDESC) d->x = r->t, d->set |= 1u << S_X;
            else d->y = r->t, d->set |= 1u << S_Y;
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_OPERATIONGRAPH_HANDLE:
            EXPECT(CUDNN_TYPE_HANDLE, 1, 1);
            d->handle = *(const cudnnHandle_t *)arr;
            if (!d->handle) return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: the handle is NULL");
            d->set |= 1u << S_HANDLE;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_OPERATIONGRAPH_OPS: {
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1 << 20);
            op_t *ops = calloc((size_t)n, sizeof *ops);
            if (!ops) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
            for (int64_t i = 0; i < n; i++) {
                desc_t *o = as_desc(((cudnnBackendDescriptor_t const *)arr)[i]);
                const char *bad = NULL;
                if (!o) bad = "is not a backend descriptor";
                else if (o->type != CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR &&
                         o->type != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR &&
                         o->type != CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR &&
                         o->type != CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)
                    bad = "is not an operation descriptor the simulation models";
                else if (!o->finalized) bad = "is not finalized";
                if (bad) {
                    free(ops);
                    return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH: CUDNN_ATTR_OPERATIONGRAPH_OPS[%lld] %s",
                                (long long)i, bad);
                }
                op_t *op = &ops[i];
                op->alpha1 = o->alpha1;
                op->alpha2 = o->alpha2;
                op->out = o->y;
                if (o->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
                    op->kind = OP_PW;
                    op->pw = o->pw;
                    op->nin = pw_inputs(o->pw.mode);
                    op->in[0] = o->x;
                    op->in[1] = o->b;
                    op->in[2] = o->tt;
                } else if (o->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) {
                    op->kind = OP_MM;
                    op->mm = o->mm;
                    op->nin = 2;
                    op->in[0] = o->x;
                    op->in[1] = o->b;
                } else if (o->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) {
                    op->kind = OP_RED;
                    op->red = o->red;
                    op->nin = 1;
                    op->in[0] = o->x;
                } else {
                    op->kind = OP_RESHAPE;
                    op->nin = 1;
                    op->in[0] = o->x;
                }
            }
            free(d->ops);
            d->ops = ops;
            d->nops = (int)n;
            d->set |= 1u << S_OPS;
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED:
            EXPECT(CUDNN_TYPE_BOOLEAN, 1, 1);
            if (*(const bool *)arr)
                return fail(CUDNN_STATUS_NOT_SUPPORTED, "OPERATIONGRAPH: dynamic shapes are not modelled");
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, r);
            graph_release(d->graph);
            d->graph = graph_retain(r->graph);
            d->set |= 1u << S_GRAPH;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_ENGINEHEUR_MODE:
            EXPECT(CUDNN_TYPE_HEUR_MODE, 1, 1);
            d->heur_mode = *(const cudnnBackendHeurMode_t *)arr;
            if ((int)d->heur_mode < 0 || d->heur_mode >= CUDNN_HEUR_MODES_COUNT)
                return fail(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR: heuristics mode %d", (int)d->heur_mode);
            d->set |= 1u << S_MODE;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET:
            EXPECT(CUDNN_TYPE_INT32, 1, 1); /* no SMs to target here */
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, r);
            graph_release(d->graph);
            d->graph = graph_retain(r->graph);
            d->set |= 1u << S_GRAPH;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
            EXPECT(CUDNN_TYPE_INT64, 1, 1);
            d->index = *(const int64_t *)arr;
            d->set |= 1u << S_INDEX;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_ENGINE_SM_COUNT_TARGET:
            EXPECT(CUDNN_TYPE_INT32, 1, 1);
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE:
            EXPECT(CUDNN_TYPE_KNOB_TYPE, 1, 1);
            d->knob_type = *(const cudnnBackendKnobType_t *)arr;
            d->set |= 1u << S_KNOB_TYPE;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE:
            EXPECT(CUDNN_TYPE_INT64, 1, 1);
            d->knob_value = *(const int64_t *)arr;
            d->set |= 1u << S_KNOB_VALUE;
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_ENGINECFG_ENGINE:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_ENGINE_DESCRIPTOR, r);
            graph_release(d->graph);
            d->graph = graph_retain(r->graph);
            d->index = r->index;
            d->set |= 1u << S_ENGINE;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES:
            /* The engine has no knobs; choices are checked and ignored. */
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, 1 << 10);
            for (int64_t i = 0; i < n; i++) {
                desc_t *k = as_desc(((cudnnBackendDescriptor_t const *)arr)[i]);
                if (!k || k->type != CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR || !k->finalized)
                    return fail(CUDNN_STATUS_BAD_PARAM,
                                "ENGINECFG: CUDNN_ATTR_ENGINECFG_KNOB_CHOICES[%lld] is not a finalized KNOB_CHOICE",
                                (long long)i);
            }
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_EXECUTION_PLAN_HANDLE:
            EXPECT(CUDNN_TYPE_HANDLE, 1, 1);
            d->handle = *(const cudnnHandle_t *)arr;
            if (!d->handle) return fail(CUDNN_STATUS_BAD_PARAM, "EXECUTION_PLAN: the handle is NULL");
            d->set |= 1u << S_HANDLE;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
            EXPECT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
            REF(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, r);
            graph_release(d->graph);
            d->graph = graph_retain(r->graph);
            d->index = r->index;
            d->set |= 1u << S_CFG;
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: {
            EXPECT(CUDNN_TYPE_INT64, 0, 1 << 20);
            int64_t *u = malloc((size_t)(n ? n : 1) * sizeof *u);
            if (!u) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
            if (n) memcpy(u, arr, (size_t)n * sizeof *u);
            free(d->vp_uids);
            d->vp_uids = u;
            d->nvp = n;
            d->set |= 1u << S_VP_UIDS;
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: {
            EXPECT(CUDNN_TYPE_VOID_PTR, 0, 1 << 20);
            void **p = malloc((size_t)(n ? n : 1) * sizeof *p);
            if (!p) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
            if (n) memcpy(p, arr, (size_t)n * sizeof *p);
            free(d->vp_ptrs);
            d->vp_ptrs = p;
            d->nvp_ptrs = n;
            d->set |= 1u << S_VP_PTRS;
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
            EXPECT(CUDNN_TYPE_VOID_PTR, 1, 1);
            d->workspace = *(void *const *)arr;
            d->set |= 1u << S_VP_WS;
            return CUDNN_STATUS_SUCCESS;
        default: return unsupported_attr(d, a, "Set");
        }

    default: return unsupported_attr(d, a, "Set");
    }
}

/* -------------------------------------------------------------- finalize */

static cudnnStatus_t missing(const desc_t *d, const char *attr) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(%s): required attribute %s is not set",
                type_name(d->type), attr);
}

#define REQUIRE(slot, attr)                                                                        \
    do {                                                                                           \
        if (!HAS(d, slot)) return missing(d, #attr);                                               \
    } while (0)

static void shape_str(const tensor_t *t, char *buf, size_t len) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (int i = 0; i < t->nd && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ",%lld" : "%lld", (long long)t->dim[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

/* Each dim of `in` equals the output's or is 1, same rank. */
static cudnnStatus_t check_broadcast(const desc_t *d, const char *what, const tensor_t *in, const tensor_t *out) {
    char a[128], b[128];
    int ok = in->nd == out->nd;
    for (int i = 0; ok && i < in->nd; i++) ok = in->dim[i] == out->dim[i] || in->dim[i] == 1;
    if (ok) return CUDNN_STATUS_SUCCESS;
    shape_str(in, a, sizeof a);
    shape_str(out, b, sizeof b);
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(%s): %s %s does not broadcast to the output %s",
                type_name(d->type), what, a, b);
}

static int float_type(cudnnDataType_t t) {
    return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16 || t == CUDNN_DATA_DOUBLE;
}

static cudnnStatus_t finalize_tensor(desc_t *d) {
    /* Required: DATA_TYPE, DIMENSIONS, STRIDES, UNIQUE_ID, BYTE_ALIGNMENT. */
    REQUIRE(S_T_DTYPE, CUDNN_ATTR_TENSOR_DATA_TYPE);
    REQUIRE(S_T_DIMS, CUDNN_ATTR_TENSOR_DIMENSIONS);
    REQUIRE(S_T_STRIDES, CUDNN_ATTR_TENSOR_STRIDES);
    REQUIRE(S_T_UID, CUDNN_ATTR_TENSOR_UNIQUE_ID);
    REQUIRE(S_T_ALIGN, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
    if (d->x.nd != d->t.nd)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR uid %lld): %d dimensions but %d strides",
                    (long long)d->t.uid, d->t.nd, d->x.nd);
    memset(&d->x, 0, sizeof d->x);
    for (int i = 0; i < d->t.nd; i++) {
        if (d->t.dim[i] <= 0)
            return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR uid %lld): dimension %d is %lld",
                        (long long)d->t.uid, i, (long long)d->t.dim[i]);
        if (d->t.str[i] <= 0)
            return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR uid %lld): stride %d is %lld",
                        (long long)d->t.uid, i, (long long)d->t.str[i]);
    }
    if (d->t.align <= 0 || (d->t.align & (d->t.align - 1)))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR uid %lld): byte alignment %lld",
                    (long long)d->t.uid, (long long)d->t.align);
    if (d->t.is_virtual && d->t.by_value)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(TENSOR uid %lld): both virtual and by value",
                    (long long)d->t.uid);
    if (d->vector_count != 1)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "TENSOR uid %lld: vectorised tensors are not modelled",
                    (long long)d->t.uid);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_pointwise(desc_t *d) {
    /* Required: MODE, MATH_PREC; AXIS for GEN_INDEX. */
    REQUIRE(S_PW_MODE, CUDNN_ATTR_POINTWISE_MODE);
    REQUIRE(S_PW_PREC, CUDNN_ATTR_POINTWISE_MATH_PREC);
    if (!supported_pw_mode(d->pw.mode))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "POINTWISE mode %d is not modelled by the simulation",
                    (int)d->pw.mode);
    /* f32 arithmetic; the index, compare and logical modes may also say
     * INT32 or BOOLEAN (cudnn-frontend's masks do), computed the same way
     * here since their operands are exact small integers or 0/1. */
    int int_ok = d->pw.mode == CUDNN_POINTWISE_GEN_INDEX || pw_is_compare_or_logical(d->pw.mode);
    if (d->pw.prec != CUDNN_DATA_FLOAT &&
        !(int_ok && (d->pw.prec == CUDNN_DATA_INT32 || d->pw.prec == CUDNN_DATA_BOOLEAN)))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "POINTWISE math precision %s is not modelled for mode %d (FLOAT; "
                    "INT32 or BOOLEAN for GEN_INDEX, CMP_* and LOGICAL_*)", dtype_name(d->pw.prec), (int)d->pw.mode);
    if (d->pw.mode == CUDNN_POINTWISE_GEN_INDEX && !d->pw.has_axis)
        return missing(d, "CUDNN_ATTR_POINTWISE_AXIS (GEN_INDEX)");
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_op_pointwise(desc_t *d) {
    /* Required: PW_DESCRIPTOR, XDESC, YDESC; BDESC for binary modes and
     * BINARY_SELECT; TDESC for BINARY_SELECT. */
    REQUIRE(S_DESC, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
    REQUIRE(S_X, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
    REQUIRE(S_Y, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    int nin = pw_inputs(d->pw.mode);
    if (nin >= 2) REQUIRE(S_B, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
    if (nin >= 3) REQUIRE(S_T, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
    if (nin < 2 && HAS(d, S_B))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATION_POINTWISE): BDESC set for a unary mode");
    if (nin < 3 && HAS(d, S_T))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATION_POINTWISE): TDESC set for mode %d",
                    (int)d->pw.mode);
    cudnnStatus_t st;
    if (d->pw.mode == CUDNN_POINTWISE_GEN_INDEX) {
        if (d->x.nd != d->y.nd || memcmp(d->x.dim, d->y.dim, (size_t)d->x.nd * sizeof(int64_t)))
            return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATION_POINTWISE): GEN_INDEX output "
                                                "dims differ from the input's");
        if (d->pw.axis < 0 || d->pw.axis >= d->y.nd)
            return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATION_POINTWISE): GEN_INDEX axis %lld "
                                                "of a %d-d tensor", (long long)d->pw.axis, d->y.nd);
        return CUDNN_STATUS_SUCCESS;
    }
    if ((st = check_broadcast(d, "XDESC", &d->x, &d->y))) return st;
    if (nin >= 2 && (st = check_broadcast(d, "BDESC", &d->b, &d->y))) return st;
    if (nin >= 3 && (st = check_broadcast(d, "TDESC", &d->tt, &d->y))) return st;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_op_matmul(desc_t *d) {
    /* Required: ADESC, BDESC, CDESC, DESC. */
    REQUIRE(S_X, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
    REQUIRE(S_B, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
    REQUIRE(S_Y, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
    REQUIRE(S_DESC, CUDNN_ATTR_OPERATION_MATMUL_DESC);
    const tensor_t *A = &d->x, *B = &d->b, *C = &d->y;
    char sa[128], sb[128], sc[128];
    shape_str(A, sa, sizeof sa);
    shape_str(B, sb, sizeof sb);
    shape_str(C, sc, sizeof sc);
    int nd = C->nd;
    int ok = nd >= 2 && A->nd == nd && B->nd == nd;
    if (ok)
        ok = A->dim[nd - 2] == C->dim[nd - 2] && B->dim[nd - 1] == C->dim[nd - 1] &&
             A->dim[nd - 1] == B->dim[nd - 2];
    /* Batch dims: equal, 1 (broadcast) or dividing C's (grouped, as the
     * grouped-query attention graphs use it: A's index is C's / group). */
    for (int i = 0; ok && i < nd - 2; i++) ok = C->dim[i] % A->dim[i] == 0 && C->dim[i] % B->dim[i] == 0;
    if (!ok)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATION_MATMUL): A %s x B %s does not give C %s",
                    sa, sb, sc);
    if (!float_type(A->dtype) || !float_type(B->dtype) || !float_type(C->dtype))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "OPERATION_MATMUL: data types %s x %s -> %s are not modelled",
                    dtype_name(A->dtype), dtype_name(B->dtype), dtype_name(C->dtype));
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_op_reduction(desc_t *d) {
    /* Required: XDESC, YDESC, DESC. */
    REQUIRE(S_X, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
    REQUIRE(S_Y, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
    REQUIRE(S_DESC, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
    char a[128], b[128];
    /* Each output dim is the input's, 1 (reduced) or divides it (reduced
     * over groups of consecutive indices: grouped-query attention's dK and
     * dV, "b (hk g) s d -> b hk s d"). */
    int ok = d->x.nd == d->y.nd;
    for (int i = 0; ok && i < d->x.nd; i++) ok = d->x.dim[i] % d->y.dim[i] == 0;
    if (ok) return CUDNN_STATUS_SUCCESS;
    shape_str(&d->x, a, sizeof a);
    shape_str(&d->y, b, sizeof b);
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATION_REDUCTION): output %s is not a reduction "
                                        "of the input %s", b, a);
}

/* The element offsets a tensor covers, as (dim, stride) pairs of its dims
 * longer than 1, sorted; two tensors with equal lists cover the same
 * offsets. */
static int dim_stride_pairs(const tensor_t *t, int64_t pairs[][2]) {
    int n = 0;
    for (int i = 0; i < t->nd; i++)
        if (t->dim[i] > 1) pairs[n][0] = t->str[i], pairs[n][1] = t->dim[i], n++;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && (pairs[j][0] < pairs[j - 1][0] ||
                                  (pairs[j][0] == pairs[j - 1][0] && pairs[j][1] < pairs[j - 1][1])); j--) {
            int64_t s0 = pairs[j][0], s1 = pairs[j][1];
            pairs[j][0] = pairs[j - 1][0], pairs[j][1] = pairs[j - 1][1];
            pairs[j - 1][0] = s0, pairs[j - 1][1] = s1;
        }
    return n;
}

/* Dense: the offsets are exactly 0 .. numel-1. */
static int dense(const tensor_t *t) {
    int64_t pairs[MAXD][2], expect = 1;
    int n = dim_stride_pairs(t, pairs);
    for (int i = 0; i < n; i++) {
        if (pairs[i][0] != expect) return 0;
        expect *= pairs[i][1];
    }
    return 1;
}

static int64_t numel(const tensor_t *t);

static cudnnStatus_t finalize_op_reshape(desc_t *d) {
    /* Required: XDESC, YDESC. A view: y describes the memory x describes
     * (the frontend's transposes, dims and strides permuted together), so
     * both must cover the same element offsets; the data type may change
     * (cudnn-frontend's sdpa_backward reshapes the f32 P into the I/O
     * type), values are converted, rounding to nearest even. */
    REQUIRE(S_X, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
    REQUIRE(S_Y, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
    char a[128], b[128];
    shape_str(&d->x, a, sizeof a);
    shape_str(&d->y, b, sizeof b);
    if (numel(&d->x) != numel(&d->y))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATION_RESHAPE): %s and %s have different "
                                            "element counts", a, b);
    int64_t px[MAXD][2], py[MAXD][2];
    int nx = dim_stride_pairs(&d->x, px), ny = dim_stride_pairs(&d->y, py);
    int same = nx == ny && !memcmp(px, py, (size_t)nx * sizeof px[0]);
    if (!same && !(dense(&d->x) && dense(&d->y)))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "OPERATION_RESHAPE: %s and %s (strides not a permutation of each "
                                                "other's, not both dense) is not modelled as a view", a, b);
    return CUDNN_STATUS_SUCCESS;
}

static int same_tensor(const tensor_t *a, const tensor_t *b) {
    if (a->dtype != b->dtype || a->nd != b->nd || a->is_virtual != b->is_virtual || a->by_value != b->by_value)
        return 0;
    for (int i = 0; i < a->nd; i++)
        if (a->dim[i] != b->dim[i] || a->str[i] != b->str[i]) return 0;
    return 1;
}

/* The graph: tensors by uid (consistent descriptors, one producer each,
 * virtual ones produced inside), and a topological order of the ops. */
static cudnnStatus_t finalize_graph(desc_t *d) {
    /* Required: OPS. HANDLE is optional (deprecated in cuDNN 9.x). */
    REQUIRE(S_OPS, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    int n = d->nops;
    /* Every tensor reference, with who produces it. */
    int nref = 0;
    for (int i = 0; i < n; i++) nref += d->ops[i].nin + 1;
    const tensor_t **refs = malloc((size_t)nref * sizeof *refs);
    int *producer = malloc((size_t)nref * sizeof *producer);
    int *indeg = calloc((size_t)n, sizeof *indeg);
    int *order = malloc((size_t)n * sizeof *order);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (!refs || !producer || !indeg || !order) {
        st = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
        goto out;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < d->ops[i].nin; j++) refs[k] = &d->ops[i].in[j], producer[k++] = -1;
        refs[k] = &d->ops[i].out, producer[k++] = i;
    }
    /* Consistency of descriptors sharing a uid; one producer per uid. */
    for (int p = 0; p < nref && !st; p++)
        for (int q = p + 1; q < nref && !st; q++) {
            if (refs[p]->uid != refs[q]->uid) continue;
            if (!same_tensor(refs[p], refs[q]))
                st = fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATIONGRAPH): two different tensors "
                                                  "have unique id %lld", (long long)refs[p]->uid);
            else if (producer[p] >= 0 && producer[q] >= 0)
                st = fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATIONGRAPH): tensor %lld is the output "
                                                  "of operations %d and %d", (long long)refs[p]->uid, producer[p],
                          producer[q]);
        }
    if (st) goto out;
    for (int p = 0; p < nref && !st; p++) {
        if (producer[p] >= 0) {
            if (refs[p]->by_value)
                st = fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATIONGRAPH): by-value tensor %lld is an "
                                                  "operation's output", (long long)refs[p]->uid);
            continue;
        }
        /* An input: find its producer. */
        int prod = -1;
        for (int q = 0; q < nref; q++)
            if (producer[q] >= 0 && refs[q]->uid == refs[p]->uid) prod = producer[q];
        if (prod < 0 && refs[p]->is_virtual)
            st = fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATIONGRAPH): virtual tensor %lld is read "
                                              "but no operation writes it", (long long)refs[p]->uid);
    }
    if (st) goto out;
    /* Kahn's algorithm; an op depends on the producers of its inputs. */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d->ops[i].nin; j++)
            for (int q = 0; q < n; q++)
                if (d->ops[q].out.uid == d->ops[i].in[j].uid) indeg[i]++;
    int done = 0;
    for (int round = 0; round < n && done < n; round++) {
        int progressed = 0;
        for (int i = 0; i < n; i++) {
            if (indeg[i] != 0) continue;
            indeg[i] = -1;
            order[done++] = i;
            progressed = 1;
            for (int c = 0; c < n; c++)
                for (int j = 0; j < d->ops[c].nin; j++)
                    if (d->ops[c].in[j].uid == d->ops[i].out.uid) indeg[c]--;
        }
        if (!progressed) break;
    }
    if (done < n) {
        st = fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATIONGRAPH): the operations form a cycle");
        goto out;
    }
    graph_t *g = calloc(1, sizeof *g);
    if (!g) {
        st = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
        goto out;
    }
    g->refs = 1;
    g->nops = n;
    g->ops = d->ops;
    g->order = order;
    d->ops = NULL;
    order = NULL;
    d->graph = g;
out:
    free(refs);
    free(producer);
    free(indeg);
    free(order);
    return st;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
    desc_t *d = as_desc(descriptor);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: not a backend descriptor");
    if (d->finalized)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(%s): already finalized", type_name(d->type));
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: st = finalize_tensor(d); break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: st = finalize_pointwise(d); break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        /* Required: COMP_TYPE. */
        REQUIRE(S_MM_COMP, CUDNN_ATTR_MATMUL_COMP_TYPE);
        if (d->mm.comp != CUDNN_DATA_FLOAT)
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "MATMUL compute type %s is not modelled (FLOAT only)",
                        dtype_name(d->mm.comp));
        break;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        /* Required: OPERATOR, COMP_TYPE. */
        REQUIRE(S_RED_OP, CUDNN_ATTR_REDUCTION_OPERATOR);
        REQUIRE(S_RED_COMP, CUDNN_ATTR_REDUCTION_COMP_TYPE);
        if (d->red.op != CUDNN_REDUCE_TENSOR_ADD && d->red.op != CUDNN_REDUCE_TENSOR_MAX &&
            d->red.op != CUDNN_REDUCE_TENSOR_MIN)
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "REDUCTION operator %d is not modelled (ADD, MAX, MIN)",
                        (int)d->red.op);
        if (d->red.comp != CUDNN_DATA_FLOAT)
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "REDUCTION compute type %s is not modelled (FLOAT only)",
                        dtype_name(d->red.comp));
        break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: st = finalize_op_pointwise(d); break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: st = finalize_op_matmul(d); break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: st = finalize_op_reduction(d); break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: st = finalize_op_reshape(d); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: st = finalize_graph(d); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        /* Required: OPERATION_GRAPH, MODE. */
        REQUIRE(S_GRAPH, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
        REQUIRE(S_MODE, CUDNN_ATTR_ENGINEHEUR_MODE);
        break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        /* Required: OPERATION_GRAPH, GLOBAL_INDEX (0: the one engine). */
        REQUIRE(S_GRAPH, CUDNN_ATTR_ENGINE_OPERATION_GRAPH);
        REQUIRE(S_INDEX, CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
        if (d->index != 0)
            return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(ENGINE): global index %lld, the graph has 1 "
                                                "engine", (long long)d->index);
        break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        /* Required: ENGINE. */
        REQUIRE(S_ENGINE, CUDNN_ATTR_ENGINECFG_ENGINE);
        break;
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR:
        /* Required: KNOB_TYPE, KNOB_VALUE. */
        REQUIRE(S_KNOB_TYPE, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE);
        REQUIRE(S_KNOB_VALUE, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE);
        break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        /* Required: ENGINE_CONFIG. HANDLE is optional (deprecated in 9.x). */
        REQUIRE(S_CFG, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        /* Required: UNIQUE_IDS, DATA_POINTERS (as many), WORKSPACE (may be
         * NULL: the plans here need none). */
        REQUIRE(S_VP_UIDS, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
        REQUIRE(S_VP_PTRS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
        REQUIRE(S_VP_WS, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
        if (d->nvp != d->nvp_ptrs)
            return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(VARIANT_PACK): %lld unique ids but %lld data "
                                                "pointers", (long long)d->nvp, (long long)d->nvp_ptrs);
        for (int64_t i = 0; i < d->nvp; i++)
            for (int64_t j = i + 1; j < d->nvp; j++)
                if (d->vp_uids[i] == d->vp_uids[j])
                    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(VARIANT_PACK): unique id %lld twice",
                                (long long)d->vp_uids[i]);
        break;
    default: return fail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize: descriptor type not modelled");
    }
    if (st == CUDNN_STATUS_SUCCESS) d->finalized = 1;
    return st;
}

/* --------------------------------------------------------- get attribute */

static cudnnStatus_t get_check(const desc_t *d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t got,
                               cudnnBackendAttributeType_t want, int64_t requested, int64_t *count, void *arr) {
    if (got != want)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute(%s, %s): attribute type %d, expected %d",
                    type_name(d->type), attr_name(a), (int)got, (int)want);
    if (requested < 0 || (requested > 0 && !arr))
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute(%s, %s): bad requested count or NULL array",
                    type_name(d->type), attr_name(a));
    (void)count;
    return CUDNN_STATUS_SUCCESS;
}

#define GET(want)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t st_ = get_check(d, a, type, want, req, count, arr);                          \
        if (st_ != CUDNN_STATUS_SUCCESS) return st_;                                               \
    } while (0)

/* Copies min(req, n) elements of size sz and reports n. */
static cudnnStatus_t give(const void *src, int64_t n, size_t sz, int64_t req, int64_t *count, void *arr) {
    if (count) *count = n;
    int64_t m = req < n ? req : n;
    if (m > 0) memcpy(arr, src, (size_t)m * sz);
    return CUDNN_STATUS_SUCCESS;
}

/* Fills a caller-created descriptor of type `want` as a finalized copy. */
static cudnnStatus_t fill_desc(const desc_t *d, cudnnBackendAttributeName_t a, void *arr, int64_t req,
                               cudnnBackendDescriptorType_t want, graph_t *g, int64_t index) {
    for (int64_t i = 0; i < req; i++) {
        desc_t *o = as_desc(((cudnnBackendDescriptor_t *)arr)[i]);
        if (!o || o->type != want)
            return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute(%s, %s): element %lld is not a %s "
                                                "descriptor created by the caller", type_name(d->type),
                        attr_name(a), (long long)i, type_name(want));
        reset(o);
        o->graph = graph_retain(g);
        o->index = index;
        o->set = want == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR ? 1u << S_ENGINE : (1u << S_GRAPH) | (1u << S_INDEX);
        o->finalized = 1;
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t requestedElementCount, int64_t *elementCount,
                                       void *arrayOfElements) {
    desc_t *d = as_desc(descriptor);
    cudnnBackendAttributeName_t a = attributeName;
    cudnnBackendAttributeType_t type = attributeType;
    int64_t req = requestedElementCount, *count = elementCount;
    void *arr = arrayOfElements;
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: not a backend descriptor");
    if (!d->finalized)
        return fail(CUDNN_STATUS_NOT_INITIALIZED, "cudnnBackendGetAttribute(%s, %s): the descriptor is not finalized",
                    type_name(d->type), attr_name(a));
    int64_t zero = 0, one = 1;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_TENSOR_DATA_TYPE: GET(CUDNN_TYPE_DATA_TYPE); return give(&d->t.dtype, 1, sizeof d->t.dtype, req, count, arr);
        case CUDNN_ATTR_TENSOR_DIMENSIONS: GET(CUDNN_TYPE_INT64); return give(d->t.dim, d->t.nd, 8, req, count, arr);
        case CUDNN_ATTR_TENSOR_STRIDES: GET(CUDNN_TYPE_INT64); return give(d->t.str, d->t.nd, 8, req, count, arr);
        case CUDNN_ATTR_TENSOR_UNIQUE_ID: GET(CUDNN_TYPE_INT64); return give(&d->t.uid, 1, 8, req, count, arr);
        case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: GET(CUDNN_TYPE_INT64); return give(&d->t.align, 1, 8, req, count, arr);
        case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
        case CUDNN_ATTR_TENSOR_IS_BY_VALUE: {
            GET(CUDNN_TYPE_BOOLEAN);
            bool v = a == CUDNN_ATTR_TENSOR_IS_VIRTUAL ? d->t.is_virtual : d->t.by_value;
            return give(&v, 1, sizeof v, req, count, arr);
        }
        default: return unsupported_attr(d, a, "Get");
        }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        if (a == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) {
            GET(CUDNN_TYPE_INT64);
            return give(&one, 1, 8, req, count, arr);
        }
        return unsupported_attr(d, a, "Get");
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        if (a == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
            GET(CUDNN_TYPE_BACKEND_DESCRIPTOR);
            if (count) *count = 1;
            return fill_desc(d, a, arr, req < 1 ? req : 1, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, d->graph, 0);
        }
        return unsupported_attr(d, a, "Get");
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_ENGINECFG_ENGINE:
            GET(CUDNN_TYPE_BACKEND_DESCRIPTOR);
            if (count) *count = 1;
            return fill_desc(d, a, arr, req < 1 ? req : 1, CUDNN_BACKEND_ENGINE_DESCRIPTOR, d->graph, d->index);
        case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES: GET(CUDNN_TYPE_BACKEND_DESCRIPTOR); return give(NULL, 0, 8, req, count, arr);
        case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE: GET(CUDNN_TYPE_INT64); return give(&zero, 1, 8, req, count, arr);
        default: return unsupported_attr(d, a, "Get");
        }
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_ENGINE_GLOBAL_INDEX: GET(CUDNN_TYPE_INT64); return give(&d->index, 1, 8, req, count, arr);
        case CUDNN_ATTR_ENGINE_KNOB_INFO: GET(CUDNN_TYPE_BACKEND_DESCRIPTOR); return give(NULL, 0, 8, req, count, arr);
        case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE: GET(CUDNN_TYPE_NUMERICAL_NOTE); return give(NULL, 0, 4, req, count, arr);
        case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: GET(CUDNN_TYPE_BEHAVIOR_NOTE); return give(NULL, 0, 4, req, count, arr);
        case CUDNN_ATTR_ENGINE_LAYOUT_INFO: GET(CUDNN_TYPE_BACKEND_DESCRIPTOR); return give(NULL, 0, 8, req, count, arr);
        default: return unsupported_attr(d, a, "Get");
        }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        switch (a) {
        case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: GET(CUDNN_TYPE_INT64); return give(&zero, 1, 8, req, count, arr);
        case CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS: GET(CUDNN_TYPE_INT64); return give(NULL, 0, 8, req, count, arr);
        default: return unsupported_attr(d, a, "Get");
        }
    default: return unsupported_attr(d, a, "Get");
    }
}

/* --------------------------------------------------------------- execute */

typedef struct {
    int64_t uid;
    const tensor_t *t;
    void *p;
    int owned;
} binding_t;

static int64_t extent(const tensor_t *t) {
    int64_t e = 1;
    for (int i = 0; i < t->nd; i++) e += (t->dim[i] - 1) * t->str[i];
    return e;
}

static int64_t numel(const tensor_t *t) {
    int64_t e = 1;
    for (int i = 0; i < t->nd; i++) e *= t->dim[i];
    return e;
}

/* Offset of the element at idx[] (indices in the OUTPUT's index space) in
 * tensor t, whose size-1 dims broadcast. */
static int64_t offset_bc(const tensor_t *t, const int64_t *idx) {
    int64_t o = 0;
    for (int i = 0; i < t->nd; i++)
        if (t->dim[i] != 1) o += idx[i] * t->str[i];
    return o;
}

/* The same where t's dims divide ref's (grouped: index / (ref / t), which
 * is 0 for a size-1 dim and the index itself for an equal one). */
static int64_t offset_grouped(const tensor_t *t, const int64_t *idx, const int64_t *ref) {
    int64_t o = 0;
    for (int i = 0; i < t->nd; i++)
        if (t->dim[i] != 1) o += idx[i] / (ref[i] / t->dim[i]) * t->str[i];
    return o;
}

static int next_index(int64_t *idx, const tensor_t *t) {
    for (int i = t->nd - 1; i >= 0; i--) {
        if (++idx[i] < t->dim[i]) return 1;
        idx[i] = 0;
    }
    return 0;
}

static float pw_apply(cudnnPointwiseMode_t m, float x, float b, float t) {
    switch (m) {
    case CUDNN_POINTWISE_ADD: return x + b;
    case CUDNN_POINTWISE_SUB: return x - b;
    case CUDNN_POINTWISE_MUL: return x * b;
    case CUDNN_POINTWISE_DIV: return x / b;
    case CUDNN_POINTWISE_MAX: return fmaxf(x, b);
    case CUDNN_POINTWISE_MIN: return fminf(x, b);
    case CUDNN_POINTWISE_EXP: return expf(x);
    case CUDNN_POINTWISE_LOG: return logf(x);
    case CUDNN_POINTWISE_NEG: return -x;
    case CUDNN_POINTWISE_ABS: return fabsf(x);
    case CUDNN_POINTWISE_SQRT: return sqrtf(x);
    case CUDNN_POINTWISE_RSQRT: return 1.0f / sqrtf(x);
    case CUDNN_POINTWISE_RECIPROCAL: return 1.0f / x;
    case CUDNN_POINTWISE_IDENTITY: return x;
    case CUDNN_POINTWISE_CMP_EQ: return x == b;
    case CUDNN_POINTWISE_CMP_NEQ: return x != b;
    case CUDNN_POINTWISE_CMP_GT: return x > b;
    case CUDNN_POINTWISE_CMP_GE: return x >= b;
    case CUDNN_POINTWISE_CMP_LT: return x < b;
    case CUDNN_POINTWISE_CMP_LE: return x <= b;
    case CUDNN_POINTWISE_LOGICAL_AND: return x != 0.0f && b != 0.0f;
    case CUDNN_POINTWISE_LOGICAL_OR: return x != 0.0f || b != 0.0f;
    case CUDNN_POINTWISE_LOGICAL_NOT: return x == 0.0f;
    case CUDNN_POINTWISE_BINARY_SELECT: return t != 0.0f ? x : b;
    default: return NAN; /* refused at finalize */
    }
}

static void run_pointwise(const op_t *op, void *const *in, void *out) {
    const tensor_t *y = &op->out;
    int64_t idx[MAXD] = {0};
    int nin = op->nin;
    do {
        float v[3] = {0, 0, 0};
        if (op->pw.mode == CUDNN_POINTWISE_GEN_INDEX) {
            store(out, offset_bc(y, idx), y->dtype, (float)idx[op->pw.axis]);
            continue;
        }
        for (int j = 0; j < nin; j++) v[j] = load(in[j], offset_bc(&op->in[j], idx), op->in[j].dtype);
        v[0] *= op->alpha1;
        if (nin >= 2) v[1] *= op->alpha2;
        store(out, offset_bc(y, idx), y->dtype, pw_apply(op->pw.mode, v[0], v[1], v[2]));
    } while (next_index(idx, y));
}

static cudnnStatus_t run_matmul(const op_t *op, void *const *in, void *out) {
    const tensor_t *A = &op->in[0], *B = &op->in[1], *C = &op->out;
    int nd = C->nd;
    int64_t M = C->dim[nd - 2], N = C->dim[nd - 1], K = A->dim[nd - 1];
    int64_t refa[MAXD], refb[MAXD];
    memcpy(refa, C->dim, sizeof refa);
    memcpy(refb, C->dim, sizeof refb);
    refa[nd - 1] = K, refb[nd - 2] = K;
    /* Each batch's A (M x K) and B (K x N) as f32, then the products in
     * f32, summed over k in order. */
    float *a = malloc((size_t)(M * K + K * N) * sizeof *a);
    if (!a) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    float *b = a + M * K;
    int64_t sam = A->str[nd - 2], sak = A->str[nd - 1], sbk = B->str[nd - 2], sbn = B->str[nd - 1];
    /* Loop over the batch dims of C with m = n = 0, then over m, n. */
    tensor_t batch = *C;
    batch.dim[nd - 2] = batch.dim[nd - 1] = 1;
    int64_t idx[MAXD] = {0};
    do {
        int64_t a0 = offset_grouped(A, idx, refa), b0 = offset_grouped(B, idx, refb);
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) a[m * K + k] = load(in[0], a0 + m * sam + k * sak, A->dtype);
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++) b[k * N + n] = load(in[1], b0 + k * sbk + n * sbn, B->dtype);
        int64_t ic[MAXD];
        memcpy(ic, idx, sizeof ic);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                float acc = 0.0f;
                for (int64_t k = 0; k < K; k++) acc += a[m * K + k] * b[k * N + n];
                ic[nd - 2] = m, ic[nd - 1] = n;
                store(out, offset_bc(C, ic), C->dtype, acc);
            }
    } while (next_index(idx, &batch));
    free(a);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t run_reduction(const op_t *op, void *const *in, void *out) {
    const tensor_t *x = &op->in[0], *y = &op->out;
    int64_t ny = numel(y);
    float *acc = malloc((size_t)ny * sizeof *acc);
    if (!acc) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    float init = op->red.op == CUDNN_REDUCE_TENSOR_ADD ? 0.0f
                 : op->red.op == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : INFINITY;
    for (int64_t i = 0; i < ny; i++) acc[i] = init;
    int64_t idx[MAXD] = {0};
    do {
        /* Row-major index of the output element this input element goes to. */
        int64_t r = 0;
        for (int i = 0; i < y->nd; i++) r = r * y->dim[i] + idx[i] / (x->dim[i] / y->dim[i]);
        float v = load(in[0], offset_bc(x, idx), x->dtype);
        if (op->red.op == CUDNN_REDUCE_TENSOR_ADD) acc[r] += v;
        else if (op->red.op == CUDNN_REDUCE_TENSOR_MAX) acc[r] = fmaxf(acc[r], v);
        else acc[r] = fminf(acc[r], v);
    } while (next_index(idx, x));
    memset(idx, 0, sizeof idx);
    int64_t r = 0;
    do store(out, offset_bc(y, idx), y->dtype, acc[r++]);
    while (next_index(idx, y));
    free(acc);
    return CUDNN_STATUS_SUCCESS;
}

/* y's element at each logical index is x's element at the same memory
 * offset (finalize checked both cover the same offsets). */
static void run_reshape(const op_t *op, void *const *in, void *out) {
    const tensor_t *x = &op->in[0], *y = &op->out;
    int64_t idx[MAXD] = {0};
    do {
        int64_t o = offset_bc(y, idx);
        store(out, o, y->dtype, load(in[0], o, x->dtype));
    } while (next_index(idx, y));
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack) {
    desc_t *plan = as_desc(executionPlan), *vp = as_desc(variantPack);
    if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: handle is NULL");
    if (!plan || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: executionPlan is not an EXECUTION_PLAN descriptor");
    if (!vp || vp->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: variantPack is not a VARIANT_PACK descriptor");
    if (!plan->finalized || !vp->finalized)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the %s is not finalized",
                    plan->finalized ? "variant pack" : "execution plan");
    if (plan->handle && plan->handle != handle)
        return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the plan was made for another handle");
    graph_t *g = plan->graph;
    /* Bind every tensor uid of the graph to memory. */
    int nb = 0, cap = 0;
    for (int i = 0; i < g->nops; i++) cap += g->ops[i].nin + 1;
    binding_t *b = calloc((size_t)cap, sizeof *b);
    if (!b) return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    for (int i = 0; i < g->nops && !st; i++)
        for (int j = 0; j <= g->ops[i].nin && !st; j++) {
            const tensor_t *t = j < g->ops[i].nin ? &g->ops[i].in[j] : &g->ops[i].out;
            int seen = 0;
            for (int q = 0; q < nb; q++) seen |= b[q].uid == t->uid;
            if (seen) continue;
            binding_t *bd = &b[nb++];
            bd->uid = t->uid;
            bd->t = t;
            if (t->is_virtual) {
                bd->p = calloc((size_t)extent(t), dtype_size(t->dtype));
                bd->owned = 1;
                if (!bd->p) st = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
                continue;
            }
            int64_t k = 0;
            while (k < vp->nvp && vp->vp_uids[k] != t->uid) k++;
            if (k == vp->nvp) {
                st = fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the variant pack has no pointer for tensor "
                                                  "%lld", (long long)t->uid);
                break;
            }
            bd->p = vp->vp_ptrs[k];
            if (!bd->p)
                st = fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the data pointer of tensor %lld is NULL",
                          (long long)t->uid);
            else if (!t->by_value && ((uintptr_t)bd->p % (uintptr_t)t->align))
                st = fail(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "cudnnBackendExecute: the data pointer of tensor "
                          "%lld is not aligned to its %lld-byte alignment", (long long)t->uid, (long long)t->align);
        }
    for (int s = 0; s < g->nops && !st; s++) {
        const op_t *op = &g->ops[g->order[s]];
        void *in[3] = {NULL, NULL, NULL}, *out = NULL;
        for (int q = 0; q < nb; q++) {
            for (int j = 0; j < op->nin; j++)
                if (b[q].uid == op->in[j].uid) in[j] = b[q].p;
            if (b[q].uid == op->out.uid) out = b[q].p;
        }
        if (op->kind == OP_PW) run_pointwise(op, in, out);
        else if (op->kind == OP_MM) st = run_matmul(op, in, out);
        else if (op->kind == OP_RESHAPE) run_reshape(op, in, out);
        else st = run_reduction(op, in, out);
    }
    for (int q = 0; q < nb; q++)
        if (b[q].owned) free(b[q].p);
    free(b);
    return st;
}
