/*
 * cpu_fused_gen.h: the row kernels of the fused family (RMS/layer norm,
 * softmax, cross-entropy, NLL, rotary), written once for a compute type
 * and included by cpu_fused.c twice: with R = float (f32, f16, bf16
 * tensors) and R = double (f64 tensors, where gradient checks need the
 * precision). The includer defines:
 *   R       the compute type           RT  its fl_dtype
 *   FN(x)   x with a type suffix       EXP the exp to use on R
 *
 * Every kernel walks lanes (rows along the reduced dim) in parallel: a
 * lane is read into R (in place when the tensor is already R and dense
 * along the lane, else converted into per-thread scratch), computed, and
 * written out once. Sums of products are accumulated in double.
 */

#include "cpu_fused_rows.h"

/* A lane of n elements at p (dtype dt, element stride st) as R: p itself
 * when it already is, else converted into buf. */
static const R *FN(lane_in)(const char *p, fl_dtype dt, int64_t st, int64_t n, R *buf) {
    if (dt == RT && st == 1) return (const R *)p;
    size_t es = fl_dtype_size(dt);
    for (int64_t i = 0; i < n; i += FL_CPU_SCRATCH) {
        int64_t c = n - i < FL_CPU_SCRATCH ? n - i : FL_CPU_SCRATCH;
        fl_cpu_load(buf + i, RT, p + i * st * (int64_t)es, dt, st, c);
    }
    return buf;
}

/* Where to compute an output lane: the tensor's memory when it is R and
 * dense along the lane, else buf (then FN(lane_out) writes it back). */
static R *FN(lane_dst)(char *p, fl_dtype dt, int64_t st, R *buf) {
    return dt == RT && st == 1 ? (R *)p : buf;
}

static void FN(lane_out)(char *p, fl_dtype dt, int64_t st, int64_t n, const R *src) {
    if ((const void *)src == (const void *)p) return;
    size_t es = fl_dtype_size(dt);
    for (int64_t i = 0; i < n; i += FL_CPU_SCRATCH) {
        int64_t c = n - i < FL_CPU_SCRATCH ? n - i : FL_CPU_SCRATCH;
        fl_cpu_store(p + i * st * (int64_t)es, dt, st, src + i, RT, c);
    }
}

/* A whole 1-d parameter (weight, bias) as a fresh dense R array. */
static R *FN(param)(const fl_tensor *t, int64_t n) {
    if (!t) return NULL;
    R *dst = malloc((size_t)(n ? n : 1) * sizeof(R));
    if (!dst) return NULL;
    const R *src = FN(lane_in)((const char *)t->data, t->dtype, t->stride[0], n, dst);
    if (src != dst) memcpy(dst, src, (size_t)n * sizeof(R));
    return dst;
}

/* Per-thread sums of parameter gradients (dweight, dbias): one row of n
 * doubles per thread, summed in thread order at the end. */
static void FN(reduce_partials)(fl_tensor *dst, const double *parts, int nthreads, int64_t n) {
    double *acc = (double *)parts; /* row 0 collects the others */
    for (int t = 1; t < nthreads; t++)
        for (int64_t i = 0; i < n; i++) acc[i] += parts[(int64_t)t * n + i];
    fl_convert(dst->data, dst->dtype, acc, FL_F64, n);
}

/* ---- RMSNorm ----------------------------------------------------------------- */

static int FN(rms_norm)(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
                        double eps) {
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0, xs = x->stride[dim];
    R *wr = FN(param)(w, n);
    /* Llama casts the normalised f32 value to the input dtype before the
     * weight multiply: for 16-bit inputs the value is rounded through it. */
    bool round16 = x->dtype == FL_BF16 || x->dtype == FL_F16;
    R *rs = rstd->data;
    bool oom = w && !wr;
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(2 * n + 1) * sizeof(R) + (size_t)n * 2);
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            const R *xr = FN(lane_in)(fl_fused_lane(x, dim, r), x->dtype, xs, n, buf);
            char *op = (char *)out->data + r * n * (int64_t)fl_dtype_size(out->dtype);
            R *yr = FN(lane_dst)(op, out->dtype, 1, buf + n);
            double ss = 0;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
            R inv = (R)(1.0 / sqrt(ss / (double)n + eps));
            rs[r] = inv;
            for (int64_t i = 0; i < n; i++) yr[i] = xr[i] * inv;
            if (round16) {
                void *half = buf + 2 * n + 1;
                fl_convert(half, x->dtype, yr, RT, n);
                fl_convert(yr, RT, half, x->dtype, n);
            }
            if (wr)
                for (int64_t i = 0; i < n; i++) yr[i] *= wr[i];
            FN(lane_out)(op, out->dtype, 1, n, yr);
        }
        free(buf);
    }
    free(wr);
    return oom ? fl_fail(FL_ERR_OOM, "rms_norm: out of host memory for scratch rows") : FL_OK;
}

