/*
 * check_sim_nccl.c: checks sim_nccl.c, cudasim's multi-process NCCL, so
 * that the NCCL backend's tests can lean on it: for 2, 3 and 4 forked
 * ranks sharing one unique id (made in the parent before fork), every
 * collective for every datatype and reduction op, out of place and in
 * place, at sizes 1, odd and larger than the staging chunk (a 256-byte
 * chunk for the bulk, the default 1 MiB one for a few large cases), against
 * values recomputed here from every rank's inputs with an independent
 * reference (16-bit floats summed in f32 and rounded once, integers
 * wrapping, NaN propagating); inputs must come back unchanged, and outputs
 * a rank must not write (reduce off the root) keep their poison. Then the
 * failure paths: a rank that never calls the collective (the others must
 * fail with ncclSystemError within a few seconds under
 * FSDP_COLLECTIVE_TIMEOUT=1, naming it), a rank that never joins, a rank
 * that calls ncclCommAbort (the others fail at once though their timeout is
 * 600 s), ranks that disagree on the collective, a rank number claimed
 * twice, argument refusals; and that no shared memory segment is left in
 * /dev/shm afterwards.
 *
 * Then collectives on the simulated runtime's deferred streams
 * (sim_runtime.cc): queued on a non-blocking stream they have not run
 * (results absent, even to a stream-0 copy) until the rank forces them
 * (cudaEventQuery of the done event, cudaStreamSynchronize,
 * cudaStreamWaitEvent(0, done) before a stream-0 read, a stream-0
 * operation for a blocking stream, ncclCommDestroy); a timeout inside a
 * forced collective is reported (stderr, ncclCommGetAsyncError,
 * ncclGetLastError naming the missing rank) and the forcing call returns;
 * a queued collective that never runs because the device faulted fails
 * the communicator on every rank at once.
 *
 * One line per case; exit status non-zero on any failure.
 *
 * Built by mk/cuda.mk with the simulated runtime (sim_runtime.cc.o and
 * sim_fiber.cc.o from the cudasim object folder, linked with -lstdc++
 * -lpthread); run by tests/cudasim/run.sh.
 */
#include <nccl.h>

#include "sim_internal.h" /* fl_sim_fault, to fault the simulated device */

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sim_half.h"

#define POISON 0xA5
#define SMALL_CHUNK "256"

typedef struct {
    ncclDataType_t t;
    const char *name;
    size_t es;
    int is_float, is_signed;
} dtype_info;

static const dtype_info TYPES[] = {
    {ncclInt8, "i8", 1, 0, 1},     {ncclUint8, "u8", 1, 0, 0},     {ncclInt32, "i32", 4, 0, 1},
    {ncclUint32, "u32", 4, 0, 0},  {ncclInt64, "i64", 8, 0, 1},    {ncclUint64, "u64", 8, 0, 0},
    {ncclFloat16, "f16", 2, 1, 0}, {ncclBfloat16, "bf16", 2, 1, 0}, {ncclFloat32, "f32", 4, 1, 0},
    {ncclFloat64, "f64", 8, 1, 0},
};
#define NTYPES (sizeof TYPES / sizeof TYPES[0])
static const char *OP_NAMES[] = {"sum", "prod", "max", "min", "avg"};

