/*
 * cuda_attention.cu: scaled dot-product attention forward on CUDA, a
 * flash-style tiled kernel: the fallback for what cuDNN's fused attention
 * (cuda_sdpa.cu, tried first by the op for bf16/f16) does not cover, and the
 * path for f32/f64. Semantics are the CPU's
 * (cpu_attention_gen.h): S = scale * Q K^T + bias, key j masked for query
 * i when causal and j > i, O = softmax(S) V, lse = logsumexp of each row,
 * a row with every key masked outputs zeros and lse = -inf; a window and
 * a softcap as [Note: attention window and softcap] (core/ops/attention.c).
 * Grouped-query:
 * query head h reads kv head h / (Hq / Hkv). The bias is read through its
 * strides (0 where it broadcasts).
 *
 * One block per (32 query rows, head, batch) walks the keys in tiles of
 * 32 with the online softmax: a running max m and sum l per row, the
 * output accumulator rescaled by exp(m_old - m_new) when the max grows,
 * so the scores never leave the chip. Causal blocks stop at the last key
 * their last row can see, windowed ones (and packed sequences' blocks:
 * [Note: packed sequences], core/ops/attention.c) start at the first tile
 * their first row can see. Geometry: cuda_attention.cuh.
 */
#include "cuda_attention.cuh"
#include "cuda_sdpa.cuh"

