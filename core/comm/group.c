/*
 * group.c: process groups, the sets of ranks a collective runs over: the
 * world, a list of ranks, a split by color, and the two groups of hybrid
 * sharding (the ranks of a node, and the same local rank across nodes).
 *
 * A group wraps a backend communicator and remembers the world rank of
 * each member, so every message can name ranks the way the user sees them
 * (world ranks), whatever group a failure happens in. Creating a group is
 * collective over its parent, as MPI_Comm_split is: every rank calls, and a
 * rank that is not a member gets a group that says so (is_member false)
 * rather than nothing, so the same script runs on every rank.
 */
#include "dist.h"

#include <string.h>

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

fl_group *fl_group_resolve(const char *op, fl_group *g) {
    if (fl_dist_ensure()) return NULL;
    if (!g) g = fl_dist.world;
    if (!g->comm) {
        char r[32];
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: %s is not a member of group %s", op,
                            fl_dist_rank_str(r, sizeof r), g->name);
    }
    return g;
}

fl_group *fl_group_world(void) {
    if (fl_dist_ensure()) return NULL;
    return fl_group_retain(fl_dist.world);
}

/* "group[0, 2, 5]", shortened for long lists. */
static void list_name(char *buf, size_t size, int n, const int *ranks) {
    size_t len = (size_t)snprintf(buf, size, "group[");
    for (int i = 0; i < n && len < size; i++) {
        if (len + 24 > size) {
            snprintf(buf + len, size - len, "... %d ranks]", n);
            return;
        }
        len += (size_t)snprintf(buf + len, size - len, "%s%d", i ? ", " : "", ranks[i]);
    }
    if (len < size) snprintf(buf + len, size - len, "]");
}

fl_group *fl_group_new(int n, const int *ranks) {
    if (fl_dist_ensure()) return NULL;
    int size = fl_dist.topo.size, me = fl_dist.topo.rank;
    if (n < 1 || n > size || !ranks)
        return FL_FAIL_NULL(FL_ERR_ARG, "new_group: %d ranks given, expected 1 to %d (the world "
                                        "size)",
                            n, size);
    int index = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= size)
            return FL_FAIL_NULL(FL_ERR_ARG, "new_group: rank %d (entry %d) is not in the world "
                                            "of %d ranks",
                                ranks[i], i, size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return FL_FAIL_NULL(FL_ERR_ARG, "new_group: rank %d is listed twice (entries %d "
                                                "and %d)",
                                    ranks[i], j, i);
        if (ranks[i] == me) index = i;
    }
    char name[64];
    list_name(name, sizeof name, n, ranks);
    void *comm = NULL;
    /* Members share one color; the key orders them as the list does. */
    if (fl_dist.backend->split(fl_dist.world->comm, index >= 0 ? 0 : -1, index, &comm) != FL_OK)
        return FL_FAIL_NULL(FL_ERR_DEVICE, "new_group %s: %s", name, fl_last_error());
    return fl_group_wrap(comm, name);
}

fl_group *fl_group_split(fl_group *parent, int color, int key, const char *name) {
    fl_group *p = fl_group_resolve("split", parent);
    if (!p) return NULL;
    char def[128];
    if (!name) {
        snprintf(def, sizeof def, "split(color %d of %s)", color, p->name);
        name = def;
    }
    void *comm = NULL;
    if (fl_dist.backend->split(p->comm, color < 0 ? -1 : color, key, &comm) != FL_OK)
        return FL_FAIL_NULL(FL_ERR_DEVICE, "split of group %s: %s", p->name, fl_last_error());
    return fl_group_wrap(comm, name);
}

int fl_group_hybrid(fl_group **shard, fl_group **replicate) {
    if (!shard || !replicate) return fl_fail(FL_ERR_ARG, "hybrid groups: NULL output");
    *shard = *replicate = NULL;
    if (fl_dist_ensure()) return fl_last_status();
    const fl_dist_topology *t = &fl_dist.topo;
    char name[64];
    snprintf(name, sizeof name, "shard(node %d)", t->node);
    fl_group *s = fl_group_split(NULL, t->node, t->rank, name);
    if (!s) return fl_last_status();
    snprintf(name, sizeof name, "replicate(local rank %d)", t->local_rank);
    fl_group *r = fl_group_split(NULL, t->local_rank, t->rank, name);
    if (!r) {
        fl_group_release(s);
        return fl_last_status();
    }
    *shard = s;
    *replicate = r;
    return FL_OK;
}

fl_group *fl_group_retain(fl_group *g) {
    if (g) g->refcount++;
    return g;
}

void fl_group_release(fl_group *g) {
    if (!g || --g->refcount > 0) return;
    /* After finalize the backend is gone; its communicators went with it. */
    if (g->device_comm) fl_dist_retire_device_comm(g);
    if (g->comm && fl_dist.backend && !fl_dist.finalized) fl_dist.backend->comm_free(g->comm);
    free(g->world_ranks);
    free(g);
}

bool fl_group_is_member(const fl_group *g) { return g && g->comm; }
int fl_group_rank(const fl_group *g) { return g ? g->rank : -1; }
int fl_group_size(const fl_group *g) { return g ? g->size : 0; }

const char *fl_group_device_library(const fl_group *g) {
    if (!g) g = fl_dist.world;
    if (!g || g->device_path == 0) return "undecided";
    return g->device_path > 0 ? fl_device_comm_ops_of(g->comm_device)->name : "host copies";
}

int fl_group_world_rank(const fl_group *g, int i) {
    return g && i >= 0 && i < g->size ? g->world_ranks[i] : -1;
}

const char *fl_group_name(const fl_group *g) { return g ? g->name : "(null group)"; }
