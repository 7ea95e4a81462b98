/*
 * test_text.c: tests of core/text (the tokenizers) at the C API, for what
 * the Lua goldens (tests/lua/tokenizer_spec.lua) do not pin down: decoding
 * bytes that are not UTF-8 gives U+FFFD once per maximal invalid subpart,
 * as Rust's String::from_utf8_lossy (what `tokenizers` returns); encoded
 * ids stay valid until the next call; handles cloned for threads encode
 * as the original, at the same time, and outlive it; and failures leave a
 * message naming the file. Reads the shipped test tokenizers from tests/golden/tokenizers
 * (fsdp-ctest runs from the repository root).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fl_tests.h"
#include "fsdp.h"

static const char GPT2[] = "tests/golden/tokenizers/gpt2_style.json";
static const char *FFFD = "\xEF\xBF\xBD";

/* decode(encode(bytes)) for a byte-level tokenizer: every byte is encoded
 * (invalid UTF-8 included), so this is the lossy conversion of `bytes`. */
static char *round_trip(fl_bpe *t, const char *bytes, size_t n) {
    const int32_t *ids;
    int64_t k = fl_bpe_encode(t, bytes, n, false, &ids);
    assert_true(k > 0);
    int32_t *copy = malloc((size_t)k * sizeof *copy);
    memcpy(copy, ids, (size_t)k * sizeof *copy);
    const char *text;
    int64_t len = fl_bpe_decode(t, copy, k, false, &text);
    assert_true(len >= 0);
    free(copy);
    return strndup(text, (size_t)len);
}

static void decodes_invalid_utf8_as_rust_does(void **state) {
    (void)state;
    fl_bpe *t = fl_bpe_load(GPT2);
    assert_non_null(t);
    static const struct { const char *in; size_t n; int fffd; const char *rest; } cases[] = {
        { "\xF0\x9F\x98", 3, 1, "" },       /* a 4-byte character cut short: one subpart */
        { "\xED\xA0\x80", 3, 3, "" },       /* a surrogate: ED cannot take A0, then two strays */
        { "\xC0\xAF", 2, 2, "" },           /* an overlong form: C0 is never valid */
        { "\xE2\x82x", 3, 1, "x" },         /* cut by an ASCII byte */
        { "\xF4\x90\x80\x80", 4, 4, "" },   /* above U+10FFFF */
        { "\xFF", 1, 1, "" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char *got = round_trip(t, cases[c].in, cases[c].n);
        char want[32] = "";
        for (int k = 0; k < cases[c].fffd; k++) strcat(want, FFFD);
        strcat(want, cases[c].rest);
        assert_string_equal(want, got);
        free(got);
    }
    /* valid text comes back as it was, emoji and all */
    static const char text[] = "na\xC3\xAFve \xF0\x9F\x98\x80 \xE4\xB8\xAD\n\t end";
    char *got = round_trip(t, text, sizeof text - 1);
    assert_string_equal(text, got);
    free(got);
    fl_bpe_free(t);
}

static void ids_and_errors(void **state) {
    (void)state;
    fl_bpe *t = fl_bpe_load(GPT2);
    assert_non_null(t);
    const int32_t *ids;
    int64_t n = fl_bpe_encode(t, "Hello world", 11, false, &ids);
    assert_true(n > 0 && n <= 11);
    int64_t eot = fl_bpe_token_to_id(t, "<|endoftext|>", 13);
    assert_true(eot >= 0 && fl_bpe_is_special(t, eot));
    assert_int_equal(-1, fl_bpe_token_to_id(t, "no such token", 13));
    /* an id outside the vocabulary: -1 and a message naming the file */
    int32_t bad[2] = { 5, (int32_t)fl_bpe_vocab_size(t) };
    const char *text;
    assert_int_equal(-1, fl_bpe_decode(t, bad, 2, false, &text));
    assert_non_null(strstr(fl_last_error(), GPT2));
    assert_non_null(strstr(fl_last_error(), "at position 1"));
    fl_bpe_free(t);
    fl_clear_error();
    assert_null(fl_bpe_load("tests/golden/tokenizers/no_such.json"));
    assert_non_null(strstr(fl_last_error(), "tests/golden/tokenizers/no_such.json"));
    fl_clear_error();
    assert_null(fl_spm_load("tests/golden/tokenizers/no_such.model"));
    assert_non_null(strstr(fl_last_error(), "tests/golden/tokenizers/no_such.model"));
    fl_clear_error();
}

/* A thread's work: encode the texts with its own handle, compare. */
static const char *const TEXTS[] = {
    "Hello world, it's 12345 \xF0\x9F\x98\x80", "  leading  and trailing  ", "<|endoftext|> special",
    "na\xC3\xAFve caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87", "a fairly long sentence that repeats words words words",
};
enum { N_TEXTS = sizeof TEXTS / sizeof *TEXTS, ROUNDS = 200 };

typedef struct {
    fl_bpe *handle;
    int32_t *want[N_TEXTS];
    int64_t want_n[N_TEXTS];
    int mismatches;
} worker;

static void *encode_all(void *arg) {
    worker *w = arg;
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < N_TEXTS; i++) {
            const int32_t *ids;
            int64_t n = fl_bpe_encode(w->handle, TEXTS[i], strlen(TEXTS[i]), false, &ids);
            if (n != w->want_n[i] || memcmp(ids, w->want[i], (size_t)n * sizeof *ids) != 0) w->mismatches++;
        }
    }
    return NULL;
}

