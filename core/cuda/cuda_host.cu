/*
 * cuda_host.cu: the CUDA runtime calls behind pinned (page-locked) host
 * memory and asynchronous host<->device copies: allocating and freeing
 * pinned blocks, queueing a copy on the compute stream or on a device's
 * copy stream, ordering one stream after another with events, and waiting
 * for a device to finish. The caching of pinned blocks and the bookkeeping of
 * which copies still read them live in C (core/tensor/pinned.c); only
 * plain C entry points leave this file (cuda_backend.h, "pinned host
 * memory" block).
 *
 * Why pinned memory at all: the DMA engines can only read page-locked
 * memory, so a copy from pageable memory is staged through a driver buffer
 * and is synchronous with the host; from pinned memory cudaMemcpyAsync
 * returns at once and the copy runs in stream order.
 */
#include "cuda_backend.h"
#include "cuda_common.cuh"

#include <pthread.h>
#include <stdio.h>

/* The last failure of this file, for the C side's messages (per thread,
 * like the core's error). */
static thread_local char host_problem[256];

static bool host_ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return true;
    snprintf(host_problem, sizeof host_problem, "%s: %s", what, cudaGetErrorString(err));
    cudaGetLastError(); /* a refused call is not sticky: clear it */
    return false;
}

/* cudaMallocHost is cudaHostAlloc with the default flags (portable to the
 * current context only, not mapped, not write-combined: host reads of
 * offloaded or copied-back data stay fast). */
extern "C" void *fl_cuda_host_alloc(int64_t nbytes) {
    void *p = NULL;
    if (!host_ok(cudaMallocHost(&p, (size_t)(nbytes > 0 ? nbytes : 1)), "cudaMallocHost"))
        return NULL;
    return p;
}

extern "C" void fl_cuda_host_free(void *ptr) {
    if (!ptr) return;
    fl_cuda_nccl_settle_quietly(); /* cudaFreeHost may wait for the device */
    host_ok(cudaFreeHost(ptr), "cudaFreeHost");
}

/* [Note: the copy stream]
 * One non-blocking stream per device, made on first use (one of the side
 * streams of fl_cuda_side_stream, next to NCCL's), for copies that
 * should overlap the kernels of the compute stream (activation offload's
 * device-to-host copies, core/tape/offload.c). Non-blocking, so the
 * legacy default stream's implicit synchronisation does not serialise it
 * with the kernels again; everything that crosses between the two streams
 * is therefore ordered explicitly by events (fl_cuda_stream_wait_stream,
 * fl_cuda_stream_wait_event), as cuda_nccl.cu does for its communication
 * stream. Streams live as long as the process (destroying one would
 * synchronise it). Stream ids that cross into C are cudaStream_t values
 * as uint64_t: 0 is the legacy default stream, the compute stream. */
static cudaStream_t side_streams[FL_CUDA_SIDE_STREAMS][64];
static pthread_mutex_t side_streams_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" int fl_cuda_side_stream(int index, int which, uint64_t *stream) {
    if (index < 0 || index >= 64 || which < 0 || which >= FL_CUDA_SIDE_STREAMS) {
        snprintf(host_problem, sizeof host_problem, "cuda:%d: device index out of range", index);
        return -1;
    }
    static const char *const what[FL_CUDA_SIDE_STREAMS] = {
        "cudaStreamCreateWithFlags (the copy stream)",
        "cudaStreamCreateWithFlags (the communication stream)"};
    pthread_mutex_lock(&side_streams_lock);
    cudaStream_t *slot = &side_streams[which][index];
    bool made = *slot != NULL;
    if (!made && host_ok(cudaSetDevice(index), "cudaSetDevice") &&
        host_ok(cudaStreamCreateWithFlags(slot, cudaStreamNonBlocking), what[which]))
        made = true;
    if (!made) *slot = NULL;
    *stream = (uint64_t)(uintptr_t)*slot;
    pthread_mutex_unlock(&side_streams_lock);
    return made ? 0 : -1;
}

/* On stream 0, the one every kernel runs on (fl_cu_stream(): the legacy
 * default stream), the copy is ordered after the kernels that produced its
 * source and before those that will read its destination, with no event:
 * that order is what makes the device blocks safe to free and reuse right
 * after queueing. On the copy stream, the caller orders it with events. */
extern "C" int fl_cuda_memcpy_async_on(int index, uint64_t stream, void *dst, const void *src,
                                       int64_t nbytes, int to_host) {
    if (!host_ok(cudaSetDevice(index), "cudaSetDevice")) return -1;
    if (nbytes == 0) return 0;
    cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    return host_ok(cudaMemcpyAsync(dst, src, (size_t)nbytes, kind, (cudaStream_t)(uintptr_t)stream),
                   "cudaMemcpyAsync")
               ? 0
               : -1;
}

/* The work queued on `waiter` from now on runs after the work queued on
 * `waited` so far. The event is destroyed at once: CUDA releases it when
 * the wait is done with it. */
extern "C" int fl_cuda_stream_wait_stream(int index, uint64_t waiter, uint64_t waited) {
    if (!host_ok(cudaSetDevice(index), "cudaSetDevice")) return -1;
    cudaEvent_t ev;
    if (!host_ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"))
        return -1;
    bool good = host_ok(cudaEventRecord(ev, (cudaStream_t)(uintptr_t)waited), "cudaEventRecord") &&
                host_ok(cudaStreamWaitEvent((cudaStream_t)(uintptr_t)waiter, ev, 0),
                        "cudaStreamWaitEvent");
    cudaEventDestroy(ev);
    return good ? 0 : -1;
}

/* The work queued on `stream` from now on runs after `event` (one from
 * fl_cuda_event_record) is done; the host does not wait. */
extern "C" int fl_cuda_stream_wait_event(int index, uint64_t stream, void *event) {
    if (!host_ok(cudaSetDevice(index), "cudaSetDevice")) return -1;
    return host_ok(cudaStreamWaitEvent((cudaStream_t)(uintptr_t)stream, (cudaEvent_t)event, 0),
                   "cudaStreamWaitEvent")
               ? 0
               : -1;
}

extern "C" const char *fl_cuda_host_problem(void) { return host_problem; }
