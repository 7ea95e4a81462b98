/*
 * cuda_rotary.cu: rotary position embeddings on CUDA, with the CPU's
 * semantics (cpu_rotary_gen.h): over x's last two dims [T, D],
 *   y = x * cos + rotate_half(x) * sin,  rotate_half(x) = [-x2, x1],
 * and the inverse (the transposed map, the backward)
 *   dx = g * cos - rotate_half(g * sin).
 * positions: NULL (row t uses table row t), integer [T], or [x.shape[0], T].
 *
 * One thread per pair (i, i + D/2) of a row: each reads its two elements
 * of x and of the two tables once and writes both outputs. A position
 * outside the tables is an error naming it, as on the CPU; checking it
 * costs a sync, so only calls with positions pay it.
 */
#include "cuda_fused.cuh"

namespace {

struct table {
    const void *p;
    int dt;
    int64_t s0, s1;
};

/* The positions (NULL: row t uses table row t) and what finding a row's
 * table row takes: x's rows per batch entry and the tables' length. */
struct position_map {
    const void *p;
    int dt, ndim;
    int64_t s0, s1, per_batch, table_rows;
    unsigned long long *bad_row; /* the first row whose position is out of range */
};

/* Element offset of row r's position (t = r % T). */
__host__ __device__ __forceinline__ int64_t position_offset(const position_map &ps, int64_t r, int64_t t) {
    return ps.ndim == 1 ? t * ps.s0 : (r / ps.per_batch) * ps.s0 + t * ps.s1;
}

/* The table row of x's row r, or -1 (recorded in bad_row) when its
 * position is outside the tables. */
__device__ __forceinline__ int64_t table_row(const position_map &ps, int64_t r, int64_t T) {
    int64_t t = r % T;
    if (!ps.p) return t;
    int64_t p = fl_cu_ld_i64(ps.p, position_offset(ps, r, t), ps.dt);
    if (p < 0 || p >= ps.table_rows) {
        atomicMin(ps.bad_row, (unsigned long long)r);
        return -1;
    }
    return p;
}

/* One pair (x1, x2) = (x[i], x[i + D/2]) rotated, or rotated back. */
template <typename R>
__device__ __forceinline__ void rotate(R x1, R x2, R c1, R c2, R s1, R s2, bool inverse, R &y1, R &y2) {
    if (!inverse) {
        y1 = x1 * c1 - x2 * s1;
        y2 = x2 * c2 + x1 * s2;
    } else {
        y1 = x1 * c1 + x2 * s2;
        y2 = x2 * c2 - x1 * s1;
    }
}

template <typename R>
__global__ void __launch_bounds__(1024) rotary_kernel(void *out, int out_dt, const void *x, int x_dt, fl_cu_lanes xl,
                                                      table cs, table sn, position_map ps, int64_t rows, int64_t T,
                                                      int64_t D, bool inverse) {
    int64_t h = D / 2, items = rows * h;
    for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = it / h, i = it % h, p = table_row(ps, r, T);
        if (p < 0) continue;
        int64_t xo = fl_cu_lane_offset(xl, r);
        R x1 = fl_cu_ld<R>(x, xo + i * xl.step, x_dt);
        R x2 = fl_cu_ld<R>(x, xo + (i + h) * xl.step, x_dt);
        R c1 = fl_cu_ld<R>(cs.p, p * cs.s0 + i * cs.s1, cs.dt);
        R c2 = fl_cu_ld<R>(cs.p, p * cs.s0 + (i + h) * cs.s1, cs.dt);
        R s1 = fl_cu_ld<R>(sn.p, p * sn.s0 + i * sn.s1, sn.dt);
        R s2 = fl_cu_ld<R>(sn.p, p * sn.s0 + (i + h) * sn.s1, sn.dt);
        R y1, y2;
        rotate(x1, x2, c1, c2, s1, s2, inverse, y1, y2);
        fl_cu_st(out, r * D + i, out_dt, y1);
        fl_cu_st(out, r * D + i + h, out_dt, y2);
    }
}

/* The vector path (cuda_vec.cuh): x's rows contiguous, each starting a
 * 16-byte vector, D/2 whole vectors of x's dtype XD, out of XD, the tables
 * (cos and sin of dtype TD: XD or f32) contiguous along D with aligned
 * rows. A thread takes one vector of each half of a row (elements i .. i +
 * K - 1 and i + D/2 ...), the matching table elements, and writes both
 * halves' vectors; the arithmetic per element is rotary_kernel's. */
template <int XD, int TD>
__global__ void __launch_bounds__(1024) rotary_vec_kernel(void *out, const void *x, fl_cu_lanes xl, table cs,
                                                           table sn, position_map ps, int64_t rows, int64_t T,
                                                           int64_t D, bool inverse) {
    typedef fl_cu_vec<XD> XV;
    constexpr int K = XV::N;
    int64_t h = D / 2, hc = h / K, items = rows * hc;
    for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = it / hc, i = (it % hc) * K, p = table_row(ps, r, T);
        if (p < 0) continue;
        const char *xr = (const char *)x + fl_cu_lane_offset(xl, r) * XV::SIZE;
        float x1[K], x2[K], c1[K], c2[K], s1[K], s2[K], y1[K], y2[K];
        fl_cu_vload<XD, K>(xr, i, x1);
        fl_cu_vload<XD, K>(xr, i + h, x2);
        fl_cu_vload<TD, K>(cs.p, p * cs.s0 + i, c1);
        fl_cu_vload<TD, K>(cs.p, p * cs.s0 + i + h, c2);
        fl_cu_vload<TD, K>(sn.p, p * sn.s0 + i, s1);
        fl_cu_vload<TD, K>(sn.p, p * sn.s0 + i + h, s2);
#pragma unroll
        for (int k = 0; k < K; k++) rotate(x1[k], x2[k], c1[k], c2[k], s1[k], s2[k], inverse, y1[k], y2[k]);
        fl_cu_vstore<XD, K>(out, r * D + i, y1);
        fl_cu_vstore<XD, K>(out, r * D + i + h, y2);
    }
}

