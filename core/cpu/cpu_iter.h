/*
 * cpu_iter.h: walking several same-shaped strided tensors together on the
 * CPU. Dims are coalesced where every tensor is contiguous across them, so
 * a dense tensor becomes one long row; the rows are then cut into chunks
 * that OpenMP spreads over threads. Kernels only write the inner loop over
 * one chunk: `count` elements from `ptrs[k]`, `stride[k]` elements apart.
 */
#ifndef FL_CPU_ITER_H
#define FL_CPU_ITER_H

#include "internal.h"

enum { FL_CPU_ITER_MAX = 4 };

typedef struct fl_cpu_iter {
    int ntensors;
    int ndim;                                     /* after coalescing, >= 1 */
    int64_t shape[FL_MAX_DIMS];
    int64_t stride[FL_CPU_ITER_MAX][FL_MAX_DIMS]; /* in elements */
    char *base[FL_CPU_ITER_MAX];                  /* element [0,...,0] */
    size_t elsize[FL_CPU_ITER_MAX];
    int64_t numel;
} fl_cpu_iter;

/* One chunk of a row: ptrs[k] is tensor k's first element, inner[k] its
 * stride in elements; `index` is the row-major position of the first
 * element among all elements (what counter-based random numbers key on). */
typedef void (*fl_cpu_chunk_fn)(void *ctx, char *const *ptrs, const int64_t *inner,
                                int64_t count, int64_t index);

/* All tensors must have the shape of ts[0] (broadcast views included). */
void fl_cpu_iter_init(fl_cpu_iter *it, int ntensors, const fl_tensor *const *ts);
/* Call fn over every element exactly once, in parallel for large tensors. */
void fl_cpu_iter_run(const fl_cpu_iter *it, fl_cpu_chunk_fn fn, void *ctx);

#endif /* FL_CPU_ITER_H */
