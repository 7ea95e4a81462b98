/*
 * cpu_fused.h: the CPU kernels of the fused family, one file per op as in
 * core/ops and core/cuda (cpu_norm.c, cpu_softmax.c, cpu_loss.c,
 * cpu_rotary.c, cpu_attention.c), gathered into one kernel table by
 * cpu_fused.c. Declared with the function types of
 * fl_fused_kernels (core/backend/backend.h).
 */
#ifndef FL_CPU_FUSED_H
#define FL_CPU_FUSED_H

#include "cpu_fused_math.h"

/* Whether a kernel computes in f64 (for f64 tensors) rather than f32. */
static inline bool fl_cpu_wide(const fl_tensor *t) { return t->dtype == FL_F64; }

fl_rms_norm_kernel fl_cpu_rms_norm;
fl_rms_norm_backward_kernel fl_cpu_rms_norm_backward;
fl_add_rms_norm_kernel fl_cpu_add_rms_norm;
fl_add_rms_norm_backward_kernel fl_cpu_add_rms_norm_backward;
fl_layer_norm_kernel fl_cpu_layer_norm;
fl_layer_norm_backward_kernel fl_cpu_layer_norm_backward;
fl_softmax_kernel fl_cpu_softmax;
fl_softmax_backward_kernel fl_cpu_softmax_backward;
fl_cross_entropy_kernel fl_cpu_cross_entropy;
fl_cross_entropy_backward_kernel fl_cpu_cross_entropy_backward;
fl_nll_loss_kernel fl_cpu_nll_loss;
fl_nll_loss_backward_kernel fl_cpu_nll_loss_backward;
fl_rotary_kernel fl_cpu_rotary;

#endif