enum { C_ALLGATHER, C_REDUCESCATTER, C_ALLREDUCE, C_BROADCAST, C_REDUCE };
static const char *COLL_NAMES[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce", "ncclBroadcast", "ncclReduce"};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- element access and the reference reduction ---------------------------- */

static uint64_t load_bits(const dtype_info *d, const void *buf, size_t i) {
    uint64_t v = 0;
    memcpy(&v, (const unsigned char *)buf + i * d->es, d->es); /* little endian */
    return v;
}

static void store_bits(const dtype_info *d, void *buf, size_t i, uint64_t v) {
    memcpy((unsigned char *)buf + i * d->es, &v, d->es);
}

static float to_f32(const dtype_info *d, uint64_t b) {
    switch (d->t) {
    case ncclFloat16: return f16_to_f32((uint16_t)b);
    case ncclBfloat16: return bf16_to_f32((uint16_t)b);
    default: return bits_f32((uint32_t)b);
    }
}

static uint64_t from_f32(const dtype_info *d, float f) {
    switch (d->t) {
    case ncclFloat16: return f32_to_f16(f);
    case ncclBfloat16: return f32_to_bf16(f);
    default: return f32_bits(f);
    }
}

static int is_nan_bits(const dtype_info *d, uint64_t b) {
    if (d->t == ncclFloat64) {
        double x;
        memcpy(&x, &b, 8);
        return isnan(x);
    }
    return isnan(to_f32(d, b));
}

/* Deterministic inputs: full-range integers (so sums and products wrap),
 * floats in [-15.6, 15.6] on a 1/64 grid (so 16-bit sums need rounding and
 * rounding at every step would show), and one NaN on rank 1 at element 3. */
static uint64_t gen_elem(const dtype_info *d, uint64_t seed, int rank, size_t i) {
    uint64_t h = splitmix(seed ^ splitmix((uint64_t)rank * 0x10001ull + i));
    if (!d->is_float) return d->es == 8 ? h : h & ((1ull << (8 * d->es)) - 1);
    double x = (double)((int)(h % 2001) - 1000) / 64.0;
    if (rank == 1 && i == 3) x = NAN;
    if (d->t == ncclFloat64) {
        uint64_t b;
        memcpy(&b, &x, 8);
        return b;
    }
    return from_f32(d, (float)x);
}

static void gen(const dtype_info *d, void *buf, size_t count, uint64_t seed, int rank) {
    for (size_t i = 0; i < count; i++) store_bits(d, buf, i, gen_elem(d, seed, rank, i));
}

static int64_t sext(const dtype_info *d, uint64_t v) {
    int sh = 64 - 8 * (int)d->es;
    return (int64_t)(v << sh) >> sh;
}

/* Written independently of sim_nccl.c's macros: integers in 64-bit
 * modular arithmetic truncated to the width, floats in the documented
 * accumulation type, ranks combined in order 0..n-1. */
static uint64_t ref_elem(const dtype_info *d, int op, const uint64_t *v, int n) {
    if (d->t == ncclFloat64) {
        double a, b;
        memcpy(&a, &v[0], 8);
        for (int q = 1; q < n; q++) {
            memcpy(&b, &v[q], 8);
            if (op == ncclSum || op == ncclAvg) a += b;
            else if (op == ncclProd) a *= b;
            else if (isnan(a) || isnan(b)) a = NAN;
            else if (op == ncclMax) a = b > a ? b : a;
            else a = b < a ? b : a;
        }
        if (op == ncclAvg) a /= n;
        uint64_t r;
        memcpy(&r, &a, 8);
        return r;
    }
    if (d->is_float) {
        float a = to_f32(d, v[0]);
        for (int q = 1; q < n; q++) {
            float b = to_f32(d, v[q]);
            if (op == ncclSum || op == ncclAvg) a += b;
            else if (op == ncclProd) a *= b;
            else if (isnan(a) || isnan(b)) a = NAN;
            else if (op == ncclMax) a = b > a ? b : a;
            else a = b < a ? b : a;
        }
        if (op == ncclAvg) a /= (float)n;
        return from_f32(d, a);
    }
    uint64_t mask = d->es == 8 ? ~0ull : (1ull << (8 * d->es)) - 1, a = v[0];
    for (int q = 1; q < n; q++) {
        uint64_t b = v[q];
        switch (op) {
        case ncclSum: case ncclAvg: a = (a + b) & mask; break;
        case ncclProd: a = (a * b) & mask; break;
        case ncclMax: a = d->is_signed ? (sext(d, b) > sext(d, a) ? b : a) : (b > a ? b : a); break;
        case ncclMin: a = d->is_signed ? (sext(d, b) < sext(d, a) ? b : a) : (b < a ? b : a); break;
        }
    }
    if (op == ncclAvg) a = d->is_signed ? (uint64_t)(sext(d, a) / n) & mask : a / (uint64_t)n;
    return a;
}

static int same_elem(const dtype_info *d, uint64_t a, uint64_t b) {
    return a == b || (d->is_float && is_nan_bits(d, a) && is_nan_bits(d, b));
}

/* ---- one collective call, checked ------------------------------------------ */

static int report(const char *what, const dtype_info *d, int op, size_t count, int inplace, int rank, size_t i, uint64_t got,
                  uint64_t want) {
    printf("  rank %d: %s %s %s count %zu %s: element %zu is 0x%llx, want 0x%llx\n", rank, what, d->name, op >= 0 ? OP_NAMES[op] : "",
           count, inplace ? "in place" : "out of place", i, (unsigned long long)got, (unsigned long long)want);
    return 1;
}

/* Runs one call of collective `coll` on this rank and checks its result;
 * returns the number of failures (0 or 1). */
static int one_case(ncclComm_t comm, int coll, const dtype_info *d, int op, size_t count, int inplace, int root, uint64_t seed) {
    int n, me;
    ncclCommCount(comm, &n);
    ncclCommUserRank(comm, &me);
    size_t es = d->es, total = (size_t)n * count;
    size_t send_n = coll == C_REDUCESCATTER ? total : count, recv_n = coll == C_ALLGATHER ? total : count;
    /* Every rank's input, so any rank's expected output can be computed. */
    unsigned char **all = malloc((size_t)n * sizeof *all);
    for (int q = 0; q < n; q++) {
        all[q] = malloc(send_n * es);
        gen(d, all[q], send_n, seed, q);
    }
    unsigned char *sendbuf, *recvbuf, *block = NULL;
    const void *sarg;
    void *rarg;
    if (!inplace) {
        sendbuf = malloc(send_n * es);
        memcpy(sendbuf, all[me], send_n * es);
        recvbuf = malloc(recv_n * es);
        memset(recvbuf, POISON, recv_n * es);
        sarg = sendbuf;
        rarg = recvbuf;
    } else if (coll == C_ALLGATHER) {
        /* sendbuff is this rank's block of recvbuff; the rest is poison */
        recvbuf = block = malloc(total * es);
        memset(block, POISON, total * es);
        memcpy(block + (size_t)me * count * es, all[me], count * es);
        sendbuf = NULL;
        sarg = block + (size_t)me * count * es;
        rarg = block;
    } else if (coll == C_REDUCESCATTER) {
        /* recvbuff is this rank's block of sendbuff */
        block = malloc(total * es);
        memcpy(block, all[me], total * es);
        sendbuf = NULL;
        recvbuf = block + (size_t)me * count * es;
        sarg = block;
        rarg = recvbuf;
    } else {
        recvbuf = block = malloc(count * es);
        if (coll == C_BROADCAST && me != root) memset(block, POISON, count * es);
        else memcpy(block, all[me], count * es);
        sendbuf = NULL;
        sarg = rarg = block;
    }

    ncclResult_t r = ncclInternalError;
    switch (coll) {
    case C_ALLGATHER: r = ncclAllGather(sarg, rarg, count, d->t, comm, 0); break;
    case C_REDUCESCATTER: r = ncclReduceScatter(sarg, rarg, count, d->t, (ncclRedOp_t)op, comm, 0); break;
    case C_ALLREDUCE: r = ncclAllReduce(sarg, rarg, count, d->t, (ncclRedOp_t)op, comm, 0); break;
    case C_BROADCAST: r = ncclBroadcast(sarg, rarg, count, d->t, root, comm, 0); break;
    case C_REDUCE: r = ncclReduce(sarg, rarg, count, d->t, (ncclRedOp_t)op, root, comm, 0); break;
    }
    int fails = 0;
    const char *what = coll >= 0 && coll < 5 ? COLL_NAMES[coll] : "?";
    if (r != ncclSuccess) {
        printf("  rank %d: %s %s count %zu returned %d (%s)\n", me, what, d->name, count, (int)r, ncclGetLastError(comm));
        fails = 1;
        goto out;
    }
    uint64_t *v = malloc((size_t)n * sizeof *v);
    for (size_t i = 0; i < recv_n && !fails; i++) {
        uint64_t want, got = load_bits(d, recvbuf, i);
        switch (coll) {
        case C_ALLGATHER: want = load_bits(d, all[i / count], i % count); break;
        case C_BROADCAST: want = load_bits(d, all[root], i); break;
        case C_REDUCE:
            if (me != root) { /* must not be written */
                uint64_t p = 0;
                memset(&p, POISON, es);
                want = inplace ? load_bits(d, all[me], i) : p;
                break;
            }
            /* fall through */
        default: {
            size_t src_i = coll == C_REDUCESCATTER ? (size_t)me * count + i : i;
            for (int q = 0; q < n; q++) v[q] = load_bits(d, all[q], src_i);
            want = ref_elem(d, op, v, n);
        }
        }
        if (!same_elem(d, got, want)) fails = report(what, d, op, count, inplace, me, i, got, want);
    }
    free(v);
    if (!inplace && !fails && memcmp(sendbuf, all[me], send_n * es) != 0) {
        printf("  rank %d: %s %s count %zu modified sendbuff\n", me, what, d->name, count);
        fails = 1;
    }
out:
    for (int q = 0; q < n; q++) free(all[q]);
    free(all);
    if (!inplace) {
        free(sendbuf);
        free(recvbuf);
    } else {
        free(block);
    }
    return fails;
}

/* All ranks agree on a case's result (through the simulation itself, which
 * by then has passed the cases before); rank 0 prints the line. */
static int agree(ncclComm_t comm, int fails, const char *line) {
    int me, total = fails;
    ncclCommUserRank(comm, &me);
    if (ncclAllReduce(&fails, &total, 1, ncclInt32, ncclSum, comm, 0) != ncclSuccess) total = fails + 1000;
    if (me == 0) printf("%s %s\n", total ? "FAIL" : "ok  ", line);
    return total != 0;
}

/* ---- children ----------------------------------------------------------------- */

typedef int (*child_fn)(int rank, int n, ncclUniqueId id);

static int init_or_report(ncclComm_t *comm, int n, ncclUniqueId id, int rank) {
    ncclResult_t r = ncclCommInitRank(comm, n, id, rank);
    if (r != ncclSuccess) printf("  rank %d: ncclCommInitRank returned %d: %s\n", rank, (int)r, ncclGetLastError(NULL));
    return r != ncclSuccess;
}

/* Every collective x type x op x size x placement, 256-byte chunks. */
static int child_all(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    int bad = 0, cnt = -1, rk = -1, dev = -1;
    /* chunk 256 bytes: 333 elements are 2..11 chunks, 133 with
     * reduce-scatter's slot split n ways */
    static const size_t sizes[] = {1, 7, 333};
    for (int coll = 0; coll < 5; coll++) {
        int reduces = coll == C_REDUCESCATTER || coll == C_ALLREDUCE || coll == C_REDUCE;
        for (size_t ti = 0; ti < NTYPES; ti++) {
            int fails = 0, calls = 0;
            for (int op = 0; op < (reduces ? 5 : 1); op++)
                for (size_t si = 0; si < 3; si++)
                    for (int inplace = 0; inplace < 2; inplace++) {
                        int root = (int)(si + (size_t)op) % n;
                        uint64_t seed = ((uint64_t)coll << 40) ^ (ti << 32) ^ ((uint64_t)op << 24) ^ (si << 8) ^ (uint64_t)inplace;
                        fails += one_case(comm, coll, &TYPES[ti], reduces ? op : -1, sizes[si], inplace, root, seed);
                        calls++;
                    }
            char line[200];
            snprintf(line, sizeof line, "N=%d %-17s %-4s %d calls (%ssizes 1,7,333, out of and in place, roots vary)", n,
                     COLL_NAMES[coll], TYPES[ti].name, calls, reduces ? "5 ops, " : "");
            bad |= agree(comm, fails, line);
        }
    }
    /* communicator queries and groups */
    int fails = 0;
    ncclCommCount(comm, &cnt);
    ncclCommUserRank(comm, &rk);
    ncclCommCuDevice(comm, &dev);
    int ver = 0;
    ncclGetVersion(&ver);
    fails += cnt != n || rk != rank || dev != 0 || ver != NCCL_VERSION_CODE;
    ncclResult_t ae = ncclInternalError;
    fails += ncclCommGetAsyncError(comm, &ae) != ncclSuccess || ae != ncclSuccess;
    fails += ncclGroupStart() != ncclSuccess;
    fails += one_case(comm, C_ALLREDUCE, &TYPES[8], ncclSum, 5, 0, 0, 77);
    fails += one_case(comm, C_ALLGATHER, &TYPES[2], -1, 3, 1, 0, 78);
    fails += ncclGroupEnd() != ncclSuccess;
    fails += ncclGroupEnd() != ncclInvalidUsage;
    char line[200];
    snprintf(line, sizeof line, "N=%d count/rank/device/version/async error queries, a group of two collectives", n);
    bad |= agree(comm, fails, line);

    /* Refusals: local checks, so every rank makes them and the ranks stay
     * in step; each must leave a reason in ncclGetLastError. */
    fails = 0;
    float x[4] = {0};
    struct {
        ncclResult_t got, want;
    } ref[] = {
        {ncclAllReduce(x, x, 1, ncclFloat8e4m3, ncclSum, comm, 0), ncclInvalidArgument},
        {ncclAllReduce(x, x, 1, ncclFloat32, ncclNumOps, comm, 0), ncclInvalidArgument},
        {ncclAllReduce(x, x, 1, ncclFloat32, (ncclRedOp_t)-1, comm, 0), ncclInvalidArgument},
        {ncclReduce(x, x, 1, ncclFloat32, ncclSum, n, comm, 0), ncclInvalidArgument},
        {ncclBroadcast(x, x, 1, ncclFloat32, -1, comm, 0), ncclInvalidArgument},
        {ncclAllGather(NULL, x, 1, ncclFloat32, comm, 0), ncclInvalidArgument},
        {ncclReduceScatter(x, NULL, 1, ncclFloat32, ncclSum, comm, 0), ncclInvalidArgument},
        {ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, NULL, 0), ncclInvalidArgument},
        {ncclCommCount(NULL, &cnt), ncclInvalidArgument},
        {ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, 0), ncclSuccess}, /* count 0: no-op */
    };
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++)
        if (ref[i].got != ref[i].want) {
            printf("  rank %d: refusal %zu returned %d, want %d\n", rank, i, (int)ref[i].got, (int)ref[i].want);
            fails++;
        }
    ncclResult_t rr = ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, comm, 0);
    fails += rr != ncclSuccess; /* still usable after the refusals */
    /* non-root sendbuff NULL is fine for broadcast; recvbuff for reduce */
    fails += ncclBroadcast(rank == 0 ? x : NULL, x, 2, ncclFloat32, 0, comm, 0) != ncclSuccess;
    fails += ncclReduce(x, rank == 0 ? x : NULL, 2, ncclFloat32, ncclMax, 0, comm, 0) != ncclSuccess;
    fails += strlen(ncclGetLastError(comm)) == 0;
    snprintf(line, sizeof line, "N=%d argument refusals (type, op, root, NULL buffers, NULL comm), count 0", n);
    bad |= agree(comm, fails, line);
    ncclCommDestroy(comm);
    return bad;
}