static int FN(rms_norm_backward)(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g,
                                 const fl_tensor *x, const fl_tensor *w, const fl_tensor *rstd) {
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    R *wr = FN(param)(w, n);
    const R *rs = rstd->data;
    int nthreads = omp_get_max_threads();
    double *parts = dw ? calloc((size_t)nthreads * (size_t)(n ? n : 1), sizeof(double)) : NULL;
    bool oom = (w && !wr) || (dw && !parts);
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(3 * n + 1) * sizeof(R));
        if (!buf) oom = true;
        double *mine = parts ? parts + (int64_t)omp_get_thread_num() * n : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            const R *xr = FN(lane_in)(fl_fused_lane(x, dim, r), x->dtype, x->stride[dim], n, buf);
            const R *gr =
                FN(lane_in)(fl_fused_lane(g, dim, r), g->dtype, g->stride[dim], n, buf + n);
            R inv = rs[r];
            if (dx) {
                /* dx = inv * (dn - xhat * mean(dn * xhat)), dn = g * w */
                char *dp = (char *)dx->data + r * n * (int64_t)fl_dtype_size(dx->dtype);
                R *dr = FN(lane_dst)(dp, dx->dtype, 1, buf + 2 * n);
                const R *dn = gr;
                if (wr) {
                    for (int64_t i = 0; i < n; i++) dr[i] = gr[i] * wr[i];
                    dn = dr;
                }
                double dot = 0;
#pragma omp simd reduction(+ : dot)
                for (int64_t i = 0; i < n; i++) dot += (double)dn[i] * xr[i];
                R c = (R)(dot / (double)n) * inv * inv;
                for (int64_t i = 0; i < n; i++) dr[i] = inv * (dn[i] - xr[i] * c);
                FN(lane_out)(dp, dx->dtype, 1, n, dr);
            }
            if (mine)
                for (int64_t i = 0; i < n; i++) mine[i] += (double)(gr[i] * xr[i] * inv);
        }
        free(buf);
    }
    if (!oom && dw) FN(reduce_partials)(dw, parts, nthreads, n);
    free(parts);
    free(wr);
    return oom ? fl_fail(FL_ERR_OOM, "rms_norm backward: out of host memory for scratch rows")
               : FL_OK;
}

/* ---- LayerNorm ------------------------------------------------------------------ */

static int FN(layer_norm)(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                          const fl_tensor *w, const fl_tensor *b, double eps) {
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    R *wr = FN(param)(w, n), *br = FN(param)(b, n);
    R *mu = mean->data, *rs = rstd->data;
    bool oom = (w && !wr) || (b && !br);
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(2 * n + 1) * sizeof(R));
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            const R *xr = FN(lane_in)(fl_fused_lane(x, dim, r), x->dtype, x->stride[dim], n, buf);
            char *op = (char *)out->data + r * n * (int64_t)fl_dtype_size(out->dtype);
            R *yr = FN(lane_dst)(op, out->dtype, 1, buf + n);
            /* Two passes over the row (in cache): the mean, then the
             * centred variance, which stays accurate when |mean| >> std. */
            double s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < n; i++) s += xr[i];
            double m = s / (double)n, v = 0;
#pragma omp simd reduction(+ : v)
            for (int64_t i = 0; i < n; i++) v += ((double)xr[i] - m) * ((double)xr[i] - m);
            R inv = (R)(1.0 / sqrt(v / (double)n + eps)), mr = (R)m;
            mu[r] = mr;
            rs[r] = inv;
            for (int64_t i = 0; i < n; i++) yr[i] = (xr[i] - mr) * inv;
            if (wr)
                for (int64_t i = 0; i < n; i++) yr[i] *= wr[i];
            if (br)
                for (int64_t i = 0; i < n; i++) yr[i] += br[i];
            FN(lane_out)(op, out->dtype, 1, n, yr);
        }
        free(buf);
    }
    free(wr);
    free(br);
    return oom ? fl_fail(FL_ERR_OOM, "layer_norm: out of host memory for scratch rows") : FL_OK;
}

