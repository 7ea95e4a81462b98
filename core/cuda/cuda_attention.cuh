/*
 * cuda_attention.cuh: what the flash-style attention kernels on CUDA
 * (cuda_attention.cu forward, cuda_attention_backward.cu) share: the
 * arguments as one struct passed by value, the tile geometry, the
 * choice of register width from the head dims, and the launch checks
 * (shared memory against the device's opt-in limit).
 *
 * Tiling: a block is 8 warps over a tile of 32 query rows (forward, dQ) or
 * 32 keys (dK/dV); a warp owns 4 rows, lane j of a warp owns key (or
 * query) j of the current 32-wide tile of the other side, so a score is
 * one lane's dot product over shared memory and a row's max and sum are
 * warp shuffles. Output rows (O, dQ, dK, dV) are held in registers, lane
 * l owning columns l, l + 32, ...: NC such columns per row, NC = 2, 4 or
 * 8 for head dims up to 64, 128 or 256. Math in T (float; double for f64
 * tensors), as the CPU.
 */
#ifndef FL_CUDA_ATTENTION_CUH
#define FL_CUDA_ATTENTION_CUH

#include "cuda_fused.cuh"

enum {
    FL_ATT_WARPS = 8,
    FL_ATT_ROWS = 4,                            /* rows (or keys) per warp */
    FL_ATT_TILE = FL_ATT_WARPS * FL_ATT_ROWS,   /* 32 rows per block */
    FL_ATT_KTILE = 32,                          /* the other side: one per lane */
    FL_ATT_THREADS = FL_ATT_WARPS * 32,
    FL_ATT_MAX_DIM = 256,
};

/* A [B, H, T, X] tensor with a dense last dim (bias: any s3). */
template <typename T> struct fl_att_view {
    T *p;
    int64_t s0, s1, s2, s3;
    __device__ __forceinline__ T *row(int64_t b, int64_t h, int64_t i) const {
        return p + b * s0 + h * s1 + i * s2;
    }
};

template <typename T> struct fl_att_params {
    fl_att_view<T> q, k, v, bias, out, lse, o, dout, dq, dk, dv;
    T *dbias;          /* contiguous, shape dbs (size 1 where it broadcast) */
    int64_t dbs[4];
    bool dbias_exact;  /* dbias has the scores' shape: stores, no atomics */
    T *drow;           /* [B, Hq, Tq]: rowsum(dO * O), backward */
    int64_t B, Hq, Hkv, group, Tq, Tk;
    int D, Dv;
    bool causal;
    T scale;
    int64_t window; /* 0: none ([Note: attention window and softcap], core/ops/attention.c) */
    T softcap;      /* 0: none */
    /* NULL, or [B, Tq]: each query's document start (packed sequences:
     * [Note: packed sequences], core/ops/attention.c), never decreasing
     * along the queries */
    const int64_t *starts;
};

template <typename T> static inline fl_att_view<T> fl_att_view_of(const fl_tensor *t) {
    fl_att_view<T> v = {NULL, 0, 0, 0, 0};
    if (!t) return v;
    v.p = (T *)t->data;
    v.s0 = t->stride[0];
    v.s1 = t->ndim > 1 ? t->stride[1] : 0;
    v.s2 = t->ndim > 2 ? t->stride[2] : 0;
    v.s3 = t->ndim > 3 ? t->stride[3] : 0;
    return v;
}

/* The arguments of the op as kernel parameters. */
template <typename T> static fl_att_params<T> fl_att_params_of(const fl_attention_args *a) {
    fl_att_params<T> p;
    p.q = fl_att_view_of<T>(a->q);
    p.k = fl_att_view_of<T>(a->k);
    p.v = fl_att_view_of<T>(a->v);
    p.bias = fl_att_view_of<T>(a->bias);
    p.out = fl_att_view_of<T>(a->out);
    p.lse = fl_att_view_of<T>(a->lse);
    p.o = fl_att_view_of<T>(a->o);
    p.dout = fl_att_view_of<T>(a->dout);
    p.dq = fl_att_view_of<T>(a->dq);
    p.dk = fl_att_view_of<T>(a->dk);
    p.dv = fl_att_view_of<T>(a->dv);
    p.dbias = a->dbias ? (T *)a->dbias->data : NULL;
    p.B = a->q->shape[0];
    p.Hq = a->q->shape[1];
    p.Tq = a->q->shape[2];
    p.D = (int)a->q->shape[3];
    p.Hkv = a->k->shape[1];
    p.Tk = a->k->shape[2];
    p.Dv = (int)a->v->shape[3];
    p.group = p.Hq / p.Hkv;
    p.causal = a->causal;
    p.scale = (T)a->scale;
    p.window = a->window;
    p.softcap = (T)a->softcap;
    p.starts = a->starts ? (const int64_t *)a->starts->data : NULL;
    p.drow = NULL;
    const int64_t scores[4] = {p.B, p.Hq, p.Tq, p.Tk};
    p.dbias_exact = a->dbias != NULL;
    for (int d = 0; d < 4; d++) {
        p.dbs[d] = a->dbias ? a->dbias->shape[d] : 1;
        if (p.dbs[d] != scores[d]) p.dbias_exact = false;
    }
    return p;
}

