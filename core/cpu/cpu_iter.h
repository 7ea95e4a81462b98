/*
 * cpu_iter.h: walking several same-shaped strided tensors together on the
 * CPU. Dims are coalesced where every tensor is contiguous across them, so
 * a dense tensor becomes one long row; the rows are then cut into chunks
 * that OpenMP spreads over threads. Kernels only write the inner loop over
 * one chunk: `count` elements from `ptrs[k]`, `stride[k]` elements apart.
 */
#ifndef FL_CPU_ITER_H
#define FL_CPU_ITER_H

#include "error.h"

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

/* Elements per step of the load/convert/compute/store loops of kernels:
 * small enough for scratch buffers on the stack (SCRATCH * 8 bytes). */
enum { FL_CPU_SCRATCH = 512 };

/* Read n elements of src_dtype, `stride` elements apart, into the dense
 * buffer dst as dtype `as` (n <= FL_CPU_SCRATCH). */
void fl_cpu_load(void *dst, fl_dtype as, const char *src, fl_dtype src_dtype, int64_t stride,
                 int64_t n);
/* Write n dense elements of dtype `as` from src to dst (dst_dtype, `stride`
 * elements apart), converting (n <= FL_CPU_SCRATCH). */
void fl_cpu_store(char *dst, fl_dtype dst_dtype, int64_t stride, const void *src, fl_dtype as,
                  int64_t n);
/* Move n elements of `size` bytes between strided and dense memory. */
void fl_cpu_gather(void *dst, const char *src, int64_t stride, int64_t n, size_t size);
void fl_cpu_scatter(char *dst, int64_t stride, const void *src, int64_t n, size_t size);
/* dst [rows, cols] (row stride ldd) = the transposed matrix at src: element
 * (r, c) from src[c * lds + r]; elements of es bytes (cpu_transpose.c). */
void fl_cpu_transpose(void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                      int64_t cols, size_t es);

#endif /* FL_CPU_ITER_H */
