/*
 * numeric.h: the bit-exact numeric primitives the C core and the CUDA
 * kernels share, written once: f32 <-> bf16/f16 conversions with dtype.c's
 * rounding (ties to even, NaNs quieted keeping their top payload), the
 * round-to-odd steps that make double -> 16-bit and int64 -> 16-bit one
 * correct rounding, and the Philox-4x32-10 block function of rng.c's
 * contract. core/tensor/dtype.c and rng.c use them on the host;
 * core/cuda/cuda_dtype.cuh and cuda_elem.cuh on the device (nvcc, and g++
 * in the cudasim build), so a tensor converted or filled on either side
 * has the same bits.
 *
 * Every function is branch-free where the host's bulk loops need it to
 * vectorise (fl_select_u32); on the device that costs a few selects.
 */
#ifndef FL_NUMERIC_H
#define FL_NUMERIC_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* On the device too where the CUDA headers are in (nvcc; cudasim's g++),
 * always inlined there: a call would cost a kernel a stack frame (which
 * ptxas reports as spills, failing tools/kernel_resources.lua's check). */
#ifdef __host__
#define FL_HD static __host__ __device__ __forceinline__
#else
#define FL_HD static inline
#endif
#ifdef __CUDA_ARCH__
#define FL_CLZLL(x) __clzll((long long)(x))
#else
#define FL_CLZLL(x) __builtin_clzll(x)
#endif

/* ---- f32 <-> bf16 / f16 ------------------------------------------------------ */

/* Type punning through memcpy: defined behaviour, compiled to a move on
 * the host. On the device the intrinsics: nvcc can keep a memcpy'd local
 * in memory, a stack frame in every kernel that converts. */
FL_HD uint32_t fl_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

FL_HD float fl_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* cond ? a : b as bit masks. Plain ?: here would not vectorise: GCC keeps
 * the float operation of an unselected candidate behind a branch, in case
 * it traps (-ftrapping-math, the default). */
FL_HD uint32_t fl_select_u32(bool cond, uint32_t a, uint32_t b) {
    uint32_t mask = 0u - (uint32_t)cond;
    return (a & mask) | (b & ~mask);
}

/* bf16 is the top half of an f32, so rounding is one integer add: adding
 * 0x7fff plus the lowest kept bit carries into the kept half exactly when
 * the dropped half is above 0x8000, or equal to it with an odd kept half
 * (ties to even). A carry out of the largest finite value lands on the
 * infinity pattern, which is the correct overflow. A NaN must not take the
 * add (it could carry into infinity): it keeps its top half with the top
 * mantissa bit set, a quiet NaN whatever its payload. Both candidates are
 * computed and one selected: the bulk loops have no branch. */
FL_HD uint16_t fl_bf16_from_f32(float value) {
    uint32_t x = fl_f32_bits(value);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (x >> 16) | 0x0040u;
    return (uint16_t)fl_select_u32((x & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded);
}

FL_HD float fl_f32_from_bf16(uint16_t bits) {
    return fl_bits_f32((uint32_t)bits << 16);
}

/* f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. The magnitude falls
 * in one of three ranges; on the host all three results are computed and
 * one selected, so the bulk loops have no branches and vectorise (the
 * device branches instead); each range's result is written once:
 *   >= 65536 or not finite: infinity, or a quiet NaN keeping the top payload;
 *   >= 2^-14 (normal f16): rebias the exponent and round off 13 mantissa
 *     bits with the same add-and-carry trick as bf16 (a carry out of the
 *     mantissa correctly bumps the exponent, and 65520 and up carry into
 *     the infinity pattern 0x7c00);
 *   below 2^-14 (subnormal or zero): the result counts units of 2^-24. Adding
 *     0.5f makes the FPU do the rounding: the spacing of floats in [0.5, 1)
 *     is exactly 2^-24, so the sum is 0.5 plus the magnitude rounded to
 *     nearest even in those units, and subtracting the bits of 0.5f leaves
 *     the unit count (1024, the smallest normal's pattern, when it carries).
 *     Relies on the default rounding mode, which the core never changes. */
FL_HD uint16_t fl_f16_from_f32(float value) {
    uint32_t x = fl_f32_bits(value);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
#define FL_F16_SPECIAL (fl_select_u32(a > 0x7f800000u, 0x7e00u | ((a >> 13) & 0x3ffu), 0x7c00u))
#define FL_F16_NORMAL ((a + 0xc8000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13) /* (15-127) << 23 */
#define FL_F16_SUBNORMAL (fl_f32_bits(fl_bits_f32(a) + 0.5f) - 0x3f000000u)
#ifdef __CUDA_ARCH__
    /* The device takes the one branch it needs: computing all three made
     * ptxas spill in kernels that store f16 (tools/kernel_resources.lua). */
    uint32_t h = a >= 0x47800000u ? FL_F16_SPECIAL : a >= 0x38800000u ? FL_F16_NORMAL : FL_F16_SUBNORMAL;
#else
    uint32_t special = FL_F16_SPECIAL, normal = FL_F16_NORMAL, subnormal = FL_F16_SUBNORMAL;
    uint32_t h = fl_select_u32(a >= 0x47800000u, special,                      /* 65536.0f */
                               fl_select_u32(a >= 0x38800000u, normal, subnormal)); /* 2^-14 */
#endif
#undef FL_F16_SPECIAL
#undef FL_F16_NORMAL
#undef FL_F16_SUBNORMAL
    return (uint16_t)(sign | h);
}

/* Every f16 is exactly an f32; again three candidates and a select. Normal:
 * move the bits up and rebias the exponent (+112 = 127 - 15). Infinity and
 * NaN: the all-ones exponent, payload moved up, and the quiet bit set so a
 * signalling NaN becomes quiet as in hardware conversions. Subnormal:
 * mantissa * 2^-24, exact in float arithmetic. */
FL_HD float fl_f32_from_f16(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t em = bits & 0x7fffu; /* exponent and mantissa */
    uint32_t normal = (em << 13) + (112u << 23);
    uint32_t special = 0x7f800000u | (em << 13) | fl_select_u32(em > 0x7c00u, 0x00400000u, 0);
    uint32_t subnormal = fl_f32_bits((float)(int32_t)em * 0x1p-24f);
    uint32_t f = fl_select_u32(em >= 0x7c00u, special, fl_select_u32(em >= 0x0400u, normal, subnormal));
    return fl_bits_f32(sign | f);
}

/* ---- exact double/int64 -> 16-bit floats ------------------------------------- */

/* Going double -> float -> f16 rounds twice, and twice is wrong: a double
 * just above a halfway point of f16 can round to a float exactly on it, and
 * the second rounding then breaks the tie to even, downward. The classic
 * cure is rounding the first step "to odd": truncate toward zero and set
 * the lowest bit whenever something was cut off. The odd bit remembers
 * "a little more than this" and, since float keeps at least two more bits
 * than f16 (24 vs 11) or bf16 (24 vs 8), the second rounding then gives the
 * correctly rounded result. This holds for subnormals too: float's finest
 * step (2^-149) is far below f16's (2^-24) and bf16's (2^-133). */
FL_HD float fl_f32_round_odd(double d) {
    float f = (float)d; /* nearest; keeps NaN (quiet) and infinities */
    if ((double)f == d || d != d) return f;
    uint32_t b = fl_f32_bits(f);
    /* f is the nearest float, so truncation is f itself or its neighbour
     * toward zero (for an overflow to infinity: the largest finite float). */
    if (fabs((double)f) > fabs(d)) b -= 1u;
    return fl_bits_f32(b | 1u);
}

/* The same idea one level up: int64 -> double rounded to odd, so that
 * int64 -> bf16 rounds once (|v| above 2^53 does not fit a double). */
FL_HD double fl_f64_round_odd_from_i64(int64_t v) {
    uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    if (m < (UINT64_C(1) << 53)) return (double)v;
    int shift = 11 - FL_CLZLL(m); /* bits below the top 53 */
    uint64_t kept = (m >> shift) | ((m & ((UINT64_C(1) << shift) - 1u)) != 0);
    double d = ldexp((double)kept, shift); /* kept has 53 bits: exact */
    return v < 0 ? -d : d;
}

FL_HD uint16_t fl_f16_from_f64(double d) { return fl_f16_from_f32(fl_f32_round_odd(d)); }
FL_HD uint16_t fl_bf16_from_f64(double d) { return fl_bf16_from_f32(fl_f32_round_odd(d)); }

/* ---- Philox-4x32-10 (rng.c states the contract) ------------------------------ */

enum {
    FL_PHILOX_ROUNDS = 10
};

/* Random123's constants: the two round multipliers and the Weyl sequence
 * (golden ratio and sqrt(3) - 1, scaled to 32 bits) that bumps the key. */
#define FL_PHILOX_M0 UINT32_C(0xD2511F53)
#define FL_PHILOX_M1 UINT32_C(0xCD9E8D57)
#define FL_PHILOX_W0 UINT32_C(0x9E3779B9)
#define FL_PHILOX_W1 UINT32_C(0xBB67AE85)

/* Ten rounds of: two 32x32->64 multiplies, whose high halves are mixed with
 * the other two words and the round key and whose low halves are carried
 * over, in Random123's word order. The key advances by the Weyl constants
 * before every round but the first. */
FL_HD void fl_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                 uint32_t k0, uint32_t k1, uint32_t out[4]) {
    for (int round = 0; round < FL_PHILOX_ROUNDS; round++) {
        if (round > 0) {
            k0 += FL_PHILOX_W0;
            k1 += FL_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)FL_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)FL_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

#endif /* FL_NUMERIC_H */
