/*
 * pinned.c: page-locked ("pinned") host memory for CPU tensors (the storage;
 * fl_empty_pinned and fl_pin_memory, in tensor.c, make tensors of it), and the
 * asynchronous host<->device copies it makes possible.
 *
 * A pinned tensor is an ordinary CPU tensor (device cpu, every CPU kernel
 * reads it) whose storage comes from the accelerator backend's host_alloc
 * (cudaMallocHost) instead of the CPU allocator; its storage is recognised
 * by its release callback. The backend is reached through its vtable
 * (fl_pinning_backend), like every device call of core/tensor. Only a
 * copy between pinned memory and a device can be queued without blocking
 * the host (cuda_host.cu says why), which is what non-blocking transfers
 * and activation offload (core/tape/offload.c) need.
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
 *   2 * index + 2  the copy stream of cuda:index (side_stream
 *                  FL_STREAM_COPY of the backend).
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
#include "error.h"
#include "pinned.h"
#include "memory.h"
#include "backend.h"
#include "storage.h"
#include "device_pool.h"

#include <pthread.h>
#include <string.h>

static fl_device cpu_device(void) { return fl_device_make(FL_DEVICE_CPU, 0); }

static void pinned_release(void *ctx, void *data, int64_t nbytes);

bool fl_storage_is_pinned(const fl_storage *s) { return s && s->release == pinned_release; }

bool fl_is_pinned(const fl_tensor *t) { return t && fl_storage_is_pinned(t->storage); }

/* ---- the pool's device: the backend's host memory and its streams' events */

/* The backend whose host memory the pool holds: set once, before the pool
 * is made (only the pinning backend makes it). */
static const fl_backend *pin_be;

static void *host_alloc(void *ctx, int64_t nbytes) {
    (void)ctx;
    return pin_be->host_alloc(nbytes);
}
static void host_free(void *ctx, void *ptr, int64_t nbytes) {
    (void)ctx;
    (void)nbytes;
    pin_be->host_free(ptr);
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
    if ((id - 1) % 2 == 1 && pin_be->side_stream(index, FL_STREAM_COPY, &stream) != FL_OK)
        return NULL;
    return pin_be->event_record(index, stream);
}
/* An event that could not be recorded (NULL) holds nothing back. */
static bool host_done(void *ctx, void *ev) {
    (void)ctx;
    return !ev || pin_be->event_done(ev);
}
static void host_destroy(void *ctx, void *ev) {
    (void)ctx;
    if (ev) pin_be->event_destroy(ev);
}

static fl_pool *pool; /* NULL until something was pinned */
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void make_pool(void) {
    fl_pool_device dev = {.alloc = host_alloc, .free = host_free, .record_event = host_record,
                          .event_done = host_done, .event_destroy = host_destroy};
    pool = fl_pool_create(&dev, "pinned host memory");
}

/* The pool, made on first use; NULL with an error naming op when no
 * device backend offers pinned memory. */
static fl_pool *host_pool(const char *op) {
    if (!pin_be) {
        const fl_backend *be = fl_pinning_backend();
        if (!be)
            return FL_FAIL_NULL(FL_ERR_DEVICE, "%s: pinned memory needs a CUDA device: %s", op,
                                fl_device_status(FL_DEVICE_CUDA));
        pin_be = be; /* the same backend on every thread */
    }
    pthread_once(&pool_once, make_pool);
    return pool;
}

static void pinned_release(void *ctx, void *data, int64_t nbytes) {
    (void)ctx;
    bool known = pool && fl_pool_free(pool, data);
    FL_ASSERT(known); /* else a pointer the pinned pool did not hand out */
    fl_memory_note_free(cpu_device(), nbytes);
}

fl_storage *fl_pinned_storage_new(const char *op, int64_t nbytes) {
    fl_pool *p = host_pool(op);
    if (!p) return NULL;
    fl_storage *s = calloc(1, sizeof *s);
    if (!s) return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of CPU memory for a storage header", op);
    if (fl_memory_note_alloc(cpu_device(), nbytes) != FL_OK) {
        free(s);
        return NULL;
    }
    fl_clear_error();
    s->data = fl_pool_alloc(p, nbytes > 0 ? nbytes : 1, 0);
    if (!s->data) {
        char problem[256];
        snprintf(problem, sizeof problem, "%s", fl_last_error());
        fl_memory_note_free(cpu_device(), nbytes);
        fl_memory_note_failure(cpu_device());
        free(s);
        char why[768];
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: %s (%s)", op, fl_pool_oom_message(p, why, sizeof why),
                            problem);
    }
    s->nbytes = nbytes;
    s->refcount = 1;
    s->device = cpu_device();
    s->release = pinned_release;
    return s;
}

int fl_pinned_copy_async_on(fl_device device, uint64_t stream, void *dst, const void *src,
                            int64_t nbytes, bool to_host, fl_storage *pinned) {
    FL_ASSERT(fl_storage_is_pinned(pinned) && pin_be);
    int index = fl_device_index(device);
    char dev[32];
    fl_device_format(device, dev, sizeof dev);
    const fl_backend *be = fl_backend_of(device);
    FL_ASSERT(be == pin_be); /* a device of the kind whose memory is pinned */
    uint64_t id = compute_id(index);
    if (stream != 0) {
        uint64_t copy = 0;
        if (be->side_stream(index, FL_STREAM_COPY, &copy) != FL_OK)
            return fl_fail_prefix("non-blocking copy on %s", dev);
        FL_ASSERT(stream == copy); /* else a stream the pool could not name */
        id = copy_id(index);
    }
    /* Noted before queueing: a use the pool could not note (no host memory)
     * would let the block be reused under the copy, so nothing is queued. */
    if (!fl_pool_record_stream(pool, pinned->data, id))
        return fl_fail_prefix("non-blocking copy on %s", dev);
    if (be->memcpy_async(index, stream, dst, src, nbytes, to_host) != FL_OK)
        return fl_fail_prefix("non-blocking copy %s %s (%lld bytes)", to_host ? "from" : "to", dev,
                              (long long)nbytes);
    return FL_OK;
}

/* On the compute stream, the one every kernel runs on: ordered with them
 * without events (cuda_host.cu). */
int fl_pinned_copy_async(fl_device device, void *dst, const void *src, int64_t nbytes,
                         bool to_host, fl_storage *pinned) {
    return fl_pinned_copy_async_on(device, 0, dst, src, nbytes, to_host, pinned);
}

/* Nothing is pinned before the pool exists: asking never opens a backend. */
int fl_pinned_stats(int64_t *allocated, int64_t *reserved) {
    fl_pool_stats st;
    memset(&st, 0, sizeof st);
    if (pool) fl_pool_stats_get(pool, &st);
    if (allocated) *allocated = st.allocated;
    if (reserved) *reserved = st.reserved;
    return FL_OK;
}

int64_t fl_pinned_empty_cache(void) { return pool ? fl_pool_empty_cache(pool) : 0; }
