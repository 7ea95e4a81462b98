/*
 * test_dtype.c: tests of core/tensor/dtype.c. Names and parsing, the
 * f32 <-> f16/bf16 conversions against an independent reference (exact
 * rounding computed in double), every f16 and bf16 bit pattern, and
 * fl_convert for every pair of dtypes, including saturation, bool, the
 * cases where rounding twice would be wrong, the multi-threaded paths, and
 * the errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_tests.h"
#include "fsdp.h"

/* ---- helpers ------------------------------------------------------------ */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The correctly rounded value of finite x in a binary format with `mbits`
 * stored mantissa bits, smallest normal exponent `emin` and largest finite
 * value `max_finite`: round to nearest even at the spacing of x's binade
 * (or of the subnormal range), in double, where every step is exact. */
static double ref_round(double x, int mbits, int emin, double max_finite) {
    if (x == 0 || isinf(x)) return x;
    double ax = fabs(x);
    int e;
    frexp(ax, &e); /* ax in [2^(e-1), 2^e) */
    int exponent = e - 1 < emin ? emin : e - 1;
    double ulp = ldexp(1.0, exponent - mbits);
    double r = nearbyint(ax / ulp) * ulp;
    if (r > max_finite) r = INFINITY;
    return copysign(r, x);
}

static double ref_f16(double x) { return ref_round(x, 10, -14, 65504.0); }
static double ref_bf16(double x) { return ref_round(x, 7, -126, 0x1.fep127); }

/* The value of an f16 bit pattern, from its definition. */
static double ref_f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v = exp == 0 ? ldexp(mant, -24) : ldexp(mant + 1024, exp - 25);
    return sign ? -v : v;
}

static bool same_float(double a, double b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return a == b && !!signbit(a) == !!signbit(b);
}

/* Scalar access through the public API. A one-element conversion from f64
 * (i64) is storing a double (int64), and one to f64 (i64) is loading it:
 * f64 and i64 hold every value of the other dtypes exactly, except i64
 * beyond 2^53 read as f64, which rounds once. */
static void store_f64(void *p, fl_dtype dtype, double v) {
    assert_int_equal(fl_convert(p, dtype, &v, FL_F64, 1), FL_OK);
}

static void store_i64(void *p, fl_dtype dtype, int64_t v) {
    assert_int_equal(fl_convert(p, dtype, &v, FL_I64, 1), FL_OK);
}

static double load_f64(const void *p, fl_dtype dtype) {
    double v;
    assert_int_equal(fl_convert(&v, FL_F64, p, dtype, 1), FL_OK);
    return v;
}

static int64_t load_i64(const void *p, fl_dtype dtype) {
    int64_t v;
    assert_int_equal(fl_convert(&v, FL_I64, p, dtype, 1), FL_OK);
    return v;
}

static bool f16_is_quiet_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x0200); }
static bool bf16_is_quiet_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x0040); }

/* Convert one value with fl_convert, going in and out through load/store. */
static double convert_f(fl_dtype dst, fl_dtype src, double v) {
    unsigned char s[8] = {0}, d[8] = {0};
    store_f64(s, src, v);
    assert_int_equal(fl_convert(d, dst, s, src, 1), FL_OK);
    return load_f64(d, dst);
}

/* Float in, integer out (read back through load_i64: cmocka's integer
 * asserts must never see a negative double). */
static int64_t convert_fi(fl_dtype dst, fl_dtype src, double v) {
    unsigned char s[8] = {0}, d[8] = {0};
    store_f64(s, src, v);
    assert_int_equal(fl_convert(d, dst, s, src, 1), FL_OK);
    return load_i64(d, dst);
}

static int64_t convert_i(fl_dtype dst, fl_dtype src, int64_t v) {
    unsigned char s[8] = {0}, d[8] = {0};
    store_i64(s, src, v);
    assert_int_equal(fl_convert(d, dst, s, src, 1), FL_OK);
    return load_i64(d, dst);
}

static uint16_t convert_to_16(fl_dtype dst, fl_dtype src, double v) {
    unsigned char s[8] = {0};
    uint16_t d = 0;
    store_f64(s, src, v);
    assert_int_equal(fl_convert(&d, dst, s, src, 1), FL_OK);
    return d;
}

static uint16_t convert_i64_to_16(fl_dtype dst, int64_t v) {
    uint16_t d = 0;
    assert_int_equal(fl_convert(&d, dst, &v, FL_I64, 1), FL_OK);
    return d;
}

/* ---- names, sizes, parsing ---------------------------------------------- */

