/*
 * cpu_moe.c: the CPU kernels of a mixture of experts' routing (the
 * elementwise table's moe_route and moe_route_backward; the math is in
 * core/ops/moe.c's comment). Rows are independent and short (E experts),
 * so threads take rows; each row is converted to f64 once and the softmax,
 * the top-k and the gradient run in f64, rounded once into the outputs
 * (so f32, bf16 and f64 logits share one path, and the CUDA kernels in
 * cuda_moe.cu compute the same numbers).
 */
#include "cpu_elementwise.h"
#include "cpu_iter.h"

#include <math.h>
#include <stdlib.h>

/* Row r of a contiguous [rows, n] tensor as f64 in buf (n elements). */
static void load_row(double *buf, const fl_tensor *t, int64_t r) {
    int64_t n = t->shape[1];
    size_t es = fl_dtype_size(t->dtype);
    const char *row = (const char *)t->data + r * n * (int64_t)es;
    for (int64_t c = 0; c < n; c += FL_CPU_SCRATCH) {
        int64_t len = n - c < FL_CPU_SCRATCH ? n - c : FL_CPU_SCRATCH;
        fl_cpu_load(buf + c, FL_F64, row + c * (int64_t)es, t->dtype, 1, len);
    }
}

static void store_row(fl_tensor *t, int64_t r, const double *buf) {
    int64_t n = t->shape[1];
    size_t es = fl_dtype_size(t->dtype);
    char *row = (char *)t->data + r * n * (int64_t)es;
    for (int64_t c = 0; c < n; c += FL_CPU_SCRATCH) {
        int64_t len = n - c < FL_CPU_SCRATCH ? n - c : FL_CPU_SCRATCH;
        fl_cpu_store(row + c * (int64_t)es, t->dtype, 1, buf + c, FL_F64, len);
    }
}

/* max and sum of exp(l - max) over a row. */
static void softmax_stats(const double *l, int64_t E, double *max, double *sum) {
    double m = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    for (int64_t e = 0; e < E; e++) s += exp(l[e] - m);
    *max = m;
    *sum = s;
}

/* The k largest logits (softmax is monotonic), descending, ties to the
 * lower index: each pass takes the first strictly larger value among the
 * experts not taken yet. */
static void top_k(const double *l, int64_t E, int64_t k, int64_t *id) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t t = 0; t < j && !taken; t++) taken = id[t] == e;
            if (taken) continue;
            if (best < 0 || l[e] > l[best]) best = e;
        }
        id[j] = best;
    }
}

int fl_cpu_moe_route(fl_tensor *weights, fl_tensor *ids, const fl_tensor *logits, bool normalize) {
    int64_t N = logits->shape[0], E = logits->shape[1], k = ids->shape[1];
    int64_t *out_ids = ids->data;
    bool failed = false;
#pragma omp parallel if (N * E >= (1 << 14))
    {
        double *buf = malloc((size_t)(E + 2 * k) * sizeof *buf);
        if (!buf) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            double *w = buf + E, m, s, total = 0;
            load_row(buf, logits, r);
            softmax_stats(buf, E, &m, &s);
            int64_t *id = out_ids + r * k;
            top_k(buf, E, k, id);
            for (int64_t j = 0; j < k; j++) total += (w[j] = exp(buf[id[j]] - m) / s);
            if (normalize)
                for (int64_t j = 0; j < k; j++) w[j] /= total;
            size_t ws = fl_dtype_size(weights->dtype);
            fl_cpu_store((char *)weights->data + r * k * (int64_t)ws, weights->dtype, 1, w, FL_F64,
                         k);
        }
        free(buf);
    }
    return failed ? fl_fail(FL_ERR_OOM, "moe_route: out of CPU memory for a row of %lld logits",
                            (long long)E)
                  : FL_OK;
}

int fl_cpu_moe_route_backward(fl_tensor *dlogits, const fl_tensor *dweights,
                              const fl_tensor *logits, const fl_tensor *ids, bool normalize) {
    int64_t N = logits->shape[0], E = logits->shape[1], k = ids->shape[1];
    const int64_t *in_ids = ids->data;
    bool failed = false;
#pragma omp parallel if (N * E >= (1 << 14))
    {
        double *buf = malloc((size_t)(2 * E + 3 * k) * sizeof *buf);
        if (!buf) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            double *dl = buf + E, *rj = dl + E, *dw = rj + k, *dr = dw + k, m, s;
            load_row(buf, logits, r);
            fl_cpu_load(dw, FL_F64, (const char *)dweights->data +
                                        r * k * (int64_t)fl_dtype_size(dweights->dtype),
                        dweights->dtype, 1, k);
            softmax_stats(buf, E, &m, &s);
            const int64_t *id = in_ids + r * k;
            double total = 0, dot = 0, c = 0;
            for (int64_t j = 0; j < k; j++) total += (rj[j] = exp(buf[id[j]] - m) / s);
            /* w = r / S: dL/dr_j = (dw_j - sum_m dw_m w_m) / S. */
            for (int64_t j = 0; j < k; j++) dot += dw[j] * rj[j] / total;
            for (int64_t j = 0; j < k; j++) dr[j] = normalize ? (dw[j] - dot) / total : dw[j];
            for (int64_t j = 0; j < k; j++) c += dr[j] * rj[j];
            /* Softmax backward with a gradient that is dr on the chosen
             * experts and 0 elsewhere: dl_e = p_e (dr(e) - c). */
            for (int64_t e = 0; e < E; e++) dl[e] = -c;
            for (int64_t j = 0; j < k; j++) dl[id[j]] += dr[j];
            for (int64_t e = 0; e < E; e++) dl[e] *= exp(buf[e] - m) / s;
            store_row(dlogits, r, dl);
        }
        free(buf);
    }
    return failed ? fl_fail(FL_ERR_OOM, "moe_route backward: out of CPU memory for a row of %lld "
                                        "logits", (long long)E)
                  : FL_OK;
}
