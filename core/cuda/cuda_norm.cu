/*
 * cuda_norm.cu: RMSNorm (alone, and after a residual add: add_rms_norm,
 * the same kernels with the add's operand and h's gradient passed) and
 * LayerNorm on CUDA, forward and backward, with
 * the semantics of the CPU kernels (cpu_norm_gen.h): math in R (float for
 * f32/f16/bf16, double for f64), statistics rstd/mean saved per row in R,
 * RMSNorm's output rounded through x's 16-bit dtype before the weight
 * multiply (Llama), outputs contiguous.
 *
 * Forward and dx: one block per row (the row stays in L1/L2 between the
 * passes: sum, then output), block reductions in R.
 * dweight/dbias: a sum over rows of each column, done in two passes so
 * that it is deterministic and needs no atomics: blocks of 256 columns by
 * a group of rows write per-group partial sums [groups, n] (coalesced
 * along the columns), then one thread per column adds its groups in
 * double, in group order, and stores the dtype of dw.
 */
#include "cuda_fused.cuh"

namespace {

const int COLS = 256;       /* columns per block of the partial sums */

/* x + y rounded once (no contraction into a neighbouring multiply), as
 * cuda_binary.cu's add. */
__device__ __forceinline__ float add_rn(float x, float y) { return __fadd_rn(x, y); }
__device__ __forceinline__ double add_rn(double x, double y) { return __dadd_rn(x, y); }

const int MAX_GROUPS = 256; /* row groups of the partial sums */

template <typename R>
__global__ void __launch_bounds__(1024) rms_norm_kernel(void *out, int out_dt, R *rstd, const void *x, int x_dt,
                                fl_cu_lanes xl, const void *w, int w_dt, int64_t ws, int64_t rows,
                                int64_t n, double eps, int round_dt, void *h, const void *a, fl_cu_lanes al) {
    /* With a (add_rms_norm): h = x + a (dtype x_dt, contiguous) is written in
     * the first pass and read back as the row to normalise. */
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t xo = fl_cu_lane_offset(xl, r), xs = xl.step, ao = a ? fl_cu_lane_offset(al, r) : 0;
        R ss = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R v = fl_cu_ld<R>(x, xo + i * xs, x_dt);
            if (a) {
                fl_cu_st(h, r * n + i, x_dt, add_rn(v, fl_cu_ld<R>(a, ao + i * al.step, x_dt)));
                v = fl_cu_ld<R>(h, r * n + i, x_dt);
            }
            ss += v * v;
        }
        /* the row of pass 2: h's (this thread's own elements, written above) */
        const void *src = a ? h : x;
        if (a) xo = r * n, xs = 1;
        ss = fl_cu_block_sum(ss);
        R inv = (R)(1.0 / sqrt((double)ss / (double)n + eps));
        if (threadIdx.x == 0) rstd[r] = inv;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R y = fl_cu_round_to(fl_cu_ld<R>(src, xo + i * xs, x_dt) * inv, round_dt);
            if (w) y *= fl_cu_ld<R>(w, i * ws, w_dt);
            fl_cu_st(out, r * n + i, out_dt, y);
        }
    }
}

/* dx = inv * (dn - x * mean(dn * x) * inv^2), dn = g * w (+ gh: add_rms_norm,
 * ADD; a separate instance, so rms_norm's own keeps its registers) */
template <typename R, bool ADD>
__global__ void __launch_bounds__(1024) rms_norm_dx_kernel(void *dx, int dx_dt, const void *g, int g_dt, fl_cu_lanes gl,
                                   const void *x, int x_dt, fl_cu_lanes xl, const void *w,
                                   int w_dt, int64_t ws, const R *rstd, int64_t rows, int64_t n,
                                   const void *gh, int gh_dt, fl_cu_lanes hl) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t xo = fl_cu_lane_offset(xl, r), go = fl_cu_lane_offset(gl, r);
        R inv = rstd[r], dot = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R dn = fl_cu_ld<R>(g, go + i * gl.step, g_dt);
            if (w) dn *= fl_cu_ld<R>(w, i * ws, w_dt);
            dot += dn * fl_cu_ld<R>(x, xo + i * xl.step, x_dt);
        }
        dot = fl_cu_block_sum(dot);
        R c = (R)((double)dot / (double)n) * inv * inv;
        /* (h's lane found only now: one offset fewer live across the reduction) */
        int64_t ho = ADD ? fl_cu_lane_offset(hl, r) : 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R dn = fl_cu_ld<R>(g, go + i * gl.step, g_dt);
            if (w) dn *= fl_cu_ld<R>(w, i * ws, w_dt);
            R xv = fl_cu_ld<R>(x, xo + i * xl.step, x_dt), d = inv * (dn - xv * c);
            /* add_rms_norm: h's own gradient added once, in R */
            if (ADD) d = add_rn(d, fl_cu_ld<R>(gh, ho + i * hl.step, gh_dt));
            fl_cu_st(dx, r * n + i, dx_dt, d);
        }
    }
}

