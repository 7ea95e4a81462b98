/*
 * binary.c: elementwise add, sub, mul, div of two tensors (numpy
 * broadcasting) or of a tensor and a scalar, their in-place forms, and
 * their backward; plus fl_sum_to and fl_reduce_grad_to, which undo
 * broadcasting for gradients (through the reduce family's sum).
 *
 * This file is also the pattern every op follows: validate and infer the
 * output's shape and dtype (the same on every device), create the output
 * (no storage on meta or fake tensors), count FLOPs, run the device's
 * kernel, and record a backward node when an input requires grad.
 */
#include "binary.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"
#include "op_common.h"

#include <string.h>

static const char *op_names[] = {"add", "sub", "mul", "div"};

const fl_binary_kernels *fl_binary_kernels_of(const char *op, fl_device device) {
    const fl_backend *be = fl_backend_of(device);
    return be && be->binary ? be->binary : fl_no_kernel(op, device);
}

/* ---- shapes and dtypes (broadcasting and promotion: op_common.c) ---------- */

/* Division of integers is true division in f32, as in PyTorch. */
static fl_dtype result_dtype(fl_dtype a, fl_dtype b, int op) {
    fl_dtype r = fl_promote(a, b);
    return op == FL_DIV && !fl_dtype_is_float(r) ? FL_F32 : r;
}

static bool metadata_only(const fl_tensor *t) {
    return !t->storage;
}

static int broadcast_pair(const char *op, const fl_tensor *a, const fl_tensor *b, int *ndim,
                          int64_t *shape) {
    const fl_tensor *ts[2] = {a, b};
    return fl_broadcast_shape(op, 2, ts, ndim, shape);
}

/* ---- the op ---------------------------------------------------------------- */

static const fl_node_type binary_types[4];
static const fl_node_type scalar_types[4];

