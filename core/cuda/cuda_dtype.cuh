/*
 * cuda_dtype.cuh: element loads, stores and conversions on the device with
 * exactly the bits of core/tensor/dtype.c (the CPU's reference): float
 * sources through double, integer sources through int64; f16/bf16 rounded
 * once (a round-to-odd first step where a value passes through f32), NaN
 * payloads kept as dtype.c keeps them; float -> integer truncates and
 * saturates, NaN -> 0; integer -> integer saturates. The cuda_fp16
 * intrinsics are not used for stores: they canonicalise NaNs, and a copy
 * between devices must give the same bits either way. Every CUDA kernel
 * file reads and writes elements through these (via cuda_common.cuh).
 */
#ifndef FL_CUDA_DTYPE_CUH
#define FL_CUDA_DTYPE_CUH

#include <stdint.h>

#include "numeric.h"

/* The f32 <-> bf16/f16 conversions and round-to-odd steps are numeric.h's,
 * the same code dtype.c runs. */

/* Float -> integer: truncate, saturate at [lo, hi] (exact doubles), NaN -> 0. */
__device__ __forceinline__ int64_t fl_cu_int_from_f64(double d, double lo, double hi) {
    if (d != d) return 0;
    if (d <= lo) return lo <= -0x1p63 ? INT64_MIN : (int64_t)lo;
    if (d >= hi) return hi >= 0x1p63 ? INT64_MAX : (int64_t)hi;
    return (int64_t)d;
}