static int FN(layer_norm_backward)(fl_tensor *dx, fl_tensor *dw, fl_tensor *db,
                                   const fl_tensor *g, const fl_tensor *x, const fl_tensor *w,
                                   const fl_tensor *mean, const fl_tensor *rstd) {
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    R *wr = FN(param)(w, n);
    const R *mu = mean->data, *rs = rstd->data;
    int nthreads = omp_get_max_threads();
    size_t per = (size_t)nthreads * (size_t)(n ? n : 1);
    double *pw = dw ? calloc(per, sizeof(double)) : NULL;
    double *pb = db ? calloc(per, sizeof(double)) : NULL;
    bool oom = (w && !wr) || (dw && !pw) || (db && !pb);
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(4 * n + 1) * sizeof(R));
        if (!buf) oom = true;
        int64_t me = omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            const R *xr = FN(lane_in)(fl_fused_lane(x, dim, r), x->dtype, x->stride[dim], n, buf);
            const R *gr =
                FN(lane_in)(fl_fused_lane(g, dim, r), g->dtype, g->stride[dim], n, buf + n);
            R m = mu[r], inv = rs[r];
            R *xhat = buf + 2 * n;
            for (int64_t i = 0; i < n; i++) xhat[i] = (xr[i] - m) * inv;
            if (dx) {
                /* dx = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
                char *dp = (char *)dx->data + r * n * (int64_t)fl_dtype_size(dx->dtype);
                R *dr = FN(lane_dst)(dp, dx->dtype, 1, buf + 3 * n);
                const R *dxh = gr; /* dxhat = g * w */
                if (wr) {
                    for (int64_t i = 0; i < n; i++) dr[i] = gr[i] * wr[i];
                    dxh = dr;
                }
                double s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
                for (int64_t i = 0; i < n; i++) {
                    s1 += dxh[i];
                    s2 += (double)dxh[i] * xhat[i];
                }
                R c1 = (R)(s1 / (double)n), c2 = (R)(s2 / (double)n);
                for (int64_t i = 0; i < n; i++) dr[i] = inv * (dxh[i] - c1 - xhat[i] * c2);
                FN(lane_out)(dp, dx->dtype, 1, n, dr);
            }
            if (pw)
                for (int64_t i = 0; i < n; i++) pw[me * n + i] += (double)(gr[i] * xhat[i]);
            if (pb)
                for (int64_t i = 0; i < n; i++) pb[me * n + i] += gr[i];
        }
        free(buf);
    }
    if (!oom && dw) FN(reduce_partials)(dw, pw, nthreads, n);
    if (!oom && db) FN(reduce_partials)(db, pb, nthreads, n);
    free(pw);
    free(pb);
    free(wr);
    return oom ? fl_fail(FL_ERR_OOM, "layer_norm backward: out of host memory for scratch rows")
               : FL_OK;
}

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
    return oom ? fl_fail(FL_ERR_OOM, "%s: out of host memory for scratch rows",
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
    return oom ? fl_fail(FL_ERR_OOM, "softmax backward: out of host memory for scratch rows")
               : FL_OK;
}

/* ---- cross-entropy and NLL ---------------------------------------------------------- */

static void FN(store_one)(fl_tensor *t, int64_t i, R v) {
    fl_convert((char *)t->data + i * (int64_t)fl_dtype_size(t->dtype), t->dtype, &v, RT, 1);
}

