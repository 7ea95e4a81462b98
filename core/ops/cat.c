/*
 * cat.c: tensors joined along one dim into a new tensor, and its backward,
 * which hands each input the slice of the gradient where it landed (a
 * view: narrow, no copy). The copies go through the device backend's
 * strided copy, so cat needs no kernel of its own. No FLOPs (data
 * movement only).
 */
#include "linear.h"
#include "shape.h"
#include "node.h"
#include "storage.h"

#include <stdlib.h>
#include <string.h>

static const fl_node_type cat_type;

fl_tensor *fl_cat(int n, const fl_tensor *const *ts, int dim) {
    const char *op = "cat";
    if (n < 1 || !ts) return FL_FAIL_NULL(FL_ERR_ARG, "cat: expected at least one tensor, got %d", n);
    for (int i = 0; i < n; i++)
        if (!ts[i]) return FL_FAIL_NULL(FL_ERR_ARG, "cat: tensor %d is NULL (freed?)", i);
    const fl_tensor *first = ts[0];
    char s[128], t[128];
    if (first->ndim == 0)
        return FL_FAIL_NULL(FL_ERR_ARG, "cat: tensor 0 is 0-d and cannot be concatenated");
    int d = fl_wrap_dim(op, first, dim, 0);
    if (d < 0) return NULL;
    int64_t total = 0;
    bool no_storage = false;
    for (int i = 0; i < n; i++) {
        const fl_tensor *x = ts[i];
        if (x->dtype != first->dtype)
            return FL_FAIL_NULL(FL_ERR_ARG, "cat: tensor %d is %s but tensor 0 is %s", i,
                                fl_dtype_name(x->dtype), fl_dtype_name(first->dtype));
        if (x->device != first->device) {
            char a[32], b[32];
            fl_device_format(x->device, a, sizeof a);
            fl_device_format(first->device, b, sizeof b);
            return FL_FAIL_NULL(FL_ERR_ARG, "cat: tensor %d is on %s but tensor 0 is on %s", i, a, b);
        }
        bool same = x->ndim == first->ndim;
        for (int k = 0; same && k < x->ndim; k++) same = k == d || x->shape[k] == first->shape[k];
        if (!same)
            return FL_FAIL_NULL(FL_ERR_ARG,
                                "cat: tensor %d has shape %s but tensor 0 has shape %s (sizes must "
                                "match except in dim %d)",
                                i, fl_shape_str(x, s, sizeof s), fl_shape_str(first, t, sizeof t), d);
        total += x->shape[d];
        no_storage |= !x->storage;
    }
    int64_t shape[FL_MAX_DIMS];
    memcpy(shape, first->shape, sizeof shape);
    shape[d] = total;
    fl_tensor *out = fl_linear_output(first->ndim, shape, first->dtype, first->device, no_storage);
    if (!out) return NULL;
    int rc = FL_OK;
    if (!no_storage) {
        const fl_backend *be = fl_backend_of(out->device);
        int64_t at = 0;
        for (int i = 0; i < n && rc == FL_OK; i++) {
            /* The slot of input i: a stack view of out, narrowed along d. */
            fl_tensor slot = *out;
            slot.shape[d] = ts[i]->shape[d];
            slot.numel = ts[i]->numel;
            slot.offset = out->offset + at * out->stride[d];
            slot.data = (char *)out->data + at * out->stride[d] * (int64_t)fl_dtype_size(out->dtype);
            if (slot.numel > 0) rc = be->copy(&slot, ts[i]);
            at += ts[i]->shape[d];
        }
    }
    if (rc == FL_OK && fl_needs_grad(n, ts)) {
        int64_t *sizes = malloc((size_t)n * sizeof *sizes);
        fl_node *node = NULL;
        rc = sizes ? fl_record(&cat_type, n, ts, out, 0, NULL, &node)
                   : fl_fail(FL_ERR_OOM, "cat: out of CPU memory for %d sizes", n);
        if (node) {
            for (int i = 0; i < n; i++) sizes[i] = ts[i]->shape[d];
            node->i[0] = d;
            node->extra = sizes;
        } else {
            free(sizes);
        }
    }
    if (rc != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

static int cat_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const int64_t *sizes = node->extra;
    int d = (int)node->i[0];
    int64_t at = 0;
    for (int i = 0; i < node->n_inputs; i++) {
        if (fl_node_wants(node, i)) {
            gi[i] = fl_narrow(go[0], d, at, sizes[i]);
            if (!gi[i]) return fl_last_status();
        }
        at += sizes[i];
    }
    return FL_OK;
}

static void cat_release(fl_node *node) { free(node->extra); }

static const fl_node_type cat_type = {
    .name = "CatBackward", .backward = cat_backward, .release = cat_release};
