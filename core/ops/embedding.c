/*
 * embedding.c: rows of a weight table picked by integer ids, and the
 * backward that adds the output gradient's rows into the table's gradient:
 * a new one of zeros, or, when the table already has a gradient waiting (a
 * tied weight), that one in place (backward_into).
 *
 * FLOPs: the forward is a gather and counts none; the backward counts one
 * addition per gradient element it adds (numel(ids) * D).
 */
#include "linear.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"

#include <string.h>

static const fl_node_type embedding_type;

fl_tensor *fl_embedding(const fl_tensor *ids, const fl_tensor *w, int64_t padding_idx) {
    const char *op = "embedding";
    if (fl_check_tensor(op, ids, false) || fl_check_tensor(op, w, false)) return NULL;
    char s[128];
    if (ids->dtype != FL_I64 && ids->dtype != FL_I32)
        return FL_FAIL_NULL(FL_ERR_ARG, "embedding: ids must be i64 or i32, got %s",
                            fl_dtype_name(ids->dtype));
    if (!fl_dtype_is_float(w->dtype))
        return FL_FAIL_NULL(FL_ERR_ARG, "embedding: weight must be a floating point tensor, got %s",
                            fl_dtype_name(w->dtype));
    if (w->ndim != 2)
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "embedding: weight must be 2-d [num_embeddings, dim], got shape %s",
                            fl_shape_str(w, s, sizeof s));
    if (ids->device != w->device) {
        char a[32], b[32];
        fl_device_format(ids->device, a, sizeof a);
        fl_device_format(w->device, b, sizeof b);
        return FL_FAIL_NULL(FL_ERR_ARG, "embedding: ids are on %s but the weight is on %s", a, b);
    }
    int64_t V = w->shape[0], D = w->shape[1];
    if (padding_idx < -1 || padding_idx >= V)
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "embedding: padding_idx %lld out of range for a weight of shape %s",
                            (long long)padding_idx, fl_shape_str(w, s, sizeof s));
    if (ids->ndim >= FL_MAX_DIMS)
        return FL_FAIL_NULL(FL_ERR_ARG, "embedding: ids of shape %s leave no room for the output's "
                                        "extra dim (at most %d dims)",
                            fl_shape_str(ids, s, sizeof s), FL_MAX_DIMS);
    int64_t shape[FL_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof shape);
    shape[ids->ndim] = D;
    bool no_storage = !ids->storage || !w->storage;
    fl_tensor *out = fl_linear_output(ids->ndim + 1, shape, w->dtype, w->device, no_storage);
    if (!out) return NULL;
    fl_count_bytes(op, 3, (const fl_tensor *[]){ids, out, out}); /* rows read, then written */
    bool was = fl_set_grad_enabled(false);
    fl_tensor *idc = fl_contiguous(ids);
    int rc = idc ? FL_OK : (int)fl_last_status();
    if (rc == FL_OK && !no_storage) {
        const fl_linear_kernels *k = fl_linear_kernels_of(op, w->device);
        fl_tensor o2 = *out;
        o2.ndim = 2;
        o2.shape[0] = ids->numel;
        o2.shape[1] = D;
        fl_contiguous_strides(2, o2.shape, o2.stride);
        rc = k ? k->embedding(&o2, idc, w) : (int)fl_last_status();
    }
    fl_set_grad_enabled(was);
    const fl_tensor *ins[2] = {ids, w};
    if (rc == FL_OK && fl_needs_grad(2, ins)) {
        /* The weight's shape only (a meta tensor), never its values. */
        fl_tensor *wshape = fl_shape_carrier(2, w->shape, w->dtype);
        const fl_tensor *saved[2] = {idc, wshape};
        fl_node *node = NULL;
        rc = wshape ? fl_record(&embedding_type, 2, ins, out, 2, saved, &node) : (int)fl_last_status();
        if (node) node->i[0] = padding_idx;
        fl_tensor_release(wshape);
    }
    fl_tensor_release(idc);
    if (rc != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

/* Add the output gradient's rows into the table gradient gw at the rows
 * of the saved ids (the device's embedding_backward kernel). */
static int add_rows(const char *op, fl_node *node, fl_tensor *go, fl_tensor *gw) {
    const fl_tensor *ids = node->saved[0];
    int64_t D = gw->shape[1];
    fl_tensor *g = fl_contiguous(go);
    const fl_linear_kernels *k = g ? fl_linear_kernels_of(op, gw->device) : NULL;
    int rc;
    if (k) {
        fl_tensor g2 = *g;
        g2.ndim = 2;
        g2.shape[0] = ids->numel;
        g2.shape[1] = D;
        fl_contiguous_strides(2, g2.shape, g2.stride);
        rc = k->embedding_backward(gw, ids, &g2, node->i[0]);
    } else {
        rc = fl_last_status();
    }
    fl_tensor_release(g);
    return rc;
}

static int embedding_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const char *op = "embedding backward";
    const fl_tensor *ids = node->saved[0], *wshape = node->saved[1];
    if (!fl_node_wants(node, 1)) return FL_OK;
    int64_t D = wshape->shape[1];
    bool no_storage = !go[0]->storage || !ids->storage;
    fl_device dev = go[0]->device;
    fl_tensor *gw = no_storage ? fl_fake(2, wshape->shape, wshape->dtype, dev)
                               : fl_zeros(2, wshape->shape, wshape->dtype, dev);
    if (!gw) return fl_last_status();
    fl_flops_add(ids->numel * D);
    /* the table zeroed, then each row of the gradient added into its row */
    fl_count_bytes(op, 4, (const fl_tensor *[]){gw, ids, go[0], go[0]});
    int rc = FL_OK;
    if (!no_storage) rc = add_rows(op, node, go[0], gw);
    if (rc != FL_OK) {
        fl_tensor_release(gw);
        return rc;
    }
    gi[1] = gw;
    return FL_OK;
}

/* The rows added straight into the table's gradient already waiting (a
 * tied weight: the head's product delivered it first), instead of into a
 * [V, D] table of zeros summed with it ([Note: gradients added where they
 * land], engine.c). */
static int embedding_backward_into(fl_node *node, fl_tensor *const *go, int input,
                                   fl_tensor *into, bool *done) {
    const char *op = "embedding backward";
    const fl_tensor *ids = node->saved[0], *wshape = node->saved[1];
    FL_ASSERT(input == 1);
    if (into->dtype != wshape->dtype || into->device != go[0]->device) return FL_OK;
    bool no_storage = !go[0]->storage || !ids->storage;
    if (no_storage != !into->storage) return FL_OK;
    int64_t D = wshape->shape[1];
    fl_flops_add(ids->numel * D);
    fl_count_bytes(op, 3, (const fl_tensor *[]){ids, go[0], go[0]}); /* rows read, added into */
    *done = true;
    if (no_storage) return FL_OK;
    return add_rows(op, node, go[0], into);
}

static const fl_node_type embedding_type = {.name = "EmbeddingBackward",
                                            .backward = embedding_backward,
                                            .backward_into = embedding_backward_into};
