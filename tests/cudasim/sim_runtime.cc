/*
 * sim_runtime.cc: the CUDA runtime calls the backend makes, simulated on
 * the host for the cudasim test build.
 *
 * Device memory is host memory (a kernel dereferences it directly), and
 * errors follow the runtime's rules: a launch failure is sticky, a bad
 * argument is reported once by cudaGetLastError. Stream 0 runs work when
 * it is issued; streams from cudaStreamCreate* queue it and run it only
 * when a synchronising call forces them, so that a missing wait between
 * streams reads stale data every time (the rules are with the streams
 * section below). FSDP_CUDASIM_STREAMS=eager runs every stream's work at
 * once instead.
 *
 * Environment: FSDP_CUDASIM_DEVICES (default 1) devices, each of
 * FSDP_CUDASIM_MEMORY_MB (default 8192) MiB; allocations beyond it fail
 * with cudaErrorMemoryAllocation, so the caching allocator's
 * out-of-memory path runs as on a real GPU.
 */
#include "sim_internal.h"

#include <cuda.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <mutex>

namespace {

constexpr int MAX_DEVICES = 16;
constexpr size_t DEFAULT_SMEM = 48 << 10, MAX_SMEM = 227 << 10;

pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
int ndevices = -1;
size_t capacity;
size_t used[MAX_DEVICES];
thread_local int current_device;
cudaError_t sticky = cudaSuccess; /* a fault: every later call reports it */
thread_local cudaError_t last = cudaSuccess;

/* Allocation sizes, for cudaFree's accounting: a small header before the
 * block keeps it without a map. */
struct alloc_header {
    size_t bytes;
    int device;
    int magic;
};
constexpr int MAGIC = 0x51a10c;
constexpr size_t HEADER = 256; /* keeps the returned block 256-byte aligned, as cudaMalloc's */

struct smem_limit {
    const void *kernel;
    size_t bytes;
};
smem_limit smem_limits[256];
int nsmem_limits;

void init(void) {
    if (ndevices >= 0) return;
    const char *d = getenv("FSDP_CUDASIM_DEVICES"), *m = getenv("FSDP_CUDASIM_MEMORY_MB");
    ndevices = d ? atoi(d) : 1;
    if (ndevices < 0) ndevices = 0;
    if (ndevices > MAX_DEVICES) ndevices = MAX_DEVICES;
    capacity = (size_t)(m ? atoll(m) : 8192) << 20;
}

cudaError_t fail(cudaError_t e) {
    last = e;
    return e;
}

/* The sticky error if there is one, else cudaSuccess: what a call that
 * touches the device returns after a fault. */
cudaError_t health(void) { return sticky != cudaSuccess ? fail(sticky) : cudaSuccess; }

void sync_before_free(const char *call); /* with the streams, below */

} // namespace

void fl_sim_fault(cudaError_t err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudasim: kernel fault: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    sticky = err;
    last = err;
}

void fl_sim_launch_error(cudaError_t err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudasim: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    last = err;
}

int fl_sim_faulted(void) { return sticky != cudaSuccess; }

size_t fl_sim_smem_limit(const void *kernel) {
    pthread_mutex_lock(&lock);
    size_t limit = DEFAULT_SMEM;
    for (int i = 0; i < nsmem_limits; i++)
        if (smem_limits[i].kernel == kernel) limit = smem_limits[i].bytes;
    pthread_mutex_unlock(&lock);
    return limit;
}

