/*
 * cpu_embedding.c: CPU kernels of embedding: a row gather, and its backward,
 * which adds gradient rows into the rows of the weight's gradient.
 *
 * The backward must not race when an id repeats (it always does: common
 * tokens). Instead of atomics the (id, position) pairs are sorted, so all
 * rows for one id are adjacent; each (id, column block) is then summed by
 * one thread in position order, starting from the gradient's row (zeros,
 * or a tied weight's other gradient), and written once. Deterministic, and
 * the sum is accumulated in double before the one rounding to the weight's
 * dtype (bf16 gradients of frequent tokens keep their precision).
 */
#include "cpu_iter.h"
#include "cpu_linear.h"
#include "shape.h"

#include <stdlib.h>
#include <string.h>

enum { PARALLEL_MIN = 1 << 16 };

static int64_t id_at(const fl_tensor *ids, int64_t i) {
    return ids->dtype == FL_I64 ? ((const int64_t *)ids->data)[i]
                                : ((const int32_t *)ids->data)[i];
}

int fl_cpu_embedding(fl_tensor *out, const fl_tensor *ids, const fl_tensor *w) {
    int64_t n = ids->numel, V = w->shape[0], D = w->shape[1];
    /* Every id is checked before anything is written. */
    for (int64_t i = 0; i < n; i++) {
        int64_t id = id_at(ids, i);
        if (id < 0 || id >= V) {
            char s[128];
            return fl_fail(FL_ERR_ARG,
                           "embedding: id %lld (element %lld of the ids) is out of range for a "
                           "weight of %lld rows (shape %s)",
                           (long long)id, (long long)i, (long long)V,
                           fl_shape_str(w, s, sizeof s));
        }
    }
    size_t es = fl_dtype_size(w->dtype);
    const char *wb = w->data;
    char *ob = out->data;
#pragma omp parallel for schedule(static) if (n * D >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const char *src = wb + id_at(ids, i) * w->stride[0] * (int64_t)es;
        char *dst = ob + i * D * (int64_t)es;
        if (w->stride[1] == 1) memcpy(dst, src, (size_t)D * es);
        else fl_cpu_gather(dst, src, w->stride[1], D, es);
    }
    return FL_OK;
}

typedef struct entry {
    int64_t id, pos;
} entry;

static int by_id_then_pos(const void *x, const void *y) {
    const entry *a = x, *b = y;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

int fl_cpu_embedding_backward(fl_tensor *gw, const fl_tensor *ids, const fl_tensor *gy,
                              int64_t padding_idx) {
    enum { BLOCK = FL_CPU_SCRATCH };
    int64_t n = ids->numel, D = gw->shape[1];
    if (n == 0 || D == 0) return FL_OK;
    entry *e = malloc((size_t)n * sizeof *e);
    int64_t *starts = malloc((size_t)(n + 1) * sizeof *starts);
    if (!e || !starts) {
        free(e);
        free(starts);
        return fl_fail(FL_ERR_OOM, "embedding backward: out of CPU memory for %lld ids",
                       (long long)n);
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t id = id_at(ids, i);
        if (id != padding_idx) e[m++] = (entry){id, i};
    }
    qsort(e, (size_t)m, sizeof *e, by_id_then_pos);
    int64_t groups = 0;
    for (int64_t i = 0; i < m; i++)
        if (i == 0 || e[i].id != e[i - 1].id) starts[groups++] = i;
    starts[groups] = m;
    int64_t nblocks = (D + BLOCK - 1) / BLOCK;
    fl_dtype dt = gy->dtype;
    size_t es = fl_dtype_size(dt), ws = fl_dtype_size(gw->dtype);
    const char *gb = gy->data;
    char *wb = gw->data;
#pragma omp parallel for schedule(dynamic, 8) if (m * D >= PARALLEL_MIN)
    for (int64_t item = 0; item < groups * nblocks; item++) {
        int64_t g = item / nblocks, c0 = (item % nblocks) * BLOCK;
        int64_t len = D - c0 < BLOCK ? D - c0 : BLOCK;
        double acc[BLOCK], tmp[BLOCK];
        char *row = wb + (e[starts[g]].id * D + c0) * (int64_t)ws;
        fl_cpu_load(acc, FL_F64, row, gw->dtype, 1, len);
        for (int64_t r = starts[g]; r < starts[g + 1]; r++) {
            fl_cpu_load(tmp, FL_F64, gb + (e[r].pos * D + c0) * (int64_t)es, dt, 1, len);
            for (int64_t j = 0; j < len; j++) acc[j] += tmp[j];
        }
        fl_cpu_store(row, gw->dtype, 1, acc, FL_F64, len);
    }
    free(e);
    free(starts);
    return FL_OK;
}
