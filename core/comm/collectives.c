/*
 * collectives.c: the collectives every backend shares, the API of core/comm:
 * checking the arguments (validate(), once for all of them), staging
 * 16-bit floats in f32, choosing the host or the device path, and handing
 * the checked buffers to a work (work.c) that starts the backend's request.
 *
 * [Note: the layers of core/comm]
 * core/comm is three layers, and calls run one way, from each to the ones
 * below it (tools/layers.lua fails on any call back up and on any circle
 * between these files):
 *   API        the public entry points: the runtime (dist.c: init,
 *              finalize, topology, timeout, leaving the job), process
 *              groups (group.c: world, lists, splits, hybrid; a group's
 *              choice of device path), the collectives and their argument
 *              checks (collectives.c), the monitored barrier
 *              (monitored_barrier.c). Within it: collectives.c and
 *              monitored_barrier.c -> group.c -> dist.c.
 *   work       async handles (work.c): starting a checked collective on
 *              the backend or the device library, completion and its
 *              post-processing, waiting with a deadline, works released
 *              early, the counts of started collectives.
 *   transport  the backend vtable (dist_backend.h) and its backends: self
 *              (backend_self.c) and the MPI plugin (mpi/, its own
 *              library); host staging of device tensors and the device
 *              library's ops (device_path.c); a group's communicators and
 *              their lifetime (communicator.c); the runtime's state, the
 *              clock and waiting policy, messages and the roll call
 *              (transport.c).
 * A lower file needs something of a higher one only as data: the runtime
 * state (fl_dist) that dist.c fills, the group and work structures. So a
 * group's lifetime sits below the works that hold it, and a group decides
 * its device path by starting works itself rather than calling the
 * collectives that call it.
 *
 * A collective checks its tensors (naming the collective, the group, this
 * rank and the shapes), hands the backend contiguous buffers, and returns
 * a work. Groups of one rank never reach the backend: the result is the
 * input. Meta and fake tensors are checked and nothing moves, so planning
 * a sharded model on meta runs the same code as training it.
 *
 * [Note: 16-bit reductions]
 * MPI has no bf16 type, and a user-defined MPI_Op on bf16 would round
 * every partial sum to bf16 (a ring all-reduce over 8 ranks adds 7
 * roundings). So bf16 and f16 reductions convert the input to an f32
 * buffer, reduce in f32 and round once into the output: accumulation in
 * fp32, at twice the bytes on the wire (CPU tensors move through memory,
 * where that is cheap next to the compute). Gathers and broadcasts move
 * 16-bit values as they are.
 *
 */
#include "dist.h"

#include <string.h>

/* ---- checking tensors -------------------------------------------------------- */

static int check_tensor(const char *op, const fl_group *g, const char *role, const fl_tensor *t) {
    char why[256];
    if (!t) {
        snprintf(why, sizeof why, "%s tensor is NULL", role);
        return fl_dist_fail_at(op, g, FL_ERR_ARG, why);
    }
    if (!t->storage) return FL_OK; /* meta or fake: shapes only */
    if (!fl_tensor_is_contiguous(t)) {
        char shape[96];
        snprintf(why, sizeof why, "%s tensor of shape %s is not contiguous (call contiguous())",
                 role, fl_shape_str(t, shape, sizeof shape));
        return fl_dist_fail_at(op, g, FL_ERR_ARG, why);
    }
    return FL_OK;
}

static int check_reduce_op(const char *op, const fl_group *g, fl_reduce_op rop, fl_dtype dtype) {
    char why[160];
    if ((int)rop < 0 || rop >= FL_REDUCE_OP_COUNT) {
        snprintf(why, sizeof why, "invalid reduce op %d (expected sum, avg, max or min)",
                 (int)rop);
        return fl_dist_fail_at(op, g, FL_ERR_ARG, why);
    }
    if (rop == FL_REDUCE_AVG && !fl_dtype_is_float(dtype)) {
        snprintf(why, sizeof why, "avg needs a float dtype, the tensor is %s (use sum)",
                 fl_dtype_name(dtype));
        return fl_dist_fail_at(op, g, FL_ERR_ARG, why);
    }
    if (rop == FL_REDUCE_SUM && dtype == FL_BOOL) {
        snprintf(why, sizeof why, "sum of bool tensors is not defined (max is any, min is all)");
        return fl_dist_fail_at(op, g, FL_ERR_ARG, why);
    }
    return FL_OK;
}

