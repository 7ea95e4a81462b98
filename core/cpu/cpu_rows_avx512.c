/*
 * cpu_rows_avx512.c: kernels written for AVX-512, which their generic
 * versions call where the CPU has it (fl_cpu_avx512, cpu_rows_avx512.h):
 * the f32 row loops of cpu_fused_rows.h (max, exp-and-sum, exp-affine)
 * and the same on bf16 rows (cross-entropy), RoPE, RMSNorm and LayerNorm
 * rows, and silu(gate) * up. Each keeps its generic version's arithmetic
 * and rounding, so results are the same bits (the specs compare them).
 * The row loops are written once over the vector width (cpu_rows_gen.h)
 * and built here twice, 16 lanes and 8 (AVX2 + FMA, for the avx2 level:
 * fl_cpu_row_loops); the 8-lane ones compute the AVX2 clone's exp bit
 * for bit but sum in their own lanes (cpu_rows_spec checks them against
 * f64).
 *
 * Why by hand rather than GCC's AVX-512 clone of the same C: that clone
 * was kept out after a sharded tiny Llama drifted further from one rank
 * with it (see cpu_fused_math.h; the cause was not found, and GCC reports
 * no alignment peeling for these loops). These loops fix their order of
 * summation themselves: they start at the row's first element whatever its
 * address and take the tail with a mask, so a row's result depends on its
 * values and length only; with them the drift stayed where it was
 * (tests/mpi/fsdp_equivalence.lua, f32: 1.4e-6). 16 lanes also run the exp
 * of softmax, cross-entropy and attention about twice as fast as the AVX2
 * clone's 8.
 */
#include "backend.h"
#include "cpu_fused_math.h"

#if FL_ROWS_AVX512_BUILD

/* Products and sums rounded one by one, as in the baseline C they stand
 * in for (GCC would fuse a multiply and an add of intrinsics into one). */
#pragma GCC optimize("fp-contract=off")

/* Outside the target regions: included first inside one, the intrinsics
 * would take that region's target and refuse to inline into the other. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

/* [Note: masked loads stall the prefetcher]
 * Every loop here takes its tail in part (a mask), but only its tail: on the
 * Zen 5 machine, rows read with masked loads throughout did not stream
 * (the hardware prefetcher did not follow them), and a bf16
 * cross-entropy over 1024 x 32000 logits took 6.9 ms forward and 9.0
 * backward; with plain loads and stores for the full vectors, 4.0 and
 * 4.8, as fast as with software prefetches added. The masked forms
 * below (and the row loops' parts, cpu_rows_gen.h) are taken only where
 * lanes are missing. */

/* ---- the row loops at avx2: 8 lanes (cpu_rows_gen.h) ---------------------------- */

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "cpu_avx2.h"

/* The tail of a row (left < 8 elements): AVX2 masks 32-bit lanes only,
 * so bf16 tails go through a small buffer. */
static inline __m256 avx2_load_part(const float *p, int64_t left, __m256 missing) {
    __m256i k = fl_lanes_below8(left);
    return _mm256_blendv_ps(missing, _mm256_maskload_ps(p, k), _mm256_castsi256_ps(k));
}

static inline __m256 avx2_load_bf16_part(const uint16_t *p, int64_t left) {
    uint16_t t[8] = {0};
    memcpy(t, p, (size_t)left * sizeof *t);
    return fl_load_bf16x8(t);
}

static inline void avx2_store_bf16_part(uint16_t *p, int64_t left, __m256 x) {
    uint16_t t[8];
    fl_store_bf16x8_exact(t, x);
    memcpy(p, t, (size_t)left * sizeof *t);
}

static inline __m256 avx2_sub_lane(__m256 y, int64_t lane, __m256 v) {
    __m256i at = _mm256_cmpeq_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                    _mm256_set1_epi32((int)lane));
    return _mm256_blendv_ps(y, _mm256_sub_ps(y, v), _mm256_castsi256_ps(at));
}

