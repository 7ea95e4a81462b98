/*
 * reader.c: documents out of the files people download (fl_reader).
 *
 * One file at a time, streamed in constant memory (a window of the
 * decompressed bytes of at most max_doc_bytes plus one read), never read
 * whole. The name says the format:
 *   .txt              a document per paragraph (lines up to a blank line),
 *                     as tools/tokenize.lua's default --documents=paragraph;
 *   .jsonl / .json    a JSON object per line, the document its text_field
 *                     (C4's shards are JSON lines named .json.gz), or with
 *                     whole_record the line itself, checked to be an object
 *                     (chat records: the caller reads their fields);
 *   + .gz / .zst      compressed with gzip (zlib, several members allowed)
 *                     or zstd (libzstd, several frames allowed).
 * A document's position is the uncompressed byte offset of its first line,
 * its index in the file (0-based, blank lines not counted) and its line
 * number (1-based); fl_reader_seek returns to a position read before, which
 * is how a resumed run continues inside a file (a compressed file is
 * decompressed again up to the offset: gzip and zstd cannot seek).
 *
 * A position also carries the fingerprint of what was read to reach it:
 * XXH3-64 of the bytes before the document and of those through the
 * document's last line ([Note: the fingerprint of a data position] in
 * lua/fsdp/data/corpus.lua). The reader hashes every byte it takes from
 * its window as it goes, so a position costs one digest, and a checked
 * seek refuses a file whose bytes up to the position are not the ones
 * read then, naming the file.
 *
 * Every problem is an error naming the file and where: a corrupt or
 * truncated compressed stream (the compressed byte offset), a JSON line that
 * does not parse, is not an object, lacks the field or holds no string there
 * (line and byte offset), invalid UTF-8 (the byte offset of the bad byte),
 * and a document longer than max_doc_bytes (its line and the limit).
 */
#include "data.h"
#include "files.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <yajl/yajl_tree.h>
#include <zlib.h>
#include <zstd.h>

enum { READ_CHUNK = 1 << 16 };

typedef enum { COMP_NONE, COMP_GZIP, COMP_ZSTD } compression;

struct fl_reader {
    char *path;
    char *field;
    bool whole; /* fl_reader_opts.whole_record */
    int64_t max_doc;
    bool json;
    compression comp;
    FILE *f;
    /* compressed input */
    unsigned char *in;
    size_t in_len, in_pos;
    int64_t in_consumed; /* compressed bytes handed to the decoder */
    bool in_eof;
    bool stream_end; /* the decoder ended a member/frame with no input after */
    z_stream z;
    bool z_live;
    ZSTD_DStream *zs;
    /* decompressed window: bytes [0, len) start at uncompressed base */
    char *buf;
    size_t cap, len, pos;
    int64_t base;
    bool eof;
    int64_t line; /* number of the line at pos */
    /* the last document */
    char *doc;
    size_t doc_cap, doc_len;
    int64_t doc_offset, doc_line, doc_index, next_index;
    /* documents the caller wants (fl_reader_filter), NULL: all */
    bool (*want)(void *arg, int64_t index);
    void *want_arg;
    /* the fingerprint: bytes [0, base + hpos) are hashed; the line before
     * pos had its newline (at pos - 1) replaced by the NUL a caller reads */
    XXH3_state_t *hash;
    size_t hpos;
    bool nl_cut;
    uint64_t doc_before, doc_through;
    /* after a checked seek: the document there must hash to this */
    bool expect;
    uint64_t expect_through;
    int64_t expect_line;
    /* fl_reader_again: the next call gives the last document once more */
    bool again;
};

/* ---- names ------------------------------------------------------------- */

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

int fl_reader_format(const char *path, bool *json, int *comp)
{
    size_t n = strlen(path);
    int c = COMP_NONE;
    if (ends_with(path, n, ".gz")) { c = COMP_GZIP; n -= 3; }
    else if (ends_with(path, n, ".zst")) { c = COMP_ZSTD; n -= 4; }
    if (ends_with(path, n, ".jsonl") || ends_with(path, n, ".json")) *json = true;
    else if (ends_with(path, n, ".txt")) *json = false;
    else return -1;
    *comp = c;
    return 0;
}

/* ---- decompression ------------------------------------------------------ */

