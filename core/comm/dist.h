/*
 * dist.h: what the files of core/comm share inside the core, in the order
 * of their layers ([Note: the layers of core/comm] in collectives.c):
 * transport (the runtime's state, groups' and communicators' structures,
 * the clock, messages, the roll call, device tensors' host staging), work
 * (the work structure and what starts, finishes and drains works), and the
 * API's own (initialising on first use, resolving a group, a group's device
 * path). A declaration sits in the section of the file that defines it.
 */
#ifndef FL_DIST_H
#define FL_DIST_H

#include "dist_backend.h"
#include "internal.h"

/* ==== transport: transport.c, communicator.c, device_path.c, backend_self.c ==== */

typedef struct fl_dist_state {
    bool initialized;
    bool finalized;
    const fl_dist_backend *backend;
    void *plugin;          /* dlopen handle of libfsdp_mpi.so, or NULL */
    fl_dist_topology topo; /* after FSDP_RANKS_PER_NODE */
    double timeout;        /* seconds a wait may last */
    fl_group *world;       /* the state's own reference */
    fl_work *dropped;      /* released before completion: finished later */
    /* Device communicators of released groups, destroyed at finalize in
     * creation order ([Note: destroying device communicators]). */
    struct fl_retired_comm {
        int seq;
        const struct fl_device_comm_ops *ops;
        void *comm;
    } *retired;
    int n_retired, cap_retired;
    int device_comms_made; /* creation counter: the same on every rank */
    /* A collective failed while the backend still held its request (a
     * timeout): its buffers are kept for good and no collective may start
     * again ([Note: a collective that never completes] in work.c). */
    bool broken;
    char broken_message[512];
    /* What ends the process if it exits before fl_dist_finalize
     * (fl_dist_note_exit): named when leaving ends the job. */
    char exit_note[256];
} fl_dist_state;

extern fl_dist_state fl_dist;

struct fl_group {
    int32_t refcount;
    void *comm;      /* backend communicator; NULL outside the group */
    int rank, size;  /* -1, 0 outside the group */
    int *world_ranks; /* size entries */
    uint32_t barrier_sequence; /* tags of monitored barriers */
    char name[64];
    /* Collectives on device tensors ([Note: collectives on device tensors]):
     * 0 not decided yet, 1 through device_comm, -1 through host copies. */
    int device_path;
    void *device_comm;   /* the device library's communicator */
    fl_device comm_device; /* the device it was made on */
    int device_comm_seq;   /* its place in creation order */
};

/* A library that moves device memory between ranks itself (NCCL), offered
 * by a device backend. Communicators are made per group from a 128-byte
 * unique id that rank 0 makes and the host backend broadcasts. start takes
 * device pointers (reductions in any float dtype, avg included) and
 * queues the collective after the work already queued on the device
 * (label names it in errors: "all_reduce on group world (rank 1 of 2)");
 * test polls the request (freed when done); order makes the device's
 * later work wait for it without blocking the host and takes the request
 * over ([Note: ordered collectives] in core/cuda/cuda_nccl.cu).
 * comm_free waits for what is still queued on the communicator. Errors
 * through fl_fail. */
typedef struct fl_device_comm_ops {
    const char *name;
    int (*unique_id)(unsigned char id[128]);
    /* FL_OK when this rank can make a communicator on the device (checked,
     * and agreed on, before any rank blocks in comm_init). */
    int (*check_device)(int device_index);
    int (*comm_init)(int nranks, const unsigned char id[128], int rank, int device_index,
                     void **comm);
    void (*comm_free)(void *comm);
    int (*start)(void *comm, int device_index, const fl_coll *c, const char *label, void **req);
    int (*test)(void *req, bool *done);
    int (*order)(void *req);
} fl_device_comm_ops;

/* The device library for a device kind, or NULL (none built, none found
 * at run time, or FSDP_NCCL=0). */
const fl_device_comm_ops *fl_device_comm_ops_of(fl_device device);

/* [Note: destroying device communicators]
 * Destroying an NCCL communicator is collective over its ranks (NCCL
 * finalizes it inside ncclCommDestroy). Groups are released when Lua
 * collects them, at a different moment and in a different order on every
 * rank, so a group's device communicator is not destroyed then: it is
 * retired, and fl_dist_finalize destroys the retired ones in creation
 * order, which every rank shares (fl_dist_free_retired_comms). */
void fl_dist_free_retired_comms(void);

/* A group around a backend communicator (taken over; NULL: non-member). */
fl_group *fl_group_wrap(void *comm, const char *name);

/* Monotonic seconds. */
FL_PLUGIN_API double fl_dist_now(void);
/* Pause between polls of something that has not completed after `waited`
 * seconds: yield the core for the first second (transfers progress only
 * while polled; other ranks sharing the core get it), then sleep briefly,
 * up to a millisecond, so waiting for a late rank does not burn a core. */
