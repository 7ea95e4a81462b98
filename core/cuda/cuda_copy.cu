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
 *
 * Copies move 16 bytes per thread step where the layout allows it (see
 * copy_vec_plan): a dense same-dtype copy is a device memcpy; a dense
 * conversion between f32, bf16 and f16, and any copy (same dtype or such
 * a conversion) whose innermost dim is contiguous in both tensors in whole
 * aligned vectors (the attention heads' [B,T,H,D] <-> [B,H,T,D]
 * transposes), go through vector kernels with the index arithmetic done
 * once per vector. Everything else walks element by element.
 */
#include "cuda_elem.cuh"
#include "cuda_elem.h"
#include "cuda_vec.cuh"

/* ---- copy ----------------------------------------------------------------------- */

__global__ void copy_kernel(fl_cu_iter it, char *dst, int dd, const char *src, int sd, int size) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[FL_CU_ITER_MAX];
        fl_cu_iter_offsets(it, i, off);
        fl_cu_convert_one(dst, off[0], dd, src, off[1], sd, size);
    }
}

/* A copy served FL_CU_VEC_BYTES at a time: the iterator's walk with the
 * innermost dim (contiguous in both tensors) counted in groups of E
 * elements that are whole aligned vectors in both. A dense walk (ndim 1)
 * may end in a partial group (the tail, done element by element); a
 * strided one may not. */
struct copy_vec_plan {
    int ndim;
    int64_t nv; /* whole groups */
    int64_t n;  /* elements walked: nv * E plus a dense walk's tail */
    int64_t shape[FL_MAX_DIMS];     /* the last in groups */
    int64_t stride[2][FL_MAX_DIMS]; /* dst, src per step of each dim: bytes for moves,
                                       elements for conversions */
};

/* Offsets (stride units) in dst and src of group v: one division per
 * outer dim, in I (32 bits when the group count allows: much cheaper). */
template <typename I>
__device__ __forceinline__ void copy_vec_offsets(const copy_vec_plan &p, I v, int64_t &od,
                                                 int64_t &os) {
    od = 0;
    os = 0;
#pragma unroll
    for (int d = FL_MAX_DIMS - 1; d > 0; d--) {
        if (d >= p.ndim) continue;
        I n = (I)p.shape[d], q = v / n, j = v - q * n;
        od += (int64_t)j * p.stride[0][d];
        os += (int64_t)j * p.stride[1][d];
        v = q;
    }
    od += (int64_t)v * p.stride[0][0];
    os += (int64_t)v * p.stride[1][0];
}

/* Same dtype, any element size: raw 16-byte moves (plan strides in bytes). */
template <typename I>
__global__ void copy_move_vec_kernel(copy_vec_plan p, char *dst, const char *src, int size) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = t; v < p.nv; v += stride) {
        int64_t od, os;
        copy_vec_offsets<I>(p, (I)v, od, os);
        *(uint4 *)(dst + od) = *(const uint4 *)(src + os);
    }
    int e = FL_CU_VEC_BYTES / size;
    for (int64_t i = p.nv * e + t; i < p.n; i += stride) fl_cu_move_one(dst, i, src, i, size);
}

/* fl_cu_convert_one between distinct float dtypes, element for element:
 * the scalar path takes the value through double and back (put_f64), which
 * for anything but NaN gives the float itself (exact: f16 and bf16 values
 * are floats), so only a NaN takes that path here too, for its bits. */
__device__ __forceinline__ float copy_cast_value(float x) {
    return x == x ? x : __double2float_rn((double)x);
}

/* A conversion from SD to DD (distinct float dtypes; plan strides in
 * elements): E elements per group, E / N vectors of each side. */
template <typename I, int SD, int DD>
__global__ void copy_cast_vec_kernel(copy_vec_plan p, void *dst, const void *src) {
    typedef fl_cu_vec<SD> VS;
    typedef fl_cu_vec<DD> VD;
    constexpr int E = VS::N > VD::N ? VS::N : VD::N;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = t; v < p.nv; v += stride) {
        int64_t od, os;
        copy_vec_offsets<I>(p, (I)v, od, os);
        VS in[E / VS::N];
        VD out[E / VD::N];
#pragma unroll
        for (int j = 0; j < E / VS::N; j++) in[j] = VS::load(src, os / VS::N + j);
#pragma unroll
        for (int k = 0; k < E; k++)
            out[k / VD::N].set(k % VD::N, copy_cast_value(in[k / VS::N].get(k % VS::N)));
#pragma unroll
        for (int j = 0; j < E / VD::N; j++) out[j].store(dst, od / VD::N + j);
    }
    for (int64_t i = p.nv * E + t; i < p.n; i += stride)
        fl_cu_vput<DD>(dst, i, copy_cast_value(fl_cu_vget<SD>(src, i)));
}

/* The plan of a copy on walk it (dst, src) in groups of e elements, where
 * a stride step of tensor k must be a multiple of unit[k] elements (its
 * vector) and is stored times scale[k]; false where the layout does not
 * allow one. */
