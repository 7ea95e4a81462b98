/*
 * cpu_reduce.c: CPU kernels of the reductions: sum (and mean) over any set
 * of dims, max/min with indices along one dim, and the scatter along a dim
 * that max/min's backward uses.
 *
 * Geometry. The input is contiguous (the op makes it so). Size-1 dims are
 * dropped and neighbouring dims that are both reduced or both kept are
 * merged, leaving alternating groups. Each reduced group is then one pass
 * over a [A, N, B] view (A: everything before it, N: the group, B: the
 * kept dims after it), innermost group first, each pass writing its
 * partial sums (f64, or i64 for integers) for the next; the last pass
 * writes the output. Two shapes of pass cover the common cases well:
 *   B == 1: contiguous runs (a mean over the last dim, a loss over all
 *           elements): each run summed with 8 independent lanes;
 *   B  > 1: reduce over outer rows (a bias gradient summed over batch and
 *           sequence): tiles of up to 1024 columns accumulated row by
 *           row, so reads stay sequential and vectorised.
 * Work is parallel over runs or column tiles; when there are too few of
 * them to share, the reduced dim is cut into fixed blocks whose partial
 * sums are added in block order afterwards.
 *
 * Accuracy and determinism. Float sums accumulate in f64 (for f32 inputs
 * the rounding error of a sum of n terms stays near 2^-53 n relative to the
 * sum of magnitudes, far below f32's own precision for any n a tensor can
 * have), f64 sums in f64 over lanes and blocks (a partial pairwise scheme);
 * integer sums in i64, exactly. Every grouping above depends on the shape
 * only, never on the number of threads, so a result is bitwise the same
 * with 1 or 64 threads.
 */
#include "cpu_elementwise.h"

#include <math.h>
#include <string.h>

enum {
    RUN_BLOCK = 1 << 14, /* elements per partial sum of a split run */
    TILE = 1024,         /* columns per work item of an outer pass */
    BUF = 1024,          /* elements converted per step (>= TILE) */
    MIN_ITEMS = 16,      /* fewer work items than this: split the reduced dim */
    MAX_SPLIT = 32,      /* at most this many row blocks per outer work item */
    PAR_MIN = 1 << 16    /* below this many elements, one thread */
};

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* n <= BUF elements of src as doubles: src itself when already f64. */
static const double *as_f64(double *buf, const char *src, fl_dtype dt, int64_t n) {
    if (dt == FL_F64) return (const double *)src;
    if (dt == FL_F32) {
        const float *x = (const float *)src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) buf[i] = x[i];
        return buf;
    }
    if (dt == FL_BF16 || dt == FL_F16) { /* through f32: fl_convert's fast paths */
        float tmp[BUF];
        fl_convert(tmp, FL_F32, src, dt, n);
#pragma omp simd
        for (int64_t i = 0; i < n; i++) buf[i] = tmp[i];
        return buf;
    }
    fl_convert(buf, FL_F64, src, dt, n);
    return buf;
}

static const int64_t *as_i64(int64_t *buf, const char *src, fl_dtype dt, int64_t n) {
    if (dt == FL_I64) return (const int64_t *)src;
    fl_convert(buf, FL_I64, src, dt, n);
    return buf;
}

/* ---- sum ----------------------------------------------------------------------- */

typedef struct sum_pass {
    const char *src;
    fl_dtype sdt;
    char *dst;
    fl_dtype ddt;
    int64_t A, N, B;
    double divisor; /* the last pass of a mean divides; 1 otherwise */
} sum_pass;

/* The sum passes for one accumulator type T (double or int64_t). ACC is
 * T's dtype and AS the loader above. The 8 lanes of run_sum are written
 * out so the compiler turns them into vector adds without being allowed
 * to reassociate anything itself. */