static int FN(cross_entropy)(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                             const fl_tensor *targets, const fl_loss_params *p, double *total,
                             int64_t *count) {
    int dim = logits->ndim - 1;
    int64_t C = logits->shape[dim], rows = targets->numel, xs = logits->stride[dim];
    R *ls = lse->data;
    R smooth = (R)p->label_smoothing;
    double tot = 0;
    int64_t cnt = 0, bad_row = -1, bad_value = 0;
    bool oom = false;
#pragma omp parallel if (rows * C >= FL_FUSED_PARALLEL_MIN) reduction(+ : tot, cnt)
    {
        R *buf = malloc((size_t)(C ? C : 1) * sizeof(R));
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t t = fl_load_i64((const char *)targets->data + r * (int64_t)fl_dtype_size(targets->dtype),
                                    targets->dtype);
            R loss = 0;
            ls[r] = 0;
            if (t != p->ignore_index && (t < 0 || t >= C)) {
#pragma omp critical(fl_cross_entropy_bad)
                if (bad_row < 0 || r < bad_row) {
                    bad_row = r;
                    bad_value = t;
                }
                continue;
            }
            if (t != p->ignore_index && buf && !oom) {
                const R *xr = FN(lane_in)(fl_fused_lane(logits, dim, r), logits->dtype, xs, C, buf);
                R mx = FN(row_max)(xr, C);
                R l = mx + (R)log((double)FN(row_exp)(NULL, xr, C, mx));
                loss = l - xr[t];
                if (smooth > 0) {
                    double sx = 0;
#pragma omp simd reduction(+ : sx)
                    for (int64_t i = 0; i < C; i++) sx += xr[i];
                    loss = (1 - smooth) * loss + smooth * (l - (R)(sx / (double)C));
                }
                ls[r] = l;
                tot += loss;
                cnt++;
            }
            if (rows_out) FN(store_one)(rows_out, r, loss);
        }
        free(buf);
    }
    if (bad_row >= 0)
        return fl_fail(FL_ERR_ARG, "cross_entropy: target %lld (at index %lld) is out of range "
                                   "for %lld classes (ignore_index is %lld)",
                       (long long)bad_value, (long long)bad_row, (long long)C,
                       (long long)p->ignore_index);
    if (oom) return fl_fail(FL_ERR_OOM, "cross_entropy: out of host memory for scratch rows");
    *total = tot;
    *count = cnt;
    return FL_OK;
}

static int FN(cross_entropy_backward)(fl_tensor *dlogits, const fl_tensor *g_rows,
                                      double g_scalar, const fl_tensor *logits,
                                      const fl_tensor *targets, const fl_tensor *lse,
                                      const fl_loss_params *p) {
    int dim = logits->ndim - 1;
    int64_t C = logits->shape[dim], rows = targets->numel, xs = logits->stride[dim];
    const R *ls = lse->data;
    const R *gr = g_rows ? g_rows->data : NULL;
    R smooth = (R)p->label_smoothing, off = C ? smooth / (R)C : 0;
    size_t des = fl_dtype_size(dlogits->dtype);
    bool oom = false;
#pragma omp parallel if (rows * C >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(2 * (C ? C : 1)) * sizeof(R));
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            int64_t t = fl_load_i64((const char *)targets->data + r * (int64_t)fl_dtype_size(targets->dtype),
                                    targets->dtype);
            char *dp = (char *)dlogits->data + r * C * (int64_t)des;
            R *dr = FN(lane_dst)(dp, dlogits->dtype, 1, buf + C);
            R gs = gr ? gr[r] : (R)g_scalar;
            if (t == p->ignore_index || t < 0 || t >= C) {
                for (int64_t i = 0; i < C; i++) dr[i] = 0;
            } else {
                const R *xr = FN(lane_in)(fl_fused_lane(logits, dim, r), logits->dtype, xs, C, buf);
                R l = ls[r];
                FN(row_exp_affine)(dr, xr, C, l, gs, -gs * off, NULL);
                dr[t] -= gs * (1 - smooth);
            }
            FN(lane_out)(dp, dlogits->dtype, 1, C, dr);
        }
        free(buf);
    }
    return oom ? fl_fail(FL_ERR_OOM, "cross_entropy backward: out of host memory for scratch rows")
               : FL_OK;
}

static int FN(nll_loss)(fl_tensor *rows_out, const fl_tensor *log_probs,
                        const fl_tensor *targets, const fl_loss_params *p, double *total,
                        int64_t *count) {
    int dim = log_probs->ndim - 1;
    int64_t C = log_probs->shape[dim], rows = targets->numel;
    size_t es = fl_dtype_size(log_probs->dtype);
    double tot = 0;
    int64_t cnt = 0, bad_row = -1, bad_value = 0;
    /* One element per row: not worth threads below huge batches. */
#pragma omp parallel for schedule(static) if (rows >= FL_FUSED_PARALLEL_MIN) reduction(+ : tot, cnt)
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = fl_load_i64((const char *)targets->data + r * (int64_t)fl_dtype_size(targets->dtype),
                                targets->dtype);
        R loss = 0;
        if (t != p->ignore_index) {
            if (t < 0 || t >= C) {
#pragma omp critical(fl_nll_loss_bad)
                if (bad_row < 0 || r < bad_row) {
                    bad_row = r;
                    bad_value = t;
                }
                continue;
            }
            const char *e = fl_fused_lane(log_probs, dim, r) + t * log_probs->stride[dim] * (int64_t)es;
            loss = -(R)fl_load_f64(e, log_probs->dtype);
            tot += loss;
            cnt++;
        }
        if (rows_out) FN(store_one)(rows_out, r, loss);
    }
    if (bad_row >= 0)
        return fl_fail(FL_ERR_ARG, "nll_loss: target %lld (at index %lld) is out of range for "
                                   "%lld classes (ignore_index is %lld)",
                       (long long)bad_value, (long long)bad_row, (long long)C,
                       (long long)p->ignore_index);
    *total = tot;
    *count = cnt;
    return FL_OK;
}

