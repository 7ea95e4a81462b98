/*
 * cuda_compare.cu: the GPU kernels of the comparisons (bool results) and
 * of where(cond, a, b) (twins of core/cpu/cpu_compare.c), and the GPU
 * kernel table of the elementwise family, fl_cuda_elementwise_kernels.
 *
 * Comparisons read both operands as int64 when both are integers (exact
 * for every integer dtype) and as double otherwise (exact for every float),
 * so results equal the CPU's. where moves whole elements, converting to
 * the output dtype only when an operand has another dtype.
 */
#include "cuda_elem.cuh"
#include "cuda_elementwise.cuh"

template <typename K>
__device__ __forceinline__ bool relation(int op, K x, K y) {
    switch (op) {
    case FL_EQ: return x == y;
    case FL_NE: return x != y;
    case FL_LT: return x < y;
    case FL_LE: return x <= y;
    case FL_GT: return x > y;
    default: return x >= y;
    }
}

__device__ __forceinline__ double load_k(double, const void *p, int64_t i, int d) {
    return fl_cu_get_f64(p, i, d);
}
__device__ __forceinline__ long long load_k(long long, const void *p, int64_t i, int d) {
    return fl_cu_get_i64(p, i, d);
}

template <typename K>
__global__ void compare_kernel(fl_cu_iter it, int op, uint8_t *out, const void *a, int ad,
                               const void *b, int bd) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        out[off[0]] = relation(op, load_k(K(), a, off[1], ad), load_k(K(), b, off[2], bd));
    }
}

int fl_cuda_compare(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b) {
    static const char *names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
    if (op < 0 || op >= FL_COMPARE_OP_COUNT)
        return fl_fail(FL_ERR_ARG, "compare on cuda: invalid op %d", op);
    const char *name = names[op];
    if (out->dtype != FL_BOOL && out->dtype != FL_U8)
        return fl_fail(FL_ERR_UNSUPPORTED, "%s on cuda: output must be bool, got %s", name,
                       fl_dtype_name(out->dtype));
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device(name, out)) return fl_last_status();
    const fl_tensor *ts[3] = {out, a, b};
    fl_cu_iter it;
    fl_cu_iter_init(&it, 3, ts);
    unsigned blocks = fl_cu_blocks(it.numel, FL_CU_THREADS);
    bool integers = !fl_dtype_is_float(a->dtype) && !fl_dtype_is_float(b->dtype);
    if (integers)
        compare_kernel<long long><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            it, op, (uint8_t *)out->data, a->data, a->dtype, b->data, b->dtype);
    else
        compare_kernel<double><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
            it, op, (uint8_t *)out->data, a->data, a->dtype, b->data, b->dtype);
    return fl_cu_check(name);
}

/* ---- where ------------------------------------------------------------------------ */

__global__ void where_kernel(fl_cu_iter it, void *out, int od, int size, const uint8_t *cond,
                             const void *a, int ad, const void *b, int bd) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        if (cond[off[1]])
            fl_cu_convert_one(out, off[0], od, a, off[2], ad, size);
        else
            fl_cu_convert_one(out, off[0], od, b, off[3], bd, size);
    }
}

int fl_cuda_where(fl_tensor *out, const fl_tensor *cond, const fl_tensor *a, const fl_tensor *b) {
    if (fl_dtype_size(cond->dtype) != 1)
        return fl_fail(FL_ERR_UNSUPPORTED, "where on cuda: condition must be bool, got %s",
                       fl_dtype_name(cond->dtype));
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device("where", out)) return fl_last_status();
    const fl_tensor *ts[4] = {out, cond, a, b};
    fl_cu_iter it;
    fl_cu_iter_init(&it, 4, ts);
    where_kernel<<<fl_cu_blocks(it.numel, FL_CU_THREADS), FL_CU_THREADS, 0, fl_cu_stream()>>>(
        it, out->data, out->dtype, (int)fl_dtype_size(out->dtype), (const uint8_t *)cond->data,
        a->data, a->dtype, b->data, b->dtype);
    return fl_cu_check("where");
}

/* ---- the table ---------------------------------------------------------------------- */

/* In the order of fl_elementwise_kernels' fields (C++17 has no designated
 * initializers). */
const fl_elementwise_kernels fl_cuda_elementwise_kernels = {
    fl_cuda_unary,   fl_cuda_unary_backward, fl_cuda_silu_mul, fl_cuda_silu_mul_backward,
    fl_cuda_dropout, fl_cuda_sum,            fl_cuda_minmax,   fl_cuda_scatter_dim,
    fl_cuda_compare, fl_cuda_where,  fl_cuda_moe_route, fl_cuda_moe_route_backward,
};
