/*
 * cpu_softmax_gen.h: the CPU's softmax and log_softmax, forward and backward, written once for a compute type
 * R (see cpu_lanes_gen.h, included before it) and instantiated by
 * cpu_softmax.c for float and double.
 */

/* ---- softmax, log_softmax --------------------------------------------------------- */

static int FN(softmax)(fl_tensor *out, const fl_tensor *x, int dim, bool is_log) {
    int64_t n = fl_fused_lane_len(x, dim);
    if (n == 0 || x->numel == 0) return FL_OK;
    int64_t lanes = x->numel / n;
    int64_t xs = fl_fused_lane_stride(x, dim), os = fl_fused_lane_stride(out, dim);
    bool oom = false;
#pragma omp parallel if (x->numel >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(2 * n) * sizeof(R));
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t l = 0; l < lanes; l++) {
            if (!buf || oom) continue;
            const R *xr = FN(lane_in)(fl_fused_lane(x, dim, l), x->dtype, xs, n, buf);
            char *op = fl_fused_lane(out, dim, l);
            R *yr = FN(lane_dst)(op, out->dtype, os, buf + n);
            R mx = FN(row_max)(xr, n);
            if (is_log) {
                /* (x - max) - log(sum), not x - (max + log(sum)): the
                 * latter rounds the shift at the scale of max. */
                R lsum = (R)log((double)FN(row_exp)(NULL, xr, n, mx));
                for (int64_t i = 0; i < n; i++) yr[i] = (xr[i] - mx) - lsum;
            } else {
                R inv = 1 / FN(row_exp)(yr, xr, n, mx);
                for (int64_t i = 0; i < n; i++) yr[i] *= inv;
            }
            FN(lane_out)(op, out->dtype, os, n, yr);
        }
        free(buf);
    }
    return oom ? fl_fail(FL_ERR_OOM, "%s: out of CPU memory for scratch rows",
                         is_log ? "log_softmax" : "softmax")
               : FL_OK;
}

static int FN(softmax_backward)(fl_tensor *dx, const fl_tensor *g, const fl_tensor *y, int dim,
                                bool is_log) {
    int64_t n = fl_fused_lane_len(y, dim);
    if (n == 0 || y->numel == 0) return FL_OK;
    int64_t lanes = y->numel / n;
    bool oom = false;
#pragma omp parallel if (y->numel >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(3 * n) * sizeof(R));
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t l = 0; l < lanes; l++) {
            if (!buf || oom) continue;
            const R *yr = FN(lane_in)(fl_fused_lane(y, dim, l), y->dtype,
                                      fl_fused_lane_stride(y, dim), n, buf);
            const R *gr = FN(lane_in)(fl_fused_lane(g, dim, l), g->dtype,
                                      fl_fused_lane_stride(g, dim), n, buf + n);
            char *dp = fl_fused_lane(dx, dim, l);
            int64_t ds = fl_fused_lane_stride(dx, dim);
            R *dr = FN(lane_dst)(dp, dx->dtype, ds, buf + 2 * n);
            double s = 0;
            if (is_log) {
                /* dx = g - softmax * sum(g), softmax = exp(log_softmax) */
#pragma omp simd reduction(+ : s)
                for (int64_t i = 0; i < n; i++) s += gr[i];
                FN(row_exp_affine)(dr, yr, n, 0, -(R)s, 0, gr);
            } else {
                /* dx = y * (g - sum(g * y)) */
#pragma omp simd reduction(+ : s)
                for (int64_t i = 0; i < n; i++) s += (double)(gr[i] * yr[i]);
                R sr = (R)s;
                for (int64_t i = 0; i < n; i++) dr[i] = yr[i] * (gr[i] - sr);
            }
            FN(lane_out)(dp, dx->dtype, ds, n, dr);
        }
        free(buf);
    }
    return oom ? fl_fail(FL_ERR_OOM, "softmax backward: out of CPU memory for scratch rows")
               : FL_OK;
}