/* Larger than the default 1 MiB chunk. */
static int child_big(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    struct {
        int coll, ti, op;
        size_t count;
    } cases[] = {
        {C_ALLREDUCE, 8, ncclSum, 300001},     {C_ALLREDUCE, 6, ncclAvg, 600011},
        {C_ALLGATHER, 1, -1, 1100003},         {C_REDUCESCATTER, 7, ncclSum, 200003},
        {C_REDUCESCATTER, 4, ncclMax, 140001}, {C_BROADCAST, 9, -1, 140001},
        {C_REDUCE, 5, ncclProd, 150001},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fails = 0;
        for (int inplace = 0; inplace < 2; inplace++)
            fails += one_case(comm, cases[i].coll, &TYPES[cases[i].ti], cases[i].op, cases[i].count, inplace, (int)i % n, 1000 + i);
        char line[200];
        const dtype_info *d = &TYPES[cases[i].ti];
        snprintf(line, sizeof line, "N=%d %-17s %-4s %s count %zu (%.1f MiB per rank) with 1 MiB chunks, out of and in place", n,
                 COLL_NAMES[cases[i].coll], d->name, cases[i].op >= 0 ? OP_NAMES[cases[i].op] : "", cases[i].count,
                 (double)cases[i].count * d->es * (cases[i].coll == C_REDUCESCATTER ? n : 1) / 1048576.0);
        bad |= agree(comm, fails, line);
    }
    ncclCommDestroy(comm);
    return bad;
}

