/*
 * adamw.c: the fused AdamW update, PyTorch's torch.optim.AdamW formula
 * (single-tensor path) in one pass over memory instead of seven:
 *
 *   p = p * (1 - lr * weight_decay)                 decoupled decay first
 *   m = m + (1 - beta1) * (g - m)                   lerp, as PyTorch
 *   v = v * beta2 + (1 - beta2) * g * g
 *   p = p - lr / (1 - beta1^t) * (m / (sqrt(v) / sqrt(1 - beta2^t) + eps))
 *
 * eps is added after the bias-corrected square root, exactly where PyTorch
 * adds it; the bias corrections are computed once per call in double.
 */
#include "optim_kernel.h"

#include <math.h>
#include <stdlib.h>

/* One AdamW update of n elements (n <= FL_OPTIM_CHUNK) in three
 * vectorised passes over L1-resident data: the moments, their square
 * roots (fl_optim_sqrt_n), the param. `far` selects PyTorch's lerp
 * branch: lerp(m, g, w) is m + w*(g - m) for w < 0.5 and g - (g - m)*(1 -
 * w) otherwise (so w = 1 gives g exactly), a constant in each instance. */
FL_OPTIM_INLINE void adamw_elems(const fl_adamw_ctx *c, int64_t n, float *restrict p,
                                 const float *restrict g, float *restrict m,
                                 float *restrict v, bool far) {
    float w = c->weight1, one_minus_w = 1 - c->weight1;
    float beta2 = c->beta2, one_minus_beta2 = c->one_minus_beta2;
    _Alignas(64) float root[FL_OPTIM_CHUNK];
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        m[i] = far ? gi - (gi - m[i]) * one_minus_w : m[i] + w * (gi - m[i]);
        float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
        v[i] = vi;
        root[i] = vi;
    }
    fl_optim_sqrt_n(root, n);
    float bc2_sqrt = c->bc2_sqrt, eps = c->eps, decay = c->decay, nss = c->neg_step_size;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float denom = root[i] / bc2_sqrt + eps;
        /* addcdiv's order of operations: p + (value * m) / denom */
        p[i] = p[i] * decay + nss * m[i] / denom;
    }
}

FL_ISA_BODY void adamw_loop_body(const void *vctx, int64_t n, float *const *x,
                                 const fl_dtype *dtypes) {
    (void)dtypes;
    const fl_adamw_ctx *c = vctx;
    if (c->weight1 < 0.5f)
        adamw_elems(c, n, x[0], x[1], x[2], x[3], false);
    else
        adamw_elems(c, n, x[0], x[1], x[2], x[3], true);
}
FL_ISA_CLONES_VOID(AVX512, adamw_loop,
                   (const void *vctx, int64_t n, float *const *x, const fl_dtype *dtypes),
                   (vctx, n, x, dtypes))

int fl_adamw_check_options(const char *op, const fl_adamw_options *o) {
    if (!o) return fl_fail(FL_ERR_ARG, "%s: options are NULL", op);
    if (fl_optim_check_lr(op, o->lr, o->weight_decay)) return fl_last_status();
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        return fl_fail(FL_ERR_ARG, "%s: betas must be in [0, 1), got (%g, %g)", op, o->beta1,
                       o->beta2);
    if (!(o->eps >= 0)) return fl_fail(FL_ERR_ARG, "%s: eps must be >= 0, got %g", op, o->eps);
    if (o->step < 1)
        return fl_fail(FL_ERR_ARG, "%s: step must be >= 1 (the count including this update), got %lld",
                       op, (long long)o->step);
    return FL_OK;
}

/* The constants of one AdamW step, from checked options. */
static fl_adamw_ctx adamw_ctx(const fl_adamw_options *o) {
    double bc1 = 1 - pow(o->beta1, (double)o->step);
    double bc2 = 1 - pow(o->beta2, (double)o->step);
    fl_adamw_ctx c = {
        .decay = (float)(1 - o->lr * o->weight_decay),
        .weight1 = (float)(1 - o->beta1),
        .beta2 = (float)o->beta2,
        .one_minus_beta2 = (float)(1 - o->beta2),
        .eps = (float)o->eps,
        .neg_step_size = (float)(-o->lr / bc1),
        .bc2_sqrt = (float)sqrt(bc2),
    };
    return c;
}

int fl_adamw_step_(fl_tensor *param, const fl_tensor *grad, fl_tensor *exp_avg,
                   fl_tensor *exp_avg_sq, const fl_adamw_options *o) {
    const char *op = "adamw";
    if (fl_adamw_check_options(op, o)) return fl_last_status();
    fl_adamw_ctx c = adamw_ctx(o);
    if (!exp_avg || !exp_avg_sq)
        return fl_fail(FL_ERR_ARG, "%s: %s is NULL", op, exp_avg ? "exp_avg_sq" : "exp_avg");
    fl_optim_operand ops[4] = {
        {"param", param, true},
        {"grad", (fl_tensor *)grad, false},
        {"exp_avg", exp_avg, true},
        {"exp_avg_sq", exp_avg_sq, true},
    };
    return fl_optim_run(op, 4, ops, adamw_loop, FL_OPTIM_ADAMW, &c);
}

int fl_adamw_step_multi_(int count, fl_tensor *const *params, const fl_tensor *const *grads,
                         fl_tensor *const *exp_avgs, fl_tensor *const *exp_avg_sqs,
                         const fl_adamw_options *o) {
    const char *op = "adamw";
    if (fl_adamw_check_options(op, o)) return fl_last_status();
    if (count < 0) return fl_fail(FL_ERR_ARG, "%s: %d tensors; the count must be >= 0", op, count);
    if (count == 0) return FL_OK;
    if (!params || !grads || !exp_avgs || !exp_avg_sqs)
        return fl_fail(FL_ERR_ARG, "%s: %d tensors but the %s array is NULL", op, count,
                       !params ? "params" : !grads ? "grads" : !exp_avgs ? "exp_avgs" : "exp_avg_sqs");
    for (int i = 0; i < count; i++)
        if (!exp_avgs[i] || !exp_avg_sqs[i])
            return fl_fail(FL_ERR_ARG, "%s: tensor %d: %s is NULL", op, i,
                           exp_avgs[i] ? "exp_avg_sq" : "exp_avg");
    fl_optim_operand *ops = malloc((size_t)count * 4 * sizeof *ops);
    if (!ops) return fl_fail(FL_ERR_OOM, "%s: no host memory for the operands of %d tensors", op, count);
    for (int i = 0; i < count; i++) {
        fl_optim_operand *set = ops + (size_t)i * 4;
        set[0] = (fl_optim_operand){"param", params[i], true};
        set[1] = (fl_optim_operand){"grad", (fl_tensor *)grads[i], false};
        set[2] = (fl_optim_operand){"exp_avg", exp_avgs[i], true};
        set[3] = (fl_optim_operand){"exp_avg_sq", exp_avg_sqs[i], true};
    }
    fl_adamw_ctx c = adamw_ctx(o);
    int rc = fl_optim_run_multi(op, count, 4, ops, adamw_loop, FL_OPTIM_ADAMW, &c);
    free(ops);
    return rc;
}
