/*
 * cpu_kernels.h: the CPU's kernel table of each op family, defined beside
 * its kernels (cpu_binary.c, cpu_elementwise.c, cpu_matmul.c, cpu_fused.c)
 * and gathered into fl_cpu_backend by cpu_backend.c. The tables' contract
 * is core/backend/backend.h.
 */
#ifndef FL_CPU_KERNELS_H
#define FL_CPU_KERNELS_H

#include "backend.h"

extern const fl_binary_kernels fl_cpu_binary_kernels;
extern const fl_elementwise_kernels fl_cpu_elementwise_kernels;
extern const fl_linear_kernels fl_cpu_linear_kernels;
extern const fl_fused_kernels fl_cpu_fused_kernels;

#endif /* FL_CPU_KERNELS_H */
