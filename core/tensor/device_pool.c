/*
 * device_pool.c: the caching allocator behind device memory (CUDA).
 *
 * cudaMalloc and cudaFree are slow and cudaFree synchronises the device, so
 * a training step must not call them per tensor. The pool takes memory from
 * the device in segments, carves them into blocks, and keeps freed blocks
 * for reuse, following PyTorch's CUDA caching allocator:
 *
 * - Sizes round up to 512 bytes. Requests up to 1 MiB are small and come
 *   from 2 MiB segments; larger ones come from 20 MiB segments when under
 *   10 MiB, otherwise from a segment of the request rounded up to 2 MiB.
 *   Small and large blocks live in separate free sets, so small tensors do
 *   not fragment the segments big ones need.
 * - A request takes the smallest cached block of its set that fits and
 *   belongs to its stream (best fit), and splits off the rest when that is
 *   worth keeping (a small remainder of at least 512 bytes, a large one
 *   over 1 MiB). A freed block merges with free neighbours of its segment.
 * - Streams: a segment belongs to the stream it was made for. Work queued
 *   on one stream runs in order, so a block freed there may be reused there
 *   at once. A block also used on other streams (fl_pool_record_stream) is
 *   held back at free until events recorded on those streams are done.
 * - When the device refuses a segment (or the pool's limit would be
 *   passed), the wholly free cached segments go back to the device and the
 *   request is tried once more (a retry); failing that it is out of memory,
 *   and fl_pool_oom_message says what was asked and what is held.
 *
 * The free sets are arrays sorted by (stream, size, address): best fit is
 * a binary search. Handed-out blocks are found by address in an
 * open-addressing table. One mutex: communication threads allocate too.
 *
 * Freeing never allocates host memory, so it cannot fail halfway: every
 * block set (small, large, pending) has room for every block that exists
 * (reserve_block, called where a block is made), and the events a freed
 * block waits on have their slots from record_stream. Running out of host
 * memory for this bookkeeping can only make an allocation or a
 * record_stream fail, which their callers report.
 */
#include "device_pool.h"

#include "error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    ROUND = 512,
    SMALL_REQUEST = 1 << 20,       /* requests up to this are small */
    SMALL_SEGMENT = 2 << 20,
    LARGE_SEGMENT = 20 << 20,      /* for requests under MID_REQUEST */
    MID_REQUEST = 10 << 20,
    SEGMENT_ROUND = 2 << 20,
    MIN_LARGE_SPLIT = 1 << 20,     /* a large remainder must exceed this */
};

typedef struct block {
    char *ptr;
    int64_t size;
    int64_t requested;     /* while handed out */
    uint64_t stream;
    bool large;
    bool in_use;           /* handed out, or freed but waiting on events */
    struct block *prev, *next; /* neighbours in the segment, by address */
    uint64_t *uses;        /* other streams that used it (record_stream) */
    int n_uses, cap_uses;
    void **events;         /* pending at free: one per other stream (cap_uses slots) */
    int n_events;
} block;

typedef struct block_set {
    block **v;
    int n, cap;
} block_set;

struct fl_pool {
    fl_pool_device dev;
    char name[32];
    pthread_mutex_t lock;
    block_set free_small, free_large;
    block_set pending;     /* freed, waiting for their events */
    int blocks;            /* blocks that exist: each set has room for all */
    block **table;         /* handed-out blocks by address; NULL = empty */
    int64_t table_cap, table_n;
    int64_t limit;
    fl_pool_stats st;
    int64_t last_request;  /* of the last failed alloc */
    uint64_t last_stream;
};

/* ---- free sets ----------------------------------------------------------- */

static int block_cmp(const block *a, uint64_t stream, int64_t size, const char *ptr) {
    if (a->stream != stream) return a->stream < stream ? -1 : 1;
    if (a->size != size) return a->size < size ? -1 : 1;
    if (a->ptr != ptr) return a->ptr < ptr ? -1 : 1;
    return 0;
}

