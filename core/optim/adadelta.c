/*
 * adadelta.c: the fused Adadelta update, PyTorch's torch.optim.Adadelta
 * formula (Zeiler 2012 with a learning rate, default 1.0):
 *
 *   d = g + weight_decay * p                        (when weight_decay != 0)
 *   s = rho * s + (1 - rho) * d * d                 square_avg
 *   delta = sqrt(a + eps) / sqrt(s + eps) * d       a: acc_delta before
 *   a = rho * a + (1 - rho) * delta * delta
 *   p = p - lr * delta
 */
#include "optim_kernel.h"

#include <math.h>

/* Vectorised passes over one chunk (n <= FL_OPTIM_CHUNK): the new
 * square_avg, both square roots (fl_optim_sqrt_n), then delta, acc_delta
 * and the param. `decay` is a constant where instantiated. */
FL_OPTIM_INLINE void adadelta_elems(const fl_adadelta_ctx *c, int64_t n, float *restrict p,
                                    const float *restrict g, float *restrict s,
                                    float *restrict a, bool decay) {
    float rho = c->rho, one_minus_rho = c->one_minus_rho, eps = c->eps, wd = c->weight_decay;
    float lr = c->lr;
    _Alignas(64) float d[FL_OPTIM_CHUNK], std[FL_OPTIM_CHUNK], root_a[FL_OPTIM_CHUNK];
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float di = decay ? g[i] + wd * p[i] : g[i];
        float si = s[i] * rho + one_minus_rho * di * di;
        s[i] = si;
        d[i] = di;
        std[i] = si + eps;
        root_a[i] = a[i] + eps;
    }
    fl_optim_sqrt_n(std, n);
    fl_optim_sqrt_n(root_a, n);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float delta = root_a[i] / std[i] * d[i];
        a[i] = a[i] * rho + one_minus_rho * delta * delta;
        p[i] = p[i] + -lr * delta;
    }
}

FL_ISA_BODY void adadelta_loop_body(const void *vctx, int64_t n, float *const *x,
                                    const fl_dtype *dtypes) {
    (void)dtypes;
    const fl_adadelta_ctx *c = vctx;
    if (c->weight_decay != 0)
        adadelta_elems(c, n, x[0], x[1], x[2], x[3], true);
    else
        adadelta_elems(c, n, x[0], x[1], x[2], x[3], false);
}
FL_ISA_CLONES_VOID(AVX512, adadelta_loop,
                   (const void *vctx, int64_t n, float *const *x, const fl_dtype *dtypes),
                   (vctx, n, x, dtypes))

int fl_adadelta_step_(fl_tensor *param, const fl_tensor *grad, fl_tensor *square_avg,
                      fl_tensor *acc_delta, const fl_adadelta_options *o) {
    const char *op = "adadelta";
    if (!o) return fl_fail(FL_ERR_ARG, "%s: options are NULL", op);
    if (fl_optim_check_lr(op, o->lr, o->weight_decay)) return fl_last_status();
    if (!(o->rho >= 0 && o->rho <= 1))
        return fl_fail(FL_ERR_ARG, "%s: rho must be in [0, 1], got %g", op, o->rho);
    if (!(o->eps >= 0)) return fl_fail(FL_ERR_ARG, "%s: eps must be >= 0, got %g", op, o->eps);
    if (!square_avg || !acc_delta)
        return fl_fail(FL_ERR_ARG, "%s: %s is NULL", op, square_avg ? "acc_delta" : "square_avg");
    fl_adadelta_ctx c = {
        .lr = (float)o->lr,
        .rho = (float)o->rho,
        .one_minus_rho = (float)(1 - o->rho),
        .eps = (float)o->eps,
        .weight_decay = (float)o->weight_decay,
    };
    fl_optim_operand ops[4] = {
        {"param", param, true},
        {"grad", (fl_tensor *)grad, false},
        {"square_avg", square_avg, true},
        {"acc_delta", acc_delta, true},
    };
    return fl_optim_run(op, 4, ops, adadelta_loop, FL_OPTIM_ADADELTA, &c);
}
