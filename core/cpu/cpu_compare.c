/*
 * cpu_compare.c: CPU kernels of the comparisons (bool results) and of
 * where(cond, a, b), through the strided iterator (broadcast operands have
 * stride 0).
 *
 * Comparisons load both operands as i64 when both are integers (exact for
 * every integer dtype) and as f64 otherwise (exact for every float, and
 * for integers up to 2^53); operands of one common dtype compare in place.
 * where does no arithmetic: whole elements are selected, converted to the
 * output dtype first only when a or b has another dtype.
 */
#include "cpu_elementwise.h"
#include "cpu_iter.h"

#include <string.h>

typedef struct compare_ctx {
    int op;
    fl_dtype a_dtype, b_dtype, compute;
} compare_ctx;

#define COMPARE_LOOP(T, o, x, y, n, op)                                                      \
    do {                                                                                    \
        const T *xv = (const T *)(x), *yv = (const T *)(y);                                 \
        switch (op) {                                                                       \
        case FL_EQ: for (int64_t k = 0; k < n; k++) o[k] = xv[k] == yv[k]; break;           \
        case FL_NE: for (int64_t k = 0; k < n; k++) o[k] = xv[k] != yv[k]; break;           \
        case FL_LT: for (int64_t k = 0; k < n; k++) o[k] = xv[k] < yv[k]; break;            \
        case FL_LE: for (int64_t k = 0; k < n; k++) o[k] = xv[k] <= yv[k]; break;           \
        case FL_GT: for (int64_t k = 0; k < n; k++) o[k] = xv[k] > yv[k]; break;            \
        case FL_GE: for (int64_t k = 0; k < n; k++) o[k] = xv[k] >= yv[k]; break;           \
        default: FL_ASSERT(!"compare op");                                                  \
        }                                                                                   \
    } while (0)

/* Same-dtype operands compare in place, strided, with no conversion (the
 * common case: scores against a threshold, labels against predictions). */
#define STRIDED_REL(REL) for (int64_t k = 0; k < n; k++) o[k * so] = xv[k * sx] REL yv[k * sy]
#define COMPARE_STRIDED(T, o, so, x, sx, y, sy, n, op)                                       \
    do {                                                                                    \
        const T *xv = (const T *)(x), *yv = (const T *)(y);                                 \
        switch (op) {                                                                       \
        case FL_EQ: STRIDED_REL(==); break;                                                 \
        case FL_NE: STRIDED_REL(!=); break;                                                 \
        case FL_LT: STRIDED_REL(<); break;                                                  \
        case FL_LE: STRIDED_REL(<=); break;                                                 \
        case FL_GT: STRIDED_REL(>); break;                                                  \
        case FL_GE: STRIDED_REL(>=); break;                                                 \
        default: FL_ASSERT(!"compare op");                                                  \
        }                                                                                   \
    } while (0)

static bool compare_direct(const compare_ctx *c, char *const *ptrs, const int64_t *inner,
                           int64_t n) {
    if (c->a_dtype != c->b_dtype) return false;
    uint8_t *o = (uint8_t *)ptrs[0];
    const char *x = ptrs[1], *y = ptrs[2];
    int64_t so = inner[0], sx = inner[1], sy = inner[2];
    switch (c->a_dtype) {
    case FL_F32: COMPARE_STRIDED(float, o, so, x, sx, y, sy, n, c->op); return true;
    case FL_F64: COMPARE_STRIDED(double, o, so, x, sx, y, sy, n, c->op); return true;
    case FL_I64: COMPARE_STRIDED(int64_t, o, so, x, sx, y, sy, n, c->op); return true;
    case FL_I32: COMPARE_STRIDED(int32_t, o, so, x, sx, y, sy, n, c->op); return true;
    default: return false;
    }
}

static void compare_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                          int64_t index) {
    (void)index;
    const compare_ctx *c = vctx;
    if (compare_direct(c, ptrs, inner, count)) return;
    _Alignas(8) char x[FL_CPU_SCRATCH * 8], y[FL_CPU_SCRATCH * 8];
    uint8_t o[FL_CPU_SCRATCH];
    int64_t sa = (int64_t)fl_dtype_size(c->a_dtype), sb = (int64_t)fl_dtype_size(c->b_dtype);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_cpu_load(x, c->compute, ptrs[1] + i * inner[1] * sa, c->a_dtype, inner[1], n);
        fl_cpu_load(y, c->compute, ptrs[2] + i * inner[2] * sb, c->b_dtype, inner[2], n);
        if (c->compute == FL_I64)
            COMPARE_LOOP(int64_t, o, x, y, n, c->op);
        else
            COMPARE_LOOP(double, o, x, y, n, c->op);
        fl_cpu_store(ptrs[0] + i * inner[0], FL_BOOL, inner[0], o, FL_BOOL, n);
    }
}

