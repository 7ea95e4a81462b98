/*
 * unit.c: the sharded unit, FSDP's flat parameter (see "sharded units" in
 * fsdp.h for the layout, the states and the gradient path).
 *
 * A unit owns three buffers:
 *   shard     master dtype, [shard numel]: this rank's slice of the flat
 *             parameter, updated by the optimizer;
 *   gathered  param dtype, [padded numel]: the whole flat parameter while
 *             unsharded, in a fixed virtual range whose pages come and go
 *             ([Note: the gathered buffer keeps its address]);
 *   grad      grad dtype, [shard numel]: the reduced, accumulated gradient.
 * Every cross-rank step is one collective on the whole unit: one all-gather
 * to unshard, one reduce-scatter (plus one all-reduce across replicas) per
 * backward.
 *
 * When the shard group has one rank and the param dtype is the master
 * dtype (NO_SHARD in full precision) the gathered buffer is the shard
 * itself: nothing is copied or freed.
 *
 * With cpu_offload the shard and grad live on the host while the gathered
 * buffer is on the unit's device: unshard copies the shard up into its slot
 * (the all-gather runs on the device buffer), and the reduced gradient
 * comes down into grad, so the optimizer steps on the host.
 */
#include "internal.h"

#include <string.h>

typedef struct unit_param {
    char *name;
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    int64_t offset, numel; /* in the flat parameter */
} unit_param;

struct fl_unit {
    char *name;
    fl_unit_config cfg;
    int n;
    unit_param *params;
    int64_t numel, padded, shard_numel, shard_start; /* shard_start: rank * shard_numel */
    int group_rank, group_size;
    fl_unit_state state;
    bool meta, aliased;
    bool stranded; /* a timed-out all-gather may still write the gathered pages */
    fl_tensor *shard, *grad, *gathered;
    void *range;          /* the gathered buffer's reserved pages (not aliased, not meta) */
    int64_t range_bytes;  /* their size, a multiple of the page size */
    fl_work *gather_work;
    fl_tensor *reduce_in, *reduce_out; /* pending reduce: packed gradient, its shard */
    fl_work *reduce_work;
};

static const char *label(const fl_unit *u) { return u->name[0] ? u->name : "<root>"; }

/* Where the shard and its gradient live: the host when offloaded. */
static fl_device shard_device(const fl_unit *u) {
    return u->cfg.cpu_offload && !u->meta ? fl_device_make(FL_DEVICE_CPU, 0) : u->cfg.device;
}

static int unit_fail(const fl_unit *u, fl_status st, const char *what) {
    return fl_fail(st, "sharded unit %s: %s", label(u), what);
}

/* ---- the gathered buffer's pages ------------------------------------------ */

/* The storage's release: the addresses go back when the last view goes
 * (ctx: the device). */
static void range_release(void *ctx, void *data, int64_t nbytes) {
    fl_device device = (fl_device)(intptr_t)ctx;
    fl_backend_of(device)->vm_unreserve(fl_device_index(device), data, nbytes);
}

/* Reserve the range through the device's backend, without memory until the
 * first unshard; the storage gives the addresses back when the last view
 * goes. */
static int reserve_gathered(fl_unit *u) {
    const fl_backend *be = fl_backend_of(u->cfg.device);
    if (!be || !be->vm_reserve) {
        char dev[32], why[160];
        fl_device_format(u->cfg.device, dev, sizeof dev);
        snprintf(why, sizeof why, "the %s backend cannot reserve address ranges for the gathered "
                 "parameters", dev);
        return unit_fail(u, FL_ERR_UNSUPPORTED, why);
    }
    int index = fl_device_index(u->cfg.device);
    int64_t bytes = u->padded * (int64_t)fl_dtype_size(u->cfg.param_dtype);
    void *p = be->vm_reserve(index, bytes > 0 ? bytes : 1, &u->range_bytes);
    if (!p) {
        char why[512];
        snprintf(why, sizeof why, "cannot reserve addresses for the gathered parameters: %s",
                 fl_last_error());
        return unit_fail(u, FL_ERR_OOM, why);
    }
    fl_storage *s = calloc(1, sizeof *s);
    fl_tensor *t = fl_tensor_header(1, &u->padded, u->cfg.param_dtype, u->cfg.device);
    if (!s || !t) {
        be->vm_unreserve(index, p, u->range_bytes);
        free(s);
        fl_tensor_release(t);
        return unit_fail(u, FL_ERR_OOM, "out of host memory for a header");
    }
    s->data = p;
    s->nbytes = u->range_bytes;
    s->refcount = 1;
    s->device = u->cfg.device;
    s->release = range_release;
    s->release_ctx = (void *)(intptr_t)u->cfg.device;
    t->storage = s;
    t->data = p;
    u->range = p;
    u->gathered = t;
    return FL_OK;
}

