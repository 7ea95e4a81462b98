/*
 * cuda_sdpa.cuh: the attention entries that go through cuDNN's fused flash
 * attention (cuda_sdpa.cu), for the fused kernel table (cuda_fused.cu), and
 * the per-path call counts that the flash-style kernels (cuda_attention.cu,
 * cuda_attention_backward.cu) add to, so tests can tell which path ran
 * (fl_attention_paths in fsdp.h).
 */
#ifndef FL_CUDA_SDPA_CUH
#define FL_CUDA_SDPA_CUH

#include "cuda_fused.cuh"

/* fused.h: attention_native / attention_native_backward. */
int fl_cuda_attention_cudnn(const fl_attention_args *a, bool *done);
int fl_cuda_attention_cudnn_backward(const fl_attention_args *a, bool *done);

/* Indices of fl_attention_paths' counts. */
enum {
    FL_ATT_PATH_CUDNN_FORWARD = 0,
    FL_ATT_PATH_KERNEL_FORWARD = 1,
    FL_ATT_PATH_CUDNN_BACKWARD = 2,
    FL_ATT_PATH_KERNEL_BACKWARD = 3,
};
void fl_cuda_attention_count(int path);

#endif /* FL_CUDA_SDPA_CUH */