#define W 8
#define VEC __m256
#define FN(name) fl_avx2_##name
#define LOAD(p) _mm256_loadu_ps(p)
#define STORE(p, x) _mm256_storeu_ps(p, x)
#define LOAD_PART(p, left, missing) avx2_load_part(p, left, missing)
#define STORE_PART(p, left, x) _mm256_maskstore_ps(p, fl_lanes_below8(left), x)
#define KEEP(left, x) _mm256_and_ps(x, _mm256_castsi256_ps(fl_lanes_below8(left)))
#define KEEP_OR(left, x, other)                                                                    \
    _mm256_blendv_ps(other, x, _mm256_castsi256_ps(fl_lanes_below8(left)))
#define LOAD_BF16(p) fl_load_bf16x8(p)
#define LOAD_BF16_PART(p, left) avx2_load_bf16_part(p, left)
#define STORE_BF16(p, x) fl_store_bf16x8_exact(p, x)
#define STORE_BF16_PART(p, left, x) avx2_store_bf16_part(p, left, x)
#define SUB_LANE(y, lane, v) avx2_sub_lane(y, lane, v)
#define SET1(x) _mm256_set1_ps(x)
#define ADD(a, b) _mm256_add_ps(a, b)
#define SUB(a, b) _mm256_sub_ps(a, b)
#define MAX(a, b) _mm256_max_ps(a, b)
#define FMADD(a, b, c) _mm256_fmadd_ps(a, b, c)
#define EXP(x) fl_exp8(x)
#define REDUCE_ADD(x) fl_reduce_add8(x)
#define REDUCE_MAX(x) fl_reduce_max8(x)
#include "cpu_rows_gen.h"
#pragma GCC pop_options

/* ---- AVX-512: the row loops 16 lanes wide, and the rest of the file ---------------- */

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

#include "cpu_avx512.h"

/* 16 bf16 (raw bits) as f32, the lanes outside k 0; and stored, rounded
 * as fl_convert rounds, the lanes outside k left alone. */
