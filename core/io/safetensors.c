/*
 * safetensors.c: reading and writing the safetensors format (the format of
 * Hugging Face checkpoints and of our own files).
 *
 * Reading maps the file read-only and validates the whole header before
 * anything else: the header length against the file size, the JSON, and
 * for every tensor its dtype, its shape (non-negative, no overflow), and
 * that data_offsets are ordered, inside the data section, and exactly the
 * tensor's byte size. Tensors are views of the mapping whose storage holds
 * a reference to the file, so the mapping lives as long as any of them.
 * Copies out of the mapping are guarded against the file shrinking
 * (core/base/fault.c). Names and metadata keys are found through hash
 * indexes, so opening and reading a file of n entries is O(n log n) (the
 * sort by offset), whatever n: headers of 200k tensors are real (token
 * shards, per-expert weights) and hostile ones are cheap to write.
 *
 * Writing streams: the header is written first from declarations, then the
 * tensors in order, so no caller needs all tensors in memory at once. The
 * file is written under a temporary name and renamed after fsync
 * (the steps of atomic_file.c).
 */
#include "error.h"
#include "files.h"
#include "shape.h"
#include "storage.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <yajl/yajl_parse.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers over 100 MB. */
enum { MAX_HEADER = 100 * 1000 * 1000 };

typedef struct entry {
    char *name;
    fl_dtype dtype;
    int ndim;
    int64_t shape[FL_MAX_DIMS];
    uint64_t begin, end; /* within the data section */
} entry;

/* ---- name indexes: open addressing on a string hash --------------------- */

typedef struct name_slot {
    const char *name; /* borrowed from the entry or metadata array; NULL: empty */
    int value;
} name_slot;

typedef struct name_index {
    name_slot *slots;
    size_t cap; /* a power of two, at least twice the count */
    size_t count;
} name_index;

static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static int index_find(const name_index *x, const char *name) {
    if (!x->cap || !name) return -1;
    for (size_t i = hash_name(name) & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
        if (!x->slots[i].name) return -1;
        if (strcmp(x->slots[i].name, name) == 0) return x->slots[i].value;
    }
}

static void index_place(name_index *x, const char *name, int value) {
    size_t i = hash_name(name) & (x->cap - 1);
    while (x->slots[i].name) i = (i + 1) & (x->cap - 1);
    x->slots[i] = (name_slot){name, value};
    x->count++;
}

/* Add name -> value (name must not be present); FL_ERR_OOM on failure. */
static int index_add(name_index *x, const char *name, int value) {
    if (2 * (x->count + 1) > x->cap) {
        name_index bigger = {NULL, x->cap ? 2 * x->cap : 64, 0};
        bigger.slots = calloc(bigger.cap, sizeof *bigger.slots);
        if (!bigger.slots) return FL_ERR_OOM;
        for (size_t i = 0; i < x->cap; i++)
            if (x->slots[i].name) index_place(&bigger, x->slots[i].name, x->slots[i].value);
        free(x->slots);
        *x = bigger;
    }
    index_place(x, name, value);
    return FL_OK;
}

static void index_free(name_index *x) {
    free(x->slots);
    *x = (name_index){0};
}

struct fl_safetensors {
    int32_t refcount; /* the handle and every tensor taken from it */
    char *path;
    void *map;
    size_t size;
    const char *data; /* start of the data section */
    uint64_t data_size;
    entry *entries;
    int n;
    char **meta_keys, **meta_values;
    int n_meta;
    name_index by_name, by_meta_key;
};

static const struct {
    const char *name;
    fl_dtype dtype;
} dtype_names[] = {
    {"F64", FL_F64}, {"F32", FL_F32}, {"F16", FL_F16}, {"BF16", FL_BF16},
    {"I64", FL_I64}, {"I32", FL_I32}, {"I16", FL_I16}, {"I8", FL_I8},
    {"U32", FL_U32}, {"U16", FL_U16}, {"U8", FL_U8},   {"BOOL", FL_BOOL},
};

static const char *st_dtype_name(fl_dtype d) {
    for (size_t k = 0; k < sizeof dtype_names / sizeof dtype_names[0]; k++)
        if (dtype_names[k].dtype == d) return dtype_names[k].name;
    return NULL;
}

/* ---- reading ---------------------------------------------------------------- */

