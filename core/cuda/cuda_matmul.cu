/*
 * cuda_matmul.cu: the GPU matrix product behind matmul, linear and their
 * backward (batched, broadcast, with an optional bias), made of the
 * strided-batched products of cuda_gemm.cu.
 *
 * An operand whose matrices have a unit stride on either axis is read in
 * place (a transposed view becomes the transposition flag); anything else
 * is compacted first, as the CPU kernel does. A dense [..., m, k] input
 * times one weight is one GEMM of all rows. The bias is cuBLASLt's BIAS
 * epilogue, read in f32 and added before the one rounding to the output
 * dtype: the CPU's order of operations (its GEMM adds onto C = bias).
 */
#include "cuda_linear.cuh"
extern "C" {
#include "gemm_operand.h"
#include "cuda_elem.h"
}

#include <string.h>

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

/* ---- operands ---------------------------------------------------------------- */

/* t in place when the library can read it, else its distinct elements (the
 * broadcast batch dims collapsed, never expanded) compacted on the device. */
static int prepare(const fl_tensor *t, fl_gemm_operand *op) {
    int nd = t->ndim, nb = nd - 2;
    int64_t r = t->shape[nd - 2], c = t->shape[nd - 1];
    memset(op, 0, sizeof *op);
    if (fl_gemm_layout(r, c, t->stride[nd - 2], t->stride[nd - 1], &op->trans, &op->ld)) {
        op->base = (const char *)t->data;
        for (int i = 0; i < nb; i++) op->bstride[i] = t->stride[i];
        return FL_OK;
    }
    fl_tensor d = *t;
    d.numel = 1;
    for (int i = 0; i < nd; i++) {
        if (i < nb && t->stride[i] == 0) d.shape[i] = 1;
        d.numel *= d.shape[i];
    }
    op->owned = fl_empty(nd, d.shape, t->dtype, t->device);
    if (!op->owned) return fl_last_status();
    int rc = fl_cuda_copy_kernel(op->owned, &d); /* the device's strided copy */
    if (rc != FL_OK) return rc;
    op->base = (const char *)op->owned->data;
    op->trans = false;
    op->ld = max1(c);
    for (int i = 0; i < nb; i++) op->bstride[i] = t->stride[i] == 0 ? 0 : op->owned->stride[i];
    return FL_OK;
}

/* ---- bias fills and fallbacks ----------------------------------------------- */

/* out[r, j] = round(src[r, j] + bias[j]) for rows x n, src f32 (or out
 * itself when f32), bias f32; or out[r, j] = bias[j] when src is NULL. */
__global__ void bias_rows_kernel(void *out, int od, const float *src, const void *bias, int bd,
                                 int64_t rows, int64_t n) {
    int64_t total = rows * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = i % n;
        if (od == FL_F64) {
            double v = bias ? fl_cu_get_f64(bias, j, bd) : 0.0;
            fl_cu_put_f64(out, i, od, v);
        } else {
            float v = (src ? src[i] : 0.0f) + (bias ? fl_cu_get_f32(bias, j, bd) : 0.0f);
            fl_cu_put_f32(out, i, od, v);
        }
    }
}

static int bias_rows(void *out, fl_dtype od, const float *src, const void *bias, fl_dtype bd,
                     int64_t rows, int64_t n) {
    int64_t total = rows * n;
    if (total == 0) return FL_OK;
    bias_rows_kernel<<<fl_cu_blocks(total, 256), 256, 0, fl_cu_stream()>>>(out, od, src, bias, bd,
                                                                            rows, n);
    return fl_cu_check("matmul");
}

/* ---- the product ---------------------------------------------------------------- */

/* Every product of out = a @ b: one GEMM when the rows fold, else one
 * strided batch over the innermost batch dims that both operands step
 * through evenly (a broadcast dim has step 0: the library reads the same
 * matrix again), looped on the host over the other batch dims. `c` has
 * out's layout in dtype cd. FL_CU_NO_ALGORITHM as fl_cu_gemm. */
