/*
 * cpu_attention_bf16.c: bf16 scaled dot-product attention, forward and
 * backward, on AMX tiles or on AVX512-BF16 dot products ([Note: bf16
 * attention kernels], cpu_attention_native.c, which decides when these
 * run and on which; cpu_attention_gen.h has the same algorithm in f32
 * through BLAS).
 *
 * The unit of work is a block of QBLOCK query rows of one (batch, head)
 * against the keys it sees: with causal masking those up to its last row,
 * with a window from its first row's window start rounded down to 32 (a
 * whole pair-packed tile; the rows' masks hide the extra keys), and with
 * packed sequences from its first row's document start, rounded the same
 * way ([Note: packed sequences], core/ops/attention.c). A
 * operands are bf16 rows as stored, B operands are packed pair-
 * interleaved ([K/2][N][2], see pack_pairs): the layout both AMX's
 * tdpbf16ps and AVX512-BF16's vdpbf16ps multiply, each f32 sum taking
 * the two products of a pair. Sums are f32. Sizes are padded with zeros
 * to whole tiles (16 rows; 32 along the summed dim); padded rows and
 * columns are never written out. Only `product` differs between the two.
 *   forward   S = Q K^T; P = exp(scale S - rowmax), masked; O = P V / rowsum
 *   backward  P = exp(scale S - lse); dV^T += dO^T P; dP = dO V^T;
 *             dS = P (dP - rowsum(dO O)); dQ = scale dS K; dK^T += scale Q^T dS
 * The backward keeps dK^T and dV^T of one (batch, kv head) in f32 over all
 * its query heads and blocks (so work is split by kv head, one writer
 * each) and writes them out once at the end.
 *
 * Built for AMX-BF16 and AVX-512 (the pragma below): only ever entered
 * through cpu_attention_native.c, after it checked the CPU (AVX512-BF16
 * always; AMX and the tile permission when `tiles`).
 */
#include "cpu_attention_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)

#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

#include "cpu_avx512.h"
#include "cpu_alloc.h"

#include <math.h>
#include <omp.h>
#include <string.h>

typedef uint16_t bf16; /* the bits of a bfloat16 */

/* Query rows per block; a multiple of 32 (it is summed over in dV, dK). */
enum { QBLOCK = 64 };

static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* ---- tiles and the product ------------------------------------------------------- */

/* Every tile 16 rows of 64 bytes: 16 x 16 f32 sums, or 16 x 32 bf16. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void tiles_begin(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = 16, c.colsb[i] = 64;
    _tile_loadconfig(&c);
}

/* C [M, N] (f32, row stride ldc) = A B, or += with acc. A [M, K] bf16
 * rows with stride lda; B packed [K/2][nb][2] (its first N columns are
 * used). M, N multiples of 16, K of 32. Tiles: 0-3 sums (a 32 x 32 block),
 * 4-5 A, 6-7 B; a last 16-row or 16-column strip one tile at a time. */
static void product_tiles(int64_t M, int64_t N, int64_t K, const bf16 *A, int64_t lda,
                          const bf16 *B, int64_t nb, float *C, int64_t ldc, bool acc) {
    size_t sa = (size_t)lda * 2, sb = (size_t)nb * 4, sc = (size_t)ldc * 4;
    int64_t M2 = M / 32 * 32, N2 = N / 32 * 32;
    for (int64_t m = 0; m < M2; m += 32)
        for (int64_t n = 0; n < N2; n += 32) {
            float *c = C + m * ldc + n;
            if (acc) {
                _tile_loadd(0, c, sc);
                _tile_loadd(1, c + 16, sc);
                _tile_loadd(2, c + 16 * ldc, sc);
                _tile_loadd(3, c + 16 * ldc + 16, sc);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int64_t k = 0; k < K; k += 32) {
                const bf16 *a = A + m * lda + k, *b = B + k * nb + 2 * n;
                _tile_loadd(4, a, sa);
                _tile_loadd(5, a + 16 * lda, sa);
                _tile_loadd(6, b, sb);
                _tile_loadd(7, b + 32, sb);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, c, sc);
            _tile_stored(1, c + 16, sc);
            _tile_stored(2, c + 16 * ldc, sc);
            _tile_stored(3, c + 16 * ldc + 16, sc);
        }
    for (int64_t m = 0; m < M; m += 16)
        for (int64_t n = m < M2 ? N2 : 0; n < N; n += 16) {
            float *c = C + m * ldc + n;
            if (acc)
                _tile_loadd(0, c, sc);
            else
                _tile_zero(0);
            for (int64_t k = 0; k < K; k += 32) {
                _tile_loadd(4, A + m * lda + k, sa);
                _tile_loadd(6, B + k * nb + 2 * n, sb);
                _tile_dpbf16ps(0, 4, 6);
            }
            _tile_stored(0, c, sc);
        }
}

