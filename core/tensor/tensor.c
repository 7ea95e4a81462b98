/*
 * tensor.c: tensor headers, reference counting, creation, and the device-
 * independent halves of fill, copy, conversion and random generation (the
 * element loops live in the backends).
 *
 * [Note: meta and fake tensors]
 * A meta tensor has device kind META; a fake tensor reports a real device
 * (cpu, cuda:N) with the FL_TENSOR_FAKE flag. Neither has storage, and both
 * go through every creation and view function so whole models can be built
 * and inspected at full size. Functions that need values (fill, copy,
 * random, element access) are no-ops on a meta tensor when they only write
 * (so model init code runs unchanged on meta) and fail with a clear message
 * when they must read.
 */
#include "error.h"
#include "shape.h"
#include "element.h"
#include "storage.h"
#include "pinned.h"
#include "flops.h"
#include "backend.h"
#include "node.h"

#include <math.h>
#include <string.h>

/* ---- headers and references -------------------------------------------- */

fl_tensor *fl_tensor_header(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device) {
    /* Views, file tensors and shards all come through here: one check makes
     * their strides and sizes safe (see [Note: shape arithmetic cannot
     * overflow] in shape.c). */
    if (fl_check_shape("tensor", ndim, shape, NULL)) return NULL;
    fl_tensor *t = calloc(1, sizeof *t);
    if (!t) return FL_FAIL_NULL(FL_ERR_OOM, "out of CPU memory for a tensor header");
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->numel *= shape[d];
    }
    fl_contiguous_strides(ndim, t->shape, t->stride);
    t->dtype = dtype;
    t->device = device;
    t->refcount = 1;
    return t;
}

fl_tensor *fl_tensor_view_of(const fl_tensor *t, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset) {
    fl_tensor *v = fl_tensor_header(ndim, shape, t->dtype, t->device);
    if (!v) return NULL;
    memcpy(v->stride, stride, (size_t)ndim * sizeof *stride);
    v->offset = offset;
    /* A view is "fake" like its base; autograd state is the op's business
     * (a recorded view gets its own grad_fn). */
    v->flags = t->flags & FL_TENSOR_FAKE;
    if (t->storage) {
        fl_storage_retain(t->storage);
        v->storage = t->storage;
        v->data = (char *)t->storage->data + offset * (int64_t)fl_dtype_size(t->dtype);
    }
    if (t->virtual_storage) {
        fl_storage_retain(t->virtual_storage);
        v->virtual_storage = t->virtual_storage;
    }
    return v;
}