/* ---- devices ------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) {
    pthread_mutex_lock(&lock);
    init();
    *count = ndevices;
    pthread_mutex_unlock(&lock);
    return ndevices ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    int n;
    cudaGetDeviceCount(&n);
    if (device < 0 || device >= n) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return health();
}

cudaError_t cudaGetDevice(int *device) {
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    int n;
    cudaGetDeviceCount(&n);
    if (device < 0 || device >= n) return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cudasim (kernels simulated on the CPU)");
    prop->major = 9;
    prop->minor = 0;
    prop->totalGlobalMem = capacity;
    prop->multiProcessorCount = 4;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlock = DEFAULT_SMEM;
    prop->sharedMemPerBlockOptin = MAX_SMEM;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e) return e;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)MAX_SMEM; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)DEFAULT_SMEM; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    default:
        fprintf(stderr, "cudasim: cudaDeviceGetAttribute(%d) is not simulated\n", (int)attr);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || (size_t)value > MAX_SMEM) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < nsmem_limits && smem_limits[i].kernel != func) i++;
    if (i < 256) {
        smem_limits[i] = {func, (size_t)value};
        if (i == nsmem_limits) nsmem_limits++;
    }
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* ---- errors -------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last;
    last = sticky;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last; }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "cudasim: unknown error";
    }
}

const char *cudaGetErrorName(cudaError_t e) {
    return e == cudaSuccess ? "cudaSuccess" : "cudaError (cudasim)";
}

/* ---- memory -------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    if (health()) return sticky;
    pthread_mutex_lock(&lock);
    init();
    int dev = current_device;
    bool fits = used[dev] + bytes <= capacity;
    if (fits) used[dev] += bytes;
    pthread_mutex_unlock(&lock);
    if (!fits) return fail(cudaErrorMemoryAllocation);
    char *raw = (char *)aligned_alloc(HEADER, HEADER + ((bytes + HEADER - 1) & ~(HEADER - 1)));
    if (!raw) {
        pthread_mutex_lock(&lock);
        used[dev] -= bytes;
        pthread_mutex_unlock(&lock);
        return fail(cudaErrorMemoryAllocation);
    }
    alloc_header *h = (alloc_header *)raw;
    h->bytes = bytes;
    h->device = dev;
    h->magic = MAGIC;
    /* Fresh device memory holds whatever was there: NaN bytes catch a
     * kernel reading what nobody wrote. */
    memset(raw + HEADER, 0xff, bytes);
    *ptr = raw + HEADER;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    sync_before_free("cudaFree");
    alloc_header *h = (alloc_header *)((char *)ptr - HEADER);
    if (h->magic != MAGIC) return fail(cudaErrorInvalidValue);
    h->magic = 0;
    pthread_mutex_lock(&lock);
    used[h->device] -= h->bytes;
    pthread_mutex_unlock(&lock);
    free(h);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes) {
    *ptr = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *ptr) {
    if (ptr) sync_before_free("cudaFreeHost");
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    pthread_mutex_lock(&lock);
    init();
    *total = capacity;
    *free_bytes = capacity - used[current_device];
    pthread_mutex_unlock(&lock);
    return health();
}

