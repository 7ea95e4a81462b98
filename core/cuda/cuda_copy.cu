/*
 * cuda_copy.cu: the tensor core's element kernels on the GPU: strided copy
 * with dtype conversion (broadcast sources included), fill, and the
 * uniform/int random fills of the counter-based generator.
 *
 * Copies give the bits of the CPU's copy (cuda_elem.cuh's conversions
 * mirror dtype.c). Random fills evaluate rng.c's contract element by
 * element: one thread per Philox block writes the 4 (uniform) or 2 (int)
 * elements that block serves. Uniform and int values are integer
 * arithmetic plus one double multiply-add done without contraction
 * (__dmul_rn, __dadd_rn, as the CPU's separate multiply and add), so they
 * equal the CPU's bit for bit. Normal values are not generated here: they
 * go through log and cos in double, and CUDA's libdevice and glibc's libm
 * differ in the last bit for some arguments, which would make a GPU-
 * initialised model differ from a CPU-initialised one.
 */
#include "cuda_elem.cuh"
#include "cuda_elem.h"

/* ---- copy ----------------------------------------------------------------------- */

__global__ void copy_kernel(fl_cu_iter it, char *dst, int dd, const char *src, int sd, int size) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        fl_cu_convert_one(dst, off[0], dd, src, off[1], sd, size);
    }
}

extern "C" int fl_cuda_copy_kernel(fl_tensor *dst, const fl_tensor *src) {
    if (dst->numel == 0) return FL_OK;
    if (fl_cu_use_device("copy_", dst)) return fl_last_status();
    const fl_tensor *ts[2] = {dst, src};
    fl_cu_iter it;
    fl_cu_iter_init(&it, 2, ts);
    if (it.dense && dst->dtype == src->dtype) {
        size_t nbytes = (size_t)dst->numel * fl_dtype_size(dst->dtype);
        cudaError_t e = cudaMemcpyAsync(dst->data, src->data, nbytes, cudaMemcpyDeviceToDevice,
                                        fl_cu_stream());
        if (e != cudaSuccess)
            return fl_fail(FL_ERR_DEVICE, "copy_ on cuda: %s", cudaGetErrorString(e));
        return FL_OK;
    }
    copy_kernel<<<fl_cu_blocks(it.numel, FL_CU_THREADS), FL_CU_THREADS, 0, fl_cu_stream()>>>(
        it, (char *)dst->data, dst->dtype, (const char *)src->data, src->dtype,
        (int)fl_dtype_size(dst->dtype));
    return fl_cu_check("copy_");
}

/* ---- fill ----------------------------------------------------------------------- */

__global__ void fill_kernel(fl_cu_iter it, char *dst, int size, uint64_t bits) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        switch (size) {
        case 1: ((uint8_t *)dst)[off[0]] = (uint8_t)bits; break;
        case 2: ((uint16_t *)dst)[off[0]] = (uint16_t)bits; break;
        case 4: ((uint32_t *)dst)[off[0]] = (uint32_t)bits; break;
        default: ((uint64_t *)dst)[off[0]] = bits; break;
        }
    }
}

extern "C" int fl_cuda_fill_kernel(fl_tensor *t, const void *element) {
    if (t->numel == 0) return FL_OK;
    if (fl_cu_use_device("fill_", t)) return fl_last_status();
    int size = (int)fl_dtype_size(t->dtype);
    uint64_t bits = 0;
    memcpy(&bits, element, (size_t)size); /* little-endian: the low bytes */
    const fl_tensor *ts[1] = {t};
    fl_cu_iter it;
    fl_cu_iter_init(&it, 1, ts);
    fill_kernel<<<fl_cu_blocks(it.numel, FL_CU_THREADS), FL_CU_THREADS, 0, fl_cu_stream()>>>(
        it, (char *)t->data, size, bits);
    return fl_cu_check("fill_");
}

/* ---- random --------------------------------------------------------------------- */