FL_PLUGIN_API void fl_dist_pause(double waited);

/* "rank 3" or "rank ?" for messages. */
const char *fl_dist_rank_str(char *buf, size_t size);

/* "all_reduce on group world (rank 1 of 4, world rank 1)" into buf. */
const char *fl_dist_where(char *buf, size_t size, const char *op, const fl_group *g);
/* fl_fail with that prefix. */
int fl_dist_fail_at(const char *op, const fl_group *g, fl_status status, const char *what);

/* [Note: the watch channel]: ask every member of g what it is doing.
 * Returns g->size answers (free them), or NULL when the backend has no
 * roll call (one rank) or it failed. */
fl_roll_answer *fl_dist_roll_call(fl_group *g, double patience);
/* One line naming the members of a roll call that are not in any
 * collective or did not answer; when there are none, where the others
 * wait. */
void fl_dist_roll_report(const fl_roll_answer *a, int n, double patience, char *buf,
                         size_t size);
/* The roll call's patience: members answer from their progress threads
 * within milliseconds; a loaded machine may delay that a second or two. */
#define FL_ROLL_CALL_SECONDS 3.0

/* Device tensors ([Note: collectives on device tensors], device_path.c):
 * on a device other than the CPU (with storage); both tensors of a
 * two-tensor collective on one device (fails naming the collective); a
 * host copy of t; an empty host tensor of t's shape. */
bool fl_dist_on_device(const fl_tensor *t);
int fl_dist_check_same_device(const char *op, const fl_group *g, const fl_tensor *out,
                              const fl_tensor *in);
fl_tensor *fl_dist_host_copy(const fl_tensor *t);
fl_tensor *fl_dist_host_like(const fl_tensor *t);

/* ==== work: work.c ============================================================== */

struct fl_work {
    const char *name;  /* the collective */
    fl_group *group;   /* reference */
    fl_tensor *keep[2];/* the caller's tensors, referenced until completion */
    fl_tensor *result; /* where the result goes (an output, or in place) */
    fl_tensor *stage_in, *stage_out; /* f32 staging of 16-bit reductions */
    fl_tensor *device_out, *host_out; /* a device result and its host stand-in */
    void *req;         /* the backend's request while in flight */
    const fl_device_comm_ops *dops; /* set when req is the device library's */
    bool average;      /* divide the sum by the group size when done */
    int kind;          /* fl_coll_kind counted for it, or -1 (nothing moved) */
    bool completed, failed;
    fl_status status;  /* of a failed work */
    char message[1024];
    fl_work *next;     /* in fl_dist.dropped */
};

/* A work of the collective `name` on g (g referenced), or NULL. */
fl_work *fl_work_new(const char *name, fl_group *g);
void fl_work_free(fl_work *w);
/* A work complete from the start (nothing to move), or NULL. */
fl_work *fl_work_done(const char *name, fl_group *g);
/* Start c (host buffers, checked by the caller) on w's group through the
 * host backend: w is returned started (and post-processed when the backend
 * finished at once), or freed and NULL on a failure naming the collective.
 * No collective starts once the runtime is broken ([Note: a collective
 * that never completes]). */
fl_work *fl_work_start(fl_work *w, const fl_coll *c);
/* Start c (device pointers) through g's device library (g's device path
 * decided: fl_group_device_path); keep0/keep1 stay referenced until it
 * completes. */
fl_work *fl_work_start_device(const char *op, fl_group *g, const fl_coll *c, fl_tensor *keep0,
                              const fl_tensor *keep1);
/* Attach to w, which moves host, the copy of host back into dev when w
 * completes (at once if it did); w and host consumed; NULL when w is. */
fl_work *fl_work_copy_back(fl_work *w, fl_tensor *dev, fl_tensor *host);
/* Test w once; post-process it when it completed (*done). */
int fl_work_progress(fl_work *w, bool *done);
/* Post-processing of a completed work. */
int fl_work_finish(fl_work *w);
/* Complete what was dropped, without blocking (each call progresses). */
void fl_dist_progress_dropped(void);
/* Wait for every dropped work, at most `seconds` in all. */
void fl_dist_drain_dropped(double seconds);

/* ==== API: dist.c, group.c (collectives.c, monitored_barrier.c) ================ */

/* Initialise on first use: FL_OK, or the status of a failed init. */
int fl_dist_ensure(void);

/* The group a collective runs on (NULL: world), checked to have this rank
 * as a member; fails naming the collective, group and rank. */
fl_group *fl_group_resolve(const char *op, fl_group *g);

/* How g moves tensors on dev, decided with every rank of g on its first
 * collective there ([Note: collectives on device tensors]): 1 through the
 * device library (a communicator made then), 0 through host copies, -1 on
 * an error (named for op). */
int fl_group_device_path(const char *op, fl_group *g, fl_device dev);

#endif /* FL_DIST_H */
