/*
 * cpu_rows_avx512.h: the hand-written AVX-512 kernels of
 * cpu_rows_avx512.c (fused row loops, also 8 lanes wide for the avx2
 * level; RoPE, RMSNorm, silu * up, bf16 rows of cross-entropy), attention's f32 block products
 * (cpu_block_gemm.c) and fl_cpu_avx512(), the run-time check every caller
 * makes first (the level in force, cpu_isa.c): the binary runs on any
 * x86-64.
 */
#ifndef FL_CPU_ROWS_AVX512_H
#define FL_CPU_ROWS_AVX512_H

#include "error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_ROWS_AVX512_BUILD 1
/* Whether the AVX-512 kernels may run: the level in force ([Note: CPU ISA
 * levels], cpu_isa.c) is avx512 or higher. */
static inline bool fl_cpu_avx512(void) { return fl_cpu_isa_level() >= FL_CPU_ISA_AVX512; }
/* The row loops of cpu_fused_rows.h (max, exp-and-sum, exp-affine) on
 * dense f32 rows, and on dense rows of bf16 (bits; cross-entropy's
 * logits), results as on the row converted to f32 first: the exp-sum
 * only sums, and the exp-affine one stores bf16 (rounded as fl_convert
 * rounds) after subtracting `minus` from element `at` (cross-entropy's
 * target; at < 0: none). Written once over the vector width
 * (cpu_rows_gen.h): 16 lanes from the avx512 level, 8 at avx2. */
typedef struct fl_row_loops {
    float (*max)(const float *x, int64_t n);
    float (*exp)(float *dst, const float *x, int64_t n, float shift);
    void (*exp_affine)(float *dst, const float *x, int64_t n, float shift, float a, float b,
                       const float *c);
    float (*max_bf16)(const uint16_t *x, int64_t n);
    float (*exp_sum_bf16)(const uint16_t *x, int64_t n, float shift);
    void (*exp_affine_bf16)(uint16_t *dst, const uint16_t *x, int64_t n, float shift, float a,
                            float b, int64_t at, float minus);
} fl_row_loops;
/* Those of the level in force, or NULL below avx2 (the C loops run). */
const fl_row_loops *fl_cpu_row_loops(void);
/* silu(a) * b and its gradients on dense bf16 (bits), the arithmetic of
 * cpu_unary.c's vector path with glibc's vector expf: its bits in the
 * release build. ga or gb may be NULL. */
void fl_avx512_silu_mul_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n);
void fl_avx512_silu_mul_backward_bf16(uint16_t *ga, uint16_t *gb, const uint16_t *g,
                                      const uint16_t *a, const uint16_t *b, int64_t n);
/* out = x op y on dense bf16 (bits), in f32 and rounded once as
 * fl_convert rounds: cpu_binary.c's results. op: FL_ADD, FL_SUB, FL_MUL,
 * FL_DIV or FL_AXPY (x + alpha y). */
void fl_avx512_binary_bf16(int op, double alpha, uint16_t *o, const uint16_t *x, const uint16_t *y,
                           int64_t n);
/* Rotary embedding without positions on f32/bf16 x (dense last dim, D a
 * multiple of 32) and f32/bf16 tables (dense rows), out dense in x's
 * dtype: cpu_rotary.c's common case, bit for bit its generic kernel. */
void fl_avx512_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos,
                      const fl_tensor *sin, bool inverse);
/* One RMSNorm row of n (a multiple of 16) f32/bf16 elements, the
 * arithmetic of cpu_norm_gen.h's (only its double sums may add in another
 * order); w f32 or NULL. Forward returns 1/rms; backward adds the row's
 * terms of dw to dw_sum (n doubles) unless NULL, and skips dx if NULL. */
float fl_avx512_rms_norm_row(void *y, bool ybf, const void *x, bool xbf, const float *w, int64_t n,
                             double eps, bool round16);
void fl_avx512_rms_norm_backward_row(void *dx, bool dxbf, const void *x, bool xbf, const void *g,
                                     bool gbf, const float *w, float inv, int64_t n,
                                     double *dw_sum);
/* One LayerNorm row, the same way: w and b f32 or NULL; forward returns
 * 1/std and stores the mean in *mean; backward adds the row's terms of dw
 * and db to dw_sum and db_sum unless NULL, and skips dx if NULL. */
float fl_avx512_layer_norm_row(void *y, bool ybf, const void *x, bool xbf, const float *w,
                               const float *b, int64_t n, double eps, float *mean);
void fl_avx512_layer_norm_backward_row(void *dx, bool dxbf, const void *x, bool xbf, const void *g,
                                       bool gbf, const float *w, float mean, float inv, int64_t n,
                                       double *dw_sum, double *db_sum);
#else
#define FL_ROWS_AVX512_BUILD 0
static inline bool fl_cpu_avx512(void) { return false; }
typedef struct fl_row_loops fl_row_loops;
static inline const fl_row_loops *fl_cpu_row_loops(void) { return NULL; }
#endif

/* C = alpha op(A) op(B) + beta C in f32 on one thread, fl_cpu_sgemm's
 * arguments, for attention's block products (cpu_block_gemm.c, [Note:
 * attention's f32 block products]); pack holds k * n floats when
 * trans_b. AVX-512 from the avx512 level, AVX2 + FMA at avx2; false, with
 * nothing done, below avx2: the caller runs BLAS. */
bool fl_cpu_block_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc, float *pack);

#endif /* FL_CPU_ROWS_AVX512_H */
