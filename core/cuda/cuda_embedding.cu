/*
 * cuda_embedding.cu: GPU kernels of embedding: a row gather, and its
 * backward, which adds gradient rows into the rows of the weight's
 * gradient.
 *
 * The forward checks every id on the device before anything is written: a
 * first kernel records the smallest position of an out-of-range id, which
 * the host reads back (one small synchronous copy per call), so a bad id
 * gives the CPU's error, naming the id and its position, instead of a
 * device fault.
 *
 * The backward adds with atomics: an f32 gradient in place, f64 in double,
 * bf16/f16 into an f32 scratch rounded once at the end (bf16 atomics would
 * round at every addition and lose the gradients of frequent tokens). The
 * order of the additions is not fixed, so unlike the CPU's sorted sum in
 * double the result may differ in the last bits from run to run.
 */
#include "cuda_linear.cuh"

#include <limits.h>

__device__ __forceinline__ int64_t id_at(const void *ids, int is64, int64_t i) {
    return is64 ? ((const long long *)ids)[i] : ((const int *)ids)[i];
}

/* *first = the smallest i whose id is outside [0, V). */
__global__ void check_ids_kernel(const void *ids, int is64, int64_t n, int64_t V,
                                 unsigned long long *first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = id_at(ids, is64, i);
        if (id < 0 || id >= V) atomicMin(first, (unsigned long long)i);
    }
}

/* out[i, j] = w[ids[i], j], elements of size T moved as they are. */
template <typename T>
__global__ void gather_rows_kernel(T *out, const T *w, int64_t s0, int64_t s1, const void *ids,
                                   int is64, int64_t n, int64_t D) {
    int64_t total = n * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / D, j = e - i * D;
        out[e] = w[id_at(ids, is64, i) * s0 + j * s1];
    }
}

/* The ids are checked; FL_OK or the CPU's error for the first bad one. */
static int check_ids(const fl_tensor *ids, const fl_tensor *w) {
    const char *op = "embedding";
    int64_t n = ids->numel, V = w->shape[0];
    int is64 = ids->dtype == FL_I64;
    int64_t one = 1;
    fl_tensor *flag = fl_empty(1, &one, FL_I64, ids->device);
    if (!flag) return fl_last_status();
    cudaStream_t s = fl_cu_stream();
    unsigned long long first = ULLONG_MAX;
    int rc = FL_OK;
    cudaError_t e = cudaMemsetAsync(flag->data, 0xff, sizeof first, s);
    if (e == cudaSuccess) {
        check_ids_kernel<<<fl_cu_blocks(n, 256), 256, 0, s>>>(ids->data, is64, n, V,
                                                              (unsigned long long *)flag->data);
        rc = fl_cu_check(op);
        if (rc == FL_OK) rc = fl_cuda_nccl_settle(); /* the host waits below */
        if (rc == FL_OK) e = cudaMemcpyAsync(&first, flag->data, sizeof first, cudaMemcpyDeviceToHost, s);
        if (rc == FL_OK && e == cudaSuccess) e = cudaStreamSynchronize(s);
    }
    if (rc == FL_OK && e != cudaSuccess)
        rc = fl_fail(FL_ERR_DEVICE, "%s on cuda: checking the ids: %s", op, cudaGetErrorString(e));
    if (rc == FL_OK && first != ULLONG_MAX) {
        /* The bad id itself, for the message. */
        int64_t id = 0;
        int32_t id32 = 0;
        size_t es = is64 ? sizeof id : sizeof id32;
        e = cudaMemcpy(is64 ? (void *)&id : (void *)&id32, (const char *)ids->data + first * es, es,
                       cudaMemcpyDeviceToHost);
        if (!is64) id = id32;
        char sh[128];
        rc = e != cudaSuccess
                 ? fl_fail(FL_ERR_DEVICE, "%s on cuda: reading a bad id: %s", op, cudaGetErrorString(e))
                 : fl_fail(FL_ERR_ARG,
                           "embedding: id %lld (element %lld of the ids) is out of range for a "
                           "weight of %lld rows (shape %s)",
                           (long long)id, (long long)first, (long long)V,
                           fl_shape_str(w, sh, sizeof sh));
    }
    fl_tensor_release(flag);
    return rc;
}