static int pages_in(fl_unit *u) {
    if (fl_memory_note_alloc(u->cfg.device, u->range_bytes) != FL_OK) {
        char why[512];
        snprintf(why, sizeof why, "cannot gather its parameters: %s", fl_last_error());
        return unit_fail(u, FL_ERR_OOM, why);
    }
    const fl_backend *be = fl_backend_of(u->cfg.device);
    if (be->vm_commit(fl_device_index(u->cfg.device), u->range, u->range_bytes) != FL_OK) {
        fl_memory_note_free(u->cfg.device, u->range_bytes);
        char why[512];
        snprintf(why, sizeof why, "cannot gather its parameters: %s", fl_last_error());
        return unit_fail(u, FL_ERR_OOM, why);
    }
    return FL_OK;
}

static void pages_out(fl_unit *u) {
    if (u->stranded) return; /* kept mapped for good: see fl_unit_wait */
    fl_backend_of(u->cfg.device)->vm_decommit(fl_device_index(u->cfg.device), u->range,
                                              u->range_bytes);
    fl_memory_note_free(u->cfg.device, u->range_bytes);
}

/* ---- construction ------------------------------------------------------------ */

static fl_tensor *flat(fl_dtype dtype, fl_device device, int64_t n) {
    return fl_zeros(1, &n, dtype, device);
}

static fl_tensor *slice1(const fl_tensor *t, int64_t start, int64_t len) {
    return fl_narrow(t, 0, start, len);
}

fl_unit *fl_unit_new(const char *name, int n, const char *const *names, const int *ndims,
                     const int64_t *dims, const fl_unit_config *config) {
    if (n < 0 || (n > 0 && (!names || !ndims || !dims)) || !config)
        return FL_FAIL_NULL(FL_ERR_ARG, "fl_unit_new: bad arguments");
    fl_dtype dts[4] = {config->master_dtype, config->param_dtype, config->reduce_dtype,
                       config->grad_dtype};
    for (int i = 0; i < 4; i++)
        if (!fl_dtype_is_float(dts[i]))
            return FL_FAIL_NULL(FL_ERR_ARG, "sharded unit %s: dtype %s is not a floating-point type",
                                name && name[0] ? name : "<root>", fl_dtype_name(dts[i]));
    fl_unit *u = calloc(1, sizeof *u);
    if (!u) return FL_FAIL_NULL(FL_ERR_OOM, "out of host memory for a unit");
    u->name = strdup(name ? name : "");
    u->cfg = *config;
    u->n = n;
    u->params = calloc((size_t)(n > 0 ? n : 1), sizeof *u->params);
    if (!u->name || !u->params) goto oom;
    u->meta = fl_device_kind_of(config->device) == FL_DEVICE_META;
    u->cfg.shard_group = config->shard_group ? fl_group_retain(config->shard_group) : fl_group_world();
    if (!u->cfg.shard_group) goto fail;
    u->cfg.replicate_group = fl_group_retain(config->replicate_group);
    if (!fl_group_is_member(u->cfg.shard_group)) {
        unit_fail(u, FL_ERR_ARG, "this rank is not a member of its shard group");
        goto fail;
    }
    u->group_rank = fl_group_rank(u->cfg.shard_group);
    u->group_size = fl_group_size(u->cfg.shard_group);
    const int64_t *d = dims;
    for (int i = 0; i < n; i++) {
        unit_param *p = &u->params[i];
        if (ndims[i] < 0 || ndims[i] > FL_MAX_DIMS) {
            unit_fail(u, FL_ERR_ARG, "a parameter has too many dimensions");
            goto fail;
        }
        p->name = strdup(names[i] ? names[i] : "");
        if (!p->name) goto oom;
        p->ndim = ndims[i];
        memcpy(p->shape, d, (size_t)p->ndim * sizeof *d);
        d += p->ndim;
        if (fl_check_shape("sharded unit", p->ndim, p->shape, &p->numel)) goto fail;
        p->offset = u->numel;
        u->numel += p->numel;
    }
    u->padded = (u->numel + u->group_size - 1) / u->group_size * u->group_size;
    u->shard_numel = u->padded / u->group_size;
    u->shard_start = (int64_t)u->group_rank * u->shard_numel;
    u->shard = flat(config->master_dtype, shard_device(u), u->shard_numel);
    if (!u->shard) goto fail;
    u->aliased = u->group_size == 1 && config->param_dtype == config->master_dtype &&
                 shard_device(u) == config->device;
    if (u->aliased) {
        u->gathered = fl_tensor_retain(u->shard);
        u->state = FL_UNIT_UNSHARDED;
    } else if (u->meta) {
        u->gathered = flat(config->param_dtype, config->device, u->padded);
        if (!u->gathered) goto fail;
    } else if (reserve_gathered(u) != FL_OK) {
        goto fail;
    }
    return u;
oom:
    fl_fail(FL_ERR_OOM, "out of host memory for a unit");
fail:
    fl_unit_free(u);
    return NULL;
}

