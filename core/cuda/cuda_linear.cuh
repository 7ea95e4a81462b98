/*
 * cuda_linear.cuh: what the CUDA kernels of the linear family share across
 * their files: cuda_gemm.cu (matmul, row sums, the table), cuda_embedding.cu,
 * cuda_pool2d.cu and cuda_conv.cu. Their contracts are the fields of
 * fl_linear_kernels (core/backend/backend.h).
 */
#ifndef FL_CUDA_LINEAR_CUH
#define FL_CUDA_LINEAR_CUH

#include "cuda_common.cuh"

extern "C" {
#include "backend.h"
}

fl_embedding_kernel fl_cuda_embedding;
fl_embedding_backward_kernel fl_cuda_embedding_backward;
fl_conv2d_kernel fl_cuda_conv2d;
fl_conv2d_backward_kernel fl_cuda_conv2d_backward;
fl_max_pool2d_kernel fl_cuda_max_pool2d;
fl_max_pool2d_backward_kernel fl_cuda_max_pool2d_backward;

fl_matmul_kernel fl_cuda_matmul;
fl_matmul_acc_kernel fl_cuda_matmul_acc;

/* C[i] = A[i] @ B[i] (+ bias) for i < batch, row-major: A at a + i * sa, B
 * at b + i * sb, C at c + i * sc (strides in elements; 0 reads one matrix
 * for every i). ta/tb: the matrix is stored as the transpose of a row-major
 * one, with row stride lda/ldb as stored. */
struct fl_cu_gemm_args {
    int64_t m, n, k, batch;
    const void *a, *b;
    bool ta, tb;
    int64_t lda, ldb, sa, sb;
    void *c;
    int64_t ldc, sc;
    fl_dtype ab, cd;  /* dtype of A and B; of C (the output) */
    const void *bias; /* n values of bias_dtype for the epilogue, or NULL (not f64) */
    fl_dtype bias_dtype;
    double beta;      /* 0, or 1: C already holds the bias (f64) or a sum to add onto */
};

/* The workspace cuBLASLt is offered: its own advice for Hopper (split-K and
 * stream-K kernels need it); the caching pool makes the size cheap. */
static const int64_t FL_CU_GEMM_WORKSPACE = 32ll << 20;

/* No algorithm for this combination (no error set): the caller may take
 * another route. */
enum { FL_CU_NO_ALGORITHM = -1 };

/* One product: cuBLASLt for f32/bf16/f16 (ws: FL_CU_GEMM_WORKSPACE bytes on
 * the device), cuBLAS for f64 (ws unused). FL_OK, FL_CU_NO_ALGORITHM, or an
 * error naming `op`. The device is current. */
int fl_cu_gemm(const char *op, int dev, const fl_cu_gemm_args *g, void *ws, int64_t ws_bytes);

/* A fresh tensor of `bytes` bytes on t's device (from the caching pool),
 * for a library's workspace; NULL (error set) when refused. */
fl_tensor *fl_cu_workspace(const fl_tensor *t, int64_t bytes);

#endif /* FL_CUDA_LINEAR_CUH */
