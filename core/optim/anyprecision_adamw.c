/*
 * anyprecision_adamw.c: AnyPrecisionAdamW, the AdamW variant of torchdistx
 * (and llama-recipes) for training with low-precision params and states.
 *
 * The moments live in any state dtype (bf16 typically), and the first
 * moment is the plain EMA m = beta1 * m + (1 - beta1) * g rather than
 * AdamW's lerp. The step is step_size * m / (sqrt(v) / sqrt(1 - beta2^t)
 * + eps) with step_size = lr / (1 - beta1^t), computed from m and v as they
 * are stored (rounded to their dtype), as the reference does.
 *
 * Kahan summation (when a compensation buffer is given): a bf16 param
 * cannot absorb an update smaller than half its spacing, so most updates of
 * a well-trained weight would vanish. The buffer c carries what the param
 * could not take:
 *
 *   c += change                 the whole change of p this step
 *   p_new = round(p + c)        what the param's dtype can hold
 *   c -= p_new - p              keep the rest for the next step
 *
 * torchdistx multiplies p by (1 - lr * wd) in the param's dtype before the
 * compensated step, which in bf16 rounds a typical decay (lr * wd ~ 1e-5)
 * away entirely. Here the decay -lr * wd * p is part of `change`, so it
 * accumulates in the buffer like the rest; without compensation the result
 * is p * (1 - lr * wd) - step, as in the reference, rounded once.
 */
#include "optim_kernel.h"

#include <math.h>

FL_ISA_BODY void anyprecision_loop_body(const void *vctx, int64_t n, float *const *x,
                                        const fl_dtype *dtypes) {
    const fl_anyprecision_ctx *c = vctx;
    float *restrict p = x[0];
    const float *restrict g = x[1];
    float *restrict m = x[2];
    float *restrict v = x[3];
    float *restrict comp = x[4];
    fl_dtype pd = dtypes[0], md = dtypes[2], vd = dtypes[3];
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = fl_optim_round(md, m[i] * c->beta1 + c->one_minus_beta1 * gi);
        float vi = fl_optim_round(vd, v[i] * c->beta2 + c->one_minus_beta2 * gi * gi);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
        float step = c->neg_step_size * mi / denom;
        float pi = p[i];
        if (c->kahan) {
            float ci = comp[i] + (c->neg_lr_wd * pi + step);
            float next = fl_optim_round(pd, pi + ci);
            comp[i] = ci - (next - pi);
            p[i] = next;
        } else {
            p[i] = pi * (1 + c->neg_lr_wd) + step;
        }
    }
}
FL_ISA_CLONES_VOID(AVX512, anyprecision_loop,
                   (const void *vctx, int64_t n, float *const *x, const fl_dtype *dtypes),
                   (vctx, n, x, dtypes))

int fl_anyprecision_adamw_step_(fl_tensor *param, const fl_tensor *grad, fl_tensor *exp_avg,
                                fl_tensor *exp_avg_sq, fl_tensor *compensation,
                                const fl_adamw_options *o) {
    const char *op = "anyprecision_adamw";
    if (fl_adamw_check_options(op, o)) return fl_last_status();
    if (!exp_avg || !exp_avg_sq)
        return fl_fail(FL_ERR_ARG, "%s: %s is NULL", op, exp_avg ? "exp_avg_sq" : "exp_avg");
    double bc1 = 1 - pow(o->beta1, (double)o->step);
    double bc2 = 1 - pow(o->beta2, (double)o->step);
    fl_anyprecision_ctx c = {
        .neg_lr_wd = (float)(-o->lr * o->weight_decay),
        .beta1 = (float)o->beta1,
        .one_minus_beta1 = (float)(1 - o->beta1),
        .beta2 = (float)o->beta2,
        .one_minus_beta2 = (float)(1 - o->beta2),
        .eps = (float)o->eps,
        .neg_step_size = (float)(-o->lr / bc1),
        .bc2_sqrt = (float)sqrt(bc2),
        .kahan = compensation != NULL,
    };
    fl_optim_operand ops[5] = {
        {"param", param, true},
        {"grad", (fl_tensor *)grad, false},
        {"exp_avg", exp_avg, true},
        {"exp_avg_sq", exp_avg_sq, true},
        {"compensation", compensation, true},
    };
    return fl_optim_run(op, 5, ops, anyprecision_loop, FL_OPTIM_ANYPRECISION_ADAMW, &c);
}
