/*
 * offload.c: activation offload. Inside an offload scope, the device
 * tensors an op saves for backward are copied to pinned host memory and
 * the node keeps the host copy instead of the device storage, so that
 * storage is freed as soon as the forward drops its own references; the
 * engine copies them back just before the node's backward
 * (fl_node_unpack_saved). GPU memory for activations then no longer grows
 * with depth, for two transfers per saved byte. PyTorch's save_on_cpu and
 * FSDP's offload_to_cpu checkpoint wrapper do the same with Python hooks;
 * here every op saves through fl_node_save, so one hook there covers them
 * all.
 *
 * [Note: what is offloaded]
 * A saved tensor is offloaded when a scope is open (fl_offload_begin, per
 * thread, nestable) and it lives on a cuda device, in storage of the
 * device allocator, and is neither a leaf that requires grad nor a view of
 * one. Parameters are therefore never offloaded: a plain module's are
 * leaves that require grad, and fl_requires_grad_ marks their storage, so
 * every view of them (a transposed weight) is known by its storage; a
 * sharded unit's are views of the gathered buffer, whose storage the unit
 * manages itself (release callback, reserved addresses) and which
 * resharding frees anyway, or, for a unit of one rank computing in its
 * master dtype, views of the shard, whose segments are marked leaves. CPU
 * tensors are left alone: there is nothing to gain.
 *
 * [Note: views and aliasing]
 * What travels is the span of storage the view covers, and it comes back
 * with the same shape, strides and dtype at offset 0 of a fresh storage
 * when that span holds no more elements than the view (dense views,
 * transposes, broadcasts: stride 0 dims cost nothing), so kernels see the
 * layout they saw in forward and compute the same bits. A view with gaps
 * (a narrow of a bigger tensor) is made contiguous on the device first
 * and comes back contiguous. The restored tensor shares storage with
 * nothing but the other nodes that saved the same view; no backward
 * formula in core/ops compares saved tensors' data pointers or writes
 * through a saved tensor (checked when this was written), so losing the
 * alias with the forward's tensors is invisible to them. Meta "shape"
 * tensors that some ops save (views, reductions, dropout) have no storage
 * and stay as they are.
 *
 * [Note: one copy per saved storage]
 * q, k and v projections save the same input; several nodes save one
 * tensor. Within a scope, entries are shared by (storage id, offset,
 * shape, strides, dtype): the first save copies, later ones take a
 * reference (fl_offload_stats counts both). The storage id never repeats,
 * unlike an address, so a freed and reallocated block is never mistaken
 * for the one that was copied. On the way back the first node to run
 * restores the entry and the others reuse that device tensor.
 *
 * [Note: offload streams]
 * The copy to the host runs on the device's copy stream (cuda_host.cu,
 * [Note: the copy stream]) so it overlaps the forward kernels queued after
 * it, instead of sitting between them on the compute stream; the copy back
 * runs on the compute stream. What orders them:
 * - At save, the copy stream waits for an event recorded on the compute
 *   stream, so the copy reads the tensor after the kernels that produced
 *   it. A write to the saved storage queued after the save (one a plain
 *   run's backward would see too) may or may not reach the host copy.
 * - The device block the copy reads records the copy stream as a user
 *   (the backend's record_stream): the forward drops its references long
 *   before the copy may have run, and the caching pool would otherwise
 *   hand the block to the next kernel on the compute stream at once. Once
 *   freed it is held back until an event recorded on the copy stream at
 *   free time is done. A dense temporary is protected the same way.
 * - The pinned block records the copy stream too (pinned.c, [Note: pinned
 *   stream ids]): an entry dropped before its backward (a forward without
 *   backward) frees it while the copy may still be queued.
 * - Each entry (one per offloaded view, [Note: one copy per saved
 *   storage]) keeps an event recorded on the copy stream after its copy.
 *   Before the copy back, the compute stream waits for it
 *   (cudaStreamWaitEvent(0, done)): the host never blocks, and the copy
 *   back, on the compute stream, is ordered before the backward kernels
 *   that read the restored tensor. The pinned block records the compute
 *   stream as well, so it is not reused before the copy back has run. The
 *   event is destroyed with the entry.
 * An entry restored at its own node's unpack is copied back this way; most
 * are prefetched instead ([Note: offload prefetch]).
 *
 * [Note: offload prefetch]
 * Queued on the compute stream, a copy back sits between the backward
 * kernels. So when the engine unpacks a node's entries it also starts, on
 * the copy stream, the copies back of the entries backward will most
 * likely need next, a window ahead: FSDP_OFFLOAD_PREFETCH entries
 * (default 4, 0 disables; read when the outermost scope opens, so it holds
 * for that forward's entries). What "next" means: the entries of a scope
 * in save order (the scope's chain), walked down from the latest-saved
 * entry of the node being unpacked. Backward runs nodes in about reverse
 * creation order, so this is a proxy, not a promise: an entry prefetched
 * too early only holds its device block longer. The window counts the
 * entries below that point which are prefetched but not yet used, so
 * prefetched blocks stay bounded by it (plus those left behind by a node
 * that ran out of order). Each prefetch:
 * - allocates the entry's device block now, from the device pool, for the
 *   compute stream; the copy stream first waits for the compute stream's
 *   work so far, since the block may have been freed by a kernel not yet
 *   run;
 * - queues the copy on the copy stream, behind the copy to the host of
 *   the same entry (same stream: no event needed), the pinned block
 *   recording the copy stream as at save; the host copy is then released;
 * - records the copy stream on the device block
 *   (the backend's record_stream): an entry whose prefetch is never used
 *   (a branch backward does not run, a graph freed without backward) frees
 *   its block while the copy may still be queued to write it;
 * - records an event (`ready`) on the copy stream after the copy. At the
 *   entry's first use the compute stream waits for it instead of queueing
 *   the copy itself, and the event is destroyed.
 * A prefetch that fails (device memory exhausted) is forgotten: the entry
 * is copied back at its own unpack, as without prefetch. Entries leave
 * the chain when first used or freed; the chain, shared by its entries
 * (refcounted, locked: an entry may be freed on another thread), outlives
 * the scope, since backward runs after it closed. A scope's entries are
 * restored by one thread at a time (the backward that owns the graph), as
 * without prefetch.
 */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A scope's entries in save order ([Note: offload prefetch]). */
