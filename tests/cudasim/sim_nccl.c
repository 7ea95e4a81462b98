/*
 * sim_nccl.c: cudasim's stand-in for NCCL: the communicator and collective
 * entry points the NCCL backend calls, for ranks that are separate
 * processes on one machine (started by mpirun, or forked), so that the
 * backend's distributed code paths run and can be compared with the CPU on
 * machines without GPUs.
 *
 * Semantics follow the NCCL user guide: count arguments are per rank for
 * all-gather (sendcount) and reduce-scatter (recvcount); the in-place forms
 * are sendbuff == recvbuff + rank*sendcount (all-gather),
 * recvbuff == sendbuff + rank*recvcount (reduce-scatter) and
 * sendbuff == recvbuff (all-reduce, broadcast, reduce); broadcast reads
 * sendbuff on the root only; count 0 is a no-op. Reductions combine the
 * ranks in rank order 0..n-1, so every rank gets bit-identical results and
 * a test can recompute them exactly; 16-bit floats are accumulated in f32
 * and rounded once (sim_half.h, round to nearest even), ncclAvg is the sum
 * divided by nranks (integers truncate toward zero), integer overflow
 * wraps, and Max/Min propagate NaN (a NaN gradient should not vanish in a
 * simulation meant to catch mistakes).
 *
 * As in the rest of cudasim, "device" pointers are host pointers. Streams
 * are the simulated runtime's (sim_runtime.cc): on stream 0 a collective
 * has completed when the call returns; on a stream from cudaStreamCreate*
 * the call checks its arguments, queues the collective and returns
 * ncclSuccess, and the collective runs when this rank forces that stream
 * (cudaStreamSynchronize, cudaEventQuery/Synchronize of an event recorded
 * after it, cudaStreamWaitEvent(0, ...) on such an event, a stream-0
 * operation if the stream is blocking, cudaDeviceSynchronize). So results
 * are absent until the program waits for them, and a failure while it
 * runs (timeout, abort, mismatch) is reported as NCCL reports
 * asynchronous errors: on stderr, in ncclGetLastError and by
 * ncclCommGetAsyncError. A rank's queued collective runs only when that
 * rank forces it, where a GPU would run it on its own: a rank that blocks
 * on something else (an MPI call, say) that waits for another rank that
 * is forced into the collective waits until FSDP_COLLECTIVE_TIMEOUT.
 * ncclCommDestroy and ncclCommAbort run the collectives still queued
 * first (destroy implies ncclCommFinalize, which flushes them).
 *
 * Transport: the id made by ncclGetUniqueId is the name of a POSIX shared
 * memory segment (pid, time, counter, random bits). The first rank to reach
 * ncclCommInitRank creates it (O_EXCL settles who), sizes it and publishes
 * a magic word last; the others wait for the magic. The segment holds a
 * header, one record per rank (pid, a barrier epoch, the descriptor of the
 * collective the rank is in) and one staging slot per rank of a fixed chunk
 * size. A collective goes chunk by chunk: each rank copies its part into
 * its slot, barrier, each rank reads what it needs from all slots (and
 * reduces), barrier (so no slot is overwritten while someone still reads
 * it). The barrier is a monotonic per-rank epoch rather than one shared
 * sense-reversing counter, so that a rank that times out can name exactly
 * the ranks that did not arrive.
 *
 * Failure: every wait gives up after FSDP_COLLECTIVE_TIMEOUT seconds
 * (default 600) with ncclSystemError and a message on stderr naming the
 * call, the rank and the missing ranks, and raises an abort flag in the
 * shared header so the other ranks fail at once (also ncclSystemError)
 * instead of each waiting out its own timeout; ncclCommAbort raises it
 * too. A communicator that failed stays failed (ncclCommGetAsyncError).
 * Ranks that disagree on a collective (kind, count, type, op, root) fail
 * with ncclInvalidUsage on every rank, where real NCCL would hang or
 * compute garbage. ncclCommDestroy unmaps, and the last rank out unlinks
 * the segment; an abort or timeout unlinks it at once, so a rank that
 * crashed leaves nothing behind in /dev/shm.
 *
 * Not modelled: ncclGroupStart/End only count nesting (calls run or are
 * queued as outside a group, which is enough for one rank per process issuing the same sequence on
 * every rank, but a single thread driving several ranks in one group would
 * deadlock); user-defined reduction ops; fp8 types; config/split/
 * send/recv and the other entry points.
 *
 * Environment:
 *   FSDP_COLLECTIVE_TIMEOUT   seconds a rank waits for the others (600)
 *   SIM_NCCL_CHUNK_BYTES      staging slot size per rank (1 MiB), read by
 *                             the rank that creates the segment; tests make
 *                             it small to exercise chunking cheaply
 *
 * Build: gcc -std=c11 -O2 -fPIC -D_GNU_SOURCE -I/usr/local/cuda/include -c
 * (plus -lrt on old glibc for shm_open). The real nccl.h is included so the
 * compiler checks every definition against the real prototype. Not
 * thread-safe per communicator, as NCCL's communicators are not.
 */
