/*
 * cuda_attention_backward.cu: scaled dot-product attention backward on
 * CUDA, flash-style (the fallback for what cuda_sdpa.cu's cuDNN graph
 * declines, and the path for f32/f64): the probabilities are recomputed
 * tile by tile from the saved logsumexp, P = exp(S - lse), never stored. With
 * Drow = rowsum(dO * O) and dS = P * (dO V^T - Drow):
 *   dV = P^T dO,  dK = scale * dS^T Q,  dQ = scale * dS K,  dbias = dS
 * (summed over the dims the bias broadcast along); with a softcap, dS is
 * multiplied by 1 - tanh^2 after dbias and before dQ and dK ([Note:
 * attention window and softcap], core/ops/attention.c).
 *
 * Three kernels, none with atomics on dq/dk/dv (deterministic results):
 *   1. Drow, one warp per query row.
 *   2. dQ (and dbias): one block per (32 query rows, head, batch) walks
 *      the keys, as the forward. dbias is stored when it has the scores'
 *      shape, else accumulated with atomics into its broadcast slot (the
 *      only order-dependent sum; summed over keys in the warp first when
 *      the keys broadcast).
 *   3. dK and dV: one block per (32 keys, kv head, batch) walks the query
 *      tiles of every query head of its group (grouped-query attention:
 *      the block is the only writer of its keys' rows), from the first
 *      tile that can see its keys when causal, up to the last that can
 *      (a window; packed sequences: [Note: packed sequences],
 *      core/ops/attention.c).
 * Both 2 and 3 recompute S and dO V^T (FlashAttention-2 recomputes them
 * once and adds dQ with atomics instead): the price of determinism.
 */
#include "cuda_attention.cuh"
#include "cuda_sdpa.cuh"

namespace {

template <typename T> __global__ void drow_kernel(fl_att_params<T> p) {
    const int64_t rows = p.B * p.Hq * p.Tq;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        int64_t i = r % p.Tq, h = (r / p.Tq) % p.Hq, b = r / (p.Tq * p.Hq);
        const T *dor = p.dout.row(b, h, i), *orow = p.o.row(b, h, i);
        T s = 0;
        for (int d = lane; d < p.Dv; d += 32) s += dor[d] * orow[d];
        s = fl_cu_warp_sum(s);
        if (lane == 0) p.drow[r] = s;
    }
}

/* Adds dS[i, j] of (b, h) into dbias; every lane of the warp calls it for
 * the same row i, lane's key j (ds = 0 for keys out of range). */
template <typename T>
__device__ __forceinline__ void add_dbias(const fl_att_params<T> &p, int64_t b, int64_t h,
                                          int64_t i, int64_t j, T ds) {
    const int64_t *s = p.dbs;
    int64_t row = (((s[0] > 1 ? b : 0) * s[1] + (s[1] > 1 ? h : 0)) * s[2] + (s[2] > 1 ? i : 0)) *
                  s[3];
    if (s[3] == 1) {
        T sum = fl_cu_warp_sum(ds);
        if ((threadIdx.x & 31) == 0 && sum != 0) atomicAdd(p.dbias + row, sum);
    } else if (j < p.Tk) {
        if (p.dbias_exact) p.dbias[row + j] = ds;
        else if (ds != 0) atomicAdd(p.dbias + row + j, ds);
    }
}

