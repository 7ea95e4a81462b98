/*
 * reduce.c: reductions over dims: sum and mean over a list of dims, var and
 * std (composed from them), max and min along one dim with their indices;
 * with their backward.
 *
 * FLOPs: one per input element (sum, mean, max, min); var and std count
 * through the ops they are built from.
 */
#include "elementwise.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"
#include "op_common.h"

#include <string.h>

static bool no_storage(const fl_tensor *t) { return !t->storage; }

/* Which dims of x a dims list reduces (ndims == 0: all). A 0-d tensor
 * accepts dim 0 and -1, as in PyTorch. */
static int reduce_mask(const char *op, const fl_tensor *x, int ndims, const int *dims, bool *mask) {
    memset(mask, 0, FL_MAX_DIMS * sizeof *mask);
    if (ndims < 0 || (ndims > 0 && !dims))
        return fl_fail(FL_ERR_ARG, "%s: invalid dims list (%d entries)", op, ndims);
    if (ndims == 0) {
        for (int d = 0; d < x->ndim; d++) mask[d] = true;
        return FL_OK;
    }
    for (int k = 0; k < ndims; k++) {
        if (x->ndim == 0 && (dims[k] == 0 || dims[k] == -1)) continue;
        int d = fl_wrap_dim(op, x, dims[k], 0);
        if (d < 0) return fl_last_status();
        if (mask[d]) {
            char s[128];
            return fl_fail(FL_ERR_ARG,
                           "%s: dim %d appears twice in the dims list (tensor of shape %s)", op,
                           d, fl_shape_str(x, s, sizeof s));
        }
        mask[d] = true;
    }
    return FL_OK;
}

/* The shape of the result: reduced dims dropped, or size 1 with keepdim. */
static int reduced_shape(const fl_tensor *x, const bool *mask, bool keepdim, int64_t *shape) {
    int n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!mask[d]) shape[n++] = x->shape[d];
        else if (keepdim) shape[n++] = 1;
    }
    return n;
}

/* ---- sum and mean ------------------------------------------------------------ */

static const fl_node_type sum_type, mean_type;

