/*
 * cuda_loss.cu: cross-entropy and NLL loss on CUDA, forward and backward,
 * with the CPU's semantics (cpu_loss_gen.h): per-row loss
 * lse - x[t] (label smoothing: (1 - ls) * that + ls * (lse - mean(x))),
 * rows whose target is ignore_index contribute 0 and are not counted, a
 * target out of range is an error naming the first such row.
 *
 * The op needs the total and the count on the host (it divides for
 * 'mean'), so the forward ends in a sync: per-row losses go to a scratch
 * vector, one block sums them in double in row order (deterministic, the
 * same total on every run), and the two scalars and the first bad row
 * (found with atomicMin) come back in one small copy. The bad target's
 * value is then read from the targets on the host, so the message names
 * the same row and value as the CPU's.
 */
#include "cuda_fused.cuh"

namespace {

const unsigned long long NO_ROW = ~0ull;

/* Device results of a loss forward: read back by finish_loss. */
struct loss_result {
    double total;
    double count;
    unsigned long long bad_row;
};

__device__ __forceinline__ bool target_ok(int64_t t, int64_t C) { return t >= 0 && t < C; }

/* Row r of a cross-entropy forward whose target t is ignored or out of
 * range: thread 0 zeroes its results and records a bad target. True when
 * the row is done so (every thread of the block gets the same answer). */
template <typename R>
__device__ __forceinline__ bool ce_skip_row(int64_t r, int64_t t, int64_t C, int64_t ignore, R *lse, R *row_loss,
                                            void *rows_out, int ro_dt, loss_result *res) {
    if (t != ignore && target_ok(t, C)) return false;
    if (threadIdx.x == 0) {
        if (t != ignore) atomicMin(&res->bad_row, (unsigned long long)r);
        lse[r] = 0;
        row_loss[r] = 0;
        if (rows_out) fl_cu_st(rows_out, r, ro_dt, (R)0);
    }
    return true;
}

/* Thread 0 of row r's block: its log-sum-exp and loss from the row's max,
 * sum of exps, sum of logits (label smoothing) and target logit xt. */
template <typename R>
__device__ __forceinline__ void ce_finish_row(int64_t r, R mx, R sum, R sx, R xt, R smooth, int64_t C, R *lse,
                                              R *row_loss, void *rows_out, int ro_dt) {
    R l = mx + (R)log((double)sum);
    R loss = l - xt;
    if (smooth > 0) loss = (1 - smooth) * loss + smooth * (l - (R)((double)sx / (double)C));
    lse[r] = l;
    row_loss[r] = loss;
    if (rows_out) fl_cu_st(rows_out, r, ro_dt, loss);
}

/* One block per row of logits [rows, C] (last dim, strided). */
template <typename R>
__global__ void __launch_bounds__(1024) cross_entropy_kernel(R *row_loss, void *rows_out, int ro_dt, R *lse,
                                     const void *x, int x_dt, fl_cu_lanes xl, const void *tg,
                                     int t_dt, int64_t rows, int64_t C, int64_t ignore,
                                     R smooth, loss_result *res) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t t = fl_cu_ld_i64(tg, r, t_dt);
        if (ce_skip_row(r, t, C, ignore, lse, row_loss, rows_out, ro_dt, res)) continue;
        int64_t xo = fl_cu_lane_offset(xl, r), xs = xl.step;
        R mx = (R)-INFINITY, sum = 0, sx = 0;
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
            mx = fmax(mx, fl_cu_ld<R>(x, xo + i * xs, x_dt));
        mx = fl_cu_block_max(mx);
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
            R v = fl_cu_ld<R>(x, xo + i * xs, x_dt);
            sum += fl_cu_exp(v - mx);
            sx += v;
        }
        sum = fl_cu_block_sum(sum);
        if (smooth > 0) sx = fl_cu_block_sum(sx);
        if (threadIdx.x == 0)
            ce_finish_row(r, mx, sum, sx, fl_cu_ld<R>(x, xo + t * xs, x_dt), smooth, C, lse, row_loss, rows_out,
                          ro_dt);
    }
}

/* The vector path of cross_entropy_kernel (cuda_vec.cuh): f32 compute,
 * logits of dtype XD whose rows are contiguous and each start a 16-byte
 * vector. The max and sum-exp passes read a vector per thread step, the
 * elements past the last whole vector one by one. The max is exact in any
 * order; the sums (exp, and x for smoothing) add per thread chunk by chunk,
 * another order than the scalar kernel's, so lse may differ by rounding. */
