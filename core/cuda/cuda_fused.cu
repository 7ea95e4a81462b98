/*
 * cuda_fused.cu: the CUDA kernel table of the fused family (fused.h), which
 * fl_fused_kernels_of returns for cuda tensors. Entries, in the table's
 * order, live in one file per concern:
 *   cuda_norm.cu                RMSNorm, add + RMSNorm, LayerNorm (+ backward)
 *   cuda_softmax.cu             softmax, log-softmax (+ backward)
 *   cuda_loss.cu                cross-entropy, NLL (+ backward)
 *   cuda_rotary.cu              rotary embeddings and their inverse
 *   cuda_attention.cu           attention forward (flash-style tiles)
 *   cuda_attention_backward.cu  attention backward
 *   cuda_sdpa.cu                attention through cuDNN (bf16/f16), both ways
 * Positional initialisers: designated ones are C++20, the build is C++17.
 */
#include "cuda_sdpa.cuh"

extern "C" const fl_fused_kernels fl_cuda_fused_kernels = {
    fl_cuda_rms_norm,
    fl_cuda_rms_norm_backward,
    fl_cuda_add_rms_norm,
    fl_cuda_add_rms_norm_backward,
    fl_cuda_layer_norm,
    fl_cuda_layer_norm_backward,
    fl_cuda_softmax,
    fl_cuda_softmax_backward,
    fl_cuda_cross_entropy,
    fl_cuda_cross_entropy_backward,
    fl_cuda_nll_loss,
    fl_cuda_nll_loss_backward,
    fl_cuda_rotary,
    fl_cuda_attention,
    fl_cuda_attention_backward,
    fl_cuda_attention_cudnn,
    fl_cuda_attention_cudnn_backward,
};
