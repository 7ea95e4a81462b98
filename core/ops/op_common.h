/*
 * op_common.h: what the op files share (op_common.c): outputs, broadcasting,
 * dtype promotion, device checks, the missing-kernel message.
 */
#ifndef FL_OP_COMMON_H
#define FL_OP_COMMON_H

#include "fsdp.h"

/* A new output: without storage (meta stays meta, fake stays fake) when
 * no_storage, else allocated on device. */
fl_tensor *fl_op_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                        bool no_storage);
/* Numpy broadcasting of n tensors' shapes; fails naming op and shapes. */
int fl_broadcast_shape(const char *op, int n, const fl_tensor *const *ts, int *ndim,
                       int64_t *shape);
/* A header-only view of t with shape (ndim, shape), stride 0 where t is
 * broadcast (for kernels; never retained or released). */
void fl_broadcast_view(const fl_tensor *t, int ndim, const int64_t *shape, fl_tensor *view);
/* The dtype two operands meet at: floats over integers, wider over
 * narrower, f16 with bf16 at f32, different integers at i64. */
fl_dtype fl_promote(fl_dtype a, fl_dtype b);
/* Fail unless all tensors share one device (naming op and the devices). */
int fl_same_device(const char *op, int n, const fl_tensor *const *ts);
/* Record "op: no kernel for device X in this build" and return NULL. */
const void *fl_no_kernel(const char *op, fl_device device);

#endif /* FL_OP_COMMON_H */
