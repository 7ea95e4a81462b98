/*
 * cpu_fused.c: the CPU kernel table of the fused family. The kernels live
 * one op per file, as in core/ops and core/cuda: cpu_norm.c (RMSNorm,
 * LayerNorm), cpu_softmax.c, cpu_loss.c (cross-entropy, NLL),
 * cpu_rotary.c, cpu_attention.c (bf16 on AMX tiles or AVX512-BF16:
 * cpu_attention_native.c, cpu_attention_bf16.c).
 */
#include "cpu_fused.h"

const fl_fused_kernels fl_cpu_fused_kernels = {
    .rms_norm = fl_cpu_rms_norm,
    .rms_norm_backward = fl_cpu_rms_norm_backward,
    .add_rms_norm = fl_cpu_add_rms_norm,
    .add_rms_norm_backward = fl_cpu_add_rms_norm_backward,
    .layer_norm = fl_cpu_layer_norm,
    .layer_norm_backward = fl_cpu_layer_norm_backward,
    .softmax = fl_cpu_softmax,
    .softmax_backward = fl_cpu_softmax_backward,
    .cross_entropy = fl_cpu_cross_entropy,
    .cross_entropy_backward = fl_cpu_cross_entropy_backward,
    .nll_loss = fl_cpu_nll_loss,
    .nll_loss_backward = fl_cpu_nll_loss_backward,
    .rotary = fl_cpu_rotary,
    .attention = fl_cpu_attention,
    .attention_backward = fl_cpu_attention_backward,
    .attention_native = fl_cpu_attention_native,
    .attention_native_backward = fl_cpu_attention_native_backward,
};
