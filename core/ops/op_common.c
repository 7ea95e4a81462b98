/*
 * op_common.c: what every op family needs before it reaches a kernel:
 * numpy broadcasting of any number of operands, the views kernels read
 * broadcast inputs through, dtype promotion, the device check, output
 * creation that keeps meta and fake tensors storage-less, and the error of
 * a device with no kernel.
 */
#include "error.h"
#include "shape.h"
#include "op_common.h"

#include <string.h>

const void *fl_no_kernel(const char *op, fl_device device) {
    char d[32];
    fl_device_format(device, d, sizeof d);
    return FL_FAIL_NULL(FL_ERR_UNSUPPORTED, "%s: no kernel for device %s in this build", op, d);
}

fl_tensor *fl_op_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                            bool no_storage) {
    return no_storage ? fl_fake(ndim, shape, dtype, device) : fl_empty(ndim, shape, dtype, device);
}

int fl_broadcast_shape(const char *op, int n, const fl_tensor *const *ts, int *ndim,
                          int64_t *shape) {
    int nd = 0;
    for (int k = 0; k < n; k++)
        if (ts[k]->ndim > nd) nd = ts[k]->ndim;
    for (int d = 0; d < nd; d++) {
        int64_t size = 1;
        for (int k = 0; k < n; k++) {
            int dk = d - (nd - ts[k]->ndim);
            int64_t s = dk >= 0 ? ts[k]->shape[dk] : 1;
            if (s == 1 || s == size) continue;
            if (size != 1) {
                /* Name every operand's shape: with three, the pair at fault
                 * is not always obvious. */
                char msg[512];
                size_t used = 0;
                for (int j = 0; j < n && used < sizeof msg; j++) {
                    char s_j[128];
                    int w = snprintf(msg + used, sizeof msg - used, "%s%s",
                                     j == 0 ? "" : (j == n - 1 ? " and " : ", "),
                                     fl_shape_str(ts[j], s_j, sizeof s_j));
                    if (w < 0) break;
                    used += (size_t)w;
                }
                return fl_fail(FL_ERR_ARG, "%s: shapes %s do not broadcast (dim %d: %lld vs %lld)",
                               op, msg, d, (long long)size, (long long)s);
            }
            size = s;
        }
        shape[d] = size;
    }
    *ndim = nd;
    return FL_OK;
}

void fl_broadcast_view(const fl_tensor *t, int ndim, const int64_t *shape, fl_tensor *view) {
    *view = *t;
    int shift = ndim - t->ndim;
    for (int d = ndim - 1; d >= 0; d--) {
        int sd = d - shift;
        view->shape[d] = shape[d];
        view->stride[d] = sd >= 0 && t->shape[sd] == shape[d] ? t->stride[sd] : 0;
    }
    view->ndim = ndim;
    view->numel = 1;
    for (int d = 0; d < ndim; d++) view->numel *= shape[d];
}

static int float_rank(fl_dtype d) {
    switch (d) {
    case FL_F64: return 3;
    case FL_F32: return 2;
    default: return 1; /* f16, bf16 */
    }
}

fl_dtype fl_promote(fl_dtype a, fl_dtype b) {
    bool fa = fl_dtype_is_float(a), fb = fl_dtype_is_float(b);
    if (fa && fb) {
        if (a == b) return a;
        if (float_rank(a) != float_rank(b)) return float_rank(a) > float_rank(b) ? a : b;
        return FL_F32; /* f16 with bf16 */
    }
    if (fa || fb) return fa ? a : b;
    return a == b ? a : FL_I64;
}

int fl_same_device(const char *op, int n, const fl_tensor *const *ts) {
    for (int k = 1; k < n; k++) {
        if (ts[k]->device == ts[0]->device) continue;
        char d0[32], dk[32];
        fl_device_format(ts[0]->device, d0, sizeof d0);
        fl_device_format(ts[k]->device, dk, sizeof dk);
        return fl_fail(FL_ERR_ARG, "%s: tensors on different devices (%s and %s)", op, d0, dk);
    }
    return FL_OK;
}
