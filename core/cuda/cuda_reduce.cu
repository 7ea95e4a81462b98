/*
 * cuda_reduce.cu: the GPU kernels of the reductions: sum (and mean) over
 * any set of dims, max/min with indices along one dim, and the scatter
 * along a dim that max/min's backward uses (twins of core/cpu/cpu_reduce.c).
 *
 * Sum. The input is contiguous. Its dims are grouped (size-1 dims dropped,
 * neighbours that are both reduced or both kept merged) into a "kept"
 * layout (M outputs) and a "reduced" layout (R terms per output), each
 * with the input's strides, so term r of output o is at
 * offset(kept, o) + offset(reduced, r). Two kernels:
 *   rows: the innermost group is reduced and R is not tiny (a mean over
 *         the hidden dim, a loss over all elements): a thread block per
 *         output, threads striding over the terms (coalesced), a warp-
 *         shuffle tree at the end;
 *   cols: the innermost group is kept (a bias gradient summed over batch
 *         and sequence), or R is tiny: a thread per output, consecutive
 *         threads reading consecutive addresses, terms in order.
 * When outputs are too few to fill the GPU, R is cut into chunks whose
 * partial sums go to a scratch tensor and are added in chunk order by a
 * last kernel. The chunking depends on the shape only, never on the GPU,
 * so results are reproducible run to run and device to device.
 * Accumulation is in f64 for float inputs (as on the CPU) and in int64 for
 * integers (exact); the CPU's summation order differs, so float sums
 * agree with the CPU to f64 rounding, far below the output's precision.
 *
 * Max/min keep the CPU's rule: a NaN beats every number, and of equal
 * candidates the first index wins (the block-wide combine breaks ties by
 * the smaller index, which is what a left-to-right scan picks).
 */
#include "cuda_elem.cuh"
#include "cuda_elementwise.cuh"

#include <algorithm>

enum {
    RUN_CHUNK = 8192,   /* terms per block-chunk in the rows kernel, at least */
    COL_CHUNK = 64,     /* terms per chunk in the cols kernel, at least */
    TARGET_BLOCKS = 1024,
    MAX_CHUNKS = 1024,
    TINY_R = 32         /* below this many terms, the cols kernel */
};

__device__ __forceinline__ double load_acc(double, const void *p, int64_t i, int d) {
    return fl_cu_get_f64(p, i, d);
}
__device__ __forceinline__ long long load_acc(long long, const void *p, int64_t i, int d) {
    return fl_cu_get_i64(p, i, d);
}

/* dst[o] = acc / divisor in dst's dtype, as cpu_reduce.c's store. */
__device__ __forceinline__ void store_acc(void *p, int64_t o, int d, double acc, double divisor) {
    fl_cu_put_f64(p, o, d, divisor != 1 ? acc / divisor : acc);
}
__device__ __forceinline__ void store_acc(void *p, int64_t o, int d, long long acc, double divisor) {
    if (divisor != 1) acc = (long long)fl_cu_int_from_f64((double)acc / divisor, -0x1p63, 0x1p63);
    fl_cu_put_i64(p, o, d, acc);
}

/* Offset of term r: the common dense run (one reduced group of stride 1)
 * without any division. */
__device__ __forceinline__ int64_t term_offset(const fl_cu_layout &red, int64_t r) {
    return red.ndim == 1 ? r * red.stride[0] : fl_cu_offset(red, r);
}

/* Output o, chunk blockIdx.y of the terms, one block. */
template <typename A>
__global__ void sum_rows_kernel(const void *in, int ind, fl_cu_layout kept, fl_cu_layout red,
                                int64_t M, int64_t R, int64_t chunk, void *out, int outd,
                                A *partial, double divisor) {
    __shared__ A warp_sums[FL_CU_THREADS / 32];
    int64_t r0 = blockIdx.y * chunk, r1 = min(R, r0 + chunk);
    for (int64_t o = blockIdx.x; o < M; o += gridDim.x) {
        int64_t base = fl_cu_offset(kept, o);
        A acc = 0;
        for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x)
            acc += load_acc(A(), in, base + term_offset(red, r), ind);
        for (int s = 16; s > 0; s >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, s);
        if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            A total = 0;
            for (int w = 0; w < FL_CU_THREADS / 32; w++) total += warp_sums[w];
            if (partial)
                partial[o * gridDim.y + blockIdx.y] = total;
            else
                store_acc(out, o, outd, total, divisor);
        }
        __syncthreads(); /* warp_sums is reused by the next output */
    }
}

