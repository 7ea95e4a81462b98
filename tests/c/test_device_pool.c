/*
 * test_device_pool.c: the caching allocator of device memory
 * (core/tensor/device_pool.c) over a fake device: host memory with a
 * capacity, and events that complete when the test says so. Rounding,
 * segment sizes, splitting and merging, best fit, stream ownership, reuse
 * held back by events, out of memory with the retry, the pool's limit,
 * emptying the cache, and a random workload checked for overlaps.
 */
#include "test_util.h"

#include "fl_tests.h"

#include <stdlib.h>

/* The pool is compiled in: its symbols are internal to libfsdp. */
#include "../../core/tensor/device_pool.c"

#define MiB (1ll << 20)

typedef struct fake_device {
    int64_t capacity, used;
    int live_allocs;
} fake_device;

typedef struct fake_event {
    bool done;
    struct fake_event *next_made;
} fake_event;

static fake_event *events_made; /* every event the pool asked for, newest first */
static int events_alive;

static void *fake_alloc(void *ctx, int64_t n) {
    fake_device *d = ctx;
    if (d->used + n > d->capacity) return NULL;
    void *p = aligned_alloc(512, (size_t)n);
    if (!p) return NULL;
    d->used += n;
    d->live_allocs++;
    return p;
}

static void fake_free(void *ctx, void *p, int64_t n) {
    fake_device *d = ctx;
    d->used -= n;
    d->live_allocs--;
    free(p);
}

static void *fake_record(void *ctx, uint64_t stream) {
    (void)ctx;
    (void)stream;
    fake_event *e = calloc(1, sizeof *e);
    e->next_made = events_made;
    events_made = e;
    events_alive++;
    return e;
}

static bool fake_done(void *ctx, void *e) {
    (void)ctx;
    return ((fake_event *)e)->done;
}

/* Destroyed events stay in the list (marked) so the test can walk it. */
static void fake_destroy(void *ctx, void *e) {
    (void)ctx;
    (void)e;
    events_alive--;
}

static int fake_info(void *ctx, int64_t *free_bytes, int64_t *total) {
    fake_device *d = ctx;
    *free_bytes = d->capacity - d->used;
    *total = d->capacity;
    return 0;
}

static fake_device dev;

static fl_pool *make_pool(int64_t capacity) {
    dev = (fake_device){.capacity = capacity};
    fl_pool_device fd = {.ctx = &dev, .alloc = fake_alloc, .free = fake_free,
                         .record_event = fake_record, .event_done = fake_done,
                         .event_destroy = fake_destroy, .mem_info = fake_info};
    return fl_pool_create(&fd, "fake:0");
}

static void finish(fl_pool *p) {
    fl_pool_destroy(p);
    assert_int_equal(dev.used, 0);
    assert_int_equal(dev.live_allocs, 0);
    while (events_made) {
        fake_event *e = events_made;
        events_made = e->next_made;
        free(e);
    }
    assert_int_equal(events_alive, 0);
}

static fl_pool_stats stats(fl_pool *p) {
    fl_pool_stats s;
    fl_pool_stats_get(p, &s);
    return s;
}

static void rounds_and_reuses_warm_blocks(void **state) {
    (void)state;
    fl_pool *p = make_pool(1ll << 30);
    char *a = fl_pool_alloc(p, 1000, 0);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 512, 0);
    assert_int_equal(stats(p).allocated, 1024);
    assert_int_equal(stats(p).requested, 1000);
    assert_int_equal(stats(p).reserved, 2 * MiB); /* a small segment */
    assert_true(fl_pool_free(p, a));
    assert_int_equal(stats(p).allocated, 0);
    char *b = fl_pool_alloc(p, 1000, 0);
    assert_ptr_equal(a, b); /* the warm block, no new device allocation */
    assert_int_equal(stats(p).device_allocs, 1);
    char *z = fl_pool_alloc(p, 0, 0); /* zero bytes still get an address */
    assert_non_null(z);
    assert_int_equal(stats(p).allocated, 1024 + 512);
    assert_false(fl_pool_free(p, a + 512)); /* not a block's address */
    finish(p);
}

