/*
 * bpe.c: Hugging Face tokenizer.json byte-level BPE (GPT-2, Llama 3, Qwen2
 * and the models that copied them), encode and decode, with the results of
 * the `tokenizers` package (tests/golden/make_tokenizer_goldens.py).
 *
 * The pipeline of `tokenizers`, in the parts these files use:
 *   1. added tokens (special or not) are cut out of the text first,
 *      leftmost-longest, and map straight to their ids: those marked
 *      "normalized": false from the raw text, then the rest of it goes
 *      through the normalizer (Unicode NFC/NFD/NFKC/NFKD, by Debian's
 *      libutf8proc, or none) and the other added tokens are cut out of that;
 *   2. every other segment goes through the pre-tokenizer: Split steps (a
 *      regex; Digits is one too) cut it into pieces, the ByteLevel step
 *      (last) optionally prefixes a space and splits with GPT-2's regex;
 *   3. each piece is a word of the BPE model: its bytes, as the byte-level
 *      alphabet's symbols, merged by rank (with ignore_merges a word that is
 *      in the vocabulary as a whole is one token);
 *   4. the TemplateProcessing post-processor adds its special tokens when
 *      asked (Llama 3's <|begin_of_text|>).
 * Decoding maps every token's characters back to bytes (a token with a
 * character outside the byte alphabet, such as an added token with a space,
 * gives its own UTF-8), then replaces invalid UTF-8 with U+FFFD as Rust's
 * String::from_utf8_lossy does.
 *
 * Regexes are PCRE2's (Debian's libpcre2-8, UTF + UCP for \p{L}, \p{N},
 * Unicode \s, JIT-compiled), close enough to the Oniguruma syntax of the
 * files' patterns for the GPT-2 and Llama 3 ones; with
 * PCRE2_MATCH_INVALID_UTF an invalid byte never matches and so stays a piece
 * of its own. Merge ranks live in a hash map keyed by the pair of ids, and
 * encoded words in a cache, so a common word costs one lookup.
 * Anything in a file this code does not implement (another model, a
 * normalizer, pre-tokenizer, post-processor or decoder it does not know,
 * options with other results) is refused at load naming the file and the
 * field.
 *
 * An fl_bpe is used by one thread at a time (its cache, match data and
 * output buffers are its own); fl_bpe_clone gives another thread a handle
 * of its own on the same loaded model (read-only, shared, reference
 * counted), without reading the file again.
 */
#include "error.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* GPT-2's pre-tokenizer regex, as the ByteLevel step of `tokenizers` has it. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum { MAX_STEPS = 8, MAX_TEMPLATE = 8, CACHE_MAX_WORD = 256, CACHE_MAX_ENTRIES = 1 << 16 };

/* ---- a string -> (a, b) hash map with keys in an arena ------------------ */

typedef struct {
    uint64_t hash;
    size_t key_off;
    uint32_t key_len;
    int32_t a, b; /* a < 0: empty slot */
} str_slot;

typedef struct {
    str_slot *slots;
    size_t cap, used; /* cap: a power of two */
    char *arena;
    size_t arena_len, arena_cap;
} str_map;

static int str_map_init(str_map *m, size_t expected) {
    size_t cap = 64;
    while (cap < expected * 2) cap *= 2;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < cap; i++) m->slots[i].a = -1;
    m->cap = cap;
    m->used = 0;
    m->arena = NULL;
    m->arena_len = m->arena_cap = 0;
    return 0;
}

static void str_map_free(str_map *m) {
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static void str_map_clear(str_map *m) {
    for (size_t i = 0; i < m->cap; i++) m->slots[i].a = -1;
    m->used = 0;
    m->arena_len = 0;
}

static str_slot *str_map_find(const str_map *m, const char *key, size_t len, uint64_t h) {
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        str_slot *s = &m->slots[i];
        if (s->a < 0) return s;
        if (s->hash == h && s->key_len == len && memcmp(m->arena + s->key_off, key, len) == 0) return s;
    }
}

static const str_slot *str_map_get(const str_map *m, const char *key, size_t len) {
    const str_slot *s = str_map_find(m, key, len, XXH3_64bits(key, len));
    return s->a < 0 ? NULL : s;
}

/* Insert or overwrite; -1 when out of memory. */
static int str_map_put(str_map *m, const char *key, size_t len, int32_t a, int32_t b) {
    if ((m->used + 1) * 2 > m->cap) {
        str_slot *old = m->slots;
        size_t old_cap = m->cap;
        str_slot *slots = malloc(old_cap * 2 * sizeof *slots);
        if (!slots) return -1;
        for (size_t i = 0; i < old_cap * 2; i++) slots[i].a = -1;
        m->slots = slots;
        m->cap = old_cap * 2;
        for (size_t i = 0; i < old_cap; i++) {
            if (old[i].a < 0) continue;
            size_t j = old[i].hash & (m->cap - 1);
            while (m->slots[j].a >= 0) j = (j + 1) & (m->cap - 1);
            m->slots[j] = old[i];
        }
        free(old);
    }
    uint64_t h = XXH3_64bits(key, len);
    str_slot *s = str_map_find(m, key, len, h);
    if (s->a < 0) {
        if (m->arena_len + len > m->arena_cap) {
            size_t cap = m->arena_cap ? m->arena_cap : 4096;
            while (cap < m->arena_len + len) cap *= 2;
            char *arena = realloc(m->arena, cap);
            if (!arena) return -1;
            m->arena = arena;
            m->arena_cap = cap;
        }
        memcpy(m->arena + m->arena_len, key, len);
        s->hash = h;
        s->key_off = m->arena_len;
        s->key_len = (uint32_t)len;
        m->arena_len += len;
        m->used++;
    }
    s->a = a;
    s->b = b;
    return 0;
}