int fl_cpu_compare(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b) {
    bool integers = !fl_dtype_is_float(a->dtype) && !fl_dtype_is_float(b->dtype);
    compare_ctx c = {op, a->dtype, b->dtype, integers ? FL_I64 : FL_F64};
    const fl_tensor *ts[3] = {out, a, b};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 3, ts);
    fl_cpu_iter_run(&it, compare_chunk, &c);
    return FL_OK;
}

/* ---- where ----------------------------------------------------------------------------- */

typedef struct where_ctx {
    fl_dtype out_dtype, a_dtype, b_dtype;
} where_ctx;

#define SELECT(T, o, cnd, x, y, n)                                                           \
    do {                                                                                    \
        T *ov = (T *)(o);                                                                   \
        const T *xv = (const T *)(x), *yv = (const T *)(y);                                 \
        for (int64_t k = 0; k < n; k++) ov[k] = cnd[k] ? xv[k] : yv[k];                     \
    } while (0)

/* o = cond ? a : b over strided operands of one element size. */
#define SELECT_STRIDED(T, ptrs, inner, n)                                                    \
    do {                                                                                    \
        T *ov = (T *)ptrs[0];                                                               \
        const uint8_t *cv = (const uint8_t *)ptrs[1];                                       \
        const T *xv = (const T *)ptrs[2], *yv = (const T *)ptrs[3];                         \
        for (int64_t k = 0; k < n; k++)                                                     \
            ov[k * inner[0]] = cv[k * inner[1]] ? xv[k * inner[2]] : yv[k * inner[3]];      \
    } while (0)

static void where_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                        int64_t index) {
    (void)index;
    const where_ctx *c = vctx;
    if (c->a_dtype == c->out_dtype && c->b_dtype == c->out_dtype) { /* no conversion */
        switch (fl_dtype_size(c->out_dtype)) {
        case 1: SELECT_STRIDED(uint8_t, ptrs, inner, count); return;
        case 2: SELECT_STRIDED(uint16_t, ptrs, inner, count); return;
        case 4: SELECT_STRIDED(uint32_t, ptrs, inner, count); return;
        case 8: SELECT_STRIDED(uint64_t, ptrs, inner, count); return;
        default: FL_ASSERT(!"element size");
        }
    }
    _Alignas(8) char x[FL_CPU_SCRATCH * 8], y[FL_CPU_SCRATCH * 8], o[FL_CPU_SCRATCH * 8];
    uint8_t cond[FL_CPU_SCRATCH];
    int64_t so = (int64_t)fl_dtype_size(c->out_dtype), sa = (int64_t)fl_dtype_size(c->a_dtype),
            sb = (int64_t)fl_dtype_size(c->b_dtype);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_cpu_gather(cond, ptrs[1] + i * inner[1], inner[1], n, 1);
        fl_cpu_load(x, c->out_dtype, ptrs[2] + i * inner[2] * sa, c->a_dtype, inner[2], n);
        fl_cpu_load(y, c->out_dtype, ptrs[3] + i * inner[3] * sb, c->b_dtype, inner[3], n);
        switch (so) {
        case 1: SELECT(uint8_t, o, cond, x, y, n); break;
        case 2: SELECT(uint16_t, o, cond, x, y, n); break;
        case 4: SELECT(uint32_t, o, cond, x, y, n); break;
        case 8: SELECT(uint64_t, o, cond, x, y, n); break;
        default: FL_ASSERT(!"element size");
        }
        fl_cpu_store(ptrs[0] + i * inner[0] * so, c->out_dtype, inner[0], o, c->out_dtype, n);
    }
}

int fl_cpu_where(fl_tensor *out, const fl_tensor *cond, const fl_tensor *a, const fl_tensor *b) {
    where_ctx c = {out->dtype, a->dtype, b->dtype};
    const fl_tensor *ts[4] = {out, cond, a, b};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 4, ts);
    fl_cpu_iter_run(&it, where_chunk, &c);
    return FL_OK;
}
