/*
 * cpu_rotary.c: the CPU kernels of rotary position embedding (RoPE), forward and its inverse (the op: core/ops/rotary.c;
 * the CUDA kernels: core/cuda/cuda_rotary.cu), instantiated from cpu_rotary_gen.h for f32 math
 * (f32, f16, bf16 tensors) and f64 math (f64 tensors). Each entry picks the
 * instantiation from the dtype of the statistics or output tensor the op
 * created in the compute dtype; cpu_fused.c puts them in the kernel table.
 */
/* The build's -O2 vectorises only loops without an epilogue and never
 * if-converts float selects (they could raise FP exceptions, which
 * nothing here reads): these loops are exp/max/sum over rows of arbitrary
 * length, so this file asks for both. */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")

#include "cpu_fused.h"

#include <omp.h>
#include <stdlib.h>

#define R float
#define RT FL_F32
#define FN(name) name##_f32
#define EXP(x) fl_fast_expf(x)
#include "cpu_lanes_gen.h"
#include "cpu_rotary_gen.h"
#undef R
#undef RT
#undef FN
#undef EXP

#define R double
#define RT FL_F64
#define FN(name) name##_f64
#define EXP(x) exp(x)
#include "cpu_lanes_gen.h"
#include "cpu_rotary_gen.h"
#undef R
#undef RT
#undef FN
#undef EXP

int fl_cpu_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos, const fl_tensor *sin,
                  const fl_tensor *positions, bool inverse) {
    return fl_cpu_wide(out) ? rotary_f64(out, x, cos, sin, positions, inverse)
                            : rotary_f32(out, x, cos, sin, positions, inverse);
}