static inline __m512 load_bf16_masked(const uint16_t *p, __mmask16 k) {
    __m256i h =
        k == 0xffff ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(k, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline void store_bf16_masked(uint16_t *p, __mmask16 k, __m512 x) {
    __m256i h = _mm512_cvtepi32_epi16(fl_bf16_bits16(x));
    if (k == 0xffff)
        _mm256_storeu_si256((__m256i *)p, h);
    else
        _mm256_mask_storeu_epi16(p, k, h);
}

#define W 16
#define VEC __m512
#define FN(name) fl_avx512_##name
#define LOAD(p) _mm512_loadu_ps(p)
#define STORE(p, x) _mm512_storeu_ps(p, x)
#define LOAD_PART(p, left, missing) _mm512_mask_loadu_ps(missing, fl_lanes_below(0, left), p)
#define STORE_PART(p, left, x) _mm512_mask_storeu_ps(p, fl_lanes_below(0, left), x)
#define KEEP(left, x) _mm512_maskz_mov_ps(fl_lanes_below(0, left), x)
#define KEEP_OR(left, x, other) _mm512_mask_mov_ps(other, fl_lanes_below(0, left), x)
#define LOAD_BF16(p) load_bf16_masked(p, 0xffff)
#define LOAD_BF16_PART(p, left) load_bf16_masked(p, fl_lanes_below(0, left))
#define STORE_BF16(p, x) store_bf16_masked(p, 0xffff, x)
#define STORE_BF16_PART(p, left, x) store_bf16_masked(p, fl_lanes_below(0, left), x)
#define SUB_LANE(y, lane, v) _mm512_mask_sub_ps(y, (__mmask16)(1u << (lane)), y, v)
#define SET1(x) _mm512_set1_ps(x)
#define ADD(a, b) _mm512_add_ps(a, b)
#define SUB(a, b) _mm512_sub_ps(a, b)
#define MAX(a, b) _mm512_max_ps(a, b)
#define FMADD(a, b, c) _mm512_fmadd_ps(a, b, c)
#define EXP(x) fl_exp16(x)
#define REDUCE_ADD(x) _mm512_reduce_add_ps(x)
#define REDUCE_MAX(x) _mm512_reduce_max_ps(x)
#include "cpu_rows_gen.h"

/* The row loops at the level in force. */
static const fl_row_loops avx512_loops = {
    fl_avx512_row_max,      fl_avx512_row_exp,        fl_avx512_row_exp_affine,
    fl_avx512_row_max_bf16, fl_avx512_row_exp_sum_bf16, fl_avx512_row_exp_affine_bf16,
};
static const fl_row_loops avx2_loops = {
    fl_avx2_row_max,      fl_avx2_row_exp,        fl_avx2_row_exp_affine,
    fl_avx2_row_max_bf16, fl_avx2_row_exp_sum_bf16, fl_avx2_row_exp_affine_bf16,
};

const fl_row_loops *fl_cpu_row_loops(void) {
    fl_cpu_isa isa = fl_cpu_isa_level();
    return isa >= FL_CPU_ISA_AVX512 ? &avx512_loops : isa >= FL_CPU_ISA_AVX2 ? &avx2_loops : NULL;
}

/* f32 or bf16 (rounded as fl_convert rounds), 16 at a time. */
static inline __m512 load16(const void *p, bool bf16) {
    return bf16 ? fl_load_bf16x16(p) : _mm512_loadu_ps(p);
}

static inline void store16(void *p, bool bf16, __m512 x) {
    if (bf16)
        fl_store_bf16x16_exact(p, x);
    else
        _mm512_storeu_ps(p, x);
}

/* ---- RMSNorm ---------------------------------------------------------------------- */

/* acc + a * b over 16 lanes, in double (8 lanes wide, as two halves):
 * the products of f32 values are exact there, as in cpu_norm_gen.h. */
static inline __m512d dot_pd(__m512d acc, __m512 a, __m512 b) {
    acc = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(a)),
                          _mm512_cvtps_pd(_mm512_castps512_ps256(b)), acc);
    __m256 ah = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 bh = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1));
    return _mm512_fmadd_pd(_mm512_cvtps_pd(ah), _mm512_cvtps_pd(bh), acc);
}

/* d[0..15] += the 16 lanes of a, widened to double. */
static inline void add_to_pd(double *d, __m512 a) {
    __m256 ah = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    _mm512_storeu_pd(d,
                     _mm512_add_pd(_mm512_loadu_pd(d), _mm512_cvtps_pd(_mm512_castps512_ps256(a))));
    _mm512_storeu_pd(d + 8, _mm512_add_pd(_mm512_loadu_pd(d + 8), _mm512_cvtps_pd(ah)));
}

float fl_avx512_rms_norm_row(void *y, bool ybf, const void *x, bool xbf, const float *w, int64_t n,
                             double eps, bool round16) {
    int64_t xe = xbf ? 2 : 4, ye = ybf ? 2 : 4;
    const char *xp = x;
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = load16(xp + i * xe, xbf);
        acc = dot_pd(acc, v, v);
    }
    float inv = (float)(1.0 / sqrt(_mm512_reduce_add_pd(acc) / (double)n + eps));
    __m512 vi = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_mul_ps(load16(xp + i * xe, xbf), vi);
        if (round16) v = fl_round_bf16x16(v);
        if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        store16((char *)y + i * ye, ybf, v);
    }
    return inv;
}

