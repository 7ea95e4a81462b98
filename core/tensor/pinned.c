/*
 * pinned.c: page-locked ("pinned") host memory for CPU tensors, and the
 * asynchronous host<->device copies it makes possible.
 *
 * A pinned tensor is an ordinary CPU tensor (device cpu, every CPU kernel
 * reads it) whose storage comes from cudaMallocHost instead of the CPU
 * allocator; its storage is recognised by its release callback. Only a
 * copy between pinned memory and a device can be queued without blocking
 * the host (cuda_host.cu says why), which is what non-blocking transfers
 * and activation offload (core/autograd/offload.c) need.
 *
 * cudaMallocHost is slow (it maps and locks pages, often milliseconds) and
 * cudaFreeHost synchronises the device, so pinned blocks come from a
 * caching pool, the device pool's policy (core/tensor/device_pool.c) over
 * cudaMallocHost, as PyTorch's CachingHostAllocator. Each asynchronous
 * copy records the stream it was queued on as a user of the block
 * (fl_pool_record_stream); a freed block is then held back until an event
 * recorded at free time on each such stream is done, so freeing a pinned
 * tensor never races with a copy still reading or writing it, and the
 * host never waits for one either.
 *
 * [Note: pinned stream ids]
 * The one pinned pool serves every device, and a cudaStream_t does not
 * name its device (the compute stream is the legacy default stream, 0, on
 * all of them), so the pool's stream ids encode the device and the
 * stream, not a cudaStream_t:
 *   0              the host, which owns every block (allocations);
 *   2 * index + 1  the compute stream of cuda:index (cudaStream_t 0);
 *   2 * index + 2  the copy stream of cuda:index (fl_cuda_copy_stream).
 * host_record turns an id back into (device, cudaStream_t) to record its
 * event. The device pools need no such encoding: one per device, their
 * ids are the cudaStream_t values themselves (cuda_backend.c).
 *
 * Pinned bytes count in the cpu device's memory statistics (in use, peak,
 * limit): they are host memory.
 *
 * Without a CUDA device there is nothing to pin for: pinning fails with a
 * message saying so (as PyTorch), rather than handing back pageable memory
 * that would silently make "non-blocking" copies blocking.
 */
#include "internal.h"
#include "device_pool.h"

#ifdef FL_HAVE_CUDA
#include "../cuda/cuda_backend.h"
#endif

#include <pthread.h>
#include <string.h>

static fl_device cpu_device(void) { return fl_device_make(FL_DEVICE_CPU, 0); }

static void pinned_release(void *ctx, void *data, int64_t nbytes);

bool fl_storage_is_pinned(const fl_storage *s) { return s && s->release == pinned_release; }

bool fl_is_pinned(const fl_tensor *t) { return t && fl_storage_is_pinned(t->storage); }

#ifdef FL_HAVE_CUDA

/* ---- the pool's device: cudaMallocHost and the streams' events ---------- */

static void *host_alloc(void *ctx, int64_t nbytes) {
    (void)ctx;
    return fl_cuda_host_alloc(nbytes);
}
static void host_free(void *ctx, void *ptr, int64_t nbytes) {
    (void)ctx;
    (void)nbytes;
    fl_cuda_host_free(ptr);
}
/* [Note: pinned stream ids] */
static uint64_t compute_id(int index) { return 2 * (uint64_t)index + 1; }
static uint64_t copy_id(int index) { return 2 * (uint64_t)index + 2; }

/* An event on the stream `id` names; NULL (holds nothing back) for the
 * host, or when it cannot be recorded. A copy stream id is only recorded
 * after a copy went there, so its stream exists. */
static void *host_record(void *ctx, uint64_t id) {
    (void)ctx;
    if (id == 0) return NULL;
    int index = (int)((id - 1) / 2);
    uint64_t stream = 0;
    if ((id - 1) % 2 == 1 && fl_cuda_copy_stream(index, &stream) != 0) return NULL;
    return fl_cuda_event_record(index, stream);
}
/* An event that could not be recorded (NULL) holds nothing back. */
static bool host_done(void *ctx, void *ev) {
    (void)ctx;
    return !ev || fl_cuda_event_done(ev);
}
static void host_destroy(void *ctx, void *ev) {
    (void)ctx;
    if (ev) fl_cuda_event_destroy(ev);
}

static fl_pool *pool;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void make_pool(void) {
    fl_pool_device dev = {.alloc = host_alloc, .free = host_free, .record_event = host_record,
                          .event_done = host_done, .event_destroy = host_destroy};
    pool = fl_pool_create(&dev, "pinned host memory");
}

static fl_pool *host_pool(void) {
    pthread_once(&pool_once, make_pool);
    return pool;
}

static void pinned_release(void *ctx, void *data, int64_t nbytes) {
    (void)ctx;
    bool known = fl_pool_free(host_pool(), data);
    FL_ASSERT(known); /* else a pointer the pinned pool did not hand out */
    fl_memory_note_free(cpu_device(), nbytes);
}

