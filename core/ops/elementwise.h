/*
 * elementwise.h: the dispatch of the elementwise family: unary math and
 * activations (and their fused backward), silu(a) * b, dropout,
 * reductions (sum/mean, max/min with indices), comparisons, where, and the
 * top-k routing of a mixture of experts (core/ops/moe.c) to a device's
 * kernel table (fl_elementwise_kernels, core/backend/backend.h); the op
 * files (unary.c, reduce.c, compare.c) do the validation, shapes, FLOPs
 * and autograd, and reach kernels only through fl_elementwise_kernels_of.
 */
#ifndef FL_OPS_ELEMENTWISE_H
#define FL_OPS_ELEMENTWISE_H

#include "backend.h"

/* The table for a device, or NULL with an error naming the op. */
const fl_elementwise_kernels *fl_elementwise_kernels_of(const char *op, fl_device device);

#endif /* FL_OPS_ELEMENTWISE_H */