/* ---- the vector path (cuda_vec.cuh) -----------------------------------------
 * Taken per call where x's lanes (and g's) are contiguous and each starts a
 * 16-byte vector, the compute type is f32, x is of dtype XD (f32, bf16,
 * f16) and the weight, the forward's output and the backward's g are of
 * dtype OD: x's, or f32 for a 16-bit x with an f32 weight (norm.c's
 * promotion). A thread takes chunks of K elements (one x vector; for OD f32
 * and a 16-bit x, two OD vectors); the first ROW_CACHE chunks it takes stay
 * in registers from the reduction pass to the output pass, so a row of up
 * to ROW_CACHE * 512 chunks (8192 bf16) is read from memory once. Past
 * the last whole chunk (a single row whose length is not whole vectors) the
 * elements go one by one. Per element the arithmetic is the scalar
 * kernels'; the row sums add in another order (per thread, chunk by chunk),
 * so the statistics may differ from the scalar path's by rounding. */
const int ROW_CACHE = 2;
const int VEC_COLS = 64; /* threads (column chunks) per block of the vector partials */

int64_t param_stride(const fl_tensor *t) { return t && t->ndim ? t->stride[0] : 0; }

/* x of dtype xd with the weight side (weight, output, g) of od: a pair the
 * vector kernels are built for. */
bool vec_pair_ok(fl_dtype xd, fl_dtype od) {
    return fl_cu_vec_dtype(xd) && (od == xd || (od == FL_F32 && (xd == FL_BF16 || xd == FL_F16)));
}

/* No weight, or one of dtype od, contiguous and aligned. */
bool vec_weight_ok(const fl_tensor *w, fl_dtype od, int64_t n) {
    return !w || (w->dtype == od && (param_stride(w) == 1 || n <= 1) && fl_cu_vec_aligned(w->data));
}