static void test_names_and_sizes(void **state) {
    static const struct {
        fl_dtype dtype;
        const char *name;
        size_t size;
        bool is_float;
    } expect[] = {
        {FL_F32, "f32", 4, true},   {FL_F64, "f64", 8, true},   {FL_F16, "f16", 2, true},
        {FL_BF16, "bf16", 2, true}, {FL_I64, "i64", 8, false},  {FL_I32, "i32", 4, false},
        {FL_I16, "i16", 2, false},  {FL_I8, "i8", 1, false},    {FL_U32, "u32", 4, false},
        {FL_U16, "u16", 2, false},  {FL_U8, "u8", 1, false},    {FL_BOOL, "bool", 1, false},
    };
    assert_int_equal(sizeof expect / sizeof expect[0], FL_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        assert_string_equal(fl_dtype_name(expect[i].dtype), expect[i].name);
        assert_int_equal(fl_dtype_size(expect[i].dtype), expect[i].size);
        assert_int_equal(fl_dtype_is_float(expect[i].dtype), expect[i].is_float);
        /* Every canonical name parses back to its dtype. */
        assert_int_equal(fl_dtype_parse(expect[i].name), expect[i].dtype);
    }
    assert_string_equal(fl_dtype_name(FL_DTYPE_COUNT), "?");
    assert_string_equal(fl_dtype_name((fl_dtype)-1), "?");
    assert_int_equal(fl_dtype_size(FL_DTYPE_COUNT), 0);
    assert_int_equal(fl_dtype_size((fl_dtype)-1), 0);
    assert_false(fl_dtype_is_float(FL_DTYPE_COUNT));
    assert_false(fl_dtype_is_float((fl_dtype)-1));
}

static void test_parse_aliases(void **state) {
    static const struct {
        const char *name;
        fl_dtype dtype;
    } aliases[] = {
        {"float32", FL_F32}, {"float", FL_F32},   {"float64", FL_F64}, {"double", FL_F64},
        {"float16", FL_F16}, {"half", FL_F16},    {"bfloat16", FL_BF16}, {"int64", FL_I64},
        {"long", FL_I64},    {"int32", FL_I32},   {"int", FL_I32},     {"int16", FL_I16},
        {"short", FL_I16},   {"int8", FL_I8},     {"uint32", FL_U32},  {"uint16", FL_U16},
        {"uint8", FL_U8},    {"byte", FL_U8},     {"bool", FL_BOOL},
    };
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        assert_int_equal(fl_dtype_parse(aliases[i].name), aliases[i].dtype);
}

static void test_parse_unknown(void **state) {
    const char *bad[] = {"f8", "F32", "float32 ", "", "i128", "complex64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fl_clear_error();
        assert_int_equal(fl_dtype_parse(bad[i]), -1);
        assert_int_equal(fl_last_status(), FL_ERR_ARG);
        char want[64];
        snprintf(want, sizeof want, "unknown dtype '%s'", bad[i]);
        assert_non_null(strstr(fl_last_error(), want));
        /* The message lists what would have been accepted. */
        assert_non_null(strstr(fl_last_error(), "f32"));
        assert_non_null(strstr(fl_last_error(), "bool"));
    }
    fl_clear_error();
    assert_int_equal(fl_dtype_parse(NULL), -1);
    assert_int_equal(fl_last_status(), FL_ERR_ARG);
    fl_clear_error();
}

/* ---- f16 ------------------------------------------------------------------ */

/* All 65536 patterns: f16 -> f32 gives the defined value, and f32 -> f16
 * gives the pattern back (a NaN comes back a quiet NaN of the same sign). */
static void test_f16_every_pattern(void **state) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = fl_f16_to_f32(h);
        uint16_t back = fl_f32_to_f16(f);
        bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        bool is_inf = (h & 0x7fff) == 0x7c00;
        if (is_nan) {
            assert_true(isnan(f));
            assert_int_equal(!!signbit(f), h >> 15);
            assert_true(f16_is_quiet_nan(back));
            assert_int_equal(back >> 15, h >> 15);
            /* A quiet NaN keeps its payload through the round trip. */
            if (h & 0x200) assert_int_equal(back, h);
        } else if (is_inf) {
            assert_true(isinf(f));
            assert_int_equal(back, h);
        } else {
            assert_true(same_float(f, ref_f16_value(h)));
            assert_int_equal(back, h);
        }
    }
}