/* First position whose block is >= (stream, size, ptr). */
static int set_lower_bound(const block_set *s, uint64_t stream, int64_t size, const char *ptr) {
    int lo = 0, hi = s->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (block_cmp(s->v[mid], stream, size, ptr) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Room for `need` blocks in s; false (s unchanged) without host memory. */
static bool set_reserve(block_set *s, int need) {
    if (need <= s->cap) return true;
    int cap = s->cap ? 2 * s->cap : 64;
    while (cap < need) cap *= 2;
    block **v = realloc(s->v, (size_t)cap * sizeof *v);
    if (!v) return false;
    s->v = v;
    s->cap = cap;
    return true;
}

/* Count one more block, first making room for it in every set; false
 * (nothing changed) without host memory. */
static bool reserve_block(fl_pool *p) {
    int need = p->blocks + 1;
    if (!set_reserve(&p->free_small, need) || !set_reserve(&p->free_large, need) ||
        !set_reserve(&p->pending, need))
        return false;
    p->blocks = need;
    return true;
}

/* Free a block's bookkeeping (not its memory) and uncount it. */
static void drop_block(fl_pool *p, block *b) {
    free(b->uses);
    free(b->events);
    free(b);
    p->blocks--;
}

static void set_insert(block_set *s, block *b) {
    FL_ASSERT(s->n < s->cap); /* room for every block: reserve_block */
    int at = set_lower_bound(s, b->stream, b->size, b->ptr);
    memmove(s->v + at + 1, s->v + at, (size_t)(s->n - at) * sizeof *s->v);
    s->v[at] = b;
    s->n++;
}

static void set_remove(block_set *s, block *b) {
    int at = set_lower_bound(s, b->stream, b->size, b->ptr);
    FL_ASSERT(at < s->n && s->v[at] == b); /* a free block is in its set */
    memmove(s->v + at, s->v + at + 1, (size_t)(s->n - at - 1) * sizeof *s->v);
    s->n--;
}

static block_set *free_set(fl_pool *p, const block *b) {
    return b->large ? &p->free_large : &p->free_small;
}

/* ---- handed-out blocks by address ----------------------------------------- */

static uint64_t slot_of(const fl_pool *p, const void *ptr) {
    uint64_t h = (uint64_t)(uintptr_t)ptr / ROUND;
    h *= 0x9E3779B97F4A7C15ull;
    return (h >> 17) & (uint64_t)(p->table_cap - 1);
}

static bool table_put(fl_pool *p, block *b);

static bool table_grow(fl_pool *p) {
    if (p->table_cap && 4 * (p->table_n + 1) <= 3 * p->table_cap) return true;
    int64_t old_cap = p->table_cap;
    block **old = p->table;
    int64_t cap = old_cap ? 2 * old_cap : 256;
    block **t = calloc((size_t)cap, sizeof *t);
    if (!t) return false;
    p->table = t;
    p->table_cap = cap;
    p->table_n = 0;
    for (int64_t i = 0; i < old_cap; i++)
        if (old[i]) table_put(p, old[i]);
    free(old);
    return true;
}

static bool table_put(fl_pool *p, block *b) {
    if (!table_grow(p)) return false;
    uint64_t i = slot_of(p, b->ptr);
    while (p->table[i]) i = (i + 1) & (uint64_t)(p->table_cap - 1);
    p->table[i] = b;
    p->table_n++;
    return true;
}

static block *table_find(const fl_pool *p, const void *ptr, uint64_t *slot) {
    if (!p->table_cap) return NULL;
    uint64_t i = slot_of(p, ptr);
    while (p->table[i]) {
        if (p->table[i]->ptr == ptr) {
            if (slot) *slot = i;
            return p->table[i];
        }
        i = (i + 1) & (uint64_t)(p->table_cap - 1);
    }
    return NULL;
}

/* Remove slot i, shifting later entries of its probe run back (no
 * tombstones). */
static void table_remove_at(fl_pool *p, uint64_t i) {
    uint64_t mask = (uint64_t)(p->table_cap - 1);
    p->table[i] = NULL;
    p->table_n--;
    for (uint64_t j = (i + 1) & mask; p->table[j]; j = (j + 1) & mask) {
        block *b = p->table[j];
        uint64_t home = slot_of(p, b->ptr);
        /* b may move to i if i lies cyclically in [home, j). */
        bool movable = (j > i) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            p->table[i] = b;
            p->table[j] = NULL;
            i = j;
        }
    }
}

/* ---- blocks ---------------------------------------------------------------- */

static int64_t round_size(int64_t n) {
    if (n < ROUND) return ROUND;
    return (n + ROUND - 1) / ROUND * ROUND;
}

static int64_t segment_size(int64_t size) {
    if (size <= SMALL_REQUEST) return SMALL_SEGMENT;
    if (size < MID_REQUEST) return LARGE_SEGMENT;
    return (size + SEGMENT_ROUND - 1) / SEGMENT_ROUND * SEGMENT_ROUND;
}

static bool worth_splitting(const block *b, int64_t size) {
    int64_t rest = b->size - size;
    return b->large ? rest > MIN_LARGE_SPLIT : rest >= ROUND;
}

static void note_peaks(fl_pool_stats *st) {
    if (st->allocated > st->peak_allocated) st->peak_allocated = st->allocated;
    if (st->reserved > st->peak_reserved) st->peak_reserved = st->reserved;
}

/* Put a block that nothing uses any more back in its free set, merged with
 * free neighbours. */
static void release_block(fl_pool *p, block *b) {
    block_set *set = free_set(p, b);
    p->st.allocated -= b->size;
    p->st.requested -= b->requested;
    p->st.active_blocks--;
    b->in_use = false;
    b->requested = 0;
    b->n_uses = 0;
    block *n = b->next;
    if (n && !n->in_use) {
        set_remove(set, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        drop_block(p, n);
    }
    block *q = b->prev;
    if (q && !q->in_use) {
        set_remove(set, q);
        q->size += b->size;
        q->next = b->next;
        if (b->next) b->next->prev = q;
        drop_block(p, b);
        b = q;
    }
    set_insert(set, b);
}

/* Release the pending blocks whose events are all done. */
static void process_pending(fl_pool *p) {
    for (int i = 0; i < p->pending.n;) {
        block *b = p->pending.v[i];
        bool done = true;
        for (int e = 0; e < b->n_events && done; e++)
            done = p->dev.event_done(p->dev.ctx, b->events[e]);
        if (!done) {
            i++;
            continue;
        }
        for (int e = 0; e < b->n_events; e++) p->dev.event_destroy(p->dev.ctx, b->events[e]);
        b->n_events = 0;
        p->pending.v[i] = p->pending.v[--p->pending.n];
        release_block(p, b);
    }
}

/* Return wholly free segments of one set to the device. */
static int64_t release_segments(fl_pool *p, block_set *set) {
    int64_t released = 0;
    for (int i = 0; i < set->n;) {
        block *b = set->v[i];
        if (b->prev || b->next) {
            i++;
            continue;
        }
        memmove(set->v + i, set->v + i + 1, (size_t)(set->n - i - 1) * sizeof *set->v);
        set->n--;
        p->dev.free(p->dev.ctx, b->ptr, b->size);
        p->st.reserved -= b->size;
        p->st.segments--;
        p->st.device_frees++;
        released += b->size;
        drop_block(p, b);
    }
    return released;
}

static int64_t empty_cache_locked(fl_pool *p) {
    process_pending(p);
    return release_segments(p, &p->free_small) + release_segments(p, &p->free_large);
}

static void *device_alloc(fl_pool *p, int64_t nbytes) {
    if (p->limit > 0 && p->st.reserved + nbytes > p->limit) return NULL;
    return p->dev.alloc(p->dev.ctx, nbytes);
}

/* A fresh segment for `size` on `stream`, as one free block (not in a set). */
static block *new_segment(fl_pool *p, int64_t size, uint64_t stream) {
    int64_t seg = segment_size(size);
    void *mem = device_alloc(p, seg);
    if (!mem) {
        /* Only worth a second try if the cache gave something back. */
        if (empty_cache_locked(p) == 0) return NULL;
        p->st.alloc_retries++;
        mem = device_alloc(p, seg);
        if (!mem) return NULL;
    }
    block *b = calloc(1, sizeof *b);
    if (!b || !reserve_block(p)) {
        free(b);
        p->dev.free(p->dev.ctx, mem, seg);
        return NULL;
    }
    b->ptr = mem;
    b->size = seg;
    b->stream = stream;
    b->large = size > SMALL_REQUEST;
    p->st.reserved += seg;
    p->st.segments++;
    p->st.device_allocs++;
    return b;
}

/* ---- public ---------------------------------------------------------------- */

fl_pool *fl_pool_create(const fl_pool_device *device, const char *name) {
    fl_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->dev = *device;
    snprintf(p->name, sizeof p->name, "%s", name ? name : "device");
    pthread_mutex_init(&p->lock, NULL);
    return p;
}

static void destroy_blocks(fl_pool *pool, const block_set *s) {
    for (int i = 0; i < s->n; i++) {
        block *b = s->v[i];
        for (int e = 0; e < b->n_events; e++) pool->dev.event_destroy(pool->dev.ctx, b->events[e]);
        /* A segment's first block holds the segment's address. */
        if (!b->prev) {
            int64_t seg = 0;
            for (block *x = b; x; x = x->next) seg += x->size;
            pool->dev.free(pool->dev.ctx, b->ptr, seg);
        }
        free(b->uses);
        free(b->events);
        free(b);
    }
}

void fl_pool_destroy(fl_pool *pool) {
    if (!pool) return;
    /* Every block is in exactly one place: a free set, the pending list or
     * the table of handed-out blocks. Segment sizes are summed before any
     * block struct is freed. */
    block_set all = {0};
    const block_set *sets[] = {&pool->free_small, &pool->free_large, &pool->pending};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < sets[s]->n; i++)
            if (set_reserve(&all, all.n + 1)) all.v[all.n++] = sets[s]->v[i];
    for (int64_t i = 0; i < pool->table_cap; i++)
        if (pool->table[i] && set_reserve(&all, all.n + 1)) all.v[all.n++] = pool->table[i];
    /* Heads first (they sum their segments), then the rest. */
    block_set heads = {0}, rest = {0};
    for (int i = 0; i < all.n; i++) {
        block_set *into = all.v[i]->prev ? &rest : &heads;
        if (set_reserve(into, into->n + 1)) into->v[into->n++] = all.v[i];
    }
    destroy_blocks(pool, &heads);
    destroy_blocks(pool, &rest);
    free(heads.v);
    free(rest.v);
    free(all.v);
    free(pool->free_small.v);
    free(pool->free_large.v);
    free(pool->pending.v);
    free(pool->table);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

void *fl_pool_alloc(fl_pool *p, int64_t nbytes, uint64_t stream) {
    if (nbytes < 0) return NULL;
    int64_t size = round_size(nbytes);
    bool large = size > SMALL_REQUEST;
    pthread_mutex_lock(&p->lock);
    if (p->pending.n) process_pending(p);
    block_set *set = large ? &p->free_large : &p->free_small;
    block *b = NULL;
    int at = set_lower_bound(set, stream, size, NULL);
    /* The table's room first, so that nothing fails once a block is taken
     * (no host memory for it is out of memory too). */
    if (table_grow(p)) {
        if (at < set->n && set->v[at]->stream == stream) {
            b = set->v[at];
            set_remove(set, b);
        } else {
            b = new_segment(p, size, stream);
        }
    }
    if (!b) {
        p->st.ooms++;
        p->last_request = nbytes;
        p->last_stream = stream;
        pthread_mutex_unlock(&p->lock);
        return NULL;
    }
    if (worth_splitting(b, size)) {
        /* Without host memory for the rest the block is handed out whole. */
        block *rest = calloc(1, sizeof *rest);
        if (rest && !reserve_block(p)) {
            free(rest);
            rest = NULL;
        }
        if (rest) {
            rest->ptr = b->ptr + size;
            rest->size = b->size - size;
            rest->stream = stream;
            rest->large = b->large;
            rest->prev = b;
            rest->next = b->next;
            if (b->next) b->next->prev = rest;
            b->next = rest;
            b->size = size;
            set_insert(set, rest);
        }
    }
    b->in_use = true;
    b->requested = nbytes;
    bool put = table_put(p, b);
    FL_ASSERT(put); /* its room was made above */
    p->st.allocated += b->size;
    p->st.requested += nbytes;
    p->st.active_blocks++;
    note_peaks(&p->st);
    pthread_mutex_unlock(&p->lock);
    return b->ptr;
}

bool fl_pool_free(fl_pool *p, void *ptr) {
    pthread_mutex_lock(&p->lock);
    uint64_t slot;
    block *b = table_find(p, ptr, &slot);
    if (!b) {
        pthread_mutex_unlock(&p->lock);
        return false;
    }
    table_remove_at(p, slot);
    if (b->n_uses > 0 && p->dev.record_event) {
        for (int i = 0; i < b->n_uses; i++)
            b->events[b->n_events++] = p->dev.record_event(p->dev.ctx, b->uses[i]);
        FL_ASSERT(p->pending.n < p->pending.cap); /* room for every block */
        p->pending.v[p->pending.n++] = b; /* unordered: only ever scanned */
    } else {
        release_block(p, b);
    }
    pthread_mutex_unlock(&p->lock);
    return true;
}

bool fl_pool_record_stream(fl_pool *p, void *ptr, uint64_t stream) {
    pthread_mutex_lock(&p->lock);
    block *b = table_find(p, ptr, NULL);
    bool ok = b != NULL;
    if (!ok) fl_fail(FL_ERR_STATE, "device pool %s: %p is not a block it handed out", p->name, ptr);
    if (ok && stream != b->stream) {
        bool known = false;
        for (int i = 0; i < b->n_uses; i++) known |= b->uses[i] == stream;
        if (!known && b->n_uses == b->cap_uses) {
            /* The event slots grow with the uses, so the free that records
             * the events needs no memory. */
            int cap = b->cap_uses ? 2 * b->cap_uses : 2;
            uint64_t *u = realloc(b->uses, (size_t)cap * sizeof *u);
            if (u) b->uses = u;
            void **e = u ? realloc(b->events, (size_t)cap * sizeof *e) : NULL;
            if (e) {
                b->events = e;
                b->cap_uses = cap;
            } else {
                ok = false;
                fl_fail(FL_ERR_OOM, "device pool %s: no host memory to note a second stream's use of a block",
                        p->name);
            }
        }
        if (ok && !known) b->uses[b->n_uses++] = stream;
    }
    pthread_mutex_unlock(&p->lock);
    return ok;
}

void fl_pool_set_limit(fl_pool *p, int64_t bytes) {
    pthread_mutex_lock(&p->lock);
    p->limit = bytes > 0 ? bytes : 0;
    pthread_mutex_unlock(&p->lock);
}

int64_t fl_pool_empty_cache(fl_pool *p) {
    pthread_mutex_lock(&p->lock);
    int64_t released = empty_cache_locked(p);
    pthread_mutex_unlock(&p->lock);
    return released;
}

static int64_t largest_free(const fl_pool *p) {
    int64_t best = 0;
    const block_set *sets[] = {&p->free_small, &p->free_large};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < sets[s]->n; i++)
            if (sets[s]->v[i]->size > best) best = sets[s]->v[i]->size;
    return best;
}

void fl_pool_stats_get(fl_pool *p, fl_pool_stats *out) {
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    out->largest_free = largest_free(p);
    pthread_mutex_unlock(&p->lock);
}

void fl_pool_stats_reset(fl_pool *p) {
    pthread_mutex_lock(&p->lock);
    p->st.peak_allocated = p->st.allocated;
    p->st.peak_reserved = p->st.reserved;
    p->st.alloc_retries = 0;
    p->st.ooms = 0;
    pthread_mutex_unlock(&p->lock);
}

static const char *human(int64_t n, char *buf, size_t size) {
    if (n >= (1ll << 30)) snprintf(buf, size, "%.2f GiB", (double)n / (1ll << 30));
    else if (n >= (1 << 20)) snprintf(buf, size, "%.2f MiB", (double)n / (1 << 20));
    else if (n >= 1024) snprintf(buf, size, "%.2f KiB", (double)n / 1024);
    else snprintf(buf, size, "%lld bytes", (long long)n);
    return buf;
}

const char *fl_pool_oom_message(fl_pool *p, char *buf, size_t size) {
    fl_pool_stats st;
    fl_pool_stats_get(p, &st);
    char req[32], alloc[32], res[32], cached[32], big[32], peak[32], dev[96] = "", lim[48] = "";
    int64_t f = 0, t = 0;
    if (p->dev.mem_info && p->dev.mem_info(p->dev.ctx, &f, &t) == 0) {
        char fb[32], tb[32];
        snprintf(dev, sizeof dev, "; the device has %s free of %s", human(f, fb, sizeof fb),
                 human(t, tb, sizeof tb));
    }
    if (p->limit > 0) {
        char lb[32];
        snprintf(lim, sizeof lim, "; the pool's limit is %s", human(p->limit, lb, sizeof lb));
    }
    snprintf(buf, size,
             "out of memory on %s: tried to allocate %s (stream %llu); %s allocated to tensors, "
             "%s reserved by the caching allocator in %lld segments (%s cached free, the "
             "largest free block %s), peak allocated %s%s%s",
             p->name, human(p->last_request, req, sizeof req), (unsigned long long)p->last_stream,
             human(st.allocated, alloc, sizeof alloc), human(st.reserved, res, sizeof res),
             (long long)st.segments, human(st.reserved - st.allocated, cached, sizeof cached),
             human(st.largest_free, big, sizeof big), human(st.peak_allocated, peak, sizeof peak),
             lim, dev);
    return buf;
}
