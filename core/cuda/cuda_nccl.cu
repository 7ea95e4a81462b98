/*
 * cuda_nccl.cu: NCCL as the device library of core/dist (fl_device_comm_ops):
 * collectives on cuda tensors move GPU to GPU, in their own dtype (bf16
 * and ncclAvg natively), on a communication stream per device that waits
 * for the kernels queued before them (an event) and overlaps those queued
 * after; a work's test is an event query, its wait a device-side wait
 * ([Note: ordered collectives]), and a collective that never completes
 * aborts its communicator instead of hanging the process.
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
    decltype(&ncclCommAbort) comm_abort;
    decltype(&ncclCommGetAsyncError) get_async_error;
};

nccl_api api;
int loaded; /* 0 not tried, 1 ready, -1 unavailable */
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#ifdef FL_CUDASIM
bool load_library(void) {
    api = {ncclGetUniqueId, ncclCommInitRank,  ncclCommDestroy, ncclGetErrorString,
           ncclGetLastError, ncclAllGather,    ncclReduceScatter, ncclAllReduce,
           ncclBroadcast,   ncclCommAbort,     ncclCommGetAsyncError};
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
        sym(lib, "ncclAllReduce", &api.all_reduce) && sym(lib, "ncclBroadcast", &api.broadcast) &&
        sym(lib, "ncclCommAbort", &api.comm_abort) &&
        sym(lib, "ncclCommGetAsyncError", &api.get_async_error))
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

/* ---- communicators and requests ------------------------------------------ */

/* A group's communicator. After an abort NCCL has freed it: it is never
 * used or destroyed again, and every later collective fails with why. */
struct communicator {
    ncclComm_t nc;
    int device;
    bool aborted;
    char why[400];
};

/* A collective in flight: done is recorded on the communication stream
 * after the NCCL call. */
struct request {
    cudaEvent_t done;
    communicator *comm;
    char label[200];
    request *next; /* in the ordered list */
};

/* [Note: ordered collectives]
 * fl_work_wait on a device work does not block the host: order() makes the
 * compute stream wait for the collective's done event (as PyTorch's NCCL
 * works do), the work completes at once, and the request moves to this
 * list until its event is seen done. A host synchronisation behind such a
 * wait (a device-to-host copy, cudaFree) would block inside the driver,
 * without a deadline, if a rank never joined the collective: settle() runs
 * first at those points (cuda_backend.c) and polls the listed requests
 * with the collective timeout; past it, or when NCCL reports an
 * asynchronous error, the communicator is aborted (ncclCommAbort makes its
 * kernels return, so the streams drain) and the caller fails naming the
 * collective. */
request *ordered;       /* oldest first */
request **ordered_tail = &ordered;
int ordered_count;      /* read without the lock as a cheap "nothing to do" */

/* One non-blocking communication stream per device: collectives run there,
 * after an event on the compute stream (the legacy default stream, where
 * every kernel runs), so they overlap the kernels queued after them. */
cudaStream_t comm_streams[64];

int comm_stream(int device, cudaStream_t *s) {
    if (device < 0 || device >= 64) return fl_fail(FL_ERR_DEVICE, "nccl: cuda:%d: device index out of range", device);
    fl_cu_lock l(&lock);
    if (!comm_streams[device]) {
        cudaError_t e = cudaStreamCreateWithFlags(&comm_streams[device], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            comm_streams[device] = NULL;
            return fl_fail(FL_ERR_DEVICE, "nccl: cuda:%d: cannot create the communication stream: %s", device,
                           cudaGetErrorString(e));
        }
    }
    *s = comm_streams[device];
    return FL_OK;
}

/* Abort c (once) because of why; its streams drain, its collectives fail. */
void abort_comm(communicator *c, const char *why) {
    if (c->aborted) return;
    snprintf(c->why, sizeof c->why, "%s", why);
    c->aborted = true;
    if (api.comm_abort) api.comm_abort(c->nc);
    fprintf(stderr, "fsdp-lua: rank %d: %s; the NCCL communicator was aborted\n", fl_dist.topo.rank, why);
}

