/*
 * communicator.c: a group's communicators and their lifetime, in the
 * transport layer of core/comm ([Note: the layers of core/comm] in
 * collectives.c): wrapping the backend's communicator (with the world rank
 * of each member), reference counting, and retiring the device library's
 * communicator of a released group until finalize destroys them all.
 * Works hold a reference to their group, so the group's lifetime sits
 * below them; making groups (world, lists, splits) is the API's (group.c).
 */
#include "dist.h"

#include <string.h>

/* ---- device communicators ([Note: destroying device communicators]) ------------- */

/* A released group's device communicator, kept for finalize: destroying it
 * now would be collective over ranks that release at other moments. */
static void retire_device_comm(fl_group *g) {
    const fl_device_comm_ops *ops = fl_device_comm_ops_of(g->comm_device);
    if (fl_dist.finalized || !ops) return; /* gone with the process */
    if (fl_dist.n_retired == fl_dist.cap_retired) {
        int cap = fl_dist.cap_retired ? 2 * fl_dist.cap_retired : 8;
        void *p = realloc(fl_dist.retired, (size_t)cap * sizeof *fl_dist.retired);
        if (!p) return; /* left to the process's end */
        fl_dist.retired = p;
        fl_dist.cap_retired = cap;
    }
    fl_dist.retired[fl_dist.n_retired++] =
        (struct fl_retired_comm){g->device_comm_seq, ops, g->device_comm};
    g->device_comm = NULL;
}

/* ---- groups' lifetime ---------------------------------------------------------- */

fl_group *fl_group_wrap(void *comm, const char *name) {
    fl_group *g = calloc(1, sizeof *g);
    if (!g) {
        if (comm) fl_dist.backend->comm_free(comm);
        return FL_FAIL_NULL(FL_ERR_OOM, "dist: out of memory creating group %s", name);
    }
    g->refcount = 1;
    g->comm = comm;
    g->rank = -1;
    snprintf(g->name, sizeof g->name, "%s", name);
    if (!comm) return g;
    g->rank = fl_dist.backend->comm_rank(comm);
    g->size = fl_dist.backend->comm_size(comm);
    g->world_ranks = malloc(sizeof(int) * (size_t)(g->size > 0 ? g->size : 1));
    if (!g->world_ranks || g->rank < 0 || g->size < 1 ||
        fl_dist.backend->world_ranks(comm, g->world_ranks) != FL_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", g->world_ranks ? fl_last_error() : "out of memory");
        fl_group_release(g);
        return FL_FAIL_NULL(FL_ERR_DEVICE, "dist: cannot describe the members of group %s: %s",
                            name, why);
    }
    return g;
}

fl_group *fl_group_retain(fl_group *g) {
    if (g) g->refcount++;
    return g;
}

void fl_group_release(fl_group *g) {
    if (!g || --g->refcount > 0) return;
    /* After finalize the backend is gone; its communicators went with it. */
    if (g->device_comm) retire_device_comm(g);
    if (g->comm && fl_dist.backend && !fl_dist.finalized) fl_dist.backend->comm_free(g->comm);
    free(g->world_ranks);
    free(g);
}

static int by_seq(const void *a, const void *b) {
    const struct fl_retired_comm *x = a, *y = b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* [Note: destroying device communicators]: in creation order, which every
 * rank shares. */
void fl_dist_free_retired_comms(void) {
    if (fl_dist.n_retired > 1)
        qsort(fl_dist.retired, (size_t)fl_dist.n_retired, sizeof *fl_dist.retired, by_seq);
    for (int i = 0; i < fl_dist.n_retired; i++)
        fl_dist.retired[i].ops->comm_free(fl_dist.retired[i].comm);
    free(fl_dist.retired);
    fl_dist.retired = NULL;
    fl_dist.n_retired = fl_dist.cap_retired = 0;
}
