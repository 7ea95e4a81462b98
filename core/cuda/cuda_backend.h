/*
 * cuda_backend.h: the C entry points of cuda_runtime.cu, used by the C
 * vtable in cuda_backend.c. Plain C types only.
 */
#ifndef FL_CUDA_BACKEND_H
#define FL_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int fl_cuda_probe(void);                 /* device count, 0 without a GPU */
const char *fl_cuda_probe_status(void);  /* device 0's name or why none */
void *fl_cuda_malloc(int index, int64_t nbytes);
void fl_cuda_free(int index, void *ptr);
int fl_cuda_memcpy(int index, void *dst, const void *src, int64_t nbytes, int to_host);
int fl_cuda_memset(int index, void *dst, int value, int64_t nbytes);
const char *fl_cuda_last_problem(void);  /* text of the last failed call */
/* Events for the caching allocator: recorded on a stream (0: the legacy
 * default stream), queried without blocking, destroyed. NULL/false on
 * failure. */
void *fl_cuda_event_record(int index, uint64_t stream);
int fl_cuda_event_done(void *event);
void fl_cuda_event_destroy(void *event);
/* Free and total memory of the device; 0 on success. */
int fl_cuda_mem_info(int index, int64_t *free_bytes, int64_t *total_bytes);
/* Reserved address ranges (the backend vtable's vm_*): cuda_vm.cu. */
void *fl_cuda_vm_reserve(int index, int64_t nbytes, int64_t *granted);
int fl_cuda_vm_commit(int index, void *base, int64_t nbytes);
void fl_cuda_vm_decommit(int index, void *base, int64_t nbytes);
void fl_cuda_vm_unreserve(int index, void *base, int64_t nbytes);
/* Before the host blocks on a device (a synchronous copy, cudaFree): wait,
 * with the collective timeout, for the NCCL collectives the device was
 * made to wait for, aborting a communicator that never completes one
 * ([Note: ordered collectives] in cuda_nccl.cu). FL_OK, or the error set. */
int fl_cuda_nccl_settle(void);
/* The public events' CUDA side (cuda_event.cu; core/tensor/event.c). */
void *fl_cuda_user_event_new(int index, bool timing);
void fl_cuda_user_event_free(void *ev);
int fl_cuda_user_event_record(int index, void *ev);
int fl_cuda_user_event_query(int index, void *ev, bool *done);
int fl_cuda_user_event_synchronize(int index, void *ev);
int fl_cuda_user_event_elapsed(int index, void *start, void *end, double *ms);
int fl_cuda_synchronize(int index);

#ifdef __cplusplus
}
#endif

/* ---- pinned host memory and asynchronous copies (cuda_host.cu) ---------- */
#ifdef __cplusplus
extern "C" {
#endif
void *fl_cuda_host_alloc(int64_t nbytes);  /* page-locked; NULL on failure */
void fl_cuda_host_free(void *ptr);
/* cudaMemcpyAsync on the compute stream of device `index`; 0 on success. */
int fl_cuda_memcpy_async(int index, void *dst, const void *src, int64_t nbytes, int to_host);
int fl_cuda_event_wait(void *event);       /* cudaEventSynchronize; 0 on success */
const char *fl_cuda_host_problem(void);    /* text of the last failed call above */
#ifdef __cplusplus
}
#endif
/* ---- end of pinned host memory ------------------------------------------- */

#endif /* FL_CUDA_BACKEND_H */