void fl_avx512_rms_norm_backward_row(void *dx, bool dxbf, const void *x, bool xbf, const void *g,
                                     bool gbf, const float *w, float inv, int64_t n,
                                     double *dw_sum) {
    int64_t xe = xbf ? 2 : 4, ge = gbf ? 2 : 4, de = dxbf ? 2 : 4;
    const char *xp = x, *gp = g;
    __m512 vi = _mm512_set1_ps(inv);
    if (dx) {
        /* dx = inv * (dn - x * c), dn = g * w, c = mean(dn * x) * inv^2 */
        __m512d acc = _mm512_setzero_pd();
        for (int64_t i = 0; i < n; i += 16) {
            __m512 dn = load16(gp + i * ge, gbf);
            if (w) dn = _mm512_mul_ps(dn, _mm512_loadu_ps(w + i));
            acc = dot_pd(acc, dn, load16(xp + i * xe, xbf));
        }
        float c = (float)(_mm512_reduce_add_pd(acc) / (double)n) * inv * inv;
        __m512 vc = _mm512_set1_ps(c);
        for (int64_t i = 0; i < n; i += 16) {
            __m512 dn = load16(gp + i * ge, gbf);
            if (w) dn = _mm512_mul_ps(dn, _mm512_loadu_ps(w + i));
            __m512 v =
                _mm512_mul_ps(vi, _mm512_sub_ps(dn, _mm512_mul_ps(load16(xp + i * xe, xbf), vc)));
            store16((char *)dx + i * de, dxbf, v);
        }
    }
    if (dw_sum)
        for (int64_t i = 0; i < n; i += 16)
            add_to_pd(dw_sum + i,
                      _mm512_mul_ps(
                          _mm512_mul_ps(load16(gp + i * ge, gbf), load16(xp + i * xe, xbf)), vi));
}

/* ---- LayerNorm ------------------------------------------------------------------- */

/* acc + the 16 lanes of a, in double. */
static inline __m512d sum_pd(__m512d acc, __m512 a) {
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(a)));
    __m256 ah = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return _mm512_add_pd(acc, _mm512_cvtps_pd(ah));
}

/* acc + (a - m)^2 over a's 16 lanes, in double (cpu_norm_gen.h's centred
 * variance). */
static inline __m512d centred_pd(__m512d acc, __m512 a, __m512d m) {
    __m256 ah = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m512d d0 = _mm512_sub_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(a)), m);
    __m512d d1 = _mm512_sub_pd(_mm512_cvtps_pd(ah), m);
    acc = _mm512_add_pd(acc, _mm512_mul_pd(d0, d0));
    return _mm512_add_pd(acc, _mm512_mul_pd(d1, d1));
}

float fl_avx512_layer_norm_row(void *y, bool ybf, const void *x, bool xbf, const float *w,
                               const float *b, int64_t n, double eps, float *mean) {
    int64_t xe = xbf ? 2 : 4, ye = ybf ? 2 : 4;
    const char *xp = x;
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) acc = sum_pd(acc, load16(xp + i * xe, xbf));
    double m = _mm512_reduce_add_pd(acc) / (double)n;
    __m512d vm = _mm512_set1_pd(m);
    acc = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) acc = centred_pd(acc, load16(xp + i * xe, xbf), vm);
    float inv = (float)(1.0 / sqrt(_mm512_reduce_add_pd(acc) / (double)n + eps));
    *mean = (float)m;
    __m512 vi = _mm512_set1_ps(inv), mr = _mm512_set1_ps((float)m);
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(load16(xp + i * xe, xbf), mr), vi);
        if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        if (b) v = _mm512_add_ps(v, _mm512_loadu_ps(b + i));
        store16((char *)y + i * ye, ybf, v);
    }
    return inv;
}

