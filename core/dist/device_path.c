/*
 * device_path.c: collectives on device tensors: through the device
 * library's communicator (NCCL) when every rank of the group can make one,
 * else through host copies ([Note: collectives on device tensors]).
 */
#include "dist.h"
#include "op_common.h"

#include <string.h>

/* ---- device tensors ----------------------------------------------------------- */

/* [Note: collectives on device tensors]
 * A group's first collective on device tensors decides, with every rank,
 * how the group moves them (device_path):
 * - through the device's library (NCCL for cuda: cuda_nccl.cu) when every
 *   rank has it and could make a communicator from rank 0's unique id
 *   (broadcast by the host backend): device pointers, the tensor's own
 *   dtype, avg done by the library, queued after the kernels that made the
 *   inputs, the work complete when its event is;
 * - otherwise through host copies: the inputs are copied to the host when
 *   the collective starts (the copy waits for the kernels that made them),
 *   the host backend moves the copies, and the result is copied back to the
 *   device tensor when the work completes (work_finish), so a caller sees
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

/* Every rank of g learns whether all of them have *flag set (an all-reduce
 * of int32 minima on the host). */
static int agree(fl_group *g, int32_t *flag) {
    int64_t one = 1;
    fl_tensor *t = fl_empty(1, &one, FL_I32, fl_device_make(FL_DEVICE_CPU, 0));
    if (!t) return fl_last_status();
    *(int32_t *)t->data = *flag;
    fl_work *w = fl_all_reduce(g, t, FL_REDUCE_MIN);
    int rc = w ? fl_work_wait(w) : (int)fl_last_status();
    fl_work_release(w);
    *flag = *(int32_t *)t->data;
    fl_tensor_release(t);
    return rc;
}

/* Decide, with every rank of g, how g moves tensors on dev: 1 through the
 * device library (a communicator made now), 0 through host copies; -1 on
 * an error. All ranks or none use the library: a rank without it, or one
 * whose communicator could not be made (NCCL refuses two ranks on one
 * GPU), sends the whole group through host copies, since collectives of
 * the two kinds would never meet. */
int fl_dist_device_path(const char *op, fl_group *g, fl_device dev) {
    if (g->size == 1) return 0;
    if (g->device_path == 0) {
        const fl_device_comm_ops *ops = fl_device_comm_ops_of(dev);
        /* A rank that cannot use its device must say so before the others
         * block in comm_init waiting for it. */
        int32_t ok = ops != NULL && ops->check_device(fl_device_index(dev)) == FL_OK;
        if (ops && !ok)
            fprintf(stderr, "fsdp-lua: rank %d: %s cannot use the device: %s\n", fl_dist.topo.rank,
                    ops->name, fl_last_error());
        if (agree(g, &ok)) return -1;
        unsigned char id[129] = {0};
        if (ok) {
            int64_t n = sizeof id;
            fl_tensor *t = fl_empty(1, &n, FL_U8, fl_device_make(FL_DEVICE_CPU, 0));
            if (!t) return -1;
            unsigned char *b = t->data;
            memset(b, 0, sizeof id);
            if (g->rank == 0) b[0] = ops->unique_id(b + 1) == FL_OK;
            fl_work *w = fl_broadcast(g, t, 0);
            int rc = w ? fl_work_wait(w) : (int)fl_last_status();
            fl_work_release(w);
            memcpy(id, b, sizeof id);
            fl_tensor_release(t);
            if (rc) return -1;
            ok = id[0];
        }
        void *comm = NULL;
        char why[300] = "";
        if (ok) {
            ok = ops->comm_init(g->size, id + 1, g->rank, fl_device_index(dev), &comm) == FL_OK;
            if (!ok) snprintf(why, sizeof why, "%s", fl_last_error());
            int32_t all = ok;
            if (agree(g, &all)) return -1;
            /* A communicator some ranks made and others could not is left
             * alone: destroying it is collective over ranks that never
             * joined, and would hang. */
            if (!all && why[0])
                fprintf(stderr, "fsdp-lua: rank %d: %s is not used for cuda tensors on group %s (%s); "
                        "they move through host copies\n", fl_dist.topo.rank, ops->name, g->name, why);
            ok = all;
        }
        g->device_path = ok ? 1 : -1;
        g->device_comm = ok ? comm : NULL;
        g->comm_device = dev;
        if (ok) g->device_comm_seq = ++fl_dist.device_comms_made;
    }
    if (g->device_path < 0) return 0;
    if (g->comm_device != dev) {
        char a[32], b[32], why[160];
        fl_device_format(g->comm_device, a, sizeof a);
        fl_device_format(dev, b, sizeof b);
        snprintf(why, sizeof why, "the group's %s communicator is on %s, the tensors on %s",
                 fl_device_comm_ops_of(dev)->name, a, b);
        fl_dist_fail_at(op, g, FL_ERR_ARG, why);
        return -1;
    }
    return 1;
}

/* Start c (device pointers) through g's device library; keep0/keep1 stay
 * referenced until it completes. */
fl_work *fl_dist_launch_device(const char *op, fl_group *g, const fl_coll *c, fl_tensor *keep0,
                               const fl_tensor *keep1) {
    const fl_device_comm_ops *ops = fl_device_comm_ops_of(g->comm_device);
    fl_work *w = fl_work_new(op, g);
    if (!w) return NULL;
    fl_dist_count_started(w, c, g->size);
    w->keep[0] = fl_tensor_retain(keep0);
    w->keep[1] = keep1 ? fl_tensor_retain((fl_tensor *)keep1) : NULL;
    w->dops = ops;
    char label[160];
    fl_dist_where(label, sizeof label, op, g);
    if (ops->start(g->device_comm, fl_device_index(g->comm_device), c, label, &w->req) != FL_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", fl_last_error());
        fl_dist_fail_at(op, g, FL_ERR_DEVICE, why);
        fl_work_free(w);
        return NULL;
    }
    return w;
}

/* Attach the copy back of host to dev to w, which ran on host (consumed);
 * done at once if w already completed. */
fl_work *fl_dist_copy_back_when_done(fl_work *w, fl_tensor *dev, fl_tensor *host) {
    if (!w) {
        fl_tensor_release(host);
        return NULL;
    }
    if (w->completed) {
        int rc = fl_copy_(dev, host);
        fl_tensor_release(host);
        if (rc != FL_OK) {
            fl_work_free(w);
            return NULL;
        }
        return w;
    }
    w->device_out = fl_tensor_retain(dev);
    w->host_out = host;
    return w;
}
