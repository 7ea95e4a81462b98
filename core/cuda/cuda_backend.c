/*
 * cuda_backend.c: the vtable of the cuda device (compiled only with the
 * CUDA backend). Memory comes from one caching pool per device
 * (core/tensor/device_pool.c over cudaMalloc and CUDA events); transfers go
 * to cuda_runtime.cu; the element kernels (strided copy with conversion,
 * fill, uniform and int random fills) to cuda_copy.cu.
 */
#ifdef FL_HAVE_CUDA
#include "internal.h"
#include "cuda_backend.h"
#include "cuda_elem.h"
#include "../tensor/device_pool.h"

#include <pthread.h>

bool fl_cuda_built(void) { return true; }
#ifdef FL_CUDASIM
bool fl_cuda_simulated(void) { return true; }
#else
bool fl_cuda_simulated(void) { return false; }
#endif
int fl_cuda_device_count(void) { return fl_cuda_probe(); }
const char *fl_cuda_status(void) { return fl_cuda_probe_status(); }

/* ---- the caching pools ---------------------------------------------------- */

/* The pool's callbacks get the device index as their context. */
/* A refusal is retried once after the gathered ranges waiting to be
 * unmapped give their memory back (cuda_vm.cu); the pool then empties its
 * own cache and tries again. */
static void *raw_alloc(void *ctx, int64_t nbytes) {
    int index = (int)(intptr_t)ctx;
    void *p = fl_cuda_malloc(index, nbytes);
    if (!p && fl_cuda_vm_release_pending(index) > 0) p = fl_cuda_malloc(index, nbytes);
    return p;
}
static void raw_free(void *ctx, void *ptr, int64_t nbytes) {
    (void)nbytes;
    fl_cuda_nccl_settle_quietly(); /* cudaFree waits for the whole device */
    fl_cuda_free((int)(intptr_t)ctx, ptr);
}
static void *raw_record(void *ctx, uint64_t stream) {
    return fl_cuda_event_record((int)(intptr_t)ctx, stream);
}
/* An event that could not be recorded (NULL) never holds a block back. */
static bool raw_done(void *ctx, void *ev) {
    (void)ctx;
    return !ev || fl_cuda_event_done(ev);
}
static void raw_destroy(void *ctx, void *ev) {
    (void)ctx;
    if (ev) fl_cuda_event_destroy(ev);
}
static int raw_info(void *ctx, int64_t *free_bytes, int64_t *total) {
    return fl_cuda_mem_info((int)(intptr_t)ctx, free_bytes, total);
}

static fl_pool *pools[FL_MAX_DEVICE_INDEX + 1];
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;

/* The pool of device `index`, made on first use; NULL for a device that
 * does not exist. Pools live as long as the process. */
static fl_pool *pool_of(int index) {
    if (index < 0 || index > FL_MAX_DEVICE_INDEX || index >= fl_cuda_probe()) return NULL;
    pthread_mutex_lock(&pools_lock);
    if (!pools[index]) {
        fl_pool_device dev = {.ctx = (void *)(intptr_t)index, .alloc = raw_alloc, .free = raw_free,
                              .record_event = raw_record, .event_done = raw_done,
                              .event_destroy = raw_destroy, .mem_info = raw_info};
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", index);
        pools[index] = fl_pool_create(&dev, name);
    }
    fl_pool *p = pools[index];
    pthread_mutex_unlock(&pools_lock);
    return p;
}

/* Every tensor is allocated for the compute stream: the pools' stream ids
 * are cudaStream_t values, and that is 0, the legacy default stream. A
 * block that another stream also reads or writes (activation offload's
 * copy stream) is marked with fl_cuda_pool_record_stream. */
static void *cuda_alloc(int index, int64_t nbytes) {
    fl_pool *p = pool_of(index);
    return p ? fl_pool_alloc(p, nbytes, 0) : NULL;
}

static void cuda_free(int index, void *ptr, int64_t nbytes) {
    (void)nbytes;
    fl_pool *p = pool_of(index);
    bool known = p && fl_pool_free(p, ptr);
    FL_ASSERT(known); /* else a pointer the pool did not hand out */
}