/* One collective's arguments, as validate() checks them. */
typedef struct coll_args {
    const char *op;
    int tensors;          /* 0 (barrier), 1 (all_reduce, broadcast: out), 2 */
    fl_tensor *out;
    const fl_tensor *in;
    bool out_gathers;     /* 2 tensors: out has size x in's elements (all_gather), */
                          /* else in has size x out's (reduce_scatter) */
    bool reduces;         /* rop is checked for the dtype */
    fl_reduce_op rop;
    bool rooted;          /* root is checked to be a rank of the group */
    int root;
} coll_args;

/* The preamble every collective shares: complete what was released
 * before completion, resolve the group (this rank a member), and check the
 * arguments: tensors present and contiguous, on one device, of one dtype,
 * the gathered side the group size times the other, the reduce op for the
 * dtype, the root a rank of the group. Each failure is one message naming
 * the collective, the group, this rank and the shapes. Returns the group,
 * or NULL. */
static fl_group *validate(fl_group *group, const coll_args *a) {
    const char *op = a->op;
    fl_dist_progress_dropped();
    fl_group *g = fl_group_resolve(op, group);
    if (!g) return NULL;
    const fl_tensor *out = a->out, *in = a->in;
    if (a->tensors == 1 && check_tensor(op, g, "the", out)) return NULL;
    char why[256], s1[96], s2[96];
    if (a->tensors == 2) {
        if (check_tensor(op, g, "output", out) || check_tensor(op, g, "input", in) ||
            fl_dist_check_same_device(op, g, out, in))
            return NULL;
        if (in->dtype != out->dtype) {
            snprintf(why, sizeof why, "input is %s, output is %s: the dtypes must match",
                     fl_dtype_name(in->dtype), fl_dtype_name(out->dtype));
            return fl_dist_fail_at(op, g, FL_ERR_ARG, why), NULL;
        }
    }
    if (a->reduces && check_reduce_op(op, g, a->rop, out->dtype)) return NULL;
    if (a->tensors == 2) {
        const fl_tensor *big = a->out_gathers ? out : in, *part = a->out_gathers ? in : out;
        if (big->numel != part->numel * g->size) {
            snprintf(why, sizeof why,
                     "%s %s has %lld elements, expected %d ranks x %lld (%s %s) = %lld",
                     big == out ? "output" : "input", fl_shape_str(big, s1, sizeof s1),
                     (long long)big->numel, g->size, (long long)part->numel,
                     part == out ? "output" : "input", fl_shape_str(part, s2, sizeof s2),
                     (long long)(part->numel * g->size));
            return fl_dist_fail_at(op, g, FL_ERR_ARG, why), NULL;
        }
    }
    if (a->rooted && (a->root < 0 || a->root >= g->size)) {
        snprintf(why, sizeof why, "root %d is not a rank of the group (0 ... %d)", a->root,
                 g->size - 1);
        return fl_dist_fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    return g;
}

static bool is_16bit_float(fl_dtype d) { return d == FL_BF16 || d == FL_F16; }

static bool overlap(const fl_tensor *a, const fl_tensor *b) {
    const char *pa = a->data, *pb = b->data;
    int64_t na = a->numel * (int64_t)fl_dtype_size(a->dtype);
    int64_t nb = b->numel * (int64_t)fl_dtype_size(b->dtype);
    return pa < pb + nb && pb < pa + na;
}

static int check_count(const char *op, const fl_group *g, int64_t count) {
    if (count <= INT32_MAX) return FL_OK;
    char why[160];
    snprintf(why, sizeof why, "%lld elements per rank exceed MPI's count limit of %d; split it",
             (long long)count, INT32_MAX);
    return fl_dist_fail_at(op, g, FL_ERR_ARG, why);
}

static fl_tensor *f32_stage(const fl_tensor *like, int64_t numel, bool copy) {
    int64_t shape[1] = {numel};
    fl_tensor *s = fl_empty(1, shape, FL_F32, fl_device_make(FL_DEVICE_CPU, 0));
    if (s && copy && fl_convert(s->data, FL_F32, like->data, like->dtype, numel) != FL_OK) {
        fl_tensor_release(s);
        return NULL;
    }
    return s;
}

/* ---- the collectives --------------------------------------------------------- */

fl_work *fl_all_gather_into(fl_group *group, fl_tensor *out, const fl_tensor *in) {
    static const char op[] = "all_gather_into";
    fl_group *g = validate(group, &(coll_args){.op = op, .tensors = 2, .out = out, .in = in,
                                               .out_gathers = true});
    if (!g) return NULL;
    if (!in->storage || !out->storage) return fl_work_done(op, g);
    if (check_count(op, g, in->numel)) return NULL;
    size_t bytes = (size_t)in->numel * fl_dtype_size(in->dtype);
    const char *slot = (const char *)out->data + (size_t)g->rank * bytes;
    bool in_place = in->data == slot;
    if (!in_place && overlap(in, out)) {
        char why[160];
        snprintf(why, sizeof why,
                 "input overlaps the output other than as this rank's slot (elements %lld "
                 "... of the output)",
                 (long long)(g->rank * in->numel));
        return fl_dist_fail_at(op, g, FL_ERR_ARG, why), NULL;
    }
    if (fl_dist_on_device(out)) {
        int path = fl_group_device_path(op, g, out->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_ALL_GATHER, in->data, out->data, in->numel, in->dtype,
                         FL_REDUCE_SUM, 0};
            return fl_work_start_device(op, g, &c, out, in);
        }
        fl_tensor *hin = fl_dist_host_copy(in), *hout = hin ? fl_dist_host_like(out) : NULL;
        fl_work *w = hout ? fl_all_gather_into(group, hout, hin) : NULL;
        fl_tensor_release(hin);
        return hout ? fl_work_copy_back(w, out, hout) : NULL;
    }
    if (g->size == 1) {
        if (!in_place) memmove(out->data, in->data, bytes);
        return fl_work_done(op, g);
    }
    fl_work *w = fl_work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(out);
    w->keep[1] = fl_tensor_retain((fl_tensor *)in);
    fl_coll c = {FL_COLL_ALL_GATHER, in_place ? NULL : in->data, out->data, in->numel,
                 in->dtype, FL_REDUCE_SUM, 0};
    return fl_work_start(w, &c);
}

