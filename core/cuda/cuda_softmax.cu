/*
 * cuda_softmax.cu: softmax and log-softmax along any dim on CUDA, forward
 * and backward, with the CPU's semantics (cpu_softmax_gen.h): math in R
 * (float, double for f64), the max subtracted before exp, log-softmax as
 * (x - max) - log(sum) (not x - (max + log(sum)), which rounds the shift at
 * the scale of max).
 *
 * One block per lane (a row along dim), sized to the lane; inputs and
 * outputs are read through their strides, so softmax along a non-last dim
 * needs no transpose (its reads are strided, which costs bandwidth but not
 * correctness; attention and losses, the hot users, reduce the last dim).
 */
#include "cuda_fused.cuh"

namespace {

template <typename R>
__global__ void __launch_bounds__(1024) softmax_kernel(void *out, int out_dt, fl_cu_lanes ol, const void *x, int x_dt,
                               fl_cu_lanes xl, int64_t lanes, int64_t n, bool is_log) {
    for (int64_t l = blockIdx.x; l < lanes; l += gridDim.x) {
        int64_t xo = fl_cu_lane_offset(xl, l), oo = fl_cu_lane_offset(ol, l);
        R mx = (R)-INFINITY;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            mx = fmax(mx, fl_cu_ld<R>(x, xo + i * xl.step, x_dt));
        mx = fl_cu_block_max(mx);
        R sum = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            sum += fl_cu_exp(fl_cu_ld<R>(x, xo + i * xl.step, x_dt) - mx);
        sum = fl_cu_block_sum(sum);
        if (is_log) {
            R lsum = (R)log((double)sum);
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                fl_cu_st(out, oo + i * ol.step, out_dt,
                         (fl_cu_ld<R>(x, xo + i * xl.step, x_dt) - mx) - lsum);
        } else {
            R inv = 1 / sum;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                fl_cu_st(out, oo + i * ol.step, out_dt,
                         fl_cu_exp(fl_cu_ld<R>(x, xo + i * xl.step, x_dt) - mx) * inv);
        }
    }
}

/* log: dx = g - exp(y) * sum(g); else dx = y * (g - sum(g * y)). */
template <typename R>
__global__ void __launch_bounds__(1024) softmax_backward_kernel(void *dx, int dx_dt, fl_cu_lanes dl, const void *g,
                                        int g_dt, fl_cu_lanes gl, const void *y, int y_dt,
                                        fl_cu_lanes yl, int64_t lanes, int64_t n, bool is_log) {
    for (int64_t l = blockIdx.x; l < lanes; l += gridDim.x) {
        int64_t go = fl_cu_lane_offset(gl, l), yo = fl_cu_lane_offset(yl, l);
        int64_t d0 = fl_cu_lane_offset(dl, l);
        R s = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R gv = fl_cu_ld<R>(g, go + i * gl.step, g_dt);
            s += is_log ? gv : gv * fl_cu_ld<R>(y, yo + i * yl.step, y_dt);
        }
        s = fl_cu_block_sum(s);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            R gv = fl_cu_ld<R>(g, go + i * gl.step, g_dt);
            R yv = fl_cu_ld<R>(y, yo + i * yl.step, y_dt);
            R d = is_log ? -s * fl_cu_exp(yv) + gv : yv * (gv - s);
            fl_cu_st(dx, d0 + i * dl.step, dx_dt, d);
        }
    }
}

int64_t lane_len(const fl_tensor *t, int dim) { return t->ndim ? t->shape[dim] : 1; }

} // namespace

int fl_cuda_softmax(fl_tensor *out, const fl_tensor *x, int dim, bool log) {
    const char *op = log ? "log_softmax" : "softmax";
    int64_t n = lane_len(x, dim);
    if (n == 0 || x->numel == 0) return FL_OK;
    if (fl_cu_use_device(op, x)) return fl_last_status();
    int64_t lanes = x->numel / n;
    unsigned blocks = fl_cu_row_blocks(lanes);
    int threads = fl_cu_row_threads(n);
    fl_cu_lanes ol = fl_cu_lanes_of(out, dim), xl = fl_cu_lanes_of(x, dim);
    if (out->dtype == FL_F64)
        softmax_kernel<double><<<blocks, threads, 0, fl_cu_stream()>>>(
            out->data, out->dtype, ol, x->data, x->dtype, xl, lanes, n, log);
    else
        softmax_kernel<float><<<blocks, threads, 0, fl_cu_stream()>>>(
            out->data, out->dtype, ol, x->data, x->dtype, xl, lanes, n, log);
    return fl_cu_check(op);
}

int fl_cuda_softmax_backward(fl_tensor *dx, const fl_tensor *g, const fl_tensor *y, int dim,
                             bool log) {
    const char *op = log ? "log_softmax backward" : "softmax backward";
    int64_t n = lane_len(y, dim);
    if (n == 0 || y->numel == 0) return FL_OK;
    if (fl_cu_use_device(op, y)) return fl_last_status();
    int64_t lanes = y->numel / n;
    unsigned blocks = fl_cu_row_blocks(lanes);
    int threads = fl_cu_row_threads(n);
    fl_cu_lanes dl = fl_cu_lanes_of(dx, dim), gl = fl_cu_lanes_of(g, dim);
    fl_cu_lanes yl = fl_cu_lanes_of(y, dim);
    if (dx->dtype == FL_F64)
        softmax_backward_kernel<double><<<blocks, threads, 0, fl_cu_stream()>>>(
            dx->data, dx->dtype, dl, g->data, g->dtype, gl, y->data, y->dtype, yl, lanes, n, log);
    else
        softmax_backward_kernel<float><<<blocks, threads, 0, fl_cu_stream()>>>(
            dx->data, dx->dtype, dl, g->data, g->dtype, gl, y->data, y->dtype, yl, lanes, n, log);
    return fl_cu_check(op);
}