#include <nccl.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim_half.h"

#include "sim_internal.h"

/* Weak, so the library links without a CUDA runtime (then every stream is
 * stream 0: collectives run when called); under cudasim they reach the
 * simulated runtime: ncclCommCuDevice reports the device that was current
 * at init, as NCCL does, and collectives go into the runtime's streams. */
#pragma weak cudaGetDevice
#pragma weak cudaDeviceSynchronize
#pragma weak fl_sim_stream_enqueue

#define SIM_MAGIC 0x4e43434c53494d31ull /* "NCCLSIM1" */
#define ID_PREFIX "/fsdp-sim-nccl-"
#define MAX_RANKS 4096
#define DEFAULT_CHUNK (1u << 20)
#define CACHE_LINE 64

/* What a rank is doing, published in its record so the others can check
 * that all ranks run the same collective with the same arguments. */
enum coll_kind { K_ALLGATHER = 1, K_REDUCESCATTER, K_ALLREDUCE, K_BROADCAST, K_REDUCE };

typedef struct {
    int32_t kind, dtype, op, root;
    uint64_t count, seq;
} coll_desc;

/* One cache line per rank, so that ranks spinning on each other's epochs
 * do not also contend with the owner's writes to its neighbours. */
typedef struct {
    _Alignas(CACHE_LINE) _Atomic int pid; /* 0 until the rank joined */
    _Atomic uint64_t epoch;               /* barriers this rank has reached */
    coll_desc desc;
} rank_rec;

typedef struct {
    _Atomic uint64_t magic; /* SIM_MAGIC once the creator has filled the rest */
    int32_t nranks;
    uint32_t chunk;         /* bytes per rank slot */
    uint64_t total_size;
    _Atomic int joined;     /* ranks that finished joining */
    _Atomic int left;       /* ranks that destroyed their communicator */
    _Atomic int abort_by;   /* 0, or 1 + the rank that raised the abort */
    char abort_reason[512];
} shm_hdr;

struct ncclComm {
    shm_hdr *hdr;
    rank_rec *recs;
    unsigned char *slots;
    size_t map_size;
    int rank, nranks, device;
    double timeout_s;
    uint64_t epoch, seq;
    ncclResult_t async_err;
    int pending; /* collectives queued on deferred streams, not yet run */
    char name[NCCL_UNIQUE_ID_BYTES];
};

static char last_error[1024];
static int group_depth;

static void set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

/* Argument errors: remembered for ncclGetLastError, as NCCL does (it also
 * logs them with NCCL_DEBUG=WARN; we stay quiet so tests of refusals do
 * not flood stderr). */
static ncclResult_t invalid(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return r;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double env_timeout(void) {
    const char *s = getenv("FSDP_COLLECTIVE_TIMEOUT");
    if (s && *s) {
        char *end;
        double v = strtod(s, &end);
        if (end != s && v > 0) return v;
    }
    return 600.0;
}

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0; /* fp8 and anything out of range: not modelled */
    }
}

static const char *coll_name(int kind) {
    switch (kind) {
    case K_ALLGATHER: return "ncclAllGather";
    case K_REDUCESCATTER: return "ncclReduceScatter";
    case K_ALLREDUCE: return "ncclAllReduce";
    case K_BROADCAST: return "ncclBroadcast";
    case K_REDUCE: return "ncclReduce";
    default: return "?";
    }
}

/* ---- waiting ------------------------------------------------------------ */

/* Yield for the first spins (the others are usually close behind), then
 * sleep briefly so waiting ranks leave the cores to the ones working. */
static void backoff(unsigned *spins) {
    if (*spins < 200) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
    }
    (*spins)++;
}

static void unlink_name(const char *name) { shm_unlink(name); }

/* Raise the shared abort flag; the first raiser's reason is the one kept,
 * so every rank reports the root cause rather than "someone aborted". */
static void raise_abort(struct ncclComm *c, const char *reason) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&c->hdr->abort_by, &expected, c->rank + 1)) {
        snprintf(c->hdr->abort_reason, sizeof c->hdr->abort_reason, "%s", reason);
        /* Unlink now: if ranks died, nobody would be left to do it. */
        unlink_name(c->name);
    }
}