#define DEFINE_SUM(SUF, T, ACC, AS)                                                          \
    static T run_sum_##SUF(const char *src, fl_dtype dt, int64_t n) {                       \
        size_t sz = fl_dtype_size(dt);                                                      \
        T l[8] = {0}, buf[BUF];                                                             \
        for (int64_t i = 0; i < n; i += BUF) {                                              \
            int64_t m = min64(BUF, n - i), j = 0;                                           \
            const T *v = AS(buf, src + (size_t)i * sz, dt, m);                              \
            for (; j + 8 <= m; j += 8) {                                                    \
                l[0] += v[j]; l[1] += v[j + 1]; l[2] += v[j + 2]; l[3] += v[j + 3];         \
                l[4] += v[j + 4]; l[5] += v[j + 5]; l[6] += v[j + 6]; l[7] += v[j + 7];     \
            }                                                                               \
            for (; j < m; j++) l[j & 7] += v[j];                                            \
        }                                                                                   \
        return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));           \
    }                                                                                       \
                                                                                            \
    /* acc[0, w) += rows [n0, n1) of columns [c0, c0 + w) of slice a. */                    \
    static void tile_sum_##SUF(const sum_pass *p, int64_t a, int64_t c0, int64_t w,         \
                               int64_t n0, int64_t n1, T *acc) {                            \
        size_t sz = fl_dtype_size(p->sdt);                                                  \
        T buf[BUF];                                                                         \
        for (int64_t j = 0; j < w; j++) acc[j] = 0;                                         \
        for (int64_t n = n0; n < n1; n++) {                                                 \
            const char *row = p->src + (size_t)((a * p->N + n) * p->B + c0) * sz;           \
            if (p->sdt == FL_F32) { /* the common case, converted as it is added */         \
                const float *x = (const float *)row;                                        \
                _Pragma("omp simd") for (int64_t j = 0; j < w; j++) acc[j] += (T)x[j];      \
                continue;                                                                   \
            }                                                                               \
            const T *v = AS(buf, row, p->sdt, w);                                           \
            _Pragma("omp simd") for (int64_t j = 0; j < w; j++) acc[j] += v[j];             \
        }                                                                                   \
    }                                                                                       \
                                                                                            \
    /* dst[off, off + w) = acc / divisor, converted (the common f32 and same-type       \
     * stores inline: a row-wise sum stores one value per row). */                          \
    static void store_##SUF(const sum_pass *p, int64_t off, T *acc, int64_t w) {            \
        if (p->divisor != 1)                                                                \
            for (int64_t j = 0; j < w; j++) acc[j] = (T)(acc[j] / p->divisor);              \
        char *d = p->dst + (size_t)off * fl_dtype_size(p->ddt);                             \
        if (p->ddt == ACC)                                                                  \
            memcpy(d, acc, (size_t)w * sizeof(T));                                          \
        else if (p->ddt == FL_F32)                                                          \
            for (int64_t j = 0; j < w; j++) ((float *)d)[j] = (float)acc[j];                \
        else                                                                                \
            fl_convert(d, p->ddt, acc, ACC, w);                                             \
    }                                                                                       \
                                                                                            \
    static int pass_##SUF(const sum_pass *p) {                                              \
        size_t sz = fl_dtype_size(p->sdt);                                                  \
        int64_t A = p->A, N = p->N, B = p->B;                                               \
        bool par = A * N * B >= PAR_MIN;                                                    \
        if (B == 1) {                                                                       \
            int64_t nb = N > RUN_BLOCK && A < MIN_ITEMS ? (N + RUN_BLOCK - 1) / RUN_BLOCK : 1; \
            if (nb == 1) {                                                                  \
                _Pragma("omp parallel for schedule(static) if (par)")                       \
                for (int64_t a = 0; a < A; a++) {                                           \
                    T s = run_sum_##SUF(p->src + (size_t)(a * N) * sz, p->sdt, N);          \
                    store_##SUF(p, a, &s, 1);                                               \
                }                                                                           \
                return FL_OK;                                                               \
            }                                                                               \
            T *part = malloc((size_t)(A * nb) * sizeof(T));                                 \
            if (!part) return fl_fail(FL_ERR_OOM, "sum: out of CPU memory for partial sums"); \
            _Pragma("omp parallel for schedule(static) if (par)")                           \
            for (int64_t item = 0; item < A * nb; item++) {                                 \
                int64_t a = item / nb, start = item % nb * RUN_BLOCK;                       \
                part[item] = run_sum_##SUF(p->src + (size_t)(a * N + start) * sz, p->sdt,   \
                                           min64(RUN_BLOCK, N - start));                    \
            }                                                                               \
            for (int64_t a = 0; a < A; a++) {                                               \
                T s = 0;                                                                    \
                for (int64_t k = 0; k < nb; k++) s += part[a * nb + k];                     \
                store_##SUF(p, a, &s, 1);                                                   \
            }                                                                               \
            free(part);                                                                     \
            return FL_OK;                                                                   \
        }                                                                                   \
        int64_t tiles = (B + TILE - 1) / TILE, items = A * tiles;                           \
        int64_t width = min64(B, TILE), rows = RUN_BLOCK / width > 0 ? RUN_BLOCK / width : 1; \
        int64_t nb = items < MIN_ITEMS && N > rows ? min64((N + rows - 1) / rows, MAX_SPLIT) : 1; \
        rows = (N + nb - 1) / nb;                                                           \
        if (nb == 1) {                                                                      \
            _Pragma("omp parallel for schedule(static) if (par)")                           \
            for (int64_t item = 0; item < items; item++) {                                  \
                int64_t a = item / tiles, c0 = item % tiles * TILE, w = min64(TILE, B - c0); \
                T acc[TILE];                                                                \
                tile_sum_##SUF(p, a, c0, w, 0, N, acc);                                     \
                store_##SUF(p, a * B + c0, acc, w);                                         \
            }                                                                               \
            return FL_OK;                                                                   \
        }                                                                                   \
        T *part = malloc((size_t)(items * nb * TILE) * sizeof(T));                          \
        if (!part) return fl_fail(FL_ERR_OOM, "sum: out of CPU memory for partial sums");  \
        _Pragma("omp parallel for schedule(static) if (par)")                               \
        for (int64_t job = 0; job < items * nb; job++) {                                    \
            int64_t item = job / nb, k = job % nb;                                          \
            int64_t a = item / tiles, c0 = item % tiles * TILE, w = min64(TILE, B - c0);    \
            tile_sum_##SUF(p, a, c0, w, k * rows, min64(N, (k + 1) * rows),                 \
                           part + job * TILE);                                              \
        }                                                                                   \
        for (int64_t item = 0; item < items; item++) {                                      \
            int64_t a = item / tiles, c0 = item % tiles * TILE, w = min64(TILE, B - c0);    \
            T *acc = part + item * nb * TILE;                                               \
            for (int64_t k = 1; k < nb; k++)                                                \
                for (int64_t j = 0; j < w; j++) acc[j] += acc[k * TILE + j];                \
            store_##SUF(p, a * B + c0, acc, w);                                             \
        }                                                                                   \
        free(part);                                                                         \
        return FL_OK;                                                                       \
    }

