/*
 * cuda_optim.cu: the fused optimizer updates (AdamW, AnyPrecisionAdamW,
 * SGD, Adadelta) and the two kernels of clip-by-global-norm on the GPU.
 *
 * Each update is one kernel launch over a flat shard, one thread per
 * element (grid-stride), doing exactly the CPU loop's operations
 * (the .c files of core/optim) on the same f32 constants (optim_update.h): every
 * operand is read as f32, each value is rounded once when stored (nearest
 * even), and the arithmetic is written with the _rn intrinsics, which nvcc
 * never contracts into fused multiply-adds. The CPU build has no FMA
 * either (x86-64 baseline), IEEE division and square roots are correctly
 * rounded on both, so a GPU step gives the CPU's bits.
 *
 * The sum of squares keeps grad_norm.c's chunks and its order of additions
 * (four interleaved accumulators per chunk, chunks in order): one thread
 * per accumulator on the device, the chunks added on the host, so the GPU
 * gives the CPU's bits there too.
 */
#include "cuda_common.cuh"

extern "C" {
#include "../optim/optim_update.h"
}

#include <stdlib.h>

#define ADD __fadd_rn
#define SUB __fsub_rn
#define MUL __fmul_rn
#define DIV __fdiv_rn

/* The operands by value: data and stored dtype, NULL when absent. */
struct operands {
    void *p[FL_OPTIM_MAX_OPERANDS];
    int dt[FL_OPTIM_MAX_OPERANDS];
};

__device__ __forceinline__ float get(const operands &o, int k, int64_t i) {
    return fl_cu_get_f32(o.p[k], i, o.dt[k]);
}

__device__ __forceinline__ void put(const operands &o, int k, int64_t i, float v) {
    fl_cu_put_f32(o.p[k], i, o.dt[k], v);
}

/* x as it reads back after being stored as dtype d (fl_optim_round). */
__device__ __forceinline__ float rounded(int d, float x) {
    if (d == FL_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    if (d == FL_F16) return __half2float(__float2half_rn(x));
    return x;
}

#define FOR_EACH_ELEMENT(i, n)                                                                     \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                     \
         i += (int64_t)gridDim.x * blockDim.x)