static fl_tensor *sum_impl(const char *op, bool mean, const fl_tensor *x, int ndims,
                           const int *dims, bool keepdim) {
    if (fl_check_tensor(op, x, false)) return NULL;
    bool mask[FL_MAX_DIMS];
    if (reduce_mask(op, x, ndims, dims, mask)) return NULL;
    if (mean && !fl_dtype_is_float(x->dtype))
        return FL_FAIL_NULL(FL_ERR_ARG, "mean: expects a float tensor, got %s (convert it first)",
                            fl_dtype_name(x->dtype));
    int64_t shape[FL_MAX_DIMS], count = 1;
    int nd = reduced_shape(x, mask, keepdim, shape);
    for (int d = 0; d < x->ndim; d++)
        if (mask[d]) count *= x->shape[d];
    fl_dtype dtype = fl_dtype_is_float(x->dtype) ? x->dtype : FL_I64;
    fl_tensor *out = fl_op_output(nd, shape, dtype, x->device, no_storage(x));
    if (!out) return NULL;
    fl_flops_add(x->numel);
    fl_count_bytes(op, 2, (const fl_tensor *[]){x, out});
    if (!no_storage(x)) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of(op, x->device);
        /* The kernel walks dense memory (strided inputs are rare here and a
         * copy is cheap next to the passes a strided walk would cost). */
        fl_tensor *dense = k ? fl_contiguous(x) : NULL;
        int rc = dense ? k->sum(out, dense, mask, mean ? (double)count : 1.0)
                       : (int)fl_last_status();
        fl_tensor_release(dense);
        if (rc != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    if (fl_needs_grad(1, &x)) {
        fl_tensor *like = fl_shape_carrier(x->ndim, x->shape, x->dtype);
        const fl_tensor *saved[1] = {like};
        fl_node *node = NULL;
        int rc = like ? fl_record(mean ? &mean_type : &sum_type, 1, &x, out, 1, saved, &node)
                      : (int)fl_last_status();
        fl_tensor_release(like);
        if (rc != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
        int64_t bits = 0;
        for (int d = 0; d < x->ndim; d++)
            if (mask[d]) bits |= (int64_t)1 << d;
        node->i[0] = bits;
        node->i[1] = keepdim;
        node->f[0] = (double)count;
    }
    return out;
}

fl_tensor *fl_sum(const fl_tensor *x, int ndims, const int *dims, bool keepdim) {
    return sum_impl("sum", false, x, ndims, dims, keepdim);
}

fl_tensor *fl_mean(const fl_tensor *x, int ndims, const int *dims, bool keepdim) {
    return sum_impl("mean", true, x, ndims, dims, keepdim);
}

/* g (the reduced shape) -> a view with size-1 dims where x was reduced,
 * so it broadcasts over x (new reference). */
static fl_tensor *unsqueeze_reduced(fl_tensor *g, int64_t bits, bool keepdim, int ndim) {
    fl_tensor *r = fl_tensor_retain(g);
    if (keepdim) return r;
    for (int d = 0; d < ndim && r; d++) {
        if (!(bits >> d & 1)) continue;
        fl_tensor *u = fl_unsqueeze(r, d);
        fl_tensor_release(r);
        r = u;
    }
    return r;
}

/* d sum / dx = 1 (mean: 1/count) at every reduced position: the gradient
 * broadcast back as a stride-0 view, never materialised here. */
static int sum_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *like = node->saved[0];
    bool mean = node->type == &mean_type;
    fl_tensor *g = unsqueeze_reduced(go[0], node->i[0], node->i[1] != 0, like->ndim);
    if (g && mean) {
        fl_tensor *scaled = fl_binary_scalar(FL_DIV, g, node->f[0], false);
        fl_tensor_release(g);
        g = scaled;
    }
    if (g && g->dtype != like->dtype) {
        fl_tensor *cast = fl_to(g, like->dtype, g->device);
        fl_tensor_release(g);
        g = cast;
    }
    fl_tensor *e = g ? fl_expand(g, like->ndim, like->shape) : NULL;
    fl_tensor_release(g);
    gi[0] = e;
    return e ? FL_OK : (int)fl_last_status();
}

static const fl_node_type sum_type = {.name = "SumBackward", .backward = sum_backward};
static const fl_node_type mean_type = {.name = "MeanBackward", .backward = sum_backward};

/* ---- var and std ----------------------------------------------------------------- */

/* Two passes, composed from differentiable ops (so their backward comes
 * with them): the mean first, then the sum of squared deviations, which is
 * accurate where the one-pass E[x^2] - E[x]^2 cancels catastrophically. */
fl_tensor *fl_var(const fl_tensor *x, int ndims, const int *dims, int64_t correction,
                  bool keepdim) {
    if (fl_check_tensor("var", x, false)) return NULL;
    bool mask[FL_MAX_DIMS];
    if (reduce_mask("var", x, ndims, dims, mask)) return NULL;
    if (!fl_dtype_is_float(x->dtype))
        return FL_FAIL_NULL(FL_ERR_ARG, "var: expects a float tensor, got %s",
                            fl_dtype_name(x->dtype));
    if (correction < 0)
        return FL_FAIL_NULL(FL_ERR_ARG, "var: correction must be >= 0, got %lld",
                            (long long)correction);
    int64_t count = 1;
    for (int d = 0; d < x->ndim; d++)
        if (mask[d]) count *= x->shape[d];
    fl_tensor *m = fl_mean(x, ndims, dims, true);
    fl_tensor *dev = m ? fl_binary(FL_SUB, x, m) : NULL;
    fl_tensor *sq = dev ? fl_unary(FL_SQUARE, dev) : NULL;
    fl_tensor *s = sq ? fl_sum(sq, ndims, dims, keepdim) : NULL;
    double denom = count > correction ? (double)(count - correction) : 0.0;
    fl_tensor *v = s ? fl_binary_scalar(FL_DIV, s, denom, false) : NULL;
    fl_tensor_release(m);
    fl_tensor_release(dev);
    fl_tensor_release(sq);
    fl_tensor_release(s);
    return v;
}

fl_tensor *fl_std(const fl_tensor *x, int ndims, const int *dims, int64_t correction,
                  bool keepdim) {
    fl_tensor *v = fl_var(x, ndims, dims, correction, keepdim);
    fl_tensor *r = v ? fl_unary(FL_SQRT, v) : NULL;
    fl_tensor_release(v);
    return r;
}

/* ---- max and min along a dim ----------------------------------------------------- */

static const fl_node_type max_type, min_type;

static int minmax_impl(bool is_max, const fl_tensor *x, int dim, bool keepdim, fl_tensor **values,
                       fl_tensor **indices) {
    const char *op = is_max ? "max" : "min";
    if (!values || !indices) return fl_fail(FL_ERR_ARG, "%s: output pointers are NULL", op);
    *values = *indices = NULL;
    if (fl_check_tensor(op, x, false)) return fl_last_status();
    /* A 0-d tensor is its own max along dim 0 (PyTorch accepts 0 and -1). */
    int d = x->ndim == 0 && (dim == 0 || dim == -1) ? 0 : fl_wrap_dim(op, x, dim, 0);
    if (d < 0) return fl_last_status();
    if (x->ndim > 0 && x->shape[d] == 0) {
        char s[128];
        return fl_fail(FL_ERR_ARG, "%s: dim %d of shape %s is empty: no %s to take", op, dim,
                       fl_shape_str(x, s, sizeof s), op);
    }
    if (x->dtype == FL_BOOL)
        return fl_fail(FL_ERR_ARG, "%s: bool tensors are not supported", op);
    bool mask[FL_MAX_DIMS] = {false};
    if (x->ndim > 0) mask[d] = true;
    int64_t shape[FL_MAX_DIMS];
    int nd = reduced_shape(x, mask, keepdim, shape);
    fl_tensor *v = fl_op_output(nd, shape, x->dtype, x->device, no_storage(x));
    fl_tensor *ix = v ? fl_op_output(nd, shape, FL_I64, x->device, no_storage(x)) : NULL;
    if (!ix) goto fail;
    fl_flops_add(x->numel);
    fl_count_bytes(op, 3, (const fl_tensor *[]){x, v, ix});
    if (!no_storage(x)) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of(op, x->device);
        fl_tensor *dense = k ? fl_contiguous(x) : NULL;
        int rc = dense ? k->minmax(is_max, v, ix, dense, x->ndim ? d : 0) : (int)fl_last_status();
        fl_tensor_release(dense);
        if (rc != FL_OK) goto fail;
    }
    if (fl_needs_grad(1, &x)) {
        fl_tensor *like = fl_shape_carrier(x->ndim, x->shape, x->dtype);
        const fl_tensor *saved[2] = {like, ix};
        fl_node *node = NULL;
        const fl_node_type *type = is_max ? &max_type : &min_type;
        int rc = like ? fl_record(type, 1, &x, v, 2, saved, &node) : (int)fl_last_status();
        fl_tensor_release(like);
        if (rc != FL_OK) goto fail;
        node->i[0] = x->ndim ? d : 0;
        node->i[1] = keepdim;
    }
    *values = v;
    *indices = ix;
    return FL_OK;
fail:
    fl_tensor_release(v);
    fl_tensor_release(ix);
    return fl_last_status();
}