/* ---- streams and events: deferred ("lazy") streams ------------------------------
 * Stream 0 (also cudaStreamLegacy and cudaStreamPerThread) runs its work
 * when it is issued. A stream from cudaStreamCreate* is deferred: its
 * operations (kernel launches, async copies and sets, host functions,
 * event records, waits, sim_nccl's collectives) are queued in order and
 * run only when something forces them:
 *   - cudaStreamSynchronize/cudaStreamQuery/cudaStreamDestroy: the whole
 *     queue; cudaDeviceSynchronize, cudaFree, cudaFreeHost: every queue;
 *   - cudaEventSynchronize/cudaEventQuery(e): e's stream up to and
 *     including e's last record (a host that polls makes progress, and the
 *     query then says cudaSuccess);
 *   - cudaStreamWaitEvent(s, e): on stream 0 at once, e's stream up to e;
 *     on a deferred s, the same when s reaches the wait;
 *   - any operation on stream 0 (launch, copy, set, record, wait,
 *     synchronisation, the synchronous cudaMemcpy/cudaMemset, a cuBLAS,
 *     cuDNN or NCCL call: fl_sim_stream_now/enqueue): first the queues of
 *     the blocking streams (created without cudaStreamNonBlocking), in the
 *     order their work was issued: the legacy default stream's implicit
 *     synchronisation;
 *   - ncclCommDestroy/ncclCommAbort with collectives queued (sim_nccl.c,
 *     through cudaDeviceSynchronize).
 * Nothing else runs queued work (not a host read of device memory, not
 * cudaEventElapsedTime). So work whose ordering a program forgot
 * runs as late as the CUDA rules allow, and a reader that did not wait
 * for it sees the old contents every time instead of usually the new: a
 * missing cudaStreamWaitEvent or a buffer reused too early shows as wrong
 * values in a test rather than as a rare race on a GPU. Merged runs of
 * several queues go in issue order (a global sequence number); a wait
 * names the record it waits for by that number, so re-recording an event
 * later does not move a wait already issued, and waits cannot form a cycle.
 *
 * An event never recorded is complete; a record on stream 0 completes at
 * once; the last record wins. Events with timing take the host clock
 * (CLOCK_MONOTONIC) when their record runs, for cudaEventElapsedTime.
 *
 * After a fault (sticky error), queued kernels, copies, sets and host
 * functions are dropped when reached, as a dead context runs nothing; the
 * call that forced them returns the error. Records and waits still do
 * their bookkeeping, so forcing always terminates.
 *
 * FSDP_CUDASIM_STREAMS=eager makes every stream run its work when issued
 * (the model before deferred streams), to tell whether a failure comes from
 * the stream model.
 *
 * One recursive lock covers the streams, the events and everything that
 * runs forced work (kernels included): a second host thread (a watchdog
 * polling cudaEventQuery) waits while the first forces work, even a
 * collective blocked in sim_nccl until its timeout. */

