/*
 * cpu_rows_avx512.c: the f32 row loops of cpu_fused_rows.h (max,
 * exp-and-sum, exp-affine) written for AVX-512, which those loops call
 * where the CPU has it (fl_cpu_avx512, cpu_fused_math.h).
 *
 * Why by hand rather than GCC's AVX-512 clone of the same C: that clone
 * was kept out after a sharded tiny Llama drifted further from one rank
 * with it (see FL_FUSED_CLONES; the cause was not found, and GCC reports
 * no alignment peeling for these loops). These loops fix their order of
 * summation themselves: they start at the row's first element whatever its
 * address and take the tail with a mask, so a row's result depends on its
 * values and length only; with them the drift stayed where it was
 * (tests/mpi/fsdp_equivalence.lua, f32: 1.4e-6). 16 lanes also run the exp
 * of softmax, cross-entropy and attention about twice as fast as the AVX2
 * clone's 8.
 */
#include "cpu_fused_math.h"

#if FL_ROWS_AVX512_BUILD

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
/* Products and sums rounded one by one, as in the baseline C they stand
 * in for (GCC would fuse a multiply and an add of intrinsics into one). */
#pragma GCC optimize("fp-contract=off")

#include "cpu_avx512.h"

#include <math.h>
#include <omp.h>

float fl_avx512_row_max(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, fl_lanes_below(i, n), x + i));
    return _mm512_reduce_max_ps(m);
}

float fl_avx512_row_exp(float *dst, const float *x, int64_t n, float shift) {
    __m512 sum = _mm512_setzero_ps(), s = _mm512_set1_ps(shift);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = fl_lanes_below(i, n);
        __m512 e = _mm512_maskz_mov_ps(k, fl_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s)));
        if (dst) _mm512_mask_storeu_ps(dst + i, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

void fl_avx512_row_exp_affine(float *dst, const float *x, int64_t n, float shift, float a, float b,
                              const float *c) {
    __m512 s = _mm512_set1_ps(shift), va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = fl_lanes_below(i, n);
        __m512 e = fl_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s));
        __m512 y = _mm512_fmadd_ps(va, e, vb);
        if (c) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(k, c + i));
        _mm512_mask_storeu_ps(dst + i, k, y);
    }
}

/* ---- rotary ---------------------------------------------------------------------- */

static inline __m512 load16(const void *p, bool bf16) {
    return bf16 ? fl_load_bf16x16(p) : _mm512_loadu_ps(p);
}

static inline void store16(void *p, bool bf16, __m512 x) {
    if (bf16) fl_store_bf16x16_exact(p, x);
    else _mm512_storeu_ps(p, x);
}

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