namespace {

template <typename T, int NC>
__global__ void __launch_bounds__(FL_ATT_THREADS) attention_kernel(fl_att_params<T> p) {
    const int D = p.D, Dv = p.Dv;
    FL_ATT_SMEM(T, Qs);                       /* [TILE][D] */
    T *Ks = Qs + FL_ATT_TILE * D;             /* [KTILE][D + 1]: lane-indexed rows, padded */
    T *Vs = Ks + FL_ATT_KTILE * (D + 1);      /* [KTILE][Dv] */
    const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / p.group;
    const int64_t i0 = (int64_t)blockIdx.x * FL_ATT_TILE;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    for (int x = tid; x < FL_ATT_TILE * D; x += FL_ATT_THREADS) {
        int64_t i = i0 + x / D;
        Qs[x] = i < p.Tq ? p.q.row(b, h, i)[x % D] : (T)0;
    }
    T m[FL_ATT_ROWS], l[FL_ATT_ROWS], acc[FL_ATT_ROWS][NC];
    #pragma unroll
    for (int rr = 0; rr < FL_ATT_ROWS; rr++) {
        m[rr] = (T)-INFINITY;
        l[rr] = 0;
        #pragma unroll
        for (int c = 0; c < NC; c++) acc[rr][c] = 0;
    }
    int64_t kend = p.causal ? min(p.Tk, i0 + FL_ATT_TILE) : p.Tk;
    for (int64_t k0 = fl_att_first_key(p, b, i0); k0 < kend; k0 += FL_ATT_KTILE) {
        __syncthreads(); /* the previous tile's readers are done */
        for (int x = tid; x < FL_ATT_KTILE * D; x += FL_ATT_THREADS) {
            int jj = x / D, d = x % D;
            Ks[jj * (D + 1) + d] = k0 + jj < p.Tk ? p.k.row(b, hk, k0 + jj)[d] : (T)0;
        }
        for (int x = tid; x < FL_ATT_KTILE * Dv; x += FL_ATT_THREADS) {
            int jj = x / Dv;
            Vs[x] = k0 + jj < p.Tk ? p.v.row(b, hk, k0 + jj)[x % Dv] : (T)0;
        }
        __syncthreads();

        T s[FL_ATT_ROWS];
        #pragma unroll
        for (int rr = 0; rr < FL_ATT_ROWS; rr++) s[rr] = 0;
        fl_att_dot_rows(s, Qs + warp * FL_ATT_ROWS * D, Ks + lane * (D + 1), D);
        const int64_t j = k0 + lane;
        #pragma unroll
        for (int rr = 0; rr < FL_ATT_ROWS; rr++) {
            const int64_t i = i0 + warp * FL_ATT_ROWS + rr;
            T th, sv = fl_att_score(p, s[rr], &th);
            bool masked = j >= p.Tk || i >= p.Tq || fl_att_hidden(p, b, i, j);
            if (!masked && p.bias.p && i < p.Tq) sv += p.bias.row(b, h, i)[j * p.bias.s3];
            if (masked) sv = (T)-INFINITY;
            T mn = fmax(m[rr], fl_cu_warp_max(sv));
            /* With every key so far masked the max is -inf: no mass yet. */
            T pr = mn == (T)-INFINITY ? (T)0 : fl_cu_exp(sv - mn);
            T alpha = mn == (T)-INFINITY ? (T)1 : fl_cu_exp(m[rr] - mn);
            l[rr] = l[rr] * alpha + fl_cu_warp_sum(pr);
            m[rr] = mn;
            #pragma unroll
            for (int c = 0; c < NC; c++) acc[rr][c] *= alpha;
            for (int jj = 0; jj < FL_ATT_KTILE; jj++) {
                T pj = __shfl_sync(0xffffffffu, pr, jj);
                const T *vr = Vs + jj * Dv;
                #pragma unroll
                for (int c = 0; c < NC; c++) {
                    int d = lane + 32 * c;
                    if (d < Dv) acc[rr][c] += pj * vr[d];
                }
            }
        }
    }
    #pragma unroll
    for (int rr = 0; rr < FL_ATT_ROWS; rr++) {
        const int64_t i = i0 + warp * FL_ATT_ROWS + rr;
        if (i >= p.Tq) continue;
        bool empty = m[rr] == (T)-INFINITY;
        T inv = empty ? (T)0 : 1 / l[rr];
        T *orow = p.out.row(b, h, i);
        #pragma unroll
        for (int c = 0; c < NC; c++) {
            int d = lane + 32 * c;
            if (d < Dv) orow[d] = acc[rr][c] * inv;
        }
        if (lane == 0)
            p.lse.row(b, h, i)[0] = empty ? (T)-INFINITY : m[rr] + (T)log((double)l[rr]);
    }
}

template <typename T> size_t forward_smem(int D, int Dv) {
    return sizeof(T) * ((size_t)FL_ATT_TILE * D + (size_t)FL_ATT_KTILE * (D + 1) +
                        (size_t)FL_ATT_KTILE * Dv);
}

template <typename T, int NC> int launch_forward(const char *op, const fl_att_params<T> &p) {
    size_t smem = forward_smem<T>(p.D, p.Dv);
    if (fl_att_prepare_launch(op, attention_kernel<T, NC>, smem, NC, p.B, p.Hq, p.D, p.Dv,
                              sizeof(T) == 8 ? "f64" : "f32"))
        return fl_last_status();
    dim3 grid((unsigned)((p.Tq + FL_ATT_TILE - 1) / FL_ATT_TILE), (unsigned)p.Hq, (unsigned)p.B);
    attention_kernel<T, NC><<<grid, FL_ATT_THREADS, smem, fl_cu_stream()>>>(p);
    return fl_cu_check(op);
}

template <typename T> int attention_t(const fl_attention_args *a) {
    const char *op = "scaled_dot_product_attention";
    fl_att_params<T> p = fl_att_params_of<T>(a);
    if (p.B == 0 || p.Hq == 0 || p.Tq == 0) return FL_OK;
    switch (fl_att_nc(p.D, p.Dv)) {
    case 2: return launch_forward<T, 2>(op, p);
    case 4: return launch_forward<T, 4>(op, p);
    case 8: return launch_forward<T, 8>(op, p);
    default:
        return fl_att_prepare_launch(op, attention_kernel<T, 2>, 0, 0, p.B, p.Hq, p.D, p.Dv,
                                     sizeof(T) == 8 ? "f64" : "f32");
    }
}

} // namespace

int fl_cuda_attention(const fl_attention_args *a) {
    if (fl_att_check_dtypes("scaled_dot_product_attention", a)) return fl_last_status();
    if (fl_cu_use_device("scaled_dot_product_attention", a->q)) return fl_last_status();
    fl_cuda_attention_count(FL_ATT_PATH_KERNEL_FORWARD);
    return a->q->dtype == FL_F64 ? attention_t<double>(a) : attention_t<float>(a);
}
