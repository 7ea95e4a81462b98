/*
 * ring.c: all-gather, reduce-scatter and all-reduce as rings of
 * point-to-point messages, progressed like any other request of the MPI
 * plugin (by its progress thread and by test).
 *
 * [Note: ring collectives]
 * Open MPI 4.1 runs the non-blocking collectives FSDP needs through
 * libnbc, whose algorithms move far more than a ring: MPI_Ireduce_scatter_block
 * reduces the whole buffer to rank 0 along a binomial tree and scatters it
 * back (1.5 buffers cross a 2-rank link instead of half of one), and
 * MPI_Iallreduce in place, or on fewer than 4 ranks, is a binomial reduce
 * and broadcast (2 buffers instead of one). Measured on the cluster in a
 * box's shaped 1 Gbit/s link (benchmarks/link_rate.lua): all_gather 110
 * MB/s of ring wire bytes, reduce_scatter 42, all_reduce 61. So the plugin
 * runs these three itself when the buffer is large (FSDP_RING_MIN_BYTES,
 * default 64 KiB; smaller ones, the loss and the gradient norm, keep
 * libnbc's few-message algorithms) and FSDP_MPI_RING is not 0.
 * The ring's own gain, as libnbc's time over the ring's, in shared memory
 * (`benchmarks/ring_gain.sh [MIB]`: link_rate.lua with FSDP_MPI_RING=1
 * and 0, the fastest round of 3-5 runs each; 2026-12-06 by the machine's
 * clock, AMD EPYC (Zen 5), 2 cores shared with other jobs at load 11-16,
 * Open MPI 4.1.4; 16 MiB run twice, so its ranges are the noise, 64 MiB
 * once):
 *                     reduce_scatter  all_reduce  all_gather
 *   16 MiB, 2 ranks     3.0-5.5x       0.7-1.3x    0.95-1.07x
 *   16 MiB, 4 ranks     1.0-1.5x       0.9-1.1x    0.75-0.85x
 *   64 MiB, 2 ranks     3.7x           2.4x        0.63x
 *   64 MiB, 4 ranks     2.0x           1.9x        1.2x
 * So the gain is the reduce-scatter's, FSDP's every backward, and the
 * large all-reduce's; in shared memory the all-gather gains nothing
 * (libnbc's moves no more bytes there), and it stays a ring for its
 * crossing of each node's link once each way and one tag sequence with
 * the others.
 * Why not a library's ring. Gloo (Debian's libgloo-dev, a 2022 snapshot)
 * is C++, moves data over its own TCP or ibverbs transport (no shared
 * memory: ranks of one node would talk over loopback TCP instead of Open
 * MPI's vader), meets its ranks through a store of its own (a file, or
 * Redis through hiredis, which the package depends on), so a second
 * rendezvous and set of connections beside MPI's, and its algorithms'
 * run() blocks until done, so overlapping compute would take a thread per
 * collective. MPICH (Debian's mpich 4.0.2) has ring schedules for its
 * non-blocking all-gather and all-reduce (the `tsp_ring` algorithms of
 * MPIR_CVAR_I*_INTRA_ALGORITHM), but it is another MPI: the plugin would
 * link libmpich instead of Open MPI, and jobs would start under MPICH's
 * Hydra mpiexec rather than the mpirun and srun --mpi=pmix paths this
 * project runs and tests; one job cannot mix the two. This file is a
 * couple of hundred lines over MPI_Isend/MPI_Irecv, which Open MPI
 * already progresses.
 * The ring:
 *   - the buffer is cut into one block per rank (reduce-scatter's and
 *     all-gather's blocks are the ranks' own; an all-reduce's N elements
 *     are cut as evenly as they go);
 *   - reduce-scatter: P-1 steps; at step s rank r sends the block
 *     (r-s-1) mod P summed so far to rank r+1 and receives block
 *     (r-s-2) mod P from rank r-1, adding its own contribution
 *     (MPI_Reduce_local, MPI's own vectorised loops); after the last step
 *     it holds block r summed over all ranks;
 *   - all-gather: P-1 steps; at step s rank r sends block (r-s) mod P and
 *     receives block (r-s-1) mod P in place;
 *   - all-reduce: the reduce-scatter in place, then the all-gather, so
 *     every rank ends with the same bits.
 * Each rank sends (P-1)/P of the buffer per phase, what fsdp.plan.cost
 * prices, and a group laid out node by node crosses each node's link once
 * each way. Sums run in a fixed order for a given P (deterministic, but
 * not the order libnbc used). Every ring collective on a communicator
 * takes the next tag of that communicator's sequence (backend_mpi.c):
 * collectives start in the same order on every rank, so two rings in
 * flight on one communicator never take each other's messages.
 */
