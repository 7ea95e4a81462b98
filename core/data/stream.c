/*
 * stream.c: the streaming token loader (fl_stream): raw corpus files read,
 * tokenized and packed into training rows, with the reading and the
 * tokenizing done ahead in worker threads.
 *
 * The rank's files form an endless sequence of positions p = 0, 1, ...:
 * epoch e = p / files_per_epoch, and the k-th file of an epoch is taken from
 * a permutation of all files drawn from (seed, e) (name order without
 * shuffle). With at least world_size files a rank owns whole files (the
 * epoch order's files k * world_size + rank); with fewer, every rank reads
 * every file and keeps the documents whose index in the file is rank mod
 * world_size. Either way the parts are disjoint and every document is read.
 *
 * [Note: stream order does not depend on threads] Worker threads claim
 * file positions in order, each its own file, and queue that file's
 * documents, already tokenized, in the file's slot (at most ahead_tokens
 * queued per file; at most `threads` + 1 files in flight). The consumer
 * (fl_stream_next, the training loop's thread) takes the documents of
 * position p, in file order, before any of p + 1, so the rows are the same
 * for 1 or 8 threads; only how far ahead the work runs changes. An error a
 * worker meets (corrupt file, bad JSON line, a tokenizer failure) waits in
 * its slot and is raised when the consumer reaches that point of the
 * stream, as if it had been read there.
 *
 * Packing: each document's ids then eos, back to back; a row is seq_len + 1
 * tokens (ids its first seq_len, targets its last), and the next row starts
 * with the last token of the row before (the `carry`), as fsdp.data.tokens
 * packs shards, so every token is a target once.
 *
 * The state (fl_stream_state) is the position of the document being
 * consumed, how many of its tokens are already in rows, and the carry;
 * set_state seeks that file to that document (fl_reader_seek), skips the
 * consumed tokens (tokenizers are deterministic) and restores the carry, so
 * a resumed run continues with exactly the next row. A checked set_state
 * reads the file up to the position and the document there in the
 * caller's thread, so changed data is refused before training goes on (and
 * before the caller loads anything more), and hands that reader, already
 * there, to the worker that takes the position: the prefix is read once.
 */
#include "data.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

typedef struct doc_item {
    struct doc_item *next;
    fl_doc_position pos;
    int64_t n; /* ids, eos not included */
    int32_t ids[];
} doc_item;

typedef struct slot {
    int64_t file; /* the position it holds, -1 when free */
    doc_item *head, *tail;
    int64_t queued; /* tokens queued (eos counted) */
    bool done, failed;
    char error[1024];
} slot;

typedef struct worker {
    fl_stream *s;
    void *tok;
    pthread_t thread;
} worker;

struct fl_stream {
    fl_stream_opts o;
    char *path, *field;
    fl_file_list *files;
    int64_t nfiles, per_epoch;
    bool by_file;
    int nthreads;
    worker *workers;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_data;
    slot *slots;
    int nslots;
    int64_t next_file; /* next position a worker claims */
    int64_t cur_file;  /* the position the consumer reads */
    bool stop;
    fl_stream_state start; /* where the workers begin (set_state) */
    fl_reader *ready;      /* a checked set_state's reader, at start's document */
    bool lenient;          /* set_state without check: go on past what changed */
    /* the consumer */
    doc_item *cur;
    fl_stream_state st;
    int64_t skip; /* tokens of the first document already consumed (after set_state) */
    bool epoch_whole;
    int64_t epoch_tokens, docs, tokens;
};

/* ---- file order --------------------------------------------------------- */

static uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The index in the sorted file list of the rank's file at position p. */
static int64_t file_at(const fl_stream *s, int64_t p)
{
    int64_t e = p / s->per_epoch, k = p % s->per_epoch;
    int64_t g = s->by_file ? k * s->o.world_size + s->o.rank : k;
    if (!s->o.shuffle) return g;
    /* Fisher-Yates from the back, stopping once position g is drawn */
    int64_t n = s->nfiles;
    int64_t *perm = malloc((size_t)n * sizeof *perm);
    FL_ASSERT(perm);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    uint64_t key = splitmix(s->o.seed ^ splitmix((uint64_t)e + 0x5EED));
    for (int64_t i = n - 1; i >= g && i > 0; i--) {
        int64_t j = (int64_t)(splitmix(key + (uint64_t)i) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t r = perm[g];
    free(perm);
    return r;
}

const char *fl_stream_file_path(const fl_stream *s, int64_t file)
{
    if (file < 0) return NULL;
    return fl_file_list_path(s->files, file_at(s, file));
}

int64_t fl_stream_files_per_epoch(const fl_stream *s) { return s->per_epoch; }
int64_t fl_stream_documents(const fl_stream *s) { return s->docs; }
int64_t fl_stream_tokens(const fl_stream *s) { return s->tokens; }

/* ---- workers ------------------------------------------------------------ */

static bool wanted(const fl_stream *s, int64_t k)
{
    double f = s->o.val_fraction;
    bool held = f > 0 && floor((double)(k + 1) * f) > floor((double)k * f);
    if (s->o.split == FL_SPLIT_TRAIN && held) return false;
    if (s->o.split == FL_SPLIT_VAL && !held) return false;
    return s->by_file || k % s->o.world_size == s->o.rank;
}

static bool want_doc(void *arg, int64_t k) { return wanted(arg, k); }

static void slot_fail(fl_stream *s, slot *sl)
{
    pthread_mutex_lock(&s->mu);
    snprintf(sl->error, sizeof sl->error, "%s", fl_last_error());
    sl->failed = true;
    pthread_mutex_unlock(&s->mu);
}

/* Read, tokenize and queue the documents of position p. */
static void read_file(fl_stream *s, void *tok, int64_t p, slot *sl)
{
    const char *path = fl_stream_file_path(s, p);
    fl_reader *r = NULL;
    if (p == s->start.file && s->ready) { /* only the worker claiming p gets here */
        r = s->ready;
        s->ready = NULL;
    } else {
        r = fl_reader_open(path, &s->o.reader);
        if (!r) { slot_fail(s, sl); return; }
        fl_reader_filter(r, want_doc, s);
        if (p == s->start.file && fl_reader_seek(r, &s->start.doc, false)) goto fail;
    }
    for (;;) {
        const char *text;
        size_t len;
        int rc = fl_reader_next(r, &text, &len);
        if (rc < 0) goto fail;
        if (rc == 0) break;
        fl_doc_position pos;
        fl_reader_position(r, &pos);
        if (!wanted(s, pos.index)) continue;
        const int32_t *ids;
        int64_t n = s->o.tokenizer.encode(tok, text, len, &ids);
        if (n < 0) {
            char msg[768];
            snprintf(msg, sizeof msg, "%s", fl_last_error());
            fl_fail(FL_ERR_IO, "%s: line %lld: the tokenizer failed: %s", path, (long long)pos.line, msg);
            goto fail;
        }
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= s->o.vocab_size) {
                fl_fail(FL_ERR_ARG, "%s: line %lld: the tokenizer gave id %d, outside the model's vocabulary of "
                        "%lld", path, (long long)pos.line, ids[i], (long long)s->o.vocab_size);
                goto fail;
            }
        doc_item *d = malloc(sizeof *d + (size_t)n * sizeof(int32_t));
        if (!d) {
            fl_fail(FL_ERR_OOM, "%s: line %lld: out of memory for %lld tokens", path, (long long)pos.line,
                    (long long)n);
            goto fail;
        }
        d->next = NULL;
        d->pos = pos;
        d->n = n;
        if (n) memcpy(d->ids, ids, (size_t)n * sizeof(int32_t));
        pthread_mutex_lock(&s->mu);
        while (!s->stop && sl->head && sl->queued >= s->o.ahead_tokens) pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            free(d);
            break;
        }
        if (sl->tail) sl->tail->next = d;
        else sl->head = d;
        sl->tail = d;
        sl->queued += n + 1;
        pthread_cond_broadcast(&s->cv_data);
        pthread_mutex_unlock(&s->mu);
    }
    fl_reader_free(r);
    return;
fail:
    fl_reader_free(r);
    slot_fail(s, sl);
}