static int fill_input(fl_reader *r)
{
    if (r->in_pos < r->in_len || r->in_eof) return 0;
    r->in_len = fread(r->in, 1, READ_CHUNK, r->f);
    r->in_pos = 0;
    if (r->in_len < READ_CHUNK) {
        if (ferror(r->f))
            return fl_fail(FL_ERR_IO, "%s: read error at compressed byte %lld: %s", r->path,
                           (long long)r->in_consumed, strerror(errno));
        r->in_eof = true;
    }
    return 0;
}

/* Up to cap decompressed bytes into dst; *got 0 at the end of the file.
 * At the end of the input the decoder is called once more with nothing, to
 * flush what it still holds; it must then have ended its stream, or the
 * file is truncated. */
static int source_read(fl_reader *r, char *dst, size_t cap, size_t *got)
{
    *got = 0;
    if (r->comp == COMP_NONE) {
        *got = fread(dst, 1, cap, r->f);
        if (*got < cap && ferror(r->f))
            return fl_fail(FL_ERR_IO, "%s: read error near byte %lld: %s", r->path,
                           (long long)(r->base + (int64_t)r->len), strerror(errno));
        return 0;
    }
    while (*got == 0) {
        if (fill_input(r)) return -1;
        size_t avail = r->in_len - r->in_pos;
        if (avail == 0 && r->stream_end) return 0; /* the end, cleanly */
        size_t used;
        if (r->comp == COMP_GZIP) {
            if (r->stream_end) { inflateReset(&r->z); r->stream_end = false; } /* the next member */
            r->z.next_in = r->in + r->in_pos;
            r->z.avail_in = (uInt)avail;
            r->z.next_out = (Bytef *)dst;
            r->z.avail_out = (uInt)cap;
            int rc = inflate(&r->z, Z_NO_FLUSH);
            used = avail - r->z.avail_in;
            if (rc != Z_OK && rc != Z_STREAM_END && !(rc == Z_BUF_ERROR && avail == 0))
                return fl_fail(FL_ERR_IO, "%s: corrupt gzip data at compressed byte %lld: %s", r->path,
                               (long long)(r->in_consumed + (int64_t)used),
                               r->z.msg ? r->z.msg : zError(rc));
            *got = cap - r->z.avail_out;
            if (rc == Z_STREAM_END) r->stream_end = true;
        } else {
            ZSTD_inBuffer ib = { r->in + r->in_pos, avail, 0 };
            ZSTD_outBuffer ob = { dst, cap, 0 };
            size_t rc = ZSTD_decompressStream(r->zs, &ob, &ib);
            if (ZSTD_isError(rc))
                return fl_fail(FL_ERR_IO, "%s: corrupt zstd data at compressed byte %lld: %s", r->path,
                               (long long)(r->in_consumed + (int64_t)ib.pos), ZSTD_getErrorName(rc));
            used = ib.pos;
            *got = ob.pos;
            r->stream_end = (rc == 0);
        }
        r->in_pos += used;
        r->in_consumed += (int64_t)used;
        if (avail == 0 && *got == 0)
            return fl_fail(FL_ERR_IO, "%s: truncated %s stream: the file ends at compressed byte %lld "
                           "inside a compressed block (an interrupted download?)", r->path,
                           r->comp == COMP_GZIP ? "gzip" : "zstd", (long long)r->in_consumed);
    }
    return 0;
}

/* Start the file again from its first byte. */
static int source_rewind(fl_reader *r)
{
    if (fseek(r->f, 0, SEEK_SET) != 0)
        return fl_fail(FL_ERR_IO, "%s: cannot seek: %s", r->path, strerror(errno));
    r->in_len = r->in_pos = 0;
    r->in_consumed = 0;
    r->in_eof = false;
    r->stream_end = false;
    if (r->comp == COMP_GZIP) inflateReset(&r->z);
    if (r->comp == COMP_ZSTD) ZSTD_initDStream(r->zs);
    r->len = r->pos = 0;
    r->base = 0;
    r->eof = false;
    r->hpos = 0;
    r->nl_cut = false;
    r->expect = r->again = false;
    XXH3_64bits_reset(r->hash);
    return 0;
}

/* ---- open / free ------------------------------------------------------- */

