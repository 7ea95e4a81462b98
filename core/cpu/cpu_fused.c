/*
 * cpu_fused.c: the CPU kernel table of the fused family. The row kernels
 * (norms, softmax, losses, rotary) are instantiated here from
 * cpu_fused_gen.h for f32 and f64 math; attention lives in
 * cpu_attention.c. Each entry picks the instantiation from the dtype of
 * the statistics or output tensor the op created in the compute dtype.
 */
/* The build's -O2 vectorises only loops without an epilogue and never
 * if-converts float selects (they could raise FP exceptions, which
 * nothing here reads): these loops are exp/max/sum over rows of arbitrary
 * length, so this file asks for both. */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")

#include "cpu_fused_math.h"

#include <omp.h>
#include <stdlib.h>

#define R float
#define RT FL_F32
#define FN(name) name##_f32
#define EXP(x) fl_fast_expf(x)
#include "cpu_fused_gen.h"
#undef R
#undef RT
#undef FN
#undef EXP

#define R double
#define RT FL_F64
#define FN(name) name##_f64
#define EXP(x) exp(x)
#include "cpu_fused_gen.h"
#undef R
#undef RT
#undef FN
#undef EXP

static bool wide(const fl_tensor *t) {
    return t->dtype == FL_F64;
}

static int cpu_rms_norm(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
                        double eps) {
    return wide(rstd) ? rms_norm_f64(out, rstd, x, w, eps) : rms_norm_f32(out, rstd, x, w, eps);
}

static int cpu_rms_norm_backward(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g,
                                 const fl_tensor *x, const fl_tensor *w, const fl_tensor *rstd) {
    return wide(rstd) ? rms_norm_backward_f64(dx, dw, g, x, w, rstd)
                      : rms_norm_backward_f32(dx, dw, g, x, w, rstd);
}

static int cpu_layer_norm(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                          const fl_tensor *w, const fl_tensor *b, double eps) {
    return wide(rstd) ? layer_norm_f64(out, mean, rstd, x, w, b, eps)
                      : layer_norm_f32(out, mean, rstd, x, w, b, eps);
}

static int cpu_layer_norm_backward(fl_tensor *dx, fl_tensor *dw, fl_tensor *db,
                                   const fl_tensor *g, const fl_tensor *x, const fl_tensor *w,
                                   const fl_tensor *mean, const fl_tensor *rstd) {
    return wide(rstd) ? layer_norm_backward_f64(dx, dw, db, g, x, w, mean, rstd)
                      : layer_norm_backward_f32(dx, dw, db, g, x, w, mean, rstd);
}

static int cpu_softmax(fl_tensor *out, const fl_tensor *x, int dim, bool log) {
    return wide(out) ? softmax_f64(out, x, dim, log) : softmax_f32(out, x, dim, log);
}

static int cpu_softmax_backward(fl_tensor *dx, const fl_tensor *g, const fl_tensor *y, int dim,
                                bool log) {
    return wide(dx) ? softmax_backward_f64(dx, g, y, dim, log)
                    : softmax_backward_f32(dx, g, y, dim, log);
}

static int cpu_cross_entropy(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                             const fl_tensor *targets, const fl_loss_params *p, double *total,
                             int64_t *count) {
    return wide(lse) ? cross_entropy_f64(rows_out, lse, logits, targets, p, total, count)
                     : cross_entropy_f32(rows_out, lse, logits, targets, p, total, count);
}

static int cpu_cross_entropy_backward(fl_tensor *dlogits, const fl_tensor *g_rows,
                                      double g_scalar, const fl_tensor *logits,
                                      const fl_tensor *targets, const fl_tensor *lse,
                                      const fl_loss_params *p) {
    return wide(lse)
               ? cross_entropy_backward_f64(dlogits, g_rows, g_scalar, logits, targets, lse, p)
               : cross_entropy_backward_f32(dlogits, g_rows, g_scalar, logits, targets, lse, p);
}

static int cpu_nll_loss(fl_tensor *rows_out, const fl_tensor *log_probs,
                        const fl_tensor *targets, const fl_loss_params *p, double *total,
                        int64_t *count) {
    return wide(log_probs) ? nll_loss_f64(rows_out, log_probs, targets, p, total, count)
                           : nll_loss_f32(rows_out, log_probs, targets, p, total, count);
}

static int cpu_nll_loss_backward(fl_tensor *dlp, const fl_tensor *g_rows, double g_scalar,
                                 const fl_tensor *targets, const fl_loss_params *p) {
    return wide(dlp) ? nll_loss_backward_f64(dlp, g_rows, g_scalar, targets, p)
                     : nll_loss_backward_f32(dlp, g_rows, g_scalar, targets, p);
}

static int cpu_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos,
                      const fl_tensor *sin, const fl_tensor *positions, bool inverse) {
    return wide(out) ? rotary_f64(out, x, cos, sin, positions, inverse)
                     : rotary_f32(out, x, cos, sin, positions, inverse);
}

const fl_fused_kernels fl_cpu_fused_kernels = {
    .rms_norm = cpu_rms_norm,
    .rms_norm_backward = cpu_rms_norm_backward,
    .layer_norm = cpu_layer_norm,
    .layer_norm_backward = cpu_layer_norm_backward,
    .softmax = cpu_softmax,
    .softmax_backward = cpu_softmax_backward,
    .cross_entropy = cpu_cross_entropy,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .nll_loss = cpu_nll_loss,
    .nll_loss_backward = cpu_nll_loss_backward,
    .rotary = cpu_rotary,
    .attention = fl_cpu_attention,
    .attention_backward = fl_cpu_attention_backward,
};