/* R rows by 16 V columns of C = A B (or +=), as product_tiles, on
 * AVX512-BF16: per pair of A's columns, a broadcast of the pair times V
 * vectors of 16 packed pairs of B, each vdpbf16ps adding both products to
 * 16 f32 sums. R V sums stay in registers over the whole K. */
static inline __attribute__((always_inline)) void dots_block(int R, int V, int64_t K, const bf16 *A,
                                                             int64_t lda, const bf16 *B, int64_t nb,
                                                             float *C, int64_t ldc, bool acc) {
    __m512 c[8][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < V; v++)
            c[r][v] = acc ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t i = 0; i < K / 2; i++) {
        __m512bh b[2];
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) b[v] = (__m512bh)_mm512_loadu_si512(B + 2 * (i * nb + 16 * v));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            uint32_t pair;
            memcpy(&pair, A + r * lda + 2 * i, sizeof pair);
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)pair);
#pragma GCC unroll 2
            for (int v = 0; v < V; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < V; v++) _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
}

/* product_tiles' contract on AVX512-BF16: blocks of 8 rows by 32 columns
 * (16 sums in registers), a last 16-column strip 8 by 16. */
static void product_dots(int64_t M, int64_t N, int64_t K, const bf16 *A, int64_t lda, const bf16 *B,
                         int64_t nb, float *C, int64_t ldc, bool acc) {
    int64_t N2 = N / 32 * 32;
    for (int64_t m = 0; m < M; m += 8) {
        for (int64_t n = 0; n < N2; n += 32)
            dots_block(8, 2, K, A + m * lda, lda, B + 2 * n, nb, C + m * ldc + n, ldc, acc);
        if (N2 < N)
            dots_block(8, 1, K, A + m * lda, lda, B + 2 * N2, nb, C + m * ldc + N2, ldc, acc);
    }
}

/* The products of one call: on the tiles or on dot products. */
static void product(bool tiles, int64_t M, int64_t N, int64_t K, const bf16 *A, int64_t lda,
                    const bf16 *B, int64_t nb, float *C, int64_t ldc, bool acc) {
    if (tiles)
        product_tiles(M, N, K, A, lda, B, nb, C, ldc, acc);
    else
        product_dots(M, N, K, A, lda, B, nb, C, ldc, acc);
}

/* ---- packing: B operands and transposes ------------------------------------------ */

/* Rows 2i and 2i+1 of X [rows, N] (row stride ld), interleaved: the B
 * operand for a product summing over X's rows. dst [K/2][N][2], rows at
 * and past `rows` zero up to K. */
static void pack_pairs(bf16 *dst, const bf16 *X, int64_t ld, int64_t rows, int64_t K, int64_t N) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                        8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t i = 0; i < K / 2; i++) {
        const bf16 *x0 = 2 * i < rows ? X + 2 * i * ld : NULL;
        const bf16 *x1 = 2 * i + 1 < rows ? X + (2 * i + 1) * ld : NULL;
        bf16 *d = dst + i * 2 * N;
        int64_t n = 0;
        for (; n + 32 <= N; n += 32) {
            __m512i a = x0 ? _mm512_loadu_si512(x0 + n) : _mm512_setzero_si512();
            __m512i b = x1 ? _mm512_loadu_si512(x1 + n) : _mm512_setzero_si512();
            _mm512_storeu_si512(d + 2 * n, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(d + 2 * n + 32, _mm512_permutex2var_epi16(a, hi, b));
        }
        for (; n < N; n++) {
            d[2 * n] = x0 ? x0[n] : 0;
            d[2 * n + 1] = x1 ? x1[n] : 0;
        }
    }
}

