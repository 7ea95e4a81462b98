/*
 * binary.h: the kernel table of the elementwise binary family (add, sub,
 * mul, div, and a += alpha * b). One table per device kind.
 */
#ifndef FL_OPS_BINARY_H
#define FL_OPS_BINARY_H

#include "internal.h"

/* Internal op code beyond the public ones: out = a + alpha * b. */
enum { FL_AXPY = FL_BINARY_OP_COUNT };

typedef struct fl_binary_kernels {
    /* out = a op b elementwise; a and b are views with out's shape (stride
     * 0 where they broadcast); any dtypes; alpha is used by FL_AXPY. */
    int (*binary)(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b, double alpha);
} fl_binary_kernels;

extern const fl_binary_kernels fl_cpu_binary_kernels;

/* The table for a tensor's device, or NULL with an error naming the op. */
const fl_binary_kernels *fl_binary_kernels_of(const char *op, fl_device device);

#endif /* FL_OPS_BINARY_H */
