/*
 * cuda_host.cu: the CUDA runtime calls behind pinned (page-locked) host
 * memory and asynchronous host<->device copies: allocating and freeing
 * pinned blocks, queueing a copy on the compute stream, and waiting for a
 * device to finish. The caching of pinned blocks and the bookkeeping of
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

#include <stdio.h>

/* The last failure of this file, for the C side's messages. */
static char host_problem[256];

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
    if (ptr) host_ok(cudaFreeHost(ptr), "cudaFreeHost");
}

/* Queued on the stream every kernel runs on (fl_cu_stream(): the legacy
 * default stream), so the copy is ordered after the kernels that produced
 * its source and before those that will read its destination, with no
 * event: that order is what makes the device blocks safe to free and reuse
 * right after queueing. */
extern "C" int fl_cuda_memcpy_async(int index, void *dst, const void *src, int64_t nbytes,
                                    int to_host) {
    if (!host_ok(cudaSetDevice(index), "cudaSetDevice")) return -1;
    if (nbytes == 0) return 0;
    cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    return host_ok(cudaMemcpyAsync(dst, src, (size_t)nbytes, kind, fl_cu_stream()),
                   "cudaMemcpyAsync")
               ? 0
               : -1;
}

/* Blocks until the event's work has run (freeing a pinned block that a
 * copy may still read, when the cache is emptied). */
extern "C" int fl_cuda_event_wait(void *event) {
    fl_cuda_nccl_settle(); /* a failure is reported there; the wait then ends */
    return host_ok(cudaEventSynchronize((cudaEvent_t)event), "cudaEventSynchronize") ? 0 : -1;
}

extern "C" const char *fl_cuda_host_problem(void) { return host_problem; }
