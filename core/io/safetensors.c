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
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

/* Parse one tensor entry; the message names the file and the tensor. */
static int parse_entry(const fl_safetensors *f, const char *name, json_t *v, entry *e) {
    const char *path = f->path;
    if (!json_is_object(v))
        return fl_fail(FL_ERR_IO, "%s: tensor '%s': entry is not a JSON object", path, name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) || json_array_size(off) != 2)
        return fl_fail(FL_ERR_IO, "%s: tensor '%s': needs string dtype, array shape and "
                                  "data_offsets [begin, end]", path, name);
    const char *dn = json_string_value(dt);
    bool known = false;
    for (size_t k = 0; k < sizeof dtype_names / sizeof dtype_names[0]; k++)
        if (strcmp(dn, dtype_names[k].name) == 0) {
            e->dtype = dtype_names[k].dtype;
            known = true;
        }
    if (!known)
        return fl_fail(FL_ERR_IO, "%s: tensor '%s': dtype %s is not supported", path, name, dn);
    size_t nd = json_array_size(sh);
    if (nd > FL_MAX_DIMS)
        return fl_fail(FL_ERR_IO, "%s: tensor '%s': %zu dims, at most %d supported", path, name, nd,
                       FL_MAX_DIMS);
    e->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *x = json_array_get(sh, d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return fl_fail(FL_ERR_IO, "%s: tensor '%s': shape entry %zu is not a non-negative "
                                      "integer", path, name, d);
        e->shape[d] = json_integer_value(x);
    }
    /* The core's shape rule (strides and byte sizes fit 64 bits, also with
     * a zero-size dim): what passes here is a valid tensor shape. */
    int64_t numel;
    if (fl_check_shape("safetensors", e->ndim, e->shape, &numel) != FL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s: tensor '%s': %s", path, name, fl_last_error());
        return fl_fail(FL_ERR_IO, "%s", msg);
    }
    uint64_t bytes = (uint64_t)numel * fl_dtype_size(e->dtype);
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return fl_fail(FL_ERR_IO, "%s: tensor '%s': data_offsets must be integers 0 <= begin <= end",
                       path, name);
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(en);
    if (e->end > f->data_size)
        return fl_fail(FL_ERR_IO, "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of "
                                  "the data (%llu bytes; file truncated?)", path, name,
                       (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)f->data_size);
    if (e->end - e->begin != bytes)
        return fl_fail(FL_ERR_IO, "%s: tensor '%s': %llu bytes of data for %s of %llu bytes", path,
                       name, (unsigned long long)(e->end - e->begin), dn,
                       (unsigned long long)bytes);
    e->name = strdup(name);
    if (!e->name) return fl_fail(FL_ERR_OOM, "%s: out of memory", path);
    return FL_OK;
}

static int by_offset(const void *a, const void *b) {
    const entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_header(fl_safetensors *f, const char *text, size_t len) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return fl_fail(FL_ERR_IO, "%s: header is not valid JSON (line %d: %s)", f->path, jerr.line,
                       jerr.text);
    int rc = FL_OK;
    if (!json_is_object(root)) {
        rc = fl_fail(FL_ERR_IO, "%s: header is not a JSON object", f->path);
        goto done;
    }
    size_t count = json_object_size(root);
    f->entries = calloc(count ? count : 1, sizeof *f->entries);
    if (!f->entries) {
        rc = fl_fail(FL_ERR_OOM, "%s: out of memory for %zu entries", f->path, count);
        goto done;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(value)) {
                rc = fl_fail(FL_ERR_IO, "%s: __metadata__ is not an object", f->path);
                goto done;
            }
            size_t m = json_object_size(value);
            f->meta_keys = calloc(m ? m : 1, sizeof(char *));
            f->meta_values = calloc(m ? m : 1, sizeof(char *));
            if (!f->meta_keys || !f->meta_values) {
                rc = fl_fail(FL_ERR_OOM, "%s: out of memory", f->path);
                goto done;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(value, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = fl_fail(FL_ERR_IO, "%s: __metadata__ value of '%s' is not a string",
                                 f->path, mk);
                    goto done;
                }
                f->meta_keys[f->n_meta] = strdup(mk);
                f->meta_values[f->n_meta] = strdup(json_string_value(mv));
                if (!f->meta_keys[f->n_meta] || !f->meta_values[f->n_meta]) {
                    free(f->meta_keys[f->n_meta]);
                    free(f->meta_values[f->n_meta]);
                    rc = fl_fail(FL_ERR_OOM, "%s: out of memory", f->path);
                    goto done;
                }
                if (index_add(&f->by_meta_key, f->meta_keys[f->n_meta], f->n_meta) != FL_OK) {
                    f->n_meta++;
                    rc = fl_fail(FL_ERR_OOM, "%s: out of memory", f->path);
                    goto done;
                }
                f->n_meta++;
            }
            continue;
        }
        rc = parse_entry(f, key, value, &f->entries[f->n]);
        if (rc != FL_OK) goto done;
        f->n++;
    }
    /* Data order; overlapping tensors would alias each other's bytes. */
    qsort(f->entries, (size_t)f->n, sizeof *f->entries, by_offset);
    int last = -1; /* the non-empty entry reaching furthest so far */
    for (int i = 0; i < f->n; i++) {
        const entry *e = &f->entries[i];
        if (e->end == e->begin) continue;
        if (last >= 0 && e->begin < f->entries[last].end) {
            rc = fl_fail(FL_ERR_IO, "%s: tensors '%s' and '%s' overlap in the data", f->path,
                         f->entries[last].name, e->name);
            goto done;
        }
        if (last < 0 || e->end > f->entries[last].end) last = i;
    }
    /* Names are unique (JSON_REJECT_DUPLICATES): index them in data order. */
    for (int i = 0; i < f->n; i++)
        if (index_add(&f->by_name, f->entries[i].name, i) != FL_OK) {
            rc = fl_fail(FL_ERR_OOM, "%s: out of memory for the name index", f->path);
            goto done;
        }
done:
    json_decref(root);
    return rc;
}

fl_safetensors *fl_safetensors_open(const char *path) {
    if (!path) return FL_FAIL_NULL(FL_ERR_ARG, "safetensors: path is NULL");
    fl_safetensors *f = calloc(1, sizeof *f);
    if (!f) return FL_FAIL_NULL(FL_ERR_OOM, "safetensors: out of memory");
    f->refcount = 1;
    f->path = strdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fl_fail(FL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
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
    const unsigned char *p = f->map;
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = n << 8 | p[k]; /* little-endian on any host */
    if (n > MAX_HEADER || n > f->size - 8) {
        fl_fail(FL_ERR_IO, "%s: header length %llu does not fit the file of %zu bytes "
                           "(truncated or not safetensors)", path, (unsigned long long)n, f->size);
        goto fail;
    }
    f->data = (const char *)f->map + 8 + n;
    f->data_size = f->size - 8 - n;
    if (parse_header(f, (const char *)f->map + 8, (size_t)n) != FL_OK) goto fail;
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
};

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
    free(w->path);
    free(w->tmp_path);
    free(w);
}
