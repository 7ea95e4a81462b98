/*
 * cpu_fused_rows.h: the hot loops over one row that the fused kernels
 * share (max, exp-and-sum, exp-affine), written for one compute type and
 * included by cpu_fused_gen.h and cpu_attention_gen.h under their R, FN
 * and EXP. No include guard: each instantiation defines its own copies.
 *
 * Each loop is a family of FL_ISA_CLONES (an AVX2+FMA variant next to the
 * baseline build, run at the level in force: [Note: ISA clones]; no
 * AVX-512 one, cpu_fused_math.h says why): the row kernels call them once
 * per row, so the dispatch costs nothing, while the loops around OpenMP
 * regions would not take a target (GCC outlines those regions).
 *
 * The f32 instantiation (FL_ROWS_F32 defined by the includer where
 * cpu_rows_avx512.c is built) hands each loop to its hand-written
 * version at the level in force (fl_cpu_row_loops: AVX-512, or AVX2 +
 * FMA at avx2), so its variants' own loops run only below avx2 or where
 * those are not built.
 */

/* max over x[0, n) (-inf for n == 0). A nan may be skipped here; it
 * still reaches the result through exp(nan - max). */
FL_ISA_BODY R FL_ISA_BODY_NAME(FN(row_max))(const R *x, int64_t n) {
#ifdef FL_ROWS_F32
    const fl_row_loops *loops = fl_cpu_row_loops();
    if (loops) return loops->max(x, n);
#endif
    R m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
FL_ISA_CLONES(AVX2, R, FN(row_max), (const R *x, int64_t n), (x, n))

/* sum of exp(x[i] - shift); the terms are also stored to dst (which may
 * be x) unless dst is NULL. */
FL_ISA_BODY R FL_ISA_BODY_NAME(FN(row_exp))(R *dst, const R *x, int64_t n, R shift) {
#ifdef FL_ROWS_F32
    const fl_row_loops *loops = fl_cpu_row_loops();
    if (loops) return loops->exp(dst, x, n, shift);
#endif
    R sum = 0;
    if (dst) {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; i++) {
            R e = EXP(x[i] - shift);
            dst[i] = e;
            sum += e;
        }
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; i++) sum += EXP(x[i] - shift);
    }
    return sum;
}
FL_ISA_CLONES(AVX2, R, FN(row_exp), (R *dst, const R *x, int64_t n, R shift), (dst, x, n, shift))

/* dst[i] = a * exp(x[i] - shift) + b, plus c[i] when c is not NULL. */
FL_ISA_BODY void FL_ISA_BODY_NAME(FN(row_exp_affine))(R *dst, const R *x, int64_t n, R shift,
                                                       R a, R b, const R *c) {
#ifdef FL_ROWS_F32
    const fl_row_loops *loops = fl_cpu_row_loops();
    if (loops) {
        loops->exp_affine(dst, x, n, shift, a, b, c);
        return;
    }
#endif
    if (c) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = a * EXP(x[i] - shift) + b + c[i];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = a * EXP(x[i] - shift) + b;
    }
}
FL_ISA_CLONES_VOID(AVX2, FN(row_exp_affine),
                   (R *dst, const R *x, int64_t n, R shift, R a, R b, const R *c),
                   (dst, x, n, shift, a, b, c))