fl_work *fl_reduce_scatter(fl_group *group, fl_tensor *out, const fl_tensor *in,
                           fl_reduce_op rop) {
    static const char op[] = "reduce_scatter";
    fl_group *g = validate(group, &(coll_args){.op = op, .tensors = 2, .out = out, .in = in,
                                               .reduces = true, .rop = rop});
    if (!g) return NULL;
    if (!in->storage || !out->storage) return fl_work_done(op, g);
    if (check_count(op, g, out->numel)) return NULL;
    if (overlap(in, out))
        return fl_dist_fail_at(op, g, FL_ERR_ARG, "input and output overlap (reduce into a separate "
                                          "tensor)"),
               NULL;
    if (fl_dist_on_device(out)) {
        int path = fl_group_device_path(op, g, out->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_REDUCE_SCATTER, in->data, out->data, out->numel, in->dtype, rop, 0};
            return fl_work_start_device(op, g, &c, out, in);
        }
        fl_tensor *hin = fl_dist_host_copy(in), *hout = hin ? fl_dist_host_like(out) : NULL;
        fl_work *w = hout ? fl_reduce_scatter(group, hout, hin, rop) : NULL;
        fl_tensor_release(hin);
        return hout ? fl_work_copy_back(w, out, hout) : NULL;
    }
    if (g->size == 1) {
        memcpy(out->data, in->data, (size_t)in->numel * fl_dtype_size(in->dtype));
        return fl_work_done(op, g);
    }
    fl_work *w = fl_work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(out);
    w->keep[1] = fl_tensor_retain((fl_tensor *)in);
    w->result = out;
    w->average = rop == FL_REDUCE_AVG;
    fl_coll c = {FL_COLL_REDUCE_SCATTER, in->data, out->data, out->numel, in->dtype,
                 w->average ? FL_REDUCE_SUM : rop, 0};
    if (is_16bit_float(in->dtype)) {
        w->stage_in = f32_stage(in, in->numel, true);
        w->stage_out = w->stage_in ? f32_stage(out, out->numel, false) : NULL;
        if (!w->stage_out) {
            fl_work_free(w);
            return NULL;
        }
        c.send = w->stage_in->data;
        c.recv = w->stage_out->data;
        c.dtype = FL_F32;
    }
    return fl_work_start(w, &c);
}

