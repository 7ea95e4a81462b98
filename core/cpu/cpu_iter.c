/*
 * cpu_iter.c: the strided multi-tensor iterator described in cpu_iter.h.
 */
#include "cpu_iter.h"

#include <string.h>

/* Elements per chunk: large enough to amortise the call and the index
 * arithmetic, small enough to balance threads and stay in L1/L2. */
enum { CHUNK = 4096 };
/* Below this many elements threads cost more than they save. */
enum { PARALLEL_MIN = 1 << 16 };

void fl_cpu_iter_init(fl_cpu_iter *it, int ntensors, const fl_tensor *const *ts) {
    FL_ASSERT(ntensors >= 1 && ntensors <= FL_CPU_ITER_MAX);
    memset(it, 0, sizeof *it);
    it->ntensors = ntensors;
    it->numel = ts[0]->numel;
    for (int k = 0; k < ntensors; k++) {
        FL_ASSERT(ts[k]->ndim == ts[0]->ndim);
        it->base[k] = ts[k]->data;
        it->elsize[k] = fl_dtype_size(ts[k]->dtype);
    }
    /* Copy dims, dropping size-1 dims (their strides never matter). */
    int n = 0;
    for (int d = 0; d < ts[0]->ndim; d++) {
        if (ts[0]->shape[d] == 1) continue;
        it->shape[n] = ts[0]->shape[d];
        for (int k = 0; k < ntensors; k++) it->stride[k][n] = ts[k]->stride[d];
        n++;
    }
    if (n == 0) { /* a scalar or all-ones shape: one element */
        it->shape[0] = 1;
        for (int k = 0; k < ntensors; k++) it->stride[k][0] = 1;
        n = 1;
    }
    /* Merge dim d into d+1 when every tensor steps over d exactly as if
     * the two were one dim. */
    int m = 0;
    for (int d = 1; d < n; d++) {
        bool mergeable = true;
        for (int k = 0; k < ntensors; k++)
            mergeable &= it->stride[k][m] == it->stride[k][d] * it->shape[d];
        if (mergeable) {
            it->shape[m] *= it->shape[d];
            for (int k = 0; k < ntensors; k++) it->stride[k][m] = it->stride[k][d];
        } else {
            m++;
            it->shape[m] = it->shape[d];
            for (int k = 0; k < ntensors; k++) it->stride[k][m] = it->stride[k][d];
        }
    }
    it->ndim = m + 1;
}

/* Pointers to the first element of row `row` (row-major over all but the
 * last dim) plus `col` elements along the last dim. */
static void locate(const fl_cpu_iter *it, int64_t row, int64_t col, char **ptrs) {
    int64_t off[FL_CPU_ITER_MAX];
    for (int k = 0; k < it->ntensors; k++) off[k] = col * it->stride[k][it->ndim - 1];
    for (int d = it->ndim - 2; d >= 0 && row > 0; d--) {
        int64_t i = row % it->shape[d];
        row /= it->shape[d];
        for (int k = 0; k < it->ntensors; k++) off[k] += i * it->stride[k][d];
    }
    for (int k = 0; k < it->ntensors; k++)
        ptrs[k] = it->base[k] + off[k] * (int64_t)it->elsize[k];
}

void fl_cpu_iter_run(const fl_cpu_iter *it, fl_cpu_chunk_fn fn, void *ctx) {
    if (it->numel == 0) return;
    int64_t inner = it->shape[it->ndim - 1];
    int64_t chunks_per_row = (inner + CHUNK - 1) / CHUNK;
    int64_t rows = it->numel / inner;
    int64_t items = rows * chunks_per_row;
    int64_t istride[FL_CPU_ITER_MAX];
    for (int k = 0; k < it->ntensors; k++) istride[k] = it->stride[k][it->ndim - 1];
#pragma omp parallel for schedule(static) if (it->numel >= PARALLEL_MIN)
    for (int64_t item = 0; item < items; item++) {
        int64_t row = item / chunks_per_row;
        int64_t col = (item % chunks_per_row) * CHUNK;
        int64_t count = inner - col < CHUNK ? inner - col : CHUNK;
        char *ptrs[FL_CPU_ITER_MAX];
        locate(it, row, col, ptrs);
        fn(ctx, ptrs, istride, count, row * inner + col);
    }
}

void fl_cpu_gather(void *dst, const char *src, int64_t stride, int64_t n, size_t size) {
    switch (size) {
    case 1: for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = ((const uint8_t *)src)[i * stride]; break;
    case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = ((const uint16_t *)src)[i * stride]; break;
    case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i * stride]; break;
    case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i] = ((const uint64_t *)src)[i * stride]; break;
    default: FL_ASSERT(!"element size");
    }
}

void fl_cpu_scatter(char *dst, int64_t stride, const void *src, int64_t n, size_t size) {
    switch (size) {
    case 1: for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i * stride] = ((const uint8_t *)src)[i]; break;
    case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * stride] = ((const uint16_t *)src)[i]; break;
    case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i * stride] = ((const uint32_t *)src)[i]; break;
    case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i * stride] = ((const uint64_t *)src)[i]; break;
    default: FL_ASSERT(!"element size");
    }
}

void fl_cpu_load(void *dst, fl_dtype as, const char *src, fl_dtype src_dtype, int64_t stride,
                 int64_t n) {
    FL_ASSERT(n <= FL_CPU_SCRATCH);
    size_t size = fl_dtype_size(src_dtype);
    if (stride == 1) {
        fl_convert(dst, as, src, src_dtype, n);
    } else if (as == src_dtype) {
        fl_cpu_gather(dst, src, stride, n, size);
    } else {
        _Alignas(8) char tmp[FL_CPU_SCRATCH * 8];
        fl_cpu_gather(tmp, src, stride, n, size);
        fl_convert(dst, as, tmp, src_dtype, n);
    }
}

void fl_cpu_store(char *dst, fl_dtype dst_dtype, int64_t stride, const void *src, fl_dtype as,
                  int64_t n) {
    FL_ASSERT(n <= FL_CPU_SCRATCH);
    size_t size = fl_dtype_size(dst_dtype);
    if (stride == 1) {
        fl_convert(dst, dst_dtype, src, as, n);
    } else if (as == dst_dtype) {
        fl_cpu_scatter(dst, stride, src, n, size);
    } else {
        _Alignas(8) char tmp[FL_CPU_SCRATCH * 8];
        fl_convert(tmp, dst_dtype, src, as, n);
        fl_cpu_scatter(dst, stride, tmp, n, size);
    }
}