DEFINE_SUM(f64, double, FL_F64, as_f64)
DEFINE_SUM(i64, int64_t, FL_I64, as_i64)

int fl_cpu_sum(fl_tensor *out, const fl_tensor *in, const bool *reduce, double divisor) {
    if (out->numel == 0) return FL_OK;
    bool integer = !fl_dtype_is_float(in->dtype);
    /* Groups of merged dims, outermost first. */
    int64_t size[FL_MAX_DIMS];
    bool red[FL_MAX_DIMS], alive[FL_MAX_DIMS];
    int ng = 0;
    for (int d = 0; d < in->ndim; d++) {
        if (in->shape[d] == 1) continue;
        if (ng > 0 && red[ng - 1] == reduce[d]) {
            size[ng - 1] *= in->shape[d];
        } else {
            size[ng] = in->shape[d];
            red[ng] = reduce[d];
            alive[ng] = true;
            ng++;
        }
    }
    int n_red = 0;
    for (int g = 0; g < ng; g++) n_red += red[g];
    if (n_red == 0) { /* nothing of size > 1 reduced: one pass that converts */
        sum_pass p = {in->data, in->dtype, out->data, out->dtype, out->numel, 1, 1, divisor};
        return integer ? pass_i64(&p) : pass_f64(&p);
    }
    const char *src = in->data;
    fl_dtype sdt = in->dtype;
    char *temp = NULL;
    int rc = FL_OK;
    for (int g = ng - 1; g >= 0 && rc == FL_OK; g--) {
        if (!red[g]) continue;
        int64_t A = 1, B = 1;
        for (int h = 0; h < g; h++) A *= alive[h] ? size[h] : 1;
        for (int h = g + 1; h < ng; h++) B *= alive[h] ? size[h] : 1;
        bool last = --n_red == 0;
        fl_dtype ddt = last ? out->dtype : integer ? FL_I64 : FL_F64;
        char *dst = last ? out->data : malloc((size_t)(A * B > 0 ? A * B : 1) * 8);
        if (!dst) {
            rc = fl_fail(FL_ERR_OOM, "sum: out of CPU memory for partial sums");
            break;
        }
        sum_pass p = {src, sdt, dst, ddt, A, size[g], B, last ? divisor : 1.0};
        rc = integer ? pass_i64(&p) : pass_f64(&p);
        free(temp);
        temp = last ? NULL : dst;
        src = dst;
        sdt = ddt;
        alive[g] = false;
    }
    free(temp);
    return rc;
}