__device__ __forceinline__ int64_t fl_cu_clamp_i64(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Element i (in elements) of p, of dtype d, as double (exact for floats). */
__device__ __forceinline__ double fl_cu_get_f64(const void *p, int64_t i, int d) {
    switch (d) {
    case FL_F32: return ((const float *)p)[i];
    case FL_F64: return ((const double *)p)[i];
    case FL_F16: return fl_f32_from_f16(((const uint16_t *)p)[i]);
    case FL_BF16: return fl_f32_from_bf16(((const uint16_t *)p)[i]);
    case FL_I64: return (double)((const long long *)p)[i];
    case FL_I32: return ((const int32_t *)p)[i];
    case FL_I16: return ((const int16_t *)p)[i];
    case FL_I8: return ((const int8_t *)p)[i];
    case FL_U32: return ((const uint32_t *)p)[i];
    case FL_U16: return ((const uint16_t *)p)[i];
    case FL_U8: return ((const uint8_t *)p)[i];
    case FL_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
    }
}

__device__ __forceinline__ int64_t fl_cu_get_i64(const void *p, int64_t i, int d) {
    switch (d) {
    case FL_I64: return ((const long long *)p)[i];
    case FL_I32: return ((const int32_t *)p)[i];
    case FL_I16: return ((const int16_t *)p)[i];
    case FL_I8: return ((const int8_t *)p)[i];
    case FL_U32: return ((const uint32_t *)p)[i];
    case FL_U16: return ((const uint16_t *)p)[i];
    case FL_U8: return ((const uint8_t *)p)[i];
    case FL_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return fl_cu_int_from_f64(fl_cu_get_f64(p, i, d), -0x1p63, 0x1p63);
    }
}

/* As fl_cu_get_f64 then to float: what fl_convert(-> f32) gives (one
 * rounding: doubles and int64 round directly to float). */
__device__ __forceinline__ float fl_cu_get_f32(const void *p, int64_t i, int d) {
    switch (d) {
    case FL_F32: return ((const float *)p)[i];
    case FL_F16: return fl_f32_from_f16(((const uint16_t *)p)[i]);
    case FL_BF16: return fl_f32_from_bf16(((const uint16_t *)p)[i]);
    case FL_I64: return __ll2float_rn(((const long long *)p)[i]);
    case FL_U32: return __uint2float_rn(((const uint32_t *)p)[i]);
    case FL_I32: return __int2float_rn(((const int32_t *)p)[i]);
    default: return __double2float_rn(fl_cu_get_f64(p, i, d));
    }
}

__device__ __forceinline__ void fl_cu_put_f64(void *p, int64_t i, int d, double v) {
    switch (d) {
    case FL_F32: ((float *)p)[i] = __double2float_rn(v); break;
    case FL_F64: ((double *)p)[i] = v; break;
    case FL_F16: ((uint16_t *)p)[i] = fl_f16_from_f32(fl_f32_round_odd(v)); break;
    case FL_BF16: ((uint16_t *)p)[i] = fl_bf16_from_f32(fl_f32_round_odd(v)); break;
    case FL_I64: ((long long *)p)[i] = fl_cu_int_from_f64(v, -0x1p63, 0x1p63); break;
    case FL_I32: ((int32_t *)p)[i] = (int32_t)fl_cu_int_from_f64(v, INT32_MIN, INT32_MAX); break;
    case FL_I16: ((int16_t *)p)[i] = (int16_t)fl_cu_int_from_f64(v, INT16_MIN, INT16_MAX); break;
    case FL_I8: ((int8_t *)p)[i] = (int8_t)fl_cu_int_from_f64(v, INT8_MIN, INT8_MAX); break;
    case FL_U32: ((uint32_t *)p)[i] = (uint32_t)fl_cu_int_from_f64(v, 0, UINT32_MAX); break;
    case FL_U16: ((uint16_t *)p)[i] = (uint16_t)fl_cu_int_from_f64(v, 0, UINT16_MAX); break;
    case FL_U8: ((uint8_t *)p)[i] = (uint8_t)fl_cu_int_from_f64(v, 0, UINT8_MAX); break;
    case FL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: break;
    }
}

/* A float result: f32/f16/bf16 directly from the float (exactly what
 * fl_convert does from an f32 buffer), others through double. */
__device__ __forceinline__ void fl_cu_put_f32(void *p, int64_t i, int d, float v) {
    switch (d) {
    case FL_F32: ((float *)p)[i] = v; break;
    case FL_F16: ((uint16_t *)p)[i] = fl_f16_from_f32(v); break;
    case FL_BF16: ((uint16_t *)p)[i] = fl_bf16_from_f32(v); break;
    default: fl_cu_put_f64(p, i, d, (double)v); break;
    }
}

__device__ __forceinline__ void fl_cu_put_i64(void *p, int64_t i, int d, int64_t v) {
    switch (d) {
    case FL_F32: ((float *)p)[i] = __ll2float_rn(v); break;
    case FL_F64: ((double *)p)[i] = __ll2double_rn(v); break;
    case FL_F16: ((uint16_t *)p)[i] = fl_f16_from_f32(fl_f32_round_odd(fl_f64_round_odd_from_i64(v))); break;
    case FL_BF16: ((uint16_t *)p)[i] = fl_bf16_from_f32(fl_f32_round_odd(fl_f64_round_odd_from_i64(v))); break;
    case FL_I64: ((long long *)p)[i] = v; break;
    case FL_I32: ((int32_t *)p)[i] = (int32_t)fl_cu_clamp_i64(v, INT32_MIN, INT32_MAX); break;
    case FL_I16: ((int16_t *)p)[i] = (int16_t)fl_cu_clamp_i64(v, INT16_MIN, INT16_MAX); break;
    case FL_I8: ((int8_t *)p)[i] = (int8_t)fl_cu_clamp_i64(v, INT8_MIN, INT8_MAX); break;
    case FL_U32: ((uint32_t *)p)[i] = (uint32_t)fl_cu_clamp_i64(v, 0, UINT32_MAX); break;
    case FL_U16: ((uint16_t *)p)[i] = (uint16_t)fl_cu_clamp_i64(v, 0, UINT16_MAX); break;
    case FL_U8: ((uint8_t *)p)[i] = (uint8_t)fl_cu_clamp_i64(v, 0, UINT8_MAX); break;
    case FL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: break;
    }
}

/* Element si of src into element di of dst, both of one dtype of `size` bytes. */
__device__ __forceinline__ void fl_cu_move_one(void *dst, int64_t di, const void *src, int64_t si,
                                               int size) {
    switch (size) {
    case 1: ((uint8_t *)dst)[di] = ((const uint8_t *)src)[si]; break;
    case 2: ((uint16_t *)dst)[di] = ((const uint16_t *)src)[si]; break;
    case 4: ((uint32_t *)dst)[di] = ((const uint32_t *)src)[si]; break;
    default: ((uint64_t *)dst)[di] = ((const uint64_t *)src)[si]; break;
    }
}

/* Element si of src (dtype sd) into element di of dst (dtype dd), as
 * fl_convert: same dtype moves bytes, float sources go through double,
 * integer sources through int64. */
__device__ __forceinline__ void fl_cu_convert_one(void *dst, int64_t di, int dd, const void *src,
                                                  int64_t si, int sd, int size) {
    if (dd == sd) {
        fl_cu_move_one(dst, di, src, si, size);
    } else if (sd == FL_F32 || sd == FL_F64 || sd == FL_F16 || sd == FL_BF16) {
        fl_cu_put_f64(dst, di, dd, fl_cu_get_f64(src, si, sd));
    } else {
        fl_cu_put_i64(dst, di, dd, fl_cu_get_i64(src, si, sd));
    }
}

#endif /* FL_CUDA_DTYPE_CUH */
