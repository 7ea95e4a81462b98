/*
 * test_rng.c: tests of core/tensor/rng.c through the public API.
 * Philox-4x32-10 against the Random123 known-answer vectors; the element
 * mapping of fl_uniform_/fl_normal_/fl_randint_ (a contract: sharded init
 * depends on it) recomputed from the raw generator and pinned by golden
 * values; the distributions' statistics; that an element's value does not
 * depend on which other elements are generated with it; and that seeds and
 * streams give unrelated sequences.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fl_tests.h"
#include "fsdp.h"

/* What to generate: one of the three distributions and its parameters. */
typedef enum { UNIFORM, NORMAL, RANDINT } distribution;

typedef struct rspec {
    distribution dist;
    uint64_t seed, stream;
    double a, b;   /* uniform: low, high; normal: mean, std */
    int64_t low, high; /* randint */
} rspec;

static rspec uniform(uint64_t seed, uint64_t stream, double low, double high) {
    return (rspec){.dist = UNIFORM, .seed = seed, .stream = stream, .a = low, .b = high};
}

static rspec normal(uint64_t seed, uint64_t stream, double mean, double std) {
    return (rspec){.dist = NORMAL, .seed = seed, .stream = stream, .a = mean, .b = std};
}

static rspec randint(uint64_t seed, uint64_t stream, int64_t low, int64_t high) {
    return (rspec){.dist = RANDINT, .seed = seed, .stream = stream, .low = low, .high = high};
}

/* Elements first .. first + n - 1 of a spec: a 1-d CPU tensor of `dtype`
 * filled by the public generator, read back as doubles into out. */
static void generate_as(const rspec *s, fl_dtype dtype, uint64_t first, int64_t n, double *out) {
    fl_tensor *t = fl_empty(1, &n, dtype, fl_device_make(FL_DEVICE_CPU, 0));
    if (!t) fail_msg("fl_empty: %s", fl_last_error());
    int rc = s->dist == UNIFORM ? fl_uniform_(t, s->seed, s->stream, first, s->a, s->b)
             : s->dist == NORMAL ? fl_normal_(t, s->seed, s->stream, first, s->a, s->b)
                                 : fl_randint_(t, s->seed, s->stream, first, s->low, s->high);
    if (rc != FL_OK) fail_msg("random fill: %s", fl_last_error());
    if (fl_to_host(t, out, FL_F64, n) != FL_OK) fail_msg("fl_to_host: %s", fl_last_error());
    fl_tensor_release(t);
}

static void generate(const rspec *s, uint64_t first, int64_t n, double *out) {
    generate_as(s, FL_F64, first, n, out);
}

static double value_at(const rspec *s, uint64_t index) {
    double v;
    generate(s, index, 1, &v);
    return v;
}

/* ---- the generator -------------------------------------------------------- */

/* Random123's tests/kat_vectors, the "philox4x32 10" lines: counter, key,
 * expected output. */