fl_reader *fl_reader_open(const char *path, const fl_reader_opts *opts)
{
    bool json = false;
    int comp = COMP_NONE;
    if (!path) return FL_FAIL_NULL(FL_ERR_ARG, "fl_reader_open: no path");
    if (fl_reader_format(path, &json, &comp))
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: unknown corpus format (readers know .txt, .jsonl, .json, each "
                            "optionally .gz or .zst)", path);
    int64_t max_doc = opts && opts->max_doc_bytes > 0 ? opts->max_doc_bytes : FL_READER_MAX_DOC_DEFAULT;
    const char *field = opts && opts->text_field && opts->text_field[0] ? opts->text_field : "text";
    int fd = fl_open_regular(path, NULL); /* a FIFO in a corpus would block a worker for good */
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        return FL_FAIL_NULL(FL_ERR_IO, "%s: cannot open: %s", path, strerror(err));
    }
    fl_reader *r = calloc(1, sizeof *r);
    if (!r) { fclose(f); return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory", path); }
    r->f = f;
    r->json = json;
    r->whole = opts && opts->whole_record;
    r->comp = (compression)comp;
    r->max_doc = max_doc;
    r->path = strdup(path);
    r->field = strdup(field);
    r->cap = (size_t)max_doc + READ_CHUNK + 1;
    r->buf = malloc(r->cap);
    r->in = comp != COMP_NONE ? malloc(READ_CHUNK) : NULL;
    r->line = 1;
    r->hash = XXH3_createState();
    if (r->hash) XXH3_64bits_reset(r->hash);
    if (!r->path || !r->field || !r->buf || !r->hash || (comp != COMP_NONE && !r->in)) {
        fl_reader_free(r);
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory for a %lld-byte window", path, (long long)r->cap);
    }
    if (comp == COMP_GZIP) {
        if (inflateInit2(&r->z, 15 + 32) != Z_OK) { /* 15 + 32: gzip or zlib header */
            fl_reader_free(r);
            return FL_FAIL_NULL(FL_ERR_OOM, "%s: cannot start zlib", path);
        }
        r->z_live = true;
    } else if (comp == COMP_ZSTD) {
        r->zs = ZSTD_createDStream();
        if (!r->zs || ZSTD_isError(ZSTD_initDStream(r->zs))) {
            fl_reader_free(r);
            return FL_FAIL_NULL(FL_ERR_OOM, "%s: cannot start zstd", path);
        }
    }
    return r;
}

void fl_reader_free(fl_reader *r)
{
    if (!r) return;
    if (r->f) fclose(r->f);
    if (r->z_live) inflateEnd(&r->z);
    if (r->zs) ZSTD_freeDStream(r->zs);
    free(r->in);
    free(r->buf);
    free(r->doc);
    free(r->path);
    free(r->field);
    XXH3_freeState(r->hash);
    free(r);
}

const char *fl_reader_path(const fl_reader *r) { return r->path; }

/* ---- lines -------------------------------------------------------------- */

/* Hash the bytes of the lines taken since the last call (the window from
 * hpos to pos), with the newline a NUL replaced put back. Lines are hashed
 * when the next one is asked for, not when taken, so the hash at the start
 * of a document is that of the bytes before it without a digest per line. */
static void hash_taken(fl_reader *r)
{
    if (r->pos > r->hpos) {
        if (r->nl_cut) r->buf[r->pos - 1] = '\n';
        XXH3_64bits_update(r->hash, r->buf + r->hpos, r->pos - r->hpos);
    }
    r->hpos = r->pos;
    r->nl_cut = false;
}

/* The next line as [*s, *s + *n) without its newline (NUL written after it,
 * valid until the next call); *off its uncompressed offset. 0 at the end. */
