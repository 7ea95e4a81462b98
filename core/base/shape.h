/*
 * shape.h: checking and printing shapes and dims (core/tensor/shape.c),
 * for every layer's messages and new tensors.
 */
#ifndef FL_SHAPE_H
#define FL_SHAPE_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Normalise a possibly negative dim against ndim (ndim_extra lets unsqueeze
 * accept dim == ndim). Returns the dim or -1 after recording an error that
 * names `op` and the tensor's shape. */
int fl_wrap_dim(const char *op, const fl_tensor *t, int dim, int ndim_extra);
/* Validate ndim and sizes for a new tensor; computes numel. */
int fl_check_shape(const char *op, int ndim, const int64_t *shape,
                   int64_t *numel);
/* "[3, 4]" of a tensor into a caller buffer (for messages). */
FL_PLUGIN_API const char *fl_shape_str(const fl_tensor *t, char *buf, size_t size);
/* Row-major contiguous strides for shape. */
void fl_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);

#ifdef __cplusplus
}
#endif

#endif /* FL_SHAPE_H */
