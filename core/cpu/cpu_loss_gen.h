/*
 * cpu_loss_gen.h: the CPU's cross-entropy and NLL losses, forward and backward, written once for a compute type
 * R (see cpu_lanes_gen.h, included before it) and instantiated by
 * cpu_loss.c for float and double.
 */

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
#ifdef FL_ROWS_F32
    const fl_row_loops *loops = fl_cpu_row_loops();
    bool bf16_rows = logits->dtype == FL_BF16 && xs == 1 && loops;
#endif
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
#ifdef FL_ROWS_F32
            if (t != p->ignore_index && bf16_rows && smooth == 0) {
                /* (cpu_rows_avx512.c: as on the row converted to f32) */
                const uint16_t *xb = (const uint16_t *)fl_fused_lane(logits, dim, r);
                R mx = loops->max_bf16(xb, C);
                R l = mx + (R)log((double)loops->exp_sum_bf16(xb, C, mx));
                loss = l - fl_load_f64((const char *)(xb + t), FL_BF16);
                ls[r] = l;
                tot += loss;
                cnt++;
            } else
#endif
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
    if (oom) return fl_fail(FL_ERR_OOM, "cross_entropy: out of CPU memory for scratch rows");
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
#ifdef FL_ROWS_F32
    const fl_row_loops *loops = fl_cpu_row_loops();
    bool bf16_rows = logits->dtype == FL_BF16 && dlogits->dtype == FL_BF16 && xs == 1 && loops;
#endif
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
            R gs = gr ? gr[r] : (R)g_scalar;
#ifdef FL_ROWS_F32
            if (bf16_rows && t != p->ignore_index && t >= 0 && t < C) {
                loops->exp_affine_bf16((uint16_t *)dp,
                                       (const uint16_t *)fl_fused_lane(logits, dim, r), C, ls[r],
                                       gs, -gs * off, t, gs * (1 - smooth));
                continue;
            }
#endif
            R *dr = FN(lane_dst)(dp, dlogits->dtype, 1, buf + C);
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
    return oom ? fl_fail(FL_ERR_OOM, "cross_entropy backward: out of CPU memory for scratch rows")
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
