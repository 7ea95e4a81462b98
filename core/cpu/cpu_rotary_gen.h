/*
 * cpu_rotary_gen.h: the CPU's rotary position embedding (RoPE), forward and its inverse, written once for a compute type
 * R (see cpu_lanes_gen.h, included before it) and instantiated by
 * cpu_rotary.c for float and double.
 */

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
    return oom ? fl_fail(FL_ERR_OOM, "apply_rotary: out of CPU memory for scratch rows") : FL_OK;
}