/* X^T as a B operand, X [rows, K] (row stride ld): the product sums over
 * X's columns, so pair i of column n is X[n][2i], X[n][2i+1], which are
 * adjacent in X: a transpose of 32-bit pairs, [N][K/2] -> [K/2][N].
 * dst [K/2][N][2], rows at and past `rows` zero up to N (a multiple of
 * 32; K, a head dim, too). */
static void pack_transposed(bf16 *dst, const bf16 *X, int64_t ld, int64_t rows, int64_t N,
                            int64_t K) {
    for (int64_t n0 = 0; n0 < N; n0 += 16)
        for (int64_t i0 = 0; i0 < K / 2; i0 += 16) {
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = n0 + j < rows ? _mm512_loadu_si512(X + (n0 + j) * ld + 2 * i0)
                                     : _mm512_setzero_si512();
            fl_transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + ((i0 + j) * N + n0) * 2, r[j]);
        }
}

/* Rows [0, m) of X (row stride ld) into dst [M, cols] (dense), zero rows
 * up to M; with transposed, into dst [cols, M] instead (M and cols
 * multiples of 32): rows 2i and 2i+1 joined into 32-bit pairs, then
 * those transposed. */
static void copy_rows(bf16 *dst, const bf16 *X, int64_t ld, int64_t m, int64_t M, int64_t cols,
                      bool transposed) {
    if (!transposed) {
        for (int64_t r = 0; r < m; r++)
            memcpy(dst + r * cols, X + r * ld, (size_t)cols * sizeof *dst);
        memset(dst + m * cols, 0, (size_t)((M - m) * cols) * sizeof *dst);
        return;
    }
    for (int64_t r0 = 0; r0 < M; r0 += 32)
        for (int64_t c0 = 0; c0 < cols; c0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                int64_t ra = r0 + 2 * i;
                __m512i a = ra < m ? _mm512_cvtepu16_epi32(
                                         _mm256_loadu_si256((const __m256i *)(X + ra * ld + c0)))
                                   : _mm512_setzero_si512();
                __m512i b = ra + 1 < m ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                             (const __m256i *)(X + (ra + 1) * ld + c0)))
                                       : _mm512_setzero_si512();
                r[i] = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
            }
            fl_transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(dst + (c0 + i) * M + r0, r[i]);
        }
}

/* ---- 16 lanes at a time ------------------------------------------------------------ */

/* Rows x0 and x1 (16 f32 each) rounded to bf16 and interleaved: the 32
 * values of pair-packed columns n ... n+15 (pack_pairs' layout). */
static inline void store_pairs(bf16 *p, __m512 x0, __m512 x1) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512i both = (__m512i)_mm512_cvtne2ps_pbh(x1, x0); /* x0 low, x1 high */
    _mm512_storeu_si512(p, _mm512_permutexvar_epi16(idx, both));
}

/* ---- blocks -------------------------------------------------------------------------- */

static inline const bf16 *row_of(const fl_tensor *t, int64_t b, int64_t h, int64_t i) {
    return (const bf16 *)t->data + b * t->stride[0] + h * t->stride[1] + i * t->stride[2];
}

/* The first key query i of batch row b sees: its window's start, or its
 * document's when later (packed sequences); never decreases along i. */
static inline int64_t first_key(const fl_attention_args *a, int64_t b, int64_t i) {
    int64_t lo = a->window > 0 ? i - a->window + 1 : 0;
    if (a->starts) {
        int64_t s = ((const int64_t *)a->starts->data)[b * a->starts->shape[1] + i];
        if (s > lo) lo = s;
    }
    return lo;
}