static void clones_share_the_model_across_threads(void **state) {
    (void)state;
    fl_bpe *t = fl_bpe_load(GPT2);
    assert_non_null(t);
    worker w[3];
    memset(w, 0, sizeof w);
    for (int i = 0; i < N_TEXTS; i++) {
        const int32_t *ids;
        int64_t n = fl_bpe_encode(t, TEXTS[i], strlen(TEXTS[i]), false, &ids);
        assert_true(n > 0);
        for (int k = 0; k < 3; k++) {
            w[k].want[i] = malloc((size_t)n * sizeof *ids);
            memcpy(w[k].want[i], ids, (size_t)n * sizeof *ids);
            w[k].want_n[i] = n;
        }
    }
    for (int k = 0; k < 3; k++) {
        w[k].handle = fl_bpe_clone(t);
        assert_non_null(w[k].handle);
    }
    fl_bpe_free(t); /* the clones keep the model */
    pthread_t th[3];
    for (int k = 0; k < 3; k++) assert_int_equal(0, pthread_create(&th[k], NULL, encode_all, &w[k]));
    for (int k = 0; k < 3; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(0, w[k].mismatches);
        assert_int_equal(701, fl_bpe_vocab_size(w[k].handle));
        fl_bpe_free(w[k].handle);
        for (int i = 0; i < N_TEXTS; i++) free(w[k].want[i]);
    }
}

static void sentencepiece_in_process(void **state) {
    (void)state;
    fl_spm *t = fl_spm_load("tests/golden/tokenizers/spm.model");
    assert_non_null(t);
    assert_true(fl_spm_eos_id(t) >= 0 && fl_spm_is_control(t, fl_spm_eos_id(t)));
    const int32_t *ids;
    static const char text[] = "Hello world 123";
    int64_t n = fl_spm_encode(t, text, sizeof text - 1, &ids);
    assert_true(n > 0);
    int32_t *copy = malloc((size_t)n * sizeof *copy);
    memcpy(copy, ids, (size_t)n * sizeof *copy);
    const char *out;
    int64_t len = fl_spm_decode(t, copy, n, &out);
    assert_int_equal((int64_t)sizeof text - 1, len);
    assert_memory_equal(text, out, (size_t)len);
    free(copy);
    fl_spm_free(t);
}

int fl_test_text(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decodes_invalid_utf8_as_rust_does),
        cmocka_unit_test(ids_and_errors),
        cmocka_unit_test(clones_share_the_model_across_threads),
        cmocka_unit_test(sentencepiece_in_process),
    };
    return cmocka_run_group_tests_name("text", tests, NULL, NULL);
}
