/*
 * sim_internal.h: what the simulated runtime (sim_runtime.cc) and the
 * kernel scheduler (sim_fiber.cc) tell each other.
 */
#ifndef FL_SIM_INTERNAL_H
#define FL_SIM_INTERNAL_H

#include <cuda_runtime.h>

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

#endif /* FL_SIM_INTERNAL_H */
