/*
 * compare.c: elementwise comparisons giving bool tensors (eq, ne, lt, le,
 * gt, ge against a tensor or a scalar) and where(cond, a, b), all with
 * numpy broadcasting: the masks of attention and of losses.
 *
 * Comparisons are not differentiable (their result is bool); where is, in
 * a and b. FLOPs: one per output element.
 */
#include "elementwise.h"
#include "storage.h"
#include "flops.h"
#include "node.h"
#include "op_common.h"

#include <math.h>

static const char *compare_names[FL_COMPARE_OP_COUNT] = {"eq", "ne", "lt", "le", "gt", "ge"};

static bool no_storage(const fl_tensor *t) { return !t->storage; }

fl_tensor *fl_compare(fl_compare_op op, const fl_tensor *a, const fl_tensor *b) {
    if ((int)op < 0 || op >= FL_COMPARE_OP_COUNT)
        return FL_FAIL_NULL(FL_ERR_ARG, "compare: invalid op %d", (int)op);
    const char *name = compare_names[op];
    if (fl_check_tensor(name, a, false) || fl_check_tensor(name, b, false)) return NULL;
    const fl_tensor *ins[2] = {a, b};
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    if (fl_same_device(name, 2, ins) || fl_broadcast_shape(name, 2, ins, &ndim, shape))
        return NULL;
    bool meta = no_storage(a) || no_storage(b);
    fl_tensor *out = fl_op_output(ndim, shape, FL_BOOL, a->device, meta);
    if (!out) return NULL;
    fl_flops_add(out->numel);
    fl_count_bytes(name, 3, (const fl_tensor *[]){a, b, out});
    if (!meta) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of(name, a->device);
        fl_tensor va, vb;
        fl_broadcast_view(a, ndim, shape, &va);
        fl_broadcast_view(b, ndim, shape, &vb);
        if (!k || k->compare(op, out, &va, &vb) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

/* A 0-d tensor holding s on dev: i64 when s is an integer and a is one
 * (exact for every int64 value), else f64 (exact for every float). */
static fl_tensor *scalar_like(const fl_tensor *a, double s) {
    bool integral = !fl_dtype_is_float(a->dtype) && s == floor(s) && fabs(s) < 0x1p63;
    fl_dtype dtype = integral ? FL_I64 : FL_F64;
    fl_device cpu = fl_device_make(FL_DEVICE_CPU, 0);
    fl_device_kind kind = fl_device_kind_of(a->device);
    if (kind == FL_DEVICE_META) return fl_empty(0, NULL, dtype, a->device);
    fl_tensor *st = fl_full(0, NULL, s, dtype, cpu);
    if (!st || kind == FL_DEVICE_CPU) return st;
    fl_tensor *moved = fl_to(st, dtype, a->device);
    fl_tensor_release(st);
    return moved;
}

fl_tensor *fl_compare_scalar(fl_compare_op op, const fl_tensor *a, double s) {
    if ((int)op < 0 || op >= FL_COMPARE_OP_COUNT)
        return FL_FAIL_NULL(FL_ERR_ARG, "compare: invalid op %d", (int)op);
    if (fl_check_tensor(compare_names[op], a, false)) return NULL;
    fl_tensor *st = scalar_like(a, s);
    if (!st) return NULL;
    fl_tensor *out = fl_compare(op, a, st);
    fl_tensor_release(st);
    return out;
}

/* ---- where ------------------------------------------------------------------------- */

static const fl_node_type where_type;

fl_tensor *fl_where(const fl_tensor *cond, const fl_tensor *a, const fl_tensor *b) {
    if (fl_check_tensor("where", cond, false) || fl_check_tensor("where", a, false) ||
        fl_check_tensor("where", b, false))
        return NULL;
    if (cond->dtype != FL_BOOL)
        return FL_FAIL_NULL(FL_ERR_ARG, "where: the condition must be a bool tensor, got %s",
                            fl_dtype_name(cond->dtype));
    const fl_tensor *ins[3] = {cond, a, b};
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    if (fl_same_device("where", 3, ins) || fl_broadcast_shape("where", 3, ins, &ndim, shape))
        return NULL;
    bool meta = no_storage(cond) || no_storage(a) || no_storage(b);
    fl_tensor *out = fl_op_output(ndim, shape, fl_promote(a->dtype, b->dtype), a->device,
                                      meta);
    if (!out) return NULL;
    fl_flops_add(out->numel);
    fl_count_bytes("where", 4, (const fl_tensor *[]){cond, a, b, out});
    if (!meta) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of("where", a->device);
        fl_tensor vc, va, vb;
        fl_broadcast_view(cond, ndim, shape, &vc);
        fl_broadcast_view(a, ndim, shape, &va);
        fl_broadcast_view(b, ndim, shape, &vb);
        if (!k || k->where(out, &vc, &va, &vb) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    const fl_tensor *data[2] = {a, b};
    if (fl_needs_grad(2, data)) {
        /* Saved: the condition, and a's and b's shapes and dtypes (meta
         * tensors) to reduce and cast their gradients to. */
        fl_tensor *la = fl_shape_carrier(a->ndim, a->shape, a->dtype);
        fl_tensor *lb = fl_shape_carrier(b->ndim, b->shape, b->dtype);
        const fl_tensor *saved[3] = {cond, la, lb};
        /* The node's inputs are (cond, a, b); cond never requires grad. */
        int rc = la && lb ? fl_record(&where_type, 3, ins, out, 3, saved, NULL)
                          : (int)fl_last_status();
        fl_tensor_release(la);
        fl_tensor_release(lb);
        if (rc != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

static int where_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *cond = node->saved[0];
    const fl_tensor *g = go[0];
    fl_tensor *zero = fl_device_kind_of(g->device) == FL_DEVICE_META
                          ? fl_empty(0, NULL, g->dtype, g->device)
                          : fl_zeros(0, NULL, g->dtype, g->device);
    if (!zero) return fl_last_status();
    int rc = FL_OK;
    for (int i = 1; i <= 2 && rc == FL_OK; i++) {
        if (!fl_node_wants(node, i)) continue;
        fl_tensor *w = i == 1 ? fl_where(cond, g, zero) : fl_where(cond, zero, g);
        gi[i] = w ? fl_reduce_grad_to(w, node->saved[i]) : NULL;
        fl_tensor_release(w);
        if (!gi[i]) rc = fl_last_status();
    }
    fl_tensor_release(zero);
    if (rc != FL_OK) {
        fl_tensor_release(gi[1]);
        fl_tensor_release(gi[2]);
        gi[1] = gi[2] = NULL;
    }
    return rc;
}

static const fl_node_type where_type = {.name = "WhereBackward", .backward = where_backward};