/* Run BODY with compile-time XD and OD bound to a pair vec_pair_ok accepts. */
#define vec_pair_dispatch(xd, od, XD, OD, ...)                                                     \
    do {                                                                                           \
        if ((xd) == (od)) {                                                                        \
            fl_cu_vec_dispatch(xd, XD, constexpr int OD = XD; __VA_ARGS__);                        \
        } else if ((xd) == FL_BF16) {                                                              \
            constexpr int XD = FL_BF16, OD = FL_F32;                                               \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            constexpr int XD = FL_F16, OD = FL_F32;                                                \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

/* Threads for a row of `chunks` chunks: about ROW_CACHE chunks each. */
int vec_row_threads(int64_t chunks) { return fl_cu_vec_row_threads((chunks + ROW_CACHE - 1) / ROW_CACHE); }

template <int XD, int OD>
__global__ void __launch_bounds__(FL_CU_VEC_ROW_THREADS)
    rms_norm_vec_kernel(void *out, float *rstd, const void *x, fl_cu_lanes xl, const void *w, int64_t rows,
                        int64_t n, double eps, void *h, const void *b, fl_cu_lanes bl) {
    typedef fl_cu_vec<XD> XV;
    constexpr int K = XV::N;
    int64_t chunks = n / K, nt = blockDim.x;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const char *xr = (const char *)x + fl_cu_lane_offset(xl, r) * XV::SIZE;
        void *orow = (char *)out + r * n * fl_cu_vec<OD>::SIZE;
        /* With b (add_rms_norm): chunk v of h = x + b, rounded to XD as the
         * vector add rounds and stored to h's row; pass 2 reads h's row. */
        const char *br = b ? (const char *)b + fl_cu_lane_offset(bl, r) * XV::SIZE : NULL;
        char *hrow = b ? (char *)h + r * n * XV::SIZE : NULL;
        auto row = [&](int64_t v) {
            XV e = XV::load(xr, v);
            if (b) {
                XV f = XV::load(br, v);
#pragma unroll
                for (int k = 0; k < K; k++) e.set(k, __fadd_rn(e.get(k), f.get(k)));
                e.store(hrow, v);
            }
            return e;
        };
        auto elem = [&](int64_t i) {
            float e = fl_cu_vget<XD>(xr, i);
            if (!b) return e;
            fl_cu_vput<XD>(hrow, i, __fadd_rn(e, fl_cu_vget<XD>(br, i)));
            return fl_cu_vget<XD>(hrow, i);
        };
        const char *src = b ? hrow : xr;
        XV c[ROW_CACHE];
        float ss = 0;
#pragma unroll
        for (int j = 0; j < ROW_CACHE; j++) {
            int64_t v = threadIdx.x + j * nt;
            if (v < chunks) {
                c[j] = row(v);
#pragma unroll
                for (int k = 0; k < K; k++) ss += c[j].get(k) * c[j].get(k);
            }
        }
        for (int64_t v = threadIdx.x + ROW_CACHE * nt; v < chunks; v += nt) {
            XV a = row(v);
#pragma unroll
            for (int k = 0; k < K; k++) ss += a.get(k) * a.get(k);
        }
        for (int64_t i = chunks * K + threadIdx.x; i < n; i += nt) {
            float e = elem(i);
            ss += e * e;
        }
        ss = fl_cu_block_sum(ss);
        float inv = (float)(1.0 / sqrt((double)ss / (double)n + eps));
        if (threadIdx.x == 0) rstd[r] = inv;
        /* y = round_x(x * inv) * w, as rms_norm_kernel with round_dt = XD */
        auto emit = [&](const XV &a, int64_t v) {
            float y[K], wv[K];
#pragma unroll
            for (int k = 0; k < K; k++) y[k] = fl_cu_round_to(a.get(k) * inv, XD);
            if (w) {
                fl_cu_vload<OD, K>(w, v * K, wv);
#pragma unroll
                for (int k = 0; k < K; k++) y[k] *= wv[k];
            }
            fl_cu_vstore<OD, K>(orow, v * K, y);
        };
#pragma unroll
        for (int j = 0; j < ROW_CACHE; j++) {
            int64_t v = threadIdx.x + j * nt;
            if (v < chunks) emit(c[j], v);
        }
        for (int64_t v = threadIdx.x + ROW_CACHE * nt; v < chunks; v += nt) emit(XV::load(src, v), v);
        for (int64_t i = chunks * K + threadIdx.x; i < n; i += nt) {
            float y = fl_cu_round_to(fl_cu_vget<XD>(src, i) * inv, XD);
            if (w) y *= fl_cu_vget<OD>(w, i);
            fl_cu_vput<OD>(orow, i, y);
        }
    }
}

/* dx = inv * (dn - x * mean(dn * x) * inv^2), dn = g * w, as rms_norm_dx_kernel:
 * g (dtype OD) and x chunks both kept between the passes. */
template <int XD, int OD, bool ADD>
__global__ void __launch_bounds__(FL_CU_VEC_ROW_THREADS)
    rms_norm_dx_vec_kernel(void *dx, const void *g, fl_cu_lanes gl, const void *x, fl_cu_lanes xl, const void *w,
                           const float *rstd, int64_t rows, int64_t n, const void *gh, fl_cu_lanes hl) {
    typedef fl_cu_vec<XD> XV;
    constexpr int K = XV::N;
    int64_t chunks = n / K, nt = blockDim.x;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const char *xr = (const char *)x + fl_cu_lane_offset(xl, r) * XV::SIZE;
        const char *gr = (const char *)g + fl_cu_lane_offset(gl, r) * fl_cu_vec<OD>::SIZE;
        void *drow = (char *)dx + r * n * XV::SIZE;
        /* add_rms_norm: h's own gradient (dtype XD) added to each result */
        const char *ghr = ADD ? (const char *)gh + fl_cu_lane_offset(hl, r) * XV::SIZE : NULL;
        float inv = rstd[r], dot = 0;
        float cg[ROW_CACHE][K];
        XV cx[ROW_CACHE];
        /* dn = g * w in place */
        auto dn_of = [&](float (&dn)[K], int64_t v) {
            fl_cu_vload<OD, K>(gr, v * K, dn);
            if (w) {
                float wv[K];
                fl_cu_vload<OD, K>(w, v * K, wv);
#pragma unroll
                for (int k = 0; k < K; k++) dn[k] *= wv[k];
            }
        };
#pragma unroll
        for (int j = 0; j < ROW_CACHE; j++) {
            int64_t v = threadIdx.x + j * nt;
            if (v < chunks) {
                dn_of(cg[j], v);
                cx[j] = XV::load(xr, v);
#pragma unroll
                for (int k = 0; k < K; k++) dot += cg[j][k] * cx[j].get(k);
            }
        }
        for (int64_t v = threadIdx.x + ROW_CACHE * nt; v < chunks; v += nt) {
            float dn[K];
            dn_of(dn, v);
            XV a = XV::load(xr, v);
#pragma unroll
            for (int k = 0; k < K; k++) dot += dn[k] * a.get(k);
        }
        for (int64_t i = chunks * K + threadIdx.x; i < n; i += nt) {
            float dn = fl_cu_vget<OD>(gr, i);
            if (w) dn *= fl_cu_vget<OD>(w, i);
            dot += dn * fl_cu_vget<XD>(xr, i);
        }
        dot = fl_cu_block_sum(dot);
        float c = (float)((double)dot / (double)n) * inv * inv;
        auto emit = [&](const float (&dn)[K], const XV &a, int64_t v) {
            float d[K];
#pragma unroll
            for (int k = 0; k < K; k++) d[k] = inv * (dn[k] - a.get(k) * c);
            if (ADD) {
                XV e = XV::load(ghr, v);
#pragma unroll
                for (int k = 0; k < K; k++) d[k] = __fadd_rn(d[k], e.get(k));
            }
            fl_cu_vstore<XD, K>(drow, v * K, d);
        };
#pragma unroll
        for (int j = 0; j < ROW_CACHE; j++) {
            int64_t v = threadIdx.x + j * nt;
            if (v < chunks) emit(cg[j], cx[j], v);
        }
        for (int64_t v = threadIdx.x + ROW_CACHE * nt; v < chunks; v += nt) {
            float dn[K];
            dn_of(dn, v);
            emit(dn, XV::load(xr, v), v);
        }
        for (int64_t i = chunks * K + threadIdx.x; i < n; i += nt) {
            float dn = fl_cu_vget<OD>(gr, i);
            if (w) dn *= fl_cu_vget<OD>(w, i);
            float d = inv * (dn - fl_cu_vget<XD>(xr, i) * c);
            fl_cu_vput<XD>(drow, i, ADD ? __fadd_rn(d, fl_cu_vget<XD>(ghr, i)) : d);
        }
    }
}