/* Fails the communicator: remembers the error, prints it, raises abort. */
static ncclResult_t comm_fail(struct ncclComm *c, ncclResult_t r, const char *msg) {
    set_error("%s", msg);
    fprintf(stderr, "sim_nccl: %s\n", msg);
    c->async_err = r;
    raise_abort(c, msg);
    return r;
}

static ncclResult_t aborted_elsewhere(struct ncclComm *c, const char *what) {
    int by = atomic_load(&c->hdr->abort_by);
    char msg[1024];
    if (by - 1 == c->rank)
        snprintf(msg, sizeof msg, "%s on rank %d of %d: communicator failed earlier (%.600s)", what, c->rank, c->nranks,
                 c->hdr->abort_reason);
    else
        snprintf(msg, sizeof msg, "%s on rank %d of %d: communicator aborted by rank %d (%.600s)", what, c->rank, c->nranks,
                 by - 1, c->hdr->abort_reason);
    set_error("%s", msg);
    fprintf(stderr, "sim_nccl: %s\n", msg);
    c->async_err = ncclSystemError;
    return ncclSystemError;
}

/* Lists the ranks whose epoch is below target (or which never joined, for
 * target 0) into buf. */
static void missing_ranks(struct ncclComm *c, uint64_t target, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int q = 0; q < c->nranks && used + 16 < n; q++) {
        int missing = target ? atomic_load(&c->recs[q].epoch) < target : atomic_load(&c->recs[q].pid) == 0;
        if (missing) used += (size_t)snprintf(buf + used, n - used, "%s%d", used ? "," : "", q);
    }
}

/* Barrier: publish this rank's new epoch, wait until every rank has
 * reached it. A rank can only be one barrier ahead of the slowest (it
 * waits for all at each), so ">= target" never confuses barriers. */
static ncclResult_t barrier(struct ncclComm *c, const char *what) {
    uint64_t target = ++c->epoch;
    atomic_store(&c->recs[c->rank].epoch, target);
    double deadline = now_s() + c->timeout_s;
    unsigned spins = 0;
    for (;;) {
        int q = 0;
        while (q < c->nranks && atomic_load(&c->recs[q].epoch) >= target) q++;
        if (q == c->nranks) return ncclSuccess;
        if (atomic_load(&c->hdr->abort_by)) return aborted_elsewhere(c, what);
        if ((spins & 63) == 0 && now_s() > deadline) {
            char miss[512], msg[1024];
            missing_ranks(c, target, miss, sizeof miss);
            snprintf(msg, sizeof msg,
                     "%s timed out after %g s (FSDP_COLLECTIVE_TIMEOUT) on rank %d of %d (pid %d): "
                     "rank(s) %s did not arrive",
                     what, c->timeout_s, c->rank, c->nranks, (int)getpid(), miss);
            return comm_fail(c, ncclSystemError, msg);
        }
        backoff(&spins);
    }
}

/* ---- version, ids, errors ------------------------------------------------ */

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return invalid(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static unsigned counter;
    if (!uniqueId) return invalid(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* Random bits keep ids of different processes with recycled pids (in
     * containers, say) apart; no need for quality, only for difference. */
    uint64_t rnd = (uint64_t)ts.tv_nsec * 6364136223846793005ull ^ (uint64_t)getpid() << 32;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        uint64_t r;
        if (read(fd, &r, sizeof r) == (ssize_t)sizeof r) rnd ^= r;
        close(fd);
    }
    memset(uniqueId, 0, sizeof *uniqueId);
    snprintf(uniqueId->internal, sizeof uniqueId->internal, ID_PREFIX "%d-%lld%09ld-%u-%016llx", (int)getpid(),
             (long long)ts.tv_sec, ts.tv_nsec, counter++, (unsigned long long)rnd);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm; /* process-wide, as in NCCL */
    return last_error;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return invalid(ncclInvalidUsage, "ncclGroupEnd: not in a group (no matching ncclGroupStart)");
    group_depth--;
    return ncclSuccess;
}

/* ---- communicators ---------------------------------------------------------- */

static int valid_id(const ncclUniqueId *id) {
    size_t n = strnlen(id->internal, sizeof id->internal);
    return n < sizeof id->internal && strncmp(id->internal, ID_PREFIX, strlen(ID_PREFIX)) == 0 &&
           !strchr(id->internal + 1, '/');
}

static size_t layout_size(int nranks, uint32_t chunk, size_t *recs_off, size_t *slots_off) {
    *recs_off = align_up(sizeof(shm_hdr), CACHE_LINE);
    *slots_off = align_up(*recs_off + (size_t)nranks * sizeof(rank_rec), CACHE_LINE);
    return *slots_off + (size_t)nranks * chunk;
}

