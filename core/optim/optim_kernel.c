/*
 * optim_kernel.c: the operand checks and the chunked f32 driver shared by
 * the fused optimizer updates (see optim_kernel.h).
 */
#include "optim_kernel.h"

#include <math.h>

/* Elements per chunk: the scratch arrays of all operands (5 x 4 KiB) stay
 * in L1, and a chunk is enough work to amortise the conversions. */
enum { CHUNK = FL_OPTIM_CHUNK };
/* Below this many elements threads cost more than they save. */
enum { PARALLEL_MIN = 1 << 16 };

static bool is_update_dtype(fl_dtype d) {
    return d == FL_F32 || d == FL_BF16 || d == FL_F16;
}

static bool is_metadata_only(const fl_tensor *t) {
    return fl_device_kind_of(t->device) == FL_DEVICE_META || (t->flags & FL_TENSOR_FAKE);
}

static int check_operand(const char *op, const fl_optim_operand *o, const fl_tensor *param) {
    const fl_tensor *t = o->t;
    char s[128], ps[128], dev[32], pdev[32];
    fl_shape_str(t, s, sizeof s);
    fl_shape_str(param, ps, sizeof ps);
    if (t->device != param->device) {
        fl_device_format(t->device, dev, sizeof dev);
        fl_device_format(param->device, pdev, sizeof pdev);
        return fl_fail(FL_ERR_ARG, "%s: %s is on %s but param is on %s", op, o->name, dev, pdev);
    }
    if (t->numel != param->numel)
        return fl_fail(FL_ERR_ARG, "%s: %s has %lld elements (shape %s) but param has %lld (shape %s)",
                       op, o->name, (long long)t->numel, s, (long long)param->numel, ps);
    /* Any of f32, bf16, f16 for any operand: the loop reads each through
     * f32 scratch. A low-precision gradient of an f32 parameter is what
     * sharded units keep with keep_low_precision_grads. */
    if (!is_update_dtype(t->dtype)) {
        return fl_fail(FL_ERR_ARG, "%s: %s has dtype %s; supported are f32, bf16 and f16", op,
                       o->name, fl_dtype_name(t->dtype));
    }
    if (!fl_tensor_is_contiguous(t))
        return fl_fail(FL_ERR_ARG, "%s: %s of shape %s is not contiguous; fused updates need dense "
                       "tensors (call contiguous() first)", op, o->name, s);
    return FL_OK;
}

/* Two operands over the same bytes would make the update order-dependent
 * (and break the no-alias assumption of the inner loops). */
static int check_overlap(const char *op, int n, const fl_optim_operand *ops) {
    for (int a = 0; a < n; a++) {
        if (!ops[a].t) continue;
        const char *a0 = ops[a].t->data;
        const char *a1 = a0 + ops[a].t->numel * (int64_t)fl_dtype_size(ops[a].t->dtype);
        for (int b = a + 1; b < n; b++) {
            if (!ops[b].t) continue;
            const char *b0 = ops[b].t->data;
            const char *b1 = b0 + ops[b].t->numel * (int64_t)fl_dtype_size(ops[b].t->dtype);
            if (a0 < b1 && b0 < a1 && a0 != a1 && b0 != b1)
                return fl_fail(FL_ERR_ARG, "%s: %s and %s share memory; each operand needs its own",
                               op, ops[a].name, ops[b].name);
        }
    }
    return FL_OK;
}

int fl_optim_check_lr(const char *op, double lr, double weight_decay) {
    if (!(lr >= 0) || isinf(lr)) return fl_fail(FL_ERR_ARG, "%s: lr must be >= 0 and finite, got %g", op, lr);
    if (!(weight_decay >= 0) || isinf(weight_decay))
        return fl_fail(FL_ERR_ARG, "%s: weight_decay must be >= 0 and finite, got %g", op, weight_decay);
    return FL_OK;
}

int fl_optim_run(const char *op, int n, const fl_optim_operand *ops, fl_optim_loop loop,
                 fl_optim_kind kind, const void *ctx) {
    FL_ASSERT(n >= 2 && n <= FL_OPTIM_MAX_OPERANDS);
    const fl_tensor *param = ops[0].t;
    if (!param) return fl_fail(FL_ERR_ARG, "%s: param is NULL (freed?)", op);
    if (!ops[1].t) return fl_fail(FL_ERR_ARG, "%s: grad is NULL (freed?)", op);
    if (!is_update_dtype(param->dtype))
        return fl_fail(FL_ERR_ARG, "%s: param has dtype %s; supported are f32, bf16 and f16", op,
                       fl_dtype_name(param->dtype));
    bool metadata_only = false;
    for (int k = 0; k < n; k++) {
        if (!ops[k].t) continue;
        if (check_operand(op, &ops[k], param)) return fl_last_status();
        metadata_only |= is_metadata_only(ops[k].t);
    }
    /* Every operand read, every one but the gradient written back. */
    const fl_tensor *moved[2 * FL_OPTIM_MAX_OPERANDS];
    int n_moved = 0;
    for (int k = 0; k < n; k++) {
        moved[n_moved++] = ops[k].t;
        if (k != 1) moved[n_moved++] = ops[k].t;
    }
    fl_count_bytes(op, n_moved, moved);
    if (metadata_only) return FL_OK;
    /* The device's kernel, or the host loops below on the cpu. */
    const fl_backend *be = fl_backend_of(param->device);
    const fl_optim_kernels *kernels = be ? be->optim : NULL;
    if (!kernels && fl_device_kind_of(param->device) != FL_DEVICE_CPU) {
        char dev[32];
        fl_device_format(param->device, dev, sizeof dev);
        return fl_fail(FL_ERR_UNSUPPORTED, "%s: no fused update for device %s%s%s", op, dev,
                       be ? "" : ": ", be ? "" : fl_device_status(fl_device_kind_of(param->device)));
    }
    for (int k = 0; k < n; k++)
        if (ops[k].t && fl_check_tensor(op, ops[k].t, true)) return fl_last_status();
    if (check_overlap(op, n, ops)) return fl_last_status();
    if (kernels) return kernels->update(op, kind, ctx, n, ops);

    fl_dtype dtypes[FL_OPTIM_MAX_OPERANDS] = {0};
    for (int k = 0; k < n; k++) dtypes[k] = ops[k].t ? ops[k].t->dtype : FL_F32;
    int64_t numel = param->numel;
    int64_t chunks = (numel + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (numel >= PARALLEL_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t start = c * CHUNK;
        int64_t len = numel - start < CHUNK ? numel - start : CHUNK;
        _Alignas(64) float scratch[FL_OPTIM_MAX_OPERANDS][CHUNK];
        float *x[FL_OPTIM_MAX_OPERANDS] = {0};
        for (int k = 0; k < n; k++) {
            const fl_tensor *t = ops[k].t;
            if (!t) continue;
            char *p = (char *)t->data + start * (int64_t)fl_dtype_size(t->dtype);
            if (t->dtype == FL_F32) {
                x[k] = (float *)p;
            } else {
                fl_convert(scratch[k], FL_F32, p, t->dtype, len);
                x[k] = scratch[k];
            }
        }
        loop(ctx, len, x, dtypes);
        for (int k = 0; k < n; k++) {
            const fl_tensor *t = ops[k].t;
            if (!t || !ops[k].write || t->dtype == FL_F32) continue;
            char *p = (char *)t->data + start * (int64_t)fl_dtype_size(t->dtype);
            fl_convert(p, t->dtype, scratch[k], FL_F32, len);
        }
    }
    return FL_OK;
}