static void test_f16_edge_cases(void **state) {
    static const struct {
        float in;
        uint16_t out;
    } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0x1p-24f, 0x0001},                   /* smallest subnormal */
        {0x1p-25f, 0x0000},                   /* half of it: tie, to even (0) */
        {0x1.000002p-25f, 0x0001},            /* just above half */
        {-0x1p-25f, 0x8000},                  /* negative tie keeps the sign */
        {0x1p-26f, 0x0000},                   /* below half */
        {0x1.8p-24f, 0x0002},                 /* 1.5 units: tie, to even (2) */
        {0x1.4p-23f, 0x0002},                 /* 2.5 units: tie, to even (2) */
        {0x1.cp-23f, 0x0004},                 /* 3.5 units: tie, to even (4) */
        {0x1.ffcp-15f, 0x0400},               /* 1023.5 units: carries to the smallest normal */
        {0x1p-14f, 0x0400},                   /* smallest normal */
        {0x1.ff8p-15f, 0x03ff},               /* largest subnormal */
        {1.0f + 0x1p-11f, 0x3c00},            /* tie between 1 and 1+2^-10: even */
        {1.0f + 0x1.8p-10f, 0x3c02},          /* tie between 1+2^-10 and 1+2^-9: even */
        {0x1.002002p+0f, 0x3c01},             /* just above the tie (1 + 2^-11 + 2^-23) */
        {65504.0f, 0x7bff},                   /* largest finite */
        {65519.996f, 0x7bff},                 /* just below the overflow tie */
        {65520.0f, 0x7c00},                   /* tie at the top: rounds to infinity */
        {-65520.0f, 0xfc00},
        {1e10f, 0x7c00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {0x1p-149f, 0x0000},                  /* f32 subnormal: far below f16 */
        {-0x1p-149f, 0x8000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = fl_f32_to_f16(cases[i].in);
        if (got != cases[i].out)
            fail_msg("f32 %a -> f16: got 0x%04x, want 0x%04x", cases[i].in, got, cases[i].out);
    }
    /* NaNs: quiet, sign kept, top payload kept; a signalling NaN whose payload
     * lives only in the low bits must not turn into infinity. */
    assert_int_equal(fl_f32_to_f16(bits_f32(0x7fc00000u)), 0x7e00);
    assert_int_equal(fl_f32_to_f16(bits_f32(0xffc00000u)), 0xfe00);
    assert_true(f16_is_quiet_nan(fl_f32_to_f16(bits_f32(0x7f800001u))));
    assert_true(f16_is_quiet_nan(fl_f32_to_f16(bits_f32(0x7fa00000u))));
    assert_int_equal(fl_f32_to_f16(bits_f32(0x7fc02000u)), 0x7e01);
    /* f16 -> f32 of a signalling NaN is quiet. */
    assert_true(isnan(fl_f16_to_f32(0x7c01)));
    assert_true(f32_bits(fl_f16_to_f32(0x7c01)) & 0x00400000u);
}

/* ---- bf16 ----------------------------------------------------------------- */

static void test_bf16_every_pattern(void **state) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = fl_bf16_to_f32(h);
        assert_int_equal(f32_bits(f), (uint32_t)h << 16);
        uint16_t back = fl_f32_to_bf16(f);
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
            assert_true(bf16_is_quiet_nan(back));
            assert_int_equal(back, h | 0x40);
        } else {
            assert_int_equal(back, h);
        }
    }
}

static void test_bf16_rounding(void **state) {
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f808000u, 0x3f80}, /* 1 + half an ulp: tie, even stays */
        {0x3f818000u, 0x3f82}, /* tie with an odd kept half: up to even */
        {0x3f808001u, 0x3f81}, /* just above the tie */
        {0x3f807fffu, 0x3f80}, /* just below the tie */
        {0xbf808001u, 0xbf81}, /* negative: magnitude rounds the same way */
        {0x7f7fffffu, 0x7f80}, /* largest f32 rounds to infinity */
        {0x7f7f7fffu, 0x7f7f}, /* below the overflow tie: largest finite bf16 */
        {0x7f7f8000u, 0x7f80}, /* the overflow tie: odd, so up, to infinity */
        {0xff7fffffu, 0xff80},
        {0x00000000u, 0x0000},
        {0x80000000u, 0x8000}, /* -0 */
        {0x00008000u, 0x0000}, /* subnormal tie, even */
        {0x00018000u, 0x0002}, /* subnormal tie, odd: up */
        {0x80000001u, 0x8000}, /* tiny negative: -0 */
        {0x7f800000u, 0x7f80}, /* infinity */
        {0xff800000u, 0xff80},
        {0x7fc00000u, 0x7fc0}, /* quiet NaN */
        {0xffc00000u, 0xffc0}, /* negative quiet NaN keeps its sign */
        {0x7f800001u, 0x7fc0}, /* signalling NaN, payload in the low half: quiet NaN, not inf */
        {0xff80ffffu, 0xffc0},
        {0x7fffffffu, 0x7fff}, /* NaN with all payload bits: no carry into the sign */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = fl_f32_to_bf16(bits_f32(cases[i].in));
        if (got != cases[i].out)
            fail_msg("f32 0x%08x -> bf16: got 0x%04x, want 0x%04x", cases[i].in, got,
                     cases[i].out);
    }
    assert_true(fl_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(fl_bf16_to_f32(0xc040) == -3.0f);
}

/* f32 -> f16/bf16 against the reference rounding over a spread of all f32
 * patterns (a prime stride meets every exponent with varied low bits) plus
 * the neighbourhood of every f16 halfway point. */