static int next_line(fl_reader *r, char **s, size_t *n, int64_t *off, int *status)
{
    *status = 0;
    hash_taken(r);
    size_t scan = r->pos;
    for (;;) {
        char *nl = memchr(r->buf + scan, '\n', r->len - scan);
        if (nl || (r->eof && r->len > r->pos)) {
            size_t end = nl ? (size_t)(nl - r->buf) : r->len;
            *s = r->buf + r->pos;
            *n = end - r->pos;
            *off = r->base + (int64_t)r->pos;
            if (*n > 0 && (*s)[*n - 1] == '\r') (*n)--;
            if (*n > (size_t)r->max_doc) goto too_long;
            r->buf[end] = '\0';
            r->pos = nl ? end + 1 : r->len;
            r->nl_cut = nl != NULL;
            r->line++;
            return 1;
        }
        if (r->eof) return 0;
        if (r->len - r->pos > (size_t)r->max_doc) { *off = r->base + (int64_t)r->pos; goto too_long; }
        /* compact, then read more */
        if (r->pos > 0) {
            memmove(r->buf, r->buf + r->pos, r->len - r->pos);
            r->base += (int64_t)r->pos;
            r->len -= r->pos;
            r->pos = r->hpos = 0; /* everything before pos was hashed on entry */
        }
        scan = r->len;
        size_t room = r->cap - 1 - r->len, got = 0;
        if (room > READ_CHUNK) room = READ_CHUNK;
        if (source_read(r, r->buf + r->len, room, &got)) { *status = -1; return 0; }
        if (got == 0) r->eof = true;
        r->len += got;
    }
too_long:
    *status = FL_FAIL_M1(FL_ERR_IO, "%s: line %lld (byte %lld) is longer than the reader's limit of %lld bytes "
                      "(max_doc_bytes; --max_doc_bytes in the recipes)", r->path, (long long)r->line,
                      (long long)*off, (long long)r->max_doc);
    return 0;
}

/* ---- documents ---------------------------------------------------------- */

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* Index of the first byte that is not valid UTF-8, or n. */
static size_t utf8_bad(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        unsigned min;
        if (c >= 0xC2 && c <= 0xDF) { k = 1; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; min = 0x10000; }
        else return i;
        unsigned cp = c & (0x3F >> k);
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += k + 1;
    }
    return n;
}

static int doc_append(fl_reader *r, const char *s, size_t n)
{
    if (r->doc_len + n + 1 > r->doc_cap) {
        size_t cap = r->doc_cap ? r->doc_cap : 4096;
        while (cap < r->doc_len + n + 1) cap *= 2;
        char *d = realloc(r->doc, cap);
        if (!d) return fl_fail(FL_ERR_OOM, "%s: out of memory for a %zu-byte document", r->path, cap);
        r->doc = d;
        r->doc_cap = cap;
    }
    memcpy(r->doc + r->doc_len, s, n);
    r->doc_len += n;
    r->doc[r->doc_len] = '\0';
    return 0;
}

/* The text field of one JSON line into r->doc. */
static int json_doc(fl_reader *r, const char *s, int64_t off, int64_t line)
{
    char err[256];
    err[0] = '\0';
    yajl_val v = yajl_tree_parse(s, err, sizeof err);
    if (!v) {
        char *nl = strchr(err, '\n');
        if (nl) *nl = '\0';
        return fl_fail(FL_ERR_IO, "%s: line %lld (byte %lld) is not valid JSON: %s", r->path, (long long)line,
                       (long long)off, err[0] ? err : "parse error");
    }
    int rc = 0;
    if (!YAJL_IS_OBJECT(v) && r->whole) {
        rc = fl_fail(FL_ERR_IO, "%s: line %lld (byte %lld) is not a JSON object (each line must be one record)",
                     r->path, (long long)line, (long long)off);
    } else if (!YAJL_IS_OBJECT(v)) {
        rc = fl_fail(FL_ERR_IO, "%s: line %lld (byte %lld) is not a JSON object (each line must be an object "
                     "with a \"%s\" field)", r->path, (long long)line, (long long)off, r->field);
    } else if (r->whole) {
        r->doc_len = 0;
        rc = doc_append(r, s, strlen(s));
    } else {
        yajl_val t = NULL;
        for (size_t i = 0; i < v->u.object.len; i++)
            if (strcmp(v->u.object.keys[i], r->field) == 0) t = v->u.object.values[i];
        if (!t)
            rc = fl_fail(FL_ERR_IO, "%s: line %lld (byte %lld) has no \"%s\" field (the text field; "
                         "--text_field names another)", r->path, (long long)line, (long long)off, r->field);
        else if (!YAJL_IS_STRING(t))
            rc = fl_fail(FL_ERR_IO, "%s: line %lld (byte %lld): field \"%s\" is not a string", r->path,
                         (long long)line, (long long)off, r->field);
        else {
            r->doc_len = 0;
            rc = doc_append(r, t->u.string, strlen(t->u.string));
        }
    }
    yajl_tree_free(v);
    return rc;
}