template <typename T, int NC>
__global__ void __launch_bounds__(FL_ATT_THREADS) dq_kernel(fl_att_params<T> p) {
    const int D = p.D, Dv = p.Dv;
    FL_ATT_SMEM(T, Qs);                      /* [TILE][D] */
    T *dOs = Qs + FL_ATT_TILE * D;           /* [TILE][Dv] */
    T *Ks = dOs + FL_ATT_TILE * Dv;          /* [KTILE][D + 1] */
    T *Vs = Ks + FL_ATT_KTILE * (D + 1);     /* [KTILE][Dv + 1] */
    const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / p.group;
    const int64_t i0 = (int64_t)blockIdx.x * FL_ATT_TILE;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    for (int x = tid; x < FL_ATT_TILE * D; x += FL_ATT_THREADS) {
        int64_t i = i0 + x / D;
        Qs[x] = i < p.Tq ? p.q.row(b, h, i)[x % D] : (T)0;
    }
    for (int x = tid; x < FL_ATT_TILE * Dv; x += FL_ATT_THREADS) {
        int64_t i = i0 + x / Dv;
        dOs[x] = i < p.Tq ? p.dout.row(b, h, i)[x % Dv] : (T)0;
    }
    T L[FL_ATT_ROWS], Dr[FL_ATT_ROWS], acc[FL_ATT_ROWS][NC];
    #pragma unroll
    for (int rr = 0; rr < FL_ATT_ROWS; rr++) {
        int64_t i = i0 + warp * FL_ATT_ROWS + rr;
        L[rr] = i < p.Tq ? p.lse.row(b, h, i)[0] : (T)-INFINITY;
        Dr[rr] = i < p.Tq ? p.drow[(b * p.Hq + h) * p.Tq + i] : (T)0;
        #pragma unroll
        for (int c = 0; c < NC; c++) acc[rr][c] = 0;
    }
    int64_t kend = p.causal ? min(p.Tk, i0 + FL_ATT_TILE) : p.Tk;
    for (int64_t k0 = fl_att_first_key(p, b, i0); k0 < kend; k0 += FL_ATT_KTILE) {
        __syncthreads();
        for (int x = tid; x < FL_ATT_KTILE * D; x += FL_ATT_THREADS) {
            int jj = x / D, d = x % D;
            Ks[jj * (D + 1) + d] = k0 + jj < p.Tk ? p.k.row(b, hk, k0 + jj)[d] : (T)0;
        }
        for (int x = tid; x < FL_ATT_KTILE * Dv; x += FL_ATT_THREADS) {
            int jj = x / Dv, d = x % Dv;
            Vs[jj * (Dv + 1) + d] = k0 + jj < p.Tk ? p.v.row(b, hk, k0 + jj)[d] : (T)0;
        }
        __syncthreads();

        T s[FL_ATT_ROWS], dp[FL_ATT_ROWS];
        #pragma unroll
        for (int rr = 0; rr < FL_ATT_ROWS; rr++) s[rr] = dp[rr] = 0;
        fl_att_dot_rows(s, Qs + warp * FL_ATT_ROWS * D, Ks + lane * (D + 1), D);
        fl_att_dot_rows(dp, dOs + warp * FL_ATT_ROWS * Dv, Vs + lane * (Dv + 1), Dv);
        const int64_t j = k0 + lane;
        #pragma unroll
        for (int rr = 0; rr < FL_ATT_ROWS; rr++) {
            const int64_t i = i0 + warp * FL_ATT_ROWS + rr;
            bool masked = i >= p.Tq || j >= p.Tk || fl_att_hidden(p, b, i, j) || L[rr] == (T)-INFINITY;
            T pr = 0, th = 0;
            if (!masked) {
                T sv = fl_att_score(p, s[rr], &th);
                if (p.bias.p) sv += p.bias.row(b, h, i)[j * p.bias.s3];
                pr = fl_cu_exp(sv - L[rr]);
            }
            T ds = pr * (dp[rr] - Dr[rr]);
            if (p.dbias && i < p.Tq) add_dbias(p, b, h, i, j, ds);
            ds *= 1 - th * th;
            if (!p.dq.p) continue;
            for (int jj = 0; jj < FL_ATT_KTILE; jj++) {
                T dsj = __shfl_sync(0xffffffffu, ds, jj);
                const T *krow = Ks + jj * (D + 1);
                #pragma unroll
                for (int c = 0; c < NC; c++) {
                    int d = lane + 32 * c;
                    if (d < D) acc[rr][c] += dsj * krow[d];
                }
            }
        }
    }
    if (!p.dq.p) return;
    #pragma unroll
    for (int rr = 0; rr < FL_ATT_ROWS; rr++) {
        const int64_t i = i0 + warp * FL_ATT_ROWS + rr;
        if (i >= p.Tq) continue;
        T *dqr = p.dq.row(b, h, i);
        #pragma unroll
        for (int c = 0; c < NC; c++) {
            int d = lane + 32 * c;
            if (d < D) dqr[d] = acc[rr][c] * p.scale;
        }
    }
}

