/*
 * cpu_attention_gen.h: the attention kernels for one compute type,
 * included by cpu_attention.c for f32 and f64. The includer defines R, RT,
 * FN(x), EXP(x) (as cpu_lanes_gen.h) and GEMM (the block product in R:
 * scratch for packing a transposed B, then fl_cpu_sgemm's arguments).
 *
 * The unit of work is a block of QBLOCK query rows of one (batch, head):
 *   forward   S = softcap(scale * Q K^T) + bias, masked; P = exp(S - rowmax);
 *             O = (P V) / rowsum; lse = rowmax + log(rowsum)
 *   backward  P = exp(S - lse) recomputed; dV += P^T dO; dP = dO V^T;
 *             dS = P * (dP - rowsum(dO * O)); dbias += dS;
 *             dS *= 1 - tanh^2 (softcap); dQ = scale * dS K;
 *             dK += scale * dS^T Q
 * A block only multiplies the keys its rows can see ([Note: attention
 * window and softcap], core/ops/attention.c): from the first row's window
 * start (0 without a window) to the last row's diagonal (causal) or Tk, so
 * causal GEMMs shrink to about half and windowed ones to the window.
 * Packed sequences ([Note: packed sequences], core/ops/attention.c) raise
 * each row's first key to its document's start (a->starts): the block
 * starts at its first row's, so blocks skip the keys of earlier documents.
 */

#include "cpu_fused_rows.h"
#include "error.h"
#include "backend.h"

/* Row i0 of (b, h) of a [B, H, T, X] tensor with a dense last dim. */
static inline R *FN(row_of)(const fl_tensor *t, int64_t b, int64_t h, int64_t i) {
    return (R *)t->data + b * t->stride[0] + h * t->stride[1] + i * t->stride[2];
}

/* The softcap over one row of scores, in place: s = cap * tanh(s / cap),
 * the tanh also to t when t is not NULL. tanh(x) = 1 - 2 / (1 + e^2x):
 * one exponential, no branch, so the loop vectorises (EXP saturates: +-1
 * at the ends); its absolute error is EXP's near 1, about 1e-7 in f32
 * (times cap in the score). */
FL_ISA_BODY void FL_ISA_BODY_NAME(FN(row_softcap))(R *s, R *t, int64_t n, R cap) {
    R two_inv = 2 / cap;
    if (t) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            R th = 1 - 2 / (1 + EXP(s[j] * two_inv));
            s[j] = cap * th;
            t[j] = th;
        }
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) s[j] = cap * (1 - 2 / (1 + EXP(s[j] * two_inv)));
    }
}
FL_ISA_CLONES_VOID(AVX2, FN(row_softcap), (R *s, R *t, int64_t n, R cap), (s, t, n, cap))

/* The first key query i of batch row b sees: the window's start, or its
 * document's (packed sequences) when later. Never decreases along i. */
static inline int64_t FN(first_key)(const fl_attention_args *a, int64_t b, int64_t i) {
    int64_t lo = a->window > 0 ? i - a->window + 1 : 0;
    if (a->starts) {
        int64_t s = ((const int64_t *)a->starts->data)[b * a->starts->shape[1] + i];
        if (s > lo) lo = s;
    }
    return lo;
}

/* The keys [*j0, *j1) the rows [i0, i0 + m) of a block of batch row b can
 * see (from the first row's first key: first_key never decreases). */
static inline void FN(key_range)(const fl_attention_args *a, int64_t b, int64_t i0, int64_t m,
                                 int64_t Tk, int64_t *j0, int64_t *j1) {
    int64_t lo = m > 0 ? FN(first_key)(a, b, i0) : 0;
    *j0 = lo > 0 ? (lo < Tk ? lo : Tk) : 0;
    *j1 = a->causal && i0 + m < Tk ? i0 + m : Tk;
    if (*j1 < *j0) *j1 = *j0;
}