namespace {

enum op_kind { OP_KERNEL, OP_COPY, OP_SET, OP_HOST, OP_CLOSURE, OP_RECORD, OP_WAIT };

struct sim_stream;
struct sim_event;

struct sim_op {
    op_kind kind;
    uint64_t seq; /* issue order, over all streams */
    sim_op *next;
    /* OP_KERNEL */
    fl_sim_site site;
    dim3 grid, block;
    size_t smem;
    /* OP_KERNEL (body, destroy), OP_HOST (fn), OP_CLOSURE (fn, destroy = drop) */
    void (*fn)(void *);
    void (*destroy)(void *);
    void *arg;
    /* OP_COPY, OP_SET */
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    /* OP_RECORD */
    sim_event *event;
    /* OP_WAIT: run `target` up to `target_seq` */
    sim_stream *target;
    uint64_t target_seq;
};

constexpr uint32_t STREAM_MAGIC = 0x5157a3e1, EVENT_MAGIC = 0x5e7e0e11;

struct sim_stream {
    uint32_t magic; /* 0 once destroyed: the handle is refused */
    unsigned flags;
    int priority;
    int refs; /* the handle, and queued waits elsewhere that name it */
    sim_op *head, *tail;
    sim_stream *next; /* live streams, oldest first */
};

struct sim_event {
    uint32_t magic;
    unsigned flags;
    int refs;            /* the handle, and its queued records */
    uint64_t seq;        /* the last record's sequence number; 0: never recorded */
    sim_stream *pending; /* where that record is queued; NULL once it ran */
    bool ran;            /* the last record has run */
    double ms;           /* host clock when it ran (timing events) */
    int queries;         /* cudaEventQuery calls on the last record so far */
};

std::recursive_mutex stream_lock;
typedef std::lock_guard<std::recursive_mutex> stream_guard;
sim_stream *streams;
uint64_t last_seq;
int eager_mode = -1;
/* The runtime call that is forcing queued work on this thread, for the
 * note after a queued kernel faults. */
thread_local const char *forcing_call;

struct forcing {
    bool outer;
    explicit forcing(const char *call) : outer(!forcing_call) {
        if (outer) forcing_call = call;
    }
    ~forcing() {
        if (outer) forcing_call = NULL;
    }
};

bool eager(void) {
    if (eager_mode < 0) {
        const char *m = getenv("FSDP_CUDASIM_STREAMS");
        eager_mode = m && strcmp(m, "eager") == 0;
        if (m && *m && !eager_mode && strcmp(m, "lazy") != 0)
            fprintf(stderr, "cudasim: FSDP_CUDASIM_STREAMS=%s is neither lazy nor eager; using lazy\n", m);
    }
    return eager_mode;
}

/* FSDP_CUDASIM_QUERY_DELAY=n: cudaEventQuery says cudaErrorNotReady n
 * times for each queued record before it forces the work, as a GPU still
 * busy would. With n > 0, code that queries an event and then uses the
 * work's results without a wait (cudaStreamWaitEvent or a synchronise)
 * reads stale data: a query is not an ordering. */
int query_delay(void) {
    static int n = -1;
    if (n < 0) {
        const char *v = getenv("FSDP_CUDASIM_QUERY_DELAY");
        n = v && *v ? atoi(v) : 0;
        if (n < 0) n = 0;
    }
    return n;
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

bool immediate_handle(cudaStream_t s) {
    return s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

/* The stream behind handle h: NULL for the immediate handles; false if h
 * is not a live stream. */
bool lookup_stream(cudaStream_t h, sim_stream **out) {
    *out = NULL;
    if (immediate_handle(h)) return true;
    sim_stream *s = (sim_stream *)h;
    if (s->magic != STREAM_MAGIC) return false;
    *out = s;
    return true;
}

/* Whether work issued on s is queued (rather than run at once). */
bool defers(const sim_stream *s) { return s && !eager(); }

sim_event *lookup_event(cudaEvent_t h) {
    sim_event *e = (sim_event *)h;
    return e && e->magic == EVENT_MAGIC ? e : NULL;
}

void unref_stream(sim_stream *s) {
    if (--s->refs == 0) free(s);
}

void unref_event(sim_event *e) {
    if (--e->refs == 0) free(e);
}

sim_op *new_op(op_kind kind) {
    sim_op *op = (sim_op *)calloc(1, sizeof *op);
    if (!op) {
        fprintf(stderr, "cudasim: out of CPU memory for a stream operation\n");
        abort();
    }
    op->kind = kind;
    return op;
}

uint64_t enqueue(sim_stream *s, sim_op *op) {
    op->seq = ++last_seq;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    return op->seq;
}

sim_op *pop(sim_stream *s) {
    sim_op *op = s->head;
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    return op;
}

void force(sim_stream *s, uint64_t upto);

void run_op(sim_op *op, sim_stream *s) {
    bool dead = fl_sim_faulted();
    switch (op->kind) {
    case OP_KERNEL:
        if (!dead) {
            fl_sim_run(op->site, op->grid, op->block, op->smem, op->fn, op->arg);
            if (fl_sim_faulted())
                fprintf(stderr, "cudasim: (that launch of %s was queued on stream %p and ran when %s forced it)\n",
                        op->site.kernel, (void *)s, forcing_call ? forcing_call : "the runtime");
        }
        op->destroy(op->arg);
        break;
    case OP_COPY:
        if (!dead && op->bytes) memmove(op->dst, op->src, op->bytes);
        break;
    case OP_SET:
        if (!dead) memset(op->dst, op->value, op->bytes);
        break;
    case OP_HOST:
        if (!dead) op->fn(op->arg);
        break;
    case OP_CLOSURE:
        if (!dead) op->fn(op->arg);
        else op->destroy(op->arg);
        break;
    case OP_RECORD: {
        sim_event *e = op->event;
        if (e->seq == op->seq) { /* a later record supersedes this one */
            e->pending = NULL;
            e->ran = true;
            e->ms = now_ms();
        }
        unref_event(e);
        break;
    }
    case OP_WAIT:
        force(op->target, op->target_seq);
        unref_stream(op->target);
        break;
    }
    free(op);
}

/* Run s's queue up to and including the operation numbered upto. The op
 * is unlinked before it runs, so a wait inside it that forces other
 * streams (which may come back here) sees the rest of the queue only. */
void force(sim_stream *s, uint64_t upto) {
    while (s->head && s->head->seq <= upto) run_op(pop(s), s);
}

/* Run the queues of the streams that match, merged in issue order. */
void force_merged(bool blocking_only) {
    for (;;) {
        sim_stream *first = NULL;
        for (sim_stream *s = streams; s; s = s->next)
            if (s->head && (!blocking_only || !(s->flags & cudaStreamNonBlocking)) &&
                (!first || s->head->seq < first->head->seq))
                first = s;
        if (!first) return;
        run_op(pop(first), first);
    }
}

/* What an operation on the legacy default stream waits for: all work
 * issued before it on the blocking streams. */
void legacy(const char *call) {
    forcing f(call);
    force_merged(true);
}

void force_all(const char *call) {
    forcing f(call);
    force_merged(false);
}

} // namespace

cudaError_t cudaDeviceSynchronize(void) {
    stream_guard g(stream_lock);
    force_all("cudaDeviceSynchronize");
    return health();
}

namespace {

/* Every queue, before memory goes away: cudaFree and cudaFreeHost
 * synchronise the device (CUDA's implicit synchronisation), so queued work
 * never touches freed memory. */
void sync_before_free(const char *call) {
    stream_guard g(stream_lock);
    force_all(call);
}

} // namespace

static int64_t launches_asked;

int64_t fl_sim_launch_count(bool reset) {
    return reset ? __atomic_exchange_n(&launches_asked, 0, __ATOMIC_RELAXED)
                 : __atomic_load_n(&launches_asked, __ATOMIC_RELAXED);
}

void fl_sim_launch_kernel(fl_sim_site site, const void *kernel, dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, void (*body)(void *), void *closure, void (*destroy)(void *)) {
    __atomic_fetch_add(&launches_asked, 1, __ATOMIC_RELAXED);
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!lookup_stream(stream, &s)) {
        fl_sim_launch_error(cudaErrorInvalidResourceHandle, "%s:%d %s: launched on %p, which is not a stream",
                            site.file, site.line, site.kernel, (void *)stream);
        destroy(closure);
        return;
    }
    if (fl_sim_faulted() || !fl_sim_launch_valid(site, kernel, grid, block, smem)) {
        destroy(closure);
        return;
    }
    if (!defers(s)) {
        if (!s) legacy("a kernel launch on stream 0");
        fl_sim_run(site, grid, block, smem, body, closure);
        destroy(closure);
        return;
    }
    sim_op *op = new_op(OP_KERNEL);
    op->site = site;
    op->grid = grid;
    op->block = block;
    op->smem = smem;
    op->fn = body;
    op->arg = closure;
    op->destroy = destroy;
    enqueue(s, op);
}

int fl_sim_stream_now(cudaStream_t stream) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!lookup_stream(stream, &s)) return -1;
    if (defers(s)) return 1;
    if (!s) legacy("a library call on stream 0");
    return 0;
}

