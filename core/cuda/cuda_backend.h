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
/* Out of device memory: the bytes of decommitted ranges still waiting for
 * their kernels (unmapped now, after waiting), and of the caching pool's
 * free blocks (returned now). Each returns what it gave back. */
int64_t fl_cuda_vm_release_pending(int index);
int64_t fl_cuda_pool_release_cached(int index);
/* Before the host blocks on a device (a synchronous copy, cudaFree): wait,
 * with the collective timeout, for the NCCL collectives the device was
 * made to wait for, aborting a communicator that never completes one
 * ([Note: ordered collectives] in cuda_nccl.cu). FL_OK, or the error set. */
int fl_cuda_nccl_settle(void);
/* The same before a wait for the whole device (cudaDeviceSynchronize),
 * which also waits for the collectives not waited for yet. */
int fl_cuda_nccl_settle_device(void);
/* For callers that cannot report a failure (cudaFree in the caching pool,
 * teardown): as settle_device, a failure kept for the next reporting call. */
void fl_cuda_nccl_settle_quietly(void);
/* The public events' CUDA side (cuda_event.cu; core/tensor/event.c). */
void *fl_cuda_user_event_new(int index, bool timing);
void fl_cuda_user_event_free(void *ev);
int fl_cuda_user_event_record(int index, void *ev);
int fl_cuda_user_event_query(int index, void *ev, bool *done);
int fl_cuda_user_event_synchronize(int index, void *ev);
int fl_cuda_user_event_elapsed(int index, void *start, void *end, double *ms);
int fl_cuda_synchronize(int index);
/* The backend's kernel launches so far ([Note: kernel launches counted] in
 * cuda_common.cuh), added to by fl_cu_check. */
extern int64_t fl_cuda_launch_count;

#ifdef __cplusplus
}
#endif

/* ---- pinned host memory and asynchronous copies (cuda_host.cu) ---------- */
#ifdef __cplusplus
extern "C" {
#endif
void *fl_cuda_host_alloc(int64_t nbytes);  /* page-locked; NULL on failure */
void fl_cuda_host_free(void *ptr);
const char *fl_cuda_host_problem(void);    /* text of the last failed call above */
#ifdef __cplusplus
}
#endif
/* ---- end of pinned host memory ------------------------------------------- */

/* ---- the copy stream and the pools' stream uses ----------------------------
 * Stream ids here are cudaStream_t values as uint64_t (0: the legacy
 * default stream, where every kernel runs: the compute stream). */
#ifdef __cplusplus
extern "C" {
#endif
/* The non-blocking streams beside the compute stream, one of each kind per
 * device, made on first use: the copy stream and NCCL's communication
 * stream (cuda_nccl.cu). 0 on success. */
enum { FL_CUDA_COPY_STREAM, FL_CUDA_COMM_STREAM, FL_CUDA_SIDE_STREAMS };
int fl_cuda_side_stream(int index, int which, uint64_t *stream);
/* cudaMemcpyAsync on `stream` (0: the compute stream); 0 on success. */
int fl_cuda_memcpy_async_on(int index, uint64_t stream, void *dst, const void *src, int64_t nbytes,
                            int to_host);
/* Later work on `waiter` runs after the work queued on `waited` so far. */
int fl_cuda_stream_wait_stream(int index, uint64_t waiter, uint64_t waited);
/* Later work on `stream` runs after `event` (fl_cuda_event_record's). */
int fl_cuda_stream_wait_event(int index, uint64_t stream, void *event);
/* cuda_backend.c: fl_pool_record_stream on device `index`'s pool: the block
 * at `block` (the start of an allocation of that pool) is also used by
 * `stream`, so once freed it is not handed out again before the work
 * queued there by then has run. false for a block the pool does not know. */
bool fl_cuda_pool_record_stream(int index, void *block, uint64_t stream);
#ifdef __cplusplus
}
#endif
/* ---- end of the copy stream ------------------------------------------------ */

/* ---- what the vtable points at (cuda_backend.c) ------------------------------
 * The kernel tables of the op families (one .cu file each), the
 * optimizers', NCCL's collective library, and the attention path counts. */
#ifdef __cplusplus
extern "C" {
#endif
extern const struct fl_binary_kernels fl_cuda_binary_kernels;           /* cuda_binary.cu */
extern const struct fl_elementwise_kernels fl_cuda_elementwise_kernels; /* cuda_compare.cu */
extern const struct fl_linear_kernels fl_cuda_linear_kernels;           /* cuda_linear.cu */
extern const struct fl_fused_kernels fl_cuda_fused_kernels;             /* cuda_fused.cu */
extern const struct fl_optim_kernels fl_cuda_optim_kernels;             /* cuda_optim.cu */
const struct fl_device_comm_ops *fl_cuda_nccl_ops(void);                /* cuda_nccl.cu */
void fl_cuda_attention_paths(int64_t counts[4]);                        /* cuda_sdpa.cu */
int64_t fl_cuda_library_version(const char *library);                  /* cuda_sdpa.cu */
#ifdef __cplusplus
}
#endif

#endif /* FL_CUDA_BACKEND_H */
