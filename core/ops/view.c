/*
 * view.c: the differentiable views, functions that return a new tensor
 * header over the same storage (fl_tensor_view_of, core/tensor) with a
 * backward node when grad is needed (so they live in ops, above autograd):
 * view/reshape, narrow, slice, select, transpose, permute, expand, squeeze,
 * unsqueeze, flatten. All of them work on meta and fake tensors, since they
 * only compute geometry.
 */
#include "internal.h"

#include <string.h>

/* ---- autograd of views --------------------------------------------------- */

/* What a view's backward needs: the input's shape (as a storage-less meta
 * tensor) and up to 8 integers describing the view. */
enum { VIEW_RESHAPE, VIEW_PERMUTE, VIEW_EXPAND, VIEW_NARROW, VIEW_SLICE, VIEW_SELECT };

static const fl_node_type view_types[];

/* Record out = view(in) when grad is needed; releases out on failure. */
static fl_tensor *recorded(fl_tensor *out, const fl_tensor *in, int kind, int n, const int64_t *params) {
    if (!out || !fl_needs_grad(1, &in)) return out;
    fl_tensor *shape = fl_shape_carrier(in->ndim, in->shape, in->dtype);
    fl_node *node = NULL;
    const fl_tensor *saved[1] = {shape};
    int rc = shape ? fl_record(&view_types[kind], 1, &in, out, 1, saved, &node) : (int)fl_last_status();
    fl_tensor_release(shape);
    if (rc != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    for (int k = 0; k < n; k++) node->i[k] = params[k];
    return out;
}

static int reshape_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    fl_tensor *in = node->saved[0];
    gi[0] = fl_reshape(go[0], in->ndim, in->shape);
    return gi[0] ? FL_OK : (int)fl_last_status();
}

static int permute_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    int inverse[FL_MAX_DIMS];
    for (int k = 0; k < go[0]->ndim; k++) inverse[node->i[k]] = k;
    gi[0] = fl_permute(go[0], go[0]->ndim, inverse);
    return gi[0] ? FL_OK : (int)fl_last_status();
}

static int expand_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    fl_tensor *in = node->saved[0];
    gi[0] = fl_sum_to(go[0], in->ndim, in->shape);
    return gi[0] ? FL_OK : (int)fl_last_status();
}

/* narrow, slice, select: the gradient lands in the viewed part of zeros. */
static int part_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    fl_tensor *in = node->saved[0];
    fl_tensor *z = fl_zeros(in->ndim, in->shape, go[0]->dtype, go[0]->device);
    if (!z) return fl_last_status();
    int kind = (int)(node->type - view_types);
    int dim = (int)node->i[0];
    fl_tensor *part = kind == VIEW_NARROW ? fl_narrow(z, dim, node->i[1], node->i[2])
                      : kind == VIEW_SLICE ? fl_slice(z, dim, node->i[1], node->i[2], node->i[3])
                                           : fl_select(z, dim, node->i[1]);
    int rc = part ? fl_copy_(part, go[0]) : (int)fl_last_status();
    fl_tensor_release(part);
    if (rc != FL_OK) {
        fl_tensor_release(z);
        return rc;
    }
    gi[0] = z;
    return FL_OK;
}

/* The same into a gradient already waiting for the input (the other parts
 * of a tensor split by narrowing, as attention's fused qkv: each part's
 * backward would otherwise make a zero-filled whole to be summed; [Note:
 * gradients added where they land], engine.c). */
static int part_backward_into(fl_node *node, fl_tensor *const *go, int input, fl_tensor *into,
                              bool *done) {
    (void)input;
    if (into->dtype != go[0]->dtype || into->device != go[0]->device ||
        !go[0]->storage != !into->storage)
        return FL_OK;
    int kind = (int)(node->type - view_types);
    int dim = (int)node->i[0];
    fl_tensor *part = kind == VIEW_NARROW ? fl_narrow(into, dim, node->i[1], node->i[2])
                      : kind == VIEW_SLICE ? fl_slice(into, dim, node->i[1], node->i[2], node->i[3])
                                           : fl_select(into, dim, node->i[1]);
    int rc = part ? fl_add_scaled_(part, go[0], 1.0) : (int)fl_last_status();
    fl_tensor_release(part);
    *done = rc == FL_OK;
    return rc;
}