int fl_sim_stream_enqueue(cudaStream_t stream, void (*run)(void *), void (*drop)(void *), void *arg) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!lookup_stream(stream, &s)) return -1;
    if (!defers(s)) {
        if (!s) legacy("work issued on stream 0");
        return 0;
    }
    sim_op *op = new_op(OP_CLOSURE);
    op->fn = run;
    op->destroy = drop;
    op->arg = arg;
    enqueue(s, op);
    return 1;
}

/* ---- memory copies and sets: on stream 0 at once, else queued -------------------- */

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    stream_guard g(stream_lock);
    if (health()) return sticky;
    legacy("cudaMemcpy");
    if (health()) return sticky; /* a kernel queued on a blocking stream faulted */
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!lookup_stream(stream, &s)) return fail(cudaErrorInvalidResourceHandle);
    if (!defers(s)) {
        if (!s) return cudaMemcpy(dst, src, bytes, kind);
        if (health()) return sticky; /* eager mode: a stream of its own, at once */
        if (bytes) memmove(dst, src, bytes);
        return cudaSuccess;
    }
    if (health()) return sticky;
    sim_op *op = new_op(OP_COPY);
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
    enqueue(s, op);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    stream_guard g(stream_lock);
    if (health()) return sticky;
    legacy("cudaMemset");
    if (health()) return sticky;
    memset(dst, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!lookup_stream(stream, &s)) return fail(cudaErrorInvalidResourceHandle);
    if (!defers(s)) {
        if (!s) return cudaMemset(dst, value, bytes);
        if (health()) return sticky;
        memset(dst, value, bytes);
        return cudaSuccess;
    }
    if (health()) return sticky;
    sim_op *op = new_op(OP_SET);
    op->dst = dst;
    op->value = value;
    op->bytes = bytes;
    enqueue(s, op);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!fn) return fail(cudaErrorInvalidValue);
    if (!lookup_stream(stream, &s)) return fail(cudaErrorInvalidResourceHandle);
    if (health()) return sticky;
    if (!defers(s)) {
        if (!s) legacy("cudaLaunchHostFunc on stream 0");
        if (health()) return sticky;
        fn(data);
        return cudaSuccess;
    }
    sim_op *op = new_op(OP_HOST);
    op->fn = fn;
    op->arg = data;
    enqueue(s, op);
    return cudaSuccess;
}