static uint32_t env_chunk(void) {
    const char *s = getenv("SIM_NCCL_CHUNK_BYTES");
    if (s && *s) {
        long v = strtol(s, NULL, 10);
        /* At least one element of the widest type per rank for reduce-
         * scatter's split slot; 16-byte multiples keep elements aligned. */
        if (v >= 64 && v <= (1l << 30)) return (uint32_t)align_up((size_t)v, 16);
    }
    return DEFAULT_CHUNK;
}

static ncclResult_t init_fail(struct ncclComm *c, int fd, ncclResult_t r, int unlink_it, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (r == ncclSystemError) fprintf(stderr, "sim_nccl: %s\n", last_error);
    if (unlink_it) unlink_name(c->name);
    if (fd >= 0) close(fd);
    if (c->hdr) munmap(c->hdr, c->map_size);
    free(c);
    return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    if (!comm) return invalid(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS)
        return invalid(ncclInvalidArgument, "ncclCommInitRank: nranks %d out of range [1, %d]", nranks, MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return invalid(ncclInvalidArgument, "ncclCommInitRank: rank %d out of range [0, %d)", rank, nranks);
    if (!valid_id(&commId))
        return invalid(ncclInvalidArgument, "ncclCommInitRank: commId was not made by ncclGetUniqueId");

    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return invalid(ncclSystemError, "ncclCommInitRank: out of CPU memory");
    memcpy(c->name, commId.internal, sizeof c->name);
    c->rank = rank;
    c->nranks = nranks;
    c->timeout_s = env_timeout();
    if (cudaGetDevice) {
        int dev = 0;
        if (cudaGetDevice(&dev) == cudaSuccess) c->device = dev;
    }
    double deadline = now_s() + c->timeout_s;
    size_t recs_off, slots_off;

    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        /* Creator: size and fill the segment, publish the magic last. */
        uint32_t chunk = env_chunk();
        size_t size = layout_size(nranks, chunk, &recs_off, &slots_off);
        /* posix_fallocate so a full /dev/shm is an error now, not a SIGBUS
         * in the middle of a collective. */
        int e = posix_fallocate(fd, 0, (off_t)size);
        if (e) return init_fail(c, fd, ncclSystemError, 1, "ncclCommInitRank: cannot size shared memory %s to %zu bytes: %s",
                                c->name, size, strerror(e));
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            return init_fail(c, fd, ncclSystemError, 1, "ncclCommInitRank: mmap %s: %s", c->name, strerror(errno));
        c->hdr = p;
        c->map_size = size;
        c->hdr->nranks = nranks;
        c->hdr->chunk = chunk;
        c->hdr->total_size = size;
        atomic_store(&c->hdr->magic, SIM_MAGIC);
    } else if (errno == EEXIST) {
        unsigned spins = 0;
        /* Another rank created it; it may not have been sized yet. */
        while ((fd = shm_open(c->name, O_RDWR, 0600)) < 0) {
            if (errno != ENOENT || now_s() > deadline)
                return init_fail(c, -1, ncclSystemError, 0, "ncclCommInitRank: rank %d cannot open shared memory %s: %s", rank,
                                 c->name, strerror(errno));
            backoff(&spins);
        }
        struct stat st;
        for (;;) {
            if (fstat(fd, &st) != 0)
                return init_fail(c, fd, ncclSystemError, 0, "ncclCommInitRank: fstat %s: %s", c->name, strerror(errno));
            if ((size_t)st.st_size >= sizeof(shm_hdr)) break;
            if (now_s() > deadline)
                return init_fail(c, fd, ncclSystemError, 0,
                                 "ncclCommInitRank: rank %d timed out waiting for the creator of %s to size it", rank, c->name);
            backoff(&spins);
        }
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            return init_fail(c, fd, ncclSystemError, 0, "ncclCommInitRank: mmap %s: %s", c->name, strerror(errno));
        c->hdr = p;
        c->map_size = (size_t)st.st_size;
        while (atomic_load(&c->hdr->magic) != SIM_MAGIC) {
            if (now_s() > deadline)
                return init_fail(c, fd, ncclSystemError, 0,
                                 "ncclCommInitRank: rank %d timed out waiting for %s to be initialised", rank, c->name);
            backoff(&spins);
        }
        if (c->hdr->nranks != nranks)
            return init_fail(c, fd, ncclInvalidUsage, 0, "ncclCommInitRank: rank %d says nranks %d, rank(s) before it said %d", rank,
                             nranks, c->hdr->nranks);
        if (c->hdr->total_size != c->map_size)
            return init_fail(c, fd, ncclInternalError, 0, "ncclCommInitRank: shared memory %s has %zu bytes, header says %llu",
                             c->name, c->map_size, (unsigned long long)c->hdr->total_size);
        layout_size(nranks, c->hdr->chunk, &recs_off, &slots_off);
    } else {
        return init_fail(c, -1, ncclSystemError, 0, "ncclCommInitRank: shm_open %s: %s", c->name, strerror(errno));
    }
    close(fd); /* the mapping keeps the segment */
    c->recs = (rank_rec *)((char *)c->hdr + recs_off);
    c->slots = (unsigned char *)c->hdr + slots_off;

    if (atomic_load(&c->hdr->abort_by)) {
        ncclResult_t r = aborted_elsewhere(c, "ncclCommInitRank");
        munmap(c->hdr, c->map_size);
        free(c);
        return r;
    }
    int expected = 0;
    if (!atomic_compare_exchange_strong(&c->recs[rank].pid, &expected, (int)getpid())) {
        /* Not fatal to the others: the rightful rank may still come. */
        ncclResult_t r = invalid(ncclInvalidUsage, "ncclCommInitRank: rank %d of %s already joined by pid %d", rank, c->name, expected);
        munmap(c->hdr, c->map_size);
        free(c);
        return r;
    }
    atomic_fetch_add(&c->hdr->joined, 1);
    /* NCCL's init synchronises the ranks; so does this. */
    unsigned spins = 0;
    while (atomic_load(&c->hdr->joined) < nranks) {
        if (atomic_load(&c->hdr->abort_by)) {
            ncclResult_t r = aborted_elsewhere(c, "ncclCommInitRank");
            munmap(c->hdr, c->map_size);
            free(c);
            return r;
        }
        if ((spins & 63) == 0 && now_s() > deadline) {
            char miss[512], msg[1024];
            missing_ranks(c, 0, miss, sizeof miss);
            snprintf(msg, sizeof msg,
                     "ncclCommInitRank timed out after %g s (FSDP_COLLECTIVE_TIMEOUT) on rank %d of %d (pid %d): "
                     "rank(s) %s did not join",
                     c->timeout_s, rank, nranks, (int)getpid(), miss);
            ncclResult_t r = comm_fail(c, ncclSystemError, msg);
            munmap(c->hdr, c->map_size);
            free(c);
            return r;
        }
        backoff(&spins);
    }
    *comm = c;
    return ncclSuccess;
}

