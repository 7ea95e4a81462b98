/*
 * cpu_rotary.c: the CPU kernels of rotary position embedding (RoPE), forward
 * and its inverse (the op: core/ops/rotary.c; on CUDA:
 * core/cuda/cuda_rotary.cu), instantiated from cpu_rotary_gen.h for f32 math
 * (f32, f16, bf16 tensors) and f64 math (f64 tensors) by
 * cpu_fused_instances.h. Each entry picks the instantiation from the dtype
 * of the statistics or output tensor the op created in the compute dtype;
 * cpu_fused.c puts them in the kernel table.
 */
#define FL_CPU_KERNELS "cpu_rotary_gen.h"
#include "cpu_fused_instances.h"

int fl_cpu_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos, const fl_tensor *sin,
                  const fl_tensor *positions, bool inverse) {
    return fl_cpu_wide(out) ? rotary_f64(out, x, cos, sin, positions, inverse)
                            : rotary_f32(out, x, cos, sin, positions, inverse);
}
