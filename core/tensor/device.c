/*
 * device.c: device identifiers ("cpu", "meta", "cuda:1"); which backend
 * serves a device is backend.c's business.
 *
 * A device is one int (kind | index << 8) so it crosses the FFI as a plain
 * number that LuaJIT can compile calls with (structs by value it cannot).
 */
#include "error.h"

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