/* Leaves the segment; the last rank out removes its name. */
static void comm_release(struct ncclComm *c) {
    if (atomic_fetch_add(&c->hdr->left, 1) + 1 == c->nranks) unlink_name(c->name);
    munmap(c->hdr, c->map_size);
    free(c);
}

/* Destroy and abort finish the collectives still queued on streams (NCCL's
 * ncclCommFinalize, which ncclCommDestroy implies, flushes uncompleted
 * operations), so none of them runs later on a freed communicator. After
 * an abort they fail at once. */
static void flush_pending(ncclComm_t comm) {
    if (comm->pending > 0 && cudaDeviceSynchronize) cudaDeviceSynchronize();
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return invalid(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    flush_pending(comm);
    comm_release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess; /* NCCL accepts NULL here */
    char msg[256];
    snprintf(msg, sizeof msg, "ncclCommAbort called on rank %d of %d (pid %d)", comm->rank, comm->nranks, (int)getpid());
    raise_abort(comm, msg);
    flush_pending(comm);
    comm_release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm) return invalid(ncclInvalidArgument, "ncclCommGetAsyncError: comm is NULL");
    if (!asyncError) return invalid(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    /* Another rank's abort is this communicator's error too: the next
     * collective would fail, so report it before anyone waits on one. */
    if (comm->async_err == ncclSuccess && atomic_load(&comm->hdr->abort_by)) comm->async_err = ncclSystemError;
    *asyncError = comm->async_err;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm) return invalid(ncclInvalidArgument, "ncclCommCount: comm is NULL");
    if (!count) return invalid(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm) return invalid(ncclInvalidArgument, "ncclCommUserRank: comm is NULL");
    if (!rank) return invalid(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!comm) return invalid(ncclInvalidArgument, "ncclCommCuDevice: comm is NULL");
    if (!device) return invalid(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

/* ---- reductions ------------------------------------------------------------ */

/* Reduces element range [0, n) of the nranks sources src[q] (each at byte
 * stride 0 from its own base) into dst, in rank order. Integers are
 * combined as unsigned where overflow is possible so that they wrap
 * instead of being undefined. */
#define NAN_MAX(a, b) ((a) != (a) || (b) != (b) ? (a) + (b) : ((a) > (b) ? (a) : (b)))
#define NAN_MIN(a, b) ((a) != (a) || (b) != (b) ? (a) + (b) : ((a) < (b) ? (a) : (b)))

#define REDUCE_INT(T, U)                                                                         \
    static void reduce_##T(T *dst, const unsigned char *const *src, int nr, size_t n, int op) { \
        for (size_t i = 0; i < n; i++) {                                                         \
            T a = ((const T *)src[0])[i];                                                        \
            for (int q = 1; q < nr; q++) {                                                       \
                T b = ((const T *)src[q])[i];                                                    \
                switch (op) {                                                                    \
                case ncclSum: case ncclAvg: a = (T)((U)a + (U)b); break;                         \
                case ncclProd: a = (T)((U)a * (U)b); break;                                      \
                case ncclMax: a = a > b ? a : b; break;                                          \
                default: a = a < b ? a : b; break;                                               \
                }                                                                                \
            }                                                                                    \
            if (op == ncclAvg) a = (T)(a / (T)nr);                                               \
            dst[i] = a;                                                                          \
        }                                                                                        \
    }

REDUCE_INT(int8_t, uint32_t)
REDUCE_INT(uint8_t, uint32_t)
REDUCE_INT(int32_t, uint32_t)
REDUCE_INT(uint32_t, uint32_t)
REDUCE_INT(int64_t, uint64_t)
REDUCE_INT(uint64_t, uint64_t)

/* T: storage type, A: accumulation type, LOAD/STORE convert. */
#define REDUCE_FLOAT(NAME, T, A, LOAD, STORE)                                                     \
    static void reduce_##NAME(T *dst, const unsigned char *const *src, int nr, size_t n, int op) { \
        for (size_t i = 0; i < n; i++) {                                                          \
            A a = LOAD(((const T *)src[0])[i]);                                                   \
            for (int q = 1; q < nr; q++) {                                                        \
                A b = LOAD(((const T *)src[q])[i]);                                               \
                switch (op) {                                                                     \
                case ncclSum: case ncclAvg: a = a + b; break;                                     \
                case ncclProd: a = a * b; break;                                                  \
                case ncclMax: a = NAN_MAX(a, b); break;                                           \
                default: a = NAN_MIN(a, b); break;                                                \
                }                                                                                 \
            }                                                                                     \
            if (op == ncclAvg) a = a / (A)nr;                                                     \
            dst[i] = STORE(a);                                                                    \
        }                                                                                         \
    }