static void test_f32_to_16_against_reference(void **state) {
    for (uint64_t b = 0; b < (UINT64_C(1) << 32); b += 4099) {
        float f = bits_f32((uint32_t)b);
        if (isnan(f)) continue;
        double got16 = fl_f16_to_f32(fl_f32_to_f16(f));
        double gotbf = fl_bf16_to_f32(fl_f32_to_bf16(f));
        if (!same_float(got16, ref_f16(f)))
            fail_msg("f32 0x%08x -> f16: got %a, want %a", (uint32_t)b, got16, ref_f16(f));
        if (!same_float(gotbf, ref_bf16(f)))
            fail_msg("f32 0x%08x -> bf16: got %a, want %a", (uint32_t)b, gotbf, ref_bf16(f));
    }
    for (uint32_t h = 0; h < 0x7c00; h++) {
        /* The midpoint between h and h+1, and its two float neighbours. */
        double mid = (ref_f16_value((uint16_t)h) + ref_f16_value((uint16_t)(h + 1))) / 2;
        float m = (float)mid;
        float probes[3] = {nextafterf(m, 0.0f), m, nextafterf(m, INFINITY)};
        for (int k = 0; k < 3; k++) {
            for (int sign = 0; sign < 2; sign++) {
                float f = sign ? -probes[k] : probes[k];
                double got = fl_f16_to_f32(fl_f32_to_f16(f));
                if (!same_float(got, ref_f16(f)))
                    fail_msg("f32 %a -> f16: got %a, want %a", f, got, ref_f16(f));
            }
        }
    }
}

/* ---- fl_convert ----------------------------------------------------------- */

static const fl_dtype all_dtypes[FL_DTYPE_COUNT] = {
    FL_F32, FL_F64, FL_F16, FL_BF16, FL_I64, FL_I32,
    FL_I16, FL_I8,  FL_U32, FL_U16,  FL_U8,  FL_BOOL,
};

/* The definition of converting the value v (held exactly in a double) to
 * dtype, as a double: floats round to nearest even, integers truncate and
 * saturate (NaN -> 0), bool is v != 0. */
static double ref_convert(double v, fl_dtype dtype) {
    static const struct {
        fl_dtype dtype;
        double lo, hi;
    } ranges[] = {
        {FL_I64, -0x1p63, 0x1p63}, /* INT64_MAX reads back as 2^63 */
        {FL_I32, INT32_MIN, INT32_MAX}, {FL_I16, INT16_MIN, INT16_MAX},
        {FL_I8, INT8_MIN, INT8_MAX},    {FL_U32, 0, UINT32_MAX},
        {FL_U16, 0, UINT16_MAX},        {FL_U8, 0, UINT8_MAX},
    };
    switch (dtype) {
    case FL_F64: return v;
    case FL_F32: return isnan(v) ? v : ref_round(v, 23, -126, 0x1.fffffep127);
    case FL_F16: return isnan(v) ? v : ref_f16(v);
    case FL_BF16: return isnan(v) ? v : ref_bf16(v);
    case FL_BOOL: return v != 0;
    default: break;
    }
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (ranges[i].dtype != dtype) continue;
        if (isnan(v)) return 0;
        double t = trunc(v);
        t = t < ranges[i].lo ? ranges[i].lo : t > ranges[i].hi ? ranges[i].hi : t;
        return t + 0.0; /* integers have no -0 */
    }
    fail_msg("no reference for dtype %d", (int)dtype);
    return 0;
}

/* Every (source, destination) pair, fast path or not, on values that
 * exercise rounding, truncation, saturation and the special values:
 * element by element, the result is the reference conversion of the
 * source element's value. */
static void test_convert_every_pair(void **state) {
    static const double values[] = {
        0.0,  -0.0,  1.0,     -1.0,   2.5,    -2.5,   3.75,    0.1,   -0.7,  127.0, 128.0,
        200.0, 255.0, 256.0, -129.0, 32767.5, 40000.0, 65504.0, 70000.0, 3e9, -3e9, 1e10,
        -1e10, 1e19, -1e19, 1e-30, 1e300, NAN, -NAN, INFINITY, -INFINITY,
        1.0 + 0x1p-11 + 0x1p-30, 1.0 + 0x1p-8 + 0x1p-30, 0x1p-25 + 0x1p-40, 4097.0, 16777217.0,
        0x1p31, -0x1p31, 0x1p31 - 1, 0x1p32, 0x1p63, -0x1p63,
    };
    enum { N = sizeof values / sizeof values[0] };
    unsigned char src[N * 8], dst[N * 8];
    for (int si = 0; si < FL_DTYPE_COUNT; si++) {
        fl_dtype st = all_dtypes[si];
        size_t ss = fl_dtype_size(st);
        for (int i = 0; i < N; i++) store_f64(src + i * ss, st, values[i]);
        for (int di = 0; di < FL_DTYPE_COUNT; di++) {
            fl_dtype dt = all_dtypes[di];
            size_t ds = fl_dtype_size(dt);
            memset(dst, 0xa5, sizeof dst);
            assert_int_equal(fl_convert(dst, dt, src, st, N), FL_OK);
            for (int i = 0; i < N; i++) {
                double v = load_f64(src + i * ss, st);
                double got = load_f64(dst + i * ds, dt), want = ref_convert(v, dt);
                if (!same_float(got, want))
                    fail_msg("convert %s -> %s of %a (from %a): got %a, want %a",
                             fl_dtype_name(st), fl_dtype_name(dt), v, values[i], got, want);
            }
        }
    }
}

/* Every fast pair (f32 on one side, or f64 and a 16-bit float) over one
 * long buffer (see below). */
