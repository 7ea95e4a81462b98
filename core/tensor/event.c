/*
 * event.c: the public events and device synchronisation (fsdp.h: fl_event),
 * one interface over the devices: the backend's events on a device that
 * queues work (cuda), the host clock on one where work has run when its
 * call returns (cpu: its backend has no events). Benchmarks and training
 * loops time and wait through these without knowing the device.
 */
#include "error.h"
#include "backend.h"

#include <string.h>
#include <time.h>

struct fl_event {
    fl_device device;
    bool timing;
    bool recorded;
    double host_ms;            /* host clock: when recorded */
    const fl_backend *backend; /* with events, else NULL */
    void *handle;              /* the backend's event */
};

static double host_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The backend of a device that runs work (with or without events), or
 * NULL with an error naming op and the device. */
static const fl_backend *device_backend(const char *op, fl_device d) {
    char name[32];
    fl_device_format(d, name, sizeof name);
    const fl_backend *be = fl_backend_of(d);
    fl_device_kind k = fl_device_kind_of(d);
    if (!be && k == FL_DEVICE_META)
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "%s: %s runs no work (events and synchronize need cpu or cuda)", op,
                            name);
    if (!be || fl_device_index(d) >= fl_device_count(k)) {
        char kind[32];
        snprintf(kind, sizeof kind, "%s", name);
        kind[strcspn(kind, ":")] = '\0';
        return FL_FAIL_NULL(FL_ERR_DEVICE, "%s: %s does not exist (%d %s device(s): %s)", op,
                            name, fl_device_count(k), kind, fl_device_status(k));
    }
    return be;
}

fl_event *fl_event_new(fl_device device, bool timing) {
    const fl_backend *be = device_backend("event", device);
    if (!be) return NULL;
    fl_event *e = calloc(1, sizeof *e);
    if (!e) return FL_FAIL_NULL(FL_ERR_OOM, "event: out of memory");
    e->device = device;
    e->timing = timing;
    if (be->user_event_new) {
        e->backend = be;
        if (!(e->handle = be->user_event_new(fl_device_index(device), timing))) {
            free(e);
            return NULL;
        }
    }
    return e;
}

void fl_event_free(fl_event *e) {
    if (!e) return;
    if (e->handle) e->backend->user_event_free(e->handle);
    free(e);
}

int fl_event_record(fl_event *e) {
    if (!e) return fl_fail(FL_ERR_ARG, "event record: NULL event");
    if (e->handle && e->backend->user_event_record(fl_device_index(e->device), e->handle))
        return fl_last_status();
    e->host_ms = host_ms();
    e->recorded = true;
    return FL_OK;
}

int fl_event_query(fl_event *e, bool *done) {
    if (!e || !done) return fl_fail(FL_ERR_ARG, "event query: NULL argument");
    *done = true;
    if (e->handle && e->recorded)
        return e->backend->user_event_query(fl_device_index(e->device), e->handle, done);
    return FL_OK;
}

int fl_event_synchronize(fl_event *e) {
    if (!e) return fl_fail(FL_ERR_ARG, "event synchronize: NULL event");
    if (e->handle && e->recorded)
        return e->backend->user_event_synchronize(fl_device_index(e->device), e->handle);
    return FL_OK;
}

int fl_event_elapsed_ms(const fl_event *start, const fl_event *end, double *ms) {
    if (!start || !end || !ms) return fl_fail(FL_ERR_ARG, "elapsed time: NULL argument");
    if (!start->timing || !end->timing)
        return fl_fail(FL_ERR_ARG, "elapsed time: both events must be made with timing on");
    if (start->device != end->device) {
        char a[32], b[32];
        fl_device_format(start->device, a, sizeof a);
        fl_device_format(end->device, b, sizeof b);
        return fl_fail(FL_ERR_ARG, "elapsed time: the events are on %s and %s (one device needed)", a, b);
    }
    if (!start->recorded || !end->recorded)
        return fl_fail(FL_ERR_ARG, "elapsed time: the %s event was never recorded",
                       start->recorded ? "end" : "start");
    if (start->handle) {
        const fl_backend *be = end->backend;
        int index = fl_device_index(end->device);
        bool done = false;
        if (be->user_event_query(index, end->handle, &done)) return fl_last_status();
        if (done && be->user_event_query(index, start->handle, &done)) return fl_last_status();
        if (!done)
            return fl_fail(FL_ERR_ARG, "elapsed time: the events have not been reached yet "
                                       "(synchronize the end event first)");
        return be->user_event_elapsed(index, start->handle, end->handle, ms);
    }
    *ms = end->host_ms - start->host_ms;
    return FL_OK;
}

int fl_device_synchronize(fl_device device) {
    const fl_backend *be = device_backend("synchronize", device);
    if (!be) return fl_last_status();
    return be->synchronize ? be->synchronize(fl_device_index(device)) : FL_OK;
}