#define ID(x) (x)
REDUCE_FLOAT(f16, uint16_t, float, f16_to_f32, f32_to_f16)
REDUCE_FLOAT(bf16, uint16_t, float, bf16_to_f32, f32_to_bf16)
REDUCE_FLOAT(f32, float, float, ID, ID)
REDUCE_FLOAT(f64, double, double, ID, ID)

static void reduce(ncclDataType_t t, void *dst, const unsigned char *const *src, int nr, size_t n, int op) {
    switch (t) {
    case ncclInt8: reduce_int8_t(dst, src, nr, n, op); break;
    case ncclUint8: reduce_uint8_t(dst, src, nr, n, op); break;
    case ncclInt32: reduce_int32_t(dst, src, nr, n, op); break;
    case ncclUint32: reduce_uint32_t(dst, src, nr, n, op); break;
    case ncclInt64: reduce_int64_t(dst, src, nr, n, op); break;
    case ncclUint64: reduce_uint64_t(dst, src, nr, n, op); break;
    case ncclFloat16: reduce_f16(dst, src, nr, n, op); break;
    case ncclBfloat16: reduce_bf16(dst, src, nr, n, op); break;
    case ncclFloat32: reduce_f32(dst, src, nr, n, op); break;
    case ncclFloat64: reduce_f64(dst, src, nr, n, op); break;
    default: break; /* refused by check_args */
    }
}

/* ---- collectives ------------------------------------------------------------ */

static ncclResult_t check_args(const char *what, ncclComm_t comm, ncclDataType_t dt, int op, int root, int need_op,
                               int need_root) {
    if (!comm) return invalid(ncclInvalidArgument, "%s: comm is NULL", what);
    if (!type_size(dt)) return invalid(ncclInvalidArgument, "%s: datatype %d is not supported", what, (int)dt);
    if (need_op && (op < 0 || op >= ncclNumOps))
        return invalid(ncclInvalidArgument, "%s: reduction op %d is not supported (built-in ops only)", what, op);
    if (need_root && (root < 0 || root >= comm->nranks))
        return invalid(ncclInvalidArgument, "%s: root %d out of range [0, %d)", what, root, comm->nranks);
    return ncclSuccess;
}

/* Checks the communicator is usable, and after the first barrier of a
 * collective, that all ranks are running the same one. */
