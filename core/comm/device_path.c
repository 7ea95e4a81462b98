/*
 * device_path.c: the transport's side of collectives on device tensors
 * ([Note: collectives on device tensors]): which tensors are on a device,
 * the host copies that stage them for the host backend, and the device
 * library (NCCL) a device backend offers. The choice between the two paths,
 * made with every rank of a group, is the group's (fl_group_device_path in
 * group.c); starting a device library's collective is a work's
 * (fl_work_start_device in work.c).
 */
#include "dist.h"

#include <string.h>

/* [Note: collectives on device tensors]
 * A group's first collective on device tensors decides, with every rank,
 * how the group moves them (fl_group_device_path, group.c):
 * - through the device's library (NCCL for cuda: cuda_nccl.cu) when every
 *   rank has it and could make a communicator from rank 0's unique id
 *   (broadcast by the host backend): device pointers, the tensor's own
 *   dtype, avg done by the library, queued after the kernels that made the
 *   inputs, the work complete when its event is;
 * - otherwise through host copies: the inputs are copied to the host when
 *   the collective starts (the copy waits for the kernels that made them),
 *   the host backend moves the copies, and the result is copied back to the
 *   device tensor when the work completes (fl_work_finish), so a caller sees
 *   the device tensor change exactly when it would with the result in
 *   place. This is the path for ranks sharing one GPU (NCCL refuses them),
 *   for machines without NCCL and for FSDP_NCCL=0.
 * All ranks or none use the library: collectives of the two kinds would
 * never meet. */

bool fl_dist_on_device(const fl_tensor *t) {
    return t && t->storage && fl_device_kind_of(t->device) != FL_DEVICE_CPU;
}

/* Both tensors of a two-tensor collective on one device (meta and fake
 * ones, without storage, go anywhere). */
int fl_dist_check_same_device(const char *op, const fl_group *g, const fl_tensor *out,
                              const fl_tensor *in) {
    const fl_tensor *both[2] = {out, in};
    if (!out->storage || !in->storage || fl_same_device("output and input", 2, both) == FL_OK)
        return FL_OK;
    char why[256];
    snprintf(why, sizeof why, "%s", fl_last_error());
    return fl_dist_fail_at(op, g, FL_ERR_ARG, why);
}

fl_tensor *fl_dist_host_copy(const fl_tensor *t) {
    return fl_to(t, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
}

fl_tensor *fl_dist_host_like(const fl_tensor *t) {
    return fl_empty(t->ndim, t->shape, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
}

const fl_device_comm_ops *fl_device_comm_ops_of(fl_device device) {
    const fl_backend *be = fl_backend_of(device);
    return be && be->comm_ops ? be->comm_ops() : NULL;
}