int fl_max_dim(const fl_tensor *x, int dim, bool keepdim, fl_tensor **values, fl_tensor **indices) {
    return minmax_impl(true, x, dim, keepdim, values, indices);
}

int fl_min_dim(const fl_tensor *x, int dim, bool keepdim, fl_tensor **values, fl_tensor **indices) {
    return minmax_impl(false, x, dim, keepdim, values, indices);
}

/* The gradient goes to the chosen element of each slice, zero elsewhere. */
static int minmax_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *like = node->saved[0], *ix = node->saved[1];
    int dim = (int)node->i[0];
    bool meta = no_storage(ix) || no_storage(go[0]);
    fl_tensor *gx = fl_op_output(like->ndim, like->shape, like->dtype, go[0]->device, meta);
    if (!gx || meta) {
        gi[0] = gx;
        return gx ? FL_OK : (int)fl_last_status();
    }
    const fl_elementwise_kernels *k = fl_elementwise_kernels_of("max", gx->device);
    fl_tensor *g = k ? fl_contiguous(go[0]) : NULL;
    fl_tensor *i = g ? fl_contiguous(ix) : NULL;
    int rc = i ? k->scatter_dim(gx, g, i, like->ndim ? dim : 0) : (int)fl_last_status();
    fl_tensor_release(g);
    fl_tensor_release(i);
    if (rc != FL_OK) {
        fl_tensor_release(gx);
        return rc;
    }
    gi[0] = gx;
    return FL_OK;
}

static const fl_node_type max_type = {.name = "MaxBackward", .backward = minmax_backward};
static const fl_node_type min_type = {.name = "MinBackward", .backward = minmax_backward};