/* The keys a block of rows [i0, i0 + m) of batch row b multiplies:
 * [*j0, *j1), j0 a multiple of 32 (the first row's first key rounded
 * down), j1 the last row's diagonal (causal) or Tk. */
static inline void block_keys(const fl_attention_args *a, int64_t b, int64_t i0, int64_t m,
                              int64_t Tk, int64_t *j0, int64_t *j1) {
    int64_t lo = first_key(a, b, i0);
    lo = lo < 0 ? 0 : lo > Tk ? Tk : lo;
    *j0 = lo / 32 * 32;
    *j1 = a->causal && i0 + m < Tk ? i0 + m : Tk;
    if (*j1 < *j0) *j1 = *j0;
}

/* The keys query i of batch row b sees, as [*lo, *hi) relative to the
 * block's first key j0 (its last key j1): empty when hi <= lo. */
static inline void row_keys(const fl_attention_args *a, int64_t b, int64_t i, int64_t j0,
                            int64_t j1, int64_t *lo, int64_t *hi) {
    int64_t h = a->causal && i + 1 < j1 ? i + 1 : j1, l = first_key(a, b, i);
    *lo = (l > j0 ? l : j0) - j0;
    *hi = h - j0;
}

/* Lanes j ... j + 15 inside [lo, hi). */
static inline __mmask16 lanes_in(int64_t j, int64_t lo, int64_t hi) {
    return (__mmask16)(fl_lanes_below(j, hi) & ~fl_lanes_below(j, lo));
}

/* tanh of 16 lanes from one exponential: (1 - e) / (1 + e), e = exp(-2|x|),
 * the sign put back. */
static inline __m512 tanh16(__m512 x) {
    __m512 ax = _mm512_abs_ps(x);
    __m512 e = fl_exp16(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    return _mm512_or_ps(t, _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));
}

/* scale * s, then softcap * tanh(. / softcap) when capped; *th gets the
 * tanh (for the backward's 1 - tanh^2). */
static inline __m512 scores16(__m512 s, __m512 scale, float cap, __m512 *th) {
    __m512 x = _mm512_mul_ps(s, scale);
    if (cap <= 0) return x;
    *th = tanh16(_mm512_mul_ps(x, _mm512_set1_ps(1 / cap)));
    return _mm512_mul_ps(*th, _mm512_set1_ps(cap));
}

/* Forward rows of a block (keys j0 ... j1 - 1): S [.., np] f32 in (capped
 * in place with a softcap), P
 * [m_pad, np] bf16 out (zero outside each row's keys and in the padding
 * rows); per row the logsumexp and 1/rowsum (-inf and 0 for a row that
 * sees no key). */
static void forward_softmax(const fl_attention_args *a, float *S, bf16 *P, int64_t m,
                            int64_t m_pad, int64_t np, int64_t j0, int64_t j1, int64_t b,
                            int64_t i0, float *lse, float *inv_sum) {
    __m512 scale = _mm512_set1_ps((float)a->scale), th;
    float cap = (float)a->softcap;
    for (int64_t r = 0; r < m_pad; r++) {
        bf16 *p = P + r * np;
        int64_t lo = 0, hi = 0;
        if (r < m) row_keys(a, b, i0 + r, j0, j1, &lo, &hi);
        if (hi <= lo) {
            memset(p, 0, (size_t)np * sizeof *p);
            if (r < m) lse[r] = -INFINITY, inv_sum[r] = 0;
            continue;
        }
        float *s = S + r * np;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t j = lo / 16 * 16; j < hi; j += 16) {
            __m512 x = scores16(_mm512_loadu_ps(s + j), scale, cap, &th);
            /* capped: kept in S (scratch) for the pass below, which then
             * neither scales nor caps again (lanes outside [lo, hi) stay
             * raw and masked) */
            if (cap > 0) _mm512_storeu_ps(s + j, x);
            mx = _mm512_mask_max_ps(mx, lanes_in(j, lo, hi), mx, x);
        }
        __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < np; j += 16) {
            __m512 x = cap > 0 ? _mm512_sub_ps(_mm512_loadu_ps(s + j), shift)
                               : _mm512_fmsub_ps(_mm512_loadu_ps(s + j), scale, shift);
            __m512 e = _mm512_maskz_mov_ps(lanes_in(j, lo, hi), fl_exp16(x));
            sum = _mm512_add_ps(sum, e);
            fl_store_bf16x16(p + j, e);
        }
        float total = _mm512_reduce_add_ps(sum);
        lse[r] = _mm512_cvtss_f32(shift) + logf(total);
        inv_sum[r] = 1 / total;
    }
}

