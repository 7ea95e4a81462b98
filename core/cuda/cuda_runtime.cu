/*
 * cuda_runtime.cu: the CUDA runtime calls of the core: device discovery,
 * device memory, host<->device transfers and memset. Compiled by nvcc when
 * the build finds it (mk/cuda.mk, into libfsdp_cuda.so); the binary still starts on machines
 * without a GPU or a driver, where discovery reports zero devices.
 *
 * Only plain C entry points leave this file (declared in cuda_backend.h), so
 * the vtable in cuda_backend.c stays C and the rest of the core never sees
 * CUDA headers.
 */
#include "cuda_backend.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

static char status_text[256];  /* what the probe found (fl_cuda_probe_status) */
static char problem_text[256]; /* the last failed call (fl_cuda_last_problem) */
static int device_count = -1;

extern "C" int fl_cuda_probe(void) {
    if (device_count >= 0) return device_count;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        /* 35 (insufficient driver) where no driver is installed, 100 (no
         * device) where one is but no GPU: both simply mean "no GPU". */
        snprintf(status_text, sizeof status_text, "no usable CUDA device: %s (%d)",
                 cudaGetErrorString(err), (int)err);
        cudaGetLastError(); /* clear the sticky error for later calls */
        device_count = 0;
        return 0;
    }
    device_count = n;
    cudaDeviceProp prop;
    if (n > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(status_text, sizeof status_text, "%.200s (sm_%d%d, %.1f GiB)", prop.name,
                 prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30));
    else if (n == 0)
        snprintf(status_text, sizeof status_text, "no CUDA device found");
    return n;
}

extern "C" const char *fl_cuda_probe_status(void) {
    fl_cuda_probe();
    return status_text;
}

static bool ok(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return true;
    snprintf(problem_text, sizeof problem_text, "%s: %s", what, cudaGetErrorString(err));
    return false;
}

extern "C" void *fl_cuda_malloc(int index, int64_t nbytes) {
    void *p = NULL;
    if (!ok(cudaSetDevice(index), "cudaSetDevice")) return NULL;
    if (!ok(cudaMalloc(&p, (size_t)nbytes), "cudaMalloc")) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void fl_cuda_free(int index, void *ptr) {
    cudaSetDevice(index);
    cudaFree(ptr);
}

extern "C" int fl_cuda_memcpy(int index, void *dst, const void *src, int64_t nbytes,
                              int to_host) {
    if (!ok(cudaSetDevice(index), "cudaSetDevice")) return -1;
    cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    return ok(cudaMemcpy(dst, src, (size_t)nbytes, kind), "cudaMemcpy") ? 0 : -1;
}

extern "C" int fl_cuda_memset(int index, void *dst, int value, int64_t nbytes) {
    if (!ok(cudaSetDevice(index), "cudaSetDevice")) return -1;
    return ok(cudaMemset(dst, value, (size_t)nbytes), "cudaMemset") ? 0 : -1;
}

extern "C" const char *fl_cuda_last_problem(void) { return problem_text; }

/* NULL means "nothing to wait for" to the caching pool, which then reuses
 * the block at once: so when no event can be had, the stream is drained
 * first, which makes that true. */
extern "C" void *fl_cuda_event_record(int index, uint64_t stream) {
    cudaEvent_t ev = NULL;
    cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
    if (!ok(cudaSetDevice(index), "cudaSetDevice")) return NULL;
    if (ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate") &&
        ok(cudaEventRecord(ev, s), "cudaEventRecord"))
        return (void *)ev;
    if (ev) cudaEventDestroy(ev);
    cudaGetLastError();
    fl_cuda_nccl_settle_quietly(); /* the drain may wait behind a collective */
    cudaStreamSynchronize(s);
    return NULL;
}

/* Done, or failed (an error is sticky: waiting longer would not help). */
extern "C" int fl_cuda_event_done(void *event) {
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    if (err == cudaErrorNotReady) {
        cudaGetLastError();
        return 0;
    }
    return 1;
}

extern "C" void fl_cuda_event_destroy(void *event) { cudaEventDestroy((cudaEvent_t)event); }

extern "C" int fl_cuda_mem_info(int index, int64_t *free_bytes, int64_t *total_bytes) {
    size_t f = 0, t = 0;
    if (!ok(cudaSetDevice(index), "cudaSetDevice") || !ok(cudaMemGetInfo(&f, &t), "cudaMemGetInfo"))
        return -1;
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return 0;
}