fl_tensor *fl_tensor_retain(fl_tensor *t) {
    if (t) __atomic_fetch_add(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

void fl_tensor_release(fl_tensor *t) {
    if (!t) return;
    int32_t left = __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL);
    FL_ASSERT(left >= 0);
    if (left > 0) return;
    fl_storage_release(t->storage);
    fl_storage_release(t->virtual_storage);
    fl_tensor_release(t->grad);
    fl_node *fn = t->grad_fn;
    if (fn) {
        int32_t refs = __atomic_sub_fetch(&fn->refcount, 1, __ATOMIC_ACQ_REL);
        FL_ASSERT(refs >= 0);
        if (refs == 0) fn->last_release(fn); /* autograd's freeing (node.c) */
    }
    free(t);
}

int64_t fl_tensor_storage_bytes(const fl_tensor *t) {
    return t && t->storage ? t->storage->nbytes : 0;
}

bool fl_tensor_has_storage(const fl_tensor *t) { return t && t->storage != NULL; }

/* [Note: mapped files that shrink]
 * A tensor may view a mapped file (safetensors) that another process then
 * truncates; reading a page past the new end raises SIGBUS. Two defences:
 * every op checks its inputs here, and storage with a check (the
 * mapping's last page still reads, probed under the SIGBUS guard) refuses
 * with a message naming the file; copies out of a mapping (copy_from_file below) also run under a
 * SIGBUS guard, for a truncation between the check and the read. A fault
 * that still happens inside a kernel ends the process with one line naming
 * the file (core/base/fault.c). */
int fl_check_tensor(const char *op, const fl_tensor *t, bool need_data) {
    if (!t) return fl_fail(FL_ERR_ARG, "%s: tensor is NULL (freed?)", op);
    if (t->storage && t->storage->check && t->storage->check(t->storage->release_ctx) != FL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s: %s", op, fl_last_error());
        return fl_set_error(fl_last_status(), msg);
    }
    if (!need_data || t->storage) return FL_OK;
    char s[128], dev[32];
    fl_shape_str(t, s, sizeof s);
    fl_device_format(t->device, dev, sizeof dev);
    if (fl_device_kind_of(t->device) == FL_DEVICE_META)
        return fl_fail(FL_ERR_STATE, "%s: tensor of shape %s is on the meta device and has no values",
                       op, s);
    if (t->flags & FL_TENSOR_FAKE)
        return fl_fail(FL_ERR_STATE, "%s: fake tensor of shape %s on %s has no storage yet", op,
                       s, dev);
    return fl_fail(FL_ERR_STATE, "%s: tensor of shape %s on %s has no storage (freed?)", op, s,
                   dev);
}

/* Metadata-only tensors: meta, or fake on a real device. */
static bool is_metadata_only(const fl_tensor *t) {
    return fl_device_kind_of(t->device) == FL_DEVICE_META || (t->flags & FL_TENSOR_FAKE);
}

/* A CPU tensor on the stack over memory the caller owns: contiguous, never
 * retained or released, so it may be handed to fl_copy_ and nothing else. */
typedef struct host_view {
    fl_tensor t;
    fl_storage s;
} host_view;

static fl_tensor *host_view_init(host_view *v, void *data, int ndim, const int64_t *shape,
                                 fl_dtype dtype) {
    memset(v, 0, sizeof *v);
    v->t.ndim = ndim;
    v->t.numel = 1;
    for (int d = 0; d < ndim; d++) {
        v->t.shape[d] = shape[d];
        v->t.numel *= shape[d];
    }
    fl_contiguous_strides(ndim, v->t.shape, v->t.stride);
    v->t.dtype = dtype;
    v->t.device = v->s.device = fl_device_make(FL_DEVICE_CPU, 0);
    v->t.refcount = v->s.refcount = 1;
    v->t.storage = &v->s;
    v->t.data = v->s.data = data;
    v->s.nbytes = v->t.numel * (int64_t)fl_dtype_size(dtype);
    return &v->t;
}

/* ---- creation ----------------------------------------------------------- */

static int check_dtype(const char *op, fl_dtype dtype) {
    if ((int)dtype < 0 || dtype >= FL_DTYPE_COUNT)
        return fl_fail(FL_ERR_ARG, "%s: invalid dtype %d", op, (int)dtype);
    return FL_OK;
}

static int check_device(const char *op, fl_device device) {
    char name[32];
    if (fl_device_format(device, name, sizeof name) != FL_OK)
        return fl_fail(FL_ERR_ARG, "%s: invalid device id %d", op, (int)device);
    return FL_OK;
}

static fl_tensor *create(const char *op, int ndim, const int64_t *shape, fl_dtype dtype,
                         fl_device device, bool fake) {
    int64_t numel;
    if (fl_check_shape(op, ndim, shape, &numel) || check_dtype(op, dtype) ||
        check_device(op, device))
        return NULL;
    if ((size_t)numel > (size_t)INT64_MAX / fl_dtype_size(dtype))
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: %lld elements of %s overflow a byte count", op,
                            (long long)numel, fl_dtype_name(dtype));
    fl_tensor *t = fl_tensor_header(ndim, shape, dtype, device);
    if (!t) return NULL;
    if (fake || fl_device_kind_of(device) == FL_DEVICE_META) {
        if (fl_device_kind_of(device) != FL_DEVICE_META) t->flags |= FL_TENSOR_FAKE;
        /* [Note: virtual storage] (storage.c) */
        t->virtual_storage = fl_storage_virtual(numel * (int64_t)fl_dtype_size(dtype));
        if (!t->virtual_storage) {
            free(t);
            return NULL;
        }
        return t;
    }
    t->storage = fl_storage_new(device, numel * (int64_t)fl_dtype_size(dtype));
    if (!t->storage) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s: %s", op, fl_last_error());
        fl_set_error(fl_last_status(), msg);
        free(t);
        return NULL;
    }
    t->data = t->storage->data;
    return t;
}