/* S rows of one block (keys j0 ... j0 + nk - 1): softcap (keeping the
 * tanh in T for the backward when T is given), bias, causal and window
 * masks, then exp(S - shift) in place. shift is each row's max (forward:
 * also returns lse and 1/rowsum) or the saved lse (backward). A fully
 * masked row becomes zeros. */
static void FN(probabilities)(const fl_attention_args *a, R *S, R *T, int64_t m, int64_t nk,
                              int64_t j0, int64_t b, int64_t h, int64_t i0, R *lse, R *inv_sum,
                              const R *saved_lse) {
    const fl_tensor *bias = a->bias;
    R cap = (R)a->softcap;
    for (int64_t r = 0; r < m; r++) {
        R *s = S + r * nk;
        int64_t i = i0 + r;
        if (cap > 0) FN(row_softcap)(s, T ? T + r * nk : NULL, nk, cap);
        if (bias) {
            int64_t bs = bias->stride[3];
            const R *br = FN(row_of)(bias, b, h, i) + j0 * bs;
            if (bs == 1)
                for (int64_t j = 0; j < nk; j++) s[j] += br[j];
            else
                for (int64_t j = 0; j < nk; j++) s[j] += br[j * bs];
        }
        /* keys j0 + j with j0 + j > i (causal) or before the row's first key
         * (j0 + j <= i - window, or another document) */
        if (a->causal)
            for (int64_t j = i + 1 - j0 > 0 ? i + 1 - j0 : 0; j < nk; j++) s[j] = -INFINITY;
        if (a->window > 0 || a->starts)
            for (int64_t j = 0, e = FN(first_key)(a, b, i) - j0; j < nk && j < e; j++)
                s[j] = -INFINITY;
        R shift = saved_lse ? saved_lse[r] : FN(row_max)(s, nk);
        if (shift == -INFINITY) {
            /* Every key masked: no probability mass, zero output. */
            for (int64_t j = 0; j < nk; j++) s[j] = 0;
            if (lse) lse[r] = -INFINITY;
            if (inv_sum) inv_sum[r] = 0;
            continue;
        }
        R sum = FN(row_exp)(s, s, nk, shift);
        if (lse) lse[r] = shift + (R)log((double)sum);
        if (inv_sum) inv_sum[r] = 1 / sum;
    }
}

static int FN(attention)(const fl_attention_args *a) {
    const fl_tensor *q = a->q, *k = a->k, *v = a->v;
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], Tk = k->shape[2], Dv = v->shape[3], group = Hq / Hkv;
    int64_t nqb = (Tq + QBLOCK - 1) / QBLOCK, items = B * Hq * nqb;
    R scale = (R)a->scale;
    bool par = fl_attention_parallel(items, B * Hq * Tq * Tk * (D + Dv));
    int blas_threads = par ? blas_serial_begin() : 0;
    bool oom = false;
#pragma omp parallel if (par)
    {
        R *S = malloc((size_t)(QBLOCK * (Tk ? Tk : 1) + QBLOCK + Tk * D) * sizeof(R));
        if (!S) oom = true;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!S || oom) continue;
            int64_t qb = it % nqb, h = (it / nqb) % Hq, b = it / (nqb * Hq), hk = h / group;
            int64_t i0 = qb * QBLOCK, m = Tq - i0 < QBLOCK ? Tq - i0 : QBLOCK, j0, j1;
            FN(key_range)(a, b, i0, m, Tk, &j0, &j1);
            int64_t nk = j1 - j0;
            R *O = FN(row_of)(a->out, b, h, i0), *L = FN(row_of)(a->lse, b, h, i0);
            R *inv_sum = S + QBLOCK * (Tk ? Tk : 1), *pack = inv_sum + QBLOCK;
            if (nk == 0) {
                for (int64_t r = 0; r < m; r++) {
                    L[r] = -INFINITY;
                    for (int64_t d = 0; d < Dv; d++) O[r * Dv + d] = 0;
                }
                continue;
            }
            const R *Q = FN(row_of)(q, b, h, i0), *K = FN(row_of)(k, b, hk, j0);
            const R *V = FN(row_of)(v, b, hk, j0);
            GEMM(pack, false, true, m, nk, D, scale, Q, q->stride[2], K, k->stride[2], 0, S, nk);
            FN(probabilities)(a, S, NULL, m, nk, j0, b, h, i0, L, inv_sum, NULL);
            GEMM(pack, false, false, m, Dv, nk, 1, S, nk, V, v->stride[2], 0, O, Dv);
            for (int64_t r = 0; r < m; r++)
                for (int64_t d = 0; d < Dv; d++) O[r * Dv + d] *= inv_sum[r];
        }
        free(S);
    }
    if (par) blas_serial_end(blas_threads);
    return oom ? fl_fail(FL_ERR_OOM, "scaled_dot_product_attention: out of CPU memory for "
                                     "score blocks")
               : FL_OK;
}