static void sizes_pick_segments(void **state) {
    (void)state;
    fl_pool *p = make_pool(1ll << 30);
    char *s1 = fl_pool_alloc(p, 4096, 0), *s2 = fl_pool_alloc(p, 4096, 0);
    assert_ptr_equal(s2, s1 + 4096); /* carved from one small segment */
    assert_int_equal(stats(p).segments, 1);
    fl_pool_alloc(p, 5 * MiB, 0); /* under 10 MiB: a 20 MiB segment */
    assert_int_equal(stats(p).reserved, 2 * MiB + 20 * MiB);
    char *m = fl_pool_alloc(p, 3 * MiB, 0); /* the rest of that segment */
    assert_non_null(m);
    assert_int_equal(stats(p).segments, 2);
    assert_non_null(fl_pool_alloc(p, 12 * MiB, 0)); /* the segment's last 12 MiB */
    assert_int_equal(stats(p).segments, 2);
    fl_pool_alloc(p, 13 * MiB + 1, 0); /* rounded up to 2 MiB: 14 MiB */
    assert_int_equal(stats(p).reserved, 2 * MiB + 20 * MiB + 14 * MiB);
    assert_int_equal(stats(p).segments, 3);
    finish(p);
    /* A large remainder of at most 1 MiB is not split off. */
    fl_pool *q = make_pool(1ll << 30);
    char *big = fl_pool_alloc(q, 12 * MiB - 512 * 1024, 0);
    assert_int_equal(stats(q).allocated, 12 * MiB);
    fl_pool_free(q, big);
    finish(q);
}

static void merges_free_neighbours_and_fits_best(void **state) {
    (void)state;
    fl_pool *p = make_pool(1ll << 30);
    char *a = fl_pool_alloc(p, 8192, 0), *b = fl_pool_alloc(p, 8192, 0);
    char *c = fl_pool_alloc(p, 8192, 0), *d = fl_pool_alloc(p, 512, 0);
    (void)d;
    fl_pool_free(p, b);
    fl_pool_free(p, a); /* merges with b: 16 KiB free at a */
    char *ab = fl_pool_alloc(p, 16384, 0);
    assert_ptr_equal(ab, a);
    /* Best fit: with free blocks of 8 KiB (c) and ~2 MiB (the tail), a
     * 6 KiB request takes c, not the tail. */
    fl_pool_free(p, c);
    char *e = fl_pool_alloc(p, 6144, 0);
    assert_ptr_equal(e, c);
    /* Freeing everything gives one whole free segment back. */
    fl_pool_free(p, ab);
    fl_pool_free(p, e);
    fl_pool_free(p, d);
    assert_int_equal(stats(p).largest_free, 2 * MiB);
    assert_int_equal(fl_pool_empty_cache(p), 2 * MiB);
    assert_int_equal(stats(p).reserved, 0);
    finish(p);
}

static void blocks_belong_to_their_stream(void **state) {
    (void)state;
    fl_pool *p = make_pool(1ll << 30);
    char *a = fl_pool_alloc(p, 4096, 1);
    fl_pool_free(p, a);
    char *b = fl_pool_alloc(p, 4096, 2); /* another stream: another segment */
    assert_ptr_not_equal(a, b);
    assert_int_equal(stats(p).segments, 2);
    char *c = fl_pool_alloc(p, 4096, 1);
    assert_ptr_equal(a, c);
    finish(p);
}

static void reuse_waits_for_other_streams(void **state) {
    (void)state;
    fl_pool *p = make_pool(1ll << 30);
    char *a = fl_pool_alloc(p, 4096, 1);
    assert_true(fl_pool_record_stream(p, a, 2));
    assert_true(fl_pool_record_stream(p, a, 2)); /* once per stream */
    assert_true(fl_pool_record_stream(p, a, 1)); /* its own: nothing to wait for */
    fl_pool_free(p, a);
    assert_int_equal(events_alive, 1);
    assert_int_equal(stats(p).active_blocks, 1); /* held back */
    char *b = fl_pool_alloc(p, 4096, 1);
    assert_ptr_not_equal(a, b); /* stream 2 may still be reading a */
    events_made->done = true;
    fl_pool_free(p, b);
    char *c = fl_pool_alloc(p, 4096, 1);
    assert_ptr_equal(a, c); /* the event completed: a is free again */
    assert_int_equal(events_alive, 0);
    assert_false(fl_pool_record_stream(p, a + 4096 * 8, 3));
    assert_non_null(strstr(fl_last_error(), "is not a block it handed out"));
    finish(p);
}

static void out_of_memory_empties_the_cache_then_reports(void **state) {
    (void)state;
    fl_pool *p = make_pool(30 * MiB);
    char *a = fl_pool_alloc(p, 5 * MiB, 1); /* a 20 MiB segment of stream 1 */
    fl_pool_free(p, a);                      /* cached for stream 1 */
    char *b = fl_pool_alloc(p, 12 * MiB, 0); /* 20 + 12 > 30: release, retry */
    assert_non_null(b);
    assert_int_equal(stats(p).alloc_retries, 1);
    assert_int_equal(stats(p).reserved, 12 * MiB);
    assert_null(fl_pool_alloc(p, 20 * MiB, 0)); /* nothing cached to give back */
    assert_int_equal(stats(p).ooms, 1);
    char msg[512];
    fl_pool_oom_message(p, msg, sizeof msg);
    assert_non_null(strstr(msg, "out of memory on fake:0: tried to allocate 20.00 MiB"));
    assert_non_null(strstr(msg, "12.00 MiB allocated to tensors"));
    assert_non_null(strstr(msg, "12.00 MiB reserved by the caching allocator in 1 segments"));
    assert_non_null(strstr(msg, "the device has 18.00 MiB free of 30.00 MiB"));
    /* The pool's own limit acts as a smaller device. */
    fl_pool_set_limit(p, 16 * MiB);
    assert_null(fl_pool_alloc(p, 6 * MiB, 0));
    fl_pool_oom_message(p, msg, sizeof msg);
    assert_non_null(strstr(msg, "the pool's limit is 16.00 MiB"));
    fl_pool_set_limit(p, 0);
    assert_non_null(fl_pool_alloc(p, 512 * 1024, 0)); /* a small segment fits */
    fl_pool_stats_reset(p);
    assert_int_equal(stats(p).ooms, 0);
    assert_int_equal(stats(p).peak_allocated, stats(p).allocated);
    finish(p);
}

