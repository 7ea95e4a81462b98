/*
 * dist.h: what the files of core/dist share inside the core: the state of
 * the distributed runtime (dist.c), the group and work structures (group.c,
 * collectives.c) and the waiting policy every blocking loop uses.
 */
#ifndef FL_DIST_H
#define FL_DIST_H

#include "dist_backend.h"
#include "internal.h"

typedef struct fl_dist_state {
    bool initialized;
    bool finalized;
    const fl_dist_backend *backend;
    void *plugin;          /* dlopen handle of libfsdp_mpi.so, or NULL */
    fl_dist_topology topo; /* after FSDP_RANKS_PER_NODE */
    double timeout;        /* seconds a wait may last */
    fl_group *world;       /* the state's own reference */
    fl_work *dropped;      /* released before completion: finished later */
} fl_dist_state;

extern fl_dist_state fl_dist;

/* Initialise on first use: FL_OK, or the status of a failed init. */
int fl_dist_ensure(void);

struct fl_group {
    int32_t refcount;
    void *comm;      /* backend communicator; NULL outside the group */
    int rank, size;  /* -1, 0 outside the group */
    int *world_ranks; /* size entries */
    uint32_t barrier_sequence; /* tags of monitored barriers */
    char name[64];
};

/* A group around a backend communicator (taken over; NULL: non-member). */
fl_group *fl_group_wrap(void *comm, const char *name);
/* The group a collective runs on (NULL: world), checked to have this rank
 * as a member; fails naming the collective, group and rank. */
fl_group *fl_group_resolve(const char *op, fl_group *g);
/* "rank 3" or "rank ?" for messages. */
const char *fl_dist_rank_str(char *buf, size_t size);

/* Monotonic seconds. */
double fl_dist_now(void);
/* Pause between polls of something that has not completed after `waited`
 * seconds: yield the core for the first second (transfers progress only
 * while polled; other ranks sharing the core get it), then sleep briefly,
 * up to a millisecond, so waiting for a late rank does not burn a core. */
void fl_dist_pause(double waited);

/* Complete what was dropped, without blocking (each call progresses). */
void fl_dist_progress_dropped(void);
/* Wait for every dropped work, at most `seconds` in all. */
void fl_dist_drain_dropped(double seconds);

#endif /* FL_DIST_H */
