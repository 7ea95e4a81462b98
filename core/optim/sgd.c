/*
 * sgd.c: the fused SGD update, PyTorch's torch.optim.SGD formula:
 *
 *   d = g + weight_decay * p                        (when weight_decay != 0)
 *   buf = d                                         on the first step
 *   buf = momentum * buf + (1 - dampening) * d      after it
 *   d = nesterov ? d + momentum * buf : buf         (when momentum != 0)
 *   p = p - lr * d
 *
 * PyTorch starts the buffer as a copy of the first d (no dampening on the
 * first step); `step == 1` says when that is.
 */
#include "optim_kernel.h"

/* One chunk for one combination of the flags (each a constant where it
 * is instantiated, see FL_OPTIM_INLINE). */
FL_OPTIM_INLINE void sgd_elems(const fl_sgd_ctx *c, int64_t n, float *restrict p,
                               const float *restrict g, float *restrict buf, bool decay,
                               bool momentum, bool first, bool nesterov) {
    float lr = c->lr, wd = c->weight_decay, mom = c->momentum, keep = c->one_minus_dampening;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float d = decay ? g[i] + wd * p[i] : g[i];
        if (momentum) {
            float b = first ? d : buf[i] * mom + keep * d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] = p[i] + -lr * d;
    }
}

static void sgd_loop(const void *vctx, int64_t n, float *const *x, const fl_dtype *dtypes) {
    (void)dtypes;
    const fl_sgd_ctx *c = vctx;
    float *p = x[0], *buf = x[2];
    const float *g = x[1];
    bool decay = c->weight_decay != 0;
    if (!c->use_momentum) {
        if (decay) sgd_elems(c, n, p, g, buf, true, false, false, false);
        else sgd_elems(c, n, p, g, buf, false, false, false, false);
        return;
    }
    switch ((decay ? 4 : 0) | (c->first ? 2 : 0) | (c->nesterov ? 1 : 0)) {
    case 0: sgd_elems(c, n, p, g, buf, false, true, false, false); break;
    case 1: sgd_elems(c, n, p, g, buf, false, true, false, true); break;
    case 2: sgd_elems(c, n, p, g, buf, false, true, true, false); break;
    case 3: sgd_elems(c, n, p, g, buf, false, true, true, true); break;
    case 4: sgd_elems(c, n, p, g, buf, true, true, false, false); break;
    case 5: sgd_elems(c, n, p, g, buf, true, true, false, true); break;
    case 6: sgd_elems(c, n, p, g, buf, true, true, true, false); break;
    default: sgd_elems(c, n, p, g, buf, true, true, true, true); break;
    }
}

int fl_sgd_step_(fl_tensor *param, const fl_tensor *grad, fl_tensor *momentum_buffer,
                 const fl_sgd_options *o) {
    const char *op = "sgd";
    if (!o) return fl_fail(FL_ERR_ARG, "%s: options are NULL", op);
    if (fl_optim_check_lr(op, o->lr, o->weight_decay)) return fl_last_status();
    if (!(o->momentum >= 0) || !(o->dampening >= 0 && o->dampening <= 1))
        return fl_fail(FL_ERR_ARG, "%s: momentum must be >= 0 and dampening in [0, 1], got %g and %g",
                       op, o->momentum, o->dampening);
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return fl_fail(FL_ERR_ARG, "%s: nesterov momentum requires momentum > 0 and zero dampening "
                       "(got momentum %g, dampening %g)", op, o->momentum, o->dampening);
    if (o->step < 1)
        return fl_fail(FL_ERR_ARG, "%s: step must be >= 1 (the count including this update), got %lld",
                       op, (long long)o->step);
    bool use_momentum = o->momentum != 0;
    if (use_momentum && !momentum_buffer)
        return fl_fail(FL_ERR_ARG, "%s: momentum %g needs a momentum_buffer, got NULL", op, o->momentum);
    fl_sgd_ctx c = {
        .lr = (float)o->lr,
        .momentum = (float)o->momentum,
        .one_minus_dampening = (float)(1 - o->dampening),
        .weight_decay = (float)o->weight_decay,
        .use_momentum = use_momentum,
        .nesterov = o->nesterov,
        .first = o->step == 1,
    };
    fl_optim_operand ops[3] = {
        {"param", param, true},
        {"grad", (fl_tensor *)grad, false},
        {"momentum_buffer", use_momentum ? momentum_buffer : NULL, true},
    };
    return fl_optim_run(op, 3, ops, sgd_loop, FL_OPTIM_SGD, &c);
}
