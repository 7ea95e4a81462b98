/*
 * rng.c: the counter-based random number generator of the core.
 *
 * Philox-4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2,
 * 3", SC11; the Random123 reference) maps a 128-bit counter and a 64-bit key
 * to 128 random bits with no state in between. That is what deferred,
 * sharded parameter init needs: a rank computes just the elements of its
 * shard, and they equal the same elements of a single-process init of the
 * whole model, for any world size.
 *
 * THE MAPPING BELOW IS A CONTRACT. Changing any detail of it changes every
 * initialised model and every checkpoint comparison against older runs.
 *
 *   key      = { lo32(seed), hi32(seed) }
 *   g        = spec->first_index + index      (uint64, wraps)
 *   block(b) = fl_philox4x32_10(counter = { lo32(b), hi32(b),
 *                                        lo32(stream), hi32(stream) }, key)
 *              -> words w[0..3]
 *
 *   UNIFORM: b = g >> 2, word x = w[g & 3].
 *            u = (x >> 8) * 2^-24, a multiple of 2^-24 in [0, 1) (as
 *            PyTorch's float uniform; exact in f32, so an f32 tensor with
 *            [low, high) = [0, 1) never holds 1).
 *            value = low + (high - low) * u, in double.
 *   NORMAL:  b = g >> 1, words x1 = w[2 (g & 1)], x2 = w[2 (g & 1) + 1].
 *            u1 = (x1 + 1) * 2^-32 in (0, 1], u2 = x2 * 2^-32 in [0, 1),
 *            z = sqrt(-2 ln u1) * cos(2 pi u2)   (Box-Muller, in double),
 *            value = mean + std * z. The tails reach |z| = 6.66.
 *   INT:     b = g >> 1, word x = w[2 (g & 1)] | w[2 (g & 1) + 1] << 32.
 *            range = high - low (as uint64; 0 if high <= low),
 *            value = low + floor(x * range / 2^64)   (128-bit multiply:
 *            bias below range / 2^64, far less than x mod range).
 *
 * Each element reads one block, so any element is computable alone; kernels
 * that generate runs of elements may share a block between its 4 (uniform)
 * or 2 (normal, int) elements, with identical results. Uniform and int
 * values are exact integer arithmetic; normal values go through log, sqrt
 * and cos and so match to the last bit only where the math library agrees
 * (identical on every rank of one installation).
 */
#include "error.h"
#include "element.h"
#include "numeric.h"

#include <math.h>
#include <string.h>

void fl_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    fl_philox4x32_10(counter[0], counter[1], counter[2], counter[3], key[0], key[1], out);
}

/* Block b of the stream (seed, stream), per the contract above. */
static inline void random_block(const fl_random_spec *spec, uint64_t b, uint32_t w[4]) {
    fl_philox4x32_10((uint32_t)b, (uint32_t)(b >> 32), (uint32_t)spec->stream,
                  (uint32_t)(spec->stream >> 32), (uint32_t)spec->seed,
                  (uint32_t)(spec->seed >> 32), w);
}

/* Element g's value from the words of its block (uniform: block g >> 2;
 * normal and int: block g >> 1), per the contract above. Shared by the
 * one-element and the batched paths, so both give the same bits. */
static double uniform_of(const fl_random_spec *spec, uint64_t g, const uint32_t w[4]) {
    double u = (double)(w[g & 3] >> 8) * 0x1p-24;
    return spec->a + (spec->b - spec->a) * u;
}

static double normal_of(const fl_random_spec *spec, uint64_t g, const uint32_t w[4]) {
    int j = 2 * (int)(g & 1);
    double u1 = ((double)w[j] + 1.0) * 0x1p-32;
    double u2 = (double)w[j + 1] * 0x1p-32;
    double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
    return spec->a + spec->b * z;
}

static int64_t int_of(const fl_random_spec *spec, uint64_t g, const uint32_t w[4]) {
    int j = 2 * (int)(g & 1);
    uint64_t x = (uint64_t)w[j] | (uint64_t)w[j + 1] << 32;
    /* Unsigned arithmetic: high - low and low + offset may exceed int64 in
     * between (e.g. the full range [INT64_MIN, INT64_MAX)). */
    uint64_t range = spec->ihigh > spec->ilow ? (uint64_t)spec->ihigh - (uint64_t)spec->ilow : 0;
    uint64_t offset = (uint64_t)(((unsigned __int128)x * range) >> 64);
    return (int64_t)((uint64_t)spec->ilow + offset);
}

