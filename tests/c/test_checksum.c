/*
 * test_checksum.c: tests of core/io/checksum.c. The streamed digest equals
 * the one-shot (parallel, per block) checksum for sizes around the block
 * boundaries and any split of the bytes into updates; one flipped bit
 * changes the value; the finiteness scan finds the first NaN or infinity
 * of every floating dtype (and nothing in integer data), and a digest
 * with the scan on stops there.
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

static unsigned char *random_bytes(size_t n) {
    unsigned char *p = malloc(n ? n : 1);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)x;
    }
    return p;
}

static void streamed_equals_one_shot(void **state) {
    (void)state;
    const size_t B = FL_CHECKSUM_BLOCK;
    const size_t sizes[] = {0, 1, 4095, B - 1, B, B + 1, 2 * B + 12345, 3 * B};
    size_t max = 3 * B;
    unsigned char *data = random_bytes(max);
    fl_digest *d = fl_digest_new();
    assert_non_null(d);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        uint64_t want = fl_checksum(data, n);
        /* uneven updates, some crossing block ends */
        const size_t steps[] = {1, 7, 4096, B - 3, 1 << 20};
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
            fl_digest_reset(d);
            for (size_t at = 0; at < n; at += steps[k]) {
                size_t m = n - at < steps[k] ? n - at : steps[k];
                assert_int_equal(-1, fl_digest_update(d, data + at, m, FL_U8, true));
            }
            assert_true(fl_digest_value(d) == want);
            assert_true(fl_digest_value(d) == want); /* reading the value changes nothing */
        }
        if (n > 0) {
            data[n / 2] ^= 0x10;
            assert_true(fl_checksum(data, n) != want);
            data[n / 2] ^= 0x10;
        }
    }
    char text[FL_CHECKSUM_TEXT];
    fl_checksum_text(0x0123456789abcdefull, text);
    assert_string_equal("xxh3-64:0123456789abcdef", text);
    fl_digest_free(d);
    free(data);
}

static void finds_the_first_nonfinite(void **state) {
    (void)state;
    enum { N = 100000 };
    float *f = calloc(N, sizeof *f);
    double *g = calloc(N, sizeof *g);
    uint16_t *h = calloc(N, sizeof *h), *b = calloc(N, sizeof *b);
    int32_t *i = calloc(N, sizeof *i);
    for (int k = 0; k < N; k++) f[k] = (float)k * 1e30f, g[k] = k * 1e300, h[k] = 0x7bff, b[k] = 0x7f7f;
    assert_int_equal(-1, fl_first_nonfinite(f, N, FL_F32)); /* largest finite values */
    assert_int_equal(-1, fl_first_nonfinite(h, N, FL_F16));
    assert_int_equal(-1, fl_first_nonfinite(b, N, FL_BF16));
    f[77777] = NAN;
    f[88888] = INFINITY;
    assert_int_equal(77777, fl_first_nonfinite(f, N, FL_F32));
    g[N - 1] = -INFINITY;
    assert_int_equal(N - 1, fl_first_nonfinite(g, N, FL_F64));
    h[5] = 0xfc00; /* f16 -inf */
    assert_int_equal(5, fl_first_nonfinite(h, N, FL_F16));
    b[40000] = 0x7fc0; /* bf16 NaN */
    assert_int_equal(40000, fl_first_nonfinite(b, N, FL_BF16));
    for (int k = 0; k < N; k++) i[k] = 0x7f800000;
    assert_int_equal(-1, fl_first_nonfinite(i, N, FL_I32)); /* integers are never non-finite */
    /* the digest reports the element, counted from the start of its update */
    fl_digest *d = fl_digest_new();
    assert_int_equal(77777, fl_digest_update(d, f, N * sizeof *f, FL_F32, true));
    assert_int_equal(-1, fl_digest_update(d, f, N * sizeof *f, FL_F32, false));
    fl_digest_free(d);
    free(f), free(g), free(h), free(b), free(i);
}

/* Known answers of CRC-32C: the check value of the catalogue of CRC
 * parameters ("123456789"), RFC 3720's iSCSI vectors (32 zero bytes, 32
 * bytes 0xff, 0..31), and continuing across a split equals one call. */
static void crc32c_known_answers(void **state) {
    (void)state;
    assert_int_equal(0xE3069283u, fl_crc32c(0, "123456789", 9));
    assert_int_equal(0, fl_crc32c(0, "", 0));
    unsigned char buf[32];
    memset(buf, 0, sizeof buf);
    assert_int_equal(0x8A9136AAu, fl_crc32c(0, buf, sizeof buf));
    memset(buf, 0xff, sizeof buf);
    assert_int_equal(0x62A8AB43u, fl_crc32c(0, buf, sizeof buf));
    for (int k = 0; k < 32; k++) buf[k] = (unsigned char)k;
    assert_int_equal(0x46DD794Eu, fl_crc32c(0, buf, sizeof buf));
    assert_int_equal(0x46DD794Eu, fl_crc32c(fl_crc32c(0, buf, 13), buf + 13, 19));
}

/* CRC-32C bit by bit from its definition, the reference the fast one is held to. */
static uint32_t crc32c_by_bits(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

/* On buffers long enough for the vector paths (ISA-L folds 64-byte and larger blocks),
 * at odd lengths and unaligned starts, and split anywhere: the definition's value. */
static void crc32c_equals_definition_on_long_buffers(void **state) {
    (void)state;
    size_t n = (1u << 20) + 77;
    unsigned char *buf = malloc(n + 8);
    assert_non_null(buf);
    uint32_t x = 12345;
    for (size_t i = 0; i < n + 8; i++) {
        x = x * 1664525u + 1013904223u;
        buf[i] = (unsigned char)(x >> 24);
    }
    const size_t lens[] = { 63, 64, 65, 255, 4096 + 3, 65536, n };
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        for (size_t off = 0; off < 8; off += 3) {
            uint32_t want = crc32c_by_bits(buf + off, lens[k]);
            assert_int_equal(want, fl_crc32c(0, buf + off, lens[k]));
            size_t cut = lens[k] / 3;
            assert_int_equal(want, fl_crc32c(fl_crc32c(0, buf + off, cut), buf + off + cut, lens[k] - cut));
        }
    }
    free(buf);
}

int fl_test_checksum(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(streamed_equals_one_shot),
        cmocka_unit_test(finds_the_first_nonfinite),
        cmocka_unit_test(crc32c_known_answers),
        cmocka_unit_test(crc32c_equals_definition_on_long_buffers),
    };
    return cmocka_run_group_tests_name("checksum", tests, NULL, NULL);
}