/* RMSNorm's column partials (column_partials_kernel with mean NULL) a chunk
 * of K columns per thread: the same sums in the same row order, so the
 * same bits. n is whole chunks. */
template <int XD, int OD>
__global__ void __launch_bounds__(1024) rms_column_partials_vec_kernel(float *pw, const void *g, fl_cu_lanes gl,
                                                                        const void *x, fl_cu_lanes xl,
                                                                        const float *rstd, int64_t rows,
                                                                        int64_t n, int64_t rows_per_group) {
    typedef fl_cu_vec<XD> XV;
    constexpr int K = XV::N;
    int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= n / K) return;
    int64_t r0 = (int64_t)blockIdx.y * rows_per_group;
    int64_t r1 = r0 + rows_per_group < rows ? r0 + rows_per_group : rows;
    float sw[K];
#pragma unroll
    for (int k = 0; k < K; k++) sw[k] = 0;
#pragma unroll 2
    for (int64_t r = r0; r < r1; r++) {
        float gv[K];
        fl_cu_vload<OD, K>(g, fl_cu_lane_offset(gl, r) + v * K, gv);
        XV a = XV::load((const char *)x + fl_cu_lane_offset(xl, r) * XV::SIZE, v);
        float inv = rstd[r];
#pragma unroll
        for (int k = 0; k < K; k++) sw[k] += gv[k] * (a.get(k) * inv);
    }
    fl_cu_vstore<FL_F32, K>(pw, (int64_t)blockIdx.y * n + v * K, sw);
}

template <typename R>
__global__ void __launch_bounds__(1024) layer_norm_kernel(void *out, int out_dt, R *mean, R *rstd, const void *x,
                                  int x_dt, fl_cu_lanes xl, const void *w, int w_dt, int64_t ws,
                                  const void *b, int b_dt, int64_t bs, int64_t rows, int64_t n,
                                  double eps) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t xo = fl_cu_lane_offset(xl, r), xs = xl.step;
        /* Two passes: the mean, then the centred variance (accurate when
         * |mean| >> std), as the CPU. */
        R s = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += fl_cu_ld<R>(x, xo + i * xs, x_dt);
        s = fl_cu_block_sum(s);
        R m = (R)((double)s / (double)n), v = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R d = fl_cu_ld<R>(x, xo + i * xs, x_dt) - m;
            v += d * d;
        }
        v = fl_cu_block_sum(v);
        R inv = (R)(1.0 / sqrt((double)v / (double)n + eps));
        if (threadIdx.x == 0) {
            mean[r] = m;
            rstd[r] = inv;
        }
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R y = (fl_cu_ld<R>(x, xo + i * xs, x_dt) - m) * inv;
            if (w) y *= fl_cu_ld<R>(w, i * ws, w_dt);
            if (b) y += fl_cu_ld<R>(b, i * bs, b_dt);
            fl_cu_st(out, r * n + i, out_dt, y);
        }
    }
}