static void test_philox_known_answers(void **state) {
    static const struct {
        uint32_t counter[4], key[2], out[4];
    } kat[] = {
        {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
         {0x00000000, 0x00000000},
         {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        fl_philox4x32(kat[i].counter, kat[i].key, out);
        for (int w = 0; w < 4; w++)
            if (out[w] != kat[i].out[w])
                fail_msg("vector %zu word %d: got 0x%08x, want 0x%08x", i, w, out[w],
                         kat[i].out[w]);
    }
}

/* ---- the mapping contract ------------------------------------------------- */

/* The block of the contract: counter {lo(b), hi(b), lo(stream), hi(stream)},
 * key {lo(seed), hi(seed)}. */
static void block(uint64_t seed, uint64_t stream, uint64_t b, uint32_t w[4]) {
    const uint32_t counter[4] = {(uint32_t)b, (uint32_t)(b >> 32), (uint32_t)stream,
                                 (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    fl_philox4x32(counter, key, w);
}

/* The generated values recomputed from the raw generator, as rng.c
 * documents the mapping. */
static void test_mapping_matches_contract(void **state) {
    enum { N = 16 };
    const uint64_t seeds[] = {0, 1, UINT64_C(0x0123456789abcdef), UINT64_MAX};
    const uint64_t streams[] = {0, 7, UINT64_C(0xfedcba9876543210)};
    const uint64_t firsts[] = {0, 5, (UINT64_C(1) << 40) + 3};
    for (size_t si = 0; si < 4; si++) {
        for (size_t ti = 0; ti < 3; ti++) {
            for (size_t fi = 0; fi < 3; fi++) {
                uint64_t seed = seeds[si], stream = streams[ti];
                rspec u = uniform(seed, stream, -1.0, 3.0);
                rspec n = normal(seed, stream, 0.5, 2.0);
                rspec r = randint(seed, stream, -1000, 1000);
                double us[N], ns[N], rs[N];
                generate(&u, firsts[fi], N, us);
                generate(&n, firsts[fi], N, ns);
                generate(&r, firsts[fi], N, rs);
                for (uint64_t i = 0; i < N; i++) {
                    uint64_t g = firsts[fi] + i;
                    uint32_t w[4];

                    block(seed, stream, g >> 2, w);
                    double uu = (double)(w[g & 3] >> 8) * 0x1p-24;
                    assert_true(us[i] == -1.0 + 4.0 * uu);

                    block(seed, stream, g >> 1, w);
                    int j = 2 * (int)(g & 1);
                    double u1 = ((double)w[j] + 1.0) * 0x1p-32;
                    double u2 = (double)w[j + 1] * 0x1p-32;
                    double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
                    assert_true(ns[i] == 0.5 + 2.0 * z);

                    uint64_t x = (uint64_t)w[j] | (uint64_t)w[j + 1] << 32;
                    int64_t want = -1000 + (int64_t)(((unsigned __int128)x * 2000) >> 64);
                    assert_true(rs[i] == (double)want);
                }
            }
        }
    }
}

/* Golden values: any change to the generator or the mapping breaks these,
 * and with them every model initialised before the change. */
static void test_golden_values(void **state) {
    const uint64_t seed = UINT64_C(0x0123456789abcdef), stream = 42;
    uint32_t w[4];
    block(seed, stream, 0, w);
    assert_int_equal(w[0], 0xbbb8d34b);
    assert_int_equal(w[1], 0x3d0d511d);
    assert_int_equal(w[2], 0x3998a0ef);
    assert_int_equal(w[3], 0x268e0d84);

    static const double uniform_want[6] = {0x1.7771a6p-1, 0x1.e86a88p-3, 0x1.ccc5p-3,
                                           0x1.347068p-3, 0x1.a526a4p-2, 0x1.faccaep-1};
    rspec u = uniform(seed, stream, 0.0, 1.0);
    double got[6];
    generate(&u, 0, 6, got);
    for (int i = 0; i < 6; i++) assert_true(got[i] == uniform_want[i]);

    static const double normal_want[4] = {0x1.d277e9ac5942p-5, 0x1.028b79125ebbcp+0,
                                          0x1.548f692810e21p+0, 0x1.01c64d37d7253p+0};
    rspec n = normal(seed, stream, 0.0, 1.0);
    generate(&n, 0, 4, got);
    for (int i = 0; i < 4; i++) /* through libm: equal up to its last bit */
        assert_true(fabs(got[i] - normal_want[i]) <= 1e-15 * fabs(normal_want[i]));

    static const double int_want[4] = {-523032, -698790, 979685, -953864};
    rspec r = randint(seed, stream, -1000000, 1000000);
    generate(&r, 0, 4, got);
    for (int i = 0; i < 4; i++) assert_true(got[i] == int_want[i]);
}

/* ---- distributions -------------------------------------------------------- */

enum { SAMPLES = 1000000 };

static void test_uniform_statistics(void **state) {
    const double low = -2.0, high = 3.0;
    rspec s = uniform(2024, 3, low, high);
    double *v = malloc(SAMPLES * sizeof *v);
    assert_non_null(v);
    generate(&s, 0, SAMPLES, v);
    double sum = 0, sum2 = 0;
    int64_t bins[10] = {0};
    for (int i = 0; i < SAMPLES; i++) {
        if (!(v[i] >= low && v[i] < high))
            fail_msg("uniform value %g outside [%g, %g)", v[i], low, high);
        sum += v[i];
        sum2 += v[i] * v[i];
        bins[(int)((v[i] - low) / (high - low) * 10)]++;
    }
    double mean = sum / SAMPLES, var = sum2 / SAMPLES - mean * mean;
    /* Standard errors: 0.0014 for the mean, 0.0019 for the variance. */
    assert_true(fabs(mean - 0.5) < 0.01);
    assert_true(fabs(var - 25.0 / 12.0) < 0.015);
    /* Chi-square over 10 bins (9 degrees of freedom; 40 is far in the tail). */
    double chi2 = 0, expect = SAMPLES / 10.0;
    for (int b = 0; b < 10; b++) chi2 += (bins[b] - expect) * (bins[b] - expect) / expect;
    assert_true(chi2 < 40.0);

    /* [0, 1) holds in an f32 tensor too: u is a multiple of 2^-24 below 1,
     * exact in f32. */
    rspec unit = uniform(7, 0, 0.0, 1.0);
    generate_as(&unit, FL_F32, 0, SAMPLES, v);
    for (int i = 0; i < SAMPLES; i++) {
        assert_true(v[i] >= 0.0 && v[i] < 1.0);
        assert_true(v[i] * 0x1p24 == floor(v[i] * 0x1p24));
    }
    free(v);
}

static void test_normal_statistics(void **state) {
    const double mean = 1.5, std = 2.0;
    rspec s = normal(99, 1, mean, std);
    double *v = malloc(SAMPLES * sizeof *v);
    assert_non_null(v);
    generate(&s, 0, SAMPLES, v);
    double m1 = 0, m2 = 0, m3 = 0, m4 = 0;
    int64_t within_one = 0;
    for (int i = 0; i < SAMPLES; i++) {
        if (!isfinite(v[i])) fail_msg("normal value %g at %d", v[i], i);
        double z = (v[i] - mean) / std;
        m1 += z;
        m2 += z * z;
        m3 += z * z * z;
        m4 += z * z * z * z;
        within_one += fabs(z) < 1.0;
    }
    free(v);
    m1 /= SAMPLES;
    m2 /= SAMPLES;
    m3 /= SAMPLES;
    m4 /= SAMPLES;
    /* Standard errors at 1e6 samples: mean 0.001, variance 0.0014, skewness
     * 0.0024, kurtosis 0.005, P(|z| < 1) 0.0005. Tolerances are ~6 of them. */
    assert_true(fabs(m1) < 0.006);
    assert_true(fabs(m2 - 1.0) < 0.01);
    assert_true(fabs(m3) < 0.015);
    assert_true(fabs(m4 - 3.0) < 0.04);
    assert_true(fabs((double)within_one / SAMPLES - 0.682689) < 0.003);
}

static void test_randint(void **state) {
    enum { LOW = -3, HIGH = 7, DRAWS = 100000 };
    rspec s = randint(5, 11, LOW, HIGH);
    double *v = malloc(DRAWS * sizeof *v);
    assert_non_null(v);
    generate_as(&s, FL_I32, 0, DRAWS, v);
    int64_t counts[HIGH - LOW] = {0};
    for (int i = 0; i < DRAWS; i++) {
        if (!(v[i] == floor(v[i]) && v[i] >= LOW && v[i] < HIGH)) fail_msg("randint value %g", v[i]);
        counts[(int)v[i] - LOW]++;
    }
    /* Every value is hit, about equally (expected 10000, sd 95). */
    for (int k = 0; k < HIGH - LOW; k++) {
        assert_true(counts[k] > 0);
        assert_true(llabs(counts[k] - DRAWS / (HIGH - LOW)) < 600);
    }

    /* A range of one value. */
    rspec one = randint(5, 11, 42, 43);
    generate(&one, 0, 100, v);
    for (int i = 0; i < 100; i++) assert_true(v[i] == 42.0);

    /* A range of 2^53 around zero: no overflow, both signs, in range. */
    rspec wide = randint(5, 11, -(INT64_C(1) << 52), INT64_C(1) << 52);
    generate_as(&wide, FL_I64, 0, 1000, v);
    int negatives = 0;
    for (int i = 0; i < 1000; i++) {
        assert_true(v[i] >= -0x1p52 && v[i] < 0x1p52);
        negatives += v[i] < 0;
    }
    assert_true(negatives > 400 && negatives < 600);
    free(v);
}

/* ---- counter-based properties --------------------------------------------- */

/* An element's value depends only on its global index (first_index + i):
 * generating it alone, as part of a "shard" starting elsewhere, or in any
 * order gives the same value, which is what lets each rank initialise only
 * its shard of a parameter. */
static void test_index_independence(void **state) {
    enum { N = 1000 };
    const rspec specs[3] = {
        uniform(31, 4, -1.0, 1.0),
        normal(31, 4, 0.0, 0.02),
        randint(31, 4, 0, 50000),
    };
    double seq[N], shard[13];
    for (int k = 0; k < 3; k++) {
        generate(&specs[k], 0, N, seq);
        /* Visit the indices in a scrambled order (7919 is coprime to N). */
        for (int step = 0; step < N; step++) {
            int i = (int)((step * 7919L) % N);
            assert_true(value_at(&specs[k], (uint64_t)i) == seq[i]);
            int j = i % 13;
            generate(&specs[k], (uint64_t)(i - j), j + 1, shard);
            assert_true(shard[j] == seq[i]);
        }
    }
}

/* How many of the first n values agree between two specs. */
static int count_equal(const rspec *a, const rspec *b, uint64_t first_a, uint64_t first_b) {
    enum { N = 1000 };
    double va[N], vb[N];
    generate(a, first_a, N, va);
    generate(b, first_b, N, vb);
    int equal = 0;
    for (int i = 0; i < N; i++) equal += va[i] == vb[i];
    return equal;
}

static void test_seeds_and_streams_differ(void **state) {
    const uint64_t hi = UINT64_C(1) << 32;
    const rspec base = uniform(1, 0, 0.0, 1.0);
    const struct {
        rspec spec;
        uint64_t first;
    } others[] = {
        {uniform(2, 0, 0.0, 1.0), 0},      /* another seed */
        {uniform(1 + hi, 0, 0.0, 1.0), 0}, /* the seed's high word counts */
        {uniform(1, 1, 0.0, 1.0), 0},      /* another stream */
        {uniform(1, hi, 0.0, 1.0), 0},     /* the stream's high word counts */
        {uniform(0, 1, 0.0, 1.0), 0},      /* seed and stream are not interchangeable */
        {uniform(1, 0, 0.0, 1.0), hi * 4}, /* far indices: the block's high word counts */
        {uniform(1, 0, 0.0, 1.0), 1000},   /* the next 1000 indices */
    };
    enum { OTHERS = sizeof others / sizeof others[0] };
    /* Equal 24-bit values by chance: about 1000 / 2^24 per pair. */
    for (int k = 0; k < OTHERS; k++)
        assert_true(count_equal(&base, &others[k].spec, 0, others[k].first) < 3);
    for (int a = 0; a < OTHERS; a++)
        for (int b = a + 1; b < OTHERS; b++)
            assert_true(count_equal(&others[a].spec, &others[b].spec, others[a].first,
                                    others[b].first) < 3);

    /* The same holds for normals and integers. */
    rspec n1 = normal(1, 0, 0, 1), n2 = normal(1, 1, 0, 1);
    assert_true(count_equal(&n1, &n2, 0, 0) < 3);
    rspec i1 = randint(1, 0, 0, INT64_C(1) << 52), i2 = randint(2, 0, 0, INT64_C(1) << 52);
    assert_true(count_equal(&i1, &i2, 0, 0) < 3);
}

int fl_test_rng(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_mapping_matches_contract),
        cmocka_unit_test(test_golden_values),
        cmocka_unit_test(test_uniform_statistics),
        cmocka_unit_test(test_normal_statistics),
        cmocka_unit_test(test_randint),
        cmocka_unit_test(test_index_independence),
        cmocka_unit_test(test_seeds_and_streams_differ),
    };
    return cmocka_run_group_tests_name("rng", tests, NULL, NULL);
}