#include "ring.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum ring_phase { PHASE_REDUCE_SCATTER, PHASE_ALL_GATHER, PHASE_DONE };

struct mpi_ring {
    MPI_Comm comm;
    int rank, size, left, right, tag;
    MPI_Datatype type;
    MPI_Op op;
    int elem;            /* bytes per element */
    fl_coll_kind kind;
    int64_t block_count; /* reduce-scatter and all-gather: elements per block */
    int64_t total;       /* all-reduce: elements of the whole buffer */
    const char *input;   /* reduce-scatter: the caller's full send buffer */
    char *data;          /* all-gather and all-reduce: the full buffer */
    char *out;           /* reduce-scatter: the caller's block */
    char *scratch[2];    /* received partial sums */
    enum ring_phase phase;
    int step;
    char *received;      /* where this step's block arrives */
    int64_t received_block;
    MPI_Request request[2]; /* [0] the receive, [1] the send */
};

bool mpi_ring_takes(const fl_coll *c, int size, int elem_size, long min_bytes) {
    if (size < 2) return false;
    int64_t elements;
    switch (c->kind) {
    case FL_COLL_ALL_GATHER:
    case FL_COLL_REDUCE_SCATTER: elements = c->count * size; break;
    case FL_COLL_ALL_REDUCE: elements = c->count; break;
    default: return false;
    }
    return elements >= size && elements * elem_size >= min_bytes;
}

static int wrap(int i, int size) { return ((i % size) + size) % size; }

/* Block i's first element and length. */
static void block(const mpi_ring *g, int i, int64_t *first, int64_t *count) {
    i = wrap(i, g->size);
    if (g->kind != FL_COLL_ALL_REDUCE) {
        *first = i * g->block_count;
        *count = g->block_count;
        return;
    }
    int64_t base = g->total / g->size, extra = g->total % g->size;
    *first = i * base + (i < extra ? i : extra);
    *count = base + (i < extra);
}

static char *at(char *buf, const mpi_ring *g, int64_t element) { return buf + element * g->elem; }

/* Post the receive and the send of the current step. */
static int post_step(mpi_ring *g) {
    int P = g->size, r = g->rank, s = g->step;
    int64_t send_first, send_count, recv_first, recv_count;
    const char *send;
    if (g->phase == PHASE_REDUCE_SCATTER) {
        block(g, r - s - 1, &send_first, &send_count);
        block(g, r - s - 2, &recv_first, &recv_count);
        g->received_block = wrap(r - s - 2, P);
        if (g->input) { /* reduce-scatter: partial sums travel in scratch */
            send = s == 0 ? g->input + send_first * g->elem : g->scratch[(s - 1) & 1];
            g->received = s == P - 2 ? g->out : g->scratch[s & 1];
        } else { /* all-reduce: partial sums accumulate in place */
            send = at(g->data, g, send_first);
            g->received = g->scratch[0];
        }
    } else {
        block(g, r - s, &send_first, &send_count);
        block(g, r - s - 1, &recv_first, &recv_count);
        send = at(g->data, g, send_first);
        g->received = at(g->data, g, recv_first);
    }
    int rc = MPI_Irecv(g->received, (int)recv_count, g->type, g->left, g->tag, g->comm, &g->request[0]);
    if (rc != MPI_SUCCESS) return rc;
    return MPI_Isend(send, (int)send_count, g->type, g->right, g->tag, g->comm, &g->request[1]);
}

