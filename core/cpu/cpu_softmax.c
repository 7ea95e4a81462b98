/*
 * cpu_softmax.c: the CPU kernels of softmax and log_softmax, forward and
 * backward (the op: core/ops/softmax.c; on CUDA: core/cuda/cuda_softmax.cu),
 * instantiated from cpu_softmax_gen.h for f32 math (f32, f16, bf16 tensors)
 * and f64 math (f64 tensors) by cpu_fused_instances.h. Each entry picks the
 * instantiation from the dtype of the statistics or output tensor the op
 * created in the compute dtype; cpu_fused.c puts them in the kernel table.
 */
#define FL_CPU_KERNELS "cpu_softmax_gen.h"
#include "cpu_fused_instances.h"

int fl_cpu_softmax(fl_tensor *out, const fl_tensor *x, int dim, bool log) {
    return fl_cpu_wide(out) ? softmax_f64(out, x, dim, log) : softmax_f32(out, x, dim, log);
}

int fl_cpu_softmax_backward(fl_tensor *dx, const fl_tensor *g, const fl_tensor *y, int dim,
                            bool log) {
    return fl_cpu_wide(dx) ? softmax_backward_f64(dx, g, y, dim, log)
                           : softmax_backward_f32(dx, g, y, dim, log);
}
