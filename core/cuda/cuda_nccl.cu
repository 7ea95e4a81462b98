/*
 * cuda_nccl.cu: NCCL as the device library of core/comm (fl_device_comm_ops):
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
 * after the NCCL call. Every request is on the in-flight list, in issue
 * order, until its event is seen done; until order() it belongs to its work
 * (test() frees it), after that to the list. */
struct request {
    cudaEvent_t done;
    communicator *comm;
    char label[200];
    bool ordered;  /* the compute stream waits for it; the list owns it */
    bool finished; /* seen done (or failed) while its work still holds it */
    bool failed;   /* ... and it had failed */
    request *next;
};

/* [Note: ordered collectives]
 * fl_work_wait on a device work does not block the host: order() makes the
 * compute stream wait for the collective's done event (as PyTorch's NCCL
 * works do) and the work completes at once. Every collective stays on the
 * in-flight list until its event is seen done. A host synchronisation
 * would block inside the driver, without a deadline, if a rank never
 * joined a collective it depends on: a copy or an id check on the compute
 * stream depends on the ordered collectives, cudaDeviceSynchronize and
 * cudaFree on every collective of the device. So settle(only_ordered) runs
 * first at those points (cuda_backend.c, the kernels' host reads, events)
 * and polls the collectives concerned, failing when one makes no progress
 * for the collective timeout or NCCL reports an asynchronous error. Then
 * every communicator with an unfinished collective issued up to that one
 * is aborted (one communication stream serves them all, so an earlier hung
 * collective blocks the later ones; ncclCommAbort makes their kernels
 * return and the stream drain), and the caller fails naming the collective.
 * A failure found by a caller that cannot report it (cudaFree inside the
 * caching pool) is kept and returned by the next one that can, so a step
 * never goes on with the outputs of a failed collective unannounced. */
request *inflight;            /* oldest first */
int inflight_count;           /* read without the lock as a cheap "nothing to do" */
char sticky_failure[512];     /* found by a quiet settle, not reported yet */

/* One non-blocking communication stream per device (fl_cuda_side_stream):
 * collectives run there, after an event on the compute stream (the legacy
 * default stream, where every kernel runs), so they overlap the kernels
 * queued after them. */
int comm_stream(int device, cudaStream_t *s) {
    uint64_t id = 0;
    if (fl_cuda_side_stream(device, FL_CUDA_COMM_STREAM, &id) != 0)
        return fl_fail(FL_ERR_DEVICE, "nccl: cuda:%d: cannot create the communication stream: %s", device,
                       fl_cuda_host_problem());
    *s = (cudaStream_t)(uintptr_t)id;
    return FL_OK;
}

/* Abort c (once) because of why; its streams drain, its collectives fail. */
void abort_comm(communicator *c, const char *why) {
    if (c->aborted) return;
    snprintf(c->why, sizeof c->why, "%s", why);
    c->aborted = true;
    if (api.comm_abort) api.comm_abort(c->nc);
    fprintf(stderr, "fsdp-lua: rank %d: %s; the NCCL communicator was aborted\n", fl_dist_rank(), why);
}

/* NCCL's asynchronous error of c as a failure (FL_OK when none). */
int async_error(communicator *c, const char *label) {
    if (c->aborted) return fl_fail(FL_ERR_DEVICE, "%s: its communicator was aborted: %s", label, c->why);
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
    if (r->comm->aborted) return async_error(r->comm, r->label), -1;
    cudaError_t e = cudaEventQuery(r->done);
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return async_error(r->comm, r->label) == FL_OK ? 0 : -1;
    }
    if (e != cudaSuccess)
        return fl_fail(FL_ERR_DEVICE, "%s: failed on the device: %s", r->label, cudaGetErrorString(e)), -1;
    return async_error(r->comm, r->label) == FL_OK ? 1 : -1;
}

/* Take r off the in-flight list (caller holds the lock). */
void unlink_request(request *r) {
    for (request **link = &inflight; *link; link = &(*link)->next)
        if (*link == r) {
            *link = r->next;
            inflight_count--;
            return;
        }
}

void free_request(request *r) {
    cudaEventDestroy(r->done);
    free(r);
}

/* Abort every communicator with an unfinished collective issued up to and
 * including `upto` on its device's stream: they block each other. */
void abort_upto(request *upto, const char *why) {
    for (request *r = inflight; r; r = r->next) {
        if (r->comm->device == upto->comm->device && !r->finished) abort_comm(r->comm, why);
        if (r == upto) break;
    }
}