/* NCCL's asynchronous error of c as a failure (FL_OK when none). */
int async_error(communicator *c, const char *label) {
    if (c->aborted) return fl_fail(FL_ERR_DEVICE, "%s: %s (communicator aborted)", label, c->why);
    ncclResult_t r = ncclSuccess;
    if (!api.get_async_error || api.get_async_error(c->nc, &r) != ncclSuccess || r == ncclSuccess ||
        r == ncclInProgress)
        return FL_OK;
    char why[400];
    snprintf(why, sizeof why, "%s: NCCL reported an asynchronous error: %s", label, api.error_string(r));
    abort_comm(c, why);
    return fl_fail(FL_ERR_DEVICE, "%s", why);
}

/* Query r's event: 1 done, 0 not yet, -1 failed (error set). */
int query(request *r) {
    cudaError_t e = cudaEventQuery(r->done);
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return async_error(r->comm, r->label) == FL_OK ? 0 : -1;
    }
    if (e != cudaSuccess)
        return fl_fail(FL_ERR_DEVICE, "%s: failed on the device: %s", r->label, cudaGetErrorString(e)), -1;
    return async_error(r->comm, r->label) == FL_OK ? 1 : -1;
}

void free_request(request *r) {
    cudaEventDestroy(r->done);
    free(r);
}

/* Drop the ordered requests that are done; with `wait`, poll the others
 * (only those of `only`, if given) until done, giving up after the
 * collective timeout. A request that failed (or whose communicator was
 * aborted) is dropped too, and the first such failure is returned: each is
 * reported once, at the first synchronisation that sees it. Caller holds
 * the lock. */
int drain_ordered(bool wait, communicator *only) {
    int rc = FL_OK;
    char first[512] = "";
    double start = fl_dist_now();
    request **link = &ordered;
    while (*link) {
        request *r = *link;
        int q = r->comm->aborted
                    ? (fl_fail(FL_ERR_DEVICE, "%s: its communicator was aborted: %s", r->label, r->comm->why), -1)
                    : query(r);
        if (q == 0 && wait && (!only || r->comm == only)) {
            double waited = fl_dist_now() - start;
            if (waited > fl_dist_timeout()) {
                char why[400];
                snprintf(why, sizeof why,
                         "%s did not complete within %g s (the collective timeout, FSDP_COLLECTIVE_TIMEOUT): a "
                         "rank of the group has not started it, has failed, or started this group's "
                         "collectives in another order",
                         r->label, fl_dist_timeout());
                abort_comm(r->comm, why);
                fl_fail(FL_ERR_DEVICE, "%s", why);
                q = -1;
            } else {
                fl_dist_pause(waited);
                continue; /* poll r again */
            }
        }
        if (q < 0 && rc == FL_OK) {
            rc = fl_last_status();
            snprintf(first, sizeof first, "%s", fl_last_error());
        }
        if (q != 0) {
            *link = r->next;
            free_request(r);
            ordered_count--;
        } else {
            link = &r->next;
        }
    }
    ordered_tail = link;
    return rc == FL_OK ? FL_OK : fl_fail((fl_status)rc, "%s", first);
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
    ncclComm_t nc = NULL;
    ncclResult_t r = api.comm_init_rank(&nc, nranks, u, rank);
    if (r != ncclSuccess) return nccl_fail("ncclCommInitRank", r);
    communicator *c = (communicator *)calloc(1, sizeof *c);
    if (!c) {
        api.comm_destroy(nc);
        return fl_fail(FL_ERR_OOM, "nccl: out of memory for a communicator");
    }
    c->nc = nc;
    c->device = device_index;
    *comm = c;
    return FL_OK;
}

/* Collectives still ordered on c complete (or time out) first: destroying a
 * communicator with work in flight is undefined in NCCL. */
void comm_free(void *comm) {
    communicator *c = (communicator *)comm;
    {
        fl_cu_lock l(&lock);
        if (drain_ordered(true, c) != FL_OK)
            fprintf(stderr, "fsdp-lua: rank %d: %s\n", fl_dist.topo.rank, fl_last_error());
        drain_ordered(false, NULL);
        /* Requests of c that remain (aborted) are dropped with it. */
        request **link = &ordered;
        while (*link) {
            request *r = *link;
            if (r->comm == c) {
                *link = r->next;
                free_request(r);
                ordered_count--;
            } else {
                link = &r->next;
            }
        }
        ordered_tail = link;
    }
    if (!c->aborted) api.comm_destroy(c->nc);
    free(c);
}