fl_tensor *fl_empty(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device) {
    return create("empty", ndim, shape, dtype, device, false);
}

fl_tensor *fl_shape_carrier(int ndim, const int64_t *shape, fl_dtype dtype) {
    return fl_tensor_header(ndim, shape, dtype, fl_device_make(FL_DEVICE_META, 0));
}

fl_tensor *fl_fake(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device) {
    return create("fake", ndim, shape, dtype, device, true);
}

static fl_tensor *filled(const char *op, int ndim, const int64_t *shape, double value,
                         fl_dtype dtype, fl_device device) {
    fl_tensor *t = create(op, ndim, shape, dtype, device, false);
    if (t && fl_fill_(t, value) != FL_OK) {
        fl_tensor_release(t);
        return NULL;
    }
    return t;
}

fl_tensor *fl_zeros(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device) {
    return filled("zeros", ndim, shape, 0.0, dtype, device);
}

fl_tensor *fl_full(int ndim, const int64_t *shape, double value, fl_dtype dtype,
                   fl_device device) {
    return filled("full", ndim, shape, value, dtype, device);
}

fl_tensor *fl_arange(double start, double end, double step, fl_dtype dtype, fl_device device) {
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step))
        return FL_FAIL_NULL(FL_ERR_ARG, "arange: start %g, end %g, step %g must be finite with "
                            "step != 0", start, end, step);
    double count = ceil((end - start) / step);
    if (count < 0) count = 0;
    if (count > 9.0e18)
        return FL_FAIL_NULL(FL_ERR_ARG, "arange: %g elements are too many", count);
    int64_t n = (int64_t)count;
    fl_tensor *t = create("arange", 1, &n, dtype, device, false);
    if (!t || is_metadata_only(t)) return t;
    /* Compute on the host in f64 (exact for integers up to 2^53), then
     * convert and place on the device. */
    double *values = malloc((size_t)(n > 0 ? n : 1) * sizeof *values);
    if (!values) {
        fl_tensor_release(t);
        return FL_FAIL_NULL(FL_ERR_OOM, "arange: out of CPU memory for %lld values",
                            (long long)n);
    }
    for (int64_t i = 0; i < n; i++) values[i] = start + (double)i * step;
    host_view v;
    int rc = fl_copy_(t, host_view_init(&v, values, 1, &n, FL_F64));
    free(values);
    if (rc != FL_OK) {
        fl_tensor_release(t);
        return NULL;
    }
    return t;
}

static int copy_impl(fl_tensor *dst, const fl_tensor *src, bool non_blocking, bool count);

fl_tensor *fl_from_host(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                        const void *src, fl_dtype src_dtype, int64_t n) {
    int64_t numel;
    if (fl_check_shape("from_host", ndim, shape, &numel) || check_dtype("from_host", src_dtype))
        return NULL;
    if (n != numel) {
        char s[128];
        fl_shape_format(ndim, shape, s, sizeof s);
        return FL_FAIL_NULL(FL_ERR_ARG, "from_host: %lld values given for shape %s (%lld elements)",
                            (long long)n, s, (long long)numel);
    }
    if (n > 0 && !src) return FL_FAIL_NULL(FL_ERR_ARG, "from_host: source pointer is NULL");
    fl_tensor *t = create("from_host", ndim, shape, dtype, device, false);
    /* What is written on the device, counted on meta too (where nothing is). */
    if (t) fl_count_bytes("from_host", 1, (const fl_tensor *[]){t});
    if (!t || is_metadata_only(t)) return t;
    host_view v;
    if (copy_impl(t, host_view_init(&v, (void *)src, ndim, shape, src_dtype), false, false) != FL_OK) {
        fl_tensor_release(t);
        return NULL;
    }
    return t;
}