static ncclResult_t check_usable(ncclComm_t comm, const char *what) {
    /* The abort flag first: its reason (this rank's own timeout, or the
     * root cause elsewhere) says more than "already failed". */
    if (atomic_load(&comm->hdr->abort_by)) return aborted_elsewhere(comm, what);
    if (comm->async_err != ncclSuccess) {
        set_error("%s on rank %d: communicator already failed (%s)", what, comm->rank, ncclGetErrorString(comm->async_err));
        return comm->async_err;
    }
    return ncclSuccess;
}

static ncclResult_t check_same(ncclComm_t c, const coll_desc *d, int use_root) {
    for (int q = 0; q < c->nranks; q++) {
        const coll_desc *o = &c->recs[q].desc;
        if (o->kind != d->kind || o->count != d->count || o->dtype != d->dtype || o->op != d->op ||
            (use_root && o->root != d->root) || o->seq != d->seq) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "mismatched collectives: rank %d is in %s #%llu (count %llu, type %d, op %d, root %d), "
                     "rank %d in %s #%llu (count %llu, type %d, op %d, root %d)",
                     c->rank, coll_name(d->kind), (unsigned long long)d->seq, (unsigned long long)d->count, d->dtype, d->op,
                     d->root, q, coll_name(o->kind), (unsigned long long)o->seq, (unsigned long long)o->count, o->dtype,
                     o->op, o->root);
            return comm_fail(c, ncclInvalidUsage, msg);
        }
    }
    return ncclSuccess;
}

/* Publishes what this rank is about to run; compared after the first
 * barrier. All ranks check all records, so all fail together. */
static void post_desc(ncclComm_t c, coll_desc *d, int kind, size_t count, ncclDataType_t dt, int op, int root) {
    d->kind = kind;
    d->count = count;
    d->dtype = dt;
    d->op = op;
    d->root = root;
    d->seq = ++c->seq;
    c->recs[c->rank].desc = *d; /* ordered before the barrier's release store */
}

/* One driver for all five, in two halves. coll_check refuses bad
 * arguments when the call is made (their return code is the call's, as in
 * NCCL); coll_run moves the data when the collective runs (at once on
 * stream 0, or when its stream is forced): per step, `put` elements of
 * this rank's data go into its slot, barrier, results are read out,
 * barrier. A failure in coll_run is the communicator's (async_err), which
 * is all a queued collective can report. */
typedef struct {
    int kind, op, root;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    ncclDataType_t dt;
    ncclComm_t comm;
} coll_call;

static ncclResult_t coll_check(coll_call *k) {
    const char *what = coll_name(k->kind);
    ncclComm_t c = k->comm;
    int need_op = k->kind == K_REDUCESCATTER || k->kind == K_ALLREDUCE || k->kind == K_REDUCE;
    int need_root = k->kind == K_BROADCAST || k->kind == K_REDUCE;
    ncclResult_t r = check_args(what, c, k->dt, k->op, k->root, need_op, need_root);
    if (r != ncclSuccess) return r;
    if (!need_op) k->op = 0;
    if (!need_root) k->root = 0;
    if ((r = check_usable(c, what)) != ncclSuccess) return r;
    if (k->count == 0) return ncclSuccess;
    const size_t es = type_size(k->dt);
    if ((k->kind == K_ALLGATHER || k->kind == K_REDUCESCATTER) && k->count > SIZE_MAX / es / (size_t)c->nranks)
        return invalid(ncclInvalidArgument, "%s: count %zu overflows", what, k->count);
    int send_used = k->kind != K_BROADCAST || c->rank == k->root;
    int recv_used = k->kind != K_REDUCE || c->rank == k->root;
    if ((send_used && !k->sendbuff) || (recv_used && !k->recvbuff))
        return invalid(ncclInvalidArgument, "%s: %s is NULL on rank %d", what,
                       send_used && !k->sendbuff ? "sendbuff" : "recvbuff", c->rank);
    return ncclSuccess;
}