/* fl_random_spec's kinds (in C++ its enum is scoped to the struct). */
enum { RANDOM_UNIFORM = fl_random_spec::FL_RANDOM_UNIFORM, RANDOM_INT = fl_random_spec::FL_RANDOM_INT };

/* What one fill needs on the device (a copy of fl_random_spec's fields). */
struct random_args {
    int kind; /* RANDOM_UNIFORM or RANDOM_INT */
    uint64_t seed, stream, g0;
    double low, span;      /* uniform: low + span * u */
    int64_t ilow;          /* int: low + floor(x * range / 2^64) */
    uint64_t range;
};

/* Thread j owns Philox block first + j and writes the elements of it that
 * fall in [g0, g0 + numel). */
__global__ void random_kernel(fl_cu_iter it, char *dst, int dt, random_args a, int shift,
                              uint64_t nblocks) {
    uint64_t first = a.g0 >> shift;
    for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; j < nblocks;
         j += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t b = (first + j) & (UINT64_MAX >> shift); /* block indices wrap as g does */
        uint32_t w[4];
        fl_cu_philox(b, a.stream, a.seed, w);
        for (int e = 0; e < (1 << shift); e++) {
            uint64_t g = (b << shift) + (uint64_t)e, i = g - a.g0;
            if (i >= (uint64_t)it.numel) continue; /* before g0 (wraps) or past the end */
            int64_t off[FL_CU_ITER_MAX];
            fl_cu_iter_offsets(it, (int64_t)i, off);
            if (a.kind == RANDOM_UNIFORM) {
                double u = (double)(w[g & 3] >> 8) * 0x1p-24;
                fl_cu_put_f64(dst, off[0], dt, __dadd_rn(a.low, __dmul_rn(a.span, u)));
            } else {
                int k = 2 * (int)(g & 1);
                uint64_t x = (uint64_t)w[k] | (uint64_t)w[k + 1] << 32;
                uint64_t offset = __umul64hi(x, a.range);
                fl_cu_put_i64(dst, off[0], dt, (int64_t)((uint64_t)a.ilow + offset));
            }
        }
    }
}

extern "C" int fl_cuda_random_kernel(fl_tensor *t, const fl_random_spec *spec) {
    int kind = (int)spec->kind;
    if (kind != RANDOM_UNIFORM && kind != RANDOM_INT)
        return fl_fail(FL_ERR_UNSUPPORTED, "random on cuda: only uniform and int fills run on "
                                           "the device");
    if (t->numel == 0) return FL_OK;
    if (fl_cu_use_device("random", t)) return fl_last_status();
    random_args a;
    a.kind = kind;
    a.seed = spec->seed;
    a.stream = spec->stream;
    a.g0 = spec->first_index;
    a.low = spec->a;
    a.span = spec->b - spec->a; /* the CPU computes the same double per element */
    a.ilow = spec->ilow;
    a.range = spec->ihigh > spec->ilow ? (uint64_t)spec->ihigh - (uint64_t)spec->ilow : 0;
    int shift = kind == RANDOM_UNIFORM ? 2 : 1;
    uint64_t last = a.g0 + (uint64_t)t->numel - 1;
    uint64_t nblocks = (last >> shift) - (a.g0 >> shift) + 1;
    if (last < a.g0) /* the element indices wrap past 2^64: blocks wrap too */
        nblocks = (last >> shift) + (UINT64_MAX >> shift) - (a.g0 >> shift) + 2;
    const fl_tensor *ts[1] = {t};
    fl_cu_iter it;
    fl_cu_iter_init(&it, 1, ts);
    random_kernel<<<fl_cu_blocks((int64_t)nblocks, FL_CU_THREADS), FL_CU_THREADS, 0,
                    fl_cu_stream()>>>(it, (char *)t->data, t->dtype, a, shift, nblocks);
    return fl_cu_check("random");
}
