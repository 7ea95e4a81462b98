/*
 * shape.c: shape arithmetic shared by every tensor function and op: dim
 * wrapping, shape validation, contiguity, strides, and shape strings for
 * error messages.
 */
#include "error.h"
#include "shape.h"

#include <string.h>

int fl_shape_format(int ndim, const int64_t *shape, char *buf, size_t size) {
    if (size == 0) return FL_OK;
    size_t used = 0;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld",
                                 (long long)shape[d]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return FL_OK;
}

const char *fl_shape_str(const fl_tensor *t, char *buf, size_t size) {
    fl_shape_format(t->ndim, t->shape, buf, size);
    return buf;
}

int fl_wrap_dim(const char *op, const fl_tensor *t, int dim, int ndim_extra) {
    int n = t->ndim + ndim_extra;
    int wrapped = dim < 0 ? dim + n : dim;
    if (wrapped < 0 || wrapped >= n || n == 0) {
        char s[128];
        fl_fail(FL_ERR_ARG, "%s: dim %d out of range for a %d-d tensor of shape %s", op, dim,
                t->ndim, fl_shape_str(t, s, sizeof s));
        return -1;
    }
    return wrapped;
}

/* [Note: shape arithmetic cannot overflow]
 * Every tensor header goes through fl_check_shape, which bounds the product
 * of max(size, 1) over the dims (the largest contiguous stride times the
 * outer size) so that it times the largest element size (8 bytes), with a
 * factor 2 of headroom, fits an int64. Numel, contiguous strides and byte
 * sizes derived from a valid shape therefore never overflow, in any dtype,
 * also when a zero-size dim makes numel 0 ([0, 2^62, 2^62] is refused as
 * PyTorch refuses it: its strides overflow). Code that multiplies sizes of
 * a checked shape needs no checks of its own; code that multiplies anything
 * else (user-given counts, file offsets, FLOP counts) uses
 * __builtin_mul_overflow. */
/* 8 bytes, the largest element, times 2 of headroom: a byte size stays
 * below 2^62, so allocators may round it up without overflowing. */
enum { MAX_ELEMENT_BYTES = 16 };

int fl_check_shape(const char *op, int ndim, const int64_t *shape, int64_t *numel) {
    if (ndim < 0 || ndim > FL_MAX_DIMS)
        return fl_fail(FL_ERR_ARG, "%s: %d dimensions requested, at most %d supported", op, ndim,
                       FL_MAX_DIMS);
    if (ndim > 0 && !shape) return fl_fail(FL_ERR_ARG, "%s: shape is NULL", op);
    int64_t n = 1, span = MAX_ELEMENT_BYTES;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            char s[128];
            fl_shape_format(ndim, shape, s, sizeof s);
            return fl_fail(FL_ERR_ARG, "%s: negative size %lld in dim %d of shape %s", op,
                           (long long)shape[d], d, s);
        }
        if (__builtin_mul_overflow(span, shape[d] > 0 ? shape[d] : 1, &span)) {
            char s[128];
            fl_shape_format(ndim, shape, s, sizeof s);
            return fl_fail(FL_ERR_ARG, "%s: shape %s is too large: its strides or byte size "
                                       "overflow 64 bits", op, s);
        }
        n *= shape[d]; /* <= span: cannot overflow */
    }
    if (numel) *numel = n;
    return FL_OK;
}

void fl_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    /* Callers may pass a shape not checked yet (view computes strides before
     * the header refuses the shape): saturate rather than overflow there. */
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        if (d > 0 && __builtin_mul_overflow(s, shape[d] > 0 ? shape[d] : 1, &s)) s = INT64_MAX;
    }
}

bool fl_tensor_is_contiguous(const fl_tensor *t) {
    if (t->numel == 0) return true;
    int64_t expected = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] == 1) continue; /* any stride is fine for size 1 */
        if (t->stride[d] != expected) return false;
        expected *= t->shape[d];
    }
    return true;
}