/* ---- merges: (left id, right id) -> (rank, merged id) ------------------- */

typedef struct {
    uint64_t key; /* left << 32 | right */
    int32_t rank; /* -1: empty */
    int32_t merged;
} pair_slot;

static uint64_t pair_key(int32_t l, int32_t r) { return (uint64_t)(uint32_t)l << 32 | (uint32_t)r; }

static uint64_t pair_hash(uint64_t k) { /* splitmix64's finaliser */
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebull;
    return k ^ (k >> 31);
}

/* ---- the tokenizer ----------------------------------------------------- */

typedef enum { STEP_SPLIT, STEP_BYTE_LEVEL } step_kind;

typedef struct {
    step_kind kind;
    pcre2_code *re;         /* the split regex (ByteLevel: GPT-2's, or NULL without use_regex) */
    bool add_prefix_space;  /* ByteLevel */
} pre_step;

typedef struct {
    char *content;        /* as the file writes it (id -> token) */
    char *pattern;        /* what matches: the content, normalized when the token is */
    size_t len;           /* of pattern */
    int32_t id;
    bool special, lstrip, rstrip, normalized;
} added_token;

/* What a tokenizer.json says: read-only once loaded, shared by the handles
 * fl_bpe_clone makes (one per thread), freed with the last of them. */
typedef struct bpe_model {
    int refs;             /* handles sharing it (atomic) */
    char *path;
    int64_t n_ids;        /* largest id + 1 (model vocabulary and added tokens) */
    char **token;         /* id -> token text as the file has it (NULL: no token) */
    uint32_t *token_len;
    bool *special;        /* id -> an added token marked special */
    str_map vocab;        /* the model's vocabulary: token text -> id */
    pair_slot *merges;
    size_t merges_cap;    /* a power of two */
    int32_t byte_id[256]; /* id of each byte's symbol in the byte-level alphabet (-1: missing) */
    int32_t byte_fallback_id[256]; /* <0xXX> tokens with byte_fallback (-1: none) */
    int16_t char_byte[324]; /* code point of the byte-level alphabet -> its byte (-1: none) */
    char byte_char[256][3]; /* byte -> its alphabet symbol in UTF-8 (1-2 bytes, NUL-ended) */
    pre_step steps[MAX_STEPS];
    int n_steps;
    added_token *added;   /* longest first */
    int n_added;
    bool added_first[2][256]; /* first bytes of the raw-text (0) and normalized-text (1) tokens */
    int normalize;        /* utf8proc_map options of the normalizer; 0: none */
    bool ignore_merges, fuse_unk, byte_fallback;
    int32_t unk_id;       /* -1: none (unknown symbols are dropped, as in `tokenizers`) */
    int32_t template_pre[MAX_TEMPLATE], template_post[MAX_TEMPLATE];
    int n_template_pre, n_template_post;
} bpe_model;

/* A handle: the shared model and this thread's working state. */
struct fl_bpe {
    bpe_model *m;
    pcre2_match_data *match;
    str_map cache;        /* word bytes -> (offset in cache_ids, count) */
    int32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
    int32_t *out;         /* encode's result */
    size_t out_len, out_cap;
    /* a word while merging: symbols (id, neighbours; id -1: merged away) and
     * the queue of candidate merges */
    int32_t *sym, *prev, *next;
    size_t sym_cap;
    struct merge_entry *queue;
    size_t queue_cap;
    char *scratch;        /* a word's alphabet form (ignore_merges) */
    size_t scratch_cap;
    char *text;           /* decode's result */
    size_t text_cap;
};

static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*buf, cap2 * elem);
    if (!p) return -1;
    *buf = p;
    *cap = cap2;
    return 0;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the others for code points 256, 257, ... in byte order. */
static void init_byte_alphabet(bpe_model *m) {
    for (int c = 0; c < 324; c++) m->char_byte[c] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : next++;
        m->char_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            m->byte_char[b][0] = (char)cp;
            m->byte_char[b][1] = 0;
        } else {
            m->byte_char[b][0] = (char)(0xC0 | (cp >> 6));
            m->byte_char[b][1] = (char)(0x80 | (cp & 0x3F));
            m->byte_char[b][2] = 0;
        }
    }
}

static void model_release(bpe_model *m) {
    if (!m || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (m->token) {
        for (int64_t i = 0; i < m->n_ids; i++) free(m->token[i]);
    }
    free(m->token);
    free(m->token_len);
    free(m->special);
    str_map_free(&m->vocab);
    free(m->merges);
    for (int i = 0; i < m->n_steps; i++) pcre2_code_free(m->steps[i].re);
    for (int i = 0; i < m->n_added; i++) {
        free(m->added[i].content);
        free(m->added[i].pattern);
    }
    free(m->added);
    free(m->path);
    free(m);
}

void fl_bpe_free(fl_bpe *t) {
    if (!t) return;
    model_release(t->m);
    pcre2_match_data_free(t->match);
    str_map_free(&t->cache);
    free(t->cache_ids);
    free(t->out);
    free(t->sym);
    free(t->prev);
    free(t->next);
    free(t->queue);
    free(t->scratch);
    free(t->text);
    free(t);
}

/* A new handle on a model (whose reference the caller gives it). */
static fl_bpe *handle_new(bpe_model *m) {
    fl_bpe *t = calloc(1, sizeof *t);
    if (t) t->m = m;
    if (!t || !(t->match = pcre2_match_data_create(1, NULL)) || str_map_init(&t->cache, 1024)) {
        if (t) t->m = NULL;
        fl_bpe_free(t);
        return NULL;
    }
    return t;
}

fl_bpe *fl_bpe_clone(const fl_bpe *t) {
    __atomic_add_fetch(&t->m->refs, 1, __ATOMIC_ACQ_REL);
    fl_bpe *c = handle_new(t->m);
    if (!c) {
        model_release(t->m);
        return FL_FAIL_NULL(FL_ERR_OOM, "tokenizer %s: out of memory", t->m->path);
    }
    return c;
}

/* Load-time failure: the message names the file and the field at fault. */
enum { MAX_TOKENIZER_JSON = 256 << 20 };

#define LOAD_FAIL(status, ...) (fl_fail((status), __VA_ARGS__), model_release(m), json_decref(root), (fl_bpe *)NULL)

static pcre2_code *compile_regex(const char *pattern, size_t len, bool literal, char *err, size_t err_len) {
    int code;
    PCRE2_SIZE offset;
    uint32_t opts = literal ? PCRE2_LITERAL | PCRE2_UTF | PCRE2_MATCH_INVALID_UTF
                            : PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &code, &offset, NULL);
    if (!re) {
        PCRE2_UCHAR msg[200];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, err_len, "%s at offset %zu", (const char *)msg, (size_t)offset);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter stands in where JIT is unavailable */
    return re;
}

