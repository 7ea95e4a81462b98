/*
 * dist_backend.h: the vtable a communication backend implements, shared by
 * the core (core/comm/) and the MPI plugin (core/comm/mpi/, built into
 * libfsdp_mpi.so).
 *
 * The plugin is a separate shared object so that libfsdp.so never links
 * libmpi: a plain run starts fast, prints nothing from MPI and works on
 * machines without it. Everything that does not need MPI (checking tensors,
 * staging bf16 in f32, averaging, timeouts, works, groups' names) stays in
 * the core, so a backend moves contiguous buffers and nothing else. The
 * plugin may call only public (FL_API) core functions, chiefly
 * fl_set_error to report failures; the core then prefixes the collective,
 * group and rank.
 *
 * Communicators and requests are opaque pointers owned by the backend.
 * FL_DIST_BACKEND_ABI changes whenever this file does, so a stale plugin is
 * refused with a message instead of misbehaving.
 */
#ifndef FL_DIST_BACKEND_H
#define FL_DIST_BACKEND_H

#include "fsdp.h"

enum { FL_DIST_BACKEND_ABI = 5 };

/* The symbol libfsdp_mpi.so exports: returns its vtable. */
#define FL_DIST_MPI_ENTRY "fl_dist_mpi_backend"

/* Where the process stands in the world, as the backend found it. */
typedef struct fl_dist_topology {
    int rank, size;
    int local_rank, local_size; /* on this node */
    int node, nodes;
} fl_dist_topology;

/* One collective over contiguous host buffers. count is per rank for
 * all_gather (each rank's contribution) and reduce_scatter (each rank's
 * result), the whole buffer for all_reduce and broadcast. send == NULL
 * means in place: all_gather's own slot of recv already holds the input;
 * all_reduce and broadcast always work in recv. Reductions never see f16,
 * bf16 or avg: the core stages those in f32 and divides itself. */
typedef struct fl_coll {
    fl_coll_kind kind;
    const void *send;
    void *recv;
    int64_t count;
    fl_dtype dtype;
    fl_reduce_op op; /* sum, max or min */
    int root;        /* broadcast: rank in the communicator */
} fl_coll;

/* A rank's answer to a roll call. */
typedef struct fl_roll_answer {
    bool answered;
    int world_rank;
    int in_flight;        /* collectives started and not complete */
    double since_last;    /* seconds since it started its latest one; < 0: none yet */
    double oldest;        /* age of its oldest collective in flight */
} fl_roll_answer;

typedef struct fl_dist_backend {
    int abi; /* FL_DIST_BACKEND_ABI */
    const char *name;
    /* Start (MPI_Init) and describe the world. */
    int (*init)(fl_dist_topology *topo);
    /* Stop; no call follows. */
    void (*finalize)(void);
    /* The world communicator (private to the core: a duplicate). */
    void *(*world)(void);
    /* Collective over comm: *out is the new communicator, NULL for a rank
     * that passed color < 0. */
    int (*split)(void *comm, int color, int key, void **out);
    int (*comm_rank)(void *comm);
    int (*comm_size)(void *comm);
    /* World ranks of comm's members, in comm order (comm_size entries). */
    int (*world_ranks)(void *comm, int *ranks);
    void (*comm_free)(void *comm);
    /* Start a collective; *req is NULL when it completed at once. */
    int (*start)(void *comm, const fl_coll *c, void **req);
    /* Progress; when *done the request is freed and must not be used. */
    int (*test)(void *req, bool *done);
    /* Point-to-point messages of a few bytes (the monitored barrier). */
    int (*isend)(void *comm, int dst, int tag, const void *buf, int nbytes, void **req);
    int (*irecv)(void *comm, int src, int tag, void *buf, int nbytes, void **req);
    /* Give up an unfinished request: a receive is cancelled, a send left
     * to finish alone (its buffer must stay valid). Frees req. */
    void (*abandon)(void *req);
    /* End every process of the job with this exit code. */
    void (*abort)(int code);
    /* [Note: the watch channel] (core/comm/mpi/backend_mpi.c); NULL in a
     * backend of one rank. roll_call asks every other member of comm what
     * it is doing and fills answers[i] for group rank i (this rank's own
     * entry says what it is doing), waiting at most `patience` seconds. */
    int (*roll_call)(void *comm, double patience, fl_roll_answer *answers);
    /* Tell every other rank that this one is leaving and why. */
    void (*leave)(const char *why);
    /* Progress the channel; left[r] = whether world rank r said it left
     * (this rank included once it called leave). Returns how many did. */
    int (*peers_left)(bool *left);
    /* Seconds during which at least one collective of `kind` (an
     * fl_coll_kind; -1: of any kind) was in flight, from its start until
     * the backend saw it complete: the time the link was busy with them,
     * overlapped or not. NULL: collectives complete as they start. */
    double (*busy_seconds)(int kind);
    /* Move up to max of the oldest completed collectives' records
     * ([Note: joined time], core/comm/mpi/backend_mpi.c) into out; returns
     * how many; *lost = records dropped unread since the previous call.
     * NULL: the backend keeps none. */
    int (*collective_log)(fl_coll_record *out, int max, int64_t *lost);
    /* Progress the collectives in flight once, unless another thread is
     * progressing them right now (never blocks): [Note: progress from
     * compute], core/comm/dist.c. NULL: nothing ever needs it. */
    void (*poke)(void);
} fl_dist_backend;

typedef const fl_dist_backend *(*fl_dist_backend_entry)(void);

#endif /* FL_DIST_BACKEND_H */
