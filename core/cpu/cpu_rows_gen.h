/*
 * cpu_rows_gen.h: the row loops of cpu_fused_rows.h (max, exp-and-sum,
 * exp-affine) on f32 rows and on bf16 rows (cross-entropy's logits),
 * written once over the vector width and included by cpu_rows_avx512.c
 * once per width, inside a `#pragma GCC target` region for it. The
 * includer defines W (lanes), VEC, FN (the names' prefix), and:
 *   LOAD(p), STORE(p, x)                      W floats
 *   LOAD_PART(p, left, missing)               lanes below `left` (< W) from
 *                                             p, the others from `missing`
 *   STORE_PART(p, left, x), KEEP(left, x)     the lanes below `left`
 *                                             stored; kept, the rest 0
 *   LOAD_BF16(p), LOAD_BF16_PART(p, left)     bf16 bits as f32 (missing 0)
 *   STORE_BF16(p, x), STORE_BF16_PART(p, left, x)
 *                                             rounded as fl_convert rounds
 *   SUB_LANE(y, lane, v)                      y with v taken off one lane
 *   SET1, ADD, SUB, MAX, FMADD, EXP (fl_fast_expf's arithmetic),
 *   REDUCE_ADD, REDUCE_MAX
 * and undefines them after. Every loop starts at the row's first element
 * whatever its address and takes only the tail in part ([Note: masked
 * loads stall the prefetcher]), so a row's result depends on its values
 * and length only.
 */

float FN(row_max)(const float *x, int64_t n) {
    VEC m = SET1(-INFINITY);
    int64_t i = 0;
    for (; i + W <= n; i += W) m = MAX(m, LOAD(x + i));
    if (i < n) m = MAX(m, LOAD_PART(x + i, n - i, m));
    return REDUCE_MAX(m);
}

float FN(row_exp)(float *dst, const float *x, int64_t n, float shift) {
    VEC sum = SET1(0.0f), s = SET1(shift);
    int64_t i = 0;
    for (; i + W <= n; i += W) {
        VEC e = EXP(SUB(LOAD(x + i), s));
        if (dst) STORE(dst + i, e);
        sum = ADD(sum, e);
    }
    if (i < n) {
        VEC e = KEEP(n - i, EXP(SUB(LOAD_PART(x + i, n - i, s), s)));
        if (dst) STORE_PART(dst + i, n - i, e);
        sum = ADD(sum, e);
    }
    return REDUCE_ADD(sum);
}

void FN(row_exp_affine)(float *dst, const float *x, int64_t n, float shift, float a, float b,
                        const float *c) {
    VEC s = SET1(shift), va = SET1(a), vb = SET1(b);
    int64_t i = 0;
    for (; i + W <= n; i += W) {
        VEC y = FMADD(va, EXP(SUB(LOAD(x + i), s)), vb);
        if (c) y = ADD(y, LOAD(c + i));
        STORE(dst + i, y);
    }
    if (i < n) {
        VEC y = FMADD(va, EXP(SUB(LOAD_PART(x + i, n - i, s), s)), vb);
        if (c) y = ADD(y, LOAD_PART(c + i, n - i, SET1(0.0f)));
        STORE_PART(dst + i, n - i, y);
    }
}

/* The same three loops on a row of bf16 values (cross-entropy's logits):
 * each lane converted exactly to f32, then the f32 loops' arithmetic, so
 * results are those of converting the row first. */
float FN(row_max_bf16)(const uint16_t *x, int64_t n) {
    VEC m = SET1(-INFINITY);
    int64_t i = 0;
    for (; i + W <= n; i += W) m = MAX(m, LOAD_BF16(x + i));
    if (i < n) m = MAX(m, KEEP_OR(n - i, LOAD_BF16_PART(x + i, n - i), m));
    return REDUCE_MAX(m);
}

float FN(row_exp_sum_bf16)(const uint16_t *x, int64_t n, float shift) {
    VEC sum = SET1(0.0f), s = SET1(shift);
    int64_t i = 0;
    for (; i + W <= n; i += W) sum = ADD(sum, EXP(SUB(LOAD_BF16(x + i), s)));
    if (i < n) sum = ADD(sum, KEEP(n - i, EXP(SUB(LOAD_BF16_PART(x + i, n - i), s))));
    return REDUCE_ADD(sum);
}

void FN(row_exp_affine_bf16)(uint16_t *dst, const uint16_t *x, int64_t n, float shift, float a,
                             float b, int64_t at, float minus) {
    VEC s = SET1(shift), va = SET1(a), vb = SET1(b), vm = SET1(minus);
    for (int64_t i = 0; i < n; i += W) {
        bool part = n - i < W;
        VEC y = FMADD(va, EXP(SUB(part ? LOAD_BF16_PART(x + i, n - i) : LOAD_BF16(x + i), s)), vb);
        if (at >= i && at < i + W) y = SUB_LANE(y, at - i, vm);
        if (part)
            STORE_BF16_PART(dst + i, n - i, y);
        else
            STORE_BF16(dst + i, y);
    }
}

#undef W
#undef VEC
#undef FN
#undef LOAD
#undef STORE
#undef LOAD_PART
#undef STORE_PART
#undef KEEP
#undef KEEP_OR
#undef LOAD_BF16
#undef LOAD_BF16_PART
#undef STORE_BF16
#undef STORE_BF16_PART
#undef SUB_LANE
#undef SET1
#undef ADD
#undef SUB
#undef MAX
#undef FMADD
#undef EXP
#undef REDUCE_ADD
#undef REDUCE_MAX