typedef struct chain {
    int32_t refcount;     /* the open scope's, and one per entry still in it */
    int32_t window;       /* FSDP_OFFLOAD_PREFETCH when the scope opened */
    pthread_mutex_t lock; /* items: entries may be freed on any thread */
    fl_packed **items;    /* NULL once used or freed */
    int64_t n, cap;
} chain;

struct fl_packed {
    int32_t refcount;
    fl_tensor *host;        /* pinned: the span's elements; NULL once restored */
    fl_tensor *restored;    /* the device tensor, once the first user brought it back */
    fl_device device;
    const fl_backend *backend;   /* device's: its streams and events */
    fl_dtype dtype;
    int32_t ndim;
    int64_t shape[FL_MAX_DIMS];
    int64_t stride[FL_MAX_DIMS]; /* of the restored tensor, at offset 0 */
    int64_t span;                /* elements of the restored storage */
    void *done;                  /* recorded on the copy stream after the copy to the host */
    void *ready;                 /* after a prefetch's copy back; NULL once waited for */
    chain *chain;                /* while in its scope's chain, at items[pos] */
    int64_t pos;
};

/* ---- statistics ----------------------------------------------------------- */

static _Atomic int64_t st_saved, st_copies, st_bytes, st_shared, st_kept, st_kept_params,
    st_restores, st_restored_bytes, st_failed, st_prefetched;

void fl_offload_stats_get(fl_offload_stats *out) {
    out->saved = st_saved;
    out->copies = st_copies;
    out->bytes = st_bytes;
    out->shared = st_shared;
    out->kept = st_kept;
    out->kept_params = st_kept_params;
    out->restores = st_restores;
    out->restored_bytes = st_restored_bytes;
    out->failed = st_failed;
    out->prefetched = st_prefetched;
    fl_pinned_stats(&out->pinned_allocated, &out->pinned_reserved);
}

void fl_offload_stats_reset(void) {
    st_saved = st_copies = st_bytes = st_shared = st_kept = st_kept_params = 0;
    st_restores = st_restored_bytes = st_failed = st_prefetched = 0;
}

