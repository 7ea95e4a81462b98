/*
 * binary.h: the dispatch of the elementwise binary family (add, sub, mul,
 * div, and a += alpha * b) to the kernel table of a device (its contract:
 * fl_binary_kernels in core/backend/backend.h).
 */
#ifndef FL_OPS_BINARY_H
#define FL_OPS_BINARY_H

#include "backend.h"

/* The table for a tensor's device, or NULL with an error naming the op. */
const fl_binary_kernels *fl_binary_kernels_of(const char *op, fl_device device);

#endif /* FL_OPS_BINARY_H */