/* ---- max / min along one dim ------------------------------------------------------------- */

/* Is v a better pick than best? Strictly larger (smaller), or the first
 * NaN: a NaN beats every number and only an earlier NaN beats it. */
#define BETTER(is_max, v, best, ISNAN)                                                        \
    (((is_max) ? (v) > (best) : (v) < (best)) || (ISNAN(v) && !ISNAN(best)))
#define ISNAN_F64(v) isnan(v)
#define ISNAN_I64(v) ((void)(v), false)

typedef struct minmax_geom {
    bool is_max;
    const char *src;
    fl_dtype dt;
    size_t sz;
    int64_t A, N, B;
    char *values;
    int64_t *indices;
} minmax_geom;

#define DEFINE_MINMAX(SUF, T, AS, ISNAN)                                                     \
    /* Best of elements [n0, n1) of run a (B == 1): key and index. */                       \
    static void run_best_##SUF(const minmax_geom *g, int64_t a, int64_t n0, int64_t n1,     \
                               T *key, int64_t *idx) {                                      \
        T buf[BUF], best = 0;                                                               \
        int64_t at = n0;                                                                    \
        for (int64_t i = n0; i < n1; i += BUF) {                                            \
            int64_t m = min64(BUF, n1 - i);                                                 \
            const T *v = AS(buf, g->src + (size_t)(a * g->N + i) * g->sz, g->dt, m);        \
            for (int64_t j = 0; j < m; j++) {                                               \
                if (i + j == n0 || BETTER(g->is_max, v[j], best, ISNAN)) {                  \
                    best = v[j];                                                            \
                    at = i + j;                                                             \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        *key = best;                                                                        \
        *idx = at;                                                                          \
    }                                                                                       \
                                                                                            \
    static int minmax_##SUF(const minmax_geom *g) {                                         \
        int64_t A = g->A, N = g->N, B = g->B;                                               \
        bool par = A * N * B >= PAR_MIN;                                                    \
        if (B == 1) {                                                                       \
            int64_t nb = N > RUN_BLOCK && A < MIN_ITEMS ? (N + RUN_BLOCK - 1) / RUN_BLOCK : 1; \
            if (nb == 1) { /* one run per row, straight to the outputs */                   \
                _Pragma("omp parallel for schedule(static) if (par)")                       \
                for (int64_t a = 0; a < A; a++) {                                           \
                    T key;                                                                  \
                    run_best_##SUF(g, a, 0, N, &key, g->indices + a);                       \
                    memcpy(g->values + (size_t)a * g->sz,                                   \
                           g->src + (size_t)(a * N + g->indices[a]) * g->sz, g->sz);        \
                }                                                                           \
                return FL_OK;                                                               \
            }                                                                               \
            T *keys = malloc((size_t)(A * nb) * sizeof(T));                                 \
            int64_t *at = malloc((size_t)(A * nb) * sizeof(int64_t));                       \
            if (!keys || !at) {                                                             \
                free(keys);                                                                 \
                free(at);                                                                   \
                return fl_fail(FL_ERR_OOM, "max: out of CPU memory for partial results");  \
            }                                                                               \
            _Pragma("omp parallel for schedule(static) if (par)")                           \
            for (int64_t item = 0; item < A * nb; item++) {                                 \
                int64_t a = item / nb, n0 = item % nb * RUN_BLOCK;                          \
                run_best_##SUF(g, a, n0, min64(N, n0 + RUN_BLOCK), keys + item, at + item); \
            }                                                                               \
            for (int64_t a = 0; a < A; a++) {                                               \
                int64_t k = a * nb, pick = k; /* blocks in order keep the first pick */     \
                for (k = a * nb + 1; k < (a + 1) * nb; k++)                                 \
                    if (BETTER(g->is_max, keys[k], keys[pick], ISNAN)) pick = k;            \
                g->indices[a] = at[pick];                                                   \
                memcpy(g->values + (size_t)a * g->sz,                                       \
                       g->src + (size_t)(a * N + at[pick]) * g->sz, g->sz);                 \
            }                                                                               \
            free(keys);                                                                     \
            free(at);                                                                       \
            return FL_OK;                                                                   \
        }                                                                                   \
        int64_t tiles = (B + TILE - 1) / TILE;                                              \
        _Pragma("omp parallel for schedule(static) if (par)")                               \
        for (int64_t item = 0; item < A * tiles; item++) {                                  \
            int64_t a = item / tiles, c0 = item % tiles * TILE, w = min64(TILE, B - c0);    \
            T buf[BUF], best[TILE];                                                         \
            int64_t *at = g->indices + a * B + c0;                                          \
            for (int64_t n = 0; n < N; n++) {                                               \
                const T *v = AS(buf, g->src + (size_t)((a * N + n) * B + c0) * g->sz, g->dt, w); \
                for (int64_t j = 0; j < w; j++) {                                           \
                    if (n == 0 || BETTER(g->is_max, v[j], best[j], ISNAN)) {                \
                        best[j] = v[j];                                                     \
                        at[j] = n;                                                          \
                    }                                                                       \
                }                                                                           \
            }                                                                               \
            for (int64_t j = 0; j < w; j++)                                                 \
                memcpy(g->values + (size_t)(a * B + c0 + j) * g->sz,                        \
                       g->src + (size_t)((a * N + at[j]) * B + c0 + j) * g->sz, g->sz);     \
        }                                                                                   \
        return FL_OK;                                                                       \
    }

DEFINE_MINMAX(f64, double, as_f64, ISNAN_F64)
DEFINE_MINMAX(i64, int64_t, as_i64, ISNAN_I64)

/* [A, N, B] around dim of a shape. */
static void split_at(const fl_tensor *t, int dim, int64_t *A, int64_t *N, int64_t *B) {
    *A = *B = *N = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (d < dim) *A *= t->shape[d];
        else if (d == dim) *N = t->shape[d];
        else *B *= t->shape[d];
    }
}

int fl_cpu_minmax(bool is_max, fl_tensor *values, fl_tensor *indices, const fl_tensor *in,
                  int dim) {
    minmax_geom g = {is_max, in->data, in->dtype, fl_dtype_size(in->dtype), 0, 0, 0,
                     values->data, indices->data};
    split_at(in, dim, &g.A, &g.N, &g.B);
    if (g.A * g.B == 0) return FL_OK;
    return fl_dtype_is_float(in->dtype) ? minmax_f64(&g) : minmax_i64(&g);
}

int fl_cpu_scatter_dim(fl_tensor *out, const fl_tensor *src, const fl_tensor *indices, int dim) {
    int64_t A, N, B;
    split_at(out, dim, &A, &N, &B);
    size_t osz = fl_dtype_size(out->dtype), ssz = fl_dtype_size(src->dtype);
    memset(out->data, 0, (size_t)out->numel * osz);
    const int64_t *idx = indices->data;
    int64_t bad = 0;
#pragma omp parallel for schedule(static) if (A * B >= PAR_MIN) reduction(+ : bad)
    for (int64_t e = 0; e < A * B; e++) {
        int64_t n = idx[e];
        if (n < 0 || n >= N) {
            bad++;
            continue;
        }
        char *o = (char *)out->data + (size_t)((e / B * N + n) * B + e % B) * osz;
        const char *s = (const char *)src->data + (size_t)e * ssz;
        if (out->dtype == src->dtype)
            memcpy(o, s, osz);
        else
            fl_store_f64(o, out->dtype, fl_load_f64(s, src->dtype));
    }
    if (bad)
        return fl_fail(FL_ERR_ARG, "max/min backward: %lld saved indices out of range [0, %lld) "
                                   "(were the indices modified in place?)",
                       (long long)bad, (long long)N);
    return FL_OK;
}
