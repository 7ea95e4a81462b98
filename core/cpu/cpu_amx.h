/*
 * cpu_amx.h: the CPU's bf16 attention on AMX tiles. cpu_amx.c decides
 * whether it runs (the CPU, the kernel's permission, the user's choice)
 * and which calls it covers; cpu_attention_amx.c holds the kernels, built
 * for AMX and AVX-512 and entered only after cpu_amx.c said yes.
 */
#ifndef FL_CPU_AMX_H
#define FL_CPU_AMX_H

#include "cpu_fused_math.h"

/* The kernels (cpu_attention_amx.c): every tensor of a bf16, the lse
 * f32, as fused.h's attention_native entries, on calls fl_cpu_amx_covers
 * accepted. */
int fl_amx_attention(const fl_attention_args *a);
int fl_amx_attention_backward(const fl_attention_args *a);

#endif /* FL_CPU_AMX_H */