void fl_unit_free(fl_unit *u) {
    if (!u) return;
    /* Complete what is in flight: its buffers may not be freed under MPI. */
    if (u->gather_work) {
        fl_work_wait(u->gather_work);
        fl_work_release(u->gather_work);
    }
    if (u->reduce_work) {
        fl_work_wait(u->reduce_work);
        fl_work_release(u->reduce_work);
    }
    if (u->range && u->state != FL_UNIT_SHARDED) pages_out(u);
    fl_tensor_release(u->reduce_in);
    fl_tensor_release(u->reduce_out);
    fl_tensor_release(u->gathered);
    fl_tensor_release(u->shard);
    fl_tensor_release(u->grad);
    fl_group_release(u->cfg.shard_group);
    fl_group_release(u->cfg.replicate_group);
    for (int i = 0; u->params && i < u->n; i++) free(u->params[i].name);
    free(u->params);
    free(u->name);
    free(u);
}

/* ---- queries -------------------------------------------------------------------- */

const char *fl_unit_name(const fl_unit *u) { return u ? u->name : ""; }
fl_unit_state fl_unit_state_of(const fl_unit *u) { return u->state; }
int fl_unit_param_count(const fl_unit *u) { return u->n; }
int64_t fl_unit_numel(const fl_unit *u) { return u->numel; }
int64_t fl_unit_padded_numel(const fl_unit *u) { return u->padded; }
int64_t fl_unit_shard_numel(const fl_unit *u) { return u->shard_numel; }
bool fl_unit_reduce_pending(const fl_unit *u) { return u->reduce_in != NULL; }

static bool bad_index(const fl_unit *u, int i) {
    if (i >= 0 && i < u->n) return false;
    char why[96];
    snprintf(why, sizeof why, "parameter index %d out of range (%d parameters)", i, u->n);
    unit_fail(u, FL_ERR_ARG, why);
    return true;
}

const char *fl_unit_param_name(const fl_unit *u, int i) {
    return bad_index(u, i) ? NULL : u->params[i].name;
}

int64_t fl_unit_param_offset(const fl_unit *u, int i) {
    return bad_index(u, i) ? -1 : u->params[i].offset;
}

int fl_unit_param_shard_range(const fl_unit *u, int i, int64_t *param_start,
                              int64_t *shard_start, int64_t *len) {
    if (bad_index(u, i)) return fl_last_status();
    const unit_param *p = &u->params[i];
    int64_t lo = p->offset > u->shard_start ? p->offset : u->shard_start;
    int64_t hi_p = p->offset + p->numel, hi_s = u->shard_start + u->shard_numel;
    int64_t hi = hi_p < hi_s ? hi_p : hi_s;
    *len = hi > lo ? hi - lo : 0;
    *param_start = *len ? lo - p->offset : 0;
    *shard_start = *len ? lo - u->shard_start : 0;
    return FL_OK;
}