/* A thread per output, chunk blockIdx.y of the terms, in order. */
template <typename A>
__global__ void sum_cols_kernel(const void *in, int ind, fl_cu_layout kept, fl_cu_layout red,
                                int64_t M, int64_t R, int64_t chunk, void *out, int outd,
                                A *partial, double divisor) {
    int64_t r0 = blockIdx.y * chunk, r1 = min(R, r0 + chunk);
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < M;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t base = fl_cu_offset(kept, o);
        A acc = 0;
        for (int64_t r = r0; r < r1; r++) acc += load_acc(A(), in, base + term_offset(red, r), ind);
        if (partial)
            partial[o * gridDim.y + blockIdx.y] = acc;
        else
            store_acc(out, o, outd, acc, divisor);
    }
}

/* out[o] = sum of the chunks' partial sums of o, in chunk order. */
template <typename A>
__global__ void sum_finish_kernel(const A *partial, int64_t M, int64_t chunks, void *out, int outd,
                                  double divisor) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < M;
         o += (int64_t)gridDim.x * blockDim.x) {
        A acc = 0;
        for (int64_t c = 0; c < chunks; c++) acc += partial[o * chunks + c];
        store_acc(out, o, outd, acc, divisor);
    }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

template <typename A>
static int sum_launch(fl_tensor *out, const fl_tensor *in, const fl_cu_layout &kept,
                      const fl_cu_layout &red, int64_t M, int64_t R, bool rows, double divisor,
                      fl_dtype acc_dtype) {
    cudaStream_t s = fl_cu_stream();
    int64_t chunks;
    unsigned gx;
    if (rows) {
        chunks = clamp64(std::min(ceil_div(R, RUN_CHUNK), ceil_div(TARGET_BLOCKS, M)), 1, MAX_CHUNKS);
        gx = (unsigned)std::min<int64_t>(M, 1 << 20);
    } else {
        gx = fl_cu_blocks(M, FL_CU_THREADS);
        chunks = clamp64(std::min(ceil_div(R, COL_CHUNK), ceil_div(TARGET_BLOCKS, gx)), 1, MAX_CHUNKS);
    }
    int64_t chunk = std::max<int64_t>(1, ceil_div(R, chunks));
    chunks = std::max<int64_t>(1, ceil_div(R, chunk)); /* no empty chunk (R = 0: one, summing nothing) */
    fl_tensor *part = NULL;
    if (chunks > 1) {
        int64_t n = M * chunks;
        part = fl_empty(1, &n, acc_dtype, out->device);
        if (!part) return fl_last_status();
    }
    A *pp = part ? (A *)part->data : NULL;
    dim3 grid(gx, (unsigned)chunks);
    if (rows)
        sum_rows_kernel<A><<<grid, FL_CU_THREADS, 0, s>>>(in->data, in->dtype, kept, red, M, R, chunk,
                                                          out->data, out->dtype, pp, divisor);
    else
        sum_cols_kernel<A><<<grid, FL_CU_THREADS, 0, s>>>(in->data, in->dtype, kept, red, M, R, chunk,
                                                          out->data, out->dtype, pp, divisor);
    int rc = fl_cu_check("sum");
    if (rc == FL_OK && part) {
        sum_finish_kernel<A><<<fl_cu_blocks(M, FL_CU_THREADS), FL_CU_THREADS, 0, s>>>(
            pp, M, chunks, out->data, out->dtype, divisor);
        rc = fl_cu_check("sum");
    }
    fl_tensor_release(part); /* the pool keeps it until the queued kernels are done */
    return rc;
}

int fl_cuda_sum(fl_tensor *out, const fl_tensor *in, const bool *reduce, double divisor) {
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device("sum", out)) return fl_last_status();
    /* Groups of merged dims (in is contiguous, so neighbours always merge),
     * split into the kept and the reduced layout. */
    fl_cu_layout kept = {}, red = {};
    int last_kind = -1; /* 0 kept, 1 reduced: the group last appended */
    int64_t M = 1, R = 1;
    for (int d = 0; d < in->ndim; d++) {
        if (in->shape[d] == 1) continue;
        fl_cu_layout &l = reduce[d] ? red : kept;
        int kind = reduce[d] ? 1 : 0;
        if (last_kind == kind) { /* merge into the group before */
            l.shape[l.ndim - 1] *= in->shape[d];
            l.stride[l.ndim - 1] = in->stride[d];
        } else {
            l.shape[l.ndim] = in->shape[d];
            l.stride[l.ndim] = in->stride[d];
            l.ndim++;
        }
        last_kind = kind;
        (reduce[d] ? R : M) *= in->shape[d];
    }
    bool rows = last_kind == 1 && R >= TINY_R;
    if (!fl_dtype_is_float(in->dtype))
        return sum_launch<long long>(out, in, kept, red, M, R, rows, divisor, FL_I64);
    return sum_launch<double>(out, in, kept, red, M, R, rows, divisor, FL_F64);
}

