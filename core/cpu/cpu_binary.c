/*
 * cpu_binary.c: CPU kernels of the elementwise binary family.
 *
 * Values are computed in f32 (f64 for f64 outputs, int64 for integer
 * outputs): chunks are loaded and converted to that type, combined, and
 * converted back, so bf16/f16 and mixed dtypes need no kernels of their own.
 * The common all-f32 dense case skips the conversion buffers.
 */
#include "cpu_iter.h"
#include "cpu_rows_avx512.h"
#include "cpu_kernels.h"

#include <string.h>

typedef struct binary_ctx {
    int op;
    double alpha;
    fl_dtype out_dtype, a_dtype, b_dtype, compute;
} binary_ctx;

#define BINARY_LOOP(T, o, x, y, n, op, alpha)                                                  \
    do {                                                                                       \
        switch (op) {                                                                          \
        case FL_ADD: for (int64_t i = 0; i < n; i++) o[i] = x[i] + y[i]; break;                \
        case FL_SUB: for (int64_t i = 0; i < n; i++) o[i] = x[i] - y[i]; break;                \
        case FL_MUL: for (int64_t i = 0; i < n; i++) o[i] = x[i] * y[i]; break;                \
        case FL_DIV: for (int64_t i = 0; i < n; i++) o[i] = x[i] / y[i]; break;                \
        case FL_AXPY: {                                                                        \
            T al = (T)(alpha);                                                                 \
            for (int64_t i = 0; i < n; i++) o[i] = x[i] + al * y[i];                           \
            break;                                                                             \
        }                                                                                      \
        }                                                                                      \
    } while (0)

/* Integer division is done by the caller promoting to float; here it is
 * only reached for int outputs of add/sub/mul/axpy. */
static void compute(int op, double alpha, fl_dtype t, void *o, const void *x, const void *y,
                    int64_t n) {
    switch (t) {
    case FL_F32: {
        float *fo = o;
        const float *fx = x, *fy = y;
        BINARY_LOOP(float, fo, fx, fy, n, op, alpha);
        break;
    }
    case FL_F64: {
        double *fo = o;
        const double *fx = x, *fy = y;
        BINARY_LOOP(double, fo, fx, fy, n, op, alpha);
        break;
    }
    case FL_I64: {
        int64_t *io = o;
        const int64_t *ix = x, *iy = y;
        if (op == FL_DIV) {
            for (int64_t i = 0; i < n; i++) io[i] = iy[i] ? ix[i] / iy[i] : 0;
        } else {
            BINARY_LOOP(int64_t, io, ix, iy, n, op, alpha);
        }
        break;
    }
    default: FL_ASSERT(!"compute dtype");
    }
}

static void binary_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                         int64_t index) {
    (void)index;
    const binary_ctx *c = vctx;
    if (c->compute == c->out_dtype && c->a_dtype == c->out_dtype && c->b_dtype == c->out_dtype &&
        inner[0] == 1 && inner[1] == 1 && inner[2] == 1) {
        compute(c->op, c->alpha, c->compute, ptrs[0], ptrs[1], ptrs[2], count);
        return;
    }
#if FL_ROWS_AVX512_BUILD
    /* bf16 read and written as such (cpu_rows_avx512.c), same bits */
    if (c->out_dtype == FL_BF16 && c->a_dtype == FL_BF16 && c->b_dtype == FL_BF16 &&
        inner[0] == 1 && inner[1] == 1 && inner[2] == 1 && fl_cpu_avx512()) {
        fl_avx512_binary_bf16(c->op, c->alpha, (uint16_t *)ptrs[0], (const uint16_t *)ptrs[1],
                              (const uint16_t *)ptrs[2], count);
        return;
    }
#endif
    _Alignas(8) char x[FL_CPU_SCRATCH * 8], y[FL_CPU_SCRATCH * 8], o[FL_CPU_SCRATCH * 8];
    size_t so = fl_dtype_size(c->out_dtype), sa = fl_dtype_size(c->a_dtype),
           sb = fl_dtype_size(c->b_dtype);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_cpu_load(x, c->compute, ptrs[1] + i * inner[1] * (int64_t)sa, c->a_dtype, inner[1], n);
        fl_cpu_load(y, c->compute, ptrs[2] + i * inner[2] * (int64_t)sb, c->b_dtype, inner[2], n);
        compute(c->op, c->alpha, c->compute, o, x, y, n);
        fl_cpu_store(ptrs[0] + i * inner[0] * (int64_t)so, c->out_dtype, inner[0], o, c->compute, n);
    }
}

static fl_dtype compute_dtype(fl_dtype out) {
    if (out == FL_F64) return FL_F64;
    if (fl_dtype_is_float(out)) return FL_F32;
    return FL_I64;
}

static int cpu_binary(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b,
                      double alpha) {
    binary_ctx c = {op, alpha, out->dtype, a->dtype, b->dtype, compute_dtype(out->dtype)};
    const fl_tensor *ts[3] = {out, a, b};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 3, ts);
    fl_cpu_iter_run(&it, binary_chunk, &c);
    return FL_OK;
}

const fl_binary_kernels fl_cpu_binary_kernels = {
    .binary = cpu_binary,
};