/* Poll the in-flight collectives (the ordered ones only, or all of them)
 * until each is done, failed, or has made no progress for the collective
 * timeout; drop the ordered ones that ended. The first failure is returned
 * (error set); every other one was printed by abort_comm. Caller holds the
 * lock. */
int settle_locked(bool only_ordered) {
    int rc = FL_OK;
    char first[512] = "";
    double since = fl_dist_now(); /* the last progress */
    request **link = &inflight;
    while (*link) {
        request *r = *link;
        if (r->finished || (only_ordered && !r->ordered)) {
            link = &r->next;
            continue;
        }
        int q = query(r);
        if (q == 0) {
            double waited = fl_dist_now() - since;
            if (waited <= fl_dist_timeout()) {
                fl_dist_pause(waited);
                continue; /* poll r again */
            }
            char why[400];
            snprintf(why, sizeof why,
                     "%s did not complete within %g s (the collective timeout, FSDP_COLLECTIVE_TIMEOUT): a "
                     "rank of the group has not started it, has failed, or started this group's collectives "
                     "in another order",
                     r->label, fl_dist_timeout());
            abort_upto(r, why);
            fl_fail(FL_ERR_DEVICE, "%s", why);
            q = -1;
        }
        since = fl_dist_now();
        if (q < 0 && rc == FL_OK) {
            rc = fl_last_status();
            snprintf(first, sizeof first, "%s", fl_last_error());
        }
        if (r->ordered) {
            *link = r->next;
            inflight_count--;
            free_request(r);
        } else {
            r->finished = true; /* its work's test() frees it */
            r->failed = q < 0;
            link = &r->next;
        }
    }
    return rc == FL_OK ? FL_OK : fl_fail((fl_status)rc, "%s", first);
}

/* A settle whose caller reports failures (FL_OK or the error set); a
 * failure kept by an earlier quiet settle comes first. */
int settle_reporting(bool only_ordered) {
    fl_cu_lock l(&lock);
    int rc = settle_locked(only_ordered);
    if (sticky_failure[0]) {
        rc = fl_fail(FL_ERR_DEVICE, "%s", sticky_failure);
        sticky_failure[0] = 0;
    }
    return rc;
}

int unique_id(unsigned char id[128]) {
    ncclUniqueId u;
    static_assert(sizeof u == 128, "NCCL's unique id is 128 bytes");
    ncclResult_t r = api.get_unique_id(&u);
    if (r != ncclSuccess) return nccl_fail("ncclGetUniqueId", r);
    memcpy(id, &u, sizeof u);
    return FL_OK;
}

int check_device(int device_index) {
    cudaError_t e = cudaSetDevice(device_index);
    if (e == cudaSuccess) e = cudaFree(0); /* makes the context: fails on a broken device */
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fl_fail(FL_ERR_DEVICE, "nccl: cuda:%d: %s", device_index, cudaGetErrorString(e));
    }
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

/* Collectives still in flight on c complete (or time out) first:
 * destroying a communicator with work in flight is undefined in NCCL. */
void comm_free(void *comm) {
    communicator *c = (communicator *)comm;
    {
        fl_cu_lock l(&lock);
        if (settle_locked(false) != FL_OK)
            fprintf(stderr, "fsdp-lua: rank %d: %s\n", fl_dist_rank(), fl_last_error());
        /* What remains of c (aborted) goes with it. */
        request **link = &inflight;
        while (*link) {
            request *r = *link;
            if (r->comm == c && r->ordered) {
                *link = r->next;
                inflight_count--;
                free_request(r);
            } else {
                link = &r->next;
            }
        }
    }
    if (!c->aborted) api.comm_destroy(c->nc);
    free(c);
}

/* After a failure once the collective may be queued: nothing it uses may be
 * released before it has ended, so wait for it (with the timeout, aborting
 * its communicator past it). Caller holds the lock. */
void wait_queued(request *r, cudaStream_t s) {
    double start = fl_dist_now();
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e != cudaErrorNotReady) break;
        cudaGetLastError();
        double waited = fl_dist_now() - start;
        if (waited > fl_dist_timeout()) {
            abort_comm(r->comm, "a collective that failed to start properly did not end");
            start = fl_dist_now(); /* the abort lets the stream drain */
        }
        fl_dist_pause(waited);
    }
    cudaGetLastError();
}