/* dx = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * w */
template <typename R>
__global__ void __launch_bounds__(1024) layer_norm_dx_kernel(void *dx, int dx_dt, const void *g, int g_dt,
                                     fl_cu_lanes gl, const void *x, int x_dt, fl_cu_lanes xl,
                                     const void *w, int w_dt, int64_t ws, const R *mean,
                                     const R *rstd, int64_t rows, int64_t n) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t xo = fl_cu_lane_offset(xl, r), go = fl_cu_lane_offset(gl, r);
        R m = mean[r], inv = rstd[r], s1 = 0, s2 = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R dh = fl_cu_ld<R>(g, go + i * gl.step, g_dt);
            if (w) dh *= fl_cu_ld<R>(w, i * ws, w_dt);
            R xh = (fl_cu_ld<R>(x, xo + i * xl.step, x_dt) - m) * inv;
            s1 += dh;
            s2 += dh * xh;
        }
        s1 = fl_cu_block_sum(s1);
        s2 = fl_cu_block_sum(s2);
        R c1 = (R)((double)s1 / (double)n), c2 = (R)((double)s2 / (double)n);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R dh = fl_cu_ld<R>(g, go + i * gl.step, g_dt);
            if (w) dh *= fl_cu_ld<R>(w, i * ws, w_dt);
            R xh = (fl_cu_ld<R>(x, xo + i * xl.step, x_dt) - m) * inv;
            fl_cu_st(dx, r * n + i, dx_dt, inv * (dh - c1 - xh * c2));
        }
    }
}

/* Partial column sums over a group of rows: pw[grp, col] += g * xhat and
 * pb[grp, col] += g, xhat = (x - mean) * rstd (mean NULL: RMSNorm, 0).
 * Grid: (column blocks, groups). */
template <typename R>
__global__ void __launch_bounds__(1024) column_partials_kernel(R *pw, R *pb, const void *g, int g_dt, fl_cu_lanes gl,
                                       const void *x, int x_dt, fl_cu_lanes xl, const R *mean,
                                       const R *rstd, int64_t rows, int64_t n,
                                       int64_t rows_per_group) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= n) return;
    int64_t r0 = (int64_t)blockIdx.y * rows_per_group;
    int64_t r1 = r0 + rows_per_group < rows ? r0 + rows_per_group : rows;
    R sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; r++) {
        R gv = fl_cu_ld<R>(g, fl_cu_lane_offset(gl, r) + col * gl.step, g_dt);
        if (pw) {
            R xv = fl_cu_ld<R>(x, fl_cu_lane_offset(xl, r) + col * xl.step, x_dt);
            sw += gv * ((xv - (mean ? mean[r] : (R)0)) * rstd[r]);
        }
        sb += gv;
    }
    int64_t at = (int64_t)blockIdx.y * n + col;
    if (pw) pw[at] = sw;
    if (pb) pb[at] = sb;
}

/* dst[col] = sum over groups of parts[grp, col], in double, group order. */
template <typename R>
__global__ void __launch_bounds__(1024) column_finish_kernel(void *dst, int dst_dt, const R *parts, int64_t groups,
                                     int64_t n) {
    for (int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; col < n;
         col += (int64_t)gridDim.x * blockDim.x) {
        double s = 0;
        for (int64_t k = 0; k < groups; k++) s += (double)parts[k * n + col];
        fl_cu_st(dst, col, dst_dt, (R)s);
    }
}

template <typename R> fl_dtype dtype_of();
template <> fl_dtype dtype_of<float>() { return FL_F32; }
template <> fl_dtype dtype_of<double>() { return FL_F64; }