void fl_avx512_layer_norm_backward_row(void *dx, bool dxbf, const void *x, bool xbf, const void *g,
                                       bool gbf, const float *w, float mean, float inv, int64_t n,
                                       double *dw_sum, double *db_sum) {
    int64_t xe = xbf ? 2 : 4, ge = gbf ? 2 : 4, de = dxbf ? 2 : 4;
    const char *xp = x, *gp = g;
    __m512 vi = _mm512_set1_ps(inv), vm = _mm512_set1_ps(mean);
#define XHAT(i) _mm512_mul_ps(_mm512_sub_ps(load16(xp + (i)*xe, xbf), vm), vi)
    if (dx) {
        /* dx = inv * (dxhat - c1 - xhat * c2), dxhat = g * w, c1 = mean(dxhat),
         * c2 = mean(dxhat * xhat) */
        __m512d s1 = _mm512_setzero_pd(), s2 = _mm512_setzero_pd();
        for (int64_t i = 0; i < n; i += 16) {
            __m512 dn = load16(gp + i * ge, gbf);
            if (w) dn = _mm512_mul_ps(dn, _mm512_loadu_ps(w + i));
            s1 = sum_pd(s1, dn);
            s2 = dot_pd(s2, dn, XHAT(i));
        }
        __m512 c1 = _mm512_set1_ps((float)(_mm512_reduce_add_pd(s1) / (double)n));
        __m512 c2 = _mm512_set1_ps((float)(_mm512_reduce_add_pd(s2) / (double)n));
        for (int64_t i = 0; i < n; i += 16) {
            __m512 dn = load16(gp + i * ge, gbf);
            if (w) dn = _mm512_mul_ps(dn, _mm512_loadu_ps(w + i));
            __m512 t = _mm512_sub_ps(_mm512_sub_ps(dn, c1), _mm512_mul_ps(XHAT(i), c2));
            store16((char *)dx + i * de, dxbf, _mm512_mul_ps(vi, t));
        }
    }
    for (int64_t i = 0; (dw_sum || db_sum) && i < n; i += 16) {
        __m512 gv = load16(gp + i * ge, gbf);
        if (dw_sum) add_to_pd(dw_sum + i, _mm512_mul_ps(gv, XHAT(i)));
        if (db_sum) add_to_pd(db_sum + i, gv);
    }
#undef XHAT
}

/* ---- silu(gate) * up on bf16 ------------------------------------------------------ */

/* glibc's 16-lane expf (libmvec), the one cpu_unary.c's AVX-512 clones call
 * in the release build: the same bits as theirs there. (The sanitized
 * build's -O1 leaves those loops scalar, with scalar expf.) */
__m512 _ZGVeN16v_expf(__m512 x);

void fl_avx512_silu_mul_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = fl_lanes_below(i, n);
        __m512 x = load_bf16_masked(a + i, k), y = load_bf16_masked(b + i, k);
        __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
        store_bf16_masked(o + i, k, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), y));
    }
}

void fl_avx512_silu_mul_backward_bf16(uint16_t *ga, uint16_t *gb, const uint16_t *g,
                                      const uint16_t *a, const uint16_t *b, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = fl_lanes_below(i, n);
        __m512 x = load_bf16_masked(a + i, k), gy = load_bf16_masked(g + i, k);
        __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
        __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, e));
        if (ga) {
            __m512 y = load_bf16_masked(b + i, k);
            __m512 t = _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, sg)));
            store_bf16_masked(ga + i, k, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(gy, y), sg), t));
        }
        if (gb) store_bf16_masked(gb + i, k, _mm512_mul_ps(_mm512_mul_ps(gy, x), sg));
    }
}

/* ---- binary arithmetic on bf16 ----------------------------------------------------- */

void fl_avx512_binary_bf16(int op, double alpha, uint16_t *o, const uint16_t *x, const uint16_t *y,
                           int64_t n) {
    __m512 al = _mm512_set1_ps((float)alpha);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = fl_lanes_below(i, n);
        __m512 a = load_bf16_masked(x + i, k), b = load_bf16_masked(y + i, k), r;
        switch (op) {
        case FL_ADD: r = _mm512_add_ps(a, b); break;
        case FL_SUB: r = _mm512_sub_ps(a, b); break;
        case FL_MUL: r = _mm512_mul_ps(a, b); break;
        case FL_DIV: r = _mm512_div_ps(a, b); break;
        default: r = _mm512_add_ps(a, _mm512_mul_ps(al, b)); break; /* FL_AXPY */
        }
        store_bf16_masked(o + i, k, r);
    }
}