static int FN(nll_loss_backward)(fl_tensor *dlp, const fl_tensor *g_rows, double g_scalar,
                                 const fl_tensor *targets, const fl_loss_params *p) {
    int64_t C = dlp->shape[dlp->ndim - 1], rows = targets->numel;
    const R *gr = g_rows ? g_rows->data : NULL;
    size_t es = fl_dtype_size(dlp->dtype);
#pragma omp parallel for schedule(static) if (rows >= FL_FUSED_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = fl_load_i64((const char *)targets->data + r * (int64_t)fl_dtype_size(targets->dtype),
                                targets->dtype);
        if (t == p->ignore_index || t < 0 || t >= C) continue;
        R v = -(gr ? gr[r] : (R)g_scalar);
        fl_convert((char *)dlp->data + (r * C + t) * (int64_t)es, dlp->dtype, &v, RT, 1);
    }
    return FL_OK;
}

/* ---- rotary --------------------------------------------------------------------------- */

static int FN(rotary)(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos,
                      const fl_tensor *sin, const fl_tensor *positions, bool inverse) {
    int dim = x->ndim - 1;
    int64_t D = x->shape[dim], T = x->shape[dim - 1], h = D / 2;
    int64_t rows = D ? x->numel / D : 0, per_batch = x->shape[0] ? rows / x->shape[0] : 0;
    int64_t table_rows = cos->shape[0];
    size_t ces = fl_dtype_size(cos->dtype), ses = fl_dtype_size(sin->dtype);
    size_t pes = positions ? fl_dtype_size(positions->dtype) : 0;
    int64_t bad_row = -1, bad_value = 0;
    bool oom = false;
#pragma omp parallel if (x->numel >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(4 * (D ? D : 1)) * sizeof(R));
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            int64_t t = r % T, pos = t;
            if (positions) {
                int64_t off = positions->ndim == 1
                                  ? t * positions->stride[0]
                                  : (r / per_batch) * positions->stride[0] + t * positions->stride[1];
                pos = fl_load_i64((const char *)positions->data + off * (int64_t)pes,
                                  positions->dtype);
                if (pos < 0 || pos >= table_rows) {
#pragma omp critical(fl_rotary_bad)
                    if (bad_row < 0 || r < bad_row) {
                        bad_row = r;
                        bad_value = pos;
                    }
                    continue;
                }
            }
            const R *xr = FN(lane_in)(fl_fused_lane(x, dim, r), x->dtype, x->stride[dim], D, buf);
            const R *c = FN(lane_in)((const char *)cos->data + pos * cos->stride[0] * (int64_t)ces,
                                     cos->dtype, cos->stride[1], D, buf + D);
            const R *s = FN(lane_in)((const char *)sin->data + pos * sin->stride[0] * (int64_t)ses,
                                     sin->dtype, sin->stride[1], D, buf + 2 * D);
            char *op = (char *)out->data + r * D * (int64_t)fl_dtype_size(out->dtype);
            R *yr = FN(lane_dst)(op, out->dtype, 1, buf + 3 * D);
            if (!inverse) {
                /* y = x * cos + rotate_half(x) * sin */
                for (int64_t i = 0; i < h; i++) {
                    yr[i] = xr[i] * c[i] - xr[i + h] * s[i];
                    yr[i + h] = xr[i + h] * c[i + h] + xr[i] * s[i + h];
                }
            } else {
                /* the transpose: dx = g * cos - rotate_half(g * sin) */
                for (int64_t i = 0; i < h; i++) {
                    yr[i] = xr[i] * c[i] + xr[i + h] * s[i + h];
                    yr[i + h] = xr[i + h] * c[i + h] - xr[i] * s[i];
                }
            }
            FN(lane_out)(op, out->dtype, 1, D, yr);
        }
        free(buf);
    }
    if (bad_row >= 0)
        return fl_fail(FL_ERR_ARG, "apply_rotary: position %lld is out of range for tables of "
                                   "%lld positions",
                       (long long)bad_value, (long long)table_rows);
    return oom ? fl_fail(FL_ERR_OOM, "apply_rotary: out of host memory for scratch rows") : FL_OK;
}