/* ---- streams ------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *out, unsigned flags, int priority) {
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
    /* clamped to the range, as the runtime does */
    priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    sim_stream *s = (sim_stream *)calloc(1, sizeof *s);
    if (!s) return fail(cudaErrorMemoryAllocation);
    s->magic = STREAM_MAGIC;
    s->flags = flags;
    s->priority = priority;
    s->refs = 1;
    stream_guard g(stream_lock);
    sim_stream **tail = &streams;
    while (*tail) tail = &(*tail)->next;
    *tail = s;
    *out = (cudaStream_t)s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, cudaStreamDefault, 0); }

/* An H100's range; priorities are remembered, not used (the queues run
 * when forced, whatever their priority). */
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t h, int *priority) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!priority) return fail(cudaErrorInvalidValue);
    if (!lookup_stream(h, &s)) return fail(cudaErrorInvalidResourceHandle);
    *priority = s ? s->priority : 0;
    return cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t h, unsigned *flags) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!flags) return fail(cudaErrorInvalidValue);
    if (!lookup_stream(h, &s)) return fail(cudaErrorInvalidResourceHandle);
    *flags = s ? s->flags : cudaStreamDefault;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t h) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!lookup_stream(h, &s) || !s) return fail(cudaErrorInvalidResourceHandle);
    {
        forcing f("cudaStreamDestroy");
        force(s, UINT64_MAX);
    }
    for (sim_stream **p = &streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    s->magic = 0;
    unref_stream(s);
    return health();
}

/* Runs h's whole queue (the legacy stream's: the blocking streams'); `call`
 * names the runtime call in fault notes. */
static cudaError_t run_stream(cudaStream_t h, const char *call, const char *call0) {
    stream_guard g(stream_lock);
    sim_stream *s;
    if (!lookup_stream(h, &s)) return fail(cudaErrorInvalidResourceHandle);
    if (!s) {
        legacy(call0);
    } else {
        forcing f(call);
        force(s, UINT64_MAX);
    }
    return health();
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    return run_stream(h, "cudaStreamSynchronize", "cudaStreamSynchronize(0)");
}

/* Runs the queue, so a host polling a stream makes progress, as with
 * cudaEventQuery. */
