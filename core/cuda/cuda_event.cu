/*
 * cuda_event.cu: the CUDA side of the public events (core/tensor/event.c):
 * CUDA events recorded on the compute stream (the legacy default stream,
 * where every kernel runs), queried, waited for and timed, and device
 * synchronisation. Waits settle the NCCL collectives the device was made to
 * wait for first ([Note: ordered collectives] in cuda_nccl.cu), so a
 * collective that never completes fails them instead of hanging.
 */
#include "cuda_common.cuh"

#include "cuda_backend.h"

namespace {

int cuda_fail(const char *what, int index, cudaError_t e) {
    cudaGetLastError(); /* not sticky: later calls may work */
    return fl_fail(e == cudaErrorMemoryAllocation ? FL_ERR_OOM : FL_ERR_DEVICE, "cuda:%d: %s: %s", index,
                   what, cudaGetErrorString(e));
}

} // namespace

extern "C" void *fl_cuda_user_event_new(int index, bool timing) {
    cudaError_t e = cudaSetDevice(index);
    cudaEvent_t ev = NULL;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_fail("cudaEventCreate", index, e), nullptr;
    return (void *)ev;
}

extern "C" void fl_cuda_user_event_free(void *ev) { cudaEventDestroy((cudaEvent_t)ev); }

extern "C" int fl_cuda_user_event_record(int index, void *ev) {
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaEventRecord((cudaEvent_t)ev, fl_cu_stream());
    return e == cudaSuccess ? FL_OK : cuda_fail("cudaEventRecord", index, e);
}

extern "C" int fl_cuda_user_event_query(int index, void *ev, bool *done) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e != cudaErrorNotReady;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return FL_OK;
    }
    return e == cudaSuccess ? FL_OK : cuda_fail("cudaEventQuery", index, e);
}

extern "C" int fl_cuda_user_event_synchronize(int index, void *ev) {
    if (fl_cuda_nccl_settle() != FL_OK) return fl_last_status();
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? FL_OK : cuda_fail("cudaEventSynchronize", index, e);
}

extern "C" int fl_cuda_user_event_elapsed(int index, void *start, void *end, double *ms) {
    float f = 0;
    cudaError_t e = cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end);
    if (e != cudaSuccess) return cuda_fail("cudaEventElapsedTime", index, e);
    *ms = f;
    return FL_OK;
}

extern "C" int fl_cuda_synchronize(int index) {
    if (fl_cuda_nccl_settle_device() != FL_OK) return fl_last_status();
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e == cudaSuccess ? FL_OK : cuda_fail("cudaDeviceSynchronize", index, e);
}
