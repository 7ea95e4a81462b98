/*
 * cpu_loss.c: the CPU kernels of cross-entropy and NLL losses, forward and
 * backward (the op: core/ops/cross_entropy.c; on CUDA:
 * core/cuda/cuda_loss.cu), instantiated from cpu_loss_gen.h for f32 math
 * (f32, f16, bf16 tensors) and f64 math (f64 tensors) by
 * cpu_fused_instances.h. Each entry picks the instantiation from the dtype
 * of the statistics or output tensor the op created in the compute dtype;
 * cpu_fused.c puts them in the kernel table.
 */
#define FL_CPU_KERNELS "cpu_loss_gen.h"
#include "cpu_fused_instances.h"

int fl_cpu_cross_entropy(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                         const fl_tensor *targets, const fl_loss_params *p, double *total,
                         int64_t *count) {
    return fl_cpu_wide(lse) ? cross_entropy_f64(rows_out, lse, logits, targets, p, total, count)
                            : cross_entropy_f32(rows_out, lse, logits, targets, p, total, count);
}

int fl_cpu_cross_entropy_backward(fl_tensor *dlogits, const fl_tensor *g_rows, double g_scalar,
                                  const fl_tensor *logits, const fl_tensor *targets,
                                  const fl_tensor *lse, const fl_loss_params *p) {
    return fl_cpu_wide(lse)
               ? cross_entropy_backward_f64(dlogits, g_rows, g_scalar, logits, targets, lse, p)
               : cross_entropy_backward_f32(dlogits, g_rows, g_scalar, logits, targets, lse, p);
}

int fl_cpu_nll_loss(fl_tensor *rows_out, const fl_tensor *log_probs, const fl_tensor *targets,
                    const fl_loss_params *p, double *total, int64_t *count) {
    return fl_cpu_wide(log_probs) ? nll_loss_f64(rows_out, log_probs, targets, p, total, count)
                                  : nll_loss_f32(rows_out, log_probs, targets, p, total, count);
}

int fl_cpu_nll_loss_backward(fl_tensor *dlp, const fl_tensor *g_rows, double g_scalar,
                             const fl_tensor *targets, const fl_loss_params *p) {
    return fl_cpu_wide(dlp) ? nll_loss_backward_f64(dlp, g_rows, g_scalar, targets, p)
                            : nll_loss_backward_f32(dlp, g_rows, g_scalar, targets, p);
}