static bool claimable(const fl_stream *s)
{
    return s->next_file < s->cur_file + s->nslots && (!s->o.once || s->next_file < s->per_epoch);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    fl_stream *s = w->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && !claimable(s)) pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->stop) break;
        int64_t p = s->next_file++;
        slot *sl = &s->slots[p % s->nslots];
        FL_ASSERT(sl->file == -1 && !sl->head);
        sl->file = p;
        sl->queued = 0;
        sl->done = sl->failed = false;
        pthread_mutex_unlock(&s->mu);
        read_file(s, w->tok, p, sl);
        pthread_mutex_lock(&s->mu);
        sl->done = true;
        pthread_cond_broadcast(&s->cv_data);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int start_workers(fl_stream *s)
{
    s->stop = false;
    for (int i = 0; i < s->nthreads; i++) {
        if (pthread_create(&s->workers[i].thread, NULL, worker_main, &s->workers[i]) != 0) {
            pthread_mutex_lock(&s->mu);
            s->stop = true;
            pthread_cond_broadcast(&s->cv_work);
            pthread_mutex_unlock(&s->mu);
            for (int j = 0; j < i; j++) pthread_join(s->workers[j].thread, NULL);
            return fl_fail(FL_ERR_STATE, "%s: cannot start the loader's worker thread %d", s->path, i);
        }
    }
    s->running = true;
    return 0;
}

static void stop_workers(fl_stream *s)
{
    if (!s->running) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++) pthread_join(s->workers[i].thread, NULL);
    s->running = false;
}

static void clear_slots(fl_stream *s)
{
    for (int i = 0; i < s->nslots; i++) {
        slot *sl = &s->slots[i];
        for (doc_item *d = sl->head, *nx; d; d = nx) {
            nx = d->next;
            free(d);
        }
        memset(sl, 0, sizeof *sl);
        sl->file = -1;
    }
    free(s->cur);
    s->cur = NULL;
    fl_reader_free(s->ready);
    s->ready = NULL;
}

/* ---- open / free ------------------------------------------------------- */

fl_stream *fl_stream_open(const fl_stream_opts *o)
{
    if (!o || !o->path) return FL_FAIL_NULL(FL_ERR_ARG, "fl_stream_open: no path");
    if (o->seq_len < 1 || o->vocab_size < 1 || o->eos_id < 0 || o->eos_id >= o->vocab_size || o->threads < 1 ||
        o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size || o->val_fraction < 0 ||
        o->val_fraction >= 1 || o->split < FL_SPLIT_ALL || o->split > FL_SPLIT_VAL)
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: stream options out of range (seq_len %lld, vocab %lld, eos %lld, "
                            "threads %d, rank %d of %d, val_fraction %g, split %d)", o->path,
                            (long long)o->seq_len, (long long)o->vocab_size, (long long)o->eos_id, o->threads,
                            o->rank, o->world_size, o->val_fraction, o->split);
    if (!o->tokenizer.open || !o->tokenizer.encode || !o->tokenizer.close)
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: the stream's tokenizer hook is incomplete", o->path);
    fl_file_list *files = fl_file_list_open(o->path);
    if (!files) return NULL;
    fl_stream *s = calloc(1, sizeof *s);
    if (!s) {
        fl_file_list_free(files);
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory", o->path);
    }
    s->o = *o;
    s->files = files;
    s->path = strdup(o->path);
    s->field = strdup(o->reader.text_field ? o->reader.text_field : "text");
    s->o.path = s->path;
    s->o.reader.text_field = s->field;
    if (s->o.ahead_tokens <= 0) s->o.ahead_tokens = 1 << 20;
    s->nfiles = fl_file_list_count(files);
    s->by_file = s->nfiles >= o->world_size;
    s->per_epoch = s->by_file ? (s->nfiles - o->rank + o->world_size - 1) / o->world_size : s->nfiles;
    s->nthreads = o->threads;
    s->nslots = o->threads + 1;
    s->workers = calloc((size_t)s->nthreads, sizeof *s->workers);
    s->slots = calloc((size_t)s->nslots, sizeof *s->slots);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_data, NULL);
    if (!s->path || !s->field || !s->workers || !s->slots) {
        fl_stream_free(s);
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory", o->path);
    }
    for (int i = 0; i < s->nthreads; i++) {
        s->workers[i].s = s;
        s->workers[i].tok = o->tokenizer.open(o->tokenizer.arg);
        if (!s->workers[i].tok) {
            char msg[768];
            snprintf(msg, sizeof msg, "%s", fl_last_error());
            fl_stream_free(s);
            return FL_FAIL_NULL(FL_ERR_ARG, "%s: cannot make the tokenizer: %s", o->path, msg);
        }
    }
    fl_stream_state zero = { 0, { 0, 0, 1, 0, 0 }, 0, -1 };
    clear_slots(s);
    fl_stream_set_state(s, &zero, false);
    return s;
}

