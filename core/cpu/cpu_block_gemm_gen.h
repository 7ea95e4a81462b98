/*
 * cpu_block_gemm_gen.h: the kernel of cpu_block_gemm.c ([Note:
 * attention's f32 block products]) written once over the vector width.
 * The includer defines W (lanes), NV (vectors per slab of columns), VEC
 * and VECI (a vector of floats, and the type the transpose takes), MASK
 * and MASK_OF(left) (the first `left` lanes), ZERO, SET1, LOAD, LOADM
 * (masked, missing lanes 0), STORE, STOREM, FMADD, MUL, STOREI,
 * TRANSPOSE_LOAD (W rows of W lanes, ld apart, loaded transposed) and FN
 * (the names' suffix), inside a `#pragma GCC target` region for that
 * width; all are undefined at the end, so the file is included once per
 * width.
 */

/* R rows by V vectors of W columns of C = alpha A B + beta C, the last
 * vector masked by `last` when `tail`. A(r, k) is A[r * ar + k * ak]; B's
 * row k (the columns of this block) starts at B + k * ldb. R V sums stay
 * in registers over all of K. */
static inline __attribute__((always_inline)) void
FN(block)(int R, int V, bool tail, MASK last, int64_t K, const float *A, int64_t ar, int64_t ak,
          const float *B, int64_t ldb, float *C, int64_t ldc, float alpha, float beta) {
    VEC c[6][NV];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) c[r][v] = ZERO();
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        VEC bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            bv[v] = tail && v == V - 1 ? LOADM(last, b + W * v) : LOAD(b + W * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            VEC a = SET1(A[r * ar + k * ak]);
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) c[r][v] = FMADD(a, bv[v], c[r][v]);
        }
    }
    VEC va = SET1(alpha), vb = SET1(beta);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) {
            float *p = C + r * ldc + W * v;
            bool masked = tail && v == V - 1;
            VEC x = MUL(va, c[r][v]);
            if (beta != 0) x = FMADD(vb, masked ? LOADM(last, p) : LOAD(p), x);
            if (masked)
                STOREM(p, last, x);
            else
                STORE(p, x);
        }
}

/* R rows of a slab of at most NV W columns: NV vectors, or what is left
 * (the last vector masked). */
static inline __attribute__((always_inline)) void
FN(rows)(int R, int64_t N, int64_t K, const float *A, int64_t ar, int64_t ak, const float *B,
         int64_t ldb, float *C, int64_t ldc, float alpha, float beta) {
    int64_t left = N - (N - 1) / W * W;
    MASK last = MASK_OF(left);
    switch ((N + W - 1) / W) {
#if NV >= 4
    case 4:
        if (left == W)
            FN(block)(R, 4, false, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta);
        else
            FN(block)(R, 4, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta);
        break;
    case 3: FN(block)(R, 3, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta); break;
#endif
    case 2:
        if (NV == 2 && left == W)
            FN(block)(R, 2, false, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta);
        else
            FN(block)(R, 2, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta);
        break;
    case 1: FN(block)(R, 1, true, last, K, A, ar, ak, B, ldb, C, ldc, alpha, beta); break;
    default: break;
    }
}

/* Rows [0, m) of one slab, 6 at a time then the rest. */
static void FN(slab)(int64_t m, int64_t N, int64_t K, const float *A, int64_t ar, int64_t ak,
                     const float *B, int64_t ldb, float *C, int64_t ldc, float alpha, float beta) {
    int64_t r = 0;
    for (; r + 6 <= m; r += 6)
        FN(rows)(6, N, K, A + r * ar, ar, ak, B, ldb, C + r * ldc, ldc, alpha, beta);
    const float *ap = A + r * ar;
    float *cp = C + r * ldc;
    switch (m - r) {
    case 5: FN(rows)(5, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 4: FN(rows)(4, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 3: FN(rows)(3, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 2: FN(rows)(2, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    case 1: FN(rows)(1, N, K, ap, ar, ak, B, ldb, cp, ldc, alpha, beta); break;
    default: break;
    }
}

/* X [n, k] (row stride ld) transposed into dst [k, n] (dense): W x W
 * blocks through registers, the edges element by element. */
static void FN(pack_transposed)(float *dst, const float *X, int64_t ld, int64_t n, int64_t k) {
    int64_t nw = n / W * W, kw = k / W * W;
    for (int64_t i0 = 0; i0 < nw; i0 += W)
        for (int64_t j0 = 0; j0 < kw; j0 += W) {
            VECI r[W];
            TRANSPOSE_LOAD(r, X + i0 * ld + j0, ld);
            for (int j = 0; j < W; j++) STOREI(dst + (j0 + j) * n + i0, r[j]);
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i < nw ? kw : 0; j < k; j++) dst[j * n + i] = X[i * ld + j];
}

/* fl_cpu_block_sgemm's product at this width (m, n > 0). */
static void FN(block_sgemm)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc, float *pack) {
    if (trans_b) { /* B [n, k] as stored: its rows become B's columns */
        FN(pack_transposed)(pack, b, ldb, n, k);
        b = pack, ldb = n;
    }
    int64_t ar = trans_a ? 1 : lda, ak = trans_a ? lda : 1;
    /* Slab by slab of NV W columns, so that the slab's rows of B (k x NV
     * W) stay in L1 while every block of rows passes over them. */
    for (int64_t n0 = 0; n0 < n; n0 += NV * W)
        FN(slab)(m, n - n0 < NV * W ? n - n0 : NV * W, k, a, ar, ak, b + n0, ldb, c + n0, ldc,
                 alpha, beta);
}

#undef W
#undef NV
#undef VEC
#undef VECI
#undef MASK
#undef MASK_OF
#undef ZERO
#undef SET1
#undef LOAD
#undef LOADM
#undef STORE
#undef STOREM
#undef FMADD
#undef MUL
#undef STOREI
#undef TRANSPOSE_LOAD
#undef FN