/* The step's messages are done: add this rank's part to what arrived. */
static int finish_step(mpi_ring *g) {
    if (g->phase != PHASE_REDUCE_SCATTER) return MPI_SUCCESS;
    int64_t first, count;
    block(g, (int)g->received_block, &first, &count);
    if (g->input) /* own contribution + partial sum, into the received buffer */
        return MPI_Reduce_local(g->input + first * g->elem, g->received, (int)count, g->type, g->op);
    /* the received partial sum into this rank's block, in place */
    return MPI_Reduce_local(g->received, at(g->data, g, first), (int)count, g->type, g->op);
}

static void next_step(mpi_ring *g) {
    if (++g->step < g->size - 1) return;
    g->step = 0;
    g->phase = g->phase == PHASE_REDUCE_SCATTER && g->kind == FL_COLL_ALL_REDUCE ? PHASE_ALL_GATHER
                                                                                 : PHASE_DONE;
}

int mpi_ring_start(MPI_Comm comm, int rank, int size, int tag, const fl_coll *c,
                   MPI_Datatype type, MPI_Op op, mpi_ring **out) {
    *out = NULL;
    mpi_ring *g = calloc(1, sizeof *g);
    if (!g) return MPI_ERR_NO_MEM;
    g->comm = comm, g->rank = rank, g->size = size, g->tag = tag;
    g->left = wrap(rank - 1, size), g->right = wrap(rank + 1, size);
    g->type = type, g->op = op, g->kind = c->kind;
    MPI_Type_size(type, &g->elem);
    g->request[0] = g->request[1] = MPI_REQUEST_NULL;
    int64_t scratch_bytes = 0;
    switch (c->kind) {
    case FL_COLL_ALL_GATHER:
        g->block_count = c->count;
        g->data = c->recv;
        g->phase = PHASE_ALL_GATHER;
        if (c->send) memcpy(at(g->data, g, rank * c->count), c->send, (size_t)(c->count * g->elem));
        break;
    case FL_COLL_REDUCE_SCATTER:
        g->block_count = c->count;
        g->input = c->send;
        g->out = c->recv;
        g->phase = PHASE_REDUCE_SCATTER;
        scratch_bytes = c->count * g->elem;
        break;
    default: /* FL_COLL_ALL_REDUCE */
        g->total = c->count;
        g->data = c->recv;
        g->phase = PHASE_REDUCE_SCATTER;
        scratch_bytes = (c->count / size + 1) * g->elem;
        break;
    }
    if (scratch_bytes > 0) {
        g->scratch[0] = malloc((size_t)scratch_bytes);
        g->scratch[1] = g->input ? malloc((size_t)scratch_bytes) : NULL;
        if (!g->scratch[0] || (g->input && !g->scratch[1])) {
            mpi_ring_free(g);
            return MPI_ERR_NO_MEM;
        }
    }
    int rc = post_step(g);
    if (rc != MPI_SUCCESS) {
        mpi_ring_free(g);
        return rc;
    }
    *out = g;
    return MPI_SUCCESS;
}

int mpi_ring_progress(mpi_ring *g, bool *done) {
    while (g->phase != PHASE_DONE) {
        int flag = 0;
        int rc = MPI_Testall(2, g->request, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
        if (!flag) {
            *done = false;
            return MPI_SUCCESS;
        }
        if ((rc = finish_step(g)) != MPI_SUCCESS) return rc;
        next_step(g);
        if (g->phase != PHASE_DONE && (rc = post_step(g)) != MPI_SUCCESS) return rc;
    }
    *done = true;
    return MPI_SUCCESS;
}

void mpi_ring_free(mpi_ring *g) {
    if (!g) return;
    bool sending = g->request[1] != MPI_REQUEST_NULL;
    if (g->request[0] != MPI_REQUEST_NULL) {
        MPI_Cancel(&g->request[0]);
        MPI_Request_free(&g->request[0]);
    }
    if (sending) MPI_Request_free(&g->request[1]); /* finishes alone */
    /* A send still in flight may read scratch: left allocated then. */
    if (!sending) free(g->scratch[0]), free(g->scratch[1]);
    free(g);
}