/* ---- fill, copy, random ------------------------------------------------- */

int fl_fill_(fl_tensor *t, double value) {
    if (fl_check_tensor("fill_", t, false)) return fl_last_status();
    if (is_metadata_only(t)) return FL_OK;
    if (fl_check_tensor("fill_", t, true)) return fl_last_status();
    return fl_backend_of(t->device)->fill(t, value);
}

static int random_fill(const char *op, fl_tensor *t, const fl_random_spec *spec) {
    if (fl_check_tensor(op, t, false)) return fl_last_status();
    if (is_metadata_only(t)) return FL_OK;
    if (fl_check_tensor(op, t, true)) return fl_last_status();
    const fl_backend *be = fl_backend_of(t->device);
    if (!be->random) {
        /* A device without a random kernel: generate on the host, copy. */
        fl_tensor *host = fl_empty(t->ndim, t->shape, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
        if (!host) return fl_last_status();
        int rc = fl_cpu_backend.random(host, spec);
        if (rc == FL_OK) rc = fl_copy_(t, host);
        fl_tensor_release(host);
        return rc;
    }
    return be->random(t, spec);
}

int fl_uniform_(fl_tensor *t, uint64_t seed, uint64_t stream, uint64_t first_index, double low,
                double high) {
    if (!(low <= high) || !isfinite(low) || !isfinite(high))
        return fl_fail(FL_ERR_ARG, "uniform_: need finite low <= high, got [%g, %g)", low, high);
    fl_random_spec spec = {.kind = FL_RANDOM_UNIFORM, .seed = seed, .stream = stream,
                           .first_index = first_index, .a = low, .b = high};
    return random_fill("uniform_", t, &spec);
}

int fl_normal_(fl_tensor *t, uint64_t seed, uint64_t stream, uint64_t first_index, double mean,
               double std) {
    if (!(std >= 0) || !isfinite(std) || !isfinite(mean))
        return fl_fail(FL_ERR_ARG, "normal_: need finite mean and std >= 0, got mean %g, std %g",
                       mean, std);
    fl_random_spec spec = {.kind = FL_RANDOM_NORMAL, .seed = seed, .stream = stream,
                           .first_index = first_index, .a = mean, .b = std};
    return random_fill("normal_", t, &spec);
}

int fl_randint_(fl_tensor *t, uint64_t seed, uint64_t stream, uint64_t first_index, int64_t low,
                int64_t high) {
    if (low >= high)
        return fl_fail(FL_ERR_ARG, "randint_: empty range [%lld, %lld)", (long long)low,
                       (long long)high);
    fl_random_spec spec = {.kind = FL_RANDOM_INT, .seed = seed, .stream = stream,
                           .first_index = first_index, .ilow = low, .ihigh = high};
    return random_fill("randint_", t, &spec);
}

/* Broadcast src's geometry to dst's shape (numpy rules). */
static int broadcast_to(const char *op, const fl_tensor *src, const fl_tensor *dst,
                        int64_t *stride) {
    int shift = dst->ndim - src->ndim;
    bool ok = shift >= 0;
    for (int d = 0; ok && d < dst->ndim; d++) {
        int sd = d - shift;
        if (sd < 0) {
            stride[d] = 0;
        } else if (src->shape[sd] == dst->shape[d]) {
            stride[d] = src->stride[sd];
        } else if (src->shape[sd] == 1) {
            stride[d] = 0;
        } else {
            ok = false;
        }
    }
    if (!ok) {
        char a[128], b[128];
        return fl_fail(FL_ERR_ARG, "%s: source of shape %s does not broadcast to shape %s", op,
                       fl_shape_str(src, a, sizeof a), fl_shape_str(dst, b, sizeof b));
    }
    return FL_OK;
}

/* One transfer between a host tensor and a device tensor of the same
 * shape and dtype, with no staging buffer, when the host side is dense (a
 * strided device source is made dense on the device first). Queued without
 * blocking when asked and the host side is pinned (pinned.c). Returns -1
 * when it does not apply. */
static int direct_transfer(fl_tensor *dst, const fl_tensor *src, bool non_blocking) {
    bool to_host = fl_device_kind_of(dst->device) == FL_DEVICE_CPU;
    const fl_tensor *host = to_host ? dst : src, *dev = to_host ? src : dst;
    if (fl_device_kind_of(host->device) != FL_DEVICE_CPU ||
        fl_device_kind_of(dev->device) == FL_DEVICE_CPU || dst->dtype != src->dtype ||
        dst->ndim != src->ndim || !fl_tensor_is_contiguous(host) ||
        (!to_host && !fl_tensor_is_contiguous(dev)))
        return -1;
    for (int d = 0; d < dst->ndim; d++)
        if (dst->shape[d] != src->shape[d]) return -1;
    fl_tensor *dense = to_host ? fl_tensor_contiguous(src) : fl_tensor_retain(dst);
    if (!dense) return fl_last_status();
    int64_t nbytes = dense->numel * (int64_t)fl_dtype_size(dense->dtype);
    int index = fl_device_index(dense->device);
    const fl_backend *be = fl_backend_of(dense->device);
    int rc;
    if (non_blocking && fl_storage_is_pinned(host->storage))
        rc = to_host ? fl_pinned_copy_async(dense->device, dst->data, dense->data, nbytes, true,
                                            dst->storage)
                     : fl_pinned_copy_async(dense->device, dst->data, src->data, nbytes, false,
                                            src->storage);
    else
        rc = to_host ? be->to_host(index, dst->data, dense->data, nbytes)
                     : be->from_host(index, dst->data, src->data, nbytes);
    fl_tensor_release(dense);
    return rc;
}

/* Copy between different devices: directly when the layouts allow, else
 * through a contiguous host buffer. */
static int copy_across_devices(fl_tensor *dst, const fl_tensor *src, bool non_blocking) {
    fl_device cpu = fl_device_make(FL_DEVICE_CPU, 0);
    int rc = direct_transfer(dst, src, non_blocking);
    if (rc >= 0) return rc;
    if (fl_device_kind_of(src->device) != FL_DEVICE_CPU) {
        /* device -> host: bring src's bytes over, then let the CPU kernel
         * convert and scatter into dst (which may itself be remote). */
        fl_tensor *dense = fl_tensor_contiguous(src);
        if (!dense) return fl_last_status();
        fl_tensor *host = fl_empty(dense->ndim, dense->shape, dense->dtype, cpu);
        rc = host ? FL_OK : fl_last_status();
        if (rc == FL_OK)
            rc = fl_backend_of(dense->device)
                     ->to_host(fl_device_index(dense->device), host->data, dense->data,
                               dense->numel * (int64_t)fl_dtype_size(dense->dtype));
        fl_tensor_release(dense);
        if (rc == FL_OK) rc = fl_copy_(dst, host);
        fl_tensor_release(host);
        return rc;
    }
    /* host -> device: convert and densify on the host, then one transfer. */
    if (!fl_tensor_is_contiguous(dst)) {
        fl_tensor *tmp = fl_empty(dst->ndim, dst->shape, dst->dtype, dst->device);
        if (!tmp) return fl_last_status();
        rc = fl_copy_(tmp, src);
        if (rc == FL_OK) rc = fl_copy_(dst, tmp);
        fl_tensor_release(tmp);
        return rc;
    }
    fl_tensor *host = fl_empty(dst->ndim, dst->shape, dst->dtype, cpu);
    if (!host) return fl_last_status();
    rc = fl_copy_(host, src);
    if (rc == FL_OK)
        rc = fl_backend_of(dst->device)
                 ->from_host(fl_device_index(dst->device), dst->data, host->data,
                             dst->numel * (int64_t)fl_dtype_size(dst->dtype));
    fl_tensor_release(host);
    return rc;
}

/* Copy out of a mapped file (src->storage->file; see [Note: mapped files
 * that shrink]): the bytes src spans are first copied, on this thread and
 * under a SIGBUS guard (fault.c), into memory of our own, and the kernel
 * (which may run on several threads) reads them there. A file truncated by
 * another process since it was mapped is an error naming it, not a crash. */
static int copy_from_file(fl_tensor *dst, const fl_tensor *view) {
    int64_t esize = (int64_t)fl_dtype_size(view->dtype), span = 1;
    for (int d = 0; d < view->ndim; d++) {
        if (view->stride[d] < 0)
            return fl_fail(FL_ERR_UNSUPPORTED, "copy_: negative strides from the mapped file %s",
                           view->storage->file);
        span += (view->shape[d] - 1) * view->stride[d];
    }
    size_t nbytes = (size_t)(span * esize);
    const char *from = (const char *)view->data;
    void *buf = malloc(nbytes);
    if (!buf) return fl_fail(FL_ERR_OOM, "copy_: out of CPU memory for %zu bytes of %s", nbytes,
                             view->storage->file);
    if (fl_guarded_memcpy(buf, from, nbytes) != 0) {
        free(buf);
        return fl_fail(FL_ERR_IO, "%s: the file shrank while it was mapped (truncated or rewritten "
                                  "in place by another process?): bytes %lld to %lld of its mapping "
                                  "cannot be read",
                       view->storage->file, (long long)(from - (const char *)view->storage->data),
                       (long long)(from - (const char *)view->storage->data + (int64_t)nbytes));
    }
    fl_storage s = *view->storage;
    s.data = buf;
    s.nbytes = (int64_t)nbytes;
    s.file = NULL;
    fl_tensor own = *view;
    own.storage = &s;
    own.data = buf;
    own.offset = 0;
    int rc = fl_backend_of(dst->device)->copy(dst, &own);
    free(buf);
    return rc;
}

/* count: whether the copy counts in fl_bytes_moved (a copy made by a caller
 * that counts itself, such as fl_from_host, does not). */
static int copy_impl(fl_tensor *dst, const fl_tensor *src, bool non_blocking, bool count) {
    if (fl_check_tensor("copy_", dst, false) || fl_check_tensor("copy_", src, false))
        return fl_last_status();
    int64_t stride[FL_MAX_DIMS];
    if (broadcast_to("copy_", src, dst, stride)) return fl_last_status();
    /* (a copy between devices moves bytes over a link, not through one
     * device's memory: not counted) */
    if (count && dst->device == src->device) fl_count_bytes("copy", 2, (const fl_tensor *[]){src, dst});
    if (is_metadata_only(dst)) return FL_OK;
    if (fl_check_tensor("copy_ (destination)", dst, true) ||
        fl_check_tensor("copy_ (source)", src, true))
        return fl_last_status();
    if (dst->device != src->device) return copy_across_devices(dst, src, non_blocking);
    /* The source seen with dst's shape (stride 0 where it broadcasts). */
    fl_tensor view = *src;
    view.ndim = dst->ndim;
    view.numel = dst->numel;
    memcpy(view.shape, dst->shape, sizeof view.shape);
    memcpy(view.stride, stride, sizeof view.stride);
    if (src->storage->file && view.numel > 0) return copy_from_file(dst, &view);
    return fl_backend_of(dst->device)->copy(dst, &view);
}

int fl_copy_(fl_tensor *dst, const fl_tensor *src) { return copy_impl(dst, src, false, true); }

int fl_copy_non_blocking_(fl_tensor *dst, const fl_tensor *src) {
    return copy_impl(dst, src, true, true);
}

/* ---- copies that create tensors ------------------------------------------
 * Not differentiable here: core/ops/copy.c gives fl_clone, fl_contiguous,
 * fl_to and fl_to_non_blocking their backward nodes. */

fl_tensor *fl_tensor_clone(const fl_tensor *t) {
    if (fl_check_tensor("clone", t, false)) return NULL;
    fl_tensor *c = is_metadata_only(t) ? fl_fake(t->ndim, t->shape, t->dtype, t->device)
                                       : fl_empty(t->ndim, t->shape, t->dtype, t->device);
    if (c && fl_copy_(c, t) != FL_OK) {
        fl_tensor_release(c);
        return NULL;
    }
    return c;
}

fl_tensor *fl_tensor_contiguous(const fl_tensor *t) {
    if (fl_check_tensor("contiguous", t, false)) return NULL;
    if (fl_tensor_is_contiguous(t)) return fl_tensor_retain((fl_tensor *)t);
    return fl_tensor_clone(t);
}

static fl_tensor *to_blocking(const fl_tensor *t, fl_dtype dtype, fl_device device) {
    bool metadata = fl_device_kind_of(device) == FL_DEVICE_META || is_metadata_only(t);
    fl_tensor *r = metadata ? fl_fake(t->ndim, t->shape, dtype, device)
                            : fl_empty(t->ndim, t->shape, dtype, device);
    if (r && !metadata && fl_copy_(r, t) != FL_OK) {
        fl_tensor_release(r);
        return NULL;
    }
    return r;
}

fl_tensor *fl_tensor_to(const fl_tensor *t, fl_dtype dtype, fl_device device, bool non_blocking) {
    if (fl_check_tensor("to", t, false) || check_dtype("to", dtype) || check_device("to", device))
        return NULL;
    if (t->dtype == dtype && t->device == device) return fl_tensor_retain((fl_tensor *)t);
    if (!non_blocking || is_metadata_only(t) || fl_device_kind_of(device) == FL_DEVICE_META)
        return to_blocking(t, dtype, device);
    /* Device to host lands in pinned memory, or the copy could not be
     * queued (PyTorch does the same). */
    bool pin = fl_device_kind_of(device) == FL_DEVICE_CPU &&
               fl_device_kind_of(t->device) != FL_DEVICE_CPU &&
               fl_backend_of(t->device)->memcpy_async != NULL;
    fl_tensor *r = pin ? fl_empty_pinned(t->ndim, t->shape, dtype)
                       : fl_empty(t->ndim, t->shape, dtype, device);
    if (r && copy_impl(r, t, true, true) != FL_OK) {
        fl_tensor_release(r);
        return NULL;
    }
    return r;
}

/* ---- pinned tensors ---------------------------------------------------------
 * Their storage comes from pinned.c, which calls nothing of this file. */

static fl_tensor *pinned_tensor(const char *op, int ndim, const int64_t *shape, fl_dtype dtype) {
    int64_t numel;
    if (fl_check_shape(op, ndim, shape, &numel)) return NULL;
    if ((int)dtype < 0 || dtype >= FL_DTYPE_COUNT)
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: invalid dtype %d", op, (int)dtype);
    fl_storage *s = fl_pinned_storage_new(op, numel * (int64_t)fl_dtype_size(dtype));
    if (!s) return NULL;
    fl_tensor *t = fl_tensor_header(ndim, shape, dtype, fl_device_make(FL_DEVICE_CPU, 0));
    if (!t) {
        fl_storage_release(s);
        return NULL;
    }
    t->storage = s;
    t->data = s->data;
    return t;
}

fl_tensor *fl_empty_pinned(int ndim, const int64_t *shape, fl_dtype dtype) {
    return pinned_tensor("empty_pinned", ndim, shape, dtype);
}

fl_tensor *fl_pin_memory(const fl_tensor *t) {
    if (fl_check_tensor("pin_memory", t, false)) return NULL;
    if (fl_device_kind_of(t->device) != FL_DEVICE_CPU) {
        char dev[32];
        fl_device_format(t->device, dev, sizeof dev);
        return FL_FAIL_NULL(FL_ERR_ARG, "pin_memory: only cpu tensors can be pinned, this one is "
                                        "on %s", dev);
    }
    if (fl_check_tensor("pin_memory", t, true)) return NULL;
    if (fl_is_pinned(t)) return fl_tensor_retain((fl_tensor *)t);
    fl_tensor *p = pinned_tensor("pin_memory", t->ndim, t->shape, t->dtype);
    if (!p) return NULL;
    /* fl_copy_ records no node: pinning is about where bytes live; the
     * result is a new leaf, as PyTorch's pin_memory of a leaf. */
    int rc = fl_copy_(p, t);
    if (rc != FL_OK) {
        fl_tensor_release(p);
        return NULL;
    }
    return p;
}

/* ---- element access ----------------------------------------------------- */

static int element_address(const char *op, const fl_tensor *t, const int64_t *index,
                           const void **out) {
    if (fl_check_tensor(op, t, true)) return fl_last_status();
    if (fl_device_kind_of(t->device) != FL_DEVICE_CPU)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s: element access needs a cpu tensor (use :to('cpu'))",
                       op);
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (index[d] < 0 || index[d] >= t->shape[d]) {
            char s[128];
            return fl_fail(FL_ERR_ARG, "%s: index %lld out of range for dim %d of shape %s", op,
                           (long long)index[d], d, fl_shape_str(t, s, sizeof s));
        }
        off += index[d] * t->stride[d];
    }
    *out = (const char *)t->data + off * (int64_t)fl_dtype_size(t->dtype);
    return FL_OK;
}