static const fl_node_type view_types[] = {
    [VIEW_RESHAPE] = {.name = "ViewBackward", .backward = reshape_backward},
    [VIEW_PERMUTE] = {.name = "PermuteBackward", .backward = permute_backward},
    [VIEW_EXPAND] = {.name = "ExpandBackward", .backward = expand_backward},
    [VIEW_NARROW] = {.name = "NarrowBackward", .backward = part_backward,
                     .backward_into = part_backward_into},
    [VIEW_SLICE] = {.name = "SliceBackward", .backward = part_backward,
                    .backward_into = part_backward_into},
    [VIEW_SELECT] = {.name = "SelectBackward", .backward = part_backward,
                     .backward_into = part_backward_into},
};

/* Resolve a requested shape with at most one -1 against numel. */
static int infer_shape(const char *op, const fl_tensor *t, int ndim, const int64_t *req,
                       int64_t *shape) {
    if (ndim < 0 || ndim > FL_MAX_DIMS)
        return fl_fail(FL_ERR_ARG, "%s: %d dimensions requested, at most %d supported", op, ndim,
                       FL_MAX_DIMS);
    int infer = -1;
    int64_t known = 1;
    for (int d = 0; d < ndim; d++) {
        shape[d] = req[d];
        if (req[d] == -1) {
            if (infer >= 0) return fl_fail(FL_ERR_ARG, "%s: only one dimension can be -1", op);
            infer = d;
        } else if (req[d] < 0) {
            return fl_fail(FL_ERR_ARG, "%s: invalid size %lld in dim %d", op, (long long)req[d], d);
        } else if (__builtin_mul_overflow(known, req[d], &known)) {
            char b[128];
            fl_shape_format(ndim, req, b, sizeof b);
            return fl_fail(FL_ERR_ARG, "%s: shape %s is too large (its element count overflows "
                                       "64 bits)", op, b);
        }
    }
    bool ok;
    if (infer >= 0) {
        ok = known != 0 && t->numel % known == 0;
        if (ok) shape[infer] = t->numel / known;
    } else {
        ok = known == t->numel;
    }
    if (!ok) {
        char a[128], b[128];
        fl_shape_format(ndim, req, b, sizeof b);
        return fl_fail(FL_ERR_ARG, "%s: shape %s is invalid for a tensor of shape %s (%lld elements)",
                       op, b, fl_shape_str(t, a, sizeof a), (long long)t->numel);
    }
    return FL_OK;
}

/* Strides for viewing t with `shape`, or false if the memory layout cannot
 * express it. Walks t's dims from the innermost, grouping runs of dims that
 * are contiguous with each other ("chunks"); each chunk must map onto whole
 * dims of the new shape. Same rule as PyTorch's view. */
static bool view_strides(const fl_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    if (t->numel == 0 || t->ndim == 0) {
        fl_contiguous_strides(ndim, shape, stride);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base = t->stride[t->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        tensor_numel *= t->shape[d];
        bool chunk_ends = d == 0 || (t->shape[d - 1] != 1 &&
                                     t->stride[d - 1] != tensor_numel * chunk_base);
        if (!chunk_ends) continue;
        while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
            stride[view_d] = view_numel * chunk_base;
            view_numel *= shape[view_d];
            view_d--;
        }
        if (view_numel != tensor_numel) return false;
        if (d > 0) {
            chunk_base = t->stride[d - 1];
            tensor_numel = view_numel = 1;
        }
    }
    return view_d == -1;
}

fl_tensor *fl_view(const fl_tensor *t, int ndim, const int64_t *req) {
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    if (fl_check_tensor("view", t, false) || infer_shape("view", t, ndim, req, shape)) return NULL;
    if (!view_strides(t, ndim, shape, stride)) {
        char a[128], b[128];
        fl_shape_format(ndim, shape, b, sizeof b);
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "view: a tensor of shape %s with these strides cannot be viewed as %s "
                            "(use reshape, or contiguous first)",
                            fl_shape_str(t, a, sizeof a), b);
    }
    return recorded(fl_tensor_view_of(t, ndim, shape, stride, t->offset), t, VIEW_RESHAPE, 0, NULL);
}

fl_tensor *fl_reshape(const fl_tensor *t, int ndim, const int64_t *req) {
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    if (fl_check_tensor("reshape", t, false) || infer_shape("reshape", t, ndim, req, shape))
        return NULL;
    if (view_strides(t, ndim, shape, stride))
        return recorded(fl_tensor_view_of(t, ndim, shape, stride, t->offset), t, VIEW_RESHAPE, 0,
                        NULL);
    fl_tensor *dense = fl_clone(t); /* clone and view record their own nodes */
    if (!dense) return NULL;
    fl_tensor *v = fl_view(dense, ndim, shape);
    fl_tensor_release(dense);
    return v;
}

