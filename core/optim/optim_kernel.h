/*
 * optim_kernel.h: what the fused optimizer updates of core/optim/ share.
 *
 * An update reads a parameter, its gradient and a few state tensors of the
 * same number of elements and writes some of them, element by element. The
 * driver here checks the operands (naming the optimizer and the operand at
 * fault), cuts [0, numel) into chunks spread over OpenMP threads, and hands
 * each optimizer's inner loop plain f32 arrays whatever the stored dtypes:
 * f32 operands are used in place, bf16/f16 ones are converted into scratch
 * arrays and converted back (rounded to nearest even) when written. So every
 * optimizer does its math in f32 and rounds once per stored value.
 */
#ifndef FL_OPTIM_KERNEL_H
#define FL_OPTIM_KERNEL_H

#include "cpu_isa_dispatch.h"
#include "backend.h"

#include <math.h>
#include <string.h>

/* Elements per chunk of the driver: the most an inner loop is given. */
enum { FL_OPTIM_CHUNK = 1024 };

/* Inner loops are `omp simd` loops written once with loop-invariant flags
 * (weight decay on, first step, nesterov) and instantiated per flag value
 * through this forced inlining: GCC will not if-convert a conditional
 * floating-point operation under the default -ftrapping-math, so a flag
 * tested inside the loop would keep it scalar. */
#define FL_OPTIM_INLINE static inline __attribute__((always_inline))

/* Inner loops are built for AVX-512 and AVX2 besides the baseline and
 * run at the level in force (FL_ISA_CLONES on each update's loop
 * function, [Note: ISA clones]). The updates are bound by their divisions
 * and square roots, not by memory: 16 lanes instead of SSE's 4 (AdamW
 * over 124M parameters, 2 threads: 112 -> 94 ms).
 * The bits are the same: IEEE division and square root are correctly
 * rounded at any width, and C11 mode keeps GCC from contracting into FMAs
 * (-ffp-contract=off is the ISO default). */

/* The inner loop of an update over n elements: x[k] holds operand k's
 * values as f32 (NULL for an absent operand); the loop overwrites the
 * arrays of the operands it writes. `dtypes[k]` are the stored dtypes, for
 * loops that must know how a value will be rounded (Kahan summation). */
typedef void (*fl_optim_loop)(const void *ctx, int64_t n, float *const *x,
                              const fl_dtype *dtypes);

/* Check the operands and run the update over all elements: `loop` on the
 * CPU, the CUDA kernel of `kind` on a GPU (ctx is kind's struct of
 * core/backend/backend.h either way). Meta and fake operands are checked for shape
 * and dtype and then left alone (there are no values to update), so a model
 * planned on meta can step its optimizer. Returns FL_OK or the status of
 * the failure, with the error naming `op`. */
int fl_optim_run(const char *op, int n, const fl_optim_operand *ops, fl_optim_loop loop,
                 fl_optim_kind kind, const void *ctx);

/* The same update of `count` operand sets with the same constants (one
 * optimizer step of many tensors): set i is ops[i*n ... i*n + n-1], each
 * checked as fl_optim_run checks one (errors name "op: tensor i"), all on
 * one device, no operand of one set sharing bytes with another's. Every set
 * is checked before any is updated. The bytes of all sets are counted once
 * for the call ([Note: bytes moved]: it is one kernel, or a few). The
 * device's update_multi runs them (one launch per batch of sets on CUDA),
 * or its update set by set; the cpu loops over the sets. The result is
 * that of fl_optim_run on each set, bit for bit. */
int fl_optim_run_multi(const char *op, int count, int n, const fl_optim_operand *ops,
                       fl_optim_loop loop, fl_optim_kind kind, const void *ctx);

/* Check the hyper-parameters every optimizer has. */
int fl_optim_check_lr(const char *op, double lr, double weight_decay);
/* Check fl_adamw_options (AdamW and AnyPrecisionAdamW share them). */
int fl_adamw_check_options(const char *op, const fl_adamw_options *o);

/* x as it will read back after being stored as `dtype`: the rounding of
 * fl_convert (nearest even; NaN stays NaN), inlined for the inner loops. */
static inline float fl_optim_round(fl_dtype dtype, float x) {
    if (dtype == FL_BF16) {
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) return x; /* NaN */
        u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
        memcpy(&x, &u, sizeof x);
        return x;
    }
    if (dtype == FL_F16) return fl_f16_to_f32(fl_f32_to_f16(x));
    return x;
}

/* x[i] = sqrt(x[i]) for n elements, in a pass of its own. The library is
 * built with -fno-math-errno (premake5.lua), so the loop vectorises at the
 * width of the variant it is inlined into (FL_ISA_CLONES). IEEE square
 * roots are correctly rounded: any width gives the same bits. */
static inline void fl_optim_sqrt_n(float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) x[i] = sqrtf(x[i]);
}

#endif /* FL_OPTIM_KERNEL_H */