/* Scratch of one thread: the largest block sizes times the element sizes
 * of what each pass keeps. */
typedef struct scratch {
    void *base;
    int64_t bytes;
} scratch;

static bool scratch_get(scratch *s, int64_t bytes) {
    s->bytes = bytes;
    s->base = fl_cpu_alloc(bytes);
    return s->base != NULL;
}

static void scratch_put(scratch *s) {
    if (s->base) fl_cpu_free(s->base, s->bytes);
}

int fl_bf16_attention(const fl_attention_args *a, bool tiles) {
    const fl_tensor *q = a->q, *k = a->k, *v = a->v;
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], Tk = k->shape[2], Dv = v->shape[3], group = Hq / Hkv;
    int64_t nqb = (Tq + QBLOCK - 1) / QBLOCK, items = B * Hq * nqb, Tp = round_up(Tk, 32);
    /* K^T and V packed, the Q block, S (f32), P, O (f32), 1/rowsum. */
    int64_t bytes = 2 * Tp * (D + Dv) + 2 * QBLOCK * D + 4 * QBLOCK * Tp + 2 * QBLOCK * Tp +
                    4 * QBLOCK * Dv + 4 * QBLOCK;
    bool par = fl_attention_parallel(items, B * Hq * Tq * Tk * (D + Dv));
    bool oom = false;
    /* Items in order (batch, head, block) and a static split: a thread's
     * items share their kv head, so K and V are packed once per head. */
#pragma omp parallel if (par)
    {
        scratch s;
        if (!scratch_get(&s, bytes)) oom = true;
        bf16 *Kt = s.base, *Vp = Kt + Tp * D, *Qb = Vp + Tp * Dv;
        float *S = (float *)(Qb + QBLOCK * D);
        bf16 *P = (bf16 *)(S + QBLOCK * Tp);
        float *O = (float *)(P + QBLOCK * Tp), *inv_sum = O + QBLOCK * Dv;
        int64_t packed = -1;
        if (s.base && tiles) tiles_begin();
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            if (!s.base || oom) continue;
            int64_t qb = it % nqb, h = (it / nqb) % Hq, b = it / (nqb * Hq), hk = h / group;
            if (packed != b * Hkv + hk) {
                pack_transposed(Kt, row_of(k, b, hk, 0), k->stride[2], Tk, Tp, D);
                pack_pairs(Vp, row_of(v, b, hk, 0), v->stride[2], Tk, Tp, Dv);
                packed = b * Hkv + hk;
            }
            int64_t i0 = qb * QBLOCK, m = Tq - i0 < QBLOCK ? Tq - i0 : QBLOCK, j0, j1;
            block_keys(a, b, i0, m, Tk, &j0, &j1);
            int64_t m_pad = round_up(m, 32), np = round_up(j1 - j0, 32);
            float *lse = (float *)a->lse->data + (b * Hq + h) * Tq + i0;
            if (np == 0) { /* no row of the block sees a key */
                for (int64_t r = 0; r < m; r++) {
                    lse[r] = -INFINITY;
                    memset((bf16 *)row_of(a->out, b, h, i0 + r), 0, (size_t)Dv * sizeof(bf16));
                }
                continue;
            }
            copy_rows(Qb, row_of(q, b, h, i0), q->stride[2], m, m_pad, D, false);
            /* (packed K^T: column j0 at 2 j0; packed V: key pair j0 / 2 at j0 Dv) */
            product(tiles, m_pad, np, D, Qb, D, Kt + 2 * j0, Tp, S, np, false);
            forward_softmax(a, S, P, m, m_pad, np, j0, j1, b, i0, lse, inv_sum);
            product(tiles, m_pad, Dv, np, P, np, Vp + j0 * Dv, Dv, O, Dv, false);
            for (int64_t r = 0; r < m; r++) {
                bf16 *o = (bf16 *)row_of(a->out, b, h, i0 + r);
                __m512 inv = _mm512_set1_ps(inv_sum[r]);
                for (int64_t d = 0; d < Dv; d += 16)
                    fl_store_bf16x16(o + d, _mm512_mul_ps(_mm512_loadu_ps(O + r * Dv + d), inv));
            }
        }
        if (s.base && tiles) _tile_release();
        scratch_put(&s);
    }
    return oom ? fl_fail(FL_ERR_OOM, "scaled_dot_product_attention: out of CPU memory for "
                                     "score blocks")
               : FL_OK;
}