fl_tensor *fl_unit_shard(fl_unit *u) { return fl_tensor_retain(u->shard); }
fl_tensor *fl_unit_grad(fl_unit *u) { return fl_tensor_retain(u->grad); }

bool fl_unit_zero_grad(fl_unit *u) {
    fl_tensor *g = u->grad;
    /* the last reference to the header, and the header the last to the storage */
    bool last = g && __atomic_load_n(&g->refcount, __ATOMIC_ACQUIRE) == 1 &&
                (!g->storage || __atomic_load_n(&g->storage->refcount, __ATOMIC_ACQUIRE) == 1);
    fl_tensor_release(g);
    u->grad = NULL;
    return last;
}

int64_t fl_unit_gathered_bytes(const fl_unit *u) {
    return u->aliased ? 0 : u->padded * (int64_t)fl_dtype_size(u->cfg.param_dtype);
}

/* ---- unshard, wait, reshard ---------------------------------------------------- */

int fl_unit_unshard(fl_unit *u) {
    if (u->state != FL_UNIT_SHARDED) return FL_OK;
    if (u->meta) {
        u->state = FL_UNIT_UNSHARDED;
        return FL_OK;
    }
    if (pages_in(u) != FL_OK) return fl_last_status();
    /* Our slot of the gathered buffer takes the shard in the param dtype;
     * the all-gather then fills the other slots in place. */
    fl_tensor *slot = slice1(u->gathered, u->shard_start, u->shard_numel);
    int rc = slot ? fl_copy_(slot, u->shard) : (int)fl_last_status();
    if (rc == FL_OK) {
        u->gather_work = fl_all_gather_into(u->cfg.shard_group, u->gathered, slot);
        if (!u->gather_work) rc = fl_last_status();
    }
    fl_tensor_release(slot);
    if (rc != FL_OK) {
        pages_out(u);
        return rc;
    }
    u->state = FL_UNIT_UNSHARDING;
    return FL_OK;
}

int fl_unit_wait(fl_unit *u) {
    if (u->state == FL_UNIT_SHARDED)
        return unit_fail(u, FL_ERR_STATE, "wait before unshard (the unit is SHARDED)");
    if (u->state == FL_UNIT_UNSHARDED) return FL_OK;
    int rc = fl_work_wait(u->gather_work);
    /* A timed-out all-gather may still be written into by MPI: its pages
     * stay (leaked with the unit's range) rather than fault under it
     * ([Note: a collective that never completes] in core/comm). */
    if (fl_work_is_pending(u->gather_work)) u->stranded = true;
    fl_work_release(u->gather_work);
    u->gather_work = NULL;
    if (rc != FL_OK) {
        char why[1024];
        snprintf(why, sizeof why, "all-gather of its parameters failed: %s", fl_last_error());
        pages_out(u);
        u->state = FL_UNIT_SHARDED;
        return unit_fail(u, rc, why);
    }
    u->state = FL_UNIT_UNSHARDED;
    return FL_OK;
}

int fl_unit_reshard(fl_unit *u) {
    if (u->aliased || u->state == FL_UNIT_SHARDED) return FL_OK;
    if (u->state == FL_UNIT_UNSHARDING)
        return unit_fail(u, FL_ERR_STATE, "reshard while its all-gather is in flight (wait first)");
    if (!u->meta) pages_out(u);
    u->state = FL_UNIT_SHARDED;
    return FL_OK;
}

fl_tensor *fl_unit_param_view(fl_unit *u, int i) {
    if (bad_index(u, i)) return NULL;
    const unit_param *p = &u->params[i];
    int64_t stride[FL_MAX_DIMS];
    fl_contiguous_strides(p->ndim, p->shape, stride);
    return fl_tensor_view_of(u->gathered, p->ndim, p->shape, stride,
                             u->gathered->offset + p->offset);
}

/* ---- whole parameters in the master dtype (state dicts, summon) ------------ */

fl_tensor *fl_unit_gather_master(fl_unit *u, fl_dtype dtype) {
    fl_tensor *full = flat(dtype, u->cfg.device, u->padded);
    if (!full || u->meta) return full;
    fl_tensor *slot = slice1(full, u->shard_start, u->shard_numel);
    int rc = slot ? fl_copy_(slot, u->shard) : (int)fl_last_status();
    if (rc == FL_OK) {
        fl_work *w = fl_all_gather_into(u->cfg.shard_group, full, slot);
        rc = w ? fl_work_wait(w) : (int)fl_last_status();
        fl_work_release(w);
    }
    fl_tensor_release(slot);
    fl_tensor *out = rc == FL_OK ? slice1(full, 0, u->numel) : NULL;
    fl_tensor_release(full);
    return out;
}