/* ---- max / min along one dim -------------------------------------------------------- */

template <typename K>
__device__ __forceinline__ bool key_isnan(K v) { return v != v; }

/* Is (v, i) a better pick than (best, bi)? Strictly larger (smaller), the
 * first NaN, or equal (both NaN included) at a smaller index. */
template <typename K>
__device__ __forceinline__ bool better(bool is_max, K v, int64_t i, K best, int64_t bi) {
    bool vn = key_isnan(v), bn = key_isnan(best);
    if (vn || bn) return vn && (!bn || i < bi);
    if (is_max ? v > best : v < best) return true;
    return v == best && i < bi;
}

__device__ __forceinline__ double load_key(double, const void *p, int64_t i, int d) {
    return fl_cu_get_f64(p, i, d);
}
__device__ __forceinline__ long long load_key(long long, const void *p, int64_t i, int d) {
    return fl_cu_get_i64(p, i, d);
}

/* values[o] = in[at] (values has in's dtype: a byte move), indices[o] = n. */
__device__ __forceinline__ void put_pick(void *values, int64_t *indices, int64_t o, const void *in,
                                         int64_t at, int64_t n, int size) {
    fl_cu_move_one(values, o, in, at, size);
    indices[o] = n;
}

/* B == 1: one block per row a, threads scanning n in strides, then a tree. */
template <typename K>
__global__ void minmax_rows_kernel(bool is_max, const void *in, int ind, int size, int64_t A,
                                   int64_t N, void *values, int64_t *indices) {
    __shared__ K keys[FL_CU_THREADS];
    __shared__ int64_t at[FL_CU_THREADS];
    for (int64_t a = blockIdx.x; a < A; a += gridDim.x) {
        K best = 0;
        int64_t bi = -1;
        for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
            K v = load_key(K(), in, a * N + n, ind);
            if (bi < 0 || better(is_max, v, n, best, bi)) {
                best = v;
                bi = n;
            }
        }
        keys[threadIdx.x] = best;
        at[threadIdx.x] = bi;
        __syncthreads();
        for (int s = FL_CU_THREADS / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) {
                int64_t oi = at[threadIdx.x + s];
                if (oi >= 0 && (at[threadIdx.x] < 0 ||
                                better(is_max, keys[threadIdx.x + s], oi, keys[threadIdx.x],
                                       at[threadIdx.x]))) {
                    keys[threadIdx.x] = keys[threadIdx.x + s];
                    at[threadIdx.x] = oi;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) put_pick(values, indices, a, in, a * N + at[0], at[0], size);
        __syncthreads(); /* keys/at are reused by the next row */
    }
}

/* B > 1: a thread per output (a, b), scanning n in order (reads of
 * neighbouring threads are neighbouring addresses). */
template <typename K>
__global__ void minmax_cols_kernel(bool is_max, const void *in, int ind, int size, int64_t A,
                                   int64_t N, int64_t B, void *values, int64_t *indices) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < A * B;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t a = o / B, b = o % B;
        K best = load_key(K(), in, a * N * B + b, ind);
        int64_t bi = 0;
        for (int64_t n = 1; n < N; n++) {
            K v = load_key(K(), in, (a * N + n) * B + b, ind);
            if (better(is_max, v, n, best, bi)) {
                best = v;
                bi = n;
            }
        }
        put_pick(values, indices, o, in, (a * N + bi) * B + b, bi, size);
    }
}

/* [A, N, B] around dim of a shape. */
static void split_at(const fl_tensor *t, int dim, int64_t *A, int64_t *N, int64_t *B) {
    *A = *B = *N = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (d < dim) *A *= t->shape[d];
        else if (d == dim) *N = t->shape[d];
        else *B *= t->shape[d];
    }
}