fl_storage *fl_pinned_storage_new(const char *op, int64_t nbytes) {
    if (fl_cuda_device_count() == 0)
        return FL_FAIL_NULL(FL_ERR_DEVICE, "%s: pinned memory needs a CUDA device: %s", op,
                            fl_cuda_status());
    fl_storage *s = calloc(1, sizeof *s);
    if (!s) return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of host memory for a storage header", op);
    if (fl_memory_note_alloc(cpu_device(), nbytes) != FL_OK) {
        free(s);
        return NULL;
    }
    fl_pool *p = host_pool();
    s->data = p ? fl_pool_alloc(p, nbytes > 0 ? nbytes : 1, 0) : NULL;
    if (!s->data) {
        fl_memory_note_free(cpu_device(), nbytes);
        fl_memory_note_failure(cpu_device());
        free(s);
        char why[768];
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: %s (%s)", op,
                            p ? fl_pool_oom_message(p, why, sizeof why)
                              : "no pool for pinned memory",
                            fl_cuda_host_problem());
    }
    s->nbytes = nbytes;
    s->refcount = 1;
    s->device = cpu_device();
    s->release = pinned_release;
    return s;
}

int fl_pinned_copy_async_on(int index, uint64_t stream, void *dst, const void *src,
                            int64_t nbytes, bool to_host, fl_storage *pinned) {
    FL_ASSERT(fl_storage_is_pinned(pinned));
    uint64_t id = compute_id(index);
    if (stream != 0) {
        uint64_t copy = 0;
        if (fl_cuda_copy_stream(index, &copy) != 0)
            return fl_fail(FL_ERR_DEVICE, "non-blocking copy on cuda:%d: %s", index,
                           fl_cuda_host_problem());
        FL_ASSERT(stream == copy); /* else a stream the pool could not name */
        id = copy_id(index);
    }
    int rc = stream == 0 ? fl_cuda_memcpy_async(index, dst, src, nbytes, to_host)
                         : fl_cuda_memcpy_async_on(index, stream, dst, src, nbytes, to_host);
    if (rc != 0)
        return fl_fail(FL_ERR_DEVICE, "non-blocking copy %s cuda:%d (%lld bytes): %s",
                       to_host ? "from" : "to", index, (long long)nbytes, fl_cuda_host_problem());
    bool known = fl_pool_record_stream(host_pool(), pinned->data, id);
    FL_ASSERT(known);
    return FL_OK;
}

/* On the compute stream, the one every kernel runs on: ordered with them
 * without events (cuda_host.cu). */
int fl_pinned_copy_async(fl_device device, void *dst, const void *src, int64_t nbytes,
                         bool to_host, fl_storage *pinned) {
    return fl_pinned_copy_async_on(fl_device_index(device), 0, dst, src, nbytes, to_host, pinned);
}

int fl_pinned_stats(int64_t *allocated, int64_t *reserved) {
    fl_pool_stats st;
    memset(&st, 0, sizeof st);
    if (fl_cuda_device_count() > 0) fl_pool_stats_get(host_pool(), &st);
    if (allocated) *allocated = st.allocated;
    if (reserved) *reserved = st.reserved;
    return FL_OK;
}

int64_t fl_pinned_empty_cache(void) {
    return fl_cuda_device_count() > 0 ? fl_pool_empty_cache(host_pool()) : 0;
}

#else /* no CUDA backend: nothing can be pinned */

static void pinned_release(void *ctx, void *data, int64_t nbytes) {
    (void)ctx;
    (void)data;
    (void)nbytes;
    FL_ASSERT(!"pinned storage without the CUDA backend");
}

fl_storage *fl_pinned_storage_new(const char *op, int64_t nbytes) {
    (void)nbytes;
    return FL_FAIL_NULL(FL_ERR_DEVICE, "%s: pinned memory needs a CUDA device: %s", op,
                        fl_cuda_status());
}

int fl_pinned_copy_async(fl_device device, void *dst, const void *src, int64_t nbytes,
                         bool to_host, fl_storage *pinned) {
    (void)device, (void)dst, (void)src, (void)nbytes, (void)to_host, (void)pinned;
    return fl_fail(FL_ERR_DEVICE, "non-blocking copy: %s", fl_cuda_status());
}

int fl_pinned_stats(int64_t *allocated, int64_t *reserved) {
    if (allocated) *allocated = 0;
    if (reserved) *reserved = 0;
    return FL_OK;
}

int64_t fl_pinned_empty_cache(void) { return 0; }

#endif /* FL_HAVE_CUDA */

/* ---- pinned tensors ------------------------------------------------------------ */

static fl_tensor *pinned_tensor(const char *op, int ndim, const int64_t *shape, fl_dtype dtype) {
    int64_t numel;
    if (fl_check_shape(op, ndim, shape, &numel)) return NULL;
    if ((int)dtype < 0 || dtype >= FL_DTYPE_COUNT)
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: invalid dtype %d", op, (int)dtype);
    fl_storage *s = fl_pinned_storage_new(op, numel * (int64_t)fl_dtype_size(dtype));
    if (!s) return NULL;
    fl_tensor *t = fl_tensor_header(ndim, shape, dtype, cpu_device());
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
    /* A copy outside autograd: pinning is about where bytes live; the
     * result is a new leaf, as PyTorch's pin_memory of a leaf. */
    bool was = fl_set_grad_enabled(false);
    int rc = fl_copy_(p, t);
    fl_set_grad_enabled(was);
    if (rc != FL_OK) {
        fl_tensor_release(p);
        return NULL;
    }
    return p;
}