static void convert_long_buffer(void) {
    static const double values[] = {0.0, -0.0, 1.0, -2.5, 0.1, 3.75, 65504.0, 70000.0, 1e-30,
                                    1e300, NAN, -NAN, INFINITY, -INFINITY, 16777217.0, 3e9,
                                    1.0 + 0x1p-8 + 0x1p-30, 1.0 + 0x1p-9, 1.0 + 3 * 0x1p-9};
    enum { NV = sizeof values / sizeof values[0], N = 3 * 65536 + 2 };
    unsigned char *src = malloc((size_t)N * 8), *dst = malloc((size_t)N * 8);
    assert_non_null(src);
    assert_non_null(dst);
    for (int si = 0; si < FL_DTYPE_COUNT; si++) {
        fl_dtype st = all_dtypes[si];
        size_t ss = fl_dtype_size(st);
        for (int i = 0; i < N; i++) store_f64(src + (size_t)i * ss, st, values[(i * 7) % NV]);
        for (int di = 0; di < FL_DTYPE_COUNT; di++) {
            fl_dtype dt = all_dtypes[di];
            bool wide_16 = (st == FL_F64 && (dt == FL_BF16 || dt == FL_F16)) ||
                           (dt == FL_F64 && (st == FL_BF16 || st == FL_F16));
            if (st == dt || (st != FL_F32 && dt != FL_F32 && !wide_16)) continue;
            size_t ds = fl_dtype_size(dt);
            memset(dst, 0xa5, (size_t)N * 8);
            assert_int_equal(fl_convert(dst, dt, src, st, N), FL_OK);
            for (int i = 0; i < N; i++) {
                double v = load_f64(src + (size_t)i * ss, st);
                double got = load_f64(dst + (size_t)i * ds, dt), want = ref_convert(v, dt);
                if (!same_float(got, want))
                    fail_msg("convert %s -> %s, element %d of %d: %a gave %a, want %a",
                             fl_dtype_name(st), fl_dtype_name(dt), i, N, v, got, want);
            }
        }
    }
    free(src);
    free(dst);
}

/* The same values in a buffer long enough for the bulk loops' threads
 * (chunks shared among 1, 2 and 3 threads, the last one 2 elements long):
 * every pair with f32 on one side, and f64 with bf16 or f16 (the
 * vectorised fast paths), converts
 * every element as the reference does, at every position of every
 * chunk. */
static void test_convert_long_buffers(void **state) {
    (void)state;
    int threads_before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        convert_long_buffer();
    }
    omp_set_num_threads(threads_before);
}

static void test_convert_float_to_int(void **state) {
    /* Truncation toward zero and saturation, through the generic path. */
    assert_int_equal(convert_i(FL_I8, FL_F32, 0), 0);
    assert_int_equal(convert_fi(FL_I8, FL_F32, 200.0), 127);
    assert_int_equal(convert_fi(FL_I8, FL_F32, -129.0), -128);
    assert_int_equal(convert_fi(FL_I8, FL_F32, 2.7), 2);
    assert_int_equal(convert_fi(FL_I8, FL_F32, -2.7), -2);
    assert_int_equal(convert_fi(FL_I8, FL_F32, NAN), 0);
    assert_int_equal(convert_fi(FL_I8, FL_F32, INFINITY), 127);
    assert_int_equal(convert_fi(FL_I8, FL_F32, -INFINITY), -128);
    assert_int_equal(convert_fi(FL_U8, FL_F32, -1.0), 0);
    assert_int_equal(convert_fi(FL_U8, FL_F32, -0.5), 0);
    assert_int_equal(convert_fi(FL_U8, FL_F32, 300.0), 255);
    assert_int_equal(convert_fi(FL_U8, FL_F32, 255.9), 255);
    assert_int_equal(convert_fi(FL_I16, FL_F16, 65504.0), 32767);
    assert_int_equal(convert_fi(FL_I16, FL_F16, -INFINITY), -32768);
    assert_int_equal(convert_fi(FL_U8, FL_BF16, 256.0), 255);
    assert_int_equal(convert_fi(FL_U32, FL_F64, 4294967295.9), 4294967295);
    assert_int_equal(convert_fi(FL_U32, FL_F64, 4294967296.0), 4294967295);
    assert_int_equal(convert_fi(FL_U32, FL_F64, -1.0), 0);
    assert_true(convert_fi(FL_I64, FL_F64, 0x1p63) == INT64_MAX);
    /* The fast paths f32 -> i32 / i64. */
    assert_int_equal(convert_fi(FL_I32, FL_F32, 0x1p31), INT32_MAX);
    assert_int_equal(convert_fi(FL_I32, FL_F32, 3e9), INT32_MAX);
    assert_int_equal(convert_fi(FL_I32, FL_F32, -3e9), INT32_MIN);
    assert_int_equal(convert_fi(FL_I32, FL_F32, -0x1p31), INT32_MIN);
    assert_int_equal(convert_fi(FL_I32, FL_F32, 2147483520.0), 2147483520);
    assert_int_equal(convert_fi(FL_I32, FL_F32, NAN), 0);
    assert_int_equal(convert_fi(FL_I32, FL_F32, -7.9), -7);
    assert_int_equal(convert_fi(FL_I32, FL_F32, 1e-3), 0);
    int64_t i64;
    float f;
    f = 1e19f;
    assert_int_equal(fl_convert(&i64, FL_I64, &f, FL_F32, 1), FL_OK);
    assert_true(i64 == INT64_MAX);
    f = -1e19f;
    assert_int_equal(fl_convert(&i64, FL_I64, &f, FL_F32, 1), FL_OK);
    assert_true(i64 == INT64_MIN);
    f = NAN;
    assert_int_equal(fl_convert(&i64, FL_I64, &f, FL_F32, 1), FL_OK);
    assert_true(i64 == 0);
    f = 0x1p62f;
    assert_int_equal(fl_convert(&i64, FL_I64, &f, FL_F32, 1), FL_OK);
    assert_true(i64 == INT64_C(1) << 62);
    /* f64 -> i64 at the edges of the range. */
    double d = 0x1.fffffffffffffp62; /* largest double below 2^63 */
    assert_int_equal(fl_convert(&i64, FL_I64, &d, FL_F64, 1), FL_OK);
    assert_true(i64 == INT64_C(9223372036854774784));
    d = -0x1p63;
    assert_int_equal(fl_convert(&i64, FL_I64, &d, FL_F64, 1), FL_OK);
    assert_true(i64 == INT64_MIN);
}