int fl_unit_scatter_master(fl_unit *u, const fl_tensor *full) {
    if (fl_check_tensor("scatter_master", full, false)) return fl_last_status();
    if (full->ndim != 1 || full->numel != u->numel) {
        char why[160];
        snprintf(why, sizeof why, "scatter_master expects %lld elements, got %lld",
                 (long long)u->numel, (long long)full->numel);
        return unit_fail(u, FL_ERR_ARG, why);
    }
    int64_t len = u->numel - u->shard_start;
    if (len > u->shard_numel) len = u->shard_numel;
    if (len <= 0 || u->meta) return FL_OK;
    fl_tensor *src = slice1(full, u->shard_start, len);
    fl_tensor *dst = slice1(u->shard, 0, len);
    int rc = src && dst ? fl_copy_(dst, src) : (int)fl_last_status();
    fl_tensor_release(src);
    fl_tensor_release(dst);
    return rc;
}

/* ---- gradients ------------------------------------------------------------------ */

/* Zeros into elements [start, start + len) of a flat buffer. */
static int zero_range(fl_tensor *flat_buf, int64_t start, int64_t len) {
    if (len <= 0) return FL_OK;
    fl_tensor *part = slice1(flat_buf, start, len);
    int rc = part ? fl_fill_(part, 0.0) : (int)fl_last_status();
    fl_tensor_release(part);
    return rc;
}

/* [Note: a gradient nobody else reduces]
 * The reduce dtype is what travels between ranks. A unit whose shard
 * group is one rank and that has no replicas to average with (one
 * process, mixed precision) sends nothing: its packed gradient becomes
 * its sharded gradient as it is. Packing in the reduce dtype then cost a
 * pass over every gradient, and a second to convert the result to the
 * grad dtype (a bf16 small Llama step on one rank: 15 + 15 ms). So such a
 * unit packs straight into the grad dtype, which finish_reduce adopts. The
 * values are the same: the gradients round to the reduce dtype nowhere
 * else, and a bf16 gradient is exact in f32. */
static fl_dtype pack_dtype(const fl_unit *u) {
    bool alone = u->group_size == 1 &&
                 (!u->cfg.replicate_group || fl_group_size(u->cfg.replicate_group) == 1);
    return alone && !u->cfg.cpu_offload ? u->cfg.grad_dtype : u->cfg.reduce_dtype;
}