/* ---- packed entries ------------------------------------------------------------ */

static fl_packed *packed_retain(fl_packed *p) {
    if (p) __atomic_fetch_add(&p->refcount, 1, __ATOMIC_RELAXED);
    return p;
}

/* A reference to an entry found in a chain, unless it is being freed (its
 * last reference gone, not yet out of the chain). */
static fl_packed *packed_try_retain(fl_packed *p) {
    int32_t n = __atomic_load_n(&p->refcount, __ATOMIC_RELAXED);
    while (n > 0)
        if (__atomic_compare_exchange_n(&p->refcount, &n, n + 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return p;
    return NULL;
}

/* ---- chains ([Note: offload prefetch]) ------------------------------------------- */

/* FSDP_OFFLOAD_PREFETCH: entries prefetched ahead, -1 when not a
 * non-negative integer. */
static int prefetch_window(void) {
    const char *v = getenv("FSDP_OFFLOAD_PREFETCH");
    if (!v || !*v) return 4;
    char *end;
    long n = strtol(v, &end, 10);
    return *end || n < 0 || n > 1 << 20 ? -1 : (int)n;
}

static chain *chain_new(int window) {
    chain *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->refcount = 1;
    c->window = window;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

static void chain_release(chain *c) {
    if (!c || __atomic_sub_fetch(&c->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    pthread_mutex_destroy(&c->lock);
    free(c->items);
    free(c);
}

/* Append p (a new entry); a chain that cannot grow leaves p out, which
 * only means it is never prefetched. */
static void chain_add(chain *c, fl_packed *p) {
    pthread_mutex_lock(&c->lock);
    if (c->n == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 64;
        fl_packed **bigger = realloc(c->items, (size_t)cap * sizeof *bigger);
        if (!bigger) {
            pthread_mutex_unlock(&c->lock);
            return;
        }
        c->items = bigger;
        c->cap = cap;
    }
    p->pos = c->n;
    c->items[c->n++] = p;
    __atomic_fetch_add(&c->refcount, 1, __ATOMIC_RELAXED);
    p->chain = c;
    pthread_mutex_unlock(&c->lock);
}

/* p leaves its chain (used, or freed): nothing prefetches it any more. */
static void chain_leave(fl_packed *p) {
    chain *c = p->chain;
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->items[p->pos] = NULL;
    pthread_mutex_unlock(&c->lock);
    p->chain = NULL;
    chain_release(c);
}

void fl_packed_release(fl_packed *p) {
    if (!p) return;
    int32_t left = __atomic_sub_fetch(&p->refcount, 1, __ATOMIC_ACQ_REL);
    FL_ASSERT(left >= 0);
    if (left > 0) return;
    chain_leave(p);
    fl_tensor_release(p->host);
    /* A prefetched block whose copy may still be queued: it recorded the
     * copy stream, so the pool holds it back until the copy ran. */
    fl_tensor_release(p->restored);
    if (p->done) p->backend->event_destroy(p->done);
    if (p->ready) p->backend->event_destroy(p->ready);
    free(p);
}

/* ---- the copies ([Note: offload streams]) ---------------------------------------- */

/* The device's copy stream in *copy, ordered after the compute stream's
 * work so far; dev receives the device's name for messages. */
static int copy_stream_after_compute(const fl_packed *p, uint64_t *copy, char dev[32]) {
    int index = fl_device_index(p->device);
    fl_device_format(p->device, dev, 32);
    *copy = 0;
    if (p->backend->side_stream(index, FL_STREAM_COPY, copy) != FL_OK ||
        p->backend->stream_wait_stream(index, *copy, 0) != FL_OK)
        return fl_fail_prefix("offload: cannot order the copy stream of %s", dev);
    return FL_OK;
}

/* Queue the copy of src's span (nbytes) into p->host on the copy stream,
 * after the compute stream's work so far, and record p->done after it. */
static int copy_to_host(fl_packed *p, const fl_tensor *src, int64_t nbytes) {
    const fl_backend *be = p->backend;
    int index = fl_device_index(p->device);
    char dev[32];
    uint64_t copy;
    int rc = copy_stream_after_compute(p, &copy, dev);
    if (rc != FL_OK) return rc;
    /* Before queueing: a block the pool does not know could not be held
     * back, so nothing is copied out of it. */
    if (nbytes > 0 && !be->record_stream(index, src->storage->data, copy))
        return fl_fail_prefix("offload: the saved tensor's storage on %s", dev);
    rc = fl_pinned_copy_async_on(p->device, copy, p->host->data, src->data, nbytes, true,
                                     p->host->storage);
    if (rc != FL_OK) return rc;
    p->done = be->event_record(index, copy);
    if (!p->done) return fl_fail_prefix("offload: cannot record the copy's event on %s", dev);
    return FL_OK;
}

/* Queue the copy of p->host into dst on the compute stream, after the
 * copy to the host is done. */
static int copy_back(fl_packed *p, void *dst, int64_t nbytes) {
    if (p->backend->stream_wait_event(fl_device_index(p->device), 0, p->done) != FL_OK) {
        char dev[32];
        fl_device_format(p->device, dev, sizeof dev);
        return fl_fail_prefix("offload: cannot order %s after the copy to the host", dev);
    }
    return fl_pinned_copy_async(p->device, dst, p->host->data, nbytes, false, p->host->storage);
}
/* Start q's copy back on the copy stream into a new device block
 * ([Note: offload prefetch]); q->restored and q->ready are set, the host
 * copy released. */
static int prefetch(fl_packed *q) {
    const fl_backend *be = q->backend;
    int index = fl_device_index(q->device);
    char dev[32];
    uint64_t copy;
    int rc = copy_stream_after_compute(q, &copy, dev);
    if (rc != FL_OK) return rc;
    fl_tensor *flat = fl_empty(1, &q->span, q->dtype, q->device);
    if (!flat) return fl_last_status();
    int64_t nbytes = q->span * (int64_t)fl_dtype_size(q->dtype);
    if (nbytes > 0 && !be->record_stream(index, flat->storage->data, copy))
        rc = fl_fail_prefix("offload: a new tensor's storage on %s", dev);
    if (rc == FL_OK)
        rc = fl_pinned_copy_async_on(q->device, copy, flat->data, q->host->data, nbytes, false,
                                     q->host->storage);
    if (rc == FL_OK && !(q->ready = be->event_record(index, copy)))
        rc = fl_fail_prefix("offload: cannot record the prefetch's event on %s", dev);
    fl_tensor *v = rc == FL_OK ? fl_tensor_view_of(flat, q->ndim, q->shape, q->stride, 0) : NULL;
    /* On failure the block goes back at once: it recorded the copy stream
     * before any copy was queued into it. */
    fl_tensor_release(flat);
    if (!v) {
        if (q->ready) be->event_destroy(q->ready);
        q->ready = NULL;
        return rc == FL_OK ? (int)fl_last_status() : rc;
    }
    q->restored = v;
    fl_tensor_release(q->host);
    q->host = NULL;
    st_restores++;
    st_restored_bytes += nbytes;
    st_prefetched++;
    return FL_OK;
}

/* Before the first use of a prefetched entry: the compute stream waits for
 * its copy back. */
static int wait_prefetch(fl_packed *p) {
    if (p->backend->stream_wait_event(fl_device_index(p->device), 0, p->ready) != FL_OK) {
        char dev[32];
        fl_device_format(p->device, dev, sizeof dev);
        return fl_fail_prefix("offload: cannot order %s after a prefetch", dev);
    }
    p->backend->event_destroy(p->ready);
    p->ready = NULL;
    return FL_OK;
}

/* Elements of storage the view reaches, from its first to its last one
 * (strides are never negative here). */
static int64_t span_of(const fl_tensor *t) {
    if (t->numel == 0) return 0;
    int64_t last = 0;
    for (int d = 0; d < t->ndim; d++) last += (t->shape[d] - 1) * t->stride[d];
    return last + 1;
}

/* Copy t (on a cuda device) into a new pinned entry; NULL on failure with
 * the error set. Grad mode is off (no node for the contiguous copy). */
static fl_packed *pack(const fl_tensor *t) {
    fl_packed *p = calloc(1, sizeof *p);
    if (!p) return FL_FAIL_NULL(FL_ERR_OOM, "offload: out of host memory");
    p->refcount = 1;
    p->device = t->device;
    p->backend = fl_backend_of(t->device);
    p->dtype = t->dtype;
    p->ndim = t->ndim;
    memcpy(p->shape, t->shape, sizeof p->shape);
    bool neg = false;
    for (int d = 0; d < t->ndim; d++) neg |= t->stride[d] < 0;
    /* Same layout when the span is no bigger than the view; else dense. */
    const fl_tensor *src = t;
    fl_tensor *dense = NULL;
    if (neg || span_of(t) > t->numel) {
        dense = fl_tensor_clone(t);
        if (!dense) {
            free(p);
            return NULL;
        }
        src = dense;
    }
    memcpy(p->stride, src->stride, sizeof p->stride);
    p->span = span_of(src);
    int64_t nbytes = p->span * (int64_t)fl_dtype_size(t->dtype);
    p->host = fl_empty_pinned(1, &p->span, t->dtype);
    int rc = p->host ? copy_to_host(p, src, nbytes) : (int)fl_last_status();
    /* The dense temporary goes back to the pool now: it recorded the copy
     * stream, so it is not reused before the copy ran ([Note: offload
     * streams]). */
    fl_tensor_release(dense);
    if (rc != FL_OK) {
        fl_packed_release(p);
        return NULL;
    }
    st_copies++;
    st_bytes += nbytes;
    return p;
}

/* The entry's device tensor (new reference), restoring it on first use. */
static fl_tensor *unpack(fl_packed *p) {
    if (!p->restored) {
        fl_tensor *flat = fl_empty(1, &p->span, p->dtype, p->device);
        if (!flat) return NULL;
        int64_t nbytes = p->span * (int64_t)fl_dtype_size(p->dtype);
        int rc = copy_back(p, flat->data, nbytes);
        fl_tensor *v = rc == FL_OK ? fl_tensor_view_of(flat, p->ndim, p->shape, p->stride, 0)
                                   : NULL;
        fl_tensor_release(flat);
        if (!v) return NULL;
        p->restored = v;
        /* The host copy is no longer needed: its block returns to the pool
         * once the copy back has run. */
        fl_tensor_release(p->host);
        p->host = NULL;
        st_restores++;
        st_restored_bytes += nbytes;
    } else if (p->ready && wait_prefetch(p) != FL_OK) {
        return NULL;
    }
    chain_leave(p);
    return fl_tensor_retain(p->restored);
}

/* Prefetch the entries saved before position `at` of c, until `window` of
 * them are prefetched and not yet used; a failure stops it, forgotten
 * (those entries come back at their own unpack). The chain's lock is held
 * only to read a slot: a prefetch allocates, and what that frees may free
 * entries of this chain. */
static void prefetch_below(chain *c, int64_t at) {
    int count = 0;
    for (int64_t i = at - 1; i >= 0 && count < c->window; i--) {
        pthread_mutex_lock(&c->lock);
        fl_packed *q = c->items[i] ? packed_try_retain(c->items[i]) : NULL;
        pthread_mutex_unlock(&c->lock);
        if (!q) continue;
        count++;
        bool failed = !q->restored && prefetch(q) != FL_OK;
        fl_packed_release(q);
        if (failed) {
            fl_clear_error();
            break;
        }
    }
}

/* ---- the scope ------------------------------------------------------------------ */

typedef struct entry {
    uint64_t storage_id; /* 0: empty slot */
    int64_t offset;
    int32_t ndim;
    fl_dtype dtype;
    int64_t shape[FL_MAX_DIMS], stride[FL_MAX_DIMS];
    fl_packed *packed;   /* owned reference */
} entry;

/* Per thread: the depth of nested scopes and the entries of the outermost
 * one (an open-addressing table, kept under half full). */
static _Thread_local int depth;
static _Thread_local entry *table;
static _Thread_local int64_t table_cap, table_n;
/* The outermost scope's chain (made at its first copy, NULL when the
 * window is 0) and its window ([Note: offload prefetch]). */
static _Thread_local chain *scope_chain;
static _Thread_local int scope_window;

static uint64_t key_hash(uint64_t id, int64_t offset, int ndim, const int64_t *shape) {
    uint64_t h = id * 0x9E3779B97F4A7C15ull ^ (uint64_t)offset * 0xC2B2AE3D27D4EB4Full;
    for (int d = 0; d < ndim; d++) h = (h ^ (uint64_t)shape[d]) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

static bool entry_matches(const entry *e, const fl_tensor *t) {
    if (e->storage_id != t->storage->id || e->offset != t->offset || e->ndim != t->ndim ||
        e->dtype != t->dtype)
        return false;
    for (int d = 0; d < t->ndim; d++)
        if (e->shape[d] != t->shape[d] || e->stride[d] != t->stride[d]) return false;
    return true;
}

static entry *table_slot(const fl_tensor *t) {
    for (int64_t i = (int64_t)(key_hash(t->storage->id, t->offset, t->ndim, t->shape) &
                        (uint64_t)(table_cap - 1));;
         i = (i + 1) & (table_cap - 1)) {
        if (table[i].storage_id == 0 || entry_matches(&table[i], t)) return &table[i];
    }
}

static bool table_reserve(void) {
    if (table && 2 * (table_n + 1) <= table_cap) return true;
    int64_t cap = table_cap ? 2 * table_cap : 256;
    entry *bigger = calloc((size_t)cap, sizeof *bigger);
    if (!bigger) return false;
    entry *old = table;
    int64_t old_cap = table_cap;
    table = bigger;
    table_cap = cap;
    for (int64_t i = 0; i < old_cap; i++) {
        if (old[i].storage_id == 0) continue;
        uint64_t h = key_hash(old[i].storage_id, old[i].offset, old[i].ndim, old[i].shape);
        int64_t j = (int64_t)(h & (uint64_t)(cap - 1));
        while (table[j].storage_id) j = (j + 1) & (cap - 1);
        table[j] = old[i];
    }
    free(old);
    return true;
}

static void table_clear(void) {
    for (int64_t i = 0; i < table_cap; i++)
        if (table[i].storage_id) fl_packed_release(table[i].packed);
    free(table);
    table = NULL;
    table_cap = table_n = 0;
    /* Its entries keep it for backward. */
    chain_release(scope_chain);
    scope_chain = NULL;
}

int fl_offload_begin(void) {
    if (depth == 0) {
        int window = prefetch_window();
        if (window < 0)
            return fl_fail(FL_ERR_ARG, "offload: FSDP_OFFLOAD_PREFETCH must be a number of entries "
                                       "(0 or more), got '%s'", getenv("FSDP_OFFLOAD_PREFETCH"));
        scope_window = window;
    }
    depth++;
    return FL_OK;
}

int fl_offload_end(void) {
    if (depth == 0) return fl_fail(FL_ERR_STATE, "offload_end: no offload scope is open");
    if (--depth == 0) table_clear();
    return FL_OK;
}

int fl_offload_depth(void) { return depth; }

/* ---- what is offloaded ([Note: what is offloaded]) ------------------------------ */

/* A parameter or a view of one: storage a leaf that requires grad views
 * (fl_requires_grad_ marks it: w, w.t(), a sharded unit's segments and,
 * when a unit of one rank computes in its master dtype, its parameter
 * views, which alias the shard), or storage the core did not allocate (a
 * sharded unit's gathered buffer). */
static bool is_parameter(const fl_tensor *t) {
    return t->storage->holds_params || t->storage->release != NULL ||
           (!t->grad_fn && (t->flags & FL_TENSOR_REQUIRES_GRAD));
}

/* Whether the device queues copies while the host goes on (its backend
 * has streams): only then can saved tensors move without stalling. */
static bool queues_copies(fl_device device) {
    if (fl_device_kind_of(device) == FL_DEVICE_CPU) return false;
    const fl_backend *be = fl_backend_of(device);
    return be && be->memcpy_async && be->side_stream;
}

/* Whether t is offloaded; counts the ones kept. */
static bool wanted(const fl_tensor *t) {
    if (depth == 0 || !t->storage || (t->flags & FL_TENSOR_FAKE) ||
        !queues_copies(t->device))
        return false;
    if (is_parameter(t) || t->storage->id == 0) {
        st_kept_params++;
        st_kept++;
        return false;
    }
    return true;
}

/* The packed entry for t in this scope (new reference), copying it the
 * first time; NULL on failure. */
static fl_packed *pack_in_scope(const fl_tensor *t) {
    entry *e = table_reserve() ? table_slot(t) : NULL;
    if (e && e->storage_id) {
        st_shared++;
        return packed_retain(e->packed);
    }
    bool was = fl_set_grad_enabled(false);
    fl_packed *p = pack(t);
    fl_set_grad_enabled(was);
    if (p && scope_window > 0 && !scope_chain) scope_chain = chain_new(scope_window);
    if (p && scope_chain) chain_add(scope_chain, p);
    if (p && e) {
        e->storage_id = t->storage->id;
        e->offset = t->offset;
        e->ndim = t->ndim;
        e->dtype = t->dtype;
        memcpy(e->shape, t->shape, sizeof e->shape);
        memcpy(e->stride, t->stride, sizeof e->stride);
        e->packed = packed_retain(p);
        table_n++;
    }
    return p;
}

bool fl_offload_save(fl_node *node, int k, const fl_tensor *t) {
    if (depth == 0) return false;
    if (!wanted(t)) {
        if (t->storage && fl_device_kind_of(t->device) == FL_DEVICE_CPU) st_kept++;
        return false;
    }
    if (!node->packed) {
        node->packed = calloc(FL_NODE_MAX_SAVED, sizeof *node->packed);
        if (!node->packed) {
            st_failed++;
            return false;
        }
    }
    fl_packed *p = pack_in_scope(t);
    if (!p) {
        /* Offload saves memory; it never fails a forward: the tensor stays
         * on its device (fl_offload_stats counts it) and the error is
         * forgotten. */
        st_failed++;
        fl_clear_error();
        return false;
    }
    node->packed[k] = p;
    node->saved[k] = NULL;
    st_saved++;
    return true;
}

int fl_node_unpack_saved(fl_node *node) {
    if (!node->packed) return FL_OK;
    /* Where backward stands in the chain ([Note: offload prefetch]): this
     * node's latest-saved entry still in one (an entry shared with an
     * earlier save sits at that save's place). Taken first: unpacking takes
     * the entries out. */
    chain *c = NULL;
    int64_t at = -1;
    for (int k = 0; k < node->n_saved; k++) {
        fl_packed *p = node->packed[k];
        if (p && p->chain && (!c || p->chain == c) && p->pos > at) {
            c = p->chain;
            at = p->pos;
        }
    }
    if (c) __atomic_fetch_add(&c->refcount, 1, __ATOMIC_RELAXED);
    int rc = FL_OK;
    for (int k = 0; k < node->n_saved && rc == FL_OK; k++) {
        fl_packed *p = node->packed[k];
        if (!p) continue;
        fl_tensor *dev = unpack(p);
        if (!dev) {
            rc = fl_last_status();
            break;
        }
        /* A detached alias, as fl_node_save keeps. */
        node->saved[k] = fl_detach(dev);
        fl_tensor_release(dev);
        if (!node->saved[k]) {
            rc = fl_last_status();
            break;
        }
        node->packed[k] = NULL;
        fl_packed_release(p);
    }
    /* After this node's own copies back, so those are queued first; the
     * prefetches then overlap its backward kernels. */
    if (c) {
        if (rc == FL_OK) prefetch_below(c, at);
        chain_release(c);
    }
    return rc;
}

void fl_node_drop_packed(fl_node *node) {
    if (!node->packed) return;
    for (int k = 0; k < FL_NODE_MAX_SAVED; k++) fl_packed_release(node->packed[k]);
    free(node->packed);
    node->packed = NULL;
}

/* ---- packing from outside autograd (a checkpoint's inputs) ----------------------- */

int fl_offload_pack(const fl_tensor *t, fl_packed **out) {
    *out = NULL;
    if (fl_check_tensor("offload_pack", t, false)) return fl_last_status();
    if (!wanted(t)) return FL_OK;
    fl_packed *p = pack_in_scope(t);
    if (!p) return fl_last_status();
    st_saved++;
    *out = p;
    return FL_OK;
}

fl_tensor *fl_offload_unpack(fl_packed *p) {
    if (!p) return FL_FAIL_NULL(FL_ERR_ARG, "offload_unpack: no packed tensor (NULL)");
    return unpack(p);
}