fl_tensor *fl_narrow(const fl_tensor *t, int dim, int64_t start, int64_t length) {
    if (fl_check_tensor("narrow", t, false)) return NULL;
    int d = fl_wrap_dim("narrow", t, dim, 0);
    if (d < 0) return NULL;
    if (start < 0 || length < 0 || start > t->shape[d] - length) {
        char s[128];
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "narrow: start %lld, length %lld out of range for dim %d of size %lld "
                            "(shape %s)",
                            (long long)start, (long long)length, d, (long long)t->shape[d],
                            fl_shape_str(t, s, sizeof s));
    }
    int64_t shape[FL_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[d] = length;
    int64_t params[3] = {d, start, length};
    return recorded(fl_tensor_view_of(t, t->ndim, shape, t->stride, t->offset + start * t->stride[d]),
                    t, VIEW_NARROW, 3, params);
}

fl_tensor *fl_slice(const fl_tensor *t, int dim, int64_t start, int64_t stop, int64_t step) {
    if (fl_check_tensor("slice", t, false)) return NULL;
    int d = fl_wrap_dim("slice", t, dim, 0);
    if (d < 0) return NULL;
    if (step <= 0)
        return FL_FAIL_NULL(FL_ERR_ARG, "slice: step must be positive, got %lld", (long long)step);
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (stop < 0) stop += n;
    start = start < 0 ? 0 : (start > n ? n : start);
    stop = stop < start ? start : (stop > n ? n : stop);
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(stride, t->stride, sizeof stride);
    shape[d] = (stop - start + step - 1) / step;
    stride[d] = t->stride[d] * step;
    int64_t params[4] = {d, start, stop, step};
    return recorded(fl_tensor_view_of(t, t->ndim, shape, stride, t->offset + start * t->stride[d]),
                    t, VIEW_SLICE, 4, params);
}

/* t's shape and strides without dimension d (select, squeeze); returns
 * the number of dimensions left. */
static int without_dim(const fl_tensor *t, int d, int64_t *shape, int64_t *stride) {
    int n = 0;
    for (int k = 0; k < t->ndim; k++) {
        if (k == d) continue;
        shape[n] = t->shape[k];
        stride[n++] = t->stride[k];
    }
    return n;
}

fl_tensor *fl_select(const fl_tensor *t, int dim, int64_t index) {
    if (fl_check_tensor("select", t, false)) return NULL;
    int d = fl_wrap_dim("select", t, dim, 0);
    if (d < 0) return NULL;
    int64_t i = index < 0 ? index + t->shape[d] : index;
    if (i < 0 || i >= t->shape[d]) {
        char s[128];
        return FL_FAIL_NULL(FL_ERR_ARG, "select: index %lld out of range for dim %d of shape %s",
                            (long long)index, d, fl_shape_str(t, s, sizeof s));
    }
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    int n = without_dim(t, d, shape, stride);
    int64_t params[2] = {d, i};
    return recorded(fl_tensor_view_of(t, n, shape, stride, t->offset + i * t->stride[d]), t,
                    VIEW_SELECT, 2, params);
}

fl_tensor *fl_permute(const fl_tensor *t, int ndim, const int *dims) {
    if (fl_check_tensor("permute", t, false)) return NULL;
    if (ndim != t->ndim) {
        char s[128];
        return FL_FAIL_NULL(FL_ERR_ARG, "permute: %d dims given for a %d-d tensor of shape %s",
                            ndim, t->ndim, fl_shape_str(t, s, sizeof s));
    }
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS], perm[FL_MAX_DIMS];
    bool used[FL_MAX_DIMS] = {false};
    for (int k = 0; k < ndim; k++) {
        int d = fl_wrap_dim("permute", t, dims[k], 0);
        if (d < 0) return NULL;
        if (used[d])
            return FL_FAIL_NULL(FL_ERR_ARG, "permute: dim %d appears more than once", d);
        used[d] = true;
        perm[k] = d;
        shape[k] = t->shape[d];
        stride[k] = t->stride[d];
    }
    return recorded(fl_tensor_view_of(t, ndim, shape, stride, t->offset), t, VIEW_PERMUTE, ndim,
                    perm);
}