/* Blank lines between documents are skipped, but not without end: a run of
 * them longer than the document limit (a compressed file of nothing but
 * newlines expands to gigabytes) is refused as a document would be, so the
 * reader never reads on for minutes without a document or a word. */
static int blank_run(fl_reader *r, int64_t *run, int64_t *from_line, int64_t *from_off, int64_t line,
                     int64_t off, size_t n)
{
    if (*run == 0) *from_line = line, *from_off = off;
    *run += (int64_t)n + 1;
    if (*run <= r->max_doc) return 0;
    return FL_FAIL_M1(FL_ERR_IO, "%s: more than %lld bytes of blank lines from line %lld (byte %lld) without a "
                   "document, past the reader's limit of %lld bytes (max_doc_bytes; --max_doc_bytes in the recipes)",
                   r->path, (long long)r->max_doc, (long long)*from_line, (long long)*from_off,
                   (long long)r->max_doc);
}

static int read_doc(fl_reader *r, const char **text, size_t *len)
{
    char *s;
    size_t n;
    int64_t off;
    int st;
    int64_t run = 0, run_line = 0, run_off = 0;
    r->doc_len = 0;
    if (r->json) {
        for (;;) {
            int64_t line = r->line;
            if (!next_line(r, &s, &n, &off, &st)) return st;
            if (blank(s, n)) {
                if (blank_run(r, &run, &run_line, &run_off, line, off, n)) return -1;
                continue;
            }
            run = 0;
            /* a line the caller does not want is counted, not parsed */
            if (r->want && !r->want(r->want_arg, r->next_index)) {
                r->next_index++;
                continue;
            }
            /* yajl checks strings; the bytes outside them are checked here so
             * every invalid byte is reported with its offset, not as a parse error */
            size_t bad = utf8_bad((const unsigned char *)s, n);
            if (bad < n)
                return FL_FAIL_M1(FL_ERR_IO, "%s: line %lld: invalid UTF-8 at byte %lld", r->path, (long long)line,
                               (long long)(off + (int64_t)bad));
            if (json_doc(r, s, off, line)) return -1;
            r->doc_offset = off;
            r->doc_line = line;
            r->doc_before = XXH3_64bits_digest(r->hash); /* the lines before this one */
            break;
        }
    } else {
        bool started = false;
        for (;;) {
            int64_t line = r->line;
            if (!next_line(r, &s, &n, &off, &st)) {
                if (st) return st;
                if (!started) return 0;
                break;
            }
            if (blank(s, n)) {
                if (started) break;
                if (blank_run(r, &run, &run_line, &run_off, line, off, n)) return -1;
                continue;
            }
            size_t bad = utf8_bad((const unsigned char *)s, n);
            if (bad < n)
                return FL_FAIL_M1(FL_ERR_IO, "%s: line %lld: invalid UTF-8 at byte %lld", r->path, (long long)line,
                               (long long)(off + (int64_t)bad));
            if (!started) {
                started = true;
                r->doc_offset = off;
                r->doc_line = line;
                r->doc_before = XXH3_64bits_digest(r->hash);
            } else if (doc_append(r, "\n", 1)) {
                return -1;
            }
            if (r->doc_len + n > (size_t)r->max_doc)
                return FL_FAIL_M1(FL_ERR_IO, "%s: the paragraph from line %lld (byte %lld) is longer than the "
                               "reader's limit of %lld bytes (max_doc_bytes; --max_doc_bytes in the recipes)",
                               r->path, (long long)r->doc_line, (long long)r->doc_offset, (long long)r->max_doc);
            if (doc_append(r, s, n)) return -1;
        }
    }
    hash_taken(r); /* the document's lines (and a paragraph's closing blank line) */
    r->doc_through = XXH3_64bits_digest(r->hash);
    r->doc_index = r->next_index++;
    *text = r->doc ? r->doc : "";
    *len = r->doc_len;
    return 1;
}

