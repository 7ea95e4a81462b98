/*
 * backend_self.c: the backend of a world of one rank, no MPI involved.
 *
 * Every group is this rank alone, so a collective is a copy (all_gather,
 * reduce_scatter: the one contribution is the result) or nothing, and it
 * completes when started. The core already skips the backend for groups
 * of one, so start() is reached only by a caller that bypasses that; it
 * is still correct. Point-to-point messages have no one to go to.
 */
#include "dist.h"

#include <string.h>

/* The one communicator: any non-NULL token. */
static int self_token;

static int self_init(fl_dist_topology *topo) {
    topo->rank = 0;
    topo->size = 1;
    topo->local_rank = 0;
    topo->local_size = 1;
    topo->node = 0;
    topo->nodes = 1;
    return FL_OK;
}

static void self_finalize(void) {}

static void *self_world(void) { return &self_token; }

static int self_split(void *comm, int color, int key, void **out) {
    *out = color < 0 ? NULL : &self_token;
    return FL_OK;
}

static int self_comm_rank(void *comm) { return 0; }
static int self_comm_size(void *comm) { return 1; }

static int self_world_ranks(void *comm, int *ranks) {
    ranks[0] = 0;
    return FL_OK;
}

static void self_comm_free(void *comm) {}

static int self_start(void *comm, const fl_coll *c, void **req) {
    *req = NULL;
    if ((c->kind == FL_COLL_ALL_GATHER || c->kind == FL_COLL_REDUCE_SCATTER) && c->send &&
        c->send != c->recv)
        memmove(c->recv, c->send, (size_t)c->count * fl_dtype_size(c->dtype));
    return FL_OK;
}

static int self_test(void *req, bool *done) {
    *done = true;
    return FL_OK;
}

static int self_p2p(void *comm, int peer, int tag, void *buf, int nbytes, void **req) {
    *req = NULL;
    return fl_set_error(FL_ERR_ARG, "self backend: no rank other than 0 to exchange messages "
                                    "with");
}

static int self_isend(void *comm, int dst, int tag, const void *buf, int nbytes, void **req) {
    return self_p2p(comm, dst, tag, NULL, nbytes, req);
}

static void self_abandon(void *req) {}

static void self_abort(int code) { exit(code); }

const fl_dist_backend fl_dist_self_backend = {
    .abi = FL_DIST_BACKEND_ABI,
    .name = "self",
    .init = self_init,
    .finalize = self_finalize,
    .world = self_world,
    .split = self_split,
    .comm_rank = self_comm_rank,
    .comm_size = self_comm_size,
    .world_ranks = self_world_ranks,
    .comm_free = self_comm_free,
    .start = self_start,
    .test = self_test,
    .isend = self_isend,
    .irecv = self_p2p,
    .abandon = self_abandon,
    .abort = self_abort,
};