fl_tensor *fl_transpose(const fl_tensor *t, int dim0, int dim1) {
    if (fl_check_tensor("transpose", t, false)) return NULL;
    int a = fl_wrap_dim("transpose", t, dim0, 0), b = a < 0 ? -1 : fl_wrap_dim("transpose", t, dim1, 0);
    if (a < 0 || b < 0) return NULL;
    int perm[FL_MAX_DIMS];
    for (int k = 0; k < t->ndim; k++) perm[k] = k;
    perm[a] = b;
    perm[b] = a;
    return fl_permute(t, t->ndim, perm);
}

fl_tensor *fl_expand(const fl_tensor *t, int ndim, const int64_t *req) {
    if (fl_check_tensor("expand", t, false)) return NULL;
    char a[128], b[128];
    if (ndim < t->ndim || ndim > FL_MAX_DIMS) {
        fl_shape_format(ndim, req, b, sizeof b);
        return FL_FAIL_NULL(FL_ERR_ARG, "expand: cannot expand shape %s to %s",
                            fl_shape_str(t, a, sizeof a), b);
    }
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    int shift = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int sd = d - shift;
        int64_t want = req[d];
        if (sd < 0) {
            if (want < 0) goto bad;
            shape[d] = want;
            stride[d] = 0;
        } else if (want == -1 || want == t->shape[sd]) {
            shape[d] = t->shape[sd];
            stride[d] = t->stride[sd];
        } else if (t->shape[sd] == 1 && want >= 0) {
            shape[d] = want;
            stride[d] = 0;
        } else {
            goto bad;
        }
    }
    return recorded(fl_tensor_view_of(t, ndim, shape, stride, t->offset), t, VIEW_EXPAND, 0, NULL);
bad:
    fl_shape_format(ndim, req, b, sizeof b);
    return FL_FAIL_NULL(FL_ERR_ARG,
                        "expand: cannot expand shape %s to %s (only size-1 dims expand)",
                        fl_shape_str(t, a, sizeof a), b);
}

fl_tensor *fl_unsqueeze(const fl_tensor *t, int dim) {
    if (fl_check_tensor("unsqueeze", t, false)) return NULL;
    if (t->ndim == FL_MAX_DIMS)
        return FL_FAIL_NULL(FL_ERR_ARG, "unsqueeze: tensor already has %d dims", FL_MAX_DIMS);
    int d = fl_wrap_dim("unsqueeze", t, dim, 1);
    if (d < 0) return NULL;
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    for (int k = 0, j = 0; k <= t->ndim; k++) {
        if (k == d) {
            shape[k] = 1;
            stride[k] = j < t->ndim ? t->shape[j] * t->stride[j] : 1;
        } else {
            shape[k] = t->shape[j];
            stride[k] = t->stride[j++];
        }
    }
    return recorded(fl_tensor_view_of(t, t->ndim + 1, shape, stride, t->offset), t, VIEW_RESHAPE,
                    0, NULL);
}

fl_tensor *fl_squeeze(const fl_tensor *t, int dim) {
    if (fl_check_tensor("squeeze", t, false)) return NULL;
    int d = fl_wrap_dim("squeeze", t, dim, 0);
    if (d < 0) return NULL;
    if (t->shape[d] != 1) {
        char s[128];
        return FL_FAIL_NULL(FL_ERR_ARG, "squeeze: dim %d of shape %s has size %lld, not 1", d,
                            fl_shape_str(t, s, sizeof s), (long long)t->shape[d]);
    }
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    int n = without_dim(t, d, shape, stride);
    return recorded(fl_tensor_view_of(t, n, shape, stride, t->offset), t, VIEW_RESHAPE, 0, NULL);
}

fl_tensor *fl_flatten(const fl_tensor *t, int start_dim, int end_dim) {
    if (fl_check_tensor("flatten", t, false)) return NULL;
    if (t->ndim == 0) {
        int64_t one = 1;
        return fl_reshape(t, 1, &one);
    }
    int a = fl_wrap_dim("flatten", t, start_dim, 0);
    int b = a < 0 ? -1 : fl_wrap_dim("flatten", t, end_dim, 0);
    if (a < 0 || b < 0) return NULL;
    if (a > b)
        return FL_FAIL_NULL(FL_ERR_ARG, "flatten: start_dim %d is after end_dim %d", a, b);
    int64_t shape[FL_MAX_DIMS];
    int n = 0;
    for (int k = 0; k < a; k++) shape[n++] = t->shape[k];
    int64_t merged = 1;
    for (int k = a; k <= b; k++) merged *= t->shape[k];
    shape[n++] = merged;
    for (int k = b + 1; k < t->ndim; k++) shape[n++] = t->shape[k];
    return fl_reshape(t, n, shape);
}