/* Tables the vector path reads with x of dtype xd: cos and sin of xd or
 * f32, contiguous along D, rows starting vectors. */
bool tables_vec_ok(const fl_tensor *cos, const fl_tensor *sin, fl_dtype xd) {
    const fl_tensor *ts[2] = {cos, sin};
    if (cos->dtype != sin->dtype || (cos->dtype != xd && cos->dtype != FL_F32)) return false;
    for (int k = 0; k < 2; k++) {
        const fl_tensor *t = ts[k];
        if (t->stride[1] != 1 || !fl_cu_vec_aligned(t->data) ||
            (t->shape[0] > 1 && (t->stride[0] * (int64_t)fl_dtype_size(t->dtype)) % FL_CU_VEC_BYTES))
            return false;
    }
    return true;
}

table table_of(const fl_tensor *t) {
    table tb = {t->data, (int)t->dtype, t->stride[0], t->stride[1]};
    return tb;
}

} // namespace

int fl_cuda_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos,
                   const fl_tensor *sin, const fl_tensor *positions, bool inverse) {
    const char *op = "apply_rotary";
    int dim = x->ndim - 1;
    int64_t D = x->shape[dim], T = x->shape[dim - 1];
    int64_t rows = D ? x->numel / D : 0, per_batch = x->shape[0] ? rows / x->shape[0] : 0;
    int64_t table_rows = cos->shape[0], items = rows * (D / 2);
    if (items == 0) return FL_OK;
    if (fl_cu_use_device(op, x)) return fl_last_status();
    fl_tensor *bad = NULL;
    if (positions) {
        bad = fl_cu_scratch(8, FL_U8, x);
        if (!bad) return fl_last_status();
        cudaError_t e = cudaMemsetAsync(bad->data, 0xff, 8, fl_cu_stream());
        if (e != cudaSuccess) {
            fl_tensor_release(bad);
            return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
        }
    }
    position_map ps = {positions ? positions->data : NULL,
                    positions ? (int)positions->dtype : 0,
                    positions ? positions->ndim : 0,
                    positions ? positions->stride[0] : 0,
                    positions && positions->ndim > 1 ? positions->stride[1] : 0,
                    per_batch,
                    table_rows,
                    bad ? (unsigned long long *)bad->data : NULL};
    unsigned blocks = fl_cu_blocks(items, 256);
    fl_cu_lanes xl = fl_cu_lanes_of(x, dim);
    int64_t vec_k = fl_cu_vec_dtype(x->dtype) ? FL_CU_VEC_BYTES / (int64_t)fl_dtype_size(x->dtype) : 0;
    if (vec_k && out->dtype == x->dtype && (D / 2) % vec_k == 0 && fl_cu_lanes_vec_ok(x, dim) &&
        fl_cu_rows_vec_ok(out->data, out->dtype, rows, D) && tables_vec_ok(cos, sin, x->dtype)) {
        unsigned vblocks = fl_cu_blocks(rows * (D / 2 / vec_k), 256);
        if (cos->dtype == x->dtype)
            fl_cu_vec_dispatch(x->dtype, XD,
                               rotary_vec_kernel<XD, XD><<<vblocks, 256, 0, fl_cu_stream()>>>(
                                   out->data, x->data, xl, table_of(cos), table_of(sin), ps, rows, T, D,
                                   inverse));
        else
            fl_cu_vec_dispatch(x->dtype, XD,
                               rotary_vec_kernel<XD, FL_F32><<<vblocks, 256, 0, fl_cu_stream()>>>(
                                   out->data, x->data, xl, table_of(cos), table_of(sin), ps, rows, T, D,
                                   inverse));
    } else if (out->dtype == FL_F64)
        rotary_kernel<double><<<blocks, 256, 0, fl_cu_stream()>>>(
            out->data, out->dtype, x->data, x->dtype, xl, table_of(cos), table_of(sin), ps, rows, T, D, inverse);
    else
        rotary_kernel<float><<<blocks, 256, 0, fl_cu_stream()>>>(
            out->data, out->dtype, x->data, x->dtype, xl, table_of(cos), table_of(sin), ps, rows, T, D, inverse);
    int rc = fl_cu_check(op);
    if (!rc && bad) rc = fl_cuda_nccl_settle();
    if (!rc && bad) {
        unsigned long long row = 0;
        cudaError_t e = cudaMemcpy(&row, bad->data, sizeof row, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            rc = fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
        } else if (row != ~0ull) {
            /* The first bad row's position, read back for the message. */
            int64_t r = (int64_t)row, off = position_offset(ps, r, r % T);
            size_t es = fl_dtype_size(positions->dtype);
            unsigned char v[8] = {0};
            e = cudaMemcpy(v, (const char *)ps.p + off * (int64_t)es, es, cudaMemcpyDeviceToHost);
            rc = e != cudaSuccess
                     ? fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e))
                     : fl_fail(FL_ERR_ARG, "%s: position %lld is out of range for tables of "
                                           "%lld positions",
                               op, (long long)fl_load_i64(v, positions->dtype),
                               (long long)table_rows);
        }
    }
    fl_tensor_release(bad);
    return rc;
}