static void test_convert_int_to_int(void **state) {
    assert_int_equal(convert_i(FL_I8, FL_I64, 1000), 127);
    assert_int_equal(convert_i(FL_I8, FL_I64, -1000), -128);
    assert_int_equal(convert_i(FL_U32, FL_I64, -5), 0);
    assert_int_equal(convert_i(FL_U32, FL_I64, INT64_C(1) << 40), UINT32_MAX);
    assert_int_equal(convert_i(FL_I32, FL_U32, 4000000000), INT32_MAX);
    assert_int_equal(convert_i(FL_I64, FL_U32, 4294967295), 4294967295);
    assert_int_equal(convert_i(FL_U16, FL_I32, 70000), 65535);
    assert_int_equal(convert_i(FL_U16, FL_I32, -1), 0);
    assert_int_equal(convert_i(FL_I8, FL_U16, 65535), 127);
    assert_int_equal(convert_i(FL_U8, FL_I8, -1), 0);
    assert_int_equal(convert_i(FL_I16, FL_I8, -128), -128);
    assert_true(convert_i(FL_I64, FL_I64, INT64_MIN) == INT64_MIN);
    assert_true(convert_i(FL_I64, FL_I32, INT32_MIN) == INT32_MIN);
}

static void test_convert_bool(void **state) {
    assert_int_equal(convert_fi(FL_BOOL, FL_F32, 0.5), 1);
    assert_int_equal(convert_fi(FL_BOOL, FL_F32, -0.0), 0);
    assert_int_equal(convert_fi(FL_BOOL, FL_F32, NAN), 1);
    assert_int_equal(convert_fi(FL_BOOL, FL_BF16, 1e-30), 1);
    assert_int_equal(convert_i(FL_BOOL, FL_I32, 256), 1); /* not truncated to 0 */
    assert_int_equal(convert_i(FL_BOOL, FL_I64, INT64_MIN), 1);
    assert_int_equal(convert_i(FL_BOOL, FL_U8, 0), 0);
    assert_true(convert_f(FL_F32, FL_BOOL, 1.0) == 1.0);
    assert_int_equal(convert_i(FL_I32, FL_BOOL, 1), 1);
    /* A bool byte that is not 0/1 (e.g. from a foreign buffer) reads as 1. */
    unsigned char raw = 2;
    int32_t out;
    assert_int_equal(fl_convert(&out, FL_I32, &raw, FL_BOOL, 1), FL_OK);
    assert_int_equal(out, 1);
    /* Stored bools are always 0 or 1. */
    unsigned char b;
    double v = -3.5;
    assert_int_equal(fl_convert(&b, FL_BOOL, &v, FL_F64, 1), FL_OK);
    assert_int_equal(b, 1);
}