/* The last rank never calls the collective; the others must time out
 * (FSDP_COLLECTIVE_TIMEOUT=1) within a few seconds and name it. Exit
 * codes: 0 as expected, 1 otherwise. */
static int child_timeout(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    float x[3] = {1, 2, 3};
    int ok = 1;
    char want[64];
    snprintf(want, sizeof want, "rank(s) %d did not arrive", n - 1);
    if (rank == n - 1) {
        sleep(3); /* everyone else has given up by now */
        ncclResult_t ae = ncclSuccess;
        ncclCommGetAsyncError(comm, &ae);
        /* and a late call fails at once instead of waiting */
        double t0 = now_s();
        ncclResult_t r = ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, 0);
        ok = ae == ncclSystemError && r == ncclSystemError && now_s() - t0 < 0.5 && strstr(ncclGetLastError(comm), want);
        if (!ok) printf("  rank %d (late): async error %d, late call %d: %s\n", rank, (int)ae, (int)r, ncclGetLastError(comm));
    } else {
        double t0 = now_s();
        ncclResult_t r = ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, 0);
        double dt = now_s() - t0;
        ok = r == ncclSystemError && dt < 3.0 && strstr(ncclGetLastError(comm), want);
        if (!ok) printf("  rank %d: returned %d after %.2f s: %s\n", rank, (int)r, dt, ncclGetLastError(comm));
        /* a failed communicator stays failed */
        if (ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, 0) != ncclSystemError) ok = 0;
    }
    ncclCommDestroy(comm);
    return !ok;
}

