/*
 * device_pool.h: a caching allocator for device memory, in the manner of
 * PyTorch's CUDA caching allocator (see device_pool.c for the policy).
 *
 * The pool makes no device calls itself: the device's raw allocator and its
 * stream events come in as callbacks (fl_pool_device), so the CUDA backend
 * plugs in cudaMalloc and cudaEvent*, and the C tests plug in malloc and
 * hand-driven events. Self-contained (libc and pthreads only) for the same
 * reason: tests/c/test_device_pool.c compiles it in.
 */
#ifndef FL_DEVICE_POOL_H
#define FL_DEVICE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Exported to backend plugins (core/base/error.h says why; repeated here so the
 * header stays self-contained). */
#ifndef FL_PLUGIN_API
#define FL_PLUGIN_API __attribute__((visibility("default")))
#endif

typedef struct fl_pool_device {
    void *ctx;
    /* Memory from the device, NULL when it refuses; and back. */
    void *(*alloc)(void *ctx, int64_t nbytes);
    void (*free)(void *ctx, void *ptr, int64_t nbytes);
    /* An event recorded now on `stream`, done once the work queued there so
     * far has run. All three NULL on a device without streams. */
    void *(*record_event)(void *ctx, uint64_t stream);
    bool (*event_done)(void *ctx, void *event);
    void (*event_destroy)(void *ctx, void *event);
    /* Free and total device memory, for out-of-memory reports; may be NULL. */
    int (*mem_info)(void *ctx, int64_t *free_bytes, int64_t *total_bytes);
} fl_pool_device;

typedef struct fl_pool_stats {
    int64_t allocated;       /* bytes of the blocks handed out (rounded sizes) */
    int64_t requested;       /* bytes asked for by those blocks */
    int64_t reserved;        /* bytes of the segments held from the device */
    int64_t peak_allocated;  /* high-water marks since creation or reset */
    int64_t peak_reserved;
    int64_t active_blocks;   /* blocks handed out, or freed but waiting on events */
    int64_t segments;        /* device allocations held */
    int64_t largest_free;    /* largest cached free block */
    int64_t device_allocs;   /* device allocations and frees made */
    int64_t device_frees;
    int64_t alloc_retries;   /* device refusals answered by emptying the cache */
    int64_t ooms;            /* requests that failed even after that */
} fl_pool_stats;

typedef struct fl_pool fl_pool;

/* A pool over `device` (copied); `name` ("cuda:0") appears in messages. */
FL_PLUGIN_API fl_pool *fl_pool_create(const fl_pool_device *device, const char *name);
/* Return every segment to the device. Blocks still handed out are the
 * caller's leak: they are freed with their segments. */
FL_PLUGIN_API void fl_pool_destroy(fl_pool *pool);

/* A block of at least nbytes for work on `stream`, aligned to 512 bytes;
 * NULL when out of memory (fl_pool_oom_message then says why). */
FL_PLUGIN_API void *fl_pool_alloc(fl_pool *pool, int64_t nbytes, uint64_t stream);
/* Give a block back. Returns false for a pointer the pool did not hand out. */
FL_PLUGIN_API bool fl_pool_free(fl_pool *pool, void *ptr);
/* The block at ptr is also used by work on `stream`: when freed, it is not
 * reused before that work has run. Returns false, with the error set
 * (fl_last_error), for an unknown pointer or without host memory to note
 * the stream. */
FL_PLUGIN_API bool fl_pool_record_stream(fl_pool *pool, void *ptr, uint64_t stream);

/* Refuse to hold more than `bytes` of device memory (0: no limit), as if
 * the device were that small. */
FL_PLUGIN_API void fl_pool_set_limit(fl_pool *pool, int64_t bytes);
/* Return the cached segments that are wholly free; returns the bytes. */
FL_PLUGIN_API int64_t fl_pool_empty_cache(fl_pool *pool);

FL_PLUGIN_API void fl_pool_stats_get(fl_pool *pool, fl_pool_stats *out);
/* Peaks back to the current values; retries and OOMs to 0. */
FL_PLUGIN_API void fl_pool_stats_reset(fl_pool *pool);

/* Why the last failed fl_pool_alloc failed: the request and what the pool
 * and device hold. Written into buf; returns buf. */
FL_PLUGIN_API const char *fl_pool_oom_message(fl_pool *pool, char *buf, size_t size);

#endif /* FL_DEVICE_POOL_H */
