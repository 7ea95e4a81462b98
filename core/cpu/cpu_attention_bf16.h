/*
 * cpu_attention_bf16.h: the CPU's bf16 attention kernels, on AMX tiles or
 * AVX512-BF16 dot products. cpu_attention_native.c decides whether and on
 * which they run (the CPU, the kernel's tile permission, the user's
 * choice) and which calls they take; cpu_attention_bf16.c holds them,
 * built for AMX and AVX-512 and entered only after that decision.
 */
#ifndef FL_CPU_ATTENTION_BF16_H
#define FL_CPU_ATTENTION_BF16_H

#include "cpu_fused_math.h"

/* The kernels (cpu_attention_bf16.c): every tensor of a bf16, the lse
 * f32, as fused.h's attention_native entries, on calls
 * cpu_attention_native.c accepted; products on AMX tiles when `tiles`,
 * else on AVX512-BF16 dot products. */
int fl_bf16_attention(const fl_attention_args *a, bool tiles);
int fl_bf16_attention_backward(const fl_attention_args *a, bool tiles);

#endif /* FL_CPU_ATTENTION_BF16_H */