static const char *json_type_name(const json_t *j) {
    const char *s = json_string_value(json_object_get(j, "type"));
    return s ? s : "(no type)";
}

/* One pre-tokenizer (not a Sequence) into t->steps; NULL or an error text. */
static const char *add_pre_step(bpe_model *m, json_t *p, char *err, size_t err_len) {
    const char *type = json_type_name(p);
    if (m->n_steps == MAX_STEPS) return "pre_tokenizer: more steps than this build supports";
    if (m->n_steps > 0 && m->steps[m->n_steps - 1].kind == STEP_BYTE_LEVEL) {
        return "pre_tokenizer: a step after ByteLevel (this build needs ByteLevel last)";
    }
    pre_step *s = &m->steps[m->n_steps];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = STEP_BYTE_LEVEL;
        s->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *use_regex = json_object_get(p, "use_regex");
        if (!use_regex || json_is_true(use_regex)) {
            s->re = compile_regex(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, err, err_len);
            if (!s->re) return "pre_tokenizer.ByteLevel: GPT-2's regex does not compile";
        }
    } else if (strcmp(type, "Split") == 0) {
        s->kind = STEP_SPLIT;
        const char *behavior = json_string_value(json_object_get(p, "behavior"));
        if (!behavior || strcmp(behavior, "Isolated") != 0) {
            return "pre_tokenizer.Split.behavior: only Isolated is implemented";
        }
        if (json_is_true(json_object_get(p, "invert"))) return "pre_tokenizer.Split.invert: true is not implemented";
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        json_t *src = rx ? rx : lit;
        if (!json_is_string(src)) return "pre_tokenizer.Split.pattern: expected {\"Regex\": ...} or {\"String\": ...}";
        s->re = compile_regex(json_string_value(src), json_string_length(src), lit != NULL, err, err_len);
        if (!s->re) return "pre_tokenizer.Split.pattern does not compile";
    } else if (strcmp(type, "Digits") == 0) {
        /* Digits is a Split on numeric characters: each one, or runs. */
        s->kind = STEP_SPLIT;
        const char *pat = json_is_true(json_object_get(p, "individual_digits")) ? "\\p{N}" : "\\p{N}+";
        s->re = compile_regex(pat, strlen(pat), false, err, err_len);
        if (!s->re) return "pre_tokenizer.Digits: the regex does not compile";
    } else {
        snprintf(err, err_len, "%s", type);
        return "pre_tokenizer.type: not implemented (ByteLevel, Split, Digits and Sequence of them are)";
    }
    m->n_steps++;
    return NULL;
}

static int32_t vocab_id(const bpe_model *m, const char *s, size_t len) {
    const str_slot *e = str_map_get(&m->vocab, s, len);
    return e ? e->a : -1;
}

/* The special tokens of TemplateProcessing's "single" around $A. */
static const char *load_template(bpe_model *m, json_t *pp) {
    json_t *single = json_object_get(pp, "single");
    if (!json_is_array(single)) return "post_processor.single: expected a list";
    json_t *specials = json_object_get(pp, "special_tokens");
    bool seen_a = false;
    size_t i;
    json_t *piece;
    json_array_foreach(single, i, piece) {
        json_t *seq = json_object_get(piece, "Sequence"), *sp = json_object_get(piece, "SpecialToken");
        if (seq) {
            const char *id = json_string_value(json_object_get(seq, "id"));
            if (!id || strcmp(id, "A") != 0 || seen_a) return "post_processor.single: only one $A sequence is implemented";
            seen_a = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids)) return "post_processor.special_tokens: a token of single has no ids";
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            int *n = seen_a ? &m->n_template_post : &m->n_template_pre;
            int32_t *dst = seen_a ? m->template_post : m->template_pre;
            if (*n == MAX_TEMPLATE) return "post_processor.single: too many special tokens";
            if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= m->n_ids) {
                return "post_processor.special_tokens: an id outside the vocabulary";
            }
            dst[(*n)++] = (int32_t)json_integer_value(id);
        }
    }
    if (!seen_a) return "post_processor.single: no $A sequence";
    return NULL;
}

static const char *load_post_processor(bpe_model *m, json_t *pp) {
    if (!pp || json_is_null(pp)) return NULL;
    const char *type = json_type_name(pp);
    if (strcmp(type, "ByteLevel") == 0) return NULL; /* offsets only */
    if (strcmp(type, "TemplateProcessing") == 0) return load_template(m, pp);
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pp, "processors"), i, p) {
            const char *e = load_post_processor(m, p);
            if (e) return e;
        }
        return NULL;
    }
    return "post_processor.type: not implemented (ByteLevel, TemplateProcessing and Sequence of them are)";
}