/* Rows [0, rows) of t's (b, h) from X [cols, ld] that holds them as
 * columns: t[b, h, j, c] = bf16(scale X[c, j]). */
static void store_transposed(const fl_tensor *t, int64_t b, int64_t h, const float *X, int64_t ld,
                             int64_t rows, int64_t cols, float scale) {
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i at = _mm512_mullo_epi32(lanes, _mm512_set1_epi32((int)ld));
    __m512 sc = _mm512_set1_ps(scale);
    int64_t whole = rows / 16 * 16; /* 16 rows at a time by transposes, the rest by gathers */
    for (int64_t j0 = 0; j0 < whole; j0 += 16)
        for (int64_t c0 = 0; c0 < cols; c0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(X + (c0 + i) * ld + j0);
            fl_transpose16(r);
            for (int i = 0; i < 16; i++)
                fl_store_bf16x16((bf16 *)row_of(t, b, h, j0 + i) + c0,
                                 _mm512_mul_ps(_mm512_castsi512_ps(r[i]), sc));
        }
    for (int64_t j = whole; j < rows; j++) {
        bf16 *dst = (bf16 *)row_of(t, b, h, j);
        for (int64_t c = 0; c < cols; c += 16)
            fl_store_bf16x16(dst + c,
                             _mm512_mul_ps(_mm512_i32gather_ps(at, X + c * ld + j, 4), sc));
    }
}

/* Backward rows of a block (keys j0 ... j1 - 1), in place: S [m_pad, np]
 * (scores) becomes P, and dP [m_pad, np] becomes dS (through the softcap:
 * times 1 - tanh^2); P and dS also go out pair-packed over the block's
 * rows (Pp, dSp: the B operands of dV^T and dK^T) and dS as bf16 rows
 * (dSb: the A operand of dQ). Padding rows are zero. */
