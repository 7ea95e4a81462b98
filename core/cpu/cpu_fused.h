/*
 * cpu_fused.h: the CPU kernels of the fused family, one file per op as in
 * core/ops and core/cuda (cpu_norm.c, cpu_softmax.c, cpu_loss.c,
 * cpu_rotary.c, cpu_attention.c), gathered into one kernel table by
 * cpu_fused.c. Arguments as fl_fused_kernels' (core/ops/fused.h).
 */
#ifndef FL_CPU_FUSED_H
#define FL_CPU_FUSED_H

#include "cpu_fused_math.h"

/* Whether a kernel computes in f64 (for f64 tensors) rather than f32. */
static inline bool fl_cpu_wide(const fl_tensor *t) { return t->dtype == FL_F64; }

int fl_cpu_rms_norm(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
                    double eps);
int fl_cpu_rms_norm_backward(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g, const fl_tensor *x,
                             const fl_tensor *w, const fl_tensor *rstd);
int fl_cpu_add_rms_norm(fl_tensor *h, fl_tensor *out, fl_tensor *rstd, const fl_tensor *x,
                        const fl_tensor *a, const fl_tensor *w, double eps);
int fl_cpu_add_rms_norm_backward(fl_tensor *dh, fl_tensor *dw, const fl_tensor *gh,
                                 const fl_tensor *gy, const fl_tensor *h, const fl_tensor *w,
                                 const fl_tensor *rstd);
int fl_cpu_layer_norm(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                      const fl_tensor *w, const fl_tensor *b, double eps);
int fl_cpu_layer_norm_backward(fl_tensor *dx, fl_tensor *dw, fl_tensor *db, const fl_tensor *g,
                               const fl_tensor *x, const fl_tensor *w, const fl_tensor *mean,
                               const fl_tensor *rstd);
int fl_cpu_softmax(fl_tensor *out, const fl_tensor *x, int dim, bool log);
int fl_cpu_softmax_backward(fl_tensor *dx, const fl_tensor *g, const fl_tensor *y, int dim,
                            bool log);
int fl_cpu_cross_entropy(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                         const fl_tensor *targets, const fl_loss_params *p, double *total,
                         int64_t *count);
int fl_cpu_cross_entropy_backward(fl_tensor *dlogits, const fl_tensor *g_rows, double g_scalar,
                                  const fl_tensor *logits, const fl_tensor *targets,
                                  const fl_tensor *lse, const fl_loss_params *p);
int fl_cpu_nll_loss(fl_tensor *rows_out, const fl_tensor *log_probs, const fl_tensor *targets,
                    const fl_loss_params *p, double *total, int64_t *count);
int fl_cpu_nll_loss_backward(fl_tensor *dlp, const fl_tensor *g_rows, double g_scalar,
                             const fl_tensor *targets, const fl_loss_params *p);
int fl_cpu_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos, const fl_tensor *sin,
                  const fl_tensor *positions, bool inverse);

#endif