/* dw (and db) from g, x and the statistics: the two passes above. */
template <typename R>
int column_sums(const char *op, fl_tensor *dw, fl_tensor *db, const fl_tensor *g,
                const fl_tensor *x, const R *mean, const R *rstd, int64_t rows, int64_t n,
                bool vec = false) {
    int dim = x->ndim - 1;
    if (n == 0) return FL_OK;
    int64_t groups = (rows + 15) / 16;
    if (groups > MAX_GROUPS) groups = MAX_GROUPS;
    if (groups < 1) groups = 1;
    int64_t per = (rows + groups - 1) / groups;
    if (per < 1) per = 1;
    fl_tensor *pw = dw ? fl_cu_scratch(groups * n, dtype_of<R>(), x) : NULL;
    fl_tensor *pb = db ? fl_cu_scratch(groups * n, dtype_of<R>(), x) : NULL;
    int rc = (dw && !pw) || (db && !pb) ? (int)fl_last_status() : FL_OK;
    if (!rc && vec && sizeof(R) == 4 && !db && fl_cu_vec_aligned(pw->data)) {
        /* RMSNorm's dw, a chunk of columns per thread (the caller checked
         * x and g as for the vector dx, and n whole chunks). */
        int64_t chunks = n / (FL_CU_VEC_BYTES / (int64_t)fl_dtype_size(x->dtype));
        dim3 grid((unsigned)((chunks + VEC_COLS - 1) / VEC_COLS), (unsigned)groups);
        vec_pair_dispatch(x->dtype, g->dtype, XD, OD,
                          rms_column_partials_vec_kernel<XD, OD><<<grid, VEC_COLS, 0, fl_cu_stream()>>>(
                              (float *)pw->data, g->data, fl_cu_lanes_of(g, dim), x->data,
                              fl_cu_lanes_of(x, dim), (const float *)rstd, rows, n, per));
        rc = fl_cu_check(op);
    } else if (!rc) {
        dim3 grid((unsigned)((n + COLS - 1) / COLS), (unsigned)groups);
        column_partials_kernel<R><<<grid, COLS, 0, fl_cu_stream()>>>(
            pw ? (R *)pw->data : NULL, pb ? (R *)pb->data : NULL, g->data, g->dtype,
            fl_cu_lanes_of(g, dim), x->data, x->dtype, fl_cu_lanes_of(x, dim), mean, rstd, rows,
            n, per);
        rc = fl_cu_check(op);
    }
    if (!rc && dw) {
        column_finish_kernel<R><<<fl_cu_blocks(n, 256), 256, 0, fl_cu_stream()>>>(
            dw->data, dw->dtype, (const R *)pw->data, groups, n);
        rc = fl_cu_check(op);
    }
    if (!rc && db) {
        column_finish_kernel<R><<<fl_cu_blocks(n, 256), 256, 0, fl_cu_stream()>>>(
            db->data, db->dtype, (const R *)pb->data, groups, n);
        rc = fl_cu_check(op);
    }
    fl_tensor_release(pw);
    fl_tensor_release(pb);
    return rc;
}


/* a, h: NULL, or add_rms_norm's branch and h (h = x + a normalised). */
template <typename R>
int rms_norm_t(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
               double eps, const fl_tensor *a = NULL, fl_tensor *h = NULL) {
    const char *op = a ? "add_rms_norm" : "rms_norm";
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    if (rows == 0) return FL_OK;
    fl_cu_lanes al = fl_cu_lanes_of(a ? a : x, dim);
    if (sizeof(R) == 4 && vec_pair_ok(x->dtype, out->dtype) && fl_cu_lanes_vec_ok(x, dim) &&
        vec_weight_ok(w, out->dtype, n) && fl_cu_rows_vec_ok(out->data, out->dtype, rows, n) &&
        (!a || (fl_cu_lanes_vec_ok(a, dim) && fl_cu_rows_vec_ok(h->data, h->dtype, rows, n)))) {
        int threads = vec_row_threads(n / (FL_CU_VEC_BYTES / (int64_t)fl_dtype_size(x->dtype)));
        vec_pair_dispatch(x->dtype, out->dtype, XD, OD,
                          rms_norm_vec_kernel<XD, OD><<<fl_cu_row_blocks(rows), threads, 0, fl_cu_stream()>>>(
                              out->data, (float *)rstd->data, x->data, fl_cu_lanes_of(x, dim),
                              w ? w->data : NULL, rows, n, eps, h ? h->data : NULL, a ? a->data : NULL, al));
        return fl_cu_check(op);
    }
    int round_dt = x->dtype == FL_BF16 || x->dtype == FL_F16 ? (int)x->dtype : -1;
    rms_norm_kernel<R><<<fl_cu_row_blocks(rows), fl_cu_row_threads(n), 0, fl_cu_stream()>>>(
        out->data, out->dtype, (R *)rstd->data, x->data, x->dtype, fl_cu_lanes_of(x, dim),
        w ? w->data : NULL, w ? w->dtype : 0, param_stride(w), rows, n, eps, round_dt,
        h ? h->data : NULL, a ? a->data : NULL, al);
    return fl_cu_check(op);
}