/* adamw.c: decay, lerp of m (PyTorch's two branches), v, then the param. */
__global__ void adamw_kernel(operands o, fl_adamw_ctx c, int64_t n) {
    float w = c.weight1, one_minus_w = SUB(1.0f, c.weight1);
    bool far = !(w < 0.5f);
    FOR_EACH_ELEMENT(i, n) {
        float p = get(o, 0, i), g = get(o, 1, i), m = get(o, 2, i), v = get(o, 3, i);
        m = far ? SUB(g, MUL(SUB(g, m), one_minus_w)) : ADD(m, MUL(w, SUB(g, m)));
        v = ADD(MUL(v, c.beta2), MUL(MUL(c.one_minus_beta2, g), g));
        float denom = ADD(DIV(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
        p = ADD(MUL(p, c.decay), DIV(MUL(c.neg_step_size, m), denom));
        put(o, 0, i, p);
        put(o, 2, i, m);
        put(o, 3, i, v);
    }
}

/* anyprecision_adamw.c: EMA moments rounded to their dtypes, the step from
 * the rounded values, Kahan-compensated when operand 4 is present. */
__global__ void anyprecision_kernel(operands o, fl_anyprecision_ctx c, int64_t n) {
    int pd = o.dt[0], md = o.dt[2], vd = o.dt[3];
    FOR_EACH_ELEMENT(i, n) {
        float g = get(o, 1, i), p = get(o, 0, i);
        float m = rounded(md, ADD(MUL(get(o, 2, i), c.beta1), MUL(c.one_minus_beta1, g)));
        float v = rounded(vd, ADD(MUL(get(o, 3, i), c.beta2), MUL(MUL(c.one_minus_beta2, g), g)));
        put(o, 2, i, m);
        put(o, 3, i, v);
        float denom = ADD(DIV(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
        float step = DIV(MUL(c.neg_step_size, m), denom);
        if (c.kahan) {
            float comp = ADD(get(o, 4, i), ADD(MUL(c.neg_lr_wd, p), step));
            float next = rounded(pd, ADD(p, comp));
            put(o, 4, i, SUB(comp, SUB(next, p)));
            p = next;
        } else {
            p = ADD(MUL(p, ADD(1.0f, c.neg_lr_wd)), step);
        }
        put(o, 0, i, p);
    }
}

/* sgd.c: weight decay, the momentum buffer (a copy of d on the first
 * step), nesterov, then the param. */
__global__ void sgd_kernel(operands o, fl_sgd_ctx c, int64_t n) {
    bool decay = c.weight_decay != 0;
    float neg_lr = -c.lr;
    FOR_EACH_ELEMENT(i, n) {
        float p = get(o, 0, i), g = get(o, 1, i);
        float d = decay ? ADD(g, MUL(c.weight_decay, p)) : g;
        if (c.use_momentum) {
            float b = c.first ? d : ADD(MUL(get(o, 2, i), c.momentum), MUL(c.one_minus_dampening, d));
            put(o, 2, i, b);
            d = c.nesterov ? ADD(d, MUL(c.momentum, b)) : b;
        }
        put(o, 0, i, ADD(p, MUL(neg_lr, d)));
    }
}

/* adadelta.c: square_avg, delta from both square roots, acc_delta, param. */
__global__ void adadelta_kernel(operands o, fl_adadelta_ctx c, int64_t n) {
    bool decay = c.weight_decay != 0;
    float neg_lr = -c.lr;
    FOR_EACH_ELEMENT(i, n) {
        float p = get(o, 0, i), g = get(o, 1, i), s = get(o, 2, i), a = get(o, 3, i);
        float d = decay ? ADD(g, MUL(c.weight_decay, p)) : g;
        s = ADD(MUL(s, c.rho), MUL(MUL(c.one_minus_rho, d), d));
        float delta = MUL(DIV(__fsqrt_rn(ADD(a, c.eps)), __fsqrt_rn(ADD(s, c.eps))), d);
        a = ADD(MUL(a, c.rho), MUL(MUL(c.one_minus_rho, delta), delta));
        put(o, 2, i, s);
        put(o, 3, i, a);
        put(o, 0, i, ADD(p, MUL(neg_lr, delta)));
    }
}

static int cuda_optim_update(const char *op, fl_optim_kind kind, const void *ctx, int n,
                             const fl_optim_operand *ops) {
    const fl_tensor *param = ops[0].t;
    int64_t numel = param->numel;
    if (numel == 0) return FL_OK;
    int rc = fl_cu_use_device(op, param);
    if (rc != FL_OK) return rc;
    operands o;
    for (int k = 0; k < FL_OPTIM_MAX_OPERANDS; k++) {
        bool present = k < n && ops[k].t;
        o.p[k] = present ? ops[k].t->data : NULL;
        o.dt[k] = present ? (int)ops[k].t->dtype : (int)FL_F32;
    }
    unsigned blocks = fl_cu_blocks(numel, 256);
    cudaStream_t s = fl_cu_stream();
    switch (kind) {
    case FL_OPTIM_ADAMW:
        adamw_kernel<<<blocks, 256, 0, s>>>(o, *(const fl_adamw_ctx *)ctx, numel);
        break;
    case FL_OPTIM_ANYPRECISION_ADAMW:
        anyprecision_kernel<<<blocks, 256, 0, s>>>(o, *(const fl_anyprecision_ctx *)ctx, numel);
        break;
    case FL_OPTIM_SGD:
        sgd_kernel<<<blocks, 256, 0, s>>>(o, *(const fl_sgd_ctx *)ctx, numel);
        break;
    case FL_OPTIM_ADADELTA:
        adadelta_kernel<<<blocks, 256, 0, s>>>(o, *(const fl_adadelta_ctx *)ctx, numel);
        break;
    default:
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for update kind %d", op, (int)kind);
    }
    return fl_cu_check(op);
}

/* ---- clip-by-global-norm --------------------------------------------------------- */

enum { CHUNK = FL_GRAD_NORM_CHUNK };

/* part[4c + k] = accumulator k of chunk c, as chunk_sum_squares in
 * grad_norm.c: squares of elements 4j + k of the chunk's whole quads, in
 * order, in double; accumulator 0 then adds the tail elements. */
__global__ void sum_squares_kernel(double *part, const void *x, int dt, int64_t numel,
                                   int64_t chunks) {
    FOR_EACH_ELEMENT(t, chunks * 4) {
        int64_t c = t >> 2, k = t & 3, start = c * CHUNK;
        int64_t len = numel - start < CHUNK ? numel - start : CHUNK, quads = len / 4;
        double s = 0;
        for (int64_t j = 0; j < quads; j++) {
            double d = fl_cu_get_f64(x, start + 4 * j + k, dt);
            s = __dadd_rn(s, __dmul_rn(d, d));
        }
        if (k == 0)
            for (int64_t i = quads * 4; i < len; i++) {
                double d = fl_cu_get_f64(x, start + i, dt);
                s = __dadd_rn(s, __dmul_rn(d, d));
            }
        part[t] = s;
    }
}

static int cuda_grad_sq_norm(const fl_tensor *t, double *out) {
    const char *op = "grad_sq_norm";
    *out = 0;
    int64_t numel = t->numel, chunks = (numel + CHUNK - 1) / CHUNK;
    if (chunks == 0) return FL_OK;
    int rc = fl_cu_use_device(op, t);
    if (rc != FL_OK) return rc;
    int64_t nparts = chunks * 4;
    fl_tensor *part = fl_empty(1, &nparts, FL_F64, t->device);
    if (!part) return fl_last_status();
    double *host = (double *)malloc((size_t)nparts * sizeof *host);
    if (!host) {
        fl_tensor_release(part);
        return fl_fail(FL_ERR_OOM, "%s: no host memory for %lld partial sums", op, (long long)nparts);
    }
    sum_squares_kernel<<<fl_cu_blocks(nparts, 256), 256, 0, fl_cu_stream()>>>(
        (double *)part->data, t->data, t->dtype, numel, chunks);
    rc = fl_cu_check(op);
    if (rc == FL_OK) rc = fl_cuda_nccl_settle();
    if (rc == FL_OK) {
        /* Synchronous on the legacy stream: waits for the kernel. */
        cudaError_t e = cudaMemcpy(host, part->data, (size_t)nparts * sizeof *host,
                                   cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            rc = fl_fail(FL_ERR_DEVICE, "%s on cuda: reading the partial sums: %s", op,
                         cudaGetErrorString(e));
    }
    if (rc == FL_OK) {
        double sum = 0;
        for (int64_t c = 0; c < chunks; c++) {
            const double *s = host + 4 * c;
            sum += (s[0] + s[1]) + (s[2] + s[3]);
        }
        *out = sum;
    }
    free(host);
    fl_tensor_release(part);
    return rc;
}

/* t *= alpha: in double for f64, else in f32 rounded once per element. */
__global__ void scale_kernel(void *x, int dt, double alpha, int64_t n) {
    float a = (float)alpha;
    FOR_EACH_ELEMENT(i, n) {
        if (dt == FL_F64) ((double *)x)[i] = __dmul_rn(((double *)x)[i], alpha);
        else fl_cu_put_f32(x, i, dt, MUL(fl_cu_get_f32(x, i, dt), a));
    }
}

static int cuda_grad_scale_(fl_tensor *t, double alpha) {
    const char *op = "grad_scale_";
    if (t->numel == 0) return FL_OK;
    int rc = fl_cu_use_device(op, t);
    if (rc != FL_OK) return rc;
    scale_kernel<<<fl_cu_blocks(t->numel, 256), 256, 0, fl_cu_stream()>>>(t->data, t->dtype, alpha,
                                                                          t->numel);
    return fl_cu_check(op);
}

extern "C" const fl_optim_kernels fl_cuda_optim_kernels = {
    cuda_optim_update,
    cuda_grad_sq_norm,
    cuda_grad_scale_,
};