fl_tensor *fl_unit_pack_grads(fl_unit *u, int n, fl_tensor *const *grads,
                              const fl_tensor *extra) {
    if (n != u->n) {
        char why[96];
        snprintf(why, sizeof why, "pack_grads got %d gradients for %d parameters", n, u->n);
        return unit_fail(u, FL_ERR_ARG, why), NULL;
    }
    /* Not zeroed whole: every gradient overwrites its range, so only the
     * ranges of parameters without one and the padding are zeroed (a
     * memset of the whole buffer was a pass over all of a step's
     * gradients: 250 MB for a bf16 GPT-2 124M). Parameters lie end to end
     * from offset 0; the padding is [numel, padded). */
    fl_tensor *out = fl_empty(1, &u->padded, pack_dtype(u), u->cfg.device);
    if (!out || u->meta) return out;
    if (zero_range(out, u->numel, u->padded - u->numel) != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const unit_param *p = &u->params[i];
        if (!grads[i]) {
            if (zero_range(out, p->offset, p->numel) != FL_OK) {
                fl_tensor_release(out);
                return NULL;
            }
            continue;
        }
        if (grads[i]->numel != p->numel) {
            char why[256];
            snprintf(why, sizeof why, "gradient of %s has %lld elements, the parameter %lld",
                     p->name, (long long)grads[i]->numel, (long long)p->numel);
            fl_tensor_release(out);
            return unit_fail(u, FL_ERR_ARG, why), NULL;
        }
        int64_t stride[FL_MAX_DIMS];
        fl_contiguous_strides(p->ndim, p->shape, stride);
        fl_tensor *dst = fl_tensor_view_of(out, p->ndim, p->shape, stride, p->offset);
        int rc = dst ? fl_copy_(dst, grads[i]) : (int)fl_last_status();
        fl_tensor_release(dst);
        if (rc != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    if (extra) {
        fl_tensor *tmp = extra->dtype == out->dtype ? fl_tensor_retain((fl_tensor *)extra)
                                                    : fl_to(extra, out->dtype, out->device);
        int rc = tmp ? fl_add_scaled_(out, tmp, 1.0) : (int)fl_last_status();
        fl_tensor_release(tmp);
        if (rc != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

int fl_unit_reduce(fl_unit *u, fl_tensor *flat_grad) {
    if (fl_check_tensor("reduce", flat_grad, false)) return fl_last_status();
    if (flat_grad->numel != u->padded || flat_grad->dtype != pack_dtype(u))
        return unit_fail(u, FL_ERR_ARG, "reduce expects a gradient from fl_unit_pack_grads");
    if (u->reduce_in && fl_unit_finish_reduce(u) != FL_OK) return fl_last_status();
    u->reduce_in = fl_tensor_retain(flat_grad);
    if (u->group_size == 1) { /* nothing to scatter: the packed gradient is the shard */
        u->reduce_out = fl_tensor_retain(flat_grad);
        return FL_OK;
    }
    /* (not zeroed: the reduce-scatter writes all of it) */
    u->reduce_out = fl_empty(1, &u->shard_numel, u->cfg.reduce_dtype, u->cfg.device);
    if (!u->reduce_out) goto fail;
    if (u->meta) return FL_OK;
    u->reduce_work = fl_reduce_scatter(u->cfg.shard_group, u->reduce_out, flat_grad, FL_REDUCE_AVG);
    if (!u->reduce_work) goto fail;
    return FL_OK;
fail:
    fl_tensor_release(u->reduce_in);
    fl_tensor_release(u->reduce_out);
    u->reduce_in = u->reduce_out = NULL;
    return fl_last_status();
}

static int wait_work(fl_unit *u, fl_work *w, const char *what) {
    int rc = fl_work_wait(w);
    fl_work_release(w);
    if (rc == FL_OK) return FL_OK;
    char why[1024];
    snprintf(why, sizeof why, "%s of its gradient failed: %s", what, fl_last_error());
    return unit_fail(u, rc, why);
}

int fl_unit_finish_reduce(fl_unit *u) {
    if (!u->reduce_in) return FL_OK;
    fl_tensor *reduced = u->reduce_out;
    int rc = FL_OK;
    if (u->reduce_work) {
        rc = wait_work(u, u->reduce_work, "reduce-scatter");
        u->reduce_work = NULL;
    }
    fl_group *rep = u->cfg.replicate_group;
    if (rc == FL_OK && !u->meta && rep && fl_group_size(rep) > 1) {
        fl_work *w = fl_all_reduce(rep, reduced, FL_REDUCE_AVG);
        rc = w ? wait_work(u, w, "all-reduce across replicas") : (int)fl_last_status();
    }
    if (rc == FL_OK && !u->meta) {
        fl_device gdev = shard_device(u);
        if (!u->grad) { /* the first gradient: adopt the reduced buffer (it is ours) */
            u->grad = reduced->dtype == u->cfg.grad_dtype && reduced->device == gdev
                          ? fl_tensor_retain(reduced)
                          : fl_to(reduced, u->cfg.grad_dtype, gdev);
            if (!u->grad) rc = fl_last_status();
        } else {
            fl_tensor *tmp = reduced->dtype == u->grad->dtype && reduced->device == gdev
                                 ? fl_tensor_retain(reduced)
                                 : fl_to(reduced, u->grad->dtype, gdev);
            rc = tmp ? fl_add_scaled_(u->grad, tmp, 1.0) : (int)fl_last_status();
            fl_tensor_release(tmp);
        }
    } else if (rc == FL_OK && !u->grad) {
        u->grad = flat(u->cfg.grad_dtype, shard_device(u), u->shard_numel);
    }
    fl_tensor_release(u->reduce_in);
    fl_tensor_release(u->reduce_out);
    u->reduce_in = u->reduce_out = NULL;
    return rc;
}
