/*
 * linear.h: the dispatch of the "linear" family (matmul, linear,
 * embedding, conv2d, max_pool2d; cat needs no kernel of its own, it copies
 * through the backend) to a device's kernel table (fl_linear_kernels,
 * core/backend/backend.h), and the helpers its op files share.
 */
#ifndef FL_OPS_LINEAR_H
#define FL_OPS_LINEAR_H

#include "backend.h"

/* The table for a device, or NULL with an error naming the op. */
const fl_linear_kernels *fl_linear_kernels_of(const char *op, fl_device device);

/* ---- shared by the op files of the family -------------------------------- */

/* A tensor for an op's result: no storage (fake, or meta on meta) when
 * `no_storage`, else fresh memory on device. */
fl_tensor *fl_linear_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                            bool no_storage);

/* The batched product behind matmul, linear and their backward:
 * out = a @ b (+ bias), for a [..., m, k] and b [..., k, n] (ndim >= 2,
 * batch dims broadcast; out has the broadcast batch dims). Validates (the
 * messages name `op`), counts FLOPs, runs the kernel unless an operand has
 * no storage. Not recorded for autograd. If `into` is not NULL it is the
 * contiguous output of the right shape to write; else a new tensor is
 * returned. */
fl_tensor *fl_linear_bmm(const char *op, const fl_tensor *a, const fl_tensor *b,
                         const fl_tensor *bias, fl_tensor *into);

/* A view (stack header sharing t's storage, not reference counted) of t
 * with dims d0 and d1 swapped: how transposed operands reach the kernels. */
void fl_linear_swap_view(const fl_tensor *t, int d0, int d1, fl_tensor *view);

/* Check that tensors share a device and a float dtype; messages name op and
 * `what[i]`. NULL entries are skipped. */
int fl_linear_check_same(const char *op, int n, const fl_tensor *const *ts,
                         const char *const *what);

#endif /* FL_OPS_LINEAR_H */