cudaError_t cudaStreamQuery(cudaStream_t h) { return run_stream(h, "cudaStreamQuery", "cudaStreamQuery(0)"); }

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t eh, unsigned flags) {
    stream_guard g(stream_lock);
    sim_stream *s;
    sim_event *e = lookup_event(eh);
    if (!lookup_stream(h, &s) || !e) return fail(cudaErrorInvalidResourceHandle);
    if (health()) return sticky;
    if (!defers(s)) {
        /* Stream 0 (or eager): the host goes on, but every later stream-0
         * operation is ordered after the event, which here means running
         * its stream up to it now. */
        if (!s) legacy("cudaStreamWaitEvent on stream 0");
        if (e->pending) {
            forcing f("cudaStreamWaitEvent on stream 0");
            force(e->pending, e->seq);
        }
        return health();
    }
    if (!e->pending || e->pending == s) return cudaSuccess; /* complete, or already before it in s */
    sim_op *op = new_op(OP_WAIT);
    op->target = e->pending;
    op->target_seq = e->seq;
    op->target->refs++;
    enqueue(s, op);
    return cudaSuccess;
}

/* ---- events -------------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned flags) {
    if (!out || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
        return fail(cudaErrorInvalidValue);
    sim_event *e = (sim_event *)calloc(1, sizeof *e);
    if (!e) return fail(cudaErrorMemoryAllocation);
    e->magic = EVENT_MAGIC;
    e->flags = flags;
    e->refs = 1;
    *out = (cudaEvent_t)e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventRecord(cudaEvent_t eh, cudaStream_t h) {
    stream_guard g(stream_lock);
    sim_stream *s;
    sim_event *e = lookup_event(eh);
    if (!lookup_stream(h, &s) || !e) return fail(cudaErrorInvalidResourceHandle);
    if (health()) return sticky;
    if (!defers(s)) {
        if (!s) legacy("cudaEventRecord on stream 0");
        e->seq = ++last_seq;
        e->pending = NULL;
        e->ran = true;
        e->ms = now_ms();
        return health();
    }
    sim_op *op = new_op(OP_RECORD);
    op->event = e;
    e->refs++;
    e->seq = enqueue(s, op);
    e->pending = s;
    e->ran = false;
    e->queries = 0;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t eh) {
    stream_guard g(stream_lock);
    sim_event *e = lookup_event(eh);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    if (e->pending && e->queries++ < query_delay()) return cudaErrorNotReady;
    if (e->pending) {
        forcing f("cudaEventQuery");
        force(e->pending, e->seq);
    }
    return health();
}

cudaError_t cudaEventSynchronize(cudaEvent_t eh) {
    stream_guard g(stream_lock);
    sim_event *e = lookup_event(eh);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    if (e->pending) {
        forcing f("cudaEventSynchronize");
        force(e->pending, e->seq);
    }
    return health();
}

/* Does not force: a record that has not run is cudaErrorNotReady, as the
 * runtime documents. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    stream_guard g(stream_lock);
    sim_event *a = lookup_event(start), *b = lookup_event(end);
    if (!ms) return fail(cudaErrorInvalidValue);
    if (!a || !b || ((a->flags | b->flags) & cudaEventDisableTiming) || !a->seq || !b->seq)
        return fail(cudaErrorInvalidResourceHandle);
    if (!a->ran || !b->ran) return fail(cudaErrorNotReady);
    *ms = (float)(b->ms - a->ms);
    return health();
}

/* The handle goes at once; the event lives on while a record of it is
 * queued (a wait names its stream and position, not the event). */
cudaError_t cudaEventDestroy(cudaEvent_t eh) {
    stream_guard g(stream_lock);
    sim_event *e = lookup_event(eh);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    e->magic = 0;
    unref_event(e);
    return cudaSuccess;
}

