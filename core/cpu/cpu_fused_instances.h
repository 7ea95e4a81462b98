/*
 * cpu_fused_instances.h: the f32 and f64 instantiations of one file's row
 * kernels. The includer (cpu_norm.c, cpu_softmax.c, cpu_loss.c,
 * cpu_rotary.c) defines FL_CPU_KERNELS as the name of its kernel header
 * (e.g. "cpu_norm_gen.h"), which is included with cpu_lanes_gen.h once for
 * R = float (f32, f16, bf16 tensors) and once for R = double (f64
 * tensors), giving name_f32 and name_f64 of every kernel.
 */
/* The build's -O2 vectorises only loops without an epilogue and never
 * if-converts float selects (they could raise FP exceptions, which
 * nothing here reads): these loops are exp/max/sum over rows of arbitrary
 * length, so the kernel files ask for both. */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")

#include "cpu_fused.h"

#include <omp.h>
#include <stdlib.h>

#define R float
#if FL_ROWS_AVX512_BUILD /* (cpu_rows_avx512.h) */
#define FL_ROWS_F32
#endif
#define RT FL_F32
#define FN(name) name##_f32
#define EXP(x) fl_fast_expf(x)
#include "cpu_lanes_gen.h"
#include FL_CPU_KERNELS
#undef FL_ROWS_F32
#undef R
#undef RT
#undef FN
#undef EXP

#define R double
#define RT FL_F64
#define FN(name) name##_f64
#define EXP(x) exp(x)
#include "cpu_lanes_gen.h"
#include FL_CPU_KERNELS
#undef R
#undef RT
#undef FN
#undef EXP