/* gh: NULL, or add_rms_norm's gradient of h, added to dx. */
template <typename R>
int rms_norm_backward_t(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g, const fl_tensor *x,
                        const fl_tensor *w, const fl_tensor *rstd, const fl_tensor *gh = NULL) {
    const char *op = gh ? "add_rms_norm backward" : "rms_norm backward";
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    fl_cu_lanes hl = fl_cu_lanes_of(gh ? gh : x, dim);
    /* The vector path when x, g, w (and dx) suit it: see rms_norm_vec_kernel. */
    bool vec = sizeof(R) == 4 && rows > 0 && vec_pair_ok(x->dtype, g->dtype) && fl_cu_lanes_vec_ok(x, dim) &&
               fl_cu_lanes_vec_ok(g, dim) && vec_weight_ok(w, g->dtype, n);
    if (dx && vec && dx->dtype == x->dtype && fl_cu_rows_vec_ok(dx->data, dx->dtype, rows, n) &&
        (!gh || (gh->dtype == x->dtype && fl_cu_lanes_vec_ok(gh, dim)))) {
        int threads = vec_row_threads(n / (FL_CU_VEC_BYTES / (int64_t)fl_dtype_size(x->dtype)));
        if (gh)
            vec_pair_dispatch(x->dtype, g->dtype, XD, OD,
                              rms_norm_dx_vec_kernel<XD, OD, true><<<fl_cu_row_blocks(rows), threads, 0,
                                                                     fl_cu_stream()>>>(
                                  dx->data, g->data, fl_cu_lanes_of(g, dim), x->data, fl_cu_lanes_of(x, dim),
                                  w ? w->data : NULL, (const float *)rstd->data, rows, n, gh->data, hl));
        else
            vec_pair_dispatch(x->dtype, g->dtype, XD, OD,
                              rms_norm_dx_vec_kernel<XD, OD, false><<<fl_cu_row_blocks(rows), threads, 0,
                                                                      fl_cu_stream()>>>(
                                  dx->data, g->data, fl_cu_lanes_of(g, dim), x->data, fl_cu_lanes_of(x, dim),
                                  w ? w->data : NULL, (const float *)rstd->data, rows, n, (const void *)NULL, hl));
        if (fl_cu_check(op)) return fl_last_status();
    } else if (dx && rows > 0) {
        if (gh)
            rms_norm_dx_kernel<R, true><<<fl_cu_row_blocks(rows), fl_cu_row_threads(n), 0, fl_cu_stream()>>>(
                dx->data, dx->dtype, g->data, g->dtype, fl_cu_lanes_of(g, dim), x->data, x->dtype,
                fl_cu_lanes_of(x, dim), w ? w->data : NULL, w ? w->dtype : 0, param_stride(w),
                (const R *)rstd->data, rows, n, gh->data, gh->dtype, hl);
        else
            rms_norm_dx_kernel<R, false><<<fl_cu_row_blocks(rows), fl_cu_row_threads(n), 0, fl_cu_stream()>>>(
                dx->data, dx->dtype, g->data, g->dtype, fl_cu_lanes_of(g, dim), x->data, x->dtype,
                fl_cu_lanes_of(x, dim), w ? w->data : NULL, w ? w->dtype : 0, param_stride(w),
                (const R *)rstd->data, rows, n, (const void *)NULL, 0, hl);
        if (fl_cu_check(op)) return fl_last_status();
    }
    if (dw && rows == 0) return fl_fill_(dw, 0);
    return dw ? column_sums<R>(op, dw, NULL, g, x, NULL, (const R *)rstd->data, rows, n,
                               vec && n % (FL_CU_VEC_BYTES / (int64_t)fl_dtype_size(x->dtype)) == 0)
              : FL_OK;
}

template <typename R>
int layer_norm_t(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                 const fl_tensor *w, const fl_tensor *b, double eps) {
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    if (rows == 0) return FL_OK;
    layer_norm_kernel<R><<<fl_cu_row_blocks(rows), fl_cu_row_threads(n), 0, fl_cu_stream()>>>(
        out->data, out->dtype, (R *)mean->data, (R *)rstd->data, x->data, x->dtype,
        fl_cu_lanes_of(x, dim), w ? w->data : NULL, w ? w->dtype : 0, param_stride(w),
        b ? b->data : NULL, b ? b->dtype : 0, param_stride(b), rows, n, eps);
    return fl_cu_check("layer_norm");
}