int fl_cuda_embedding(fl_tensor *out, const fl_tensor *ids, const fl_tensor *w) {
    const char *op = "embedding";
    int64_t n = ids->numel, D = w->shape[1];
    if (ids->dtype != FL_I64 && ids->dtype != FL_I32)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: ids of dtype %s (i64 or i32 needed)", op,
                       fl_dtype_name(ids->dtype));
    if (n == 0) return FL_OK;
    int rc = fl_cu_use_device(op, out);
    if (rc != FL_OK || (rc = check_ids(ids, w)) != FL_OK) return rc;
    if (D == 0) return FL_OK;
    int is64 = ids->dtype == FL_I64;
    int64_t s0 = w->stride[0], s1 = w->stride[1];
    unsigned blocks = fl_cu_blocks(n * D, 256);
    cudaStream_t s = fl_cu_stream();
    switch (fl_dtype_size(w->dtype)) {
    case 1: gather_rows_kernel<uint8_t><<<blocks, 256, 0, s>>>((uint8_t *)out->data, (const uint8_t *)w->data, s0, s1, ids->data, is64, n, D); break;
    case 2: gather_rows_kernel<uint16_t><<<blocks, 256, 0, s>>>((uint16_t *)out->data, (const uint16_t *)w->data, s0, s1, ids->data, is64, n, D); break;
    case 4: gather_rows_kernel<uint32_t><<<blocks, 256, 0, s>>>((uint32_t *)out->data, (const uint32_t *)w->data, s0, s1, ids->data, is64, n, D); break;
    case 8: gather_rows_kernel<uint64_t><<<blocks, 256, 0, s>>>((uint64_t *)out->data, (const uint64_t *)w->data, s0, s1, ids->data, is64, n, D); break;
    default:
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for dtype %s", op,
                       fl_dtype_name(w->dtype));
    }
    return fl_cu_check(op);
}

/* acc[ids[i], j] += gy[i, j] for ids other than padding_idx; acc is f32
 * (dtype 0) or f64 (dtype 1). Ids outside [0, V) were refused by the
 * forward; they are skipped here rather than written out of bounds. */
__global__ void scatter_rows_kernel(void *acc, int acc64, const void *gy, int gd, const void *ids,
                                    int is64, int64_t n, int64_t D, int64_t V,
                                    int64_t padding_idx) {
    int64_t total = n * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / D, j = e - i * D;
        int64_t id = id_at(ids, is64, i);
        if (id == padding_idx || id < 0 || id >= V) continue;
        if (acc64) atomicAdd((double *)acc + id * D + j, fl_cu_get_f64(gy, e, gd));
        else atomicAdd((float *)acc + id * D + j, fl_cu_get_f32(gy, e, gd));
    }
}

__global__ void round_kernel(void *dst, int dd, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        fl_cu_put_f32(dst, i, dd, src[i]);
}

int fl_cuda_embedding_backward(fl_tensor *gw, const fl_tensor *ids, const fl_tensor *gy,
                               int64_t padding_idx) {
    const char *op = "embedding backward";
    int64_t n = ids->numel, V = gw->shape[0], D = gw->shape[1];
    if (n == 0 || D == 0) return FL_OK;
    if (ids->dtype != FL_I64 && ids->dtype != FL_I32)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: ids of dtype %s (i64 or i32 needed)", op,
                       fl_dtype_name(ids->dtype));
    fl_dtype gd = gw->dtype;
    if (gd != FL_F32 && gd != FL_F64 && gd != FL_BF16 && gd != FL_F16)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for dtype %s", op, fl_dtype_name(gd));
    int rc = fl_cu_use_device(op, gw);
    if (rc != FL_OK) return rc;
    cudaStream_t s = fl_cu_stream();
    fl_tensor *scratch = NULL;
    void *acc = gw->data;
    if (gd == FL_BF16 || gd == FL_F16) {
        scratch = fl_empty(2, gw->shape, FL_F32, gw->device);
        if (!scratch) return fl_last_status();
        cudaError_t e = cudaMemsetAsync(scratch->data, 0, (size_t)(V * D) * sizeof(float), s);
        if (e != cudaSuccess) {
            fl_tensor_release(scratch);
            return fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
        }
        acc = scratch->data;
    }
    scatter_rows_kernel<<<fl_cu_blocks(n * D, 256), 256, 0, s>>>(
        acc, gd == FL_F64, gy->data, gy->dtype, ids->data, ids->dtype == FL_I64, n, D, V,
        padding_idx);
    rc = fl_cu_check(op);
    if (rc == FL_OK && scratch) {
        round_kernel<<<fl_cu_blocks(V * D, 256), 256, 0, s>>>(gw->data, gd,
                                                              (const float *)scratch->data, V * D);
        rc = fl_cu_check(op);
    }
    fl_tensor_release(scratch);
    return rc;
}