static fl_tensor *binary_impl(int op, const fl_tensor *a, const fl_tensor *b, fl_dtype out_dtype) {
    const char *name = op_names[op];
    if (fl_check_tensor(name, a, false) || fl_check_tensor(name, b, false)) return NULL;
    const fl_tensor *pair[2] = {a, b};
    if (fl_same_device(name, 2, pair)) return NULL;
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    if (broadcast_pair(name, a, b, &ndim, shape)) return NULL;
    bool no_storage = metadata_only(a) || metadata_only(b);
    fl_tensor *out = fl_op_output(ndim, shape, out_dtype, a->device, no_storage);
    if (!out) return NULL;
    fl_flops_add(out->numel);
    fl_count_bytes(name, 3, (const fl_tensor *[]){a, b, out});
    if (!no_storage) {
        const fl_binary_kernels *k = fl_binary_kernels_of(name, out->device);
        fl_tensor va, vb;
        fl_broadcast_view(a, ndim, shape, &va);
        fl_broadcast_view(b, ndim, shape, &vb);
        if (!k || k->binary(op, out, &va, &vb, 1.0) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

fl_tensor *fl_binary(fl_binary_op op, const fl_tensor *a, const fl_tensor *b) {
    if ((int)op < 0 || op >= FL_BINARY_OP_COUNT)
        return FL_FAIL_NULL(FL_ERR_ARG, "binary: invalid op %d", (int)op);
    if (fl_check_tensor(op_names[op], a, false) || fl_check_tensor(op_names[op], b, false))
        return NULL;
    fl_tensor *out = binary_impl(op, a, b, result_dtype(a->dtype, b->dtype, op));
    const fl_tensor *ins[2] = {a, b};
    if (out && fl_needs_grad(2, ins)) {
        /* mul and div need the operands; add and sub only their shapes,
         * kept as storage-less meta tensors. */
        fl_tensor *sa = fl_shape_carrier(a->ndim, a->shape, a->dtype);
        fl_tensor *sb = fl_shape_carrier(b->ndim, b->shape, b->dtype);
        bool operands = op == FL_MUL || op == FL_DIV;
        const fl_tensor *saved[2] = {operands ? a : sa, operands ? b : sb};
        int rc = sa && sb ? fl_record(&binary_types[op], 2, ins, out, 2, saved, NULL)
                          : (int)fl_last_status();
        fl_tensor_release(sa);
        fl_tensor_release(sb);
        if (rc != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

fl_tensor *fl_binary_scalar(fl_binary_op op, const fl_tensor *a, double s, bool reverse) {
    if ((int)op < 0 || op >= FL_BINARY_OP_COUNT)
        return FL_FAIL_NULL(FL_ERR_ARG, "binary: invalid op %d", (int)op);
    if (fl_check_tensor(op_names[op], a, false)) return NULL;
    /* An integer tensor meets a fractional scalar (or true division) in f32. */
    fl_dtype out_dtype = a->dtype;
    if (!fl_dtype_is_float(a->dtype) && (s != (double)(int64_t)s || op == FL_DIV))
        out_dtype = FL_F32;
    fl_dtype sd = out_dtype == FL_F64 ? FL_F64 : fl_dtype_is_float(out_dtype) ? FL_F32 : FL_I64;
    /* The scalar as a 0-d tensor on a's device (a storage-less one when a
     * has no storage: nothing is computed then). */
    fl_tensor *sdev;
    if (metadata_only(a)) {
        sdev = fl_fake(0, NULL, sd, a->device);
    } else if (fl_device_kind_of(a->device) == FL_DEVICE_CPU) {
        sdev = fl_full(0, NULL, s, sd, a->device);
    } else {
        fl_tensor *st = fl_full(0, NULL, s, sd, fl_device_make(FL_DEVICE_CPU, 0));
        sdev = st ? fl_to(st, sd, a->device) : NULL;
        fl_tensor_release(st);
    }
    if (!sdev) return NULL;
    fl_tensor *out = reverse ? binary_impl(op, sdev, a, out_dtype) : binary_impl(op, a, sdev, out_dtype);
    fl_tensor_release(sdev);
    if (out && fl_needs_grad(1, &a)) {
        fl_node *node;
        const fl_tensor *saved[1] = {a};
        bool keep_a = op == FL_DIV && reverse; /* d(s/a)/da = -s/a^2 */
        if (fl_record(&scalar_types[op], 1, &a, out, keep_a ? 1 : 0, saved, &node) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
        node->f[0] = s;
        node->i[0] = reverse;
        node->i[1] = a->dtype; /* the gradient goes back in a's dtype */
    }
    return out;
}

static int check_inplace(const char *op, const fl_tensor *a) {
    if (fl_grad_enabled() && fl_requires_grad(a))
        return fl_fail(FL_ERR_ARG, "%s: a tensor that requires grad cannot be modified in place "
                                   "while grad mode is on (use no_grad, or the out-of-place op)",
                       op);
    return FL_OK;
}

static int inplace(int op, const char *name, fl_tensor *a, const fl_tensor *b, double alpha) {
    if (fl_check_tensor(name, a, false) || fl_check_tensor(name, b, false) ||
        check_inplace(name, a))
        return fl_last_status();
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    if (broadcast_pair(name, a, b, &ndim, shape)) return fl_last_status();
    bool same = ndim == a->ndim;
    for (int d = 0; same && d < ndim; d++) same = shape[d] == a->shape[d];
    if (!same) {
        char x[128], y[128];
        return fl_fail(FL_ERR_ARG, "%s: in place, %s must broadcast to %s", name,
                       fl_shape_str(b, y, sizeof y), fl_shape_str(a, x, sizeof x));
    }
    if (a->device != b->device)
        return fl_fail(FL_ERR_ARG, "%s: tensors on different devices", name);
    fl_flops_add(a->numel);
    fl_count_bytes(name, 3, (const fl_tensor *[]){a, b, a}); /* a read and written */
    if (metadata_only(a)) return FL_OK;
    if (metadata_only(b)) return fl_check_tensor(name, b, true);
    const fl_binary_kernels *k = fl_binary_kernels_of(name, a->device);
    if (!k) return fl_last_status();
    fl_tensor vb;
    fl_broadcast_view(b, a->ndim, a->shape, &vb);
    return k->binary(op, a, a, &vb, alpha);
}

int fl_binary_(fl_binary_op op, fl_tensor *a, const fl_tensor *b) {
    if ((int)op < 0 || op >= FL_BINARY_OP_COUNT)
        return fl_fail(FL_ERR_ARG, "binary_: invalid op %d", (int)op);
    static const char *names[] = {"add_", "sub_", "mul_", "div_"};
    return inplace(op, names[op], a, b, 1.0);
}

int fl_add_scaled_(fl_tensor *a, const fl_tensor *b, double alpha) {
    return inplace(FL_AXPY, "add_scaled_", a, b, alpha);
}

/* ---- sum_to: undo broadcasting -------------------------------------------- */

/* A sum over the broadcast dims (the reduce family's kernel, accumulating
 * in f64) and a view to the target shape; sum and view carry the backward. */
fl_tensor *fl_sum_to(const fl_tensor *t, int ndim, const int64_t *shape) {
    if (fl_check_tensor("sum_to", t, false) || fl_check_shape("sum_to", ndim, shape, NULL))
        return NULL;
    int shift = t->ndim - ndim;
    bool ok = shift >= 0;
    for (int d = 0; ok && d < ndim; d++)
        ok = shape[d] == t->shape[d + shift] || shape[d] == 1;
    if (!ok) {
        char a[128], b[128];
        fl_shape_format(ndim, shape, b, sizeof b);
        return FL_FAIL_NULL(FL_ERR_ARG, "sum_to: shape %s cannot be summed to %s",
                            fl_shape_str(t, a, sizeof a), b);
    }
    int dims[FL_MAX_DIMS], n = 0;
    for (int d = 0; d < t->ndim; d++)
        if (d < shift || (shape[d - shift] == 1 && t->shape[d] != 1)) dims[n++] = d;
    fl_tensor *summed = n > 0 ? fl_sum(t, n, dims, true) : fl_tensor_retain((fl_tensor *)t);
    fl_tensor *out = summed ? fl_reshape(summed, ndim, shape) : NULL;
    fl_tensor_release(summed);
    /* fl_sum gives integers as i64; sum_to keeps the input's dtype. */
    if (out && out->dtype != t->dtype) {
        fl_tensor *cast = fl_to(out, t->dtype, out->device);
        fl_tensor_release(out);
        out = cast;
    }
    return out;
}

fl_tensor *fl_reduce_grad_to(const fl_tensor *grad, const fl_tensor *input) {
    bool same = grad->ndim == input->ndim;
    for (int d = 0; same && d < grad->ndim; d++) same = grad->shape[d] == input->shape[d];
    fl_tensor *r = same ? fl_tensor_retain((fl_tensor *)grad)
                        : fl_sum_to(grad, input->ndim, input->shape);
    if (r && r->dtype != input->dtype) {
        fl_tensor *cast = fl_to(r, input->dtype, r->device);
        fl_tensor_release(r);
        r = cast;
    }
    return r;
}

/* ---- backward ------------------------------------------------------------- */

/* grads_in[i] = reduce(g) to saved[i]'s shape, if wanted. */
static int give(fl_node *node, int i, fl_tensor *g, fl_tensor **grads_in) {
    if (!g) return fl_last_status();
    if (fl_node_wants(node, i)) {
        grads_in[i] = fl_reduce_grad_to(g, node->saved[i]);
        if (!grads_in[i]) {
            fl_tensor_release(g);
            return fl_last_status();
        }
    }
    fl_tensor_release(g);
    return FL_OK;
}

static int add_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    int rc = give(node, 0, fl_tensor_retain(go[0]), gi);
    return rc ? rc : give(node, 1, fl_tensor_retain(go[0]), gi);
}

static int sub_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    int rc = give(node, 0, fl_tensor_retain(go[0]), gi);
    if (rc || !fl_node_wants(node, 1)) return rc;
    return give(node, 1, fl_binary_scalar(FL_MUL, go[0], -1.0, false), gi);
}

static int mul_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    fl_tensor *a = node->saved[0], *b = node->saved[1];
    int rc = fl_node_wants(node, 0) ? give(node, 0, fl_binary(FL_MUL, go[0], b), gi) : FL_OK;
    if (rc || !fl_node_wants(node, 1)) return rc;
    return give(node, 1, fl_binary(FL_MUL, go[0], a), gi);
}

static int div_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    fl_tensor *a = node->saved[0], *b = node->saved[1];
    int rc = fl_node_wants(node, 0) ? give(node, 0, fl_binary(FL_DIV, go[0], b), gi) : FL_OK;
    if (rc || !fl_node_wants(node, 1)) return rc;
    /* d(a/b)/db = -a / b^2 */
    fl_tensor *ga = fl_binary(FL_MUL, go[0], a);
    fl_tensor *bb = ga ? fl_binary(FL_MUL, b, b) : NULL;
    fl_tensor *q = bb ? fl_binary(FL_DIV, ga, bb) : NULL;
    fl_tensor *neg = q ? fl_binary_scalar(FL_MUL, q, -1.0, false) : NULL;
    fl_tensor_release(ga);
    fl_tensor_release(bb);
    fl_tensor_release(q);
    return give(node, 1, neg, gi);
}

static const fl_node_type binary_types[4] = {
    {.name = "AddBackward", .backward = add_backward},
    {.name = "SubBackward", .backward = sub_backward},
    {.name = "MulBackward", .backward = mul_backward},
    {.name = "DivBackward", .backward = div_backward},
};

/* The gradient of a scalar op, cast to the input's dtype. */
static int scalar_give(fl_tensor *g, fl_tensor **gi, fl_dtype dtype) {
    if (!g) return fl_last_status();
    if (g->dtype != dtype) {
        fl_tensor *c = fl_to(g, dtype, g->device);
        fl_tensor_release(g);
        g = c;
        if (!g) return fl_last_status();
    }
    gi[0] = g;
    return FL_OK;
}

static int scalar_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    int op = (int)(node->type - scalar_types);
    double s = node->f[0];
    bool reverse = node->i[0] != 0;
    fl_dtype dtype = (fl_dtype)node->i[1];
    switch (op) {
    case FL_ADD: return scalar_give(fl_tensor_retain(go[0]), gi, dtype);
    case FL_SUB: return scalar_give(reverse ? fl_binary_scalar(FL_MUL, go[0], -1, false)
                                                  : fl_tensor_retain(go[0]), gi, dtype);
    case FL_MUL: return scalar_give(fl_binary_scalar(FL_MUL, go[0], s, false), gi, dtype);
    case FL_DIV:
        if (!reverse) return scalar_give(fl_binary_scalar(FL_DIV, go[0], s, false), gi, dtype);
        {
            fl_tensor *a = node->saved[0];
            fl_tensor *aa = fl_binary(FL_MUL, a, a);
            fl_tensor *q = aa ? fl_binary(FL_DIV, go[0], aa) : NULL;
            fl_tensor *r = q ? fl_binary_scalar(FL_MUL, q, -s, false) : NULL;
            fl_tensor_release(aa);
            fl_tensor_release(q);
            return scalar_give(r, gi, dtype);
        }
    }
    return fl_fail(FL_ERR_STATE, "scalar backward: bad op %d", op);
}

static const fl_node_type scalar_types[4] = {
    {.name = "AddScalarBackward", .backward = scalar_backward},
    {.name = "SubScalarBackward", .backward = scalar_backward},
    {.name = "MulScalarBackward", .backward = scalar_backward},
    {.name = "DivScalarBackward", .backward = scalar_backward},
};
