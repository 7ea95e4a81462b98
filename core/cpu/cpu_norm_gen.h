/*
 * cpu_norm_gen.h: the CPU's RMSNorm and LayerNorm, forward and backward, written once for a compute type
 * R (see cpu_lanes_gen.h, included before it) and instantiated by
 * cpu_norm.c for float and double.
 */

#ifdef FL_ROWS_F32
/* Whether the rows (RMSNorm's, LayerNorm's) go to the AVX-512 row
 * functions (cpu_rows_avx512.c): f32/bf16 tensors dense along rows of a
 * multiple of 16; out (y or dx) and g may be NULL. */
static bool FN(rows_wide)(const fl_tensor *x, const fl_tensor *out, const fl_tensor *g, int64_t n) {
    const fl_tensor *ts[3] = {x, out, g};
    for (int i = 0; i < 3; i++)
        if (ts[i] && ((ts[i]->dtype != FL_F32 && ts[i]->dtype != FL_BF16) ||
                      ts[i]->stride[ts[i]->ndim - 1] != 1))
            return false;
    return n % 16 == 0 && fl_cpu_avx512();
}
#endif

/* ---- RMSNorm ----------------------------------------------------------------- */

/* With a (add_rms_norm): x + a is first computed in R and stored to h
 * (rounded to its dtype as cpu_binary.c's add rounds), and the row of h is
 * then normalised exactly as rms_norm normalises its input. */
static int FN(rms_norm)(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
                        double eps, const fl_tensor *a, fl_tensor *h) {
    const char *name = a ? "add_rms_norm" : "rms_norm";
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    R *wr = FN(param)(w, n);
    /* Llama casts the normalised f32 value to the input dtype before the
     * weight multiply: for 16-bit inputs the value is rounded through it. */
    bool round16 = x->dtype == FL_BF16 || x->dtype == FL_F16;
    R *rs = rstd->data;
    bool oom = w && !wr;
#ifdef FL_ROWS_F32
    bool wide = FN(rows_wide)(a ? h : x, out, NULL, n);
#endif
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)((a ? 4 : 2) * n + 1) * sizeof(R) + (size_t)n * 2);
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            /* the row to normalise: x's, or h's once written */
            const char *src = fl_fused_lane(x, dim, r);
            const fl_tensor *s = x;
            if (a) {
                R *xa = buf + 2 * n; /* x's and a's lanes, before the 16-bit scratch */
                const R *xr = FN(lane_in)(src, x->dtype, x->stride[dim], n, xa);
                const R *ar = FN(lane_in)(fl_fused_lane(a, dim, r), a->dtype, a->stride[dim], n, xa + n);
                char *hp = (char *)h->data + r * n * (int64_t)fl_dtype_size(h->dtype);
                R *hr = FN(lane_dst)(hp, h->dtype, 1, buf);
                for (int64_t i = 0; i < n; i++) hr[i] = xr[i] + ar[i];
                FN(lane_out)(hp, h->dtype, 1, n, hr);
                src = hp;
                s = h;
            }
#ifdef FL_ROWS_F32
            if (wide) {
                char *yp = (char *)out->data + r * n * (int64_t)fl_dtype_size(out->dtype);
                rs[r] = fl_avx512_rms_norm_row(yp, out->dtype == FL_BF16, src, s->dtype == FL_BF16, wr, n,
                                               eps, round16);
                continue;
            }
#endif
            const R *xr = FN(lane_in)(src, s->dtype, s->stride[dim], n, buf);
            char *op = (char *)out->data + r * n * (int64_t)fl_dtype_size(out->dtype);
            R *yr = FN(lane_dst)(op, out->dtype, 1, buf + n);
            double ss = 0;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
            R inv = (R)(1.0 / sqrt(ss / (double)n + eps));
            rs[r] = inv;
            for (int64_t i = 0; i < n; i++) yr[i] = xr[i] * inv;
            if (round16) {
                void *half = buf + (a ? 4 : 2) * n + 1;
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
    return oom ? fl_fail(FL_ERR_OOM, "%s: out of CPU memory for scratch rows", name) : FL_OK;
}