/* Conversions that a naive implementation rounds twice. */
static void test_convert_rounds_once(void **state) {
    /* f64 -> f16: just above a tie of f16, but (float)d lands on the tie. */
    assert_int_equal(convert_to_16(FL_F16, FL_F64, 1.0 + 0x1p-11 + 0x1p-40), 0x3c01);
    assert_int_equal(convert_to_16(FL_F16, FL_F64, 1.0 + 0x1p-11), 0x3c00);
    assert_int_equal(convert_to_16(FL_F16, FL_F64, -(1.0 + 0x1p-11 + 0x1p-40)), 0xbc01);
    /* The same in the subnormal range: just above half the smallest one. */
    assert_int_equal(convert_to_16(FL_F16, FL_F64, 0x1p-25 + 0x1p-60), 0x0001);
    assert_int_equal(convert_to_16(FL_F16, FL_F64, 0x1p-25), 0x0000);
    /* f64 -> bf16. */
    assert_int_equal(convert_to_16(FL_BF16, FL_F64, 1.0 + 0x1p-8 + 0x1p-40), 0x3f81);
    assert_int_equal(convert_to_16(FL_BF16, FL_F64, 1.0 + 0x1p-8), 0x3f80);
    /* Beyond f32's range: infinity; below it: signed zero. */
    assert_int_equal(convert_to_16(FL_BF16, FL_F64, 1e300), 0x7f80);
    assert_int_equal(convert_to_16(FL_F16, FL_F64, -1e300), 0xfc00);
    assert_int_equal(convert_to_16(FL_BF16, FL_F64, -1e-300), 0x8000);
    assert_int_equal(convert_to_16(FL_F16, FL_F64, 1e-300), 0x0000);
    assert_true(f16_is_quiet_nan(convert_to_16(FL_F16, FL_F64, NAN)));
    assert_true(bf16_is_quiet_nan(convert_to_16(FL_BF16, FL_F64, NAN)));
    /* int64 -> bf16 above 2^53, where int64 -> double already rounds. */
    int64_t big = (INT64_C(1) << 62) + (INT64_C(1) << 54) + 1;
    assert_true(fl_bf16_to_f32(convert_i64_to_16(FL_BF16, big)) == 0x1p62f + 0x1p55f);
    assert_true(fl_bf16_to_f32(convert_i64_to_16(FL_BF16, -big)) == -(0x1p62f + 0x1p55f));
    assert_true(fl_bf16_to_f32(convert_i64_to_16(FL_BF16, big - 1)) == 0x1p62f); /* tie: even */
    assert_true(fl_bf16_to_f32(convert_i64_to_16(FL_BF16, INT64_MAX)) == 0x1p63f);
    assert_true(fl_bf16_to_f32(convert_i64_to_16(FL_BF16, INT64_MIN)) == -0x1p63f);
    /* int -> f16. */
    assert_int_equal(convert_i64_to_16(FL_F16, 2049), 0x6800);  /* tie: 2048 */
    assert_int_equal(convert_i64_to_16(FL_F16, 2051), 0x6802);  /* tie: 2052 */
    assert_int_equal(convert_i64_to_16(FL_F16, 65519), 0x7bff); /* 65504 */
    assert_int_equal(convert_i64_to_16(FL_F16, 65520), 0x7c00); /* infinity */
    assert_int_equal(convert_i64_to_16(FL_F16, -65520), 0xfc00);
    /* int -> f32 / f64, once. */
    float f;
    int64_t i64 = (INT64_C(1) << 24) + 1;
    assert_int_equal(fl_convert(&f, FL_F32, &i64, FL_I64, 1), FL_OK);
    assert_true(f == 0x1p24f);
    i64 = (INT64_C(1) << 40) + (INT64_C(1) << 16) + 1; /* just above an f32 tie */
    assert_int_equal(fl_convert(&f, FL_F32, &i64, FL_I64, 1), FL_OK);
    assert_true(f == 0x1p40f + 0x1p17f);
    assert_true(convert_i(FL_F32, FL_I64, i64) == (INT64_C(1) << 40) + (INT64_C(1) << 17));
    int32_t i32 = 16777217;
    assert_int_equal(fl_convert(&f, FL_F32, &i32, FL_I32, 1), FL_OK);
    assert_true(f == 0x1p24f);
    double d;
    i64 = (INT64_C(1) << 53) + 1;
    assert_int_equal(fl_convert(&d, FL_F64, &i64, FL_I64, 1), FL_OK);
    assert_true(d == 0x1p53);
    /* f64 -> f32. */
    assert_true(convert_f(FL_F32, FL_F64, 1.0 + 0x1p-24) == 1.0);
    assert_true(convert_f(FL_F32, FL_F64, 1.0 + 0x1p-24 + 0x1p-50) == 1.0 + 0x1p-23);
    assert_true(isinf(convert_f(FL_F32, FL_F64, 1e39)));
}

/* Large conversions run on all threads: each element must still equal the
 * scalar definition, chunk boundaries included. */