fl_work *fl_all_reduce(fl_group *group, fl_tensor *t, fl_reduce_op rop) {
    static const char op[] = "all_reduce";
    fl_group *g = validate(group, &(coll_args){.op = op, .tensors = 1, .out = t, .reduces = true,
                                               .rop = rop});
    if (!g) return NULL;
    if (fl_dist_on_device(t) && g->size > 1) {
        int path = fl_group_device_path(op, g, t->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_ALL_REDUCE, NULL, t->data, t->numel, t->dtype, rop, 0};
            return fl_work_start_device(op, g, &c, t, NULL);
        }
        fl_tensor *host = fl_dist_host_copy(t);
        return host ? fl_work_copy_back(fl_all_reduce(group, host, rop), t, host) : NULL;
    }
    if (!t->storage || g->size == 1) return fl_work_done(op, g);
    if (check_count(op, g, t->numel)) return NULL;
    fl_work *w = fl_work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(t);
    w->result = t;
    w->average = rop == FL_REDUCE_AVG;
    fl_coll c = {FL_COLL_ALL_REDUCE, NULL, t->data, t->numel, t->dtype,
                 w->average ? FL_REDUCE_SUM : rop, 0};
    if (is_16bit_float(t->dtype)) {
        w->stage_out = f32_stage(t, t->numel, true);
        if (!w->stage_out) {
            fl_work_free(w);
            return NULL;
        }
        c.recv = w->stage_out->data;
        c.dtype = FL_F32;
    }
    return fl_work_start(w, &c);
}

fl_work *fl_broadcast(fl_group *group, fl_tensor *t, int root) {
    static const char op[] = "broadcast";
    fl_group *g = validate(group, &(coll_args){.op = op, .tensors = 1, .out = t, .rooted = true,
                                               .root = root});
    if (!g) return NULL;
    if (fl_dist_on_device(t) && g->size > 1) {
        int path = fl_group_device_path(op, g, t->device);
        if (path < 0) return NULL;
        if (path == 1) {
            fl_coll c = {FL_COLL_BROADCAST, NULL, t->data, t->numel, t->dtype, FL_REDUCE_SUM, root};
            return fl_work_start_device(op, g, &c, t, NULL);
        }
        fl_tensor *host = fl_dist_host_copy(t);
        return host ? fl_work_copy_back(fl_broadcast(group, host, root), t, host) : NULL;
    }
    if (!t->storage || g->size == 1) return fl_work_done(op, g);
    if (check_count(op, g, t->numel)) return NULL;
    fl_work *w = fl_work_new(op, g);
    if (!w) return NULL;
    w->keep[0] = fl_tensor_retain(t);
    fl_coll c = {FL_COLL_BROADCAST, NULL, t->data, t->numel, t->dtype, FL_REDUCE_SUM, root};
    return fl_work_start(w, &c);
}

fl_work *fl_barrier(fl_group *group) {
    static const char op[] = "barrier";
    fl_group *g = validate(group, &(coll_args){.op = op});
    if (!g) return NULL;
    if (g->size == 1) return fl_work_done(op, g);
    fl_work *w = fl_work_new(op, g);
    if (!w) return NULL;
    fl_coll c = {FL_COLL_BARRIER, NULL, NULL, 0, FL_U8, FL_REDUCE_SUM, 0};
    return fl_work_start(w, &c);
}