void fl_stream_free(fl_stream *s)
{
    if (!s) return;
    stop_workers(s);
    if (s->slots) clear_slots(s);
    if (s->workers)
        for (int i = 0; i < s->nthreads; i++)
            if (s->workers[i].tok) s->o.tokenizer.close(s->workers[i].tok);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_data);
    free(s->workers);
    free(s->slots);
    fl_file_list_free(s->files);
    free(s->path);
    free(s->field);
    free(s);
}

/* ---- state -------------------------------------------------------------- */

void fl_stream_get_state(const fl_stream *s, fl_stream_state *st) { *st = s->st; }

/* Open the file of st and read it up to st's document and that document,
 * checked against st's fingerprint: the reader, ready to give that document
 * again, or NULL with the error naming the file. */
static fl_reader *checked_reader(fl_stream *s, const fl_stream_state *st)
{
    const char *path = fl_stream_file_path(s, st->file);
    fl_reader *r = fl_reader_open(path, &s->o.reader);
    if (!r) return NULL;
    fl_reader_filter(r, want_doc, s);
    const char *text;
    size_t len;
    if (fl_reader_seek(r, &st->doc, true) || fl_reader_next(r, &text, &len) != 1) {
        fl_reader_free(r);
        return NULL;
    }
    fl_reader_again(r);
    return r;
}

const fl_file_list *fl_stream_files(const fl_stream *s) { return s->files; }

int fl_stream_set_state(fl_stream *s, const fl_stream_state *st, bool check)
{
    if (st->file < 0 || st->doc.offset < 0 || st->doc.index < 0 || st->doc.line < 1 || st->consumed < 0 ||
        st->carry < -1 || st->carry >= s->o.vocab_size)
        return fl_fail(FL_ERR_ARG, "%s: not a stream position (file %lld, byte %lld, document %lld, line %lld, "
                       "%lld consumed, carry %lld)", s->path, (long long)st->file, (long long)st->doc.offset,
                       (long long)st->doc.index, (long long)st->doc.line, (long long)st->consumed,
                       (long long)st->carry);
    fl_reader *ready = NULL;
    if (check && !(ready = checked_reader(s, st))) return -1;
    stop_workers(s);
    clear_slots(s);
    s->ready = ready;
    s->lenient = !check;
    s->start = *st;
    s->st = *st;
    s->next_file = s->cur_file = st->file;
    s->skip = st->consumed;
    s->epoch_whole = st->file % s->per_epoch == 0 && st->doc.offset == 0 && st->consumed == 0;
    s->epoch_tokens = 0;
    return 0;
}

/* ---- the consumer ------------------------------------------------------- */