static int run_products(int dev, const fl_tensor *out, const fl_gemm_operand *A,
                        const fl_gemm_operand *B, int64_t k, void *c, fl_dtype cd, const fl_cu_gemm_args *proto, void *ws) {
    const char *op = "matmul";
    int nd = out->ndim, nb = nd - 2;
    int64_t m = out->shape[nb], n = out->shape[nb + 1];
    size_t ea = fl_dtype_size(out->dtype), ec = fl_dtype_size(cd);
    fl_cu_gemm_args g = *proto;
    g.n = n;
    g.k = k;
    g.ab = out->dtype;
    g.cd = cd;
    g.b = B->base;
    g.tb = B->trans;
    g.ldb = B->ld;
    g.ta = A->trans;
    g.lda = A->ld;
    g.ldc = max1(n);
    int64_t rows, lda;
    if (fl_gemm_fold_rows(A, B, out, k, &rows, &lda)) {
        g.m = rows;
        g.lda = lda;
        g.ta = false;
        g.a = A->base;
        g.c = c;
        g.batch = 1;
        g.sa = g.sb = g.sc = 0;
        return fl_cu_gemm(op, dev, &g, ws, FL_CU_GEMM_WORKSPACE);
    }
    int split = nb; /* batch dims [split, nb) go into one strided batch */
    int64_t inner = 1, sa = 0, sb = 0;
    bool first = true;
    for (int i = nb - 1; i >= 0; i--) {
        int64_t size = out->shape[i];
        if (size != 1) {
            if (first) {
                sa = A->bstride[i];
                sb = B->bstride[i];
                first = false;
            } else if (A->bstride[i] != sa * inner || B->bstride[i] != sb * inner ||
                       inner * size > INT32_MAX) {
                break;
            }
            inner *= size;
        }
        split = i;
    }
    int64_t outer = 1;
    for (int i = 0; i < split; i++) outer *= out->shape[i];
    g.m = m;
    g.batch = inner;
    g.sa = sa;
    g.sb = sb;
    g.sc = m * n;
    for (int64_t o = 0; o < outer; o++) {
        int64_t oa = 0, ob = 0, rem = o;
        for (int d = split - 1; d >= 0; d--) {
            int64_t idx = rem % out->shape[d];
            rem /= out->shape[d];
            oa += idx * A->bstride[d];
            ob += idx * B->bstride[d];
        }
        g.a = A->base + oa * (int64_t)ea;
        g.b = B->base + ob * (int64_t)ea;
        g.c = (char *)c + o * inner * m * n * (int64_t)ec;
        int rc = fl_cu_gemm(op, dev, &g, ws, FL_CU_GEMM_WORKSPACE);
        if (rc != FL_OK) return rc;
    }
    return FL_OK;
}

/* A bias of any float dtype and stride as n contiguous values of ct. */
__global__ void bias_convert_kernel(void *dst, int ct, const void *src, int sd, int64_t stride,
                                    int64_t n) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n;
         j += (int64_t)gridDim.x * blockDim.x)
        fl_cu_put_f64(dst, j, ct, fl_cu_get_f64(src, j * stride, sd));
}

static int no_algorithm(const fl_tensor *out, int64_t k) {
    int nd = out->ndim;
    return fl_fail(FL_ERR_UNSUPPORTED, "matmul on cuda: cuBLASLt offers no algorithm for %s "
                   "[%lld x %lld] @ [%lld x %lld]", fl_dtype_name(out->dtype),
                   (long long)out->shape[nd - 2], (long long)k, (long long)k,
                   (long long)out->shape[nd - 1]);
}

