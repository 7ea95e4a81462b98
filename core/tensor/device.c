/*
 * device.c: device identifiers ("cpu", "meta", "cuda:1") and the table that
 * maps a device to its backend vtable, through which every kernel is reached.
 *
 * A device is one int (kind | index << 8) so it crosses the FFI as a plain
 * number that LuaJIT can compile calls with (structs by value it cannot).
 */
#include "internal.h"

#include <string.h>

fl_device fl_device_make(fl_device_kind kind, int index) {
    return (fl_device)((int32_t)kind | (int32_t)index << 8);
}

fl_device_kind fl_device_kind_of(fl_device device) {
    return (fl_device_kind)(device & 0xff);
}

int fl_device_index(fl_device device) { return (int)(device >> 8); }

static const char *kind_name(fl_device_kind kind) {
    switch (kind) {
    case FL_DEVICE_META: return "meta";
    case FL_DEVICE_CPU: return "cpu";
    case FL_DEVICE_CUDA: return "cuda";
    default: return NULL;
    }
}

int fl_device_parse(const char *name, fl_device *out) {
    if (!name) return fl_fail(FL_ERR_ARG, "device: name is NULL");
    for (int k = 0; k < FL_DEVICE_KIND_COUNT; k++) {
        const char *kn = kind_name((fl_device_kind)k);
        size_t len = strlen(kn);
        if (strncmp(name, kn, len) != 0) continue;
        const char *rest = name + len;
        if (*rest == '\0') {
            *out = fl_device_make((fl_device_kind)k, 0);
            return FL_OK;
        }
        if (*rest != ':' || k == FL_DEVICE_META) break;
        char *end = NULL;
        long index = strtol(rest + 1, &end, 10);
        if (end == rest + 1 || *end != '\0' || index < 0 || index > FL_MAX_DEVICE_INDEX)
            break;
        if (k == FL_DEVICE_CPU && index != 0)
            return fl_fail(FL_ERR_ARG, "device '%s': there is only one cpu device (cpu:0)", name);
        *out = fl_device_make((fl_device_kind)k, (int)index);
        return FL_OK;
    }
    return fl_fail(FL_ERR_ARG,
                   "unknown device '%s' (expected cpu, meta, cuda or cuda:N)", name);
}

int fl_device_format(fl_device device, char *buf, size_t size) {
    const char *kn = kind_name(fl_device_kind_of(device));
    int index = fl_device_index(device);
    if (!kn || index < 0 || index > FL_MAX_DEVICE_INDEX)
        return fl_fail(FL_ERR_ARG, "invalid device id %d", (int)device);
    if (fl_device_kind_of(device) == FL_DEVICE_CUDA)
        snprintf(buf, size, "%s:%d", kn, index);
    else
        snprintf(buf, size, "%s", kn);
    return FL_OK;
}

const fl_backend *fl_backend_of(fl_device device) {
    switch (fl_device_kind_of(device)) {
    case FL_DEVICE_CPU: return &fl_cpu_backend;
#ifdef FL_HAVE_CUDA
    case FL_DEVICE_CUDA: return &fl_cuda_backend;
#endif
    default: return NULL;
    }
}

#ifndef FL_HAVE_CUDA
/* Without the CUDA backend there are no CUDA devices; the answers below let
 * callers ask without knowing how the core was built. */
bool fl_cuda_built(void) { return false; }
bool fl_cuda_simulated(void) { return false; }
int fl_cuda_device_count(void) { return 0; }
const char *fl_cuda_status(void) { return "this build has no CUDA backend (nvcc was not found)"; }
void fl_cuda_attention_paths(int64_t counts[4]) {
    for (int i = 0; i < 4; i++) counts[i] = 0;
}
#endif