/* The next document into s->cur: 1, 0 at the end of a `once` stream, -1. */
static int next_doc(fl_stream *s)
{
    free(s->cur);
    s->cur = NULL;
    if (!s->running && start_workers(s)) return -1;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->o.once && s->cur_file >= s->per_epoch) {
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
        slot *sl = &s->slots[s->cur_file % s->nslots];
        while (sl->file != s->cur_file || (!sl->head && !sl->done)) pthread_cond_wait(&s->cv_data, &s->mu);
        if (sl->head) {
            doc_item *d = sl->head;
            sl->head = d->next;
            if (!sl->head) sl->tail = NULL;
            sl->queued -= d->n + 1;
            pthread_cond_broadcast(&s->cv_work);
            pthread_mutex_unlock(&s->mu);
            s->cur = d;
            s->st.file = s->cur_file;
            s->st.doc = d->pos;
            s->st.consumed = 0;
            if (s->skip) {
                if (s->skip > d->n + 1 && s->lenient) s->skip = d->n + 1; /* going on past a change */
                if (s->skip > d->n + 1) {
                    return FL_FAIL_M1(FL_ERR_IO, "%s: line %lld: the saved position had consumed %lld tokens of "
                                   "this document, which now has %lld (the file or the tokenizer changed)",
                                   fl_stream_file_path(s, s->cur_file), (long long)d->pos.line,
                                   (long long)s->skip, (long long)(d->n + 1));
                }
                s->st.consumed = s->skip;
                s->skip = 0;
            }
            s->docs++;
            return 1;
        }
        if (sl->failed) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", sl->error);
            pthread_mutex_unlock(&s->mu);
            return FL_FAIL_M1(FL_ERR_IO, "%s", msg);
        }
        sl->file = -1;
        s->cur_file++;
        pthread_cond_broadcast(&s->cv_work);
        if (s->cur_file % s->per_epoch == 0) {
            if (!s->o.once && s->epoch_whole && s->epoch_tokens == 0) {
                pthread_mutex_unlock(&s->mu);
                return FL_FAIL_M1(FL_ERR_IO, "%s: rank %d's part of the %s holds no documents (%lld files, %s)",
                               s->path, s->o.rank,
                               s->o.split == FL_SPLIT_VAL ? "validation split" : "corpus",
                               (long long)s->nfiles,
                               s->by_file ? "whole files by rank" : "documents by rank");
            }
            s->epoch_whole = true;
            s->epoch_tokens = 0;
        }
    }
}

/* Copy the next n tokens of the stream to dst: n, fewer at the end of a
 * `once` stream, -1 on error. */
static int64_t pull(fl_stream *s, int64_t *dst, int64_t n)
{
    int64_t got = 0;
    while (got < n) {
        doc_item *d = s->cur;
        if (d && s->st.consumed < d->n + 1) {
            int64_t take = d->n + 1 - s->st.consumed;
            if (take > n - got) take = n - got;
            for (int64_t i = 0; i < take; i++) {
                int64_t j = s->st.consumed + i;
                dst[got + i] = j < d->n ? d->ids[j] : s->o.eos_id;
            }
            s->st.consumed += take;
            got += take;
            s->tokens += take;
            s->epoch_tokens += take;
            continue;
        }
        int rc = next_doc(s);
        if (rc < 0) return -1;
        if (rc == 0) break;
    }
    return got;
}

int64_t fl_stream_next(fl_stream *s, int64_t rows, int64_t *out)
{
    int64_t T1 = s->o.seq_len + 1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t *row = out + r * T1;
        int64_t off = 0;
        if (s->st.carry >= 0) row[off++] = s->st.carry;
        int64_t got = pull(s, row + off, T1 - off);
        if (got < 0) return -1;
        if (got < T1 - off) return r;
        s->st.carry = row[T1 - 1];
    }
    return rows;
}

/* ---- the byte tokenizer ------------------------------------------------- */

/* A token per byte (ids 0-255), as fsdp.data.byte_tokenizer. */
typedef struct byte_tok {
    int32_t *ids;
    size_t cap;
} byte_tok;

static void *byte_open(void *arg)
{
    (void)arg;
    byte_tok *t = calloc(1, sizeof *t);
    if (!t) fl_fail(FL_ERR_OOM, "byte tokenizer: out of memory");
    return t;
}

static int64_t byte_encode(void *self, const char *text, size_t len, const int32_t **ids)
{
    byte_tok *t = self;
    if (len > t->cap) {
        size_t cap = len > 2 * t->cap ? len : 2 * t->cap;
        int32_t *p = realloc(t->ids, cap * sizeof *p);
        if (!p) return fl_fail(FL_ERR_OOM, "byte tokenizer: out of memory for %zu tokens", len), -1;
        t->ids = p;
        t->cap = cap;
    }
    for (size_t i = 0; i < len; i++) t->ids[i] = (unsigned char)text[i];
    *ids = t->ids;
    return (int64_t)len;
}

static void byte_close(void *self)
{
    byte_tok *t = self;
    free(t->ids);
    free(t);
}

fl_tokenizer_hook fl_byte_tokenizer_hook(void)
{
    fl_tokenizer_hook h = { byte_open, byte_encode, byte_close, NULL };
    return h;
}