int fl_cuda_matmul(fl_tensor *out, const fl_tensor *a, const fl_tensor *b, const fl_tensor *bias) {
    const char *op = "matmul";
    fl_dtype dt = out->dtype;
    if (dt != FL_F32 && dt != FL_BF16 && dt != FL_F16 && dt != FL_F64)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: no kernel for dtype %s", op,
                       fl_dtype_name(dt));
    if (out->numel == 0) return FL_OK;
    int rc = fl_cu_use_device(op, out);
    if (rc != FL_OK) return rc;
    int dev = fl_device_index(out->device);
    int nd = out->ndim, nb = nd - 2;
    int64_t n = out->shape[nb + 1], k = a->shape[nd - 1];
    int64_t nrows = out->numel / n;
    fl_dtype ct = dt == FL_F64 ? FL_F64 : FL_F32; /* the bias as the epilogue reads it */
    fl_gemm_operand A, B;
    memset(&A, 0, sizeof A);
    memset(&B, 0, sizeof B);
    fl_tensor *bias_ct = NULL, *ws = NULL, *tmp = NULL;
    fl_cu_gemm_args proto;
    memset(&proto, 0, sizeof proto);
    if (bias) {
        bias_ct = fl_empty(1, &n, ct, out->device);
        if (!bias_ct) return fl_last_status();
        bias_convert_kernel<<<fl_cu_blocks(n, 256), 256, 0, fl_cu_stream()>>>(
            bias_ct->data, ct, bias->data, bias->dtype, bias->stride[0], n);
        if ((rc = fl_cu_check(op)) != FL_OK) goto done;
    }
    if (k == 0) { /* no products: the bias, or zeros */
        rc = bias_rows(out->data, dt, NULL, bias_ct ? bias_ct->data : NULL, ct, nrows, n);
        goto done;
    }
    if ((rc = prepare(a, &A)) != FL_OK || (rc = prepare(b, &B)) != FL_OK) goto done;
    if (dt == FL_F64) {
        /* cuBLAS has no epilogue: C starts as the bias and beta = 1. */
        if (bias_ct && (rc = bias_rows(out->data, dt, NULL, bias_ct->data, ct, nrows, n)) != FL_OK)
            goto done;
        proto.beta = bias_ct ? 1 : 0;
        rc = run_products(dev, out, &A, &B, k, out->data, dt, &proto, NULL);
        goto done;
    }
    ws = fl_cu_workspace(out, FL_CU_GEMM_WORKSPACE);
    if (!ws) {
        rc = fl_last_status();
        goto done;
    }
    proto.bias = bias_ct ? bias_ct->data : NULL;
    proto.bias_dtype = ct;
    rc = run_products(dev, out, &A, &B, k, out->data, dt, &proto, ws->data);
    if (rc == FL_CU_NO_ALGORITHM && bias_ct) {
        /* No kernel with this epilogue: the products in f32 (out itself
         * when f32), then bias and one rounding, which is the same math. */
        if (dt != FL_F32) {
            tmp = fl_empty(1, &out->numel, FL_F32, out->device);
            if (!tmp) {
                rc = fl_last_status();
                goto done;
            }
        }
        float *c = (float *)(tmp ? tmp->data : out->data);
        proto.bias = NULL;
        rc = run_products(dev, out, &A, &B, k, c, FL_F32, &proto, ws->data);
        if (rc == FL_OK) rc = bias_rows(out->data, dt, c, bias_ct->data, ct, nrows, n);
    }
    if (rc == FL_CU_NO_ALGORITHM) rc = no_algorithm(out, k);
done:
    /* The pool is stream-ordered: memory freed here is reused only by work
     * queued after these kernels. */
    fl_tensor_release(A.owned);
    fl_tensor_release(B.owned);
    fl_tensor_release(bias_ct);
    fl_tensor_release(ws);
    fl_tensor_release(tmp);
    return rc;
}


/* out (f32/f64) += a @ b, 2-d (fl_linear_kernels.matmul_acc): one product
 * with beta = 1 onto out, the operands read in their own dtype (cuBLASLt
 * takes bf16/f16 operands with an f32 C; f64 is cuBLAS's dgemm). */
int fl_cuda_matmul_acc(fl_tensor *out, const fl_tensor *a, const fl_tensor *b) {
    const char *op = "matmul_acc";
    if (out->numel == 0 || a->shape[1] == 0) return FL_OK;
    if (out->dtype == FL_F64 && a->dtype != FL_F64)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: an f64 sum of %s operands", op,
                       fl_dtype_name(a->dtype));
    int rc = fl_cu_use_device(op, out);
    if (rc != FL_OK) return rc;
    int dev = fl_device_index(out->device);
    fl_gemm_operand A, B;
    memset(&A, 0, sizeof A);
    memset(&B, 0, sizeof B);
    fl_tensor *ws = NULL;
    fl_cu_gemm_args g;
    memset(&g, 0, sizeof g);
    if ((rc = prepare(a, &A)) != FL_OK || (rc = prepare(b, &B)) != FL_OK) goto done;
    g.m = out->shape[0];
    g.n = out->shape[1];
    g.k = a->shape[1];
    g.batch = 1;
    g.a = A.base;
    g.ta = A.trans;
    g.lda = A.ld;
    g.b = B.base;
    g.tb = B.trans;
    g.ldb = B.ld;
    g.c = out->data;
    g.ldc = max1(g.n);
    g.ab = a->dtype;
    g.cd = out->dtype;
    g.beta = 1;
    if (out->dtype != FL_F64 && !(ws = fl_cu_workspace(out, FL_CU_GEMM_WORKSPACE))) {
        rc = fl_last_status();
        goto done;
    }
    rc = fl_cu_gemm(op, dev, &g, ws ? ws->data : NULL, FL_CU_GEMM_WORKSPACE);
    if (rc == FL_CU_NO_ALGORITHM) rc = no_algorithm(out, g.k);
done:
    fl_tensor_release(A.owned);
    fl_tensor_release(B.owned);
    fl_tensor_release(ws);
    return rc;
}