template <typename T, int NC>
__global__ void __launch_bounds__(FL_ATT_THREADS) dkdv_kernel(fl_att_params<T> p) {
    const int D = p.D, Dv = p.Dv;
    FL_ATT_SMEM(T, Ks);                      /* [TILE][D]: warp-indexed key rows */
    T *Vs = Ks + FL_ATT_TILE * D;            /* [TILE][Dv] */
    T *Qs = Vs + FL_ATT_TILE * Dv;           /* [KTILE][D + 1]: lane-indexed query rows */
    T *dOs = Qs + FL_ATT_KTILE * (D + 1);    /* [KTILE][Dv + 1] */
    T *Ls = dOs + FL_ATT_KTILE * (Dv + 1);   /* [KTILE] lse */
    T *Ds = Ls + FL_ATT_KTILE;               /* [KTILE] Drow */
    const int64_t b = blockIdx.z, hk = blockIdx.y;
    const int64_t k0 = (int64_t)blockIdx.x * FL_ATT_TILE;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    for (int x = tid; x < FL_ATT_TILE * D; x += FL_ATT_THREADS) {
        int64_t j = k0 + x / D;
        Ks[x] = j < p.Tk ? p.k.row(b, hk, j)[x % D] : (T)0;
    }
    for (int x = tid; x < FL_ATT_TILE * Dv; x += FL_ATT_THREADS) {
        int64_t j = k0 + x / Dv;
        Vs[x] = j < p.Tk ? p.v.row(b, hk, j)[x % Dv] : (T)0;
    }
    T dk[FL_ATT_ROWS][NC], dv[FL_ATT_ROWS][NC];
    #pragma unroll
    for (int kk = 0; kk < FL_ATT_ROWS; kk++)
        #pragma unroll
        for (int c = 0; c < NC; c++) dk[kk][c] = dv[kk][c] = 0;
    /* Causal: query i sees key j only when j <= i, so no query before k0
     * sees any key of this block. */
    const int64_t qstart = p.causal ? k0 / FL_ATT_KTILE * FL_ATT_KTILE : 0;
    /* Window: query i sees key j only when i < j + window, so no query at
     * or past the block's last key + window sees any of its keys. */
    const int64_t qend = p.window > 0 ? min(p.Tq, k0 + FL_ATT_TILE - 1 + p.window) : p.Tq;
    const T *kw = Ks + warp * FL_ATT_ROWS * D, *vw = Vs + warp * FL_ATT_ROWS * Dv;
    for (int64_t h = hk * p.group; h < (hk + 1) * p.group; h++) {
        for (int64_t i0 = qstart; i0 < qend; i0 += FL_ATT_KTILE) {
            /* Packed sequences: rows' first keys never decrease, so once a
             * tile's first row starts past this block's last key, no later
             * query sees any of its keys (the same for the whole block). */
            if (p.starts && fl_att_row_first(p, b, i0) > k0 + FL_ATT_TILE - 1) break;
            __syncthreads();
            for (int x = tid; x < FL_ATT_KTILE * D; x += FL_ATT_THREADS) {
                int ii = x / D, d = x % D;
                Qs[ii * (D + 1) + d] = i0 + ii < p.Tq ? p.q.row(b, h, i0 + ii)[d] : (T)0;
            }
            for (int x = tid; x < FL_ATT_KTILE * Dv; x += FL_ATT_THREADS) {
                int ii = x / Dv, d = x % Dv;
                dOs[ii * (Dv + 1) + d] = i0 + ii < p.Tq ? p.dout.row(b, h, i0 + ii)[d] : (T)0;
            }
            if (tid < FL_ATT_KTILE) {
                int64_t i = i0 + tid;
                Ls[tid] = i < p.Tq ? p.lse.row(b, h, i)[0] : (T)-INFINITY;
                Ds[tid] = i < p.Tq ? p.drow[(b * p.Hq + h) * p.Tq + i] : (T)0;
            }
            __syncthreads();

            T s[FL_ATT_ROWS], dp[FL_ATT_ROWS];
            #pragma unroll
            for (int kk = 0; kk < FL_ATT_ROWS; kk++) s[kk] = dp[kk] = 0;
            fl_att_dot_rows(s, kw, Qs + lane * (D + 1), D);
            fl_att_dot_rows(dp, vw, dOs + lane * (Dv + 1), Dv);
            const int64_t i = i0 + lane;
            const T Li = Ls[lane], Di = Ds[lane];
            #pragma unroll
            for (int kk = 0; kk < FL_ATT_ROWS; kk++) {
                const int64_t j = k0 + warp * FL_ATT_ROWS + kk;
                bool masked = i >= p.Tq || j >= p.Tk || fl_att_hidden(p, b, i, j) || Li == (T)-INFINITY;
                T pr = 0, th = 0;
                if (!masked) {
                    T sv = fl_att_score(p, s[kk], &th);
                    if (p.bias.p) sv += p.bias.row(b, h, i)[j * p.bias.s3];
                    pr = fl_cu_exp(sv - Li);
                }
                T ds = pr * (dp[kk] - Di) * (1 - th * th);
                for (int ii = 0; ii < FL_ATT_KTILE; ii++) {
                    T pi = __shfl_sync(0xffffffffu, pr, ii);
                    T dsi = __shfl_sync(0xffffffffu, ds, ii);
                    const T *grow = dOs + ii * (Dv + 1), *qrow = Qs + ii * (D + 1);
                    #pragma unroll
                    for (int c = 0; c < NC; c++) {
                        int d = lane + 32 * c;
                        if (d < Dv) dv[kk][c] += pi * grow[d];
                        if (d < D) dk[kk][c] += dsi * qrow[d];
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int kk = 0; kk < FL_ATT_ROWS; kk++) {
        const int64_t j = k0 + warp * FL_ATT_ROWS + kk;
        if (j >= p.Tk) continue;
        #pragma unroll
        for (int c = 0; c < NC; c++) {
            int d = lane + 32 * c;
            if (p.dk.p && d < D) p.dk.row(b, hk, j)[d] = dk[kk][c] * p.scale;
            if (p.dv.p && d < Dv) p.dv.row(b, hk, j)[d] = dv[kk][c];
        }
    }
}

template <typename T> size_t dq_smem(int D, int Dv) {
    return sizeof(T) * ((size_t)FL_ATT_TILE * (D + Dv) + (size_t)FL_ATT_KTILE * (D + Dv + 2));
}

template <typename T> size_t dkdv_smem(int D, int Dv) {
    return sizeof(T) * ((size_t)FL_ATT_TILE * (D + Dv) + (size_t)FL_ATT_KTILE * (D + Dv + 4));
}

template <typename T, int NC>
int launch_backward(const char *op, const fl_attention_args *a, const fl_att_params<T> &p) {
    const char *dt = sizeof(T) == 8 ? "f64" : "f32";
    bool want_dq = a->dq || a->dbias, want_dkdv = (a->dk || a->dv) && p.Tk > 0;
    size_t s1 = dq_smem<T>(p.D, p.Dv), s2 = dkdv_smem<T>(p.D, p.Dv);
    if (want_dq && fl_att_prepare_launch(op, dq_kernel<T, NC>, s1, NC, p.B, p.Hq, p.D, p.Dv, dt))
        return fl_last_status();
    if (want_dkdv &&
        fl_att_prepare_launch(op, dkdv_kernel<T, NC>, s2, NC, p.B, p.Hkv, p.D, p.Dv, dt))
        return fl_last_status();
    if (want_dq) {
        dim3 grid((unsigned)((p.Tq + FL_ATT_TILE - 1) / FL_ATT_TILE), (unsigned)p.Hq,
                  (unsigned)p.B);
        dq_kernel<T, NC><<<grid, FL_ATT_THREADS, s1, fl_cu_stream()>>>(p);
        if (fl_cu_check(op)) return fl_last_status();
    }
    if (want_dkdv) {
        dim3 grid((unsigned)((p.Tk + FL_ATT_TILE - 1) / FL_ATT_TILE), (unsigned)p.Hkv,
                  (unsigned)p.B);
        dkdv_kernel<T, NC><<<grid, FL_ATT_THREADS, s2, fl_cu_stream()>>>(p);
        if (fl_cu_check(op)) return fl_last_status();
    }
    return FL_OK;
}

template <typename T> int attention_backward_t(const fl_attention_args *a) {
    const char *op = "scaled_dot_product_attention backward";
    fl_att_params<T> p = fl_att_params_of<T>(a);
    if (p.B == 0 || p.Hq == 0 || p.Tq == 0) return FL_OK; /* dk, dv, dbias stay zero */
    int nc = fl_att_nc(p.D, p.Dv);
    if (nc == 0)
        return fl_att_prepare_launch(op, dq_kernel<T, 2>, 0, 0, p.B, p.Hq, p.D, p.Dv,
                                     sizeof(T) == 8 ? "f64" : "f32");
    fl_tensor *drow = fl_cu_scratch(p.B * p.Hq * p.Tq, a->q->dtype, a->q);
    if (!drow) return fl_last_status();
    p.drow = (T *)drow->data;
    int64_t rows = p.B * p.Hq * p.Tq;
    drow_kernel<T><<<fl_cu_blocks(rows, 8), 256, 0, fl_cu_stream()>>>(p);
    int rc = fl_cu_check(op);
    if (!rc) {
        switch (nc) {
        case 2: rc = launch_backward<T, 2>(op, a, p); break;
        case 4: rc = launch_backward<T, 4>(op, a, p); break;
        default: rc = launch_backward<T, 8>(op, a, p); break;
        }
    }
    fl_tensor_release(drow);
    return rc;
}

} // namespace

int fl_cuda_attention_backward(const fl_attention_args *a) {
    const char *op = "scaled_dot_product_attention backward";
    if (fl_att_check_dtypes(op, a)) return fl_last_status();
    if (fl_cu_use_device(op, a->q)) return fl_last_status();
    fl_cuda_attention_count(FL_ATT_PATH_KERNEL_BACKWARD);
    return a->q->dtype == FL_F64 ? attention_backward_t<double>(a)
                                 : attention_backward_t<float>(a);
}