/* log2 of the elements one block serves. */
static int elements_shift(const fl_random_spec *spec) {
    return spec->kind == FL_RANDOM_UNIFORM ? 2 : 1;
}

double fl_random_value(const fl_random_spec *spec, uint64_t index) {
    uint64_t g = spec->first_index + index;
    uint32_t w[4];
    random_block(spec, g >> elements_shift(spec), w);
    switch (spec->kind) {
    case FL_RANDOM_UNIFORM: return uniform_of(spec, g, w);
    case FL_RANDOM_NORMAL: return normal_of(spec, g, w);
    case FL_RANDOM_INT: return (double)int_of(spec, g, w);
    }
    fl_abort(__FILE__, __LINE__, "fl_random_value: invalid random kind");
}

int64_t fl_random_int64(const fl_random_spec *spec, uint64_t index) {
    FL_ASSERT(spec->kind == FL_RANDOM_INT);
    uint64_t g = spec->first_index + index;
    uint32_t w[4];
    random_block(spec, g >> 1, w);
    return int_of(spec, g, w);
}

/* ---- batched generation ---------------------------------------------------- */

void fl_philox_lanes(const fl_random_spec *spec, uint64_t first_block,
                     uint32_t out[4][FL_PHILOX_LANES]) {
    /* The rounds of fl_philox4x32_10, written lane-wise over consecutive
     * blocks so the 32x32->64-bit products vectorise (about 3x the speed
     * of one block per call). */
    uint32_t x0[FL_PHILOX_LANES], x1[FL_PHILOX_LANES], x2[FL_PHILOX_LANES], x3[FL_PHILOX_LANES];
    for (int l = 0; l < FL_PHILOX_LANES; l++) {
        uint64_t block = first_block + (uint64_t)l;
        x0[l] = (uint32_t)block;
        x1[l] = (uint32_t)(block >> 32);
        x2[l] = (uint32_t)spec->stream;
        x3[l] = (uint32_t)(spec->stream >> 32);
    }
    uint32_t k0 = (uint32_t)spec->seed, k1 = (uint32_t)(spec->seed >> 32);
    for (int round = 0; round < FL_PHILOX_ROUNDS; round++) {
        if (round > 0) {
            k0 += FL_PHILOX_W0;
            k1 += FL_PHILOX_W1;
        }
#pragma omp simd
        for (int l = 0; l < FL_PHILOX_LANES; l++) {
            uint64_t p0 = (uint64_t)FL_PHILOX_M0 * x0[l];
            uint64_t p1 = (uint64_t)FL_PHILOX_M1 * x2[l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ x1[l] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ x3[l] ^ k1;
            x1[l] = (uint32_t)p1;
            x3[l] = (uint32_t)p0;
            x0[l] = n0;
            x2[l] = n2;
        }
    }
    memcpy(out[0], x0, sizeof x0);
    memcpy(out[1], x1, sizeof x1);
    memcpy(out[2], x2, sizeof x2);
    memcpy(out[3], x3, sizeof x3);
}

void fl_random_fill(const fl_random_spec *spec, uint64_t index, int64_t n, double *f64,
                    int64_t *i64) {
    if (n <= 0) return;
    int shift = elements_shift(spec);
    uint64_t per = (uint64_t)1 << shift;
    uint64_t g0 = spec->first_index + index;
    uint64_t first = g0 >> shift, last = (g0 + (uint64_t)n - 1) >> shift;
    for (uint64_t b = first;; b += FL_PHILOX_LANES) {
        uint32_t w[4][FL_PHILOX_LANES];
        fl_philox_lanes(spec, b, w);
        for (int l = 0; l < FL_PHILOX_LANES && b + (uint64_t)l <= last; l++) {
            uint32_t words[4] = {w[0][l], w[1][l], w[2][l], w[3][l]};
            for (uint64_t e = 0; e < per; e++) {
                uint64_t g = (b + (uint64_t)l) * per + e;
                if (g < g0 || g - g0 >= (uint64_t)n) continue;
                int64_t k = (int64_t)(g - g0);
                switch (spec->kind) {
                case FL_RANDOM_UNIFORM: f64[k] = uniform_of(spec, g, words); break;
                case FL_RANDOM_NORMAL: f64[k] = normal_of(spec, g, words); break;
                case FL_RANDOM_INT: i64[k] = int_of(spec, g, words); break;
                }
            }
        }
        if (last - b < FL_PHILOX_LANES) break; /* (b + lanes could wrap at the counter's end) */
    }
}