static const char *load_decoder(json_t *d) {
    if (!d || json_is_null(d)) return "decoder: missing (a byte-level BPE needs the ByteLevel decoder)";
    const char *type = json_type_name(d);
    if (strcmp(type, "ByteLevel") == 0) return NULL;
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(d, "decoders");
        if (json_array_size(list) == 1) return load_decoder(json_array_get(list, 0));
    }
    return "decoder.type: not implemented (ByteLevel is)";
}

static int cmp_added(const void *a, const void *b) {
    const added_token *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

/* Place a token text at an id of the id -> text table. */
static int set_token(bpe_model *m, int64_t id, const char *s, size_t len) {
    free(m->token[id]);
    m->token[id] = malloc(len + 1);
    if (!m->token[id]) return -1;
    memcpy(m->token[id], s, len);
    m->token[id][len] = 0;
    m->token_len[id] = (uint32_t)len;
    return 0;
}

fl_bpe *fl_bpe_load(const char *path) {
    json_t *root = NULL;
    bpe_model *m = calloc(1, sizeof *m);
    if (!m) return FL_FAIL_NULL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
    m->refs = 1;
    m->path = strdup(path);
    m->unk_id = -1;
    init_byte_alphabet(m);
    /* Read by the core's input reader, not json_load_file: a FIFO or a
     * device must be refused, not waited on or read without end. The
     * largest files shipped are tens of MiB. */
    size_t text_len;
    char *text = fl_file_read_all(path, MAX_TOKENIZER_JSON, "a tokenizer.json", &text_len);
    if (!text) {
        fl_fail_prefix("tokenizer");
        model_release(m);
        return NULL;
    }
    json_error_t jerr;
    root = json_loadb(text, text_len, 0, &jerr);
    fl_file_buffer_free(text);
    if (!root) {
        return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: not readable JSON (line %d: %s)", path, jerr.line, jerr.text);
    }
    if (!json_is_object(root)) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: not a JSON object", path);

    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: no \"model\" object", path);
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") != 0) {
        return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: model.type %s is not implemented (only BPE is: "
                         "byte-level BPE as GPT-2 and Llama 3 ship it)", path, mtype);
    }
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: model.vocab is not an object", path);
    if (!json_is_array(merges)) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: model.merges is not a list", path);
    static const char *const unsupported_null[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (size_t i = 0; i < sizeof unsupported_null / sizeof *unsupported_null; i++) {
        json_t *v = json_object_get(model, unsupported_null[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
            return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: model.%s is not implemented", path, unsupported_null[i]);
        }
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0) {
        return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: model.dropout (random merges while training) is not "
                         "implemented", path);
    }
    m->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    m->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    m->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));

    json_t *normalizer = json_object_get(root, "normalizer");
    if (normalizer && strcmp(json_type_name(normalizer), "Sequence") == 0 &&
        json_array_size(json_object_get(normalizer, "normalizers")) == 1) {
        normalizer = json_array_get(json_object_get(normalizer, "normalizers"), 0);
    }
    if (normalizer && !json_is_null(normalizer)) {
        static const struct { const char *name; int opts; } forms[] = {
            { "NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE },
            { "NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE },
            { "NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT },
            { "NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT },
        };
        for (size_t k = 0; k < sizeof forms / sizeof *forms; k++) {
            if (strcmp(json_type_name(normalizer), forms[k].name) == 0) m->normalize = forms[k].opts;
        }
        if (!m->normalize) {
            return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: normalizer %s is not implemented (NFC, NFD, NFKC and "
                             "NFKD are)", path, json_type_name(normalizer));
        }
    }

    /* Ids: the largest of the vocabulary and the added tokens. */
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added)) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: added_tokens is not a list", path);
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT32_MAX) {
            return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: model.vocab[\"%s\"] is not an id", path, key);
        }
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX ||
            !json_is_string(json_object_get(val, "content"))) {
            return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: added_tokens[%zu] needs a content and an id", path, i);
        }
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: model.vocab is empty", path);
    m->n_ids = max_id + 1;
    m->token = calloc((size_t)m->n_ids, sizeof *m->token);
    m->token_len = calloc((size_t)m->n_ids, sizeof *m->token_len);
    m->special = calloc((size_t)m->n_ids, sizeof *m->special);
    if (!m->token || !m->token_len || !m->special || str_map_init(&m->vocab, json_object_size(vocab))) {
        return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
    }
    json_object_foreach(vocab, key, val) {
        size_t len = strlen(key);
        if (str_map_put(&m->vocab, key, len, (int32_t)json_integer_value(val), 0) ||
            set_token(m, json_integer_value(val), key, len)) {
            return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
        }
    }
    for (int b = 0; b < 256; b++) {
        m->byte_id[b] = vocab_id(m, m->byte_char[b], strlen(m->byte_char[b]));
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        m->byte_fallback_id[b] = m->byte_fallback ? vocab_id(m, fb, strlen(fb)) : -1;
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) {
        m->unk_id = vocab_id(m, unk, strlen(unk));
        if (m->unk_id < 0) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: model.unk_token %s is not in model.vocab", path, unk);
    }

    /* Merges: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20). */
    size_t n_merges = json_array_size(merges);
    m->merges_cap = 64;
    while (m->merges_cap < n_merges * 2) m->merges_cap *= 2;
    m->merges = malloc(m->merges_cap * sizeof *m->merges);
    char *joined = NULL;
    size_t joined_cap = 0;
    if (!m->merges) return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
    for (size_t k = 0; k < m->merges_cap; k++) m->merges[k].rank = -1;
    json_array_foreach(merges, i, val) {
        const char *l, *r;
        size_t ll, rl;
        if (json_is_string(val)) {
            l = json_string_value(val);
            const char *sp = strchr(l, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                free(joined);
                return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: model.merges[%zu] \"%s\" is not two tokens separated by "
                                 "one space", path, i, l);
            }
            ll = (size_t)(sp - l);
            r = sp + 1;
            rl = strlen(r);
        } else if (json_is_array(val) && json_array_size(val) == 2 && json_is_string(json_array_get(val, 0)) &&
                   json_is_string(json_array_get(val, 1))) {
            l = json_string_value(json_array_get(val, 0));
            r = json_string_value(json_array_get(val, 1));
            ll = json_string_length(json_array_get(val, 0));
            rl = json_string_length(json_array_get(val, 1));
        } else {
            free(joined);
            return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: model.merges[%zu] is neither \"a b\" nor [a, b]", path, i);
        }
        if (grow((void **)&joined, &joined_cap, ll + rl + 1, 1)) {
            free(joined);
            return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
        }
        memcpy(joined, l, ll);
        memcpy(joined + ll, r, rl);
        int32_t a = vocab_id(m, l, ll), b = vocab_id(m, r, rl);
        int32_t merged = vocab_id(m, joined, ll + rl);
        if (a < 0 || b < 0 || merged < 0) {
            joined[ll + rl] = 0;
            fl_fail(FL_ERR_IO, "tokenizer %s: model.merges[%zu] (%.*s + %.*s -> %s) uses a token not in model.vocab",
                    path, i, (int)ll, l, (int)rl, r, joined);
            free(joined);
            model_release(m);
            json_decref(root);
            return NULL;
        }
        uint64_t k = pair_key(a, b);
        size_t s = pair_hash(k) & (m->merges_cap - 1);
        while (m->merges[s].rank >= 0 && m->merges[s].key != k) s = (s + 1) & (m->merges_cap - 1);
        /* A pair listed twice takes its last rank: `tokenizers` collects
         * the list into a hash map. */
        m->merges[s].key = k;
        m->merges[s].rank = (int32_t)i;
        m->merges[s].merged = merged;
    }
    free(joined);

    /* Added tokens: their text and flags; they may reuse vocabulary ids. */
    m->n_added = (int)json_array_size(added);
    m->added = calloc((size_t)m->n_added + 1, sizeof *m->added);
    if (!m->added) return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
    json_array_foreach(added, i, val) {
        added_token *a = &m->added[i];
        json_t *content = json_object_get(val, "content");
        size_t content_len = json_string_length(content);
        if (content_len == 0) return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: added_tokens[%zu].content is empty", path, i);
        a->content = malloc(content_len + 1);
        if (!a->content) return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
        memcpy(a->content, json_string_value(content), content_len + 1);
        a->len = content_len;
        a->id = (int32_t)json_integer_value(json_object_get(val, "id"));
        a->special = json_is_true(json_object_get(val, "special"));
        a->lstrip = json_is_true(json_object_get(val, "lstrip"));
        a->rstrip = json_is_true(json_object_get(val, "rstrip"));
        if (json_is_true(json_object_get(val, "single_word"))) {
            return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: added_tokens[%zu].single_word (%s) is not implemented",
                             path, i, a->content);
        }
        /* As `tokenizers`: normalized unless said otherwise, when not special. */
        json_t *norm = json_object_get(val, "normalized");
        a->normalized = norm ? json_is_true(norm) : !a->special;
        if (set_token(m, a->id, a->content, content_len)) {
            return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
        }
        if (a->normalized && m->normalize) {
            utf8proc_uint8_t *n = NULL;
            utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)a->content, (utf8proc_ssize_t)a->len, &n,
                                               (utf8proc_option_t)m->normalize);
            if (nl <= 0) {
                free(n);
                return LOAD_FAIL(FL_ERR_IO, "tokenizer %s: added_tokens[%zu].content is not valid UTF-8", path, i);
            }
            a->pattern = (char *)n;
            a->len = (size_t)nl;
        } else {
            a->pattern = strdup(a->content);
            if (!a->pattern) return LOAD_FAIL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
        }
        m->special[a->id] = a->special;
        m->added_first[a->normalized][(unsigned char)a->pattern[0]] = true;
    }
    qsort(m->added, (size_t)m->n_added, sizeof *m->added, cmp_added);

    /* Pre-tokenizer: ByteLevel last, Split/Digits before it. */
    json_t *pre = json_object_get(root, "pre_tokenizer");
    char err[256] = "";
    const char *e = NULL;
    if (!pre || json_is_null(pre)) {
        e = "pre_tokenizer: missing (a byte-level BPE needs the ByteLevel pre-tokenizer)";
    } else if (strcmp(json_type_name(pre), "Sequence") == 0) {
        json_t *p;
        json_array_foreach(json_object_get(pre, "pretokenizers"), i, p) {
            if ((e = add_pre_step(m, p, err, sizeof err))) break;
        }
    } else {
        e = add_pre_step(m, pre, err, sizeof err);
    }
    if (!e && (m->n_steps == 0 || m->steps[m->n_steps - 1].kind != STEP_BYTE_LEVEL)) {
        e = "pre_tokenizer: no ByteLevel step (this build implements byte-level BPE only)";
    }
    if (e) return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: %s%s%s", path, e, err[0] ? ": " : "", err);
    for (int b = 0; b < 256; b++) {
        if (m->byte_id[b] < 0 && m->byte_fallback_id[b] < 0 && m->unk_id < 0) {
            return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: model.vocab lacks the byte-level symbol of byte 0x%02X "
                             "(not a byte-level BPE)", path, b);
        }
    }
    if ((e = load_post_processor(m, json_object_get(root, "post_processor")))) {
        return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: %s", path, e);
    }
    if ((e = load_decoder(json_object_get(root, "decoder")))) {
        return LOAD_FAIL(FL_ERR_UNSUPPORTED, "tokenizer %s: %s", path, e);
    }
    json_decref(root);
    fl_bpe *t = handle_new(m);
    if (!t) {
        model_release(m);
        return FL_FAIL_NULL(FL_ERR_OOM, "tokenizer %s: out of memory", path);
    }
    return t;
}