template <int XD>
__global__ void __launch_bounds__(FL_CU_VEC_ROW_THREADS)
    cross_entropy_vec_kernel(float *row_loss, void *rows_out, int ro_dt, float *lse, const void *x, fl_cu_lanes xl,
                             const void *tg, int t_dt, int64_t rows, int64_t C, int64_t ignore, float smooth,
                             loss_result *res) {
    typedef fl_cu_vec<XD> XV;
    constexpr int K = XV::N;
    int64_t chunks = C / K, nt = blockDim.x;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t t = fl_cu_ld_i64(tg, r, t_dt);
        if (ce_skip_row(r, t, C, ignore, lse, row_loss, rows_out, ro_dt, res)) continue;
        const char *xr = (const char *)x + fl_cu_lane_offset(xl, r) * XV::SIZE;
        float mx = -INFINITY, sum = 0, sx = 0;
        for (int64_t v = threadIdx.x; v < chunks; v += nt) {
            XV a = XV::load(xr, v);
#pragma unroll
            for (int k = 0; k < K; k++) mx = fmax(mx, a.get(k));
        }
        for (int64_t i = chunks * K + threadIdx.x; i < C; i += nt) mx = fmax(mx, fl_cu_vget<XD>(xr, i));
        mx = fl_cu_block_max(mx);
        for (int64_t v = threadIdx.x; v < chunks; v += nt) {
            XV a = XV::load(xr, v);
#pragma unroll
            for (int k = 0; k < K; k++) {
                float e = a.get(k);
                sum += fl_cu_exp(e - mx);
                sx += e;
            }
        }
        for (int64_t i = chunks * K + threadIdx.x; i < C; i += nt) {
            float e = fl_cu_vget<XD>(xr, i);
            sum += fl_cu_exp(e - mx);
            sx += e;
        }
        sum = fl_cu_block_sum(sum);
        if (smooth > 0) sx = fl_cu_block_sum(sx);
        if (threadIdx.x == 0)
            ce_finish_row(r, mx, sum, sx, fl_cu_vget<XD>(xr, t), smooth, C, lse, row_loss, rows_out, ro_dt);
    }
}

/* The vector path of cross_entropy_backward_kernel: logits as above, dx of
 * their dtype with rows starting vectors; per element its arithmetic. */
template <int XD>
__global__ void __launch_bounds__(FL_CU_VEC_ROW_THREADS)
    cross_entropy_backward_vec_kernel(void *dx, const float *g_rows, float g_scalar, const void *x, fl_cu_lanes xl,
                                      const void *tg, int t_dt, const float *lse, int64_t rows, int64_t C,
                                      int64_t ignore, float smooth) {
    typedef fl_cu_vec<XD> XV;
    constexpr int K = XV::N;
    int64_t chunks = C / K, nt = blockDim.x;
    float off = C ? smooth / (float)C : 0.0f;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t t = fl_cu_ld_i64(tg, r, t_dt);
        bool skip = t == ignore || !target_ok(t, C);
        float gs = g_rows ? g_rows[r] : g_scalar, l = lse[r];
        const char *xr = (const char *)x + fl_cu_lane_offset(xl, r) * XV::SIZE;
        char *dr = (char *)dx + r * C * XV::SIZE;
        for (int64_t v = threadIdx.x; v < chunks; v += nt) {
            XV d;
            if (skip) {
#pragma unroll
                for (int k = 0; k < K; k++) d.set(k, 0.0f);
            } else {
                XV a = XV::load(xr, v);
#pragma unroll
                for (int k = 0; k < K; k++) {
                    float e = gs * fl_cu_exp(a.get(k) - l) + -gs * off;
                    if (v * K + k == t) e -= gs * (1 - smooth);
                    d.set(k, e);
                }
            }
            d.store(dr, v);
        }
        for (int64_t i = chunks * K + threadIdx.x; i < C; i += nt) {
            float e = 0;
            if (!skip) {
                e = gs * fl_cu_exp(fl_cu_vget<XD>(xr, i) - l) + -gs * off;
                if (i == t) e -= gs * (1 - smooth);
            }
            fl_cu_vput<XD>(dr, i, e);
        }
    }
}

/* Logits whose rows the vector kernels read (lse in f32). */
bool logits_vec_ok(const fl_tensor *logits, const fl_tensor *lse) {
    return lse->dtype == FL_F32 && fl_cu_lanes_vec_ok(logits, logits->ndim - 1);
}

