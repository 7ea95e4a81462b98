/*
 * cpu_norm.c: the CPU kernels of RMSNorm (alone and after a residual add)
 * and LayerNorm, forward and backward
 * (the op: core/ops/norm.c; on CUDA: core/cuda/cuda_norm.cu), instantiated
 * from cpu_norm_gen.h for f32 math (f32, f16, bf16 tensors) and f64 math
 * (f64 tensors) by cpu_fused_instances.h. Each entry picks the instantiation
 * from the dtype of the statistics or output tensor the op created in the
 * compute dtype; cpu_fused.c puts them in the kernel table.
 */
#define FL_CPU_KERNELS "cpu_norm_gen.h"
#include "cpu_fused_instances.h"

int fl_cpu_rms_norm(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
                    double eps) {
    return fl_cpu_wide(rstd) ? rms_norm_f64(out, rstd, x, w, eps, NULL, NULL)
                             : rms_norm_f32(out, rstd, x, w, eps, NULL, NULL);
}

int fl_cpu_rms_norm_backward(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g, const fl_tensor *x,
                             const fl_tensor *w, const fl_tensor *rstd) {
    return fl_cpu_wide(rstd) ? rms_norm_backward_f64(dx, dw, g, x, w, rstd, NULL)
                             : rms_norm_backward_f32(dx, dw, g, x, w, rstd, NULL);
}

/* The same kernels with the residual add (h = x + a) before the norm, and
 * h's own gradient added to dx ([Note: residual add fused with RMSNorm],
 * core/ops/norm.c). */
int fl_cpu_add_rms_norm(fl_tensor *h, fl_tensor *out, fl_tensor *rstd, const fl_tensor *x,
                        const fl_tensor *a, const fl_tensor *w, double eps) {
    return fl_cpu_wide(rstd) ? rms_norm_f64(out, rstd, x, w, eps, a, h)
                             : rms_norm_f32(out, rstd, x, w, eps, a, h);
}

int fl_cpu_add_rms_norm_backward(fl_tensor *dh, fl_tensor *dw, const fl_tensor *gh,
                                 const fl_tensor *gy, const fl_tensor *h, const fl_tensor *w,
                                 const fl_tensor *rstd) {
    return fl_cpu_wide(rstd) ? rms_norm_backward_f64(dh, dw, gy, h, w, rstd, gh)
                             : rms_norm_backward_f32(dh, dw, gy, h, w, rstd, gh);
}

int fl_cpu_layer_norm(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                      const fl_tensor *w, const fl_tensor *b, double eps) {
    return fl_cpu_wide(rstd) ? layer_norm_f64(out, mean, rstd, x, w, b, eps)
                             : layer_norm_f32(out, mean, rstd, x, w, b, eps);
}

int fl_cpu_layer_norm_backward(fl_tensor *dx, fl_tensor *dw, fl_tensor *db, const fl_tensor *g,
                               const fl_tensor *x, const fl_tensor *w, const fl_tensor *mean,
                               const fl_tensor *rstd) {
    return fl_cpu_wide(rstd) ? layer_norm_backward_f64(dx, dw, db, g, x, w, mean, rstd)
                             : layer_norm_backward_f32(dx, dw, db, g, x, w, mean, rstd);
}