/* ---- encoding ----------------------------------------------------------- */

static int emit(fl_bpe *t, int32_t id) {
    if (grow((void **)&t->out, &t->out_cap, t->out_len + 1, sizeof *t->out)) return -1;
    t->out[t->out_len++] = id;
    return 0;
}

static int32_t pair_lookup(const bpe_model *m, int32_t l, int32_t r, int32_t *merged) {
    uint64_t k = pair_key(l, r);
    for (size_t s = pair_hash(k) & (m->merges_cap - 1);; s = (s + 1) & (m->merges_cap - 1)) {
        const pair_slot *p = &m->merges[s];
        if (p->rank < 0) return INT32_MAX;
        if (p->key == k) {
            *merged = p->merged;
            return p->rank;
        }
    }
}

/* [Note: the order of merges]
 * `tokenizers` merges a word with a priority queue of candidate pairs,
 * lowest rank first and leftmost on equal ranks, skipping entries whose
 * left symbol was merged away or whose pair no longer yields the entry's
 * token (it checks the merged id only). The same queue here gives the same
 * tokens in every case, and O(n log n) for a word of n bytes: a long run of
 * letters (base64, a minified file) cannot stall the encoder as a rescan
 * per merge (quadratic) would. */
struct merge_entry {
    int32_t rank, pos, merged;
};

