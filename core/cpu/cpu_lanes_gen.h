/*
 * cpu_lanes_gen.h: how the CPU's row kernels (cpu_norm.c, cpu_softmax.c,
 * cpu_loss.c, cpu_rotary.c) read and write a lane, written once for a
 * compute type and included with each kernel header for R = float (f32,
 * f16, bf16 tensors) and R = double (f64 tensors, where gradient checks
 * need the precision). The includer defines:
 *   R       the compute type           RT  its fl_dtype
 *   FN(x)   x with a type suffix       EXP the exp to use on R
 *
 * Every kernel walks lanes (rows along the reduced dim) in parallel: a
 * lane is read into R (in place when the tensor is already R and dense
 * along the lane, else converted into per-thread scratch), computed, and
 * written out once. Sums of products are accumulated in double.
 */

#include "cpu_fused_rows.h"

/* A lane of n elements at p (dtype dt, element stride st) as R: p itself
 * when it already is, else converted into buf. */
static inline const R *FN(lane_in)(const char *p, fl_dtype dt, int64_t st, int64_t n, R *buf) {
    if (dt == RT && st == 1) return (const R *)p;
    size_t es = fl_dtype_size(dt);
    for (int64_t i = 0; i < n; i += FL_CPU_SCRATCH) {
        int64_t c = n - i < FL_CPU_SCRATCH ? n - i : FL_CPU_SCRATCH;
        fl_cpu_load(buf + i, RT, p + i * st * (int64_t)es, dt, st, c);
    }
    return buf;
}

/* Where to compute an output lane: the tensor's memory when it is R and
 * dense along the lane, else buf (then FN(lane_out) writes it back). */
static inline R *FN(lane_dst)(char *p, fl_dtype dt, int64_t st, R *buf) {
    return dt == RT && st == 1 ? (R *)p : buf;
}

static inline void FN(lane_out)(char *p, fl_dtype dt, int64_t st, int64_t n, const R *src) {
    if ((const void *)src == (const void *)p) return;
    size_t es = fl_dtype_size(dt);
    for (int64_t i = 0; i < n; i += FL_CPU_SCRATCH) {
        int64_t c = n - i < FL_CPU_SCRATCH ? n - i : FL_CPU_SCRATCH;
        fl_cpu_store(p + i * st * (int64_t)es, dt, st, src + i, RT, c);
    }
}

/* A whole 1-d parameter (weight, bias) as a fresh dense R array. */
static inline R *FN(param)(const fl_tensor *t, int64_t n) {
    if (!t) return NULL;
    R *dst = malloc((size_t)(n ? n : 1) * sizeof(R));
    if (!dst) return NULL;
    const R *src = FN(lane_in)((const char *)t->data, t->dtype, t->stride[0], n, dst);
    if (src != dst) memcpy(dst, src, (size_t)n * sizeof(R));
    return dst;
}

/* Per-thread sums of parameter gradients (dweight, dbias): one row of n
 * doubles per thread, summed in thread order at the end. */
static inline void FN(reduce_partials)(fl_tensor *dst, const double *parts, int nthreads, int64_t n) {
    double *acc = (double *)parts; /* row 0 collects the others */
    for (int t = 1; t < nthreads; t++)
        for (int64_t i = 0; i < n; i++) acc[i] += parts[(int64_t)t * n + i];
    fl_convert(dst->data, dst->dtype, acc, FL_F64, n);
}