/* dS of one block into its slot of dbias (the bias's shape as 4-d, size 1
 * where it broadcast): rows summed over broadcast batch/heads/queries by
 * the caller's work split, keys summed here when the bias had one. */
static void FN(add_dbias)(R *dst, const fl_tensor *dbias, const R *dS, int64_t m, int64_t nk,
                          int64_t j0, int64_t b, int64_t h, int64_t i0) {
    const int64_t *s = dbias->shape;
    for (int64_t r = 0; r < m; r++) {
        int64_t i = i0 + r;
        R *row = dst + (((s[0] > 1 ? b : 0) * s[1] + (s[1] > 1 ? h : 0)) * s[2] +
                        (s[2] > 1 ? i : 0)) * s[3];
        const R *d = dS + r * nk;
        if (s[3] == 1) {
            double sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < nk; j++) sum += d[j];
            row[0] += (R)sum;
        } else {
            for (int64_t j = 0; j < nk; j++) row[j0 + j] += d[j];
        }
    }
}

static int FN(attention_backward)(const fl_attention_args *a) {
    const fl_tensor *q = a->q, *k = a->k, *v = a->v, *o = a->o, *dout = a->dout;
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], Tk = k->shape[2], Dv = v->shape[3], group = Hq / Hkv;
    int64_t nqb = (Tq + QBLOCK - 1) / QBLOCK;
    R scale = (R)a->scale;
    /* Work is split by kv head so that dK/dV (shared by the query heads of
     * a group) have one writer. dbias is written by whoever owns its
     * slot: with a batch-broadcast bias (T5: [1, H, Tq, Tk]) each item
     * takes one kv head across the whole batch; a head-broadcast bias
     * needs per-thread copies summed at the end. */
    const fl_tensor *db = a->dbias;
    bool private_db = db && db->shape[1] == 1 && Hq > 1;
    bool whole_batch = db && !private_db && db->shape[0] == 1 && B > 1;
    int64_t items = whole_batch ? Hkv : B * Hkv;
    int nthreads = omp_get_max_threads();
    R *db_parts = NULL;
    if (private_db) {
        db_parts = calloc((size_t)nthreads * (size_t)db->numel, sizeof(R));
        if (!db_parts)
            return fl_fail(FL_ERR_OOM, "scaled_dot_product_attention backward: out of host "
                                       "memory for bias gradients");
    }
    bool par = fl_attention_parallel(items, B * Hq * Tq * Tk * (2 * D + 3 * Dv));
    int blas_threads = par ? blas_serial_begin() : 0;
    bool oom = false;
    int64_t block = QBLOCK * (Tk ? Tk : 1);
