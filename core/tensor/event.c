/*
 * event.c: the public events and device synchronisation (fsdp.h: fl_event),
 * one interface over the devices: CUDA events on cuda (cuda_event.cu), the
 * host clock on the CPU, where work has run when its call returns. Benchmarks
 * and training loops time and wait through these without knowing the
 * device.
 */
#include "internal.h"
#ifdef FL_HAVE_CUDA
#include "../cuda/cuda_backend.h"
#endif

#include <time.h>

struct fl_event {
    fl_device device;
    bool timing;
    bool recorded;
    double host_ms;  /* CPU: when recorded */
    void *cuda;      /* cuda: the cudaEvent_t */
};

#ifdef FL_HAVE_CUDA
static bool on_cuda(fl_device d) { return fl_device_kind_of(d) == FL_DEVICE_CUDA; }
#endif

static double host_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Devices that run work; NULL-safe message for the others. */
static int check_device(const char *op, fl_device d) {
    char name[32];
    fl_device_format(d, name, sizeof name);
    fl_device_kind k = fl_device_kind_of(d);
    if (k == FL_DEVICE_CPU) return FL_OK;
#ifdef FL_HAVE_CUDA
    if (k == FL_DEVICE_CUDA) {
        if (fl_device_index(d) < fl_cuda_device_count()) return FL_OK;
        return fl_fail(FL_ERR_DEVICE, "%s: %s does not exist (%d cuda device(s): %s)", op, name,
                       fl_cuda_device_count(), fl_cuda_status());
    }
#endif
    return fl_fail(FL_ERR_ARG, "%s: %s runs no work (events and synchronize need cpu or cuda)", op,
                   name);
}

fl_event *fl_event_new(fl_device device, bool timing) {
    if (check_device("event", device)) return NULL;
    fl_event *e = calloc(1, sizeof *e);
    if (!e) return FL_FAIL_NULL(FL_ERR_OOM, "event: out of memory");
    e->device = device;
    e->timing = timing;
#ifdef FL_HAVE_CUDA
    if (on_cuda(device) && !(e->cuda = fl_cuda_user_event_new(fl_device_index(device), timing))) {
        free(e);
        return NULL;
    }
#endif
    return e;
}

void fl_event_free(fl_event *e) {
    if (!e) return;
#ifdef FL_HAVE_CUDA
    if (e->cuda) fl_cuda_user_event_free(e->cuda);
#endif
    free(e);
}

int fl_event_record(fl_event *e) {
    if (!e) return fl_fail(FL_ERR_ARG, "event record: NULL event");
#ifdef FL_HAVE_CUDA
    if (e->cuda && fl_cuda_user_event_record(fl_device_index(e->device), e->cuda))
        return fl_last_status();
#endif
    e->host_ms = host_ms();
    e->recorded = true;
    return FL_OK;
}

int fl_event_query(fl_event *e, bool *done) {
    if (!e || !done) return fl_fail(FL_ERR_ARG, "event query: NULL argument");
    *done = true;
#ifdef FL_HAVE_CUDA
    if (e->cuda && e->recorded) return fl_cuda_user_event_query(fl_device_index(e->device), e->cuda, done);
#endif
    return FL_OK;
}

int fl_event_synchronize(fl_event *e) {
    if (!e) return fl_fail(FL_ERR_ARG, "event synchronize: NULL event");
#ifdef FL_HAVE_CUDA
    if (e->cuda && e->recorded) return fl_cuda_user_event_synchronize(fl_device_index(e->device), e->cuda);
#endif
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
#ifdef FL_HAVE_CUDA
    if (start->cuda) {
        bool done = false;
        if (fl_cuda_user_event_query(fl_device_index(end->device), end->cuda, &done)) return fl_last_status();
        if (done && fl_cuda_user_event_query(fl_device_index(end->device), start->cuda, &done))
            return fl_last_status();
        if (!done)
            return fl_fail(FL_ERR_ARG, "elapsed time: the events have not been reached yet "
                                       "(synchronize the end event first)");
        return fl_cuda_user_event_elapsed(fl_device_index(end->device), start->cuda, end->cuda, ms);
    }
#endif
    *ms = end->host_ms - start->host_ms;
    return FL_OK;
}

int fl_device_synchronize(fl_device device) {
    if (check_device("synchronize", device)) return fl_last_status();
#ifdef FL_HAVE_CUDA
    if (on_cuda(device)) return fl_cuda_synchronize(fl_device_index(device));
#endif
    return FL_OK;
}