template <typename K>
static void minmax_launch(bool is_max, fl_tensor *values, fl_tensor *indices, const fl_tensor *in,
                          int64_t A, int64_t N, int64_t B) {
    int size = (int)fl_dtype_size(in->dtype);
    if (B == 1)
        minmax_rows_kernel<K><<<(unsigned)std::min<int64_t>(A, 1 << 20), FL_CU_THREADS, 0,
                                fl_cu_stream()>>>(is_max, in->data, in->dtype, size, A, N,
                                                  values->data, (int64_t *)indices->data);
    else
        minmax_cols_kernel<K><<<fl_cu_blocks(A * B, FL_CU_THREADS), FL_CU_THREADS, 0,
                                fl_cu_stream()>>>(is_max, in->data, in->dtype, size, A, N, B,
                                                  values->data, (int64_t *)indices->data);
}

int fl_cuda_minmax(bool is_max, fl_tensor *values, fl_tensor *indices, const fl_tensor *in,
                   int dim) {
    const char *op = is_max ? "max" : "min";
    int64_t A, N, B;
    split_at(in, dim, &A, &N, &B);
    if (A * B == 0) return FL_OK;
    if (N == 0) return fl_fail(FL_ERR_ARG, "%s on cuda: dim %d is empty", op, dim);
    if (values->dtype != in->dtype || indices->dtype != FL_I64)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: values must be %s and indices i64, got %s "
                                           "and %s", op, fl_dtype_name(in->dtype),
                       fl_dtype_name(values->dtype), fl_dtype_name(indices->dtype));
    if (fl_cu_use_device(op, in)) return fl_last_status();
    if (fl_dtype_is_float(in->dtype))
        minmax_launch<double>(is_max, values, indices, in, A, N, B);
    else
        minmax_launch<long long>(is_max, values, indices, in, A, N, B);
    return fl_cu_check(op);
}

/* ---- scatter along a dim (max/min backward) ---------------------------------------- */

__global__ void scatter_dim_kernel(void *out, int od, const void *src, int sd,
                                   int size, const int64_t *idx, int64_t A, int64_t N,
                                   int64_t B, unsigned long long *bad) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < A * B;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = idx[e];
        if (n < 0 || n >= N) {
            atomicAdd(bad, 1ull);
            continue;
        }
        int64_t o = (e / B * N + n) * B + e % B;
        if (od == sd) /* a byte move, as the CPU's memcpy */
            fl_cu_move_one(out, o, src, e, size);
        else /* the CPU's fl_store_f64(fl_load_f64(...)) */
            fl_cu_put_f64(out, o, od, fl_cu_get_f64(src, e, sd));
    }
}

int fl_cuda_scatter_dim(fl_tensor *out, const fl_tensor *src, const fl_tensor *indices, int dim) {
    const char *op = "max/min backward";
    if (indices->dtype != FL_I64)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: indices must be i64, got %s", op,
                       fl_dtype_name(indices->dtype));
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device(op, out)) return fl_last_status();
    int64_t A, N, B;
    split_at(out, dim, &A, &N, &B);
    cudaStream_t s = fl_cu_stream();
    cudaError_t e = cudaMemsetAsync(out->data, 0, (size_t)out->numel * fl_dtype_size(out->dtype), s);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
    if (A * B == 0) return FL_OK;
    int64_t one = 1;
    fl_tensor *bad = fl_empty(1, &one, FL_I64, out->device);
    if (!bad) return fl_last_status();
    e = cudaMemsetAsync(bad->data, 0, sizeof(long long), s);
    int rc = e == cudaSuccess ? FL_OK
                              : fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
    if (rc == FL_OK) {
        scatter_dim_kernel<<<fl_cu_blocks(A * B, FL_CU_THREADS), FL_CU_THREADS, 0, s>>>(
            out->data, out->dtype, src->data, src->dtype, (int)fl_dtype_size(out->dtype),
            (const int64_t *)indices->data, A, N, B,
            (unsigned long long *)bad->data);
        rc = fl_cu_check(op);
    }
    /* The count of bad indices decides the status: one small synchronous
     * read (max/min backward is rare next to the GEMMs around it). */
    unsigned long long nbad = 0;
    if (rc == FL_OK) rc = fl_cuda_nccl_settle();
    if (rc == FL_OK) {
        e = cudaMemcpy(&nbad, bad->data, sizeof nbad, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) rc = fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
    }
    fl_tensor_release(bad);
    if (rc == FL_OK && nbad)
        rc = fl_fail(FL_ERR_ARG, "max/min backward: %lld saved indices out of range [0, %lld) "
                                 "(were the indices modified in place?)",
                     (long long)nbad, (long long)N);
    return rc;
}
