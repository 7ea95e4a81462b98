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
 *
 * In the API layer of core/comm ([Note: the layers of core/comm] in
 * collectives.c): a group's lifetime (wrap, retain, release) sits below
 * the works that reference it, in communicator.c. A group's first
 * collective on device tensors decides here, with every rank, how the group
 * moves them, through works started directly (the collectives call this
 * file, so this file calls none of them).
 */
#include "dist.h"

#include <string.h>

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

/* ---- how a group moves device tensors ([Note: collectives on device tensors]) ---- */

/* Run one collective over the host tensor t on g and wait for it: the
 * group's own exchanges while it decides its device path. The buffer is
 * this file's and well formed, so the work starts without the checks the
 * collectives make of a caller's tensors; the work keeps t referenced, as
 * a timeout may leave it with the backend. */
static int host_exchange(fl_group *g, const char *name, fl_coll_kind kind, fl_tensor *t,
                         fl_reduce_op rop) {
    fl_work *w = fl_work_new(name, g);
    if (!w) return fl_last_status();
    w->keep[0] = fl_tensor_retain(t);
    fl_coll c = {kind, NULL, t->data, t->numel, t->dtype, rop, 0};
    w = fl_work_start(w, &c);
    int rc = w ? fl_work_wait(w) : (int)fl_last_status();
    fl_work_release(w);
    return rc;
}

/* Every rank of g learns whether all of them have *flag set (an all-reduce
 * of int32 minima on the host). */
static int agree(fl_group *g, int32_t *flag) {
    int64_t one = 1;
    fl_tensor *t = fl_empty(1, &one, FL_I32, fl_device_make(FL_DEVICE_CPU, 0));
    if (!t) return fl_last_status();
    *(int32_t *)t->data = *flag;
    int rc = host_exchange(g, "all_reduce", FL_COLL_ALL_REDUCE, t, FL_REDUCE_MIN);
    *flag = *(int32_t *)t->data;
    fl_tensor_release(t);
    return rc;
}

/* All ranks or none use the library: a rank without it, or one whose
 * communicator could not be made (NCCL refuses two ranks on one GPU),
 * sends the whole group through host copies, since collectives of the two
 * kinds would never meet. */
int fl_group_device_path(const char *op, fl_group *g, fl_device dev) {
    if (g->size == 1) return 0;
    if (g->device_path == 0) {
        const fl_device_comm_ops *ops = fl_device_comm_ops_of(dev);
        /* A rank that cannot use its device must say so before the others
         * block in comm_init waiting for it. */
        int32_t ok = ops != NULL && ops->check_device(fl_device_index(dev)) == FL_OK;
        if (ops && !ok)
            fprintf(stderr, "fsdp-lua: rank %d: %s cannot use the device: %s\n", fl_dist.topo.rank,
                    ops->name, fl_last_error());
        if (agree(g, &ok)) return -1;
        unsigned char id[129] = {0};
        if (ok) {
            int64_t n = sizeof id;
            fl_tensor *t = fl_empty(1, &n, FL_U8, fl_device_make(FL_DEVICE_CPU, 0));
            if (!t) return -1;
            unsigned char *b = t->data;
            memset(b, 0, sizeof id);
            if (g->rank == 0) b[0] = ops->unique_id(b + 1) == FL_OK;
            int rc = host_exchange(g, "broadcast", FL_COLL_BROADCAST, t, FL_REDUCE_SUM);
            memcpy(id, b, sizeof id);
            fl_tensor_release(t);
            if (rc) return -1;
            ok = id[0];
        }
        void *comm = NULL;
        char why[300] = "";
        if (ok) {
            ok = ops->comm_init(g->size, id + 1, g->rank, fl_device_index(dev), &comm) == FL_OK;
            if (!ok) snprintf(why, sizeof why, "%s", fl_last_error());
            int32_t all = ok;
            if (agree(g, &all)) return -1;
            /* A communicator some ranks made and others could not is left
             * alone: destroying it is collective over ranks that never
             * joined, and would hang. */
            if (!all && why[0])
                fprintf(stderr, "fsdp-lua: rank %d: %s is not used for cuda tensors on group %s (%s); "
                        "they move through host copies\n", fl_dist.topo.rank, ops->name, g->name, why);
            ok = all;
        }
        g->device_path = ok ? 1 : -1;
        g->device_comm = ok ? comm : NULL;
        g->comm_device = dev;
        if (ok) g->device_comm_seq = ++fl_dist.device_comms_made;
    }
    if (g->device_path < 0) return 0;
    if (g->comm_device != dev) {
        char a[32], b[32], why[160];
        fl_device_format(g->comm_device, a, sizeof a);
        fl_device_format(dev, b, sizeof b);
        snprintf(why, sizeof why, "the group's %s communicator is on %s, the tensors on %s",
                 fl_device_comm_ops_of(dev)->name, a, b);
        fl_dist_fail_at(op, g, FL_ERR_ARG, why);
        return -1;
    }
    return 1;
}

/* ---- what a group says about itself ------------------------------------------------ */

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