static bool copy_vec_plan_of(const fl_cu_iter *it, const fl_tensor *dst, const fl_tensor *src,
                             int e, const int unit[2], const int scale[2], copy_vec_plan *p) {
    int last = it->ndim - 1;
    if (!fl_cu_vec_aligned(dst->data) || !fl_cu_vec_aligned(src->data)) return false;
    if (it->stride[0][last] != 1 || it->stride[1][last] != 1) return false;
    if (!it->dense && it->shape[last] % e != 0) return false;
    memset(p, 0, sizeof *p);
    p->ndim = it->ndim;
    for (int d = 0; d < it->ndim; d++) {
        p->shape[d] = it->shape[d];
        for (int k = 0; k < 2; k++) {
            if (d < last && it->stride[k][d] % unit[k] != 0) return false;
            p->stride[k][d] = (d < last ? it->stride[k][d] : e) * scale[k];
        }
    }
    p->shape[last] /= e;
    p->nv = it->numel / e; /* whole groups: all of them when strided */
    p->n = it->numel;
    return p->nv > 0;
}

/* Launches the conversion kernel for (sd, dd) with index type I. */
template <typename I>
static void copy_cast_launch(const copy_vec_plan &p, fl_tensor *dst, const fl_tensor *src) {
    unsigned blocks = fl_cu_blocks(p.nv, FL_CU_THREADS);
    cudaStream_t s = fl_cu_stream();
    fl_dtype sd = src->dtype, dd = dst->dtype;
#define FL_CAST_CASE(SD, DD)                                                                      \
    if (sd == SD && dd == DD)                                                                      \
        copy_cast_vec_kernel<I, SD, DD><<<blocks, FL_CU_THREADS, 0, s>>>(p, dst->data, src->data);
    FL_CAST_CASE(FL_F32, FL_BF16)
    else FL_CAST_CASE(FL_F32, FL_F16)
    else FL_CAST_CASE(FL_BF16, FL_F32)
    else FL_CAST_CASE(FL_F16, FL_F32)
    else FL_CAST_CASE(FL_BF16, FL_F16)
    else FL_CAST_CASE(FL_F16, FL_BF16)
#undef FL_CAST_CASE
}

/* The vector path of a copy where it applies: true when launched. */
static bool copy_vec(const fl_cu_iter *it, fl_tensor *dst, const fl_tensor *src) {
    copy_vec_plan p;
    if (dst->dtype == src->dtype) {
        int size = (int)fl_dtype_size(dst->dtype), e = FL_CU_VEC_BYTES / size;
        int unit[2] = {e, e}, scale[2] = {size, size};
        if (size > FL_CU_VEC_BYTES || !copy_vec_plan_of(it, dst, src, e, unit, scale, &p))
            return false;
        unsigned blocks = fl_cu_blocks(p.nv, FL_CU_THREADS);
        if (p.nv <= (int64_t)UINT32_MAX) /* group indices fit 32 bits */
            copy_move_vec_kernel<uint32_t><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
                p, (char *)dst->data, (const char *)src->data, size);
        else
            copy_move_vec_kernel<uint64_t><<<blocks, FL_CU_THREADS, 0, fl_cu_stream()>>>(
                p, (char *)dst->data, (const char *)src->data, size);
        return true;
    }
    if (!fl_cu_vec_dtype(dst->dtype) || !fl_cu_vec_dtype(src->dtype)) return false;
    int ud = FL_CU_VEC_BYTES / (int)fl_dtype_size(dst->dtype);
    int us = FL_CU_VEC_BYTES / (int)fl_dtype_size(src->dtype);
    int unit[2] = {ud, us}, scale[2] = {1, 1};
    if (!copy_vec_plan_of(it, dst, src, ud > us ? ud : us, unit, scale, &p)) return false;
    if (p.nv <= (int64_t)UINT32_MAX)
        copy_cast_launch<uint32_t>(p, dst, src);
    else
        copy_cast_launch<uint64_t>(p, dst, src);
    return true;
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
    if (copy_vec(&it, dst, src)) return fl_cu_check("copy_");
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

/* A dense, aligned fill: the element's bytes repeated over 16-byte stores,
 * the elements past the last whole vector one by one. */
__global__ void fill_vec_kernel(int64_t n, char *dst, int size, uint64_t bits, uint4 pattern) {
    int64_t nv = n * size / FL_CU_VEC_BYTES, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t v = t; v < nv; v += stride) ((uint4 *)dst)[v] = pattern;
    for (int64_t i = nv * (FL_CU_VEC_BYTES / size) + t; i < n; i += stride) {
        switch (size) {
        case 1: ((uint8_t *)dst)[i] = (uint8_t)bits; break;
        case 2: ((uint16_t *)dst)[i] = (uint16_t)bits; break;
        case 4: ((uint32_t *)dst)[i] = (uint32_t)bits; break;
        default: ((uint64_t *)dst)[i] = bits; break;
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
    if (it.dense && fl_cu_vec_aligned(t->data)) {
        uint4 pattern;
        unsigned char bytes[FL_CU_VEC_BYTES];
        for (int k = 0; k < FL_CU_VEC_BYTES; k += size) memcpy(bytes + k, &bits, (size_t)size);
        memcpy(&pattern, bytes, sizeof pattern);
        fill_vec_kernel<<<fl_cu_vec_blocks(t->numel, FL_CU_VEC_BYTES / size, FL_CU_THREADS),
                          FL_CU_THREADS, 0, fl_cu_stream()>>>(t->numel, (char *)t->data, size, bits,
                                                              pattern);
        return fl_cu_check("fill_");
    }
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