/* The last rank never calls ncclCommInitRank. */
static int child_nojoin(int rank, int n, ncclUniqueId id) {
    if (rank == n - 1) return 0;
    ncclComm_t comm = (ncclComm_t)1;
    double t0 = now_s();
    ncclResult_t r = ncclCommInitRank(&comm, n, id, rank);
    char want[64];
    snprintf(want, sizeof want, "rank(s) %d did not join", n - 1);
    int ok = r == ncclSystemError && comm == NULL && now_s() - t0 < 3.0 && strstr(ncclGetLastError(NULL), want);
    if (!ok) printf("  rank %d: init returned %d: %s\n", rank, (int)r, ncclGetLastError(NULL));
    return !ok;
}

/* Rank 0 aborts after one good collective; the others, with the default
 * 600 s timeout, must fail at once. */
static int child_abort(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    double x[2] = {1, 2};
    int ok = ncclAllReduce(x, x, 2, ncclFloat64, ncclSum, comm, 0) == ncclSuccess && x[0] == n;
    if (rank == 0) {
        ok &= ncclCommAbort(comm) == ncclSuccess;
        return !ok;
    }
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(x, x, 2, ncclFloat64, ncclSum, comm, 0);
    double dt = now_s() - t0;
    ncclResult_t ae = ncclSuccess;
    ncclCommGetAsyncError(comm, &ae);
    ok &= r == ncclSystemError && ae == ncclSystemError && dt < 3.0 && strstr(ncclGetLastError(comm), "ncclCommAbort");
    if (!ok) printf("  rank %d: returned %d after %.2f s: %s\n", rank, (int)r, dt, ncclGetLastError(comm));
    ncclCommDestroy(comm);
    return !ok;
}

/* Rank 0 calls all-reduce with count 5, the others with 6: all must fail
 * with ncclInvalidUsage rather than hang or mix the data. */
static int child_mismatch(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    float x[6] = {0};
    ncclResult_t r = ncclAllReduce(x, x, rank == 0 ? 5 : 6, ncclFloat32, ncclSum, comm, 0);
    int ok = r == ncclInvalidUsage && strstr(ncclGetLastError(comm), "mismatched");
    if (!ok) printf("  rank %d: returned %d: %s\n", rank, (int)r, ncclGetLastError(comm));
    ncclCommDestroy(comm);
    return !ok;
}

/* n processes, the last claiming rank 0 again, in an (n-1)-rank
 * communicator: exactly one claimant of rank 0 gets ncclInvalidUsage
 * (exit 3), everyone else a working communicator (exit 0). */
