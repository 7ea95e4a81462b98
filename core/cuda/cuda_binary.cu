/*
 * cuda_binary.cu: the GPU kernel table of the elementwise binary family
 * (add, sub, mul, div, a + alpha * b), the twin of core/cpu/cpu_binary.c.
 *
 * Same compute types as the CPU: f64 for f64 outputs, f32 for the other
 * float outputs, int64 for integer outputs; operands of any dtype and any
 * strides (stride 0 where they broadcast) are converted on load as
 * fl_convert would, and results stored with dtype.c's rounding. The
 * multiply and add of axpy are separate roundings (__fmul_rn, __fadd_rn),
 * never contracted into an FMA, as on the CPU, so results match the CPU's
 * bit for bit.
 */
#include "cuda_elem.cuh"
#include "cuda_vec.cuh"

extern "C" {
#include "backend.h"
}

/* The operation in compute type T (float, double or int64 through
 * unsigned arithmetic, which wraps as the CPU's int64 does in practice). */
__device__ __forceinline__ float binary_op(int op, float x, float y, float al) {
    switch (op) {
    case FL_ADD: return __fadd_rn(x, y);
    case FL_SUB: return __fsub_rn(x, y);
    case FL_MUL: return __fmul_rn(x, y);
    case FL_DIV: return __fdiv_rn(x, y);
    default: return __fadd_rn(x, __fmul_rn(al, y));
    }
}

__device__ __forceinline__ double binary_op(int op, double x, double y, double al) {
    switch (op) {
    case FL_ADD: return __dadd_rn(x, y);
    case FL_SUB: return __dsub_rn(x, y);
    case FL_MUL: return __dmul_rn(x, y);
    case FL_DIV: return __ddiv_rn(x, y);
    default: return __dadd_rn(x, __dmul_rn(al, y));
    }
}

__device__ __forceinline__ int64_t binary_op(int op, int64_t x, int64_t y, int64_t al) {
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    switch (op) {
    case FL_ADD: return (int64_t)(ux + uy);
    case FL_SUB: return (int64_t)(ux - uy);
    case FL_MUL: return (int64_t)(ux * uy);
    case FL_DIV: return y == 0 ? 0 : (y == -1 ? (int64_t)(0 - ux) : x / y);
    default: return (int64_t)(ux + (uint64_t)al * uy);
    }
}

__device__ __forceinline__ float load_as(float, const void *p, int64_t i, int d) {
    return fl_cu_get_f32(p, i, d);
}
__device__ __forceinline__ double load_as(double, const void *p, int64_t i, int d) {
    return fl_cu_get_f64(p, i, d);
}
__device__ __forceinline__ int64_t load_as(int64_t, const void *p, int64_t i, int d) {
    return fl_cu_get_i64(p, i, d);
}
__device__ __forceinline__ void store_as(void *p, int64_t i, int d, float v) { fl_cu_put_f32(p, i, d, v); }
__device__ __forceinline__ void store_as(void *p, int64_t i, int d, double v) { fl_cu_put_f64(p, i, d, v); }
__device__ __forceinline__ void store_as(void *p, int64_t i, int d, int64_t v) { fl_cu_put_i64(p, i, d, v); }

template <typename T>
__global__ void binary_kernel(fl_cu_iter it, int op, T al, void *out, int od, const void *a, int ad,
                              const void *b, int bd) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        T x = load_as(T(), a, off[1], ad), y = load_as(T(), b, off[2], bd);
        store_as(out, off[0], od, binary_op(op, x, y, al));
    }
}

/* The dense path (every operand contiguous, of one float dtype, aligned):
 * cuda_vec.cuh's map with this op in f32. */
struct binary_fn {
    int op;
    float al;
    __device__ __forceinline__ float operator()(float x, float y) const { return binary_op(op, x, y, al); }
};

/* dtype.c's double -> int64 (the CPU's (T)alpha for integer axpy). */
static int64_t alpha_i64(double v) {
    if (v != v) return 0;
    if (v >= 0x1p63) return INT64_MAX;
    if (v <= -0x1p63) return INT64_MIN;
    return (int64_t)v;
}

static const char *binary_name(int op) {
    static const char *names[] = {"add", "sub", "mul", "div", "axpy"};
    return op >= 0 && op <= FL_AXPY ? names[op] : "binary";
}

static int cuda_binary(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b,
                       double alpha) {
    const char *name = binary_name(op);
    if (out->numel == 0) return FL_OK;
    if (fl_cu_use_device(name, out)) return fl_last_status();
    const fl_tensor *ts[3] = {out, a, b};
    cudaStream_t s = fl_cu_stream();
    if (fl_cu_vec_ok(out->dtype, 3, ts)) {
        binary_fn f = {op, (float)alpha};
        fl_cu_vec_dispatch(out->dtype, VDT,
                           fl_cu_vec_map_kernel<VDT, 2, binary_fn><<<fl_cu_vec_map_blocks(out, FL_CU_THREADS), FL_CU_THREADS,
                                                         0, s>>>(out->numel, out->data, a->data, b->data, f));
        return fl_cu_check(name);
    }
    fl_cu_iter it;
    fl_cu_iter_init(&it, 3, ts);
    unsigned blocks = fl_cu_blocks(it.numel, FL_CU_THREADS);
    if (out->dtype == FL_F64)
        binary_kernel<double><<<blocks, FL_CU_THREADS, 0, s>>>(it, op, alpha, out->data, out->dtype,
                                                               a->data, a->dtype, b->data, b->dtype);
    else if (fl_dtype_is_float(out->dtype))
        binary_kernel<float><<<blocks, FL_CU_THREADS, 0, s>>>(it, op, (float)alpha, out->data,
                                                              out->dtype, a->data, a->dtype,
                                                              b->data, b->dtype);
    else
        binary_kernel<int64_t><<<blocks, FL_CU_THREADS, 0, s>>>(it, op, alpha_i64(alpha), out->data,
                                                                out->dtype, a->data, a->dtype,
                                                                b->data, b->dtype);
    return fl_cu_check(name);
}

const fl_binary_kernels fl_cuda_binary_kernels = {cuda_binary};
