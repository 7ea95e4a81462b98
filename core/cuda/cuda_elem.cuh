/*
 * cuda_elem.cuh: what the elementwise kernel files (cuda_copy.cu,
 * cuda_binary.cu, cuda_unary.cu, cuda_reduce.cu, cuda_compare.cu) share:
 *

 * - (Element conversions are cuda_dtype.cuh's, through cuda_common.cuh.)
 * - rng.c's Philox-4x32-10 block (numeric.h's function), for random fills and
 *   dropout.
 * - A multi-tensor strided walk (fl_cu_iter), the device twin of
 *   core/cpu/cpu_iter.c: size-1 dims dropped, dims merged where every
 *   tensor is contiguous across them, so a dense tensor is one long row
 *   and each element's offsets cost one multiply.
 */
#ifndef FL_CUDA_ELEM_CUH
#define FL_CUDA_ELEM_CUH

#include "cuda_common.cuh"

#include <stdint.h>

/* ---- the strided walk ----------------------------------------------------------- */

enum { FL_CU_ITER_MAX = 4, FL_CU_THREADS = 256 };

struct fl_cu_iter {
    int ntensors;
    int ndim; /* after coalescing, >= 1 */
    bool dense; /* every tensor contiguous in row-major order: offset = index */
    int64_t numel;
    int64_t shape[FL_MAX_DIMS];
    int64_t stride[FL_CU_ITER_MAX][FL_MAX_DIMS];
};

/* All tensors of ts[0]'s shape (broadcast views included), as cpu_iter.c. */
static inline void fl_cu_iter_init(fl_cu_iter *it, int n, const fl_tensor *const *ts) {
    memset(it, 0, sizeof *it);
    it->ntensors = n;
    it->numel = ts[0]->numel;
    int nd = 0;
    for (int d = 0; d < ts[0]->ndim; d++) {
        if (ts[0]->shape[d] == 1) continue;
        it->shape[nd] = ts[0]->shape[d];
        for (int k = 0; k < n; k++) it->stride[k][nd] = ts[k]->stride[d];
        nd++;
    }
    if (nd == 0) {
        it->shape[0] = 1;
        for (int k = 0; k < n; k++) it->stride[k][0] = 1;
        nd = 1;
    }
    int m = 0;
    for (int d = 1; d < nd; d++) {
        bool mergeable = true;
        for (int k = 0; k < n; k++)
            mergeable &= it->stride[k][m] == it->stride[k][d] * it->shape[d];
        if (mergeable) {
            it->shape[m] *= it->shape[d];
        } else {
            m++;
            it->shape[m] = it->shape[d];
        }
        for (int k = 0; k < n; k++) it->stride[k][m] = it->stride[k][d];
    }
    it->ndim = m + 1;
    it->dense = it->ndim == 1;
    for (int k = 0; k < n; k++) it->dense &= it->stride[k][0] == 1;
}

/* Offsets (in elements) of row-major element i in each tensor. */
__device__ __forceinline__ void fl_cu_iter_offsets(const fl_cu_iter &it, int64_t i, int64_t *off) {
    if (it.dense) {
        for (int k = 0; k < FL_CU_ITER_MAX; k++) off[k] = i;
        return;
    }
    for (int k = 0; k < FL_CU_ITER_MAX; k++) off[k] = 0;
    for (int d = it.ndim - 1; d >= 0; d--) {
        int64_t n = it.shape[d], j = d == 0 ? i : i % n;
        for (int k = 0; k < FL_CU_ITER_MAX; k++)
            if (k < it.ntensors) off[k] += j * it.stride[k][d];
        i /= n;
    }
}

/* ---- counter-based random numbers ----------------------------------------------- */

/* Block `block` of the stream (seed, stream): rng.c's mapping onto
 * numeric.h's Philox-4x32-10, the code rng.c runs. */
__device__ __forceinline__ void fl_cu_philox(uint64_t block, uint64_t stream, uint64_t seed,
                                             uint32_t w[4]) {
    fl_philox4x32_10((uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32),
                     (uint32_t)seed, (uint32_t)(seed >> 32), w);
}

#endif /* FL_CUDA_ELEM_CUH */