/* Columns per lane for head dims D, Dv: 2, 4 or 8; 0 when above 256. */
static inline int fl_att_nc(int D, int Dv) {
    int m = D > Dv ? D : Dv;
    return m <= 64 ? 2 : m <= 128 ? 4 : m <= FL_ATT_MAX_DIM ? 8 : 0;
}

/* Checks what the tiled kernels support (FL_ERR_UNSUPPORTED otherwise)
 * and lets `kernel` use `smem` bytes of dynamic shared memory. */
template <typename K>
static int fl_att_prepare_launch(const char *op, K kernel, size_t smem, int nc, int64_t B,
                                 int64_t H, int D, int Dv, const char *dtype) {
    if (nc == 0)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: head dims %d (q, k) and %d (v) in %s; "
                                           "the tiled kernel supports up to %d",
                       op, D, Dv, dtype, (int)FL_ATT_MAX_DIM);
    if (B > 65535 || H > 65535)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: batch %lld and heads %lld must be at "
                                           "most 65535",
                       op, (long long)B, (long long)H);
    int dev = 0, limit = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
    if (smem > (size_t)limit)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: head dims %d/%d in %s need %zu bytes of "
                                           "shared memory per block, the device has %d",
                       op, D, Dv, dtype, smem, limit);
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
    return FL_OK;
}

/* The op hands the kernels q, k, v (and bias, o, dout) converted to the
 * compute dtype: f32, or f64. Anything else is refused, never misread. */
static inline int fl_att_check_dtypes(const char *op, const fl_attention_args *a) {
    fl_dtype t = a->q->dtype;
    const fl_tensor *all[5] = {a->k, a->v, a->bias, a->o, a->dout};
    bool ok = t == FL_F32 || t == FL_F64;
    for (int i = 0; i < 5; i++)
        if (all[i] && all[i]->dtype != t) ok = false;
    return ok ? FL_OK
              : fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: the kernel takes q, k, v, bias in one "
                                            "compute dtype (f32 or f64), got q in %s",
                        op, fl_dtype_name(t));
}

/* The first key query i (< Tq) of batch row b sees: its window's start,
 * or its document's when later (packed sequences). Never decreases along i. */
template <typename T>
__device__ __forceinline__ int64_t fl_att_row_first(const fl_att_params<T> &p, int64_t b, int64_t i) {
    int64_t lo = p.window > 0 ? i - p.window + 1 : 0;
    if (p.starts) lo = max(lo, p.starts[b * p.Tq + i]);
    return lo;
}

/* Whether query i (< Tq) of batch row b is kept from key j by the causal,
 * window and document masks. */
template <typename T>
__device__ __forceinline__ bool fl_att_hidden(const fl_att_params<T> &p, int64_t b, int64_t i,
                                              int64_t j) {
    return (p.causal && j > i) || ((p.window > 0 || p.starts) && j < fl_att_row_first(p, b, i));
}

/* The score before the bias: scale * q.k, softcapped when asked; *th gets
 * the tanh (1 - th^2 is the cap's derivative; 0 without a cap). */
template <typename T> __device__ __forceinline__ T fl_att_score(const fl_att_params<T> &p, T dot, T *th) {
    T sv = dot * p.scale;
    *th = 0;
    if (p.softcap > 0) {
        *th = fl_cu_tanh(sv / p.softcap);
        sv = p.softcap * *th;
    }
    return sv;
}

/* The first key tile (a multiple of FL_ATT_KTILE) any of the rows from i0
 * (< Tq) on of batch row b can see: 0 without a window or documents. */
template <typename T>
__device__ __forceinline__ int64_t fl_att_first_key(const fl_att_params<T> &p, int64_t b, int64_t i0) {
    int64_t lo = fl_att_row_first(p, b, i0);
    return lo > 0 ? lo / FL_ATT_KTILE * FL_ATT_KTILE : 0;
}

/* Dynamic shared memory, aligned for double. */
#define FL_ATT_SMEM(T, name)                                                                     \
    extern __shared__ __align__(16) unsigned char fl_att_smem_raw[];                              \
    T *name = reinterpret_cast<T *>(fl_att_smem_raw)

/* acc[r] += sum over d < n of rows[r * n + d] * col[d], for a warp's
 * FL_ATT_ROWS rows (queries or keys) against one lane's column: the
 * products of every kernel's tile, summed in order of d. */
template <class T>
__device__ __forceinline__ void fl_att_dot_rows(T (&acc)[FL_ATT_ROWS], const T *rows, const T *col,
                                                int n) {
    for (int d = 0; d < n; d++) {
        T c = col[d];
        #pragma unroll
        for (int r = 0; r < FL_ATT_ROWS; r++) acc[r] += rows[r * n + d] * c;
    }
}

#endif /* FL_CUDA_ATTENTION_CUH */
