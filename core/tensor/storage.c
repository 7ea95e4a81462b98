/*
 * storage.c: reference-counted blocks of device memory that tensors view.
 *
 * Storage is allocated through the device's backend and accounted in the
 * memory statistics; storage the core did not allocate (a memory-mapped
 * file, a buffer owned by another library) carries its own release callback
 * and is not counted as allocator memory.
 */
#include "error.h"
#include "storage.h"
#include "memory.h"
#include "backend.h"

#include <stdatomic.h>

static _Atomic uint64_t next_storage_id = 1;
static void (*_Atomic allocation_hook)(void);

void fl_set_allocation_hook(void (*hook)(void)) { atomic_store(&allocation_hook, hook); }

fl_storage *fl_storage_new(fl_device device, int64_t nbytes) {
    const fl_backend *be = fl_backend_of(device);
    fl_device_kind kind = fl_device_kind_of(device);
    if (!be) {
        char dev[32];
        fl_device_format(device, dev, sizeof dev);
        return FL_FAIL_NULL(FL_ERR_DEVICE, "cannot allocate on device %s: %s", dev,
                            kind == FL_DEVICE_META ? "it holds no storage"
                                                   : fl_device_status(kind));
    }
    if (fl_device_index(device) >= fl_device_count(kind)) {
        char dev[32];
        fl_device_format(device, dev, sizeof dev);
        return FL_FAIL_NULL(FL_ERR_DEVICE, "device %s is not available: %s", dev,
                            fl_device_status(kind));
    }
    fl_storage *s = calloc(1, sizeof *s);
    if (!s) return FL_FAIL_NULL(FL_ERR_OOM, "out of CPU memory for a storage header");
    if (fl_memory_note_alloc(device, nbytes) != FL_OK) {
        free(s);
        return NULL;
    }
    int index = fl_device_index(device);
    /* Allocate at least one byte so a 0-element tensor still has an address. */
    s->data = be->alloc(index, nbytes > 0 ? nbytes : 1);
    if (!s->data) {
        fl_memory_note_free(device, nbytes);
        fl_memory_note_failure(device);
        free(s);
        char why[768];
        if (be->describe_oom && be->describe_oom(index, why, sizeof why))
            return FL_FAIL_NULL(FL_ERR_OOM, "%s", why);
        char dev[32];
        fl_device_format(device, dev, sizeof dev);
        fl_memory_stats st;
        fl_memory_stats_get(device, &st);
        return FL_FAIL_NULL(FL_ERR_OOM,
                            "out of memory on %s: the system refused %lld bytes "
                            "(%lld in use, peak %lld)",
                            dev, (long long)nbytes, (long long)st.in_use, (long long)st.peak);
    }
    s->nbytes = nbytes;
    s->refcount = 1;
    s->device = device;
    s->id = atomic_fetch_add(&next_storage_id, 1);
    void (*hook)(void) = atomic_load(&allocation_hook);
    if (hook) hook();
    return s;
}

/* [Note: virtual storage]
 * A meta or fake tensor holds no memory, but it stands for some: the bytes
 * a real run would allocate for it. Each one made by a creation function
 * (an op's result, a factory) gets a virtual storage of that size, which
 * its views share exactly as real views share real storage, and which is
 * counted in the meta device's memory statistics from creation until the
 * last tensor referring to it is released. So a training step run on meta
 * tensors measures, through fl_memory_stats_get(meta), the bytes the same
 * step would hold on a device, views, saved tensors and the autograd
 * engine's early frees included: fsdp.plan's trace (lua/fsdp/plan/trace.lua)
 * reads it. Virtual storage is t->virtual_storage, never t->storage, so
 * everything that asks "does this tensor have values?" (t->storage) still
 * says no. Scratch a backend takes inside a kernel has no tensor; the
 * product's is imitated on request (fl_meta_set_f32_gemm, matmul.c). */
/* [Note: frees from before a trace]
 * fsdp.plan's trace reads the meta device's bytes in use at the bounds of
 * the segments it measures. A meta tensor made before the trace began and
 * dropped while it runs (garbage whose finalizer the trace's collections
 * happen to reach, behind a chain of other finalizers) is no part of the
 * step, yet its free would lower the bytes in use inside a segment: the
 * segment would read as holding negative bytes. So between
 * fl_meta_trace_begin and fl_meta_trace_end, frees of virtual storages
 * made before the begin are held as "ghost" bytes, still counted in use,
 * and let go together at the end, where they move nothing the trace reads.
 * Storage ids rise with time, so "made before" is "id below the fence". */
static _Atomic uint64_t trace_fence;      /* first id made inside the trace; 0: none */
static _Atomic int64_t trace_ghost_bytes; /* frees from before it, held back */
static _Atomic int trace_depth;

void fl_meta_trace_begin(void) {
    if (atomic_fetch_add(&trace_depth, 1) == 0)
        atomic_store(&trace_fence, atomic_load(&next_storage_id));
}

void fl_meta_trace_end(void) {
    int depth = atomic_fetch_sub(&trace_depth, 1);
    FL_ASSERT(depth > 0);
    if (depth > 1) return;
    atomic_store(&trace_fence, 0);
    int64_t ghost = atomic_exchange(&trace_ghost_bytes, 0);
    if (ghost > 0) fl_memory_note_free(fl_device_make(FL_DEVICE_META, 0), ghost);
}

static void virtual_release(void *ctx, void *data, int64_t nbytes) {
    (void)data;
    const fl_storage *s = ctx;
    uint64_t fence = atomic_load(&trace_fence);
    if (fence != 0 && s->id < fence) {
        atomic_fetch_add(&trace_ghost_bytes, nbytes);
        return;
    }
    fl_memory_note_free(fl_device_make(FL_DEVICE_META, 0), nbytes);
}

fl_storage *fl_storage_virtual(int64_t nbytes) {
    fl_storage *s = calloc(1, sizeof *s);
    if (!s) return FL_FAIL_NULL(FL_ERR_OOM, "out of CPU memory for a storage header");
    fl_device meta = fl_device_make(FL_DEVICE_META, 0);
    if (fl_memory_note_alloc(meta, nbytes) != FL_OK) {
        free(s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->refcount = 1;
    s->device = meta;
    s->id = atomic_fetch_add(&next_storage_id, 1);
    s->release = virtual_release;
    s->release_ctx = s; /* freed only after release returns */
    return s;
}

void fl_storage_retain(fl_storage *s) {
    if (s) __atomic_fetch_add(&s->refcount, 1, __ATOMIC_RELAXED);
}

void fl_storage_release(fl_storage *s) {
    if (!s) return;
    int32_t left = __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL);
    FL_ASSERT(left >= 0);
    if (left > 0) return;
    if (s->release) {
        s->release(s->release_ctx, s->data, s->nbytes);
    } else {
        const fl_backend *be = fl_backend_of(s->device);
        FL_ASSERT(be != NULL);
        be->free(fl_device_index(s->device), s->data, s->nbytes > 0 ? s->nbytes : 1);
        fl_memory_note_free(s->device, s->nbytes);
    }
    free(s);
}