static void test_convert_large(void **state) {
    enum { N = (1 << 17) + 3 };
    float *f = malloc(N * sizeof *f), *back = malloc(N * sizeof *back);
    uint16_t *h = malloc(N * sizeof *h);
    double *d = malloc(N * sizeof *d);
    int16_t *i16 = malloc(N * sizeof *i16);
    uint8_t *u8 = malloc(N * sizeof *u8);
    assert_non_null(f);
    assert_non_null(back);
    assert_non_null(h);
    assert_non_null(d);
    assert_non_null(i16);
    assert_non_null(u8);
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u; /* spread over all bit patterns */
        f[i] = bits_f32(x);
        i16[i] = (int16_t)(x >> 7);
    }

    assert_int_equal(fl_convert(h, FL_BF16, f, FL_F32, N), FL_OK);
    for (int i = 0; i < N; i++) assert_int_equal(h[i], fl_f32_to_bf16(f[i]));
    assert_int_equal(fl_convert(back, FL_F32, h, FL_BF16, N), FL_OK);
    for (int i = 0; i < N; i++) assert_int_equal(f32_bits(back[i]), (uint32_t)h[i] << 16);

    assert_int_equal(fl_convert(h, FL_F16, f, FL_F32, N), FL_OK);
    for (int i = 0; i < N; i++) assert_int_equal(h[i], fl_f32_to_f16(f[i]));
    assert_int_equal(fl_convert(back, FL_F32, h, FL_F16, N), FL_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(f32_bits(back[i]), f32_bits(fl_f16_to_f32(h[i])));

    assert_int_equal(fl_convert(d, FL_F64, f, FL_F32, N), FL_OK);
    for (int i = 0; i < N; i++) assert_true(same_float(d[i], f[i]));

    assert_int_equal(fl_convert(back, FL_F32, f, FL_F32, N), FL_OK);
    assert_memory_equal(back, f, N * sizeof *f);

    assert_int_equal(fl_convert(u8, FL_U8, i16, FL_I16, N), FL_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(u8[i], i16[i] < 0 ? 0 : i16[i] > 255 ? 255 : i16[i]);

    free(f);
    free(back);
    free(h);
    free(d);
    free(i16);
    free(u8);
}

static void test_convert_errors(void **state) {
    float s = 1.0f, d = 0.0f;
    fl_clear_error();
    assert_int_equal(fl_convert(&d, (fl_dtype)99, &s, FL_F32, 1), FL_ERR_ARG);
    assert_int_equal(fl_last_status(), FL_ERR_ARG);
    assert_non_null(strstr(fl_last_error(), "convert"));
    assert_non_null(strstr(fl_last_error(), "99"));

    fl_clear_error();
    assert_int_equal(fl_convert(&d, FL_F32, &s, (fl_dtype)-1, 1), FL_ERR_ARG);
    assert_non_null(strstr(fl_last_error(), "dtype"));

    fl_clear_error();
    assert_int_equal(fl_convert(&d, FL_F32, &s, FL_F32, -1), FL_ERR_ARG);
    assert_non_null(strstr(fl_last_error(), "-1"));

    fl_clear_error();
    assert_int_equal(fl_convert(NULL, FL_F32, &s, FL_F32, 1), FL_ERR_ARG);
    assert_non_null(strstr(fl_last_error(), "NULL"));

    /* Nothing to convert is fine, even without buffers, and leaves no error. */
    fl_clear_error();
    assert_int_equal(fl_convert(NULL, FL_F16, NULL, FL_I8, 0), FL_OK);
    assert_int_equal(fl_last_status(), FL_OK);
    assert_true(d == 0.0f);
}

/* Single elements in and out of every kind of dtype. */
static void test_load_store(void **state) {
    unsigned char buf[8];
    store_f64(buf, FL_F32, 3.9);
    assert_int_equal(load_i64(buf, FL_F32), 3);
    store_f64(buf, FL_F16, -3.9);
    assert_int_equal(load_i64(buf, FL_F16), -3);
    store_f64(buf, FL_BF16, NAN);
    assert_int_equal(load_i64(buf, FL_BF16), 0);
    assert_true(isnan(load_f64(buf, FL_BF16)));
    store_f64(buf, FL_U16, 1e9);
    assert_int_equal(load_i64(buf, FL_U16), 65535);
    store_i64(buf, FL_I16, -40000);
    assert_true(load_f64(buf, FL_I16) == -32768.0);
    store_i64(buf, FL_U32, INT64_MAX);
    assert_true(load_f64(buf, FL_U32) == 4294967295.0);
    store_f64(buf, FL_BOOL, -0.0);
    assert_int_equal(buf[0], 0);
    store_i64(buf, FL_BOOL, -7);
    assert_int_equal(buf[0], 1);
    store_f64(buf, FL_F16, -0.0);
    assert_true(same_float(load_f64(buf, FL_F16), -0.0));
    store_f64(buf, FL_F64, 0.1);
    assert_true(load_f64(buf, FL_F64) == 0.1);
    store_i64(buf, FL_I64, INT64_MIN);
    assert_true(load_i64(buf, FL_I64) == INT64_MIN);
}

int fl_test_dtype(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_sizes),
        cmocka_unit_test(test_parse_aliases),
        cmocka_unit_test(test_parse_unknown),
        cmocka_unit_test(test_f16_every_pattern),
        cmocka_unit_test(test_f16_edge_cases),
        cmocka_unit_test(test_bf16_every_pattern),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_f32_to_16_against_reference),
        cmocka_unit_test(test_convert_every_pair),
        cmocka_unit_test(test_convert_long_buffers),
        cmocka_unit_test(test_convert_float_to_int),
        cmocka_unit_test(test_convert_int_to_int),
        cmocka_unit_test(test_convert_bool),
        cmocka_unit_test(test_convert_rounds_once),
        cmocka_unit_test(test_convert_large),
        cmocka_unit_test(test_convert_errors),
        cmocka_unit_test(test_load_store),
    };
    return cmocka_run_group_tests_name("dtype", tests, NULL, NULL);
}