/* ---- the driver's virtual memory management, as the runtime hands it out ---------
 * cudaGetDriverEntryPointByVersion gives the backend these (cuda_vm.cu).
 * Addresses are host address space reserved with PROT_NONE; a mapping
 * makes it read-write and poisons it (fresh memory holds anything), an
 * unmap returns the pages and protects them again, so a kernel touching a
 * resharded buffer faults instead of reading stale data. The granularity
 * is the GPU's usual 2 MiB, so rounding is exercised. */

namespace {

constexpr size_t GRANULARITY = 2 << 20;

struct sim_allocation {
    size_t bytes;
    int device;
};

CUresult sim_granularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags) {
    if (!g || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult sim_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                     unsigned long long flags) {
    if (!ptr || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    /* over-reserve to honour the alignment, then trim */
    size_t align = alignment ? alignment : GRANULARITY;
    char *p = (char *)mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (start > (uintptr_t)p) munmap(p, start - (uintptr_t)p);
    size_t tail = (uintptr_t)p + size + align - (start + size);
    if (tail) munmap((void *)(start + size), tail);
    *ptr = (CUdeviceptr)start;
    return CUDA_SUCCESS;
}

CUresult sim_address_free(CUdeviceptr ptr, size_t size) {
    return munmap((void *)ptr, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult sim_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                    unsigned long long flags) {
    if (!h || !prop || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    pthread_mutex_lock(&lock);
    init();
    bool fits = dev >= 0 && dev < ndevices && used[dev] + size <= capacity;
    if (fits) used[dev] += size;
    pthread_mutex_unlock(&lock);
    if (!fits) return dev >= 0 && dev < ndevices ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_DEVICE;
    sim_allocation *a = (sim_allocation *)malloc(sizeof *a);
    *a = {size, dev};
    *h = (CUmemGenericAllocationHandle)(uintptr_t)a;
    return CUDA_SUCCESS;
}

CUresult sim_release(CUmemGenericAllocationHandle h) {
    sim_allocation *a = (sim_allocation *)(uintptr_t)h;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    used[a->device] -= a->bytes;
    pthread_mutex_unlock(&lock);
    free(a);
    return CUDA_SUCCESS;
}

CUresult sim_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                 unsigned long long flags) {
    sim_allocation *a = (sim_allocation *)(uintptr_t)h;
    if (!a || offset + size > a->bytes || ptr % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    /* Mapped but not yet accessible: cuMemSetAccess opens it. */
    return CUDA_SUCCESS;
}

CUresult sim_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (!desc || count != 1 || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return CUDA_ERROR_INVALID_VALUE;
    if (mprotect((void *)ptr, size, PROT_READ | PROT_WRITE) != 0) return CUDA_ERROR_INVALID_VALUE;
    memset((void *)ptr, 0xff, size);
    return CUDA_SUCCESS;
}

CUresult sim_unmap(CUdeviceptr ptr, size_t size) {
    madvise((void *)ptr, size, MADV_DONTNEED);
    return mprotect((void *)ptr, size, PROT_NONE) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

} // namespace

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult *status) {
    static const struct {
        const char *name;
        void *fn;
    } known[] = {
        {"cuMemAddressReserve", (void *)sim_reserve},
        {"cuMemAddressFree", (void *)sim_address_free},
        {"cuMemCreate", (void *)sim_create},
        {"cuMemRelease", (void *)sim_release},
        {"cuMemMap", (void *)sim_map},
        {"cuMemUnmap", (void *)sim_unmap},
        {"cuMemSetAccess", (void *)sim_set_access},
        {"cuMemGetAllocationGranularity", (void *)sim_granularity},
    };
    for (const auto &k : known)
        if (strcmp(k.name, symbol) == 0) {
            *fn = k.fn;
            if (status) *status = cudaDriverEntryPointSuccess;
            return cudaSuccess;
        }
    fprintf(stderr, "cudasim: the driver function %s is not simulated\n", symbol);
    *fn = NULL;
    if (status) *status = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
