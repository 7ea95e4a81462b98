/*
 * append_file.c: files that grow by whole records (the metrics JSONL, the
 * TensorBoard event files), where a write that fails is an error the
 * caller hears of and never a torn record left in the file.
 *
 * Buffered stdio hides failures: fwrite into the buffer succeeds, the
 * buffer's write(2) fails later (at a flush, or at exit, where nobody looks)
 * after putting part of it on the disk. A full disk then cut the metrics
 * file in the middle of a line and the run ended with status 0. Here every
 * record is one or more write(2) calls straight to the file; a failed or
 * short one is an error naming the file, the bytes written and errno, and
 * the part that did reach the file is cut off again (ftruncate back to
 * where the record began), so the file ends with its last whole record.
 * The cut is made only when the file's size is what this writer alone made
 * it (another writer appending to the same file is not cut into).
 *
 * close(2) is checked too: a file system that reports write errors late
 * (NFS at close) fails there, naming the file.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fl_append_file {
    int fd;
    char *path;
};

fl_append_file *fl_append_open(const char *path, bool create_new) {
    if (!path || !*path) {
        fl_fail(FL_ERR_ARG, "append file: path is empty");
        return NULL;
    }
    int flags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | (create_new ? O_EXCL : 0);
    int fd = open(path, flags, 0644);
    if (fd < 0) {
        fl_fail(FL_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
        return NULL;
    }
    fl_append_file *f = calloc(1, sizeof *f);
    char *copy = strdup(path);
    if (!f || !copy) {
        close(fd);
        free(f);
        free(copy);
        fl_fail(FL_ERR_OOM, "%s: out of memory", path);
        return NULL;
    }
    f->fd = fd;
    f->path = copy;
    return f;
}

/* The file's size, or -1 where it has none (a device such as /dev/full). */
static off_t size_of(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    return st.st_size;
}

int fl_append_write(fl_append_file *f, const void *data, size_t len) {
    if (!f) return fl_fail(FL_ERR_ARG, "append file: NULL");
    if (!data && len > 0) return fl_fail(FL_ERR_ARG, "%s: append: data is NULL", f->path);
    off_t before = size_of(f->fd);
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(f->fd, p + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            /* write(2) returning 0 for a non-empty request means no room. */
            int err = n < 0 ? errno : ENOSPC;
            const char *cut = "";
            if (done > 0 && before >= 0) {
                if (size_of(f->fd) == before + (off_t)done && ftruncate(f->fd, before) == 0)
                    cut = "; the part written was cut off again";
                else
                    cut = "; the part written could not be cut off";
            }
            return fl_fail(FL_ERR_IO, "%s: write failed after %zu of %zu bytes: %s%s", f->path, done,
                           len, strerror(err), cut);
        }
        done += (size_t)n;
    }
    return FL_OK;
}

int fl_append_close(fl_append_file *f) {
    if (!f) return FL_OK;
    int rc = FL_OK;
    if (close(f->fd) != 0)
        rc = fl_fail(FL_ERR_IO, "%s: close failed: %s", f->path, strerror(errno));
    free(f->path);
    free(f);
    return rc;
}