/* ---- rotary ---------------------------------------------------------------------- */

/* Rows [t0, t1) of one [T, D] plane: x rows xs elements apart, y dense,
 * table row t at c + t * cs (and s). The arithmetic of cpu_rotary_gen.h,
 * rounded the same way, so results are bit for bit its own. */
static void rotary_rows(char *y, bool ybf, const char *x, bool xbf, int64_t xs, const char *c,
                        const char *s, bool tbf, int64_t cs, int64_t ss, int64_t t0, int64_t t1,
                        int64_t D, bool inverse) {
    int64_t h = D / 2, xe = xbf ? 2 : 4, ye = ybf ? 2 : 4, te = tbf ? 2 : 4;
    for (int64_t t = t0; t < t1; t++) {
        const char *xr = x + t * xs * xe, *cr = c + t * cs * te, *sr = s + t * ss * te;
        char *yr = y + t * D * ye;
        for (int64_t i = 0; i < h; i += 16) {
            __m512 x0 = load16(xr + i * xe, xbf), x1 = load16(xr + (i + h) * xe, xbf);
            __m512 c0 = load16(cr + i * te, tbf), c1 = load16(cr + (i + h) * te, tbf);
            __m512 s0 = load16(sr + i * te, tbf), s1 = load16(sr + (i + h) * te, tbf);
            __m512 y0, y1;
            if (!inverse) {
                y0 = _mm512_sub_ps(_mm512_mul_ps(x0, c0), _mm512_mul_ps(x1, s0));
                y1 = _mm512_add_ps(_mm512_mul_ps(x1, c1), _mm512_mul_ps(x0, s1));
            } else {
                y0 = _mm512_add_ps(_mm512_mul_ps(x0, c0), _mm512_mul_ps(x1, s1));
                y1 = _mm512_sub_ps(_mm512_mul_ps(x1, c1), _mm512_mul_ps(x0, s0));
            }
            store16(yr + i * ye, ybf, y0);
            store16(yr + (i + h) * ye, ybf, y1);
        }
    }
}

void fl_avx512_rotary(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos,
                      const fl_tensor *sin, bool inverse) {
    enum { ROWS = 64 }; /* rows per work item */
    int nd = x->ndim;
    int64_t T = x->shape[nd - 2], D = x->shape[nd - 1];
    int64_t planes = T && D ? x->numel / (T * D) : 0, per_plane = (T + ROWS - 1) / ROWS;
    bool xbf = x->dtype == FL_BF16, ybf = out->dtype == FL_BF16, tbf = cos->dtype == FL_BF16;
    size_t xe = xbf ? 2 : 4, ye = ybf ? 2 : 4;
#pragma omp parallel for schedule(static) if (x->numel >= FL_FUSED_PARALLEL_MIN)
    for (int64_t it = 0; it < planes * per_plane; it++) {
        int64_t p = it / per_plane, t0 = it % per_plane * ROWS, t1 = t0 + ROWS < T ? t0 + ROWS : T;
        int64_t off = 0, rest = p;
        for (int d = nd - 3; d >= 0; d--) {
            off += rest % x->shape[d] * x->stride[d];
            rest /= x->shape[d];
        }
        rotary_rows((char *)out->data + p * T * D * (int64_t)ye, ybf,
                    (const char *)x->data + off * (int64_t)xe, xbf, x->stride[nd - 2], cos->data,
                    sin->data, tbf, cos->stride[0], sin->stride[0], t0, t1, D, inverse);
    }
}

#endif