/* With gh (add_rms_norm): dx + gh, added in R and rounded once. */
static int FN(rms_norm_backward)(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g,
                                 const fl_tensor *x, const fl_tensor *w, const fl_tensor *rstd,
                                 const fl_tensor *gh) {
    const char *name = gh ? "add_rms_norm backward" : "rms_norm backward";
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    R *wr = FN(param)(w, n);
    const R *rs = rstd->data;
    int nthreads = omp_get_max_threads();
    double *parts = dw ? calloc((size_t)nthreads * (size_t)(n ? n : 1), sizeof(double)) : NULL;
    bool oom = (w && !wr) || (dw && !parts);
#ifdef FL_ROWS_F32
    bool wide = FN(rows_wide)(x, dx, g, n);
#endif
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(4 * n + 1) * sizeof(R));
        if (!buf) oom = true;
        double *mine = parts ? parts + (int64_t)omp_get_thread_num() * n : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
            char *dp = dx ? (char *)dx->data + r * n * (int64_t)fl_dtype_size(dx->dtype) : NULL;
            /* dx in R first when gh is added to it */
            R *dr = dx ? (gh ? buf + 2 * n : FN(lane_dst)(dp, dx->dtype, 1, buf + 2 * n)) : NULL;
#ifdef FL_ROWS_F32
            if (wide) {
                fl_avx512_rms_norm_backward_row(gh ? (void *)dr : dp, !gh && dx && dx->dtype == FL_BF16,
                                                fl_fused_lane(x, dim, r), x->dtype == FL_BF16,
                                                fl_fused_lane(g, dim, r), g->dtype == FL_BF16, wr, rs[r], n,
                                                mine);
                if (dx && gh) {
                    const R *hr = FN(lane_in)(fl_fused_lane(gh, dim, r), gh->dtype, gh->stride[dim], n, buf);
                    for (int64_t i = 0; i < n; i++) dr[i] += hr[i];
                    FN(lane_out)(dp, dx->dtype, 1, n, dr);
                }
                continue;
            }
#endif
            const R *xr = FN(lane_in)(fl_fused_lane(x, dim, r), x->dtype, x->stride[dim], n, buf);
            const R *gr =
                FN(lane_in)(fl_fused_lane(g, dim, r), g->dtype, g->stride[dim], n, buf + n);
            R inv = rs[r];
            if (dx) {
                /* dx = inv * (dn - xhat * mean(dn * xhat)), dn = g * w */
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
                if (gh) {
                    const R *hr =
                        FN(lane_in)(fl_fused_lane(gh, dim, r), gh->dtype, gh->stride[dim], n, buf + 3 * n);
                    for (int64_t i = 0; i < n; i++) dr[i] += hr[i];
                }
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
    return oom ? fl_fail(FL_ERR_OOM, "%s: out of CPU memory for scratch rows", name) : FL_OK;
}

/* ---- LayerNorm ------------------------------------------------------------------ */

static int FN(layer_norm)(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                          const fl_tensor *w, const fl_tensor *b, double eps) {
    int dim = x->ndim - 1;
    int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
    R *wr = FN(param)(w, n), *br = FN(param)(b, n);
    R *mu = mean->data, *rs = rstd->data;
    bool oom = (w && !wr) || (b && !br);
#ifdef FL_ROWS_F32
    bool wide = FN(rows_wide)(x, out, NULL, n);
#endif
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(2 * n + 1) * sizeof(R));
        if (!buf) oom = true;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
#ifdef FL_ROWS_F32
            if (wide) {
                char *yp = (char *)out->data + r * n * (int64_t)fl_dtype_size(out->dtype);
                rs[r] = fl_avx512_layer_norm_row(yp, out->dtype == FL_BF16,
                                                 fl_fused_lane(x, dim, r), x->dtype == FL_BF16, wr,
                                                 br, n, eps, &mu[r]);
                continue;
            }
#endif
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
    return oom ? fl_fail(FL_ERR_OOM, "layer_norm: out of CPU memory for scratch rows") : FL_OK;
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
#ifdef FL_ROWS_F32
    bool wide = FN(rows_wide)(x, dx, g, n);
#endif
#pragma omp parallel if (rows * n >= FL_FUSED_PARALLEL_MIN)
    {
        R *buf = malloc((size_t)(4 * n + 1) * sizeof(R));
        if (!buf) oom = true;
        int64_t me = omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf || oom) continue;
#ifdef FL_ROWS_F32
            if (wide) {
                fl_avx512_layer_norm_backward_row(
                    dx ? (char *)dx->data + r * n * (int64_t)fl_dtype_size(dx->dtype) : NULL,
                    dx && dx->dtype == FL_BF16, fl_fused_lane(x, dim, r), x->dtype == FL_BF16,
                    fl_fused_lane(g, dim, r), g->dtype == FL_BF16, wr, mu[r], rs[r], n,
                    pw ? pw + me * n : NULL, pb ? pb + me * n : NULL);
                continue;
            }
#endif
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
    return oom ? fl_fail(FL_ERR_OOM, "layer_norm backward: out of CPU memory for scratch rows")
               : FL_OK;
}
