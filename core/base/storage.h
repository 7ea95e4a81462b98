/*
 * storage.h: the memory behind tensors (core/tensor/storage.c), tensor
 * headers and views made without autograd (core/tensor/tensor.c), and the
 * guarded reads of mapped files that may shrink (core/base/fault.c).
 */
#ifndef FL_STORAGE_H
#define FL_STORAGE_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fl_storage {
    void *data;
    int64_t nbytes;
    int32_t refcount;
    fl_device device;
    /* For storage the core did not allocate (e.g. mmap of a file): called
     * instead of the device allocator's free when the last reference goes. */
    void (*release)(void *ctx, void *data, int64_t nbytes);
    void *release_ctx;
    /* Unique for the life of the process (never reused like an address):
     * allocator and virtual storage get one (fl_storage_new,
     * fl_storage_virtual), other storage 0.
     * Activation offload keys its deduplication by it. */
    uint64_t id;
    /* Viewed by a leaf that requires grad (a parameter, or a sharded
     * unit's segment of its shard): set by fl_requires_grad_, never
     * cleared. Activation offload never moves such memory. */
    bool holds_params;
    /* For storage that maps a file: its path (owned by release_ctx), and
     * check(release_ctx): FL_OK while the file still holds the mapped
     * bytes (its last page reads), else an error naming it. Every op checks its inputs with it
     * (fl_check_tensor), and copies out of the mapping are guarded besides
     * (fault.c): see [Note: mapped files that shrink] in tensor.c. */
    const char *file;
    int (*check)(void *ctx);
};

/* Reading mapped files that may shrink (core/base/fault.c). Register a
 * mapping so a SIGBUS inside it ends the process with a message naming the
 * file; fl_guarded_memcpy copies with a SIGBUS guard on this thread and
 * returns -1 instead of faulting. */
void fl_fault_register(const void *begin, size_t size, const char *path);
void fl_fault_unregister(const void *begin);
int fl_guarded_memcpy(void *dst, const void *src, size_t n);

fl_storage *fl_storage_new(fl_device device, int64_t nbytes);
/* A function fl_storage_new calls after each allocation it makes (NULL:
 * none): how the distributed layer above progresses collectives between
 * kernels ([Note: progress from compute], core/comm/dist.c) without this
 * layer knowing of it. */
void fl_set_allocation_hook(void (*hook)(void));
/* Storage that holds nothing and counts nbytes in the meta device's memory
 * statistics while it lives ([Note: virtual storage], storage.c). */
fl_storage *fl_storage_virtual(int64_t nbytes);
/* A meta tensor that only carries a shape and dtype for a backward (what
 * an op saves of an input it needs no values of): it stands for no bytes,
 * so it has no virtual storage and the engine keeps it ([Note: virtual
 * storage]). */
fl_tensor *fl_shape_carrier(int ndim, const int64_t *shape, fl_dtype dtype);
void fl_storage_retain(fl_storage *s);
void fl_storage_release(fl_storage *s);

/* A fresh tensor header (refcount 1) with the given geometry and no data;
 * storage is attached by the caller. */
fl_tensor *fl_tensor_header(int ndim, const int64_t *shape, fl_dtype dtype,
                            fl_device device);
/* A new view header sharing t's storage with the given geometry. */
fl_tensor *fl_tensor_view_of(const fl_tensor *t, int ndim,
                             const int64_t *shape, const int64_t *stride,
                             int64_t offset);
/* fl_clone, fl_contiguous and fl_to (non_blocking: fl_to_non_blocking)
 * without autograd: core/tensor's copies, which core/ops/copy.c records. */
fl_tensor *fl_tensor_clone(const fl_tensor *t);
fl_tensor *fl_tensor_contiguous(const fl_tensor *t);
fl_tensor *fl_tensor_to(const fl_tensor *t, fl_dtype dtype, fl_device device, bool non_blocking);
/* Fail unless t is non-NULL and, if need_data, has host-usable storage. */
int fl_check_tensor(const char *op, const fl_tensor *t, bool need_data);

#ifdef __cplusplus
}
#endif

#endif /* FL_STORAGE_H */