static void backward_softmax(const fl_attention_args *a, float *S, float *dP, bf16 *Pp, bf16 *dSp,
                             bf16 *dSb, const float *lse, const float *rowdot, int64_t m,
                             int64_t m_pad, int64_t np, int64_t j0, int64_t j1, int64_t b,
                             int64_t i0) {
    __m512 scale = _mm512_set1_ps((float)a->scale), zero = _mm512_setzero_ps();
    __m512 one = _mm512_set1_ps(1.0f), th = zero;
    float cap = (float)a->softcap;
    for (int64_t r = 0; r < m_pad; r += 2) {
        float *s[2] = {S + r * np, S + (r + 1) * np}, *g[2] = {dP + r * np, dP + (r + 1) * np};
        for (int64_t j = 0; j < np; j += 16) {
            __m512 p[2], ds[2];
            for (int t = 0; t < 2; t++) {
                int64_t i = r + t;
                if (i >= m) {
                    p[t] = ds[t] = zero;
                    continue;
                }
                int64_t lo, hi;
                row_keys(a, b, i0 + i, j0, j1, &lo, &hi);
                __mmask16 keep = lanes_in(j, lo, hi);
                __m512 x = _mm512_sub_ps(scores16(_mm512_loadu_ps(s[t] + j), scale, cap, &th),
                                         _mm512_set1_ps(lse[i]));
                p[t] = _mm512_maskz_mov_ps(keep, fl_exp16(x));
                ds[t] = _mm512_mul_ps(
                    p[t], _mm512_sub_ps(_mm512_loadu_ps(g[t] + j), _mm512_set1_ps(rowdot[i])));
                if (cap > 0) ds[t] = _mm512_mul_ps(ds[t], _mm512_fnmadd_ps(th, th, one));
                fl_store_bf16x16(dSb + i * np + j, ds[t]);
            }
            store_pairs(Pp + r * np + 2 * j, p[0], p[1]);
            store_pairs(dSp + r * np + 2 * j, ds[0], ds[1]);
        }
        for (int t = 0; t < 2; t++)
            if (r + t >= m) memset(dSb + (r + t) * np, 0, (size_t)np * sizeof *dSb);
    }
}

int fl_bf16_attention_backward(const fl_attention_args *a, bool tiles) {
    const fl_tensor *q = a->q, *k = a->k, *v = a->v, *o = a->o, *dout = a->dout;
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], Tk = k->shape[2], Dv = v->shape[3], group = Hq / Hkv;
    int64_t nqb = (Tq + QBLOCK - 1) / QBLOCK, items = B * Hkv, Tp = round_up(Tk, 32);
    /* K^T, V^T and K packed; dK^T, dV^T (f32); Q, Q^T, dO, dO^T blocks;
     * S, dP (f32); P and dS pair-packed, dS rows; dQ (f32); rowdot. */
    int64_t bytes = 2 * Tp * (2 * D + Dv) + 4 * Tp * (D + Dv) + 4 * QBLOCK * (D + Dv) +
                    8 * QBLOCK * Tp + 6 * QBLOCK * Tp + 4 * QBLOCK * D + 4 * QBLOCK;
    bool par = fl_attention_parallel(items, B * Hq * Tq * Tk * (2 * D + 3 * Dv));
    bool oom = false;
    float scale = (float)a->scale;