static bool entry_before(const struct merge_entry *a, const struct merge_entry *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void queue_push(struct merge_entry *q, size_t *n, struct merge_entry e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!entry_before(&e, &q[parent])) break;
        q[i] = q[parent];
        i = parent;
    }
    q[i] = e;
}

static struct merge_entry queue_pop(struct merge_entry *q, size_t *n) {
    struct merge_entry top = q[0], last = q[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && entry_before(&q[c + 1], &q[c])) c++;
        if (!entry_before(&q[c], &last)) break;
        q[i] = q[c];
        i = c;
    }
    if (*n > 0) q[i] = last;
    return top;
}

/* Queue the merge of the symbols at pos and next[pos], if there is one. */
static void queue_pair(fl_bpe *t, size_t *nq, int32_t pos) {
    int32_t merged, r = t->next[pos];
    if (r < 0) return;
    int32_t rank = pair_lookup(t->m, t->sym[pos], t->sym[r], &merged);
    if (rank != INT32_MAX) queue_push(t->queue, nq, (struct merge_entry){ rank, pos, merged });
}

/* Merge the k symbols of t->sym ([Note: the order of merges]) and append
 * the result to t->out. */
static int merge_word(fl_bpe *t, size_t k) {
    size_t nq = 0;
    for (size_t i = 0; i < k; i++) {
        t->prev[i] = (int32_t)i - 1;
        t->next[i] = i + 1 < k ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < k; i++) queue_pair(t, &nq, (int32_t)i);
    while (nq > 0) {
        struct merge_entry top = queue_pop(t->queue, &nq);
        int32_t pos = top.pos, r = t->next[pos], merged;
        if (t->sym[pos] < 0 || r < 0) continue;
        if (pair_lookup(t->m, t->sym[pos], t->sym[r], &merged) == INT32_MAX || merged != top.merged) continue;
        t->sym[pos] = top.merged;
        t->sym[r] = -1;
        t->next[pos] = t->next[r];
        if (t->next[r] >= 0) t->prev[t->next[r]] = pos;
        if (t->prev[pos] >= 0) queue_pair(t, &nq, t->prev[pos]);
        queue_pair(t, &nq, pos);
    }
    for (int32_t i = k ? 0 : -1; i >= 0; i = t->next[i]) {
        if (emit(t, t->sym[i])) return -1;
    }
    return 0;
}

/* The BPE of one word (raw bytes), appended to t->out. */
static int encode_word(fl_bpe *t, const char *w, size_t n) {
    if (n == 0) return 0;
    bool cacheable = n <= CACHE_MAX_WORD;
    if (cacheable) {
        const str_slot *c = str_map_get(&t->cache, w, n);
        if (c) {
            if (grow((void **)&t->out, &t->out_cap, t->out_len + (size_t)c->b, sizeof *t->out)) return -1;
            memcpy(t->out + t->out_len, t->cache_ids + c->a, (size_t)c->b * sizeof *t->out);
            t->out_len += (size_t)c->b;
            return 0;
        }
    }
    size_t start = t->out_len;
    int32_t whole = -1;
    if (t->m->ignore_merges) {
        if (grow((void **)&t->scratch, &t->scratch_cap, 2 * n, 1)) return -1;
        size_t len = 0;
        for (size_t i = 0; i < n; i++) {
            const char *c = t->m->byte_char[(unsigned char)w[i]];
            t->scratch[len++] = c[0];
            if (c[1]) t->scratch[len++] = c[1];
        }
        whole = vocab_id(t->m, t->scratch, len);
    }
    if (whole >= 0) {
        if (emit(t, whole)) return -1;
    } else {
        if (n > t->sym_cap) {
            /* Each merge queues at most two pairs: 3n entries in all. */
            int32_t *sym = realloc(t->sym, n * sizeof *sym);
            if (sym) t->sym = sym;
            int32_t *prev = realloc(t->prev, n * sizeof *prev);
            if (prev) t->prev = prev;
            int32_t *next = realloc(t->next, n * sizeof *next);
            if (next) t->next = next;
            struct merge_entry *queue = realloc(t->queue, 3 * n * sizeof *queue);
            if (queue) t->queue = queue;
            if (!sym || !prev || !next || !queue) return -1;
            t->sym_cap = n;
        }
        /* The initial symbols: one per byte (the alphabet has them all in
         * byte-level files; byte_fallback or unk otherwise). */
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)w[i];
            int32_t id = t->m->byte_id[b];
            if (id < 0) id = t->m->byte_fallback_id[b];
            if (id < 0) {
                if (t->m->fuse_unk && k > 0 && t->sym[k - 1] == t->m->unk_id) continue;
                id = t->m->unk_id;
            }
            if (id >= 0) t->sym[k++] = id;
        }
        if (merge_word(t, k)) return -1;
    }
    if (cacheable) {
        size_t count = t->out_len - start;
        if (t->cache.used >= CACHE_MAX_ENTRIES) {
            str_map_clear(&t->cache);
            t->cache_ids_len = 0;
        }
        if (grow((void **)&t->cache_ids, &t->cache_ids_cap, t->cache_ids_len + count, sizeof *t->cache_ids)) return -1;
        memcpy(t->cache_ids + t->cache_ids_len, t->out + start, count * sizeof *t->out);
        if (str_map_put(&t->cache, w, n, (int32_t)t->cache_ids_len, (int32_t)count)) return -1;
        t->cache_ids_len += count;
    }
    return 0;
}

