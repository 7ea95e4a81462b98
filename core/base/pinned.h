/*
 * pinned.h: pinned host memory and the asynchronous copies through it
 * (core/tensor/pinned.c).
 */
#ifndef FL_PINNED_H
#define FL_PINNED_H

#include "storage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether s came from the pinned host pool (a cpu storage). */
bool fl_storage_is_pinned(const fl_storage *s);
/* Pinned storage of nbytes on the cpu device; NULL with an error naming
 * `op` without a CUDA device or when out of memory. */
fl_storage *fl_pinned_storage_new(const char *op, int64_t nbytes);
/* Queue a copy of nbytes between pinned host memory (inside the storage
 * `pinned`) and memory of `device` on its compute stream, and record the
 * use so the pinned block is not reused before the copy ran. */
int fl_pinned_copy_async(fl_device device, void *dst, const void *src, int64_t nbytes,
                         bool to_host, fl_storage *pinned);
/* The same with the copy queued on `stream` of the device, which must be
 * its compute stream (0) or its copy stream (FL_STREAM_COPY); the pinned
 * block records that stream as a user. FL_OK or the error set. */
int fl_pinned_copy_async_on(fl_device device, uint64_t stream, void *dst, const void *src,
                            int64_t nbytes, bool to_host, fl_storage *pinned);

#ifdef __cplusplus
}
#endif

#endif /* FL_PINNED_H */
