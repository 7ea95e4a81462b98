/*
 * fused_common.c: the kernel-table lookup and the small helpers shared by
 * the op files of the fused family (norms, softmax, losses, rotary,
 * attention): dtype and device checks, output creation that respects meta
 * and fake inputs, and conversions done outside autograd.
 */
#include "fused.h"
#include "storage.h"
#include "op_common.h"

const fl_fused_kernels *fl_fused_kernels_of(const char *op, fl_device device) {
    const fl_backend *be = fl_backend_of(device);
    return be && be->fused ? be->fused : fl_no_kernel(op, device);
}

fl_dtype fl_fused_compute_dtype(fl_dtype dtype) {
    return dtype == FL_F64 ? FL_F64 : FL_F32;
}

int fl_fused_check_float(const char *op, const char *what, const fl_tensor *t) {
    if (fl_check_tensor(op, t, false)) return fl_last_status();
    if (!fl_dtype_is_float(t->dtype))
        return fl_fail(FL_ERR_ARG, "%s: %s must be a floating point tensor, got %s", op, what,
                       fl_dtype_name(t->dtype));
    return FL_OK;
}

int fl_fused_check_device(const char *op, const char *what, const fl_tensor *t,
                          fl_device device) {
    if (t->device == device) return FL_OK;
    char a[32], b[32];
    fl_device_format(t->device, a, sizeof a);
    fl_device_format(device, b, sizeof b);
    return fl_fail(FL_ERR_ARG, "%s: %s is on %s but the input is on %s", op, what, a, b);
}

bool fl_fused_no_storage(int n, const fl_tensor *const *ts) {
    for (int i = 0; i < n; i++)
        if (ts[i] && !ts[i]->storage) return true;
    return false;
}

fl_tensor *fl_fused_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                           bool no_storage) {
    return no_storage ? fl_fake(ndim, shape, dtype, device) : fl_empty(ndim, shape, dtype, device);
}

fl_tensor *fl_fused_prepare(const fl_tensor *t, fl_dtype dtype) {
    /* fl_to and fl_clone record autograd nodes when t requires grad; the
     * kernels' private copies must not. */
    bool was = fl_set_grad_enabled(false);
    fl_tensor *c = fl_to(t, dtype, t->device);
    if (c && c->ndim > 0 && c->stride[c->ndim - 1] != 1 && c->shape[c->ndim - 1] > 1) {
        fl_tensor *dense = fl_clone(c);
        fl_tensor_release(c);
        c = dense;
    }
    fl_set_grad_enabled(was);
    return c;
}

fl_tensor *fl_fused_record(const fl_node_type *type, int n_in, const fl_tensor *const *inputs,
                           fl_tensor *out, int n_saved, const fl_tensor *const *saved,
                           fl_node **node_out) {
    if (fl_record(type, n_in, inputs, out, n_saved, saved, node_out) != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

fl_tensor *fl_fused_as_dtype(fl_tensor *g, fl_dtype dtype) {
    if (!g || g->dtype == dtype) return g;
    fl_tensor *c = fl_to(g, dtype, g->device);
    fl_tensor_release(g);
    return c;
}