static ncclResult_t coll_run(const coll_call *k) {
    const int kind = k->kind, op = k->op, root = k->root;
    const size_t count = k->count;
    const ncclDataType_t dt = k->dt;
    ncclComm_t c = k->comm;
    const char *what = coll_name(kind);
    ncclResult_t r;
    /* Checked again: between a queued call and its run, the communicator
     * may have failed (another rank's abort or timeout). */
    if ((r = check_usable(c, what)) != ncclSuccess) return r;
    const int n = c->nranks, me = c->rank;
    const size_t es = type_size(dt);
    const int need_root = kind == K_BROADCAST || kind == K_REDUCE;

    /* Elements per step: reduce-scatter splits its slot among the n
     * destination blocks. */
    size_t step = c->hdr->chunk / es / (kind == K_REDUCESCATTER ? (size_t)n : 1);
    const unsigned char *send = k->sendbuff;
    unsigned char *recv = k->recvbuff, *mine = c->slots + (size_t)me * c->hdr->chunk;
    const unsigned char *srcs[MAX_RANKS];
    coll_desc d;
    post_desc(c, &d, kind, count, dt, op, root);

    for (size_t e0 = 0; e0 < count; e0 += step) {
        size_t m = count - e0 < step ? count - e0 : step, bytes = m * es;
        switch (kind) {
        case K_ALLGATHER: case K_ALLREDUCE: case K_REDUCE:
            memcpy(mine, send + e0 * es, bytes);
            break;
        case K_REDUCESCATTER:
            for (int q = 0; q < n; q++) memcpy(mine + (size_t)q * bytes, send + ((size_t)q * count + e0) * es, bytes);
            break;
        case K_BROADCAST:
            if (me == root) memcpy(mine, send + e0 * es, bytes);
            break;
        }
        if ((r = barrier(c, what)) != ncclSuccess) return r;
        if (e0 == 0 && (r = check_same(c, &d, need_root)) != ncclSuccess) return r;
        /* Reading from the slots (not from sendbuff) is what makes the
         * in-place forms safe: this step's input is already staged. */
        switch (kind) {
        case K_ALLGATHER:
            for (int q = 0; q < n; q++) memcpy(recv + ((size_t)q * count + e0) * es, c->slots + (size_t)q * c->hdr->chunk, bytes);
            break;
        case K_ALLREDUCE: case K_REDUCE:
            if (kind == K_ALLREDUCE || me == root) {
                for (int q = 0; q < n; q++) srcs[q] = c->slots + (size_t)q * c->hdr->chunk;
                reduce(dt, recv + e0 * es, srcs, n, m, op);
            }
            break;
        case K_REDUCESCATTER:
            for (int q = 0; q < n; q++) srcs[q] = c->slots + (size_t)q * c->hdr->chunk + (size_t)me * bytes;
            reduce(dt, recv + e0 * es, srcs, n, m, op);
            break;
        case K_BROADCAST:
            memcpy(recv + e0 * es, c->slots + (size_t)root * c->hdr->chunk, bytes);
            break;
        }
        if ((r = barrier(c, what)) != ncclSuccess) return r;
    }
    return ncclSuccess;
}

/* A queued collective, run when its stream is forced (sim_runtime.cc). */
static void queued_run(void *arg) {
    coll_call *k = arg;
    coll_run(k);
    k->comm->pending--;
    free(k);
}

/* The device faulted before the queued collective ran: it never will, as
 * on a dead CUDA context, so the communicator fails here and the other
 * ranks, who would wait for it, are told at once. */
static void queued_drop(void *arg) {
    coll_call *k = arg;
    ncclComm_t c = k->comm;
    char msg[256];
    snprintf(msg, sizeof msg, "%s on rank %d of %d (pid %d) never ran: the CUDA device faulted before its stream reached it",
             coll_name(k->kind), c->rank, c->nranks, (int)getpid());
    if (c->async_err == ncclSuccess) comm_fail(c, ncclUnhandledCudaError, msg);
    c->pending--;
    free(k);
}

/* Checks the call, then runs it now (stream 0) or queues it on stream. */
static ncclResult_t coll_submit(coll_call call, cudaStream_t stream) {
    ncclResult_t r = coll_check(&call);
    if (r != ncclSuccess || call.count == 0) return r; /* count 0: NCCL returns at once, no sync */
    if (!fl_sim_stream_enqueue) return coll_run(&call); /* linked without the runtime: stream 0 only */
    coll_call *k = malloc(sizeof *k);
    if (!k) return invalid(ncclSystemError, "%s: out of CPU memory", coll_name(call.kind));
    *k = call;
    call.comm->pending++;
    int queued = fl_sim_stream_enqueue(stream, queued_run, queued_drop, k);
    if (queued == 1) return ncclSuccess;
    call.comm->pending--;
    free(k);
    if (queued < 0)
        return invalid(ncclUnhandledCudaError, "%s: stream %p is not a CUDA stream", coll_name(call.kind), (void *)stream);
    return coll_run(&call);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream) {
    return coll_submit((coll_call){K_ALLGATHER, 0, 0, sendbuff, recvbuff, sendcount, datatype, comm}, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    return coll_submit((coll_call){K_REDUCESCATTER, (int)op, 0, sendbuff, recvbuff, recvcount, datatype, comm}, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return coll_submit((coll_call){K_ALLREDUCE, (int)op, 0, sendbuff, recvbuff, count, datatype, comm}, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return coll_submit((coll_call){K_BROADCAST, 0, root, sendbuff, recvbuff, count, datatype, comm}, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    return coll_submit((coll_call){K_REDUCE, (int)op, root, sendbuff, recvbuff, count, datatype, comm}, stream);
}
