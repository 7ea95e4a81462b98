/*
 * cuda_moe.cu: the GPU kernels of a mixture of experts' routing (the
 * elementwise table's moe_route and moe_route_backward), twins of
 * core/cpu/cpu_moe.c: one thread per token row, the softmax, the top-k
 * (ties to the lower expert) and the gradient in double, rounded once into
 * the outputs. Rows are short (E experts, tens to a few hundred) and the
 * op is a sliver of a layer's time, so a thread per row, reading its logits
 * a few times from cache, is plenty; the expert products are cuBLAS's
 * (core/ops/moe.c calls the linear table per expert).
 */
#include "cuda_common.cuh"
#include "cuda_dtype.cuh"
#include "cuda_elementwise.cuh"

/* The j-th pick: the first strictly largest logit among those not taken. */
__device__ int64_t pick(const void *l, int64_t row, int64_t E, int ld, const long long *taken,
                        int64_t j) {
    int64_t best = -1;
    double bv = 0;
    for (int64_t e = 0; e < E; e++) {
        bool used = false;
        for (int64_t t = 0; t < j && !used; t++) used = taken[t] == e;
        if (used) continue;
        double v = fl_cu_get_f64(l, row + e, ld);
        if (best < 0 || v > bv) best = e, bv = v;
    }
    return best;
}

__device__ void stats(const void *l, int64_t row, int64_t E, int ld, double *m, double *s) {
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; e++) mx = fmax(mx, fl_cu_get_f64(l, row + e, ld));
    for (int64_t e = 0; e < E; e++) sum += exp(fl_cu_get_f64(l, row + e, ld) - mx);
    *m = mx;
    *s = sum;
}

__global__ void route_kernel(void *w, int wd, long long *ids, const void *l, int ld, int64_t N,
                             int64_t E, int64_t k, bool normalize) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < N;
         r += (int64_t)gridDim.x * blockDim.x) {
        double m, s, total = 0;
        stats(l, r * E, E, ld, &m, &s);
        long long *id = ids + r * k;
        for (int64_t j = 0; j < k; j++) {
            id[j] = pick(l, r * E, E, ld, id, j);
            total += exp(fl_cu_get_f64(l, r * E + id[j], ld) - m) / s;
        }
        for (int64_t j = 0; j < k; j++) {
            double p = exp(fl_cu_get_f64(l, r * E + id[j], ld) - m) / s;
            fl_cu_put_f64(w, r * k + j, wd, normalize ? p / total : p);
        }
    }
}

__global__ void route_backward_kernel(void *dl, int dld, const void *dw, int dwd, const void *l,
                                      int ld, const long long *ids, int64_t N, int64_t E,
                                      int64_t k, bool normalize) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < N;
         r += (int64_t)gridDim.x * blockDim.x) {
        double m, s, total = 0, dot = 0, c = 0;
        stats(l, r * E, E, ld, &m, &s);
        const long long *id = ids + r * k;
        for (int64_t j = 0; j < k; j++) total += exp(fl_cu_get_f64(l, r * E + id[j], ld) - m) / s;
        for (int64_t j = 0; j < k; j++) {
            double rj = exp(fl_cu_get_f64(l, r * E + id[j], ld) - m) / s;
            dot += fl_cu_get_f64(dw, r * k + j, dwd) * rj / total;
        }
        /* dr_j as in cpu_moe.c; c = sum_j dr_j r_j. */
        for (int64_t j = 0; j < k; j++) {
            double rj = exp(fl_cu_get_f64(l, r * E + id[j], ld) - m) / s;
            double g = fl_cu_get_f64(dw, r * k + j, dwd);
            c += (normalize ? (g - dot) / total : g) * rj;
        }
        for (int64_t e = 0; e < E; e++) {
            double g = -c;
            for (int64_t j = 0; j < k; j++)
                if (id[j] == e) {
                    double d = fl_cu_get_f64(dw, r * k + j, dwd);
                    g += normalize ? (d - dot) / total : d;
                }
            fl_cu_put_f64(dl, r * E + e, dld, g * (exp(fl_cu_get_f64(l, r * E + e, ld) - m) / s));
        }
    }
}

int fl_cuda_moe_route(fl_tensor *weights, fl_tensor *ids, const fl_tensor *logits, bool normalize) {
    const char *op = "moe_route";
    int64_t N = logits->shape[0], E = logits->shape[1], k = ids->shape[1];
    if (N == 0) return FL_OK;
    if (fl_cu_use_device(op, logits)) return fl_last_status();
    route_kernel<<<fl_cu_blocks(N, 128), 128, 0, fl_cu_stream()>>>(
        weights->data, weights->dtype, (long long *)ids->data, logits->data, logits->dtype, N, E, k,
        normalize);
    return fl_cu_check(op);
}

int fl_cuda_moe_route_backward(fl_tensor *dlogits, const fl_tensor *dweights,
                               const fl_tensor *logits, const fl_tensor *ids, bool normalize) {
    const char *op = "moe_route backward";
    int64_t N = logits->shape[0], E = logits->shape[1], k = ids->shape[1];
    if (N == 0) return FL_OK;
    if (fl_cu_use_device(op, logits)) return fl_last_status();
    route_backward_kernel<<<fl_cu_blocks(N, 128), 128, 0, fl_cu_stream()>>>(
        dlogits->data, dlogits->dtype, dweights->data, dweights->dtype, logits->data, logits->dtype,
        (const long long *)ids->data, N, E, k, normalize);
    return fl_cu_check(op);
}