/* One piece of the pre-tokenizer's step `step`: split further by the steps
 * after it, or (after the last) encoded as a word. */
static int pre_tokenize(fl_bpe *t, int step, const char *s, size_t n, bool prefixed);

static int piece(fl_bpe *t, int step, const char *s, size_t n) {
    if (n == 0) return 0;
    return step + 1 < t->m->n_steps ? pre_tokenize(t, step + 1, s, n, false) : encode_word(t, s, n);
}

/* Pieces of s[0, n) by step `step` and the ones after it, each piece's BPE
 * appended to t->out (`prefixed`: ByteLevel's prefix space is in s
 * already). 0, -1 (out of memory) or 1 (the error is set). */
static int pre_tokenize(fl_bpe *t, int step, const char *s, size_t n, bool prefixed) {
    if (n == 0) return 0;
    const pre_step *p = &t->m->steps[step];
    if (p->kind == STEP_BYTE_LEVEL && p->add_prefix_space && !prefixed && s[0] != ' ') {
        /* The piece with a space before it, in its own buffer: the regex
         * below must see the space. */
        char *buf = malloc(n + 1);
        if (!buf) return -1;
        buf[0] = ' ';
        memcpy(buf + 1, s, n);
        int rc = pre_tokenize(t, step, buf, n + 1, true);
        free(buf);
        return rc;
    }
    if (!p->re) return piece(t, step, s, n); /* ByteLevel without regex */
    /* Isolated: every match is a piece, and so is every gap between them.
     * An empty match is no piece but still ends the gap before it (so
     * `tokenizers` splits "abc" by \d* into a, b, c); the search goes on a
     * character later. */
    size_t gap = 0, at = 0;
    while (at < n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, 0, t->match, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            fl_fail(FL_ERR_ARG, "tokenizer %s: pre-tokenizer regex failed: %s", t->m->path, (const char *)msg);
            return 1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->match);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            if ((rc = piece(t, step, s + gap, ms - gap))) return rc;
            gap = ms;
            at = ms + 1;
            while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if ((rc = piece(t, step, s + gap, ms - gap)) || (rc = piece(t, step, s + ms, me - ms))) return rc;
        gap = at = me;
    }
    return piece(t, step, s + gap, n - gap);
}

static bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* The added token of a pass (0: raw text, 1: normalized text) starting at
 * text[i] (longest first), or NULL. */
static const added_token *added_at(const bpe_model *m, int pass, const char *text, size_t len, size_t i) {
    if (!m->added_first[pass][(unsigned char)text[i]]) return NULL;
    for (int k = 0; k < m->n_added; k++) {
        const added_token *a = &m->added[k];
        if (a->normalized == pass && a->len <= len - i && memcmp(text + i, a->pattern, a->len) == 0) return a;
    }
    return NULL;
}

static int split_added(fl_bpe *t, int pass, const char *text, size_t len);

/* A stretch of raw text between added tokens: normalized, then its
 * normalized added tokens cut out. Text that is not UTF-8 is left as it
 * is (`tokenizers` never sees any: Python and Rust strings are UTF-8). */
static int normalize_segment(fl_bpe *t, const char *text, size_t len) {
    if (!t->m->normalize || len == 0) return split_added(t, 1, text, len);
    utf8proc_uint8_t *n = NULL;
    utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &n,
                                       (utf8proc_option_t)t->m->normalize);
    if (nl == UTF8PROC_ERROR_NOMEM) return -1;
    int rc = nl < 0 ? split_added(t, 1, text, len) : split_added(t, 1, (const char *)n, (size_t)nl);
    free(n);
    return rc;
}

/* Cut the added tokens of a pass out of text[0, len) (leftmost-longest;
 * lstrip/rstrip take the whitespace next to a token into it) and pass what
 * lies between them on: to the normalizer (pass 0) or the pre-tokenizer
 * (pass 1). 0, -1 (out of memory) or 1 (the error is set). */