#pragma omp parallel if (par)
    {
        int64_t widest = D > Dv ? D : Dv;
        /* P, dP, (softcap: the tanh of each score), rowdot, pack */
        int64_t blocks = a->softcap > 0 ? 3 : 2;
        R *P = malloc((size_t)(blocks * block + QBLOCK + Tk * widest) * sizeof(R));
        if (!P) oom = true;
        R *dbias_dst = !db ? NULL
                     : private_db ? db_parts + (int64_t)omp_get_thread_num() * db->numel
                                  : (R *)db->data;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!P || oom) continue;
            R *dP = P + block, *Th = a->softcap > 0 ? P + 2 * block : NULL;
            R *rowdot = P + blocks * block, *pack = rowdot + QBLOCK;
            int64_t hk = it % Hkv, b0 = whole_batch ? 0 : it / Hkv, b1 = whole_batch ? B : b0 + 1;
            for (int64_t b = b0; b < b1; b++) {
                for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
                    for (int64_t qb = 0; qb < nqb; qb++) {
                        int64_t i0 = qb * QBLOCK, m = Tq - i0 < QBLOCK ? Tq - i0 : QBLOCK, j0, j1;
                        FN(key_range)(a, b, i0, m, Tk, &j0, &j1);
                        int64_t nk = j1 - j0;
                        const R *K = FN(row_of)(k, b, hk, j0), *V = FN(row_of)(v, b, hk, j0);
                        R *dK = a->dk ? FN(row_of)(a->dk, b, hk, j0) : NULL;
                        R *dV = a->dv ? FN(row_of)(a->dv, b, hk, j0) : NULL;
                        R *dQ = a->dq ? FN(row_of)(a->dq, b, h, i0) : NULL;
                        if (nk == 0) {
                            if (dQ)
                                for (int64_t x = 0; x < m * D; x++) dQ[x] = 0;
                            continue;
                        }
                        const R *Q = FN(row_of)(q, b, h, i0), *dO = FN(row_of)(dout, b, h, i0);
                        const R *O = FN(row_of)(o, b, h, i0);
                        const R *L = FN(row_of)(a->lse, b, h, i0);
                        int64_t ldq = q->stride[2], ldo = dout->stride[2];
                        GEMM(pack, false, true, m, nk, D, scale, Q, ldq, K, k->stride[2], 0, P, nk);
                        FN(probabilities)(a, P, Th, m, nk, j0, b, h, i0, NULL, NULL, L);
                        if (dV) GEMM(pack, true, false, nk, Dv, m, 1, P, nk, dO, ldo, 1, dV, Dv);
                        if (!dQ && !dK && !dbias_dst) continue;
                        GEMM(pack, false, true, m, nk, Dv, 1, dO, ldo, V, v->stride[2], 0, dP, nk);
                        for (int64_t r = 0; r < m; r++) {
                            double s = 0;
#pragma omp simd reduction(+ : s)
                            for (int64_t d = 0; d < Dv; d++)
                                s += (double)dO[r * ldo + d] * O[r * o->stride[2] + d];
                            rowdot[r] = (R)s;
                        }
                        for (int64_t r = 0; r < m; r++)
                            for (int64_t j = 0; j < nk; j++)
                                dP[r * nk + j] = P[r * nk + j] * (dP[r * nk + j] - rowdot[r]);
                        if (dbias_dst) FN(add_dbias)(dbias_dst, db, dP, m, nk, j0, b, h, i0);
                        if (Th) /* through the cap: d softcap*tanh(x/softcap) / dx */
                            for (int64_t x = 0; x < m * nk; x++) dP[x] *= 1 - Th[x] * Th[x];
                        if (dQ) GEMM(pack, false, false, m, D, nk, scale, dP, nk, K, k->stride[2], 0, dQ, D);
                        if (dK) GEMM(pack, true, false, nk, D, m, scale, dP, nk, Q, ldq, 1, dK, D);
                    }
                }
            }
        }
        free(P);
    }
    if (par) blas_serial_end(blas_threads);
    if (private_db && !oom) {
        R *dst = db->data;
        for (int t = 0; t < nthreads; t++)
            for (int64_t x = 0; x < db->numel; x++) dst[x] += db_parts[(int64_t)t * db->numel + x];
    }
    free(db_parts);
    return oom ? fl_fail(FL_ERR_OOM, "scaled_dot_product_attention backward: out of CPU memory "
                                     "for score blocks")
               : FL_OK;
}
