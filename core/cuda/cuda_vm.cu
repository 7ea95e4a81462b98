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
 * is kept in a small table by base address until decommit.
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
    CUmemGenericAllocationHandle handle;
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
    CUmemAllocationProp prop = device_memory(index);
    CUmemGenericAllocationHandle h;
    CUresult r = api.create(&h, (size_t)nbytes, &prop, 0);
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
    if (r != CUDA_SUCCESS) {
        api.unmap((CUdeviceptr)base, (size_t)nbytes);
        api.release(h);
        return driver_fail("cuMemSetAccess", index, r);
    }
    fl_cu_lock l(&lock);
    for (int i = 0; i < MAX_COMMITTED; i++)
        if (!table[i].base) {
            table[i] = {base, h};
            return FL_OK;
        }
    api.unmap((CUdeviceptr)base, (size_t)nbytes);
    api.release(h);
    return fl_fail(FL_ERR_DEVICE, "cuda:%d: more than %d gathered buffers committed at once", index,
                   MAX_COMMITTED);
}

/* Kernels still reading the range are queued on the legacy default stream:
 * wait for them before the memory goes. */
extern "C" void fl_cuda_vm_decommit(int index, void *base, int64_t nbytes) {
    cudaSetDevice(index);
    cudaStreamSynchronize(0);
    fl_cu_lock l(&lock);
    for (int i = 0; i < MAX_COMMITTED; i++)
        if (table[i].base == base) {
            api.unmap((CUdeviceptr)base, (size_t)nbytes);
            api.release(table[i].handle);
            table[i].base = NULL;
            return;
        }
}

extern "C" void fl_cuda_vm_unreserve(int index, void *base, int64_t nbytes) {
    fl_cuda_vm_decommit(index, base, nbytes);
    if (api.loaded) api.address_free((CUdeviceptr)base, (size_t)nbytes);
}