static int child_dup(int rank, int n, ncclUniqueId id) {
    int r_claim = rank == n - 1 ? 0 : rank;
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, n - 1, id, r_claim);
    if (r == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "already joined")) return 3;
    if (r != ncclSuccess) {
        printf("  process %d: init returned %d: %s\n", rank, (int)r, ncclGetLastError(NULL));
        return 1;
    }
    float x = 1;
    int ok = ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, 0) == ncclSuccess && x == (float)(n - 1);
    /* Stay a while: a refused claimant arriving after the last rank left
     * would find no segment, create a new one and wait for nobody. */
    usleep(500000);
    ncclCommDestroy(comm);
    return !ok;
}

/* ---- collectives on deferred streams ---------------------------------------- */

#define SM 37 /* elements per rank: not a multiple of anything */

static int count_not(const float *y, size_t n, float v) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += y[i] != v;
    return bad;
}

/* Every rank queues, checks that nothing arrived, forces, checks that all
 * did; in lock step (each forcing call meets the others' in the
 * collective). agree() runs on stream 0, at once. */
static int child_streams(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    cudaStream_t s, blocking;
    cudaEvent_t done;
    int bad = 0, fails;
    char line[200];
    fails = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess;
    fails += cudaStreamCreate(&blocking) != cudaSuccess;
    fails += cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess;

    /* all-reduce, forced by polling the done event */
    float x[SM], y[SM * 4], host[SM * 4];
    for (int i = 0; i < SM; i++) x[i] = (float)(rank + 1 + i);
    for (int i = 0; i < SM; i++) y[i] = -1;
    fails += ncclAllReduce(x, y, SM, ncclFloat32, ncclSum, comm, s) != ncclSuccess;
    fails += cudaEventRecord(done, s) != cudaSuccess;
    fails += count_not(y, SM, -1); /* absent */
    fails += cudaEventQuery(done) != cudaSuccess;
    for (int i = 0; i < SM; i++) fails += y[i] != (float)(n * (n + 1) / 2 + n * i);
    snprintf(line, sizeof line, "N=%d all-reduce on a non-blocking stream: absent until cudaEventQuery(done), then present", n);
    bad |= agree(comm, fails, line);

    /* all-gather read by stream 0: without a wait the copy sees nothing,
     * after cudaStreamWaitEvent(0, done) everything */
    fails = 0;
    for (int i = 0; i < SM * n; i++) y[i] = -1;
    for (int i = 0; i < SM; i++) x[i] = (float)(rank * 100 + i);
    fails += ncclAllGather(x, y, SM, ncclFloat32, comm, s) != ncclSuccess;
    fails += cudaEventRecord(done, s) != cudaSuccess;
    fails += cudaMemcpy(host, y, sizeof(float) * SM * n, cudaMemcpyDeviceToHost) != cudaSuccess;
    fails += count_not(host, (size_t)SM * n, -1);
    fails += cudaStreamWaitEvent(0, done, 0) != cudaSuccess;
    fails += cudaMemcpy(host, y, sizeof(float) * SM * n, cudaMemcpyDeviceToHost) != cudaSuccess;
    for (int q = 0; q < n; q++)
        for (int i = 0; i < SM; i++) fails += host[q * SM + i] != (float)(q * 100 + i);
    snprintf(line, sizeof line, "N=%d all-gather: a stream-0 copy without a wait sees nothing, after cudaStreamWaitEvent(0, done) all", n);
    bad |= agree(comm, fails, line);

    /* reduce-scatter forced by cudaStreamSynchronize; a broadcast on a
     * blocking stream, forced by the next stream-0 operation */
    fails = 0;
    float big[SM * 4];
    for (int i = 0; i < SM * n; i++) big[i] = (float)(rank + i);
    for (int i = 0; i < SM; i++) y[i] = -1;
    fails += ncclReduceScatter(big, y, SM, ncclFloat32, ncclMax, comm, s) != ncclSuccess;
    fails += count_not(y, SM, -1);
    fails += cudaStreamSynchronize(s) != cudaSuccess;
    for (int i = 0; i < SM; i++) fails += y[i] != (float)(n - 1 + rank * SM + i);
    for (int i = 0; i < SM; i++) x[i] = rank == 1 % n ? (float)(7 * i) : -2;
    fails += ncclBroadcast(x, x, SM, ncclFloat32, 1 % n, comm, blocking) != ncclSuccess;
    fails += rank != 1 % n && count_not(x, SM, -2);
    fails += cudaMemcpy(host, x, sizeof(float) * SM, cudaMemcpyDeviceToHost) != cudaSuccess;
    for (int i = 0; i < SM; i++) fails += host[i] != (float)(7 * i);
    snprintf(line, sizeof line, "N=%d reduce-scatter forced by cudaStreamSynchronize, broadcast on a blocking stream by cudaMemcpy", n);
    bad |= agree(comm, fails, line);

    /* ncclCommDestroy runs what is still queued (finalize flushes) */
    for (int i = 0; i < SM; i++) y[i] = -1, x[i] = 1;
    fails = ncclAllReduce(x, y, SM, ncclFloat32, ncclSum, comm, s) != ncclSuccess;
    fails += count_not(y, SM, -1);
    fails += ncclCommDestroy(comm) != ncclSuccess;
    fails += count_not(y, SM, (float)n);
    if (fails) printf("  rank %d: a collective queued at ncclCommDestroy: %d failures\n", rank, fails);
    cudaStreamDestroy(s);
    cudaStreamDestroy(blocking);
    cudaEventDestroy(done);
    return bad | (fails != 0);
}