#pragma omp parallel if (par)
    {
        scratch s;
        if (!scratch_get(&s, bytes)) oom = true;
        bf16 *Kt = s.base, *Vt = Kt + Tp * D, *Kp = Vt + Tp * Dv;
        float *dKt = (float *)(Kp + Tp * D), *dVt = dKt + D * Tp;
        bf16 *Qb = (bf16 *)(dVt + Dv * Tp), *QT = Qb + QBLOCK * D, *dOb = QT + QBLOCK * D;
        bf16 *dOT = dOb + QBLOCK * Dv;
        float *S = (float *)(dOT + QBLOCK * Dv), *dP = S + QBLOCK * Tp;
        bf16 *Pp = (bf16 *)(dP + QBLOCK * Tp), *dSp = Pp + QBLOCK * Tp, *dSb = dSp + QBLOCK * Tp;
        float *dQ = (float *)(dSb + QBLOCK * Tp), *rowdot = dQ + QBLOCK * D;
        if (s.base && tiles) tiles_begin();
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!s.base || oom) continue;
            int64_t hk = it % Hkv, b = it / Hkv;
            pack_transposed(Kt, row_of(k, b, hk, 0), k->stride[2], Tk, Tp, D);
            pack_transposed(Vt, row_of(v, b, hk, 0), v->stride[2], Tk, Tp, Dv);
            pack_pairs(Kp, row_of(k, b, hk, 0), k->stride[2], Tk, Tp, D);
            memset(dKt, 0, (size_t)(D + Dv) * (size_t)Tp * sizeof *dKt);
            for (int64_t h = hk * group; h < (hk + 1) * group; h++)
                for (int64_t qb = 0; qb < nqb; qb++) {
                    int64_t i0 = qb * QBLOCK, m = Tq - i0 < QBLOCK ? Tq - i0 : QBLOCK, j0, j1;
                    block_keys(a, b, i0, m, Tk, &j0, &j1);
                    int64_t m_pad = round_up(m, 32), np = round_up(j1 - j0, 32);
                    if (np == 0) { /* no row sees a key: dq zero, nothing to dk, dv */
                        for (int64_t r = 0; r < m; r++)
                            memset((bf16 *)row_of(a->dq, b, h, i0 + r), 0, (size_t)D * sizeof(bf16));
                        continue;
                    }
                    const bf16 *Q = row_of(q, b, h, i0), *dO = row_of(dout, b, h, i0);
                    copy_rows(Qb, Q, q->stride[2], m, m_pad, D, false);
                    copy_rows(QT, Q, q->stride[2], m, m_pad, D, true);
                    copy_rows(dOb, dO, dout->stride[2], m, m_pad, Dv, false);
                    copy_rows(dOT, dO, dout->stride[2], m, m_pad, Dv, true);
                    const float *lse = (const float *)a->lse->data + (b * Hq + h) * Tq + i0;
                    for (int64_t r = 0; r < m; r++) {
                        const bf16 *orow = row_of(o, b, h, i0 + r),
                                   *grow = dO + r * dout->stride[2];
                        __m512 acc = _mm512_setzero_ps();
                        for (int64_t d = 0; d < Dv; d += 16)
                            acc = _mm512_fmadd_ps(fl_load_bf16x16(orow + d),
                                                  fl_load_bf16x16(grow + d), acc);
                        rowdot[r] = _mm512_reduce_add_ps(acc);
                    }
                    /* (K^T, V^T packed: column j0 at 2 j0; K pair-packed: key pair
                     * j0 / 2 at j0 D; dK^T, dV^T: column j0) */
                    product(tiles, m_pad, np, D, Qb, D, Kt + 2 * j0, Tp, S, np, false);
                    product(tiles, m_pad, np, Dv, dOb, Dv, Vt + 2 * j0, Tp, dP, np, false);
                    backward_softmax(a, S, dP, Pp, dSp, dSb, lse, rowdot, m, m_pad, np, j0, j1, b,
                                     i0);
                    product(tiles, Dv, np, m_pad, dOT, m_pad, Pp, np, dVt + j0, Tp, true);
                    product(tiles, D, np, m_pad, QT, m_pad, dSp, np, dKt + j0, Tp, true);
                    product(tiles, m_pad, D, np, dSb, np, Kp + j0 * D, D, dQ, D, false);
                    for (int64_t r = 0; r < m; r++) {
                        bf16 *dq = (bf16 *)row_of(a->dq, b, h, i0 + r);
                        for (int64_t d = 0; d < D; d += 16)
                            fl_store_bf16x16(dq + d, _mm512_mul_ps(_mm512_loadu_ps(dQ + r * D + d),
                                                                   _mm512_set1_ps(scale)));
                    }
                }
            store_transposed(a->dk, b, hk, dKt, Tp, Tk, D, scale);
            store_transposed(a->dv, b, hk, dVt, Tp, Tk, Dv, 1);
        }
        if (s.base && tiles) _tile_release();
        scratch_put(&s);
    }
    return oom ? fl_fail(FL_ERR_OOM, "scaled_dot_product_attention backward: out of CPU memory "
                                     "for score blocks")
               : FL_OK;
}

#else /* not x86-64 Linux with GCC: cpu_attention_native.c never takes a call */

int fl_bf16_attention(const fl_attention_args *a, bool tiles) {
    (void)a, (void)tiles;
    return fl_fail(FL_ERR_UNSUPPORTED, "scaled_dot_product_attention: built without AVX-512");
}
int fl_bf16_attention_backward(const fl_attention_args *a, bool tiles) {
    (void)a, (void)tiles;
    return fl_fail(FL_ERR_UNSUPPORTED, "scaled_dot_product_attention: built without AVX-512");
}

#endif
