/*
 * memory.h: the per-device memory statistics every allocation is counted
 * in, and the limits they enforce (core/tensor/memory.c).
 */
#ifndef FL_MEMORY_H
#define FL_MEMORY_H

#include "fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Account for an allocation of nbytes on device; fails (FL_ERR_OOM, with a
 * message naming the device, the request and the statistics) when a limit
 * would be exceeded. Call fl_memory_note_free when it is returned. */
int fl_memory_note_alloc(fl_device device, int64_t nbytes);
void fl_memory_note_free(fl_device device, int64_t nbytes);
void fl_memory_note_failure(fl_device device);
/* Raise the device's peak as if nbytes more were in use for a moment
 * (scratch that meta tensors stand for, fl_meta_set_f32_gemm). */
void fl_memory_note_transient(fl_device device, int64_t nbytes);

#ifdef __cplusplus
}
#endif

#endif /* FL_MEMORY_H */