/* Threads for a row of C elements read a vector at a time. */
int vec_threads(const fl_tensor *logits, int64_t C) {
    return fl_cu_vec_row_threads(C / (FL_CU_VEC_BYTES / (int64_t)fl_dtype_size(logits->dtype)));
}

/* One thread per row: -log_probs[r, t]. */
template <typename R>
__global__ void __launch_bounds__(1024) nll_loss_kernel(R *row_loss, void *rows_out, int ro_dt, const void *lp, int lp_dt,
                                fl_cu_lanes ll, const void *tg, int t_dt, int64_t rows, int64_t C,
                                int64_t ignore, loss_result *res) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
         r += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = fl_cu_ld_i64(tg, r, t_dt);
        R loss = 0;
        if (t != ignore) {
            if (!target_ok(t, C)) {
                atomicMin(&res->bad_row, (unsigned long long)r);
                continue;
            }
            loss = -fl_cu_ld<R>(lp, fl_cu_lane_offset(ll, r) + t * ll.step, lp_dt);
        }
        row_loss[r] = loss;
        if (rows_out) fl_cu_st(rows_out, r, ro_dt, loss);
    }
}

/* One block: total (double, in row order per thread, then a fixed tree)
 * and count of the rows whose target counts. */
template <typename R>
__global__ void __launch_bounds__(1024) loss_total_kernel(const R *row_loss, const void *tg, int t_dt, int64_t rows,
                                  int64_t C, int64_t ignore, loss_result *res) {
    double tot = 0, cnt = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        int64_t t = fl_cu_ld_i64(tg, r, t_dt);
        if (t == ignore || !target_ok(t, C)) continue;
        tot += (double)row_loss[r];
        cnt += 1;
    }
    tot = fl_cu_block_sum(tot);
    cnt = fl_cu_block_sum(cnt);
    if (threadIdx.x == 0) {
        res->total = tot;
        res->count = cnt;
    }
}

/* dlogits = gs * exp(x - lse) - gs * ls / C, minus gs * (1 - ls) at the
 * target; zero rows for ignored targets. One block per row. */
template <typename R>
__global__ void __launch_bounds__(1024) cross_entropy_backward_kernel(void *dx, int dx_dt, const R *g_rows, R g_scalar,
                                              const void *x, int x_dt, fl_cu_lanes xl,
                                              const void *tg, int t_dt, const R *lse,
                                              int64_t rows, int64_t C, int64_t ignore,
                                              R smooth) {
    R off = C ? smooth / (R)C : (R)0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t t = fl_cu_ld_i64(tg, r, t_dt);
        bool skip = t == ignore || !target_ok(t, C);
        R gs = g_rows ? g_rows[r] : g_scalar, l = lse[r];
        int64_t xo = fl_cu_lane_offset(xl, r);
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
            R d = 0;
            if (!skip) {
                d = gs * fl_cu_exp(fl_cu_ld<R>(x, xo + i * xl.step, x_dt) - l) + -gs * off;
                if (i == t) d -= gs * (1 - smooth);
            }
            fl_cu_st(dx, r * C + i, dx_dt, d);
        }
    }
}

template <typename R>
__global__ void __launch_bounds__(1024) nll_loss_backward_kernel(void *dlp, int dt, const R *g_rows, R g_scalar,
                                         const void *tg, int t_dt, int64_t rows, int64_t C,
                                         int64_t ignore) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
         r += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = fl_cu_ld_i64(tg, r, t_dt);
        if (t == ignore || !target_ok(t, C)) continue;
        fl_cu_st(dlp, r * C + t, dt, -(g_rows ? g_rows[r] : g_scalar));
    }
}

/* Scratch for a loss forward: the per-row losses (R) and the results. */
struct loss_scratch {
    fl_tensor *rows, *res;
};

int scratch_begin(const char *op, loss_scratch *s, int64_t rows, fl_dtype r,
                  const fl_tensor *like) {
    s->rows = fl_cu_scratch(rows, r, like);
    s->res = s->rows ? fl_cu_scratch(sizeof(loss_result), FL_U8, like) : NULL;
    if (!s->res) return fl_last_status();
    cudaError_t e = cudaMemsetAsync(s->res->data, 0xff, sizeof(loss_result), fl_cu_stream());
    return e == cudaSuccess ? FL_OK
                            : fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
}

void scratch_end(loss_scratch *s) {
    fl_tensor_release(s->rows);
    fl_tensor_release(s->res);
}

/* Sum the row losses, bring the results to the host, and report the
 * first bad target as the CPU does. */
