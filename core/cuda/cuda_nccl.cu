/*
 * cuda_nccl.cu: NCCL as the device library of core/dist (fl_device_comm_ops):
 * collectives on cuda tensors move GPU to GPU, in their own dtype (bf16
 * and ncclAvg natively), queued on the legacy default stream after the
 * kernels that made their inputs; a work's test is an event query.
 *
 * libfsdp.so does not link NCCL: it is opened at first use (libnccl.so.2,
 * or FSDP_NCCL_LIBRARY), so the binary runs where NCCL is missing and
 * collectives then go through host copies. FSDP_NCCL=0 forces that path.
 * In the cudasim build the simulated NCCL (tests/cudasim/sim_nccl.c) is
 * linked in instead.
 */
#include "cuda_common.cuh"

extern "C" {
#include "dist.h"
}

#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

namespace {

struct nccl_api {
    decltype(&ncclGetUniqueId) get_unique_id;
    decltype(&ncclCommInitRank) comm_init_rank;
    decltype(&ncclCommDestroy) comm_destroy;
    decltype(&ncclGetErrorString) error_string;
    decltype(&ncclGetLastError) last_error;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclReduceScatter) reduce_scatter;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclBroadcast) broadcast;
};

nccl_api api;
int loaded; /* 0 not tried, 1 ready, -1 unavailable */
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#ifdef FL_CUDASIM
bool load_library(void) {
    api = {ncclGetUniqueId, ncclCommInitRank, ncclCommDestroy, ncclGetErrorString, ncclGetLastError,
           ncclAllGather,   ncclReduceScatter, ncclAllReduce,  ncclBroadcast};
    return true;
}
#else
template <class F> bool sym(void *lib, const char *name, F *fn) {
    *fn = (F)dlsym(lib, name);
    return *fn != NULL;
}

bool load_library(void) {
    const char *path = getenv("FSDP_NCCL_LIBRARY");
    void *lib = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    if (sym(lib, "ncclGetUniqueId", &api.get_unique_id) &&
        sym(lib, "ncclCommInitRank", &api.comm_init_rank) &&
        sym(lib, "ncclCommDestroy", &api.comm_destroy) &&
        sym(lib, "ncclGetErrorString", &api.error_string) &&
        sym(lib, "ncclGetLastError", &api.last_error) && sym(lib, "ncclAllGather", &api.all_gather) &&
        sym(lib, "ncclReduceScatter", &api.reduce_scatter) &&
        sym(lib, "ncclAllReduce", &api.all_reduce) && sym(lib, "ncclBroadcast", &api.broadcast))
        return true;
    dlclose(lib);
    return false;
}
#endif

bool available(void) {
    fl_cu_lock l(&lock);
    if (loaded == 0) {
        const char *off = getenv("FSDP_NCCL");
        loaded = (off && strcmp(off, "0") == 0) || !load_library() ? -1 : 1;
    }
    return loaded == 1;
}

int nccl_fail(const char *what, ncclResult_t r) {
    const char *detail = api.last_error ? api.last_error(NULL) : "";
    return fl_fail(FL_ERR_DEVICE, "nccl: %s failed: %s%s%s", what, api.error_string(r),
                   detail && *detail ? ": " : "", detail ? detail : "");
}

bool nccl_type(fl_dtype d, ncclDataType_t *t) {
    switch (d) {
    case FL_F32: *t = ncclFloat32; return true;
    case FL_F64: *t = ncclFloat64; return true;
    case FL_F16: *t = ncclFloat16; return true;
    case FL_BF16: *t = ncclBfloat16; return true;
    case FL_I64: *t = ncclInt64; return true;
    case FL_I32: *t = ncclInt32; return true;
    case FL_U8: case FL_BOOL: *t = ncclUint8; return true;
    default: return false;
    }
}

ncclRedOp_t nccl_op(fl_reduce_op op) {
    switch (op) {
    case FL_REDUCE_AVG: return ncclAvg;
    case FL_REDUCE_MAX: return ncclMax;
    case FL_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

int unique_id(unsigned char id[128]) {
    ncclUniqueId u;
    static_assert(sizeof u == 128, "NCCL's unique id is 128 bytes");
    ncclResult_t r = api.get_unique_id(&u);
    if (r != ncclSuccess) return nccl_fail("ncclGetUniqueId", r);
    memcpy(id, &u, sizeof u);
    return FL_OK;
}

int comm_init(int nranks, const unsigned char id[128], int rank, int device_index, void **comm) {
    cudaError_t e = cudaSetDevice(device_index);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "nccl: cuda:%d: %s", device_index, cudaGetErrorString(e));
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t c = NULL;
    ncclResult_t r = api.comm_init_rank(&c, nranks, u, rank);
    if (r != ncclSuccess) return nccl_fail("ncclCommInitRank", r);
    *comm = c;
    return FL_OK;
}

void comm_free(void *comm) { api.comm_destroy((ncclComm_t)comm); }

int start(void *comm, int device_index, const fl_coll *c, void **req) {
    ncclDataType_t t;
    if (!nccl_type(c->dtype, &t))
        return fl_fail(FL_ERR_UNSUPPORTED, "nccl: no NCCL type for %s", fl_dtype_name(c->dtype));
    cudaError_t e = cudaSetDevice(device_index);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "nccl: cuda:%d: %s", device_index, cudaGetErrorString(e));
    ncclComm_t nc = (ncclComm_t)comm;
    cudaStream_t s = fl_cu_stream();
    size_t n = (size_t)c->count;
    ncclResult_t r = ncclSuccess;
    const char *what = "";
    switch (c->kind) {
    case FL_COLL_ALL_GATHER: /* send is always given (in place: our slot of recv) */
        r = api.all_gather(c->send, c->recv, n, t, nc, s);
        what = "ncclAllGather";
        break;
    case FL_COLL_REDUCE_SCATTER:
        r = api.reduce_scatter(c->send, c->recv, n, t, nccl_op(c->op), nc, s);
        what = "ncclReduceScatter";
        break;
    case FL_COLL_ALL_REDUCE:
        r = api.all_reduce(c->recv, c->recv, n, t, nccl_op(c->op), nc, s);
        what = "ncclAllReduce";
        break;
    case FL_COLL_BROADCAST:
        r = api.broadcast(c->recv, c->recv, n, t, c->root, nc, s);
        what = "ncclBroadcast";
        break;
    default:
        return fl_fail(FL_ERR_UNSUPPORTED, "nccl: collective kind %d", (int)c->kind);
    }
    if (r != ncclSuccess) return nccl_fail(what, r);
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, s);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "nccl: %s: cannot record its completion: %s", what,
                                         cudaGetErrorString(e));
    *req = (void *)ev;
    return FL_OK;
}

int test(void *req, bool *done) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)req);
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        *done = false;
        return FL_OK;
    }
    cudaEventDestroy((cudaEvent_t)req);
    *done = true;
    return e == cudaSuccess ? FL_OK
                            : fl_fail(FL_ERR_DEVICE, "nccl: a collective failed on the device: %s",
                                      cudaGetErrorString(e));
}

const fl_device_comm_ops ops = {"nccl", unique_id, comm_init, comm_free, start, test};

} // namespace

extern "C" const fl_device_comm_ops *fl_cuda_nccl_ops(void) { return available() ? &ops : NULL; }
