/*
 * backend.c: which backend serves a device kind, and the opening of
 * backends that live in their own shared library.
 *
 * The cpu backend is built into libfsdp.so. The cuda backend is a plugin,
 * libfsdp_cuda.so (core/cuda, with cudart, cuBLASLt, cuDNN and NCCL behind
 * it), opened on the first use of a cuda device or of a question only it
 * can answer (how many GPUs, pinned memory), exactly as core/comm opens
 * libfsdp_mpi.so only under a launcher. A CPU run thus never loads CUDA's
 * libraries: it starts in milliseconds and runs where they are absent.
 * When the plugin is missing or cannot be loaded, cuda devices simply do
 * not exist, and fl_device_status says why (which file, which library the
 * loader could not find) to anyone who asks for one.
 *
 * The plugin is found next to libfsdp.so (build/lib, build/cudasim/lib, an
 * install), or at FSDP_CUDA_LIBRARY. Loading is once per process; its
 * outcome, success or the reason, is kept.
 */
#include "internal.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

enum { WHY_SIZE = 8192 }; /* a path of up to 4096 bytes and what befell it */

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const fl_backend *cuda_backend; /* NULL: not loaded (cuda_why says why) */
static char cuda_why[WHY_SIZE];
static _Atomic bool cuda_opened;       /* cuda_once has run */

/* Where the cuda plugin is: FSDP_CUDA_LIBRARY, else next to this library. */
static void cuda_plugin_path(char *path, size_t size) {
    const char *env = getenv("FSDP_CUDA_LIBRARY");
    if (env && *env) {
        snprintf(path, size, "%s", env);
        return;
    }
    Dl_info info;
    if (!dladdr((const void *)(uintptr_t)&fl_backend_of, &info) || !info.dli_fname) {
        snprintf(path, size, "libfsdp_cuda.so"); /* the loader's search path */
        return;
    }
    /* The library's own directory, without the rpath's "bin/../lib". */
    char real[4096];
    const char *where = realpath(info.dli_fname, real) ? real : info.dli_fname;
    const char *slash = strrchr(where, '/');
    if (slash)
        snprintf(path, size, "%.*s/libfsdp_cuda.so", (int)(slash - where), where);
    else
        snprintf(path, size, "./libfsdp_cuda.so");
}

static void open_cuda(void) {
    char path[4096];
    cuda_plugin_path(path, sizeof path);
    if (access(path, F_OK) != 0) {
        snprintf(cuda_why, sizeof cuda_why,
                 "this build has no CUDA backend (%s is not there: it is built where nvcc is "
                 "found, and not in the asan configuration)",
                 path);
        goto done;
    }
    dlerror();
    /* RTLD_LOCAL: nothing but this file looks into the plugin. */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *err = dlerror();
        snprintf(cuda_why, sizeof cuda_why,
                 "the CUDA backend %s cannot be loaded: %s (the CUDA libraries it needs are "
                 "found through its rpath and LD_LIBRARY_PATH)",
                 path, err ? err : "unknown error");
        goto done;
    }
    fl_backend_entry entry;
    void *sym = dlsym(handle, FL_BACKEND_PLUGIN_ENTRY);
    memcpy(&entry, &sym, sizeof entry);
    const fl_backend *be = entry ? entry() : NULL;
    if (!entry || !be) {
        snprintf(cuda_why, sizeof cuda_why,
                 "%s does not export %s: not an fsdp-lua CUDA backend", path,
                 FL_BACKEND_PLUGIN_ENTRY);
        dlclose(handle);
        goto done;
    }
    if (be->abi != FL_BACKEND_ABI) {
        snprintf(cuda_why, sizeof cuda_why,
                 "%s was built for backend interface %d, this core has %d: rebuild both", path,
                 be->abi, FL_BACKEND_ABI);
        dlclose(handle);
        goto done;
    }
    /* The handle stays open for the life of the process: the kernels'
     * tables and the device memory's pools live in it. */
    cuda_backend = be;
done:
    cuda_opened = true;
}

static const fl_backend *cuda(void) {
    pthread_once(&cuda_once, open_cuda);
    return cuda_backend;
}

const fl_backend *fl_backend_of(fl_device device) {
    switch (fl_device_kind_of(device)) {
    case FL_DEVICE_CPU: return &fl_cpu_backend;
    case FL_DEVICE_CUDA: return cuda();
    default: return NULL;
    }
}

const fl_backend *fl_pinning_backend(void) {
    const fl_backend *be = cuda();
    return be && be->host_alloc && be->device_count() > 0 ? be : NULL;
}

/* ---- the public questions (fsdp.h) ----------------------------------------- */

bool fl_backend_installed(fl_device_kind kind) {
    if (kind == FL_DEVICE_CPU) return true;
    if (kind != FL_DEVICE_CUDA) return false;
    if (cuda_opened) return cuda_backend != NULL;
    char path[4096];
    cuda_plugin_path(path, sizeof path);
    return access(path, F_OK) == 0;
}

bool fl_backend_simulated(fl_device_kind kind) {
    if (kind != FL_DEVICE_CUDA) return false;
    const fl_backend *be = cuda();
    return be && be->simulated;
}

int fl_device_count(fl_device_kind kind) {
    if (kind == FL_DEVICE_CPU) return 1;
    if (kind != FL_DEVICE_CUDA) return 0;
    const fl_backend *be = cuda();
    return be ? be->device_count() : 0;
}

const char *fl_device_status(fl_device_kind kind) {
    switch (kind) {
    case FL_DEVICE_CPU: return "cpu";
    case FL_DEVICE_META: return "meta holds no storage";
    case FL_DEVICE_CUDA: {
        const fl_backend *be = cuda();
        return be ? be->status() : cuda_why;
    }
    default: return "unknown device kind";
    }
}

int64_t fl_device_library_version(fl_device_kind kind, const char *library) {
    if (kind != FL_DEVICE_CUDA || !library) return -1;
    const fl_backend *be = cuda();
    return be && be->library_version ? be->library_version(library) : -1;
}

void fl_kernel_launches(fl_device_kind kind, int64_t counts[2]) {
    counts[0] = 0;
    counts[1] = -1;
    if (kind != FL_DEVICE_CUDA || !cuda_opened) return;
    const fl_backend *be = cuda();
    if (be && be->kernel_launches) be->kernel_launches(counts, false);
}

void fl_kernel_launches_reset(fl_device_kind kind) {
    int64_t counts[2];
    if (kind != FL_DEVICE_CUDA || !cuda_opened) return;
    const fl_backend *be = cuda();
    if (be && be->kernel_launches) be->kernel_launches(counts, true);
}

void fl_attention_paths(fl_device_kind kind, int64_t counts[4]) {
    for (int i = 0; i < 4; i++) counts[i] = 0;
    /* Only an open backend can have counted anything. */
    if (kind != FL_DEVICE_CUDA || !cuda_opened) return;
    const fl_backend *be = cuda();
    if (be && be->attention_paths) be->attention_paths(counts);
}