static int split_added(fl_bpe *t, int pass, const char *text, size_t len) {
    size_t seg = 0, i = 0;
    for (;;) {
        const added_token *a = NULL;
        while (i < len && !(a = added_at(t->m, pass, text, len, i))) i++;
        size_t end = i;
        if (a && a->lstrip) {
            while (end > seg && is_space((unsigned char)text[end - 1])) end--;
        }
        int rc = pass == 0 ? normalize_segment(t, text + seg, end - seg)
                           : pre_tokenize(t, 0, text + seg, end - seg, false);
        if (rc) return rc;
        if (!a) return 0;
        if (emit(t, a->id)) return -1;
        i += a->len;
        if (a->rstrip) {
            while (i < len && is_space((unsigned char)text[i])) i++;
        }
        seg = i;
    }
}

int64_t fl_bpe_encode(fl_bpe *t, const char *text, size_t len, bool add_special, const int32_t **ids) {
    t->out_len = 0;
    if (add_special) {
        for (int k = 0; k < t->m->n_template_pre; k++) {
            if (emit(t, t->m->template_pre[k])) goto oom;
        }
    }
    int rc = split_added(t, 0, text, len);
    if (rc > 0) return -1;
    if (rc < 0) goto oom;
    if (add_special) {
        for (int k = 0; k < t->m->n_template_post; k++) {
            if (emit(t, t->m->template_post[k])) goto oom;
        }
    }
    *ids = t->out;
    return (int64_t)t->out_len;
oom:
    fl_fail(FL_ERR_OOM, "tokenizer %s: out of memory encoding %zu bytes", t->m->path, len);
    return -1;
}

/* ---- decoding ----------------------------------------------------------- */

/* Append the UTF-8 of s[0, n) with each maximal invalid subpart replaced by
 * U+FFFD (Rust's from_utf8_lossy; the Unicode standard's recommendation). */
static size_t lossy_utf8(const unsigned char *s, size_t n, char *out) {
    size_t o = 0, i = 0;
    while (i < n) {
        unsigned char b = s[i];
        if (b < 0x80) {
            out[o++] = (char)b;
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) need = 2;
        else if (b == 0xE0) need = 3, lo = 0xA0;
        else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 3;
        else if (b == 0xED) need = 3, hi = 0x9F;
        else if (b == 0xF0) need = 4, lo = 0x90;
        else if (b >= 0xF1 && b <= 0xF3) need = 4;
        else if (b == 0xF4) need = 4, hi = 0x8F;
        else need = 0;
        size_t k = 1;
        if (need) {
            for (; k < need && i + k < n; k++) {
                unsigned char c = s[i + k];
                if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
            }
        }
        if (need && k == need) {
            memcpy(out + o, s + i, need);
            o += need;
            i += need;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += k;
        }
    }
    return o;
}

int64_t fl_bpe_decode(fl_bpe *t, const int32_t *ids, int64_t n, bool skip_special, const char **text) {
    size_t bytes = 0;
    for (int64_t k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] >= t->m->n_ids || !t->m->token[ids[k]]) {
            fl_fail(FL_ERR_ARG, "tokenizer %s: decode: id %d at position %lld is not in the vocabulary (%lld ids)",
                    t->m->path, (int)ids[k], (long long)k, (long long)t->m->n_ids);
            return -1;
        }
        bytes += t->m->token_len[ids[k]];
    }
    /* Raw bytes first (at most the tokens' length), then the lossy UTF-8
     * of them (at most 3 bytes per byte) after them in the same buffer. */
    if (grow((void **)&t->text, &t->text_cap, bytes * 4 + 1, 1)) {
        fl_fail(FL_ERR_OOM, "tokenizer %s: out of memory decoding %lld ids", t->m->path, (long long)n);
        return -1;
    }
    unsigned char *raw = (unsigned char *)t->text + bytes * 3 + 1;
    size_t r = 0;
    for (int64_t k = 0; k < n; k++) {
        if (skip_special && t->m->special[ids[k]]) continue;
        const unsigned char *s = (const unsigned char *)t->m->token[ids[k]];
        size_t len = t->m->token_len[ids[k]], start = r;
        bool mapped = true;
        for (size_t i = 0; i < len && mapped;) {
            uint32_t cp;
            if (s[i] < 0x80) cp = s[i++];
            else if ((s[i] & 0xE0) == 0xC0 && i + 1 < len) cp = (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F), i += 2;
            else cp = UINT32_MAX, i = len;
            if (cp < 324 && t->m->char_byte[cp] >= 0) raw[r++] = (unsigned char)t->m->char_byte[cp];
            else mapped = false;
        }
        if (!mapped) { /* a character outside the alphabet: the token's own text */
            memcpy(raw + start, s, len);
            r = start + len;
        }
    }
    /* raw lies after out's largest extent (3 bytes per raw byte): no overlap. */
    size_t o = lossy_utf8(raw, r, t->text);
    t->text[o] = 0;
    *text = t->text;
    return (int64_t)o;
}

/* ---- vocabulary queries ------------------------------------------------- */

int64_t fl_bpe_vocab_size(const fl_bpe *t) { return t->m->n_ids; }

int64_t fl_bpe_token_to_id(const fl_bpe *t, const char *token, size_t len) {
    for (int k = 0; k < t->m->n_added; k++) {
        const added_token *a = &t->m->added[k];
        if (t->m->token_len[a->id] == len && memcmp(a->content, token, len) == 0) return a->id;
    }
    return vocab_id(t->m, token, len);
}

const char *fl_bpe_id_to_token(const fl_bpe *t, int64_t id, size_t *len) {
    if (id < 0 || id >= t->m->n_ids || !t->m->token[id]) {
        fl_fail(FL_ERR_ARG, "tokenizer %s: id %lld is not in the vocabulary (%lld ids)", t->m->path, (long long)id,
                (long long)t->m->n_ids);
        return NULL;
    }
    *len = t->m->token_len[id];
    return t->m->token[id];
}

bool fl_bpe_is_special(const fl_bpe *t, int64_t id) { return id >= 0 && id < t->m->n_ids && t->m->special[id]; }
