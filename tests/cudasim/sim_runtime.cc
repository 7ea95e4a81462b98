/*
 * sim_runtime.cc: the CUDA runtime calls the backend makes, simulated on
 * the host for the cudasim test build.
 *
 * Device memory is host memory (a kernel dereferences it directly), every
 * stream is the host thread (work finishes before the call returns, so an
 * event is complete as soon as it is recorded), and errors follow the
 * runtime's rules: a launch failure is sticky, a bad argument is reported
 * once by cudaGetLastError.
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

cudaError_t cudaDeviceSynchronize(void) { return health(); }

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

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (health()) return sticky;
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    if (health()) return sticky;
    memset(dst, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
    return cudaMemset(dst, value, bytes);
}

/* ---- streams and events: the host thread is the only stream ------------------- */

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free((void *)s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return health(); }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) { return health(); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = (cudaEvent_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return health(); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return health(); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return health(); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free((void *)e);
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
