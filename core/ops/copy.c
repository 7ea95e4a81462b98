/*
 * copy.c: the differentiable copies that create tensors: clone,
 * contiguous, to and its non-blocking form. The copying itself is
 * core/tensor's (fl_tensor_clone, fl_tensor_to: the ground floor knows
 * nothing of autograd); this file records the backward, which sends the
 * gradient back converted to the input's dtype and device.
 */
#include "storage.h"
#include "node.h"

static int to_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    gi[0] = fl_to(go[0], (fl_dtype)node->i[0], (fl_device)node->i[1]);
    return gi[0] ? FL_OK : (int)fl_last_status();
}

static const fl_node_type to_type = {.name = "ToBackward", .backward = to_backward};
static const fl_node_type clone_type = {.name = "CloneBackward", .backward = to_backward};

static fl_tensor *record_copy(fl_tensor *out, const fl_tensor *in, const fl_node_type *type) {
    if (!out || out == in || !fl_needs_grad(1, &in)) return out;
    fl_node *node;
    if (fl_record(type, 1, &in, out, 0, NULL, &node) != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    node->i[0] = in->dtype;
    node->i[1] = in->device;
    return out;
}

fl_tensor *fl_clone(const fl_tensor *t) { return record_copy(fl_tensor_clone(t), t, &clone_type); }

fl_tensor *fl_contiguous(const fl_tensor *t) {
    if (fl_check_tensor("contiguous", t, false)) return NULL;
    if (fl_tensor_is_contiguous(t)) return fl_tensor_retain((fl_tensor *)t);
    return fl_clone(t);
}

fl_tensor *fl_to(const fl_tensor *t, fl_dtype dtype, fl_device device) {
    return record_copy(fl_tensor_to(t, dtype, device, false), t, &to_type);
}

fl_tensor *fl_to_non_blocking(const fl_tensor *t, fl_dtype dtype, fl_device device) {
    return record_copy(fl_tensor_to(t, dtype, device, true), t, &to_type);
}
