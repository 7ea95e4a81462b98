/*
 * cuda_backend.c: the vtable of the cuda device and the entry point of the
 * plugin it is built into (libfsdp_cuda.so, opened by
 * core/tensor/backend.c: [Note: the device interface] in core/backend/backend.h).
 * Memory comes from one caching pool per device (core/tensor/device_pool.c
 * over cudaMalloc and CUDA events); transfers go to cuda_runtime.cu; the
 * element kernels (strided copy with conversion, fill, uniform and int
 * random fills) to cuda_copy.cu; streams, events and pinned host memory to
 * cuda_host.cu and cuda_event.cu, whose 0/-1 answers become errors here.
 */
#include "error.h"
#include "element.h"
#include "backend.h"
#include "cuda_backend.h"
#include "cuda_elem.h"
#include "../tensor/device_pool.h"

#include <pthread.h>

_Static_assert((int)FL_STREAM_COPY == (int)FL_CUDA_COPY_STREAM &&
                   (int)FL_STREAM_COMM == (int)FL_CUDA_COMM_STREAM,
               "the side streams' kinds are the same numbers on both sides");

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
    int rc = fl_backend_of(host->device)->random(host, spec);
    if (rc == FL_OK) rc = fl_copy_(t, host);
    fl_tensor_release(host);
    return rc;
}

/* ---- streams, events, pinned memory: the raw calls' failures as errors ---- */

static int host_failed(int index, const char *what) {
    return fl_fail(FL_ERR_DEVICE, "cuda:%d: %s: %s", index, what, fl_cuda_host_problem());
}

static int cuda_side_stream(int index, int which, uint64_t *stream) {
    return fl_cuda_side_stream(index, which, stream) == 0 ? FL_OK
                                                          : host_failed(index, "side stream");
}

static int cuda_stream_wait_stream(int index, uint64_t waiter, uint64_t waited) {
    return fl_cuda_stream_wait_stream(index, waiter, waited) == 0
               ? FL_OK
               : host_failed(index, "ordering two streams");
}

static void *cuda_event_record(int index, uint64_t stream) {
    void *ev = fl_cuda_event_record(index, stream);
    if (!ev) fl_fail(FL_ERR_DEVICE, "cuda:%d: %s", index, fl_cuda_last_problem());
    return ev;
}

static bool cuda_event_done(void *event) { return fl_cuda_event_done(event) != 0; }

static int cuda_stream_wait_event(int index, uint64_t stream, void *event) {
    return fl_cuda_stream_wait_event(index, stream, event) == 0
               ? FL_OK
               : host_failed(index, "waiting for an event");
}

static int cuda_memcpy_async(int index, uint64_t stream, void *dst, const void *src,
                             int64_t nbytes, bool to_host) {
    return fl_cuda_memcpy_async_on(index, stream, dst, src, nbytes, to_host) == 0
               ? FL_OK
               : host_failed(index, "asynchronous copy");
}

static void *cuda_host_alloc(int64_t nbytes) {
    void *p = fl_cuda_host_alloc(nbytes);
    if (!p) fl_fail(FL_ERR_OOM, "%s", fl_cuda_host_problem());
    return p;
}

static const struct fl_device_comm_ops *cuda_comm_ops(void) { return fl_cuda_nccl_ops(); }

int64_t fl_cuda_launch_count;

#ifdef FL_CUDASIM
/* tests/cudasim/sim_runtime.cc: the launches the simulator was asked for. */
int64_t fl_sim_launch_count(bool reset);
#endif

static void cuda_kernel_launches(int64_t counts[2], bool reset) {
    counts[0] = reset ? __atomic_exchange_n(&fl_cuda_launch_count, 0, __ATOMIC_RELAXED)
                      : __atomic_load_n(&fl_cuda_launch_count, __ATOMIC_RELAXED);
#ifdef FL_CUDASIM
    counts[1] = fl_sim_launch_count(reset);
#else
    counts[1] = -1;
#endif
}

static const fl_backend cuda_backend = {
    .abi = FL_BACKEND_ABI,
    .name = "cuda",
    .device_count = fl_cuda_probe,
    .status = fl_cuda_probe_status,
#ifdef FL_CUDASIM
    .simulated = true,
#endif
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
    .synchronize = fl_cuda_synchronize,
    .side_stream = cuda_side_stream,
    .stream_wait_stream = cuda_stream_wait_stream,
    .event_record = cuda_event_record,
    .event_done = cuda_event_done,
    .stream_wait_event = cuda_stream_wait_event,
    .event_destroy = fl_cuda_event_destroy,
    .record_stream = fl_cuda_pool_record_stream,
    .memcpy_async = cuda_memcpy_async,
    .host_alloc = cuda_host_alloc,
    .host_free = fl_cuda_host_free,
    .user_event_new = fl_cuda_user_event_new,
    .user_event_free = fl_cuda_user_event_free,
    .user_event_record = fl_cuda_user_event_record,
    .user_event_query = fl_cuda_user_event_query,
    .user_event_synchronize = fl_cuda_user_event_synchronize,
    .user_event_elapsed = fl_cuda_user_event_elapsed,
    .binary = &fl_cuda_binary_kernels,
    .elementwise = &fl_cuda_elementwise_kernels,
    .linear = &fl_cuda_linear_kernels,
    .fused = &fl_cuda_fused_kernels,
    .optim = &fl_cuda_optim_kernels,
    .attention_paths = fl_cuda_attention_paths,
    .kernel_launches = cuda_kernel_launches,
    .library_version = fl_cuda_library_version,
    .comm_ops = cuda_comm_ops,
};

/* The plugin's one export (FL_BACKEND_PLUGIN_ENTRY). It does nothing but
 * hand out the table: the runtime is probed on the first question. */
__attribute__((visibility("default"))) const fl_backend *fl_backend_plugin_entry(void);
const fl_backend *fl_backend_plugin_entry(void) { return &cuda_backend; }
