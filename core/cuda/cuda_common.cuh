/*
 * cuda_common.cuh: what the CUDA kernel files (the .cu files of core/cuda) share.
 *
 * - The core's internal header, as C (it compiles as C++ under nvcc), so a
 *   .cu file implements a family's kernel table (binary.h, elementwise.h,
 *   linear.h, fused.h) directly and reports errors with fl_fail.
 * - Element loads and stores of every dtype, bit-exact with dtype.c
 *   (cuda_dtype.cuh): fl_cu_get_f32/put_f32 for kernels that compute in
 *   f32, fl_cu_get_f64/put_f64 for f64, as the CPU kernels do.
 * - Strided indexing: a tensor's shape and strides by value (fl_cu_layout),
 *   and the element offset of a row-major linear index.
 * - The stream every kernel is queued on (one place to change when streams
 *   arrive), the device of a tensor made current, grid sizes for
 *   grid-stride loops, and a launch's error turned into the core's.
 */
#ifndef FL_CUDA_COMMON_CUH
#define FL_CUDA_COMMON_CUH

extern "C" {
#include "error.h"
}

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "cuda_backend.h" /* fl_cuda_nccl_settle before a host read */
#include "cuda_dtype.cuh"

/* A scoped pthread lock. Not std::mutex: that can throw, and the library
 * links no C++ runtime (mk/nvcc_flags.sh). */
struct fl_cu_lock {
    pthread_mutex_t *m;
    explicit fl_cu_lock(pthread_mutex_t *mutex) : m(mutex) { pthread_mutex_lock(m); }
    ~fl_cu_lock() { pthread_mutex_unlock(m); }
    fl_cu_lock(const fl_cu_lock &) = delete;
    fl_cu_lock &operator=(const fl_cu_lock &) = delete;
};

/* Shape and strides (in elements) of a tensor, passed to kernels by value. */
struct fl_cu_layout {
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    int64_t stride[FL_MAX_DIMS];
};

static inline fl_cu_layout fl_cu_layout_of(const fl_tensor *t) {
    fl_cu_layout l;
    l.ndim = t->ndim;
    for (int d = 0; d < FL_MAX_DIMS; d++) {
        l.shape[d] = d < t->ndim ? t->shape[d] : 1;
        l.stride[d] = d < t->ndim ? t->stride[d] : 0;
    }
    return l;
}

/* Element offset of the i-th element in row-major order. */
__device__ __forceinline__ int64_t fl_cu_offset(const fl_cu_layout &l, int64_t i) {
    int64_t off = 0;
    for (int d = l.ndim - 1; d >= 0; d--) {
        int64_t n = l.shape[d];
        off += (i % n) * l.stride[d];
        i /= n;
    }
    return off;
}

/* The stream kernels are queued on: the legacy default stream, ordered with
 * the synchronous host transfers of the backend, until the backend has
 * streams of its own. */
static inline cudaStream_t fl_cu_stream(void) { return 0; }

/* Make t's device current; FL_OK or an error naming the op. */
static inline int fl_cu_use_device(const char *op, const fl_tensor *t) {
    cudaError_t e = cudaSetDevice(fl_device_index(t->device));
    return e == cudaSuccess
               ? FL_OK
               : fl_fail(FL_ERR_DEVICE, "%s on cuda:%d: %s", op, fl_device_index(t->device),
                         cudaGetErrorString(e));
}

/* Blocks for a grid-stride loop over n items: enough to fill the GPU,
 * never more than the items need. */
static inline unsigned fl_cu_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 8) b = 65535LL * 8;
    return (unsigned)b;
}

/* [Note: kernel launches counted]
 * Every kernel launch of this backend is followed by exactly one
 * fl_cu_check, and nothing else calls it: so it counts the launches
 * (fl_cuda_launch_count; fsdp.h: fl_kernel_launches), in one place
 * instead of at some hundred launch sites. A launch without its check, or
 * a check without a launch, makes the count differ from the simulator's
 * in the cudasim build (tests/lua/cuda_launches_spec.lua). */

/* After a launch: the launch's error (bad configuration, a sticky fault of
 * an earlier kernel) as the core's error naming the op. */
static inline int fl_cu_check(const char *op) {
    __atomic_fetch_add(&fl_cuda_launch_count, 1, __ATOMIC_RELAXED);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FL_OK : fl_fail(FL_ERR_DEVICE, "%s on cuda: %s", op, cudaGetErrorString(e));
}

#endif /* FL_CUDA_COMMON_CUH */
