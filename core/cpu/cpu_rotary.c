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

static bool f32_or_bf16(fl_dtype dt) { return dt == FL_F32 || dt == FL_BF16; }

/* The common case (a model's q and k, its tables) for fl_avx512_rotary:
 * without a call per row and its conversions, which cost more than the
 * arithmetic of a 64-wide row. */
static bool dense_case(const fl_tensor *out, const fl_tensor *x, const fl_tensor *cos,
                       const fl_tensor *sin, const fl_tensor *positions) {
    int nd = x->ndim;
    return !positions && fl_cpu_avx512() && f32_or_bf16(x->dtype) && out->dtype == x->dtype &&
           f32_or_bf16(cos->dtype) && sin->dtype == cos->dtype && x->shape[nd - 1] % 32 == 0 &&
           x->stride[nd - 1] == 1 && cos->stride[1] == 1 && sin->stride[1] == 1 &&
           fl_tensor_is_contiguous(out);
}

int fl_cpu_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos, const fl_tensor *sin,
                  const fl_tensor *positions, bool inverse) {
#if FL_ROWS_AVX512_BUILD
    if (dense_case(out, x, cos, sin, positions)) {
        fl_avx512_rotary(out, x, cos, sin, inverse);
        return FL_OK;
    }
#endif
    return fl_cpu_wide(out) ? rotary_f64(out, x, cos, sin, positions, inverse)
                            : rotary_f32(out, x, cos, sin, positions, inverse);
}