int fl_reader_next(fl_reader *r, const char **text, size_t *len)
{
    if (r->again) {
        r->again = false;
        *text = r->doc ? r->doc : "";
        *len = r->doc_len;
        return 1;
    }
    int rc = read_doc(r, text, len);
    if (!r->expect) return rc;
    /* The first document after a checked seek: the one the position was at.
     * The bytes before it were checked by the seek; a failure to read it now
     * means it changed, which is what the message must say (not blame a
     * line that is valid as written). */
    r->expect = false;
    if (rc < 0) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", fl_last_error());
        return FL_FAIL_M1(FL_ERR_IO, "%s: the document at the saved position (line %lld) is not the one read "
                          "then: the file changed since the position was saved (reading it now: %s)", r->path,
                          (long long)r->expect_line, msg);
    }
    if (rc == 0)
        return FL_FAIL_M1(FL_ERR_IO, "%s: the file now ends before the document at the saved position (line %lld): "
                          "it was truncated or changed since the position was saved", r->path,
                          (long long)r->expect_line);
    if (r->doc_through != r->expect_through)
        return FL_FAIL_M1(FL_ERR_IO, "%s: the document at the saved position (line %lld, byte %lld) is not the one "
                          "read then: the file changed in place since the position was saved", r->path,
                          (long long)r->doc_line, (long long)r->doc_offset);
    return 1;
}

void fl_reader_again(fl_reader *r) { r->again = true; }

void fl_reader_filter(fl_reader *r, bool (*want)(void *arg, int64_t index), void *arg)
{
    r->want = want;
    r->want_arg = arg;
}

void fl_reader_position(const fl_reader *r, fl_doc_position *p)
{
    p->offset = r->doc_offset;
    p->index = r->doc_index;
    p->line = r->doc_line;
    p->before = r->doc_before;
    p->through = r->doc_through;
}

int fl_reader_seek(fl_reader *r, const fl_doc_position *p, bool check)
{
    if (p->offset < 0 || p->index < 0 || p->line < 1)
        return fl_fail(FL_ERR_ARG, "%s: seek to a bad position (byte %lld, document %lld, line %lld)", r->path,
                       (long long)p->offset, (long long)p->index, (long long)p->line);
    if (source_rewind(r)) return -1;
    /* Read (decompress) and hash the bytes before the offset, also of a
     * plain file that could seek: the hash must cover them for the
     * positions of the documents after this one, and a check needs them. */
    int64_t left = p->offset;
    char last = '\n';
    bool broken = false;
    while (left > 0) {
        size_t got = 0, want = left < (int64_t)(r->cap - 1) ? (size_t)left : r->cap - 1;
        if (source_read(r, r->buf, want, &got)) {
            broken = true; /* a compressed stream cut or damaged before the offset */
            break;
        }
        if (got == 0) break;
        XXH3_64bits_update(r->hash, r->buf, got);
        last = r->buf[got - 1];
        left -= (int64_t)got;
    }
    r->base = p->offset - left;
    r->line = p->line;
    r->next_index = p->index;
    if (check) {
        if (broken) {
            char msg[768];
            snprintf(msg, sizeof msg, "%s", fl_last_error());
            return fl_fail(FL_ERR_IO, "%s: cannot be read up to the saved position (byte %lld, line %lld): it changed "
                           "since the position was saved (%s)", r->path, (long long)p->offset, (long long)p->line,
                           msg);
        }
        if (left > 0)
            return fl_fail(FL_ERR_IO, "%s: the file now holds %lld bytes%s, the saved position is at byte %lld (line "
                           "%lld): it was truncated or replaced since the position was saved", r->path,
                           (long long)(p->offset - left), r->comp != COMP_NONE ? " decompressed" : "",
                           (long long)p->offset, (long long)p->line);
        if (XXH3_64bits_digest(r->hash) != p->before)
            return fl_fail(FL_ERR_IO, "%s: the %lld bytes before the saved position (line %lld) are not the ones "
                           "read then: the file changed in place since the position was saved", r->path,
                           (long long)p->offset, (long long)p->line);
        r->expect = true;
        r->expect_through = p->through;
        r->expect_line = p->line;
        return 0;
    }
    /* Unchecked (the data changed and the caller goes on, or an old
     * position): a file that ends (or breaks off) before the offset is read
     * to its end; an offset inside a line continues at the next line, never
     * half a line. */
    if (left > 0 || broken) {
        r->eof = true;
        return 0;
    }
    if (last != '\n') {
        char *s;
        size_t n;
        int64_t off;
        int st;
        if (!next_line(r, &s, &n, &off, &st) && st) return -1;
    }
    return 0;
}