/* Random allocations and frees on two streams, some used across streams:
 * live blocks never overlap (checked by address, and each block's first and
 * last byte keep its tag), the statistics add up, and everything goes back. */
static void random_workload_keeps_blocks_apart(void **state) {
    (void)state;
    enum { LIVE = 64, STEPS = 4000 };
    fl_pool *p = make_pool(1ll << 30);
    struct { char *ptr; int64_t n; int tag; } live[LIVE] = {{0}};
    unsigned seed = 12345;
    int64_t requested = 0;
    for (int step = 0; step < STEPS; step++) {
        int i = (int)(rand_r(&seed) % LIVE);
        if (live[i].ptr) {
            if (live[i].n > 0 && (live[i].ptr[0] != (char)live[i].tag ||
                                  live[i].ptr[live[i].n - 1] != (char)live[i].tag))
                fail_msg("block %d was overwritten", i);
            assert_true(fl_pool_free(p, live[i].ptr));
            requested -= live[i].n;
            live[i].ptr = NULL;
        } else {
            int64_t n = (rand_r(&seed) % 4 == 0) ? (int64_t)(rand_r(&seed) % (24 * MiB))
                                                 : (int64_t)(rand_r(&seed) % 300000);
            uint64_t stream = rand_r(&seed) % 2;
            live[i].ptr = fl_pool_alloc(p, n, stream);
            assert_non_null(live[i].ptr);
            if (rand_r(&seed) % 8 == 0) fl_pool_record_stream(p, live[i].ptr, 1 - stream);
            live[i].n = n;
            live[i].tag = step & 0x7f;
            for (int j = 0; j < LIVE; j++) {
                if (j == i || !live[j].ptr) continue;
                char *a0 = live[i].ptr, *a1 = a0 + (n ? n : 1);
                char *b0 = live[j].ptr, *b1 = b0 + (live[j].n ? live[j].n : 1);
                if (a0 < b1 && b0 < a1) fail_msg("blocks %d and %d overlap", i, j);
            }
            if (n > 0) live[i].ptr[0] = live[i].ptr[n - 1] = (char)live[i].tag;
            requested += n;
        }
        if (step % 50 == 0)
            for (fake_event *e = events_made; e; e = e->next_made) e->done = true;
        /* Blocks waiting on events still count as requested. */
        assert_true(stats(p).requested >= requested);
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i].ptr) fl_pool_free(p, live[i].ptr);
    for (fake_event *e = events_made; e; e = e->next_made) e->done = true;
    fl_pool_empty_cache(p);
    fl_pool_stats s = stats(p);
    assert_int_equal(s.allocated, 0);
    assert_int_equal(s.requested, 0);
    assert_int_equal(s.reserved, 0);
    assert_int_equal(s.segments, 0);
    assert_int_equal(dev.used, 0);
    assert_int_equal(s.device_allocs, s.device_frees);
    finish(p);
}

/* A pool destroyed with blocks still out returns all its memory. */
static void destroy_returns_everything(void **state) {
    (void)state;
    fl_pool *p = make_pool(1ll << 30);
    char *a = fl_pool_alloc(p, 4096, 0);
    fl_pool_alloc(p, 4096, 0);
    fl_pool_alloc(p, 30 * MiB, 0);
    fl_pool_record_stream(p, a, 5);
    fl_pool_free(p, a); /* pending on an event */
    finish(p);
}

int fl_test_device_pool(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rounds_and_reuses_warm_blocks),
        cmocka_unit_test(sizes_pick_segments),
        cmocka_unit_test(merges_free_neighbours_and_fits_best),
        cmocka_unit_test(blocks_belong_to_their_stream),
        cmocka_unit_test(reuse_waits_for_other_streams),
        cmocka_unit_test(out_of_memory_empties_the_cache_then_reports),
        cmocka_unit_test(random_workload_keeps_blocks_apart),
        cmocka_unit_test(destroy_returns_everything),
    };
    return cmocka_run_group_tests_name("device_pool", tests, NULL, NULL);
}
