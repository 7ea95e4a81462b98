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
 * The backward is the CPU's algorithm, so it gives the CPU's bits: the
 * (id, position) pairs are sorted (a bitonic sort of 64-bit keys id << 32 |
 * position, one small kernel per merge step: no library, deterministic,
 * and the simulator runs it as it is), so the rows of one id are adjacent
 * and in position order; one block per id then sums its rows column by
 * column in double and stores the sum once, rounded as the CPU rounds.
 * An earlier version added with atomics: the order of the additions
 * changed from run to run, and a real H100 showed it (activation
 * checkpointing and offload, which must reproduce the plain run's
 * gradients bit for bit, differed in the embedding's by 1e-7), which the
 * simulator, running blocks one after another, could not.
 */
#include "cuda_linear.cuh"
#include "shape.h"

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

/* keys[i] = id << 32 | i for the ids to sum, all ones (sorted last) for
 * padding, out-of-range ids (refused by the forward; never written) and
 * the power-of-two padding past n. */
__global__ void make_keys_kernel(unsigned long long *keys, const void *ids, int is64, int64_t n,
                                 int64_t n_pow2, int64_t V, int64_t padding_idx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_pow2;
         i += (int64_t)gridDim.x * blockDim.x) {
        unsigned long long key = ~0ull;
        if (i < n) {
            int64_t id = id_at(ids, is64, i);
            if (id != padding_idx && id >= 0 && id < V)
                key = ((unsigned long long)id << 32) | (unsigned long long)i;
        }
        keys[i] = key;
    }
}

/* One compare-exchange step (size, stride) of a bitonic sort, ascending. */
__global__ void bitonic_step_kernel(unsigned long long *keys, int64_t n_pow2, int64_t size,
                                    int64_t stride) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_pow2;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = i ^ stride;
        if (j <= i) continue;
        bool up = (i & size) == 0;
        unsigned long long a = keys[i], b = keys[j];
        if ((a > b) == up) {
            keys[i] = b;
            keys[j] = a;
        }
    }
}

/* Block t owns sorted key t when it starts a run of one id: it sums the
 * run's gradient rows in position order onto gw's row (zeros, or a tied
 * weight's other gradient), in double, and stores the row of gw once
 * (fl_cu_put_f64 rounds as the CPU's store). */
__global__ void sum_runs_kernel(void *gw, int gwd, const void *gy, int gd,
                                const unsigned long long *keys, int64_t n, int64_t D) {
    for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
        unsigned long long key = keys[t];
        if (key == ~0ull) return; /* sorted last: nothing after it either */
        int64_t id = (int64_t)(key >> 32);
        if (t > 0 && (int64_t)(keys[t - 1] >> 32) == id) continue;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double acc = fl_cu_get_f64(gw, id * D + j, gwd);
            for (int64_t r = t; r < n && keys[r] != ~0ull && (int64_t)(keys[r] >> 32) == id; r++)
                acc += fl_cu_get_f64(gy, (int64_t)(keys[r] & 0xffffffffull) * D + j, gd);
            fl_cu_put_f64(gw, id * D + j, gwd, acc);
        }
    }
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
    /* Positions and ids share one 64-bit key. */
    if (n > (int64_t)UINT32_MAX || V > (int64_t)INT32_MAX)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: %lld ids into %lld rows is beyond the "
                       "sort's 32-bit positions and ids", op, (long long)n, (long long)V);
    int rc = fl_cu_use_device(op, gw);
    if (rc != FL_OK) return rc;
    cudaStream_t s = fl_cu_stream();
    int64_t n_pow2 = 1;
    while (n_pow2 < n) n_pow2 <<= 1;
    fl_tensor *keys = fl_empty(1, &n_pow2, FL_I64, gw->device);
    if (!keys) return fl_last_status();
    unsigned long long *k = (unsigned long long *)keys->data;
    unsigned blocks = fl_cu_blocks(n_pow2, 256);
    make_keys_kernel<<<blocks, 256, 0, s>>>(k, ids->data, ids->dtype == FL_I64, n, n_pow2, V,
                                            padding_idx);
    rc = fl_cu_check(op); /* (one check per launch: [Note: kernel launches counted]) */
    for (int64_t size = 2; size <= n_pow2 && rc == FL_OK; size <<= 1)
        for (int64_t stride = size >> 1; stride > 0 && rc == FL_OK; stride >>= 1) {
            bitonic_step_kernel<<<blocks, 256, 0, s>>>(k, n_pow2, size, stride);
            rc = fl_cu_check(op);
        }
    int threads = D >= 256 ? 256 : (int)((D + 31) / 32 * 32);
    if (rc == FL_OK) {
        sum_runs_kernel<<<(unsigned)(n < 65536 ? n : 65536), threads, 0, s>>>(gw->data, gd, gy->data,
                                                                              gy->dtype, k, n, D);
        rc = fl_cu_check(op);
    }
    /* The pool is stream-ordered: the keys are reused only by later work. */
    fl_tensor_release(keys);
    return rc;
}
