/*
 * cuda_vm.cu: address ranges whose memory comes and goes while the
 * addresses stay, on the GPU: the gathered buffer of a sharded unit
 * ([Note: the gathered buffer keeps its address] in fsdp.h).
 *
 * CUDA's virtual memory management is a driver API (cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
 * cuMemAddressFree). The core never links libcuda (the binary must start
 * on machines without a driver), so the functions are fetched once through
 * the runtime's cudaGetDriverEntryPointByVersion.
 *
 * A committed range holds one physical allocation covering it; its handle
 * is kept in a small table by base address until it is unmapped.
 *
 * Decommit happens at every reshard, on the training step's hot path, while
 * kernels reading the range may still be queued: instead of waiting for the
 * compute stream there, it records an event and the unmap happens once the
 * event is done (checked at the next vm call). A range committed again
 * before that simply keeps its memory. When the device runs out of memory,
 * the pending unmaps are finished first (waiting for their events) and the
 * allocation is tried again.
 */
#include "cuda_common.cuh"

#include "cuda_backend.h"

#include <cuda.h>
#include <stdio.h>

namespace {

struct driver_api {
    decltype(&cuMemAddressReserve) reserve;
    decltype(&cuMemAddressFree) address_free;
    decltype(&cuMemCreate) create;
    decltype(&cuMemRelease) release;
    decltype(&cuMemMap) map;
    decltype(&cuMemUnmap) unmap;
    decltype(&cuMemSetAccess) set_access;
    decltype(&cuMemGetAllocationGranularity) granularity;
    bool loaded;
    char problem[200];
};

driver_api api;
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

enum { MAX_COMMITTED = 4096 };
struct committed {
    void *base;
    int64_t nbytes;
    CUmemGenericAllocationHandle handle;
    cudaEvent_t unmap_after; /* decommitted: unmap once this is done */
};
committed table[MAX_COMMITTED];

template <class F> bool fetch(const char *name, F *fn) {
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, (void **)fn, 12000, cudaEnableDefault, &found);
    if (e == cudaSuccess && found == cudaDriverEntryPointSuccess && *fn) return true;
    snprintf(api.problem, sizeof api.problem, "the driver has no %s (%s)", name,
             e == cudaSuccess ? "symbol not found" : cudaGetErrorString(e));
    return false;
}

/* The driver functions, fetched on first use; false (api.problem says why)
 * if the driver lacks them. */
bool load(void) {
    fl_cu_lock l(&lock);
    if (api.loaded) return true;
    if (fetch("cuMemAddressReserve", &api.reserve) && fetch("cuMemAddressFree", &api.address_free) &&
        fetch("cuMemCreate", &api.create) && fetch("cuMemRelease", &api.release) &&
        fetch("cuMemMap", &api.map) && fetch("cuMemUnmap", &api.unmap) &&
        fetch("cuMemSetAccess", &api.set_access) &&
        fetch("cuMemGetAllocationGranularity", &api.granularity))
        api.loaded = true;
    return api.loaded;
}

CUmemAllocationProp device_memory(int index) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = index;
    return prop;
}

int driver_fail(const char *what, int index, CUresult r) {
    return fl_fail(r == CUDA_ERROR_OUT_OF_MEMORY ? FL_ERR_OOM : FL_ERR_DEVICE,
                   "cuda:%d: %s failed (CUresult %d%s)", index, what, (int)r,
                   r == CUDA_ERROR_OUT_OF_MEMORY ? ": out of memory" : "");
}

void unmap(committed *c) {
    api.unmap((CUdeviceptr)c->base, (size_t)c->nbytes);
    api.release(c->handle);
    if (c->unmap_after) cudaEventDestroy(c->unmap_after);
    memset(c, 0, sizeof *c);
}

/* Unmap the decommitted ranges whose kernels are done; with wait, all of
 * them (after the device finished with them). Caller holds the lock. */
void reap(bool wait) {
    for (int i = 0; i < MAX_COMMITTED; i++) {
        committed *c = &table[i];
        if (!c->base || !c->unmap_after) continue;
        cudaError_t e = wait ? cudaEventSynchronize(c->unmap_after) : cudaEventQuery(c->unmap_after);
        if (e == cudaErrorNotReady) {
            cudaGetLastError();
            continue;
        }
        unmap(c);
    }
}

committed *find(void *base) {
    for (int i = 0; i < MAX_COMMITTED; i++)
        if (table[i].base == base) return &table[i];
    return NULL;
}

} // namespace

extern "C" void *fl_cuda_vm_reserve(int index, int64_t nbytes, int64_t *granted) {
    if (!load()) return fl_fail(FL_ERR_DEVICE, "cuda:%d: %s", index, api.problem), nullptr;
    cudaError_t e = cudaSetDevice(index);
    if (e != cudaSuccess)
        return fl_fail(FL_ERR_DEVICE, "cuda:%d: %s", index, cudaGetErrorString(e)), nullptr;
    CUmemAllocationProp prop = device_memory(index);
    size_t g = 0;
    CUresult r = api.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || g == 0) return driver_fail("cuMemGetAllocationGranularity", index, r), nullptr;
    size_t bytes = ((size_t)nbytes + g - 1) / g * g;
    CUdeviceptr p = 0;
    r = api.reserve(&p, bytes, g, 0, 0);
    if (r != CUDA_SUCCESS) return driver_fail("cuMemAddressReserve", index, r), nullptr;
    *granted = (int64_t)bytes;
    return (void *)p;
}