/* [Note: NaNs handed to Lua]
 * LuaJIT keeps its tagged values (nil, booleans, pointers) in the NaN space
 * of a double and trusts doubles read through the FFI to be numbers: a NaN
 * whose bits happen to be all ones (uninitialised memory, a poisoned
 * device buffer) reads back as nil. The values the host reads as doubles
 * (fl_get, fl_to_host into f64) therefore leave as the one quiet NaN. */
int fl_get(const fl_tensor *t, const int64_t *index, double *out) {
    const void *p;
    if (element_address("get", t, index, &p)) return fl_last_status();
    double v = fl_load_f64(p, t->dtype);
    *out = v == v ? v : (double)NAN; /* [Note: NaNs handed to Lua] */
    return FL_OK;
}

int fl_get_i64(const fl_tensor *t, const int64_t *index, int64_t *out) {
    const void *p;
    if (element_address("get", t, index, &p)) return fl_last_status();
    *out = fl_load_i64(p, t->dtype);
    return FL_OK;
}

int fl_set(fl_tensor *t, const int64_t *index, double value) {
    const void *p;
    if (element_address("set", t, index, &p)) return fl_last_status();
    fl_store_f64((void *)p, t->dtype, value);
    return FL_OK;
}

int fl_to_host(const fl_tensor *t, void *dst, fl_dtype dst_dtype, int64_t n) {
    if (fl_check_tensor("to_host", t, true) || check_dtype("to_host", dst_dtype))
        return fl_last_status();
    if (n != t->numel) {
        char s[128];
        return fl_fail(FL_ERR_ARG, "to_host: buffer holds %lld values, tensor of shape %s has %lld",
                       (long long)n, fl_shape_str(t, s, sizeof s), (long long)t->numel);
    }
    host_view v;
    int rc = fl_copy_(host_view_init(&v, dst, t->ndim, t->shape, dst_dtype), t);
    if (rc == FL_OK && dst_dtype == FL_F64) {
        double *d = dst;
        for (int64_t i = 0; i < n; i++)
            if (d[i] != d[i]) d[i] = (double)NAN;
    }
    return rc;
}