template <typename R>
int layer_norm_backward_t(fl_tensor *dx, fl_tensor *dw, fl_tensor *db, const fl_tensor *g,
                          const fl_tensor *x, const fl_tensor *w, const fl_tensor *mean,
                          const fl_tensor *rstd) {
    const char *op = "layer_norm backward";
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    if (dx && rows > 0) {
        layer_norm_dx_kernel<R><<<fl_cu_row_blocks(rows), fl_cu_row_threads(n), 0,
                                  fl_cu_stream()>>>(
            dx->data, dx->dtype, g->data, g->dtype, fl_cu_lanes_of(g, dim), x->data, x->dtype,
            fl_cu_lanes_of(x, dim), w ? w->data : NULL, w ? w->dtype : 0, param_stride(w),
            (const R *)mean->data, (const R *)rstd->data, rows, n);
        if (fl_cu_check(op)) return fl_last_status();
    }
    if (rows == 0) {
        if (dw && fl_fill_(dw, 0)) return fl_last_status();
        if (db && fl_fill_(db, 0)) return fl_last_status();
        return FL_OK;
    }
    if (!dw && !db) return FL_OK;
    return column_sums<R>(op, dw, db, g, x, (const R *)mean->data, (const R *)rstd->data, rows,
                          n);
}

} // namespace

/* ---- entries of the table (cuda_fused.cu), dispatched like the CPU's ----- */

int fl_cuda_rms_norm(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
                     double eps) {
    if (fl_cu_use_device("rms_norm", x)) return fl_last_status();
    return rstd->dtype == FL_F64 ? rms_norm_t<double>(out, rstd, x, w, eps)
                                 : rms_norm_t<float>(out, rstd, x, w, eps);
}

int fl_cuda_rms_norm_backward(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g,
                              const fl_tensor *x, const fl_tensor *w, const fl_tensor *rstd) {
    if (fl_cu_use_device("rms_norm backward", x)) return fl_last_status();
    return rstd->dtype == FL_F64 ? rms_norm_backward_t<double>(dx, dw, g, x, w, rstd)
                                 : rms_norm_backward_t<float>(dx, dw, g, x, w, rstd);
}

int fl_cuda_add_rms_norm(fl_tensor *h, fl_tensor *out, fl_tensor *rstd, const fl_tensor *x,
                         const fl_tensor *a, const fl_tensor *w, double eps) {
    if (fl_cu_use_device("add_rms_norm", x)) return fl_last_status();
    return rstd->dtype == FL_F64 ? rms_norm_t<double>(out, rstd, x, w, eps, a, h)
                                 : rms_norm_t<float>(out, rstd, x, w, eps, a, h);
}

int fl_cuda_add_rms_norm_backward(fl_tensor *dh, fl_tensor *dw, const fl_tensor *gh,
                                  const fl_tensor *gy, const fl_tensor *h, const fl_tensor *w,
                                  const fl_tensor *rstd) {
    if (fl_cu_use_device("add_rms_norm backward", h)) return fl_last_status();
    return rstd->dtype == FL_F64 ? rms_norm_backward_t<double>(dh, dw, gy, h, w, rstd, gh)
                                 : rms_norm_backward_t<float>(dh, dw, gy, h, w, rstd, gh);
}

int fl_cuda_layer_norm(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                       const fl_tensor *w, const fl_tensor *b, double eps) {
    if (fl_cu_use_device("layer_norm", x)) return fl_last_status();
    return rstd->dtype == FL_F64 ? layer_norm_t<double>(out, mean, rstd, x, w, b, eps)
                                 : layer_norm_t<float>(out, mean, rstd, x, w, b, eps);
}

int fl_cuda_layer_norm_backward(fl_tensor *dx, fl_tensor *dw, fl_tensor *db, const fl_tensor *g,
                                const fl_tensor *x, const fl_tensor *w, const fl_tensor *mean,
                                const fl_tensor *rstd) {
    if (fl_cu_use_device("layer_norm backward", x)) return fl_last_status();
    return rstd->dtype == FL_F64
               ? layer_norm_backward_t<double>(dx, dw, db, g, x, w, mean, rstd)
               : layer_norm_backward_t<float>(dx, dw, db, g, x, w, mean, rstd);
}