extern "C" int fl_cuda_vm_commit(int index, void *base, int64_t nbytes) {
    if (!load()) return fl_fail(FL_ERR_DEVICE, "cuda:%d: %s", index, api.problem);
    {
        fl_cu_lock l(&lock);
        committed *pending = find(base);
        if (pending && pending->unmap_after) {
            if (pending->nbytes == nbytes) {
                /* Decommitted, not unmapped yet: keep the memory (its
                 * contents are undefined after a commit anyway). */
                cudaEventDestroy(pending->unmap_after);
                pending->unmap_after = NULL;
                return FL_OK;
            }
            fl_cuda_nccl_settle_quietly();
            cudaEventSynchronize(pending->unmap_after);
            unmap(pending);
            pending = NULL;
        }
        reap(false);
        if (pending) return fl_fail(FL_ERR_DEVICE, "cuda:%d: range %p committed twice", index, base);
    }
    /* The memory is made outside the lock: running out of it goes to the
     * caching pool, which may come back here (fl_cuda_vm_release_pending). */
    CUmemAllocationProp prop = device_memory(index);
    CUmemGenericAllocationHandle h;
    CUresult r = api.create(&h, (size_t)nbytes, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Memory may still sit in ranges waiting for their kernels, and in
         * the caching pool's free blocks. */
        if (fl_cuda_nccl_settle() != FL_OK) return fl_last_status();
        fl_cuda_vm_release_pending(index);
        r = api.create(&h, (size_t)nbytes, &prop, 0);
        if (r == CUDA_ERROR_OUT_OF_MEMORY && fl_cuda_pool_release_cached(index) > 0)
            r = api.create(&h, (size_t)nbytes, &prop, 0);
    }
    if (r != CUDA_SUCCESS) return driver_fail("cuMemCreate", index, r);
    r = api.map((CUdeviceptr)base, (size_t)nbytes, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        api.release(h);
        return driver_fail("cuMemMap", index, r);
    }
    CUmemAccessDesc access;
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = api.set_access((CUdeviceptr)base, (size_t)nbytes, &access, 1);
    fl_cu_lock l(&lock);
    committed *slot = r == CUDA_SUCCESS ? find(NULL) : NULL;
    if (!slot) {
        api.unmap((CUdeviceptr)base, (size_t)nbytes);
        api.release(h);
        if (r != CUDA_SUCCESS) return driver_fail("cuMemSetAccess", index, r);
        return fl_fail(FL_ERR_DEVICE, "cuda:%d: more than %d gathered buffers committed at once", index,
                       MAX_COMMITTED);
    }
    *slot = {base, nbytes, h, NULL};
    return FL_OK;
}

/* Unmap every decommitted range once its kernels are done (waiting for
 * them): for an allocation that ran out of memory. Returns the bytes given
 * back. */
extern "C" int64_t fl_cuda_vm_release_pending(int index) {
    (void)index; /* ranges of every device: waiting for the others is harmless */
    if (!api.loaded) return 0;
    fl_cuda_nccl_settle_quietly();
    fl_cu_lock l(&lock);
    int64_t freed = 0;
    for (int i = 0; i < MAX_COMMITTED; i++)
        if (table[i].base && table[i].unmap_after) freed += table[i].nbytes;
    reap(true);
    return freed;
}

/* The kernels queued so far may still read the range: unmap it once they
 * are done (at once if no event can be had: fl_cuda_event_record then
 * drained the compute stream). */
extern "C" void fl_cuda_vm_decommit(int index, void *base, int64_t nbytes) {
    (void)nbytes;
    cudaSetDevice(index);
    fl_cu_lock l(&lock);
    committed *c = find(base);
    if (!c || c->unmap_after) return;
    cudaEvent_t ev = (cudaEvent_t)fl_cuda_event_record(index, 0);
    if (!ev) { /* no event: the compute stream was drained instead */
        unmap(c);
        return;
    }
    c->unmap_after = ev;
    reap(false);
}

extern "C" void fl_cuda_vm_unreserve(int index, void *base, int64_t nbytes) {
    cudaSetDevice(index);
    {
        fl_cu_lock l(&lock);
        committed *c = find(base);
        if (c) {
            fl_cuda_nccl_settle_quietly();
            if (c->unmap_after) cudaEventSynchronize(c->unmap_after);
            else cudaStreamSynchronize(fl_cu_stream());
            unmap(c);
        }
    }
    if (api.loaded) api.address_free((CUdeviceptr)base, (size_t)nbytes);
}