template <typename R>
int finish_loss(const char *op, loss_scratch *s, const fl_tensor *targets, int64_t C,
                int64_t ignore, double *total, int64_t *count) {
    int64_t rows = targets->numel;
    loss_total_kernel<R><<<1, 1024, 0, fl_cu_stream()>>>((const R *)s->rows->data, targets->data,
                                                          targets->dtype, rows, C, ignore,
                                                          (loss_result *)s->res->data);
    if (fl_cu_check(op) || fl_cuda_nccl_settle()) return fl_last_status();
    loss_result res;
    cudaError_t e = cudaMemcpy(&res, s->res->data, sizeof res, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
    if (res.bad_row != NO_ROW) {
        size_t es = fl_dtype_size(targets->dtype);
        unsigned char v[8] = {0};
        e = cudaMemcpy(v, (const char *)targets->data + (int64_t)res.bad_row * (int64_t)es, es,
                       cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
        return fl_fail(FL_ERR_ARG, "%s: target %lld (at index %lld) is out of range for %lld "
                                   "classes (ignore_index is %lld)",
                       op, (long long)fl_load_i64(v, targets->dtype), (long long)res.bad_row,
                       (long long)C, (long long)ignore);
    }
    *total = res.total;
    *count = (int64_t)res.count;
    return FL_OK;
}

template <typename R>
int cross_entropy_t(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                    const fl_tensor *targets, const fl_loss_params *p, double *total,
                    int64_t *count) {
    const char *op = "cross_entropy";
    int dim = logits->ndim - 1;
    int64_t C = logits->shape[dim], rows = targets->numel;
    if (rows == 0) {
        *total = 0;
        *count = 0;
        return FL_OK;
    }
    loss_scratch s = {NULL, NULL};
    int rc = scratch_begin(op, &s, rows, lse->dtype, logits);
    if (!rc && sizeof(R) == 4 && logits_vec_ok(logits, lse)) {
        fl_cu_vec_dispatch(logits->dtype, XD,
                           cross_entropy_vec_kernel<XD><<<fl_cu_row_blocks(rows), vec_threads(logits, C), 0,
                                                          fl_cu_stream()>>>(
                               (float *)s.rows->data, rows_out ? rows_out->data : NULL,
                               rows_out ? rows_out->dtype : 0, (float *)lse->data, logits->data,
                               fl_cu_lanes_of(logits, dim), targets->data, targets->dtype, rows, C,
                               p->ignore_index, (float)p->label_smoothing, (loss_result *)s.res->data));
        rc = fl_cu_check(op);
    } else if (!rc) {
        cross_entropy_kernel<R><<<fl_cu_row_blocks(rows), fl_cu_row_threads(C), 0,
                                  fl_cu_stream()>>>(
            (R *)s.rows->data, rows_out ? rows_out->data : NULL, rows_out ? rows_out->dtype : 0,
            (R *)lse->data, logits->data, logits->dtype, fl_cu_lanes_of(logits, dim),
            targets->data, targets->dtype, rows, C, p->ignore_index, (R)p->label_smoothing,
            (loss_result *)s.res->data);
        rc = fl_cu_check(op);
    }
    if (!rc) rc = finish_loss<R>(op, &s, targets, C, p->ignore_index, total, count);
    scratch_end(&s);
    return rc;
}

template <typename R>
int nll_loss_t(fl_tensor *rows_out, const fl_tensor *log_probs, const fl_tensor *targets,
               const fl_loss_params *p, double *total, int64_t *count) {
    const char *op = "nll_loss";
    int dim = log_probs->ndim - 1;
    int64_t C = log_probs->shape[dim], rows = targets->numel;
    if (rows == 0) {
        *total = 0;
        *count = 0;
        return FL_OK;
    }
    fl_dtype r = sizeof(R) == 8 ? FL_F64 : FL_F32;
    loss_scratch s = {NULL, NULL};
    int rc = scratch_begin(op, &s, rows, r, log_probs);
    if (!rc) {
        nll_loss_kernel<R><<<fl_cu_blocks(rows, 256), 256, 0, fl_cu_stream()>>>(
            (R *)s.rows->data, rows_out ? rows_out->data : NULL, rows_out ? rows_out->dtype : 0,
            log_probs->data, log_probs->dtype, fl_cu_lanes_of(log_probs, dim), targets->data,
            targets->dtype, rows, C, p->ignore_index, (loss_result *)s.res->data);
        rc = fl_cu_check(op);
    }
    if (!rc) rc = finish_loss<R>(op, &s, targets, C, p->ignore_index, total, count);
    scratch_end(&s);
    return rc;
}

} // namespace

int fl_cuda_cross_entropy(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                          const fl_tensor *targets, const fl_loss_params *p, double *total,
                          int64_t *count) {
    if (fl_cu_use_device("cross_entropy", logits)) return fl_last_status();
    return lse->dtype == FL_F64
               ? cross_entropy_t<double>(rows_out, lse, logits, targets, p, total, count)
               : cross_entropy_t<float>(rows_out, lse, logits, targets, p, total, count);
}

int fl_cuda_cross_entropy_backward(fl_tensor *dlogits, const fl_tensor *g_rows, double g_scalar,
                                   const fl_tensor *logits, const fl_tensor *targets,
                                   const fl_tensor *lse, const fl_loss_params *p) {
    const char *op = "cross_entropy backward";
    int dim = logits->ndim - 1;
    int64_t C = logits->shape[dim], rows = targets->numel;
    if (rows == 0 || C == 0) return FL_OK;
    if (fl_cu_use_device(op, logits)) return fl_last_status();
    unsigned blocks = fl_cu_row_blocks(rows);
    int threads = fl_cu_row_threads(C);
    fl_cu_lanes xl = fl_cu_lanes_of(logits, dim);
    if (logits_vec_ok(logits, lse) && dlogits->dtype == logits->dtype &&
        fl_cu_rows_vec_ok(dlogits->data, dlogits->dtype, rows, C)) {
        fl_cu_vec_dispatch(logits->dtype, XD,
                           cross_entropy_backward_vec_kernel<XD><<<blocks, vec_threads(logits, C), 0, fl_cu_stream()>>>(
                               dlogits->data, g_rows ? (const float *)g_rows->data : NULL, (float)g_scalar,
                               logits->data, xl, targets->data, targets->dtype, (const float *)lse->data, rows,
                               C, p->ignore_index, (float)p->label_smoothing));
    } else if (lse->dtype == FL_F64)
        cross_entropy_backward_kernel<double><<<blocks, threads, 0, fl_cu_stream()>>>(
            dlogits->data, dlogits->dtype, g_rows ? (const double *)g_rows->data : NULL,
            g_scalar, logits->data, logits->dtype, xl, targets->data, targets->dtype,
            (const double *)lse->data, rows, C, p->ignore_index, p->label_smoothing);
    else
        cross_entropy_backward_kernel<float><<<blocks, threads, 0, fl_cu_stream()>>>(
            dlogits->data, dlogits->dtype, g_rows ? (const float *)g_rows->data : NULL,
            (float)g_scalar, logits->data, logits->dtype, xl, targets->data, targets->dtype,
            (const float *)lse->data, rows, C, p->ignore_index, (float)p->label_smoothing);
    return fl_cu_check(op);
}

int fl_cuda_nll_loss(fl_tensor *rows_out, const fl_tensor *log_probs, const fl_tensor *targets,
                     const fl_loss_params *p, double *total, int64_t *count) {
    if (fl_cu_use_device("nll_loss", log_probs)) return fl_last_status();
    return log_probs->dtype == FL_F64
               ? nll_loss_t<double>(rows_out, log_probs, targets, p, total, count)
               : nll_loss_t<float>(rows_out, log_probs, targets, p, total, count);
}

int fl_cuda_nll_loss_backward(fl_tensor *dlp, const fl_tensor *g_rows, double g_scalar,
                              const fl_tensor *targets, const fl_loss_params *p) {
    const char *op = "nll_loss backward";
    int64_t C = dlp->shape[dlp->ndim - 1], rows = targets->numel;
    if (rows == 0) return FL_OK;
    if (fl_cu_use_device(op, dlp)) return fl_last_status();
    unsigned blocks = fl_cu_blocks(rows, 256);
    if (dlp->dtype == FL_F64)
        nll_loss_backward_kernel<double><<<blocks, 256, 0, fl_cu_stream()>>>(
            dlp->data, dlp->dtype, g_rows ? (const double *)g_rows->data : NULL, g_scalar,
            targets->data, targets->dtype, rows, C, p->ignore_index);
    else
        nll_loss_backward_kernel<float><<<blocks, 256, 0, fl_cu_stream()>>>(
            dlp->data, dlp->dtype, g_rows ? (const float *)g_rows->data : NULL, (float)g_scalar,
            targets->data, targets->dtype, rows, C, p->ignore_index);
    return fl_cu_check(op);
}