int start(void *comm, int device_index, const fl_coll *c, const char *label, void **req) {
    communicator *cm = (communicator *)comm;
    ncclDataType_t t;
    if (!nccl_type(c->dtype, &t))
        return fl_fail(FL_ERR_UNSUPPORTED, "nccl: no NCCL type for %s", fl_dtype_name(c->dtype));
    if (cm->aborted) return fl_fail(FL_ERR_DEVICE, "the group's NCCL communicator was aborted earlier: %s", cm->why);
    {
        /* A failure found where it could not be reported is this caller's. */
        fl_cu_lock l(&lock);
        if (sticky_failure[0]) {
            int rc = fl_fail(FL_ERR_DEVICE, "%s", sticky_failure);
            sticky_failure[0] = 0;
            return rc;
        }
    }
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
    if (fl_cuda_stream_wait_stream(device_index, (uint64_t)(uintptr_t)s, 0) != 0) {
        free(r);
        return fl_fail(FL_ERR_DEVICE, "%s: cannot order it after the compute stream: %s", label,
                       fl_cuda_host_problem());
    }
    e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(r);
        return fl_fail(FL_ERR_DEVICE, "%s: cannot record its completion: %s", label, cudaGetErrorString(e));
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
        int rc = nccl_fail(what, rr);
        fl_cu_lock l(&lock);
        wait_queued(r, s); /* NCCL may have queued part of it */
        free_request(r);
        return rc;
    }
    e = cudaEventRecord(r->done, s);
    if (e != cudaSuccess) {
        int rc = fl_fail(FL_ERR_DEVICE, "nccl: %s: cannot record its completion: %s", what, cudaGetErrorString(e));
        fl_cu_lock l(&lock);
        wait_queued(r, s); /* its buffers are released on return */
        free_request(r);
        return rc;
    }
    fl_cu_lock l(&lock);
    request **link = &inflight;
    while (*link) link = &(*link)->next;
    *link = r;
    inflight_count++;
    *req = r;
    return FL_OK;
}

/* Done, or failed (error set): the request is freed either way. A failed
 * one is first waited for (its communicator is aborted, so the stream
 * drains), since its work then releases the buffers. */
int test(void *req, bool *done) {
    request *r = (request *)req;
    fl_cu_lock l(&lock);
    int q;
    if (r->finished)
        q = r->failed ? (fl_fail(FL_ERR_DEVICE, "%s: failed (reported above)", r->label), -1) : 1;
    else
        q = query(r);
    *done = q != 0;
    if (q == 0) return FL_OK;
    int rc = FL_OK;
    if (q < 0) {
        rc = fl_last_status();
        char keep[512];
        snprintf(keep, sizeof keep, "%s", fl_last_error());
        cudaEventSynchronize(r->done);
        cudaGetLastError();
        fl_fail((fl_status)rc, "%s", keep);
    }
    unlink_request(r);
    free_request(r);
    return rc;
}

/* The device's later work waits for req (which the in-flight list then
 * owns). Should the wait not be queued, the host waits instead, since the
 * work releases the collective's buffers on return. */
int order(void *req) {
    request *r = (request *)req;
    fl_cu_lock l(&lock);
    cudaError_t e = cudaSetDevice(r->comm->device);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(fl_cu_stream(), r->done, 0);
    if (e != cudaSuccess) {
        int rc = fl_fail(FL_ERR_DEVICE, "%s: cannot order the compute stream after it: %s", r->label,
                         cudaGetErrorString(e));
        char keep[512];
        snprintf(keep, sizeof keep, "%s", fl_last_error());
        r->ordered = true;
        settle_locked(false); /* the host waits (aborting past the timeout) */
        return fl_fail((fl_status)rc, "%s", keep);
    }
    r->ordered = true;
    if (r->finished) { /* seen done by a settle while its work held it */
        unlink_request(r);
        free_request(r);
    }
    return FL_OK;
}

const fl_device_comm_ops ops = {"nccl", unique_id, check_device, comm_init, comm_free, start, test, order};

} // namespace

extern "C" const fl_device_comm_ops *fl_cuda_nccl_ops(void) { return available() ? &ops : NULL; }

extern "C" int fl_cuda_nccl_settle(void) {
    if (__atomic_load_n(&inflight_count, __ATOMIC_RELAXED) == 0 && !sticky_failure[0]) return FL_OK;
    return settle_reporting(true);
}

extern "C" int fl_cuda_nccl_settle_device(void) {
    if (__atomic_load_n(&inflight_count, __ATOMIC_RELAXED) == 0 && !sticky_failure[0]) return FL_OK;
    return settle_reporting(false);
}

extern "C" void fl_cuda_nccl_settle_quietly(void) {
    if (__atomic_load_n(&inflight_count, __ATOMIC_RELAXED) == 0) return;
    fl_cu_lock l(&lock);
    if (settle_locked(false) != FL_OK && !sticky_failure[0])
        snprintf(sticky_failure, sizeof sticky_failure, "%s", fl_last_error());
}