bool fl_cuda_pool_record_stream(int index, void *block, uint64_t stream) {
    fl_pool *p = pool_of(index);
    return p && fl_pool_record_stream(p, block, stream);
}

static int64_t cuda_reserved_bytes(int index) {
    fl_pool *p = pool_of(index);
    if (!p) return 0;
    fl_pool_stats st;
    fl_pool_stats_get(p, &st);
    return st.reserved;
}

static int64_t cuda_empty_cache(int index) {
    fl_pool *p = pool_of(index);
    return p ? fl_pool_empty_cache(p) : 0;
}

int64_t fl_cuda_pool_release_cached(int index) { return cuda_empty_cache(index); }

static const char *cuda_describe_oom(int index, char *buf, size_t size) {
    fl_pool *p = pool_of(index);
    return p ? fl_pool_oom_message(p, buf, size) : NULL;
}

static int transfer_failed(const char *what) {
    return fl_fail(FL_ERR_DEVICE, "%s: %s", what, fl_cuda_last_problem());
}

/* Synchronous copies wait for everything queued on the device: first make
 * sure no collective it waits for can hang them. */
static int cuda_to_host(int index, void *host_dst, const void *src, int64_t nbytes) {
    if (fl_cuda_nccl_settle() != FL_OK) return fl_last_status();
    return fl_cuda_memcpy(index, host_dst, src, nbytes, 1) == 0
               ? FL_OK
               : transfer_failed("copy from cuda");
}

static int cuda_from_host(int index, void *dst, const void *host_src, int64_t nbytes) {
    if (fl_cuda_nccl_settle() != FL_OK) return fl_last_status();
    return fl_cuda_memcpy(index, dst, host_src, nbytes, 0) == 0
               ? FL_OK
               : transfer_failed("copy to cuda");
}

/* Same-device copies, any dtypes and strides: cuda_copy.cu. */
static int cuda_copy(fl_tensor *dst, const fl_tensor *src) { return fl_cuda_copy_kernel(dst, src); }

static int cuda_fill(fl_tensor *t, double value) {
    if (value == 0.0 && fl_tensor_is_contiguous(t)) {
        int64_t nbytes = t->numel * (int64_t)fl_dtype_size(t->dtype);
        return fl_cuda_memset(fl_device_index(t->device), t->data, 0, nbytes) == 0
                   ? FL_OK
                   : transfer_failed("fill_ on cuda");
    }
    /* The value becomes one element of t's dtype by the CPU's rules (one
     * conversion, on the host); the kernel only replicates its bytes. */
    _Alignas(8) char element[8] = {0};
    fl_store_f64(element, t->dtype, value);
    return fl_cuda_fill_kernel(t, element);
}

/* Uniform and int fills run on the device with the CPU's bits. Normal
 * fills are generated on the host and copied over: their Box-Muller step
 * goes through log and cos, where libdevice and libm may differ in the last
 * bit (see cuda_copy.cu), and initialisation must not depend on the device. */
static int cuda_random(fl_tensor *t, const fl_random_spec *spec) {
    if (spec->kind != FL_RANDOM_NORMAL) return fl_cuda_random_kernel(t, spec);
    fl_tensor *host = fl_empty(t->ndim, t->shape, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
    if (!host) return fl_last_status();
    int rc = fl_cpu_backend.random(host, spec);
    if (rc == FL_OK) rc = fl_copy_(t, host);
    fl_tensor_release(host);
    return rc;
}

const fl_backend fl_cuda_backend = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .random = cuda_random,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .reserved_bytes = cuda_reserved_bytes,
    .empty_cache = cuda_empty_cache,
    .describe_oom = cuda_describe_oom,
    .vm_reserve = fl_cuda_vm_reserve,
    .vm_commit = fl_cuda_vm_commit,
    .vm_decommit = fl_cuda_vm_decommit,
    .vm_unreserve = fl_cuda_vm_unreserve,
};
#endif /* FL_HAVE_CUDA */
