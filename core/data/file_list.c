/*
 * file_list.c: the files a corpus path names (fl_file_list): one file, a
 * directory's files that a reader knows (fl_reader_format; not recursive,
 * so a directory can also hold a tokenizer or notes), or a glob(3) pattern.
 * Always sorted by name, so every rank and every run sees the same order.
 * Every file listed is a regular file: a FIFO, a device or a directory with
 * a corpus name is an error naming it.
 * Each file's size is taken when it is listed: a stream's position records
 * the list as the run saw it (lua/fsdp/data/corpus.lua).
 */
#include "data.h"

#include <errno.h>
#include <glob.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

struct fl_file_list {
    char **paths;
    int64_t *sizes;
    int64_t n, cap;
};

static int add(fl_file_list *l, const char *dir, const char *name)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 16;
        char **p = realloc(l->paths, (size_t)cap * sizeof *p);
        if (!p) return fl_fail(FL_ERR_OOM, "corpus file list: out of memory");
        l->paths = p;
        int64_t *z = realloc(l->sizes, (size_t)cap * sizeof *z);
        if (!z) return fl_fail(FL_ERR_OOM, "corpus file list: out of memory");
        l->sizes = z;
        l->cap = cap;
    }
    size_t n = (dir ? strlen(dir) + 1 : 0) + strlen(name) + 1;
    char *s = malloc(n);
    if (!s) return fl_fail(FL_ERR_OOM, "corpus file list: out of memory");
    if (dir) snprintf(s, n, "%s/%s", dir, name);
    else snprintf(s, n, "%s", name);
    /* Refused here, when the run starts, rather than by a reader thread
     * that would wait on a FIFO for good once training reached it
     * ([Note: inputs are regular files]). */
    if (fl_file_check_regular(s) != FL_OK) {
        free(s);
        return -1;
    }
    struct stat st;
    if (stat(s, &st) != 0) {
        fl_fail(FL_ERR_IO, "%s: cannot stat: %s", s, strerror(errno));
        free(s);
        return -1;
    }
    l->sizes[l->n] = (int64_t)st.st_size;
    l->paths[l->n++] = s;
    return 0;
}

/* Sorted by name, each size moving with its path. */
typedef struct entry {
    char *path;
    int64_t size;
} entry;

static int cmp(const void *a, const void *b) { return strcmp(((const entry *)a)->path, ((const entry *)b)->path); }

static int sort_list(fl_file_list *l)
{
    entry *e = malloc((size_t)l->n * sizeof *e);
    if (!e) return fl_fail(FL_ERR_OOM, "corpus file list: out of memory");
    for (int64_t i = 0; i < l->n; i++) e[i] = (entry){ l->paths[i], l->sizes[i] };
    qsort(e, (size_t)l->n, sizeof *e, cmp);
    for (int64_t i = 0; i < l->n; i++) {
        l->paths[i] = e[i].path;
        l->sizes[i] = e[i].size;
    }
    free(e);
    return 0;
}

fl_file_list *fl_file_list_open(const char *spec)
{
    if (!spec || !spec[0]) return FL_FAIL_NULL(FL_ERR_ARG, "corpus: empty path");
    fl_file_list *l = calloc(1, sizeof *l);
    if (!l) return FL_FAIL_NULL(FL_ERR_OOM, "corpus file list: out of memory");
    struct stat st;
    bool json;
    int comp;
    if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode)) {
        DIR *d = opendir(spec);
        if (!d) {
            fl_fail(FL_ERR_IO, "%s: cannot list the directory: %s", spec, strerror(errno));
            goto fail;
        }
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.' && fl_reader_format(e->d_name, &json, &comp) == 0 && add(l, spec, e->d_name)) {
                closedir(d);
                goto fail;
            }
        closedir(d);
        if (l->n == 0) {
            fl_fail(FL_ERR_IO, "%s: the directory holds no corpus files (.txt, .jsonl, .json, each optionally "
                    ".gz or .zst)", spec);
            goto fail;
        }
    } else if (stat(spec, &st) == 0) {
        if (fl_reader_format(spec, &json, &comp)) {
            fl_fail(FL_ERR_ARG, "%s: unknown corpus format (readers know .txt, .jsonl, .json, each optionally "
                    ".gz or .zst)", spec);
            goto fail;
        }
        if (add(l, NULL, spec)) goto fail;
    } else if (strpbrk(spec, "*?[")) {
        glob_t g;
        int rc = glob(spec, 0, NULL, &g);
        if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
            if (rc == 0) globfree(&g);
            fl_fail(FL_ERR_IO, "%s: no file matches the pattern", spec);
            goto fail;
        }
        if (rc != 0) {
            fl_fail(FL_ERR_IO, "%s: cannot expand the pattern (glob error %d)", spec, rc);
            goto fail;
        }
        for (size_t i = 0; i < g.gl_pathc; i++) {
            if (fl_reader_format(g.gl_pathv[i], &json, &comp)) {
                fl_fail(FL_ERR_ARG, "%s: %s matches the pattern but is no corpus format (readers know .txt, "
                        ".jsonl, .json, each optionally .gz or .zst)", spec, g.gl_pathv[i]);
                globfree(&g);
                goto fail;
            }
            if (add(l, NULL, g.gl_pathv[i])) { globfree(&g); goto fail; }
        }
        globfree(&g);
    } else {
        fl_fail(FL_ERR_IO, "%s: no such file or directory", spec);
        goto fail;
    }
    if (sort_list(l)) goto fail;
    return l;
fail:
    fl_file_list_free(l);
    return NULL;
}

void fl_file_list_free(fl_file_list *l)
{
    if (!l) return;
    for (int64_t i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    free(l->sizes);
    free(l);
}

int64_t fl_file_list_count(const fl_file_list *l) { return l->n; }

const char *fl_file_list_path(const fl_file_list *l, int64_t i)
{
    return i >= 0 && i < l->n ? l->paths[i] : NULL;
}

int64_t fl_file_list_size(const fl_file_list *l, int64_t i)
{
    return i >= 0 && i < l->n ? l->sizes[i] : -1;
}
