/*
 * grad_norm.c: the two kernels of clip-by-global-norm. The sum of squares
 * of a tensor accumulated in double (the local part of the global norm; the
 * sharding layer adds the parts of all ranks), and an in-place scale.
 *
 * The sum is deterministic: fixed chunks are summed in a fixed order each
 * (four interleaved accumulators), and the chunk sums are added in chunk
 * order, so neither the thread count nor the scheduling changes the bits.
 * The CUDA kernels (core/cuda/cuda_optim.cu) keep the same chunks and
 * order, so a GPU gives the same bits.
 */
#include "backend.h"
#include "shape.h"
#include "storage.h"

#include <stdlib.h>

/* Elements per chunk: one chunk's partial sum is one slot of `partials`. */
enum { CHUNK = FL_GRAD_NORM_CHUNK };
/* Below this many elements threads cost more than they save. */
enum { PARALLEL_MIN = 1 << 16 };

static int check(const char *op, const fl_tensor *t) {
    if (fl_check_tensor(op, t, false)) return fl_last_status();
    char s[128];
    fl_shape_str(t, s, sizeof s);
    if (!fl_dtype_is_float(t->dtype))
        return fl_fail(FL_ERR_ARG, "%s: tensor of shape %s has dtype %s; a float dtype is needed", op,
                       s, fl_dtype_name(t->dtype));
    if (!fl_tensor_is_contiguous(t))
        return fl_fail(FL_ERR_ARG, "%s: tensor of shape %s is not contiguous (call contiguous() first)",
                       op, s);
    return FL_OK;
}

/* The device's kernels of this family (after fl_check_tensor): its
 * backend's table, or NULL with *host set for the host loops below (cpu);
 * on a device with neither, an error. */
static int kernels_of(const char *op, const fl_tensor *t, const fl_optim_kernels **k) {
    *k = NULL;
    if (fl_check_tensor(op, t, true)) return fl_last_status();
    const fl_backend *be = fl_backend_of(t->device);
    if (be && be->optim) {
        *k = be->optim;
        return FL_OK;
    }
    if (fl_device_kind_of(t->device) == FL_DEVICE_CPU) return FL_OK;
    char dev[32];
    fl_device_format(t->device, dev, sizeof dev);
    return fl_fail(FL_ERR_UNSUPPORTED, "%s: no kernel for device %s in this build", op, dev);
}

static double chunk_sum_squares(const void *src, fl_dtype dtype, int64_t n) {
    _Alignas(64) double x[CHUNK];
    const double *d = src;
    if (dtype != FL_F64) {
        fl_convert(x, FL_F64, src, dtype, n);
        d = x;
    }
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += d[i] * d[i];
        s1 += d[i + 1] * d[i + 1];
        s2 += d[i + 2] * d[i + 2];
        s3 += d[i + 3] * d[i + 3];
    }
    for (; i < n; i++) s0 += d[i] * d[i];
    return (s0 + s1) + (s2 + s3);
}

int fl_grad_sq_norm(const fl_tensor *t, double *out) {
    const char *op = "grad_sq_norm";
    if (!out) return fl_fail(FL_ERR_ARG, "%s: out is NULL", op);
    *out = 0;
    const fl_optim_kernels *k;
    if (check(op, t) || kernels_of(op, t, &k)) return fl_last_status();
    if (k) return k->grad_sq_norm(t, out);
    int64_t numel = t->numel;
    int64_t chunks = (numel + CHUNK - 1) / CHUNK;
    if (chunks == 0) return FL_OK;
    size_t esize = fl_dtype_size(t->dtype);
    double one;
    double *partials = chunks == 1 ? &one : malloc((size_t)chunks * sizeof *partials);
    if (!partials)
        return fl_fail(FL_ERR_OOM, "%s: no memory for %lld partial sums", op, (long long)chunks);
#pragma omp parallel for schedule(static) if (numel >= PARALLEL_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t start = c * CHUNK;
        int64_t len = numel - start < CHUNK ? numel - start : CHUNK;
        partials[c] = chunk_sum_squares((const char *)t->data + start * (int64_t)esize, t->dtype,
                                        len);
    }
    double sum = 0;
    for (int64_t c = 0; c < chunks; c++) sum += partials[c];
    if (partials != &one) free(partials);
    *out = sum;
    return FL_OK;
}

int fl_grad_scale_(fl_tensor *t, double alpha) {
    const char *op = "grad_scale_";
    if (check(op, t)) return fl_last_status();
    if (fl_device_kind_of(t->device) == FL_DEVICE_META || (t->flags & FL_TENSOR_FAKE)) return FL_OK;
    const fl_optim_kernels *k;
    if (kernels_of(op, t, &k)) return fl_last_status();
    if (k) return k->grad_scale_(t, alpha);
    int64_t numel = t->numel;
    int64_t chunks = (numel + CHUNK - 1) / CHUNK;
    size_t esize = fl_dtype_size(t->dtype);
    fl_dtype dtype = t->dtype;
#pragma omp parallel for schedule(static) if (numel >= PARALLEL_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t start = c * CHUNK;
        int64_t len = numel - start < CHUNK ? numel - start : CHUNK;
        char *p = (char *)t->data + start * (int64_t)esize;
        if (dtype == FL_F64) {
            double *d = (double *)p;
            for (int64_t i = 0; i < len; i++) d[i] *= alpha;
        } else if (dtype == FL_F32) {
            float *f = (float *)p, a = (float)alpha;
            for (int64_t i = 0; i < len; i++) f[i] *= a;
        } else {
            _Alignas(64) float x[CHUNK];
            float a = (float)alpha;
            fl_convert(x, FL_F32, p, dtype, len);
            for (int64_t i = 0; i < len; i++) x[i] *= a;
            fl_convert(p, dtype, x, FL_F32, len);
        }
    }
    return FL_OK;
}