/* The timeout inside a forced collective: the last rank never calls; the
 * others' queued all-reduce runs when they poll the done event, times out
 * (FSDP_COLLECTIVE_TIMEOUT=1) naming it, and the poll returns. */
static int child_stream_timeout(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    cudaStream_t s;
    cudaEvent_t done;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    float x[3] = {1, 2, 3};
    char want[64];
    snprintf(want, sizeof want, "rank(s) %d did not arrive", n - 1);
    int ok;
    ncclResult_t ae = ncclSuccess;
    if (rank == n - 1) {
        sleep(3);
        /* the others' abort is this rank's error, and a call now is refused at once */
        ncclCommGetAsyncError(comm, &ae);
        ncclResult_t r = ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, s);
        ok = ae == ncclSystemError && r == ncclSystemError;
        if (!ok) printf("  rank %d (late): async error %d, late call %d\n", rank, (int)ae, (int)r);
    } else {
        ncclResult_t r = ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, s);
        cudaEventRecord(done, s);
        ncclCommGetAsyncError(comm, &ae);
        ok = r == ncclSuccess && ae == ncclSuccess; /* queued: nothing known yet */
        double t0 = now_s();
        cudaError_t q = cudaEventQuery(done);
        double dt = now_s() - t0;
        ncclCommGetAsyncError(comm, &ae);
        ok = ok && q == cudaSuccess && dt < 3.0 && ae == ncclSystemError && strstr(ncclGetLastError(comm), want);
        if (!ok)
            printf("  rank %d: queued call %d, query %d after %.2f s, async error %d: %s\n", rank, (int)r, (int)q, dt,
                   (int)ae, ncclGetLastError(comm));
    }
    ncclCommDestroy(comm);
    return !ok;
}

/* Rank 0's device faults (a simulated kernel fault) before its queued
 * all-reduce runs: forcing the stream reports the fault and drops the
 * collective, which fails rank 0's communicator and, through the abort
 * flag, the others' at once (their timeout is 600 s). */
static int child_stream_fault(int rank, int n, ncclUniqueId id) {
    ncclComm_t comm;
    if (init_or_report(&comm, n, id, rank)) return 1;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float x[3] = {1, 2, 3};
    int ok = ncclAllReduce(x, x, 3, ncclFloat32, ncclSum, comm, s) == ncclSuccess;
    /* every rank has queued it before rank 0's abort (a stream-0
     * all-reduce runs at once, the queued one stays queued) */
    int one = 1, sum = 0;
    ok = ok && ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comm, 0) == ncclSuccess && sum == n;
    double t0 = now_s();
    if (rank == 0) fl_sim_fault(cudaErrorLaunchFailure, "check_sim_nccl: a fault on purpose, on rank 0");
    cudaError_t e = cudaStreamSynchronize(s);
    double dt = now_s() - t0;
    ncclResult_t ae = ncclSuccess;
    ncclCommGetAsyncError(comm, &ae);
    if (rank == 0) ok = ok && e == cudaErrorLaunchFailure && ae == ncclUnhandledCudaError && x[0] == 1;
    else ok = ok && e == cudaSuccess && ae == ncclSystemError && dt < 3.0 && strstr(ncclGetLastError(comm), "faulted");
    if (!ok)
        printf("  rank %d: sync %d after %.2f s, async error %d: %s\n", rank, (int)e, dt, (int)ae, ncclGetLastError(comm));
    ncclCommDestroy(comm);
    return !ok;
}

/* ---- parent ------------------------------------------------------------------- */

/* Forks n children running fn with one id made here; env_timeout and
 * env_chunk (NULL: unset) are the children's environment. Fills codes[]
 * with exit codes (-1: killed). Returns 0 if the segment is gone after. */
static int run_group(int n, child_fn fn, const char *env_timeout, const char *env_chunk, int *codes) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    if (env_timeout) setenv("FSDP_COLLECTIVE_TIMEOUT", env_timeout, 1);
    else unsetenv("FSDP_COLLECTIVE_TIMEOUT");
    if (env_chunk) setenv("SIM_NCCL_CHUNK_BYTES", env_chunk, 1);
    else unsetenv("SIM_NCCL_CHUNK_BYTES");
    fflush(stdout);
    pid_t pids[8];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            int rc = fn(i, n, id);
            fflush(stdout);
            _exit(rc);
        }
    }
    double deadline = now_s() + 300;
    for (int i = 0; i < n; i++) {
        int st;
        for (;;) {
            pid_t w = waitpid(pids[i], &st, WNOHANG);
            if (w == pids[i]) break;
            if (now_s() > deadline) { /* a hang is a failure, not a stuck CI */
                printf("  process %d hung, killing it\n", i);
                kill(pids[i], SIGKILL);
            }
            usleep(10000);
        }
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    char path[200];
    snprintf(path, sizeof path, "/dev/shm%s", id.internal);
    if (access(path, F_OK) == 0) {
        printf("  %s left behind\n", path);
        unlink(path);
        return 1;
    }
    return 0;
}

