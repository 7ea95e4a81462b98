/*
 * memory.c: allocation accounting per device (bytes in use, peak, counts)
 * and optional limits.
 *
 * Every allocation of tensor storage passes through fl_memory_note_alloc, so
 * the statistics are exact for memory the core owns; a limit turns an
 * allocation that would exceed it into a clean FL_ERR_OOM, which is how
 * tests and sweeps exercise out-of-memory handling on a big machine.
 * Counters are atomics: communication threads allocate too.
 */
#include "error.h"
#include "memory.h"
#include "backend.h"

#include <stdatomic.h>

typedef struct memory_counters {
    _Atomic int64_t in_use, peak, allocations, frees, failures, limit;
} memory_counters;

static memory_counters counters[FL_DEVICE_KIND_COUNT][FL_MAX_DEVICE_INDEX + 1];
static _Atomic int64_t allocated_total;

int64_t fl_memory_allocated_total(void) { return atomic_load(&allocated_total); }

static memory_counters *counters_of(fl_device device) {
    int kind = fl_device_kind_of(device), index = fl_device_index(device);
    if (kind < 0 || kind >= FL_DEVICE_KIND_COUNT || index < 0 || index > FL_MAX_DEVICE_INDEX)
        return NULL;
    return &counters[kind][index];
}

static int device_error(const char *op, fl_device device) {
    return fl_fail(FL_ERR_ARG, "%s: invalid device id %d", op, (int)device);
}

static const char *device_str(fl_device device, char *buf, size_t size) {
    if (fl_device_format(device, buf, size) != FL_OK) snprintf(buf, size, "?");
    return buf;
}

/* peak = max(peak, now), against other threads raising it too. */
static void raise_peak(memory_counters *c, int64_t now) {
    int64_t peak = atomic_load(&c->peak);
    while (now > peak && !atomic_compare_exchange_weak(&c->peak, &peak, now)) {
    }
}

int fl_memory_note_alloc(fl_device device, int64_t nbytes) {
    memory_counters *c = counters_of(device);
    FL_ASSERT(c != NULL && nbytes >= 0);
    int64_t limit = atomic_load(&c->limit);
    int64_t now = atomic_fetch_add(&c->in_use, nbytes) + nbytes;
    if (limit > 0 && now > limit) {
        atomic_fetch_sub(&c->in_use, nbytes);
        atomic_fetch_add(&c->failures, 1);
        char dev[32];
        return fl_fail(FL_ERR_OOM,
                       "out of memory on %s: requested %lld bytes with %lld in use "
                       "(peak %lld) and a limit of %lld bytes",
                       device_str(device, dev, sizeof dev), (long long)nbytes,
                       (long long)(now - nbytes), (long long)atomic_load(&c->peak),
                       (long long)limit);
    }
    atomic_fetch_add(&c->allocations, 1);
    /* Meta bytes are never allocated: they must not pace the collector
     * ([Note: collecting tensors], lua/fsdp/tensor.lua), or building a 70B
     * model on meta would run thousands of collections. */
    if (fl_device_kind_of(device) != FL_DEVICE_META) atomic_fetch_add(&allocated_total, nbytes);
    raise_peak(c, now);
    return FL_OK;
}

void fl_memory_note_free(fl_device device, int64_t nbytes) {
    memory_counters *c = counters_of(device);
    FL_ASSERT(c != NULL);
    atomic_fetch_sub(&c->in_use, nbytes);
    atomic_fetch_add(&c->frees, 1);
}

void fl_memory_note_transient(fl_device device, int64_t nbytes) {
    memory_counters *c = counters_of(device);
    FL_ASSERT(c != NULL && nbytes >= 0);
    raise_peak(c, atomic_load(&c->in_use) + nbytes);
}

void fl_memory_note_failure(fl_device device) {
    memory_counters *c = counters_of(device);
    if (c) atomic_fetch_add(&c->failures, 1);
}

int fl_memory_stats_get(fl_device device, fl_memory_stats *out) {
    memory_counters *c = counters_of(device);
    if (!c) return device_error("memory_stats", device);
    out->in_use = atomic_load(&c->in_use);
    out->peak = atomic_load(&c->peak);
    out->allocations = atomic_load(&c->allocations);
    out->frees = atomic_load(&c->frees);
    out->failures = atomic_load(&c->failures);
    out->limit = atomic_load(&c->limit);
    const fl_backend *be = fl_backend_of(device);
    out->reserved = be && be->reserved_bytes ? be->reserved_bytes(fl_device_index(device)) : out->in_use;
    return FL_OK;
}

int64_t fl_memory_empty_cache(fl_device device) {
    const fl_backend *be = fl_backend_of(device);
    return be && be->empty_cache ? be->empty_cache(fl_device_index(device)) : 0;
}

int fl_memory_stats_reset(fl_device device) {
    memory_counters *c = counters_of(device);
    if (!c) return device_error("memory_stats_reset", device);
    atomic_store(&c->peak, atomic_load(&c->in_use));
    atomic_store(&c->allocations, 0);
    atomic_store(&c->frees, 0);
    atomic_store(&c->failures, 0);
    return FL_OK;
}

int fl_memory_set_limit(fl_device device, int64_t bytes) {
    memory_counters *c = counters_of(device);
    if (!c) return device_error("memory_set_limit", device);
    if (bytes < 0)
        return fl_fail(FL_ERR_ARG, "memory_set_limit: limit %lld is negative (0 means none)",
                       (long long)bytes);
    atomic_store(&c->limit, bytes);
    return FL_OK;
}
