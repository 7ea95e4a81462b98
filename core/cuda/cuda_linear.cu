/*
 * cuda_linear.cu: the kernel table of the linear family on CUDA, the row
 * sums of the bias gradient, and the helpers the family's CUDA files share
 * (library workspaces; strided operands are compacted by the backend's
 * copy). The kernels themselves live in
 * cuda_matmul.cu, cuda_embedding.cu, cuda_pool2d.cu and cuda_conv.cu.
 */
#include "cuda_linear.cuh"

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

fl_tensor *fl_cu_workspace(const fl_tensor *t, int64_t bytes) {
    int64_t n = max1(bytes);
    return fl_empty(1, &n, FL_U8, t->device);
}

/* ---- row sums (bias gradients) ------------------------------------------------- */

enum { SUM_COLS = 32, SUM_LANES = 16 };

/* Column sums of rows [r0, r1) of in, in double as the CPU: a block owns
 * SUM_COLS columns and a slice of rows (blockIdx.y of gridDim.y); its
 * threads sum every SUM_LANES-th row of their column, then the lanes' sums
 * are added in lane order. Fixed order everywhere: deterministic. The
 * result goes to out (dtype od) when gridDim.y is 1, else to the f64
 * partial sums part[blockIdx.y, :]. */
__global__ void sum_rows_kernel(void *out, int od, double *part, const void *in, int id,
                                int64_t rows, int64_t n, int64_t sr, int64_t sc) {
    __shared__ double lane[SUM_LANES][SUM_COLS + 1];
    int64_t col = blockIdx.x * (int64_t)SUM_COLS + threadIdx.x;
    int64_t r0 = rows * blockIdx.y / gridDim.y, r1 = rows * (blockIdx.y + 1) / gridDim.y;
    double acc = 0;
    if (col < n)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += SUM_LANES)
            acc += fl_cu_get_f64(in, r * sr + col * sc, id);
    lane[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < n) {
        double s = 0;
        for (int y = 0; y < SUM_LANES; y++) s += lane[y][threadIdx.x];
        if (part) part[blockIdx.y * n + col] = s;
        else fl_cu_put_f64(out, col, od, s);
    }
}

/* out[j] = the sum over p of part[p, j], in order. */
__global__ void sum_parts_kernel(void *out, int od, const double *part, int64_t parts, int64_t n) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n;
         j += (int64_t)gridDim.x * blockDim.x) {
        double s = 0;
        for (int64_t p = 0; p < parts; p++) s += part[p * n + j];
        fl_cu_put_f64(out, j, od, s);
    }
}

static int cuda_sum_rows(fl_tensor *out, const fl_tensor *in) {
    const char *op = "linear backward (bias gradient)";
    int64_t rows = in->shape[0], n = in->shape[1];
    if (n == 0) return FL_OK;
    if (!fl_dtype_is_float(in->dtype))
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for dtype %s", op,
                       fl_dtype_name(in->dtype));
    int rc = fl_cu_use_device(op, in);
    if (rc != FL_OK) return rc;
    int64_t gx = (n + SUM_COLS - 1) / SUM_COLS;
    /* Split the rows over more blocks when the columns alone cannot fill the
     * GPU (a few hundred blocks), each slice at least 256 rows. The split
     * depends on the shape only, so the sum's bits do too. */
    int64_t gy = (rows + 255) / 256, want = 512 / gx;
    if (gy > want) gy = want;
    if (gy > 65535) gy = 65535;
    if (gy < 1) gy = 1;
    fl_tensor *part = NULL;
    if (gy > 1) {
        int64_t shape[2] = {gy, n};
        part = fl_empty(2, shape, FL_F64, in->device);
        if (!part) return fl_last_status();
    }
    dim3 grid((unsigned)gx, (unsigned)gy), block(SUM_COLS, SUM_LANES);
    cudaStream_t s = fl_cu_stream();
    sum_rows_kernel<<<grid, block, 0, s>>>(out->data, out->dtype,
                                           part ? (double *)part->data : NULL, in->data,
                                           in->dtype, rows, n, in->stride[0], in->stride[1]);
    rc = fl_cu_check(op);
    if (rc == FL_OK && part) {
        sum_parts_kernel<<<fl_cu_blocks(n, 256), 256, 0, s>>>(out->data, out->dtype,
                                                              (const double *)part->data, gy, n);
        rc = fl_cu_check(op);
    }
    fl_tensor_release(part);
    return rc;
}

/* ---- the table ------------------------------------------------------------------ */

/* In the order of the fields of fl_linear_kernels (C++17 has no designated
 * initializers). */
extern "C" const fl_linear_kernels fl_cuda_linear_kernels = {
    fl_cuda_matmul,
    NULL, /* matmul_scratch: cuBLASLt reads 16-bit operands as they are */
    fl_cuda_matmul_acc,
    cuda_sum_rows,
    fl_cuda_embedding,
    fl_cuda_embedding_backward,
    fl_cuda_conv2d,
    fl_cuda_conv2d_backward,
    fl_cuda_max_pool2d,
    fl_cuda_max_pool2d_backward,
};