static void release_file(fl_safetensors *f) {
    if (__atomic_sub_fetch(&f->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (f->map) {
        fl_fault_unregister(f->map);
        munmap(f->map, f->size);
    }
    index_free(&f->by_name);
    index_free(&f->by_meta_key);
    for (int i = 0; i < f->n; i++) free(f->entries[i].name);
    for (int k = 0; k < f->n_meta; k++) {
        free(f->meta_keys[k]);
        free(f->meta_values[k]);
    }
    free(f->entries);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

/* ---- the header: streamed JSON --------------------------------------------- */

/* [Note: streaming header parser]
 * The header is parsed with yajl's event (SAX) interface, not into a
 * tree: a tree costs a dozen allocations per entry and dominated opening a
 * file of 200k tensors (over a second with jansson). The events drive the
 * small state machine below, which accepts exactly what the format allows:
 * a root object whose members are tensor entries
 *     "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
 * (other members of an entry are skipped, as other readers do) and at most
 * one "__metadata__" object of strings. Names and metadata keys go into the
 * hash indexes as they arrive, which also rejects duplicates. Any callback
 * that finds a problem records the message (naming the file and the
 * tensor) and cancels the parse. */

enum field { FIELD_NONE, FIELD_DTYPE, FIELD_SHAPE, FIELD_OFFSETS, FIELD_OTHER };

typedef struct header_parser {
    fl_safetensors *f;
    int depth;          /* 0 outside the root, 1 in it, 2 in an entry or the metadata */
    int skip;           /* > 0: inside a skipped value, its nesting depth */
    bool in_meta, seen_meta, array_open;
    enum field field;
    char *key;          /* the member of the root being read (owned) */
    char *meta_key;     /* the metadata key whose value comes next (owned) */
    /* the entry being read */
    entry e;
    bool has_dtype, has_shape, has_offsets;
    size_t n_shape, n_offsets;
    int64_t offsets[2];
    size_t cap;         /* capacity of f->entries */
    size_t meta_cap;
} header_parser;

static int hp_fail(header_parser *hp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int hp_fail(header_parser *hp, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (hp->depth >= 2 && !hp->in_meta && hp->key)
        fl_fail(FL_ERR_IO, "%s: tensor '%s': %s", hp->f->path, hp->key, msg);
    else
        fl_fail(FL_ERR_IO, "%s: %s", hp->f->path, msg);
    return 0; /* cancels the parse */
}

static int hp_oom(header_parser *hp) {
    fl_fail(FL_ERR_OOM, "%s: out of memory reading the header", hp->f->path);
    return 0;
}

/* A key or string as a C string; NUL bytes inside would make two names
 * equal that are not. NULL when refused (message set). */
static char *hp_string(header_parser *hp, const unsigned char *s, size_t len, const char *what) {
    if (memchr(s, 0, len)) {
        hp_fail(hp, "%s contains a NUL character", what);
        return NULL;
    }
    char *c = malloc(len + 1);
    if (!c) {
        hp_oom(hp);
        return NULL;
    }
    memcpy(c, s, len);
    c[len] = '\0';
    return c;
}

static const char *const ENTRY_NEEDS =
    "needs string dtype, array shape and data_offsets [begin, end]";

/* The entry's end: check it whole, as one tensor of the file. */
static int hp_finish_entry(header_parser *hp) {
    fl_safetensors *f = hp->f;
    entry *e = &hp->e;
    if (!hp->has_dtype || !hp->has_shape || !hp->has_offsets || hp->n_offsets != 2)
        return hp_fail(hp, "%s", ENTRY_NEEDS);
    e->ndim = (int)hp->n_shape;
    /* The core's shape rule (strides and byte sizes fit 64 bits, also with
     * a zero-size dim): what passes here is a valid tensor shape. */
    int64_t numel;
    if (fl_check_shape("header", e->ndim, e->shape, &numel) != FL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fl_last_error());
        return hp_fail(hp, "%s", msg);
    }
    uint64_t bytes = (uint64_t)numel * fl_dtype_size(e->dtype);
    if (hp->offsets[1] < hp->offsets[0])
        return hp_fail(hp, "data_offsets must be integers 0 <= begin <= end");
    e->begin = (uint64_t)hp->offsets[0];
    e->end = (uint64_t)hp->offsets[1];
    if (e->end > f->data_size)
        return hp_fail(hp, "data_offsets [%llu, %llu] run past the end of the data (%llu bytes; "
                           "file truncated?)", (unsigned long long)e->begin,
                       (unsigned long long)e->end, (unsigned long long)f->data_size);
    if (e->end - e->begin != bytes)
        return hp_fail(hp, "%llu bytes of data for %s of %llu bytes",
                       (unsigned long long)(e->end - e->begin), st_dtype_name(e->dtype),
                       (unsigned long long)bytes);
    if ((size_t)f->n == hp->cap) {
        size_t cap = hp->cap ? 2 * hp->cap : 64;
        entry *grown = cap < (size_t)INT32_MAX ? realloc(f->entries, cap * sizeof *grown) : NULL;
        if (!grown) return hp_oom(hp);
        f->entries = grown;
        hp->cap = cap;
    }
    e->name = hp->key; /* the entry owns the name now */
    hp->key = NULL;
    f->entries[f->n++] = *e;
    return 1;
}

static int hp_map_key(void *ctx, const unsigned char *s, size_t len) {
    header_parser *hp = ctx;
    if (hp->skip) return 1;
    if (hp->depth == 1) {
        free(hp->key);
        if (!(hp->key = hp_string(hp, s, len, "a tensor name"))) return 0;
        bool meta = strcmp(hp->key, "__metadata__") == 0;
        if ((meta && hp->seen_meta) || (!meta && index_find(&hp->f->by_name, hp->key) >= 0))
            return hp_fail(hp, "header is not valid JSON: the name '%s' appears twice", hp->key);
        /* Entries are indexed by position for now; reindexed in data order
         * after the sort. Borrowed pointer: the name moves into the entry. */
        if (!meta && index_add(&hp->f->by_name, hp->key, hp->f->n) != FL_OK) return hp_oom(hp);
        return 1;
    }
    if (hp->in_meta) {
        free(hp->meta_key);
        if (!(hp->meta_key = hp_string(hp, s, len, "a __metadata__ key"))) return 0;
        if (index_find(&hp->f->by_meta_key, hp->meta_key) >= 0)
            return hp_fail(hp, "header is not valid JSON: __metadata__ key '%s' appears twice",
                           hp->meta_key);
        return 1;
    }
    /* a member of an entry */
    enum field fd = FIELD_OTHER;
    bool *seen = NULL;
    if (len == 5 && memcmp(s, "dtype", 5) == 0) fd = FIELD_DTYPE, seen = &hp->has_dtype;
    else if (len == 5 && memcmp(s, "shape", 5) == 0) fd = FIELD_SHAPE, seen = &hp->has_shape;
    else if (len == 12 && memcmp(s, "data_offsets", 12) == 0) fd = FIELD_OFFSETS, seen = &hp->has_offsets;
    if (seen && *seen) return hp_fail(hp, "header is not valid JSON: %.*s appears twice", (int)len, s);
    hp->field = fd;
    return 1;
}

static int hp_start_map(void *ctx) {
    header_parser *hp = ctx;
    if (hp->skip) return ++hp->skip, 1;
    if (hp->depth == 0) return hp->depth = 1, 1;
    if (hp->depth == 1) {
        hp->depth = 2;
        if (strcmp(hp->key, "__metadata__") == 0) {
            hp->in_meta = hp->seen_meta = true;
            return 1;
        }
        hp->in_meta = false;
        memset(&hp->e, 0, sizeof hp->e);
        hp->has_dtype = hp->has_shape = hp->has_offsets = false;
        hp->n_shape = hp->n_offsets = 0;
        hp->field = FIELD_NONE;
        return 1;
    }
    if (hp->in_meta) return hp_fail(hp, "__metadata__ value of '%s' is not a string", hp->meta_key);
    if (hp->field == FIELD_OTHER) return hp->skip = 1, 1;
    return hp_fail(hp, "%s", ENTRY_NEEDS);
}

static int hp_end_map(void *ctx) {
    header_parser *hp = ctx;
    if (hp->skip) return --hp->skip, 1;
    if (hp->depth == 2) {
        int ok = hp->in_meta ? 1 : hp_finish_entry(hp); /* messages name the tensor */
        hp->depth = 1;
        hp->in_meta = false;
        return ok;
    }
    hp->depth = 0;
    return 1;
}

static int hp_start_array(void *ctx) {
    header_parser *hp = ctx;
    if (hp->skip) return ++hp->skip, 1;
    if (hp->depth == 0) return hp_fail(hp, "header is not a JSON object");
    if (hp->depth == 1) {
        if (strcmp(hp->key, "__metadata__") == 0) return hp_fail(hp, "__metadata__ is not an object");
        hp->depth = 2; /* for the message's tensor name */
        return hp_fail(hp, "entry is not a JSON object");
    }
    if (hp->in_meta) return hp_fail(hp, "__metadata__ value of '%s' is not a string", hp->meta_key);
    if (hp->field == FIELD_OTHER) return hp->skip = 1, 1;
    if (hp->array_open && hp->field == FIELD_SHAPE)
        return hp_fail(hp, "shape entry %zu is not a non-negative integer", hp->n_shape);
    if (hp->array_open || (hp->field != FIELD_SHAPE && hp->field != FIELD_OFFSETS))
        return hp_fail(hp, "%s", ENTRY_NEEDS);
    hp->array_open = true;
    if (hp->field == FIELD_SHAPE) hp->has_shape = true;
    else hp->has_offsets = true;
    return 1;
}

static int hp_end_array(void *ctx) {
    header_parser *hp = ctx;
    if (hp->skip) return --hp->skip, 1;
    hp->array_open = false;
    if (hp->field == FIELD_SHAPE && hp->n_shape > FL_MAX_DIMS)
        return hp_fail(hp, "%zu dims, at most %d supported", hp->n_shape, FL_MAX_DIMS);
    return 1;
}

/* A scalar where the state says what it may be. */
static int hp_scalar(header_parser *hp, bool is_int, long long v, const char *what) {
    if (hp->skip) return 1;
    if (hp->depth == 0) return hp_fail(hp, "header is not a JSON object");
    if (hp->depth == 1) {
        if (strcmp(hp->key, "__metadata__") == 0) return hp_fail(hp, "__metadata__ is not an object");
        hp->depth = 2;
        return hp_fail(hp, "entry is not a JSON object");
    }
    if (hp->in_meta) return hp_fail(hp, "__metadata__ value of '%s' is not a string", hp->meta_key);
    if (hp->field == FIELD_OTHER && !hp->array_open) return 1;
    if (hp->array_open && hp->field == FIELD_SHAPE) {
        if (!is_int || v < 0)
            return hp_fail(hp, "shape entry %zu is not a non-negative integer", hp->n_shape);
        if (hp->n_shape < FL_MAX_DIMS) hp->e.shape[hp->n_shape] = v;
        hp->n_shape++; /* counted past the limit for the message */
        return 1;
    }
    if (hp->array_open && hp->field == FIELD_OFFSETS) {
        if (!is_int || v < 0 || hp->n_offsets == 2)
            return hp_fail(hp, "data_offsets must be integers 0 <= begin <= end");
        hp->offsets[hp->n_offsets++] = v;
        return 1;
    }
    (void)what;
    return hp_fail(hp, "%s", ENTRY_NEEDS);
}

static int hp_integer(void *ctx, long long v) { return hp_scalar(ctx, true, v, "integer"); }
static int hp_double(void *ctx, double v) { (void)v; return hp_scalar(ctx, false, 0, "number"); }
static int hp_null(void *ctx) { return hp_scalar(ctx, false, 0, "null"); }
static int hp_boolean(void *ctx, int v) { (void)v; return hp_scalar(ctx, false, 0, "boolean"); }

static int hp_string_value(void *ctx, const unsigned char *s, size_t len) {
    header_parser *hp = ctx;
    if (hp->skip || hp->depth < 2 || hp->array_open || (!hp->in_meta && hp->field != FIELD_DTYPE))
        return hp_scalar(hp, false, 0, "string");
    fl_safetensors *f = hp->f;
    if (hp->in_meta) {
        if ((size_t)f->n_meta == hp->meta_cap) {
            size_t cap = hp->meta_cap ? 2 * hp->meta_cap : 16;
            char **k = cap < (size_t)INT32_MAX ? realloc(f->meta_keys, cap * sizeof *k) : NULL;
            if (k) f->meta_keys = k;
            char **v = k ? realloc(f->meta_values, cap * sizeof *v) : NULL;
            if (!v) return hp_oom(hp);
            f->meta_values = v;
            hp->meta_cap = cap;
        }
        char *value = hp_string(hp, s, len, "a __metadata__ value");
        if (!value) return 0;
        if (index_add(&f->by_meta_key, hp->meta_key, f->n_meta) != FL_OK) {
            free(value);
            return hp_oom(hp);
        }
        f->meta_keys[f->n_meta] = hp->meta_key; /* owned by the file now */
        f->meta_values[f->n_meta] = value;
        f->n_meta++;
        hp->meta_key = NULL;
        return 1;
    }
    /* dtype */
    for (size_t k = 0; k < sizeof dtype_names / sizeof dtype_names[0]; k++)
        if (strlen(dtype_names[k].name) == len && memcmp(s, dtype_names[k].name, len) == 0) {
            hp->e.dtype = dtype_names[k].dtype;
            hp->has_dtype = true;
            return 1;
        }
    return hp_fail(hp, "dtype %.*s is not supported", (int)(len < 32 ? len : 32), s);
}

static const yajl_callbacks header_events = {
    .yajl_null = hp_null,
    .yajl_boolean = hp_boolean,
    .yajl_integer = hp_integer,
    .yajl_double = hp_double,
    .yajl_string = hp_string_value,
    .yajl_start_map = hp_start_map,
    .yajl_map_key = hp_map_key,
    .yajl_end_map = hp_end_map,
    .yajl_start_array = hp_start_array,
    .yajl_end_array = hp_end_array,
};

static int by_offset(const void *a, const void *b) {
    const entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_header(fl_safetensors *f, const char *text, size_t len) {
    header_parser hp = {.f = f};
    yajl_handle y = yajl_alloc(&header_events, NULL, &hp);
    if (!y) return fl_fail(FL_ERR_OOM, "%s: out of memory", f->path);
    fl_clear_error();
    yajl_status st = yajl_parse(y, (const unsigned char *)text, len);
    if (st == yajl_status_ok) st = yajl_complete_parse(y);
    int rc = FL_OK;
    if (st == yajl_status_client_canceled) {
        rc = fl_last_status() != FL_OK ? (int)fl_last_status()
                                       : fl_fail(FL_ERR_IO, "%s: header rejected", f->path);
    } else if (st != yajl_status_ok) {
        unsigned char *why = yajl_get_error(y, 0, (const unsigned char *)text, len);
        rc = fl_fail(FL_ERR_IO, "%s: header is not valid JSON (%s)", f->path,
                     why ? (const char *)why : "?");
        if (why) yajl_free_error(y, why);
    }
    yajl_free(y);
    free(hp.key);
    free(hp.meta_key);
    if (rc != FL_OK) return rc;
    /* Data order; overlapping tensors would alias each other's bytes. */
    if (f->n > 1) qsort(f->entries, (size_t)f->n, sizeof *f->entries, by_offset); /* not NULL, 0 */
    int last = -1; /* the non-empty entry reaching furthest so far */
    for (int i = 0; i < f->n; i++) {
        const entry *e = &f->entries[i];
        if (e->end == e->begin) continue;
        if (last >= 0 && e->begin < f->entries[last].end)
            return fl_fail(FL_ERR_IO, "%s: tensors '%s' and '%s' overlap in the data", f->path,
                           f->entries[last].name, e->name);
        if (last < 0 || e->end > f->entries[last].end) last = i;
    }
    /* Reindex in data order (the sort moved the entries). */
    index_free(&f->by_name);
    for (int i = 0; i < f->n; i++)
        if (index_add(&f->by_name, f->entries[i].name, i) != FL_OK)
            return fl_fail(FL_ERR_OOM, "%s: out of memory for the name index", f->path);
    return FL_OK;
}

fl_safetensors *fl_safetensors_open(const char *path) {
    if (!path) return FL_FAIL_NULL(FL_ERR_ARG, "safetensors: path is NULL");
    fl_safetensors *f = calloc(1, sizeof *f);
    if (!f) return FL_FAIL_NULL(FL_ERR_OOM, "safetensors: out of memory");
    f->refcount = 1;
    f->path = strdup(path);
    struct stat st;
    int fd = fl_open_regular(path, &st); /* a FIFO or a device is refused, never waited on */
    if (fd < 0) goto fail;
    f->size = (size_t)st.st_size;
    if (f->size < 8) {
        fl_fail(FL_ERR_IO, "%s: %zu bytes is too short for a safetensors file", path, f->size);
        goto fail;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        fl_fail(FL_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    fl_fault_register(f->map, f->size, f->path);
    unsigned char p[8];
    if (fl_guarded_memcpy(p, f->map, 8) != 0) {
        fl_fail(FL_ERR_IO, "%s: the file shrank while it was being opened", path);
        goto fail;
    }
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = n << 8 | p[k]; /* little-endian on any host */
    if (n > MAX_HEADER || n > f->size - 8) {
        fl_fail(FL_ERR_IO, "%s: header length %llu does not fit the file of %zu bytes "
                           "(truncated or not safetensors)", path, (unsigned long long)n, f->size);
        goto fail;
    }
    f->data = (const char *)f->map + 8 + n;
    f->data_size = f->size - 8 - n;
    /* The header is parsed from a copy: a file truncated meanwhile is an
     * error here, not a fault inside the parser. */
    char *header = malloc(n ? n : 1);
    if (!header) {
        fl_fail(FL_ERR_OOM, "%s: out of memory for a header of %llu bytes", path,
                (unsigned long long)n);
        goto fail;
    }
    if (fl_guarded_memcpy(header, (const char *)f->map + 8, n) != 0) {
        free(header);
        fl_fail(FL_ERR_IO, "%s: the file shrank while it was being opened", path);
        goto fail;
    }
    int rc = parse_header(f, header, (size_t)n);
    free(header);
    if (rc != FL_OK) goto fail;
    return f;
fail:
    if (fd >= 0) close(fd);
    release_file(f);
    return NULL;
}

void fl_safetensors_close(fl_safetensors *f) {
    if (f) release_file(f);
}

int fl_safetensors_count(const fl_safetensors *f) { return f ? f->n : 0; }

const char *fl_safetensors_name(const fl_safetensors *f, int i) {
    return f && i >= 0 && i < f->n ? f->entries[i].name : NULL;
}

int fl_safetensors_find(const fl_safetensors *f, const char *name) {
    return f ? index_find(&f->by_name, name) : -1;
}

static int check_index(const fl_safetensors *f, int i) {
    if (!f) return fl_fail(FL_ERR_ARG, "safetensors: file handle is NULL");
    if (i < 0 || i >= f->n)
        return fl_fail(FL_ERR_ARG, "%s: tensor index %d out of range (%d tensors)", f->path, i, f->n);
    return FL_OK;
}

int fl_safetensors_info(const fl_safetensors *f, int i, fl_dtype *dtype, int *ndim,
                        int64_t *shape) {
    if (check_index(f, i)) return fl_last_status();
    const entry *e = &f->entries[i];
    *dtype = e->dtype;
    *ndim = e->ndim;
    memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
    return FL_OK;
}

static void release_mapping(void *ctx, void *data, int64_t nbytes) {
    (void)data;
    (void)nbytes;
    release_file(ctx);
}

/* storage->check of tensors in the mapping: whether the file still holds
 * the mapping's last page, read under the SIGBUS guard (no system call, no
 * descriptor kept: a dataset may map thousands of shards). A file cut short
 * within its last page faults nowhere: its tail just reads as zeros. See
 * [Note: mapped files that shrink]. */
static int file_check(void *ctx) {
    const fl_safetensors *f = ctx;
    char last;
    if (fl_guarded_memcpy(&last, (const char *)f->map + f->size - 1, 1) != 0)
        return fl_fail(FL_ERR_IO, "%s: the file shrank while it was mapped (it had %zu bytes; "
                                  "truncated or rewritten in place by another process?)",
                       f->path, f->size);
    return FL_OK;
}

fl_tensor *fl_safetensors_get(fl_safetensors *f, int i) {
    if (check_index(f, i)) return NULL;
    const entry *e = &f->entries[i];
    const char *src = f->data + e->begin;
    fl_device cpu = fl_device_make(FL_DEVICE_CPU, 0);
    size_t align = fl_dtype_size(e->dtype);
    if ((uintptr_t)src % align != 0) {
        /* Misaligned data (a header not padded to 8): copy into memory of
         * our own rather than read it unaligned. */
        fl_tensor *t = fl_empty(e->ndim, e->shape, e->dtype, cpu);
        if (t && fl_guarded_memcpy(t->data, src, (size_t)(e->end - e->begin)) != 0) {
            fl_tensor_release(t);
            return FL_FAIL_NULL(FL_ERR_IO, "%s: the file shrank while it was mapped (truncated "
                                           "or rewritten in place by another process?): "
                                           "tensor '%s' cannot be read", f->path, e->name);
        }
        return t;
    }
    fl_tensor *t = fl_tensor_header(e->ndim, e->shape, e->dtype, cpu);
    fl_storage *s = calloc(1, sizeof *s);
    if (!t || !s) {
        free(s);
        fl_tensor_release(t);
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory", f->path);
    }
    __atomic_fetch_add(&f->refcount, 1, __ATOMIC_RELAXED);
    s->data = (void *)src;
    s->nbytes = (int64_t)(e->end - e->begin);
    s->refcount = 1;
    s->device = cpu;
    s->release = release_mapping;
    s->release_ctx = f;
    s->file = f->path;
    s->check = file_check;
    t->storage = s;
    t->data = s->data;
    return t;
}

const char *fl_safetensors_metadata(const fl_safetensors *f, const char *key) {
    int k = f ? index_find(&f->by_meta_key, key) : -1;
    return k >= 0 ? f->meta_values[k] : NULL;
}

int fl_safetensors_metadata_count(const fl_safetensors *f) { return f ? f->n_meta : 0; }

const char *fl_safetensors_metadata_key(const fl_safetensors *f, int k) {
    return f && k >= 0 && k < f->n_meta ? f->meta_keys[k] : NULL;
}

/* ---- writing ------------------------------------------------------------------ */

struct fl_safetensors_writer {
    char *path, *tmp_path;
    FILE *file;
    entry *entries;
    int n, cap, next;  /* declared, capacity, next to write */
    name_index by_name;
    json_t *meta;
    uint64_t data_size;
    bool header_written, finished, failed;
    /* Integrity (the end of this file): the running checksum or NULL, where
     * its placeholder sits in the file, finiteness checks, the result. */
    fl_digest *digest;
    long checksum_at;
    bool finite;
    char checksum[FL_CHECKSUM_TEXT];
};

/* The checksum is of the data section, which follows the header, so the
 * header is written with a placeholder of the same length and the digits
 * are patched in at finish, before the rename: the file that appears is
 * whole, and readers that do not know the key see ordinary metadata. */
#define CHECKSUM_KEY "fsdp_checksum"
#define CHECKSUM_PLACEHOLDER "xxh3-64:0000000000000000"

static int checksum_placeholder(fl_safetensors_writer *w, const char *text);
static int checked_data(fl_safetensors_writer *w, const entry *e, const void *data, size_t bytes);
static int patch_checksum(fl_safetensors_writer *w);

fl_safetensors_writer *fl_safetensors_writer_new(const char *path) {
    if (!path) return FL_FAIL_NULL(FL_ERR_ARG, "safetensors writer: path is NULL");
    fl_safetensors_writer *w = calloc(1, sizeof *w);
    size_t len = strlen(path) + 32;
    if (w) w->tmp_path = malloc(len);
    if (!w || !w->tmp_path) {
        free(w);
        return FL_FAIL_NULL(FL_ERR_OOM, "safetensors writer: out of memory");
    }
    w->path = strdup(path);
    snprintf(w->tmp_path, len, "%s.tmp.%d", path, (int)getpid());
    w->meta = json_object();
    return w;
}

static int writer_usable(fl_safetensors_writer *w, const char *op) {
    if (!w) return fl_fail(FL_ERR_ARG, "safetensors %s: writer is NULL", op);
    if (w->failed || w->finished)
        return fl_fail(FL_ERR_STATE, "%s: safetensors %s after the writer %s", w->path, op,
                       w->failed ? "failed" : "finished");
    return FL_OK;
}

int fl_safetensors_writer_declare(fl_safetensors_writer *w, const char *name, fl_dtype dtype,
                                  int ndim, const int64_t *shape) {
    int64_t numel;
    if (writer_usable(w, "declare")) return fl_last_status();
    if (w->header_written)
        return fl_fail(FL_ERR_STATE, "%s: declare '%s' after writing started", w->path, name);
    if (!name || !*name || strcmp(name, "__metadata__") == 0)
        return fl_fail(FL_ERR_ARG, "%s: invalid tensor name '%s'", w->path, name ? name : "");
    if (!st_dtype_name(dtype))
        return fl_fail(FL_ERR_ARG, "%s: tensor '%s': invalid dtype %d", w->path, name, (int)dtype);
    if (fl_check_shape("safetensors declare", ndim, shape, &numel)) return fl_last_status();
    if (index_find(&w->by_name, name) >= 0)
        return fl_fail(FL_ERR_ARG, "%s: tensor '%s' declared twice", w->path, name);
    uint64_t end; /* numel * 8 fits (fl_check_shape); the running total may not */
    if (__builtin_add_overflow(w->data_size, (uint64_t)numel * fl_dtype_size(dtype), &end) ||
        end > (uint64_t)INT64_MAX)
        return fl_fail(FL_ERR_ARG, "%s: tensor '%s': the file's data would pass 2^63 bytes",
                       w->path, name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        entry *grown = realloc(w->entries, (size_t)cap * sizeof *grown);
        if (!grown) return fl_fail(FL_ERR_OOM, "%s: out of memory", w->path);
        w->entries = grown;
        w->cap = cap;
    }
    entry *e = &w->entries[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name || index_add(&w->by_name, e->name, w->n) != FL_OK) {
        free(e->name);
        return fl_fail(FL_ERR_OOM, "%s: out of memory", w->path);
    }
    e->dtype = dtype;
    e->ndim = ndim;
    memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->begin = w->data_size;
    e->end = end;
    w->data_size = e->end;
    w->n++;
    return FL_OK;
}

int fl_safetensors_writer_metadata(fl_safetensors_writer *w, const char *key, const char *value) {
    if (writer_usable(w, "metadata")) return fl_last_status();
    if (w->header_written)
        return fl_fail(FL_ERR_STATE, "%s: metadata '%s' after writing started", w->path, key);
    if (!key || !value) return fl_fail(FL_ERR_ARG, "%s: metadata key and value are needed", w->path);
    json_object_set_new(w->meta, key, json_string(value));
    return FL_OK;
}

static int fail_writer(fl_safetensors_writer *w, const char *what) {
    w->failed = true;
    return fl_fail(FL_ERR_IO, "%s: %s: %s", w->tmp_path, what, strerror(errno));
}

static int write_header(fl_safetensors_writer *w) {
    json_t *root = json_object();
    /* A checksum copied in with other metadata would describe other data. */
    if (w->digest) json_object_set_new(w->meta, CHECKSUM_KEY, json_string(CHECKSUM_PLACEHOLDER));
    else json_object_del(w->meta, CHECKSUM_KEY);
    if (json_object_size(w->meta) > 0) json_object_set(root, "__metadata__", w->meta);
    for (int i = 0; i < w->n; i++) {
        entry *e = &w->entries[i];
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        json_t *v = json_object();
        json_object_set_new(v, "dtype", json_string(st_dtype_name(e->dtype)));
        json_object_set_new(v, "shape", shape);
        json_object_set_new(v, "data_offsets",
                            json_pack("[II]", (json_int_t)e->begin, (json_int_t)e->end));
        json_object_set_new(root, e->name, v);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return fl_fail(FL_ERR_OOM, "%s: out of memory for the header", w->path);
    /* Pad with spaces to a multiple of 8 so the data stays 8-byte aligned
     * in a mapping: readers can then use it in place. */
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    unsigned char size[8];
    for (int k = 0; k < 8; k++) size[k] = (unsigned char)((uint64_t)padded >> (8 * k));
    w->file = fopen(w->tmp_path, "wb");
    bool ok = w->file && fwrite(size, 1, 8, w->file) == 8 && fwrite(text, 1, len, w->file) == len;
    for (size_t k = len; ok && k < padded; k++) ok = fputc(' ', w->file) != EOF;
    if (ok && w->digest && checksum_placeholder(w, text) != FL_OK) {
        free(text);
        return fl_last_status();
    }
    free(text);
    if (!ok) return fail_writer(w, "cannot write the header");
    w->header_written = true;
    return FL_OK;
}

int fl_safetensors_writer_write(fl_safetensors_writer *w, const fl_tensor *t) {
    if (writer_usable(w, "write") || fl_check_tensor("safetensors write", t, true))
        return fl_last_status();
    if (w->next >= w->n)
        return fl_fail(FL_ERR_STATE, "%s: all %d declared tensors are already written", w->path, w->n);
    entry *e = &w->entries[w->next];
    bool same = t->dtype == e->dtype && t->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = t->shape[d] == e->shape[d];
    if (!same) {
        char a[128], b[128];
        fl_shape_format(e->ndim, e->shape, b, sizeof b);
        return fl_fail(FL_ERR_ARG, "%s: tensor '%s' was declared %s %s, got %s %s", w->path, e->name,
                       fl_dtype_name(e->dtype), b, fl_dtype_name(t->dtype),
                       fl_shape_str(t, a, sizeof a));
    }
    if (!w->header_written && write_header(w) != FL_OK) return fl_last_status();
    fl_tensor *host = fl_to(t, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
    fl_tensor *dense = host ? fl_contiguous(host) : NULL;
    fl_tensor_release(host);
    if (!dense) return fl_last_status();
    size_t bytes = (size_t)(e->end - e->begin);
    if (checked_data(w, e, dense->data, bytes) != FL_OK) {
        fl_tensor_release(dense);
        return fl_last_status();
    }
    bool ok = bytes == 0 || fwrite(dense->data, 1, bytes, w->file) == bytes;
    fl_tensor_release(dense);
    if (!ok) return fail_writer(w, "cannot write tensor data");
    w->next++;
    return FL_OK;
}

int fl_safetensors_writer_finish(fl_safetensors_writer *w) {
    if (writer_usable(w, "finish")) return fl_last_status();
    if (w->next != w->n)
        return fl_fail(FL_ERR_STATE, "%s: finish with %d of %d declared tensors written", w->path,
                       w->next, w->n);
    if (!w->header_written && write_header(w) != FL_OK) return fl_last_status();
    if (patch_checksum(w) != FL_OK) return fl_last_status();
    if (fflush(w->file) != 0 || fsync(fileno(w->file)) != 0) return fail_writer(w, "cannot flush");
    int rc = fclose(w->file);
    w->file = NULL;
    if (rc != 0) return fail_writer(w, "cannot close");
    if (rename(w->tmp_path, w->path) != 0) return fail_writer(w, "cannot rename into place");
    w->finished = true;
    return fl_sync_parent_dir(w->path); /* the rename itself survives a crash */
}

void fl_safetensors_writer_free(fl_safetensors_writer *w) {
    if (!w) return;
    if (w->file) fclose(w->file);
    if (!w->finished && w->header_written) unlink(w->tmp_path);
    index_free(&w->by_name);
    for (int i = 0; i < w->n; i++) free(w->entries[i].name);
    free(w->entries);
    json_decref(w->meta);
    fl_digest_free(w->digest);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

/* ---- integrity: checksum and finiteness (core/io/checksum.c) ------------------- */

int fl_safetensors_writer_checksum(fl_safetensors_writer *w) {
    if (writer_usable(w, "checksum")) return fl_last_status();
    if (w->header_written)
        return fl_fail(FL_ERR_STATE, "%s: checksum requested after writing started", w->path);
    if (!w->digest && !(w->digest = fl_digest_new())) return fl_last_status();
    return FL_OK;
}

int fl_safetensors_writer_finite(fl_safetensors_writer *w, bool on) {
    if (writer_usable(w, "finite")) return fl_last_status();
    w->finite = on;
    return FL_OK;
}

const char *fl_safetensors_writer_checksum_value(const fl_safetensors_writer *w) {
    return w && w->finished && w->digest ? w->checksum : NULL;
}

/* Where the placeholder's digits are in the file. JSON escapes every quote
 * inside a string, so the pattern with its bare quotes matches only the
 * metadata entry itself. */
static int checksum_placeholder(fl_safetensors_writer *w, const char *text) {
    static const char pattern[] = "\"" CHECKSUM_KEY "\":\"xxh3-64:";
    const char *at = strstr(text, pattern);
    if (!at) return fl_fail(FL_ERR_STATE, "%s: the checksum placeholder is missing from the header",
                            w->path);
    w->checksum_at = 8 + (long)(at - text) + (long)(sizeof pattern - 1);
    return FL_OK;
}

static int checked_data(fl_safetensors_writer *w, const entry *e, const void *data, size_t bytes) {
    int64_t bad = -1;
    if (w->digest)
        bad = fl_digest_update(w->digest, data, bytes, e->dtype, w->finite);
    else if (w->finite)
        bad = fl_first_nonfinite(data, (int64_t)(bytes / fl_dtype_size(e->dtype)), e->dtype);
    if (bad < 0) return FL_OK;
    w->failed = true;
    return fl_fail(FL_ERR_ARG, "%s: tensor '%s' is not finite (element %lld is NaN or infinite): "
                               "refusing to write it", w->path, e->name, (long long)bad);
}

static int patch_checksum(fl_safetensors_writer *w) {
    if (!w->digest) return FL_OK;
    fl_checksum_text(fl_digest_value(w->digest), w->checksum);
    const char *digits = w->checksum + strlen("xxh3-64:");
    if (fflush(w->file) != 0 || fseek(w->file, w->checksum_at, SEEK_SET) != 0 ||
        fwrite(digits, 1, 16, w->file) != 16 || fseek(w->file, 0, SEEK_END) != 0)
        return fail_writer(w, "cannot write the checksum");
    return FL_OK;
}

int fl_safetensors_verify(const fl_safetensors *f, bool *checked) {
    if (checked) *checked = false;
    if (!f) return fl_fail(FL_ERR_ARG, "safetensors verify: file handle is NULL");
    const char *want = fl_safetensors_metadata(f, CHECKSUM_KEY);
    if (!want) return FL_OK;
    /* The hash reads every mapped byte on several threads, where no guard
     * can catch a fault: a file that shrank is refused first (a truncation
     * racing the hash itself ends the process naming the file, fault.c). */
    int rc = file_check((void *)f);
    if (rc != FL_OK) return rc;
    char got[FL_CHECKSUM_TEXT];
    fl_checksum_text(fl_checksum(f->data, (size_t)f->data_size), got);
    if (strcmp(got, want) != 0)
        return fl_fail(FL_ERR_IO, "%s: the tensor data is damaged: it hashes to %s, the file "
                                  "records %s", f->path, got, want);
    if (checked) *checked = true;
    return FL_OK;
}
