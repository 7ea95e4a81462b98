/*
 * sim_internal.h: what the parts of cudasim tell each other: the simulated
 * runtime (sim_runtime.cc, which owns streams and events), the kernel
 * scheduler (sim_fiber.cc), the launch wrapper that rewritten kernel
 * launches call (cudasim.h) and the simulated libraries (C: sim_nccl.c
 * queues its collectives on the runtime's streams, sim_cublas.c and
 * sim_cudnn.c keep stream 0's ordering).
 */
#ifndef FL_SIM_INTERNAL_H
#define FL_SIM_INTERNAL_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a launch is in the source, for messages. The strings are the
 * rewritten launch's literals, so a queued launch can keep them. */
struct fl_sim_site {
    const char *file;
    int line;
    const char *kernel;
};

/* Record err as the runtime's sticky error and print why on stderr:
 * a simulated kernel fault behaves as a real one (the launch and every
 * later call report it) but also says what went wrong. */
void fl_sim_fault(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The launch error that is not sticky (a bad configuration), as
 * cudaGetLastError reports it once. */
void fl_sim_launch_error(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Non-zero once a fault happened: later launches do not run. */
int fl_sim_faulted(void);

/* The dynamic shared memory limit set for kernel by cudaFuncSetAttribute
 * (48 KiB by default, as on the GPU). */
size_t fl_sim_smem_limit(const void *kernel);

/* A kernel launch as rewritten by rewrite.lua/cudasim.h: body(closure)
 * runs once per thread of the grid, now (stream 0) or when the stream is
 * forced (a stream from cudaStreamCreate*); destroy(closure) is called
 * once afterwards, or at once if the launch is refused. The closure holds
 * the arguments copied at launch, as the GPU copies them. */
void fl_sim_launch_kernel(struct fl_sim_site site, const void *kernel, dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, void (*body)(void *), void *closure, void (*destroy)(void *));

/* The kernel launches asked for (every call of fl_sim_launch_kernel, run
 * or refused) since the start or the last reset; reset sets it back to 0
 * after reading. The CUDA backend reports it beside its own count
 * (fl_kernel_launches) so a test can compare them. */
int64_t fl_sim_launch_count(bool reset);

/* The scheduler's two halves (sim_fiber.cc). fl_sim_launch_valid checks a
 * configuration when it is launched (a bad one is a non-sticky launch
 * error, reported by the launch, as on the GPU); fl_sim_run runs a valid
 * launch to the end, or not at all once the device has faulted. */
int fl_sim_launch_valid(struct fl_sim_site site, const void *kernel, dim3 grid, dim3 block, size_t smem);
void fl_sim_run(struct fl_sim_site site, dim3 grid, dim3 block, size_t smem, void (*body)(void *), void *closure);

/* Host work in stream order, for the simulated libraries (sim_nccl's
 * collectives). If stream s runs its work when issued (stream 0,
 * cudaStreamLegacy, cudaStreamPerThread, or every stream under
 * FSDP_CUDASIM_STREAMS=eager), this first runs what stream-0 work must
 * wait for (the queues of the blocking streams), queues nothing and
 * returns 0: the caller does the work now and keeps arg. If s is a
 * deferred stream, run(arg) is queued and 1 returned; it runs when the
 * stream is forced, with the runtime's lock held; if the device has
 * faulted by then it is not run and drop(arg) is called instead. -1: s is
 * not a stream. */
int fl_sim_stream_enqueue(cudaStream_t s, void (*run)(void *), void (*drop)(void *), void *arg);

/* For the simulated libraries that do their work when called (sim_cublas,
 * sim_cudnn): 0 when s runs work at once, after running what stream-0 work
 * waits for if s is stream 0 (as fl_sim_stream_enqueue); 1 when s is a
 * deferred stream, whose order such a library cannot keep, so it refuses
 * the call rather than run it early; -1 when s is not a stream. */
int fl_sim_stream_now(cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* FL_SIM_INTERNAL_H */