int start(void *comm, int device_index, const fl_coll *c, const char *label, void **req) {
    communicator *cm = (communicator *)comm;
    ncclDataType_t t;
    if (!nccl_type(c->dtype, &t))
        return fl_fail(FL_ERR_UNSUPPORTED, "nccl: no NCCL type for %s", fl_dtype_name(c->dtype));
    if (cm->aborted) return fl_fail(FL_ERR_DEVICE, "the group's NCCL communicator was aborted earlier: %s", cm->why);
    cudaError_t e = cudaSetDevice(device_index);
    if (e != cudaSuccess) return fl_fail(FL_ERR_DEVICE, "nccl: cuda:%d: %s", device_index, cudaGetErrorString(e));
    cudaStream_t s = NULL;
    if (comm_stream(device_index, &s) != FL_OK) return fl_last_status();
    request *r = (request *)calloc(1, sizeof *r);
    if (!r) return fl_fail(FL_ERR_OOM, "nccl: out of memory for a request");
    snprintf(r->label, sizeof r->label, "%s", label);
    r->comm = cm;
    /* The collective reads what the kernels queued so far wrote: the
     * communication stream waits for the compute stream's work up to now. */
    cudaEvent_t ready;
    e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ready, fl_cu_stream());
        if (e == cudaSuccess) e = cudaStreamWaitEvent(s, ready, 0);
        cudaEventDestroy(ready); /* released once the wait is done with it */
    }
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(r);
        return fl_fail(FL_ERR_DEVICE, "%s: cannot order it after the compute stream: %s", label,
                       cudaGetErrorString(e));
    }
    ncclComm_t nc = cm->nc;
    size_t n = (size_t)c->count;
    ncclResult_t rr = ncclSuccess;
    const char *what = "";
    switch (c->kind) {
    case FL_COLL_ALL_GATHER: /* send is always given (in place: our slot of recv) */
        rr = api.all_gather(c->send, c->recv, n, t, nc, s);
        what = "ncclAllGather";
        break;
    case FL_COLL_REDUCE_SCATTER:
        rr = api.reduce_scatter(c->send, c->recv, n, t, nccl_op(c->op), nc, s);
        what = "ncclReduceScatter";
        break;
    case FL_COLL_ALL_REDUCE:
        rr = api.all_reduce(c->recv, c->recv, n, t, nccl_op(c->op), nc, s);
        what = "ncclAllReduce";
        break;
    case FL_COLL_BROADCAST:
        rr = api.broadcast(c->recv, c->recv, n, t, c->root, nc, s);
        what = "ncclBroadcast";
        break;
    default:
        free_request(r);
        return fl_fail(FL_ERR_UNSUPPORTED, "nccl: collective kind %d", (int)c->kind);
    }
    if (rr != ncclSuccess) {
        free_request(r);
        return nccl_fail(what, rr);
    }
    e = cudaEventRecord(r->done, s);
    if (e != cudaSuccess) {
        free_request(r);
        return fl_fail(FL_ERR_DEVICE, "nccl: %s: cannot record its completion: %s", what, cudaGetErrorString(e));
    }
    *req = r;
    return FL_OK;
}

int test(void *req, bool *done) {
    request *r = (request *)req;
    int q = query(r);
    *done = q != 0;
    if (q != 0) free_request(r);
    return q < 0 ? fl_last_status() : FL_OK;
}

/* The device's later work waits for req (which this file then owns). */
int order(void *req) {
    request *r = (request *)req;
    cudaError_t e = cudaStreamWaitEvent(fl_cu_stream(), r->done, 0);
    if (e != cudaSuccess) {
        int rc = fl_fail(FL_ERR_DEVICE, "%s: cannot order the compute stream after it: %s", r->label,
                         cudaGetErrorString(e));
        free_request(r);
        return rc;
    }
    fl_cu_lock l(&lock);
    r->next = NULL;
    *ordered_tail = r;
    ordered_tail = &r->next;
    ordered_count++;
    /* Drop what is done (keeps the list short); a collective found failed,
     * this one or an earlier one, fails the wait: its outputs are wrong. */
    return drain_ordered(false, NULL);
}

const fl_device_comm_ops ops = {"nccl", unique_id, comm_init, comm_free, start, test, order};

} // namespace

extern "C" const fl_device_comm_ops *fl_cuda_nccl_ops(void) { return available() ? &ops : NULL; }

extern "C" int fl_cuda_nccl_settle(void) {
    if (__atomic_load_n(&ordered_count, __ATOMIC_RELAXED) == 0) return FL_OK;
    fl_cu_lock l(&lock);
    return drain_ordered(true, NULL);
}