static int all_zero(const int *codes, int n) {
    for (int i = 0; i < n; i++)
        if (codes[i]) return 0;
    return 1;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int failed = 0, codes[8];
    /* before any fork: ids are unique and well formed */
    ncclUniqueId a, b;
    ncclGetUniqueId(&a);
    ncclGetUniqueId(&b);
    int ok = memcmp(&a, &b, sizeof a) != 0 && a.internal[0] == '/';
    ncclComm_t c = NULL;
    ok &= ncclCommInitRank(&c, 0, a, 0) == ncclInvalidArgument && ncclCommInitRank(&c, 2, a, 2) == ncclInvalidArgument &&
          ncclCommInitRank(&c, 2, a, -1) == ncclInvalidArgument && strlen(ncclGetLastError(NULL)) > 0;
    memset(&b, 0, sizeof b);
    ok &= ncclCommInitRank(&c, 1, b, 0) == ncclInvalidArgument; /* not an id */
    ok &= ncclGetErrorString(ncclSystemError) != NULL && ncclCommAbort(NULL) == ncclSuccess;
    printf("%s ids unique, init argument refusals, error strings\n", ok ? "ok  " : "FAIL");
    failed |= !ok;

    /* one rank alone works too */
    for (int n = 1; n <= 4; n++) {
        if (n == 1) {
            int leak = run_group(1, child_big, "30", SMALL_CHUNK, codes);
            ok = !leak && codes[0] == 0;
            printf("%s N=1 (a communicator of one)\n", ok ? "ok  " : "FAIL");
            failed |= !ok;
            continue;
        }
        int leak = run_group(n, child_all, "30", SMALL_CHUNK, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d all collectives, 256-byte chunks: processes exited cleanly, segment removed\n", ok ? "ok  " : "FAIL", n);
        failed |= !ok;

        leak = run_group(n, child_big, "60", NULL, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d large collectives: processes exited cleanly, segment removed\n", ok ? "ok  " : "FAIL", n);
        failed |= !ok;

        double t0 = now_s();
        leak = run_group(n, child_timeout, "1", NULL, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d timeout: rank %d never calls, the others fail with ncclSystemError naming it (%.1f s)\n",
               ok ? "ok  " : "FAIL", n, n - 1, now_s() - t0);
        failed |= !ok;

        leak = run_group(n, child_nojoin, "1", NULL, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d init timeout: rank %d never joins, the others fail naming it\n", ok ? "ok  " : "FAIL", n, n - 1);
        failed |= !ok;

        t0 = now_s();
        leak = run_group(n, child_abort, NULL, NULL, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d abort: rank 0 aborts, the others (timeout 600 s) fail at once (%.1f s)\n", ok ? "ok  " : "FAIL", n,
               now_s() - t0);
        failed |= !ok;

        leak = run_group(n, child_mismatch, "10", NULL, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d mismatched counts: every rank gets ncclInvalidUsage\n", ok ? "ok  " : "FAIL", n);
        failed |= !ok;

        leak = run_group(n, child_streams, "30", SMALL_CHUNK, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d collectives on deferred streams: processes exited cleanly, segment removed\n", ok ? "ok  " : "FAIL", n);
        failed |= !ok;

        t0 = now_s();
        leak = run_group(n, child_stream_timeout, "1", NULL, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d timeout inside a queued collective: forced by cudaEventQuery, reported, returns (%.1f s)\n",
               ok ? "ok  " : "FAIL", n, now_s() - t0);
        failed |= !ok;

        t0 = now_s();
        leak = run_group(n, child_stream_fault, NULL, NULL, codes);
        ok = !leak && all_zero(codes, n);
        printf("%s N=%d device fault before a queued collective: rank 0 drops it, the others fail at once (%.1f s)\n",
               ok ? "ok  " : "FAIL", n, now_s() - t0);
        failed |= !ok;

        leak = run_group(n + 1, child_dup, "10", NULL, codes);
        int threes = 0, zeros = 0;
        for (int i = 0; i < n + 1; i++) threes += codes[i] == 3, zeros += codes[i] == 0;
        ok = !leak && threes == 1 && zeros == n;
        printf("%s N=%d rank 0 claimed twice: one claimant refused with ncclInvalidUsage, the rest work\n", ok ? "ok  " : "FAIL", n);
        failed |= !ok;
    }
    printf("%s\n", failed ? "check_sim_nccl: FAILED" : "check_sim_nccl: all passed");
    return failed;
}
