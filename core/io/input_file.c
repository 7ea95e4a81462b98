/*
 * input_file.c: how the core opens a file a user named as an input (a
 * safetensors file, a corpus file, a tokenizer, a JSON config): it must be a
 * regular file, and what is read whole is read up to a stated bound.
 *
 * [Note: inputs are regular files]
 * open(2) of a FIFO for reading waits for a writer, forever if none comes;
 * a device (/dev/zero, /dev/urandom) never ends; a directory cannot be read
 * as a file. A FIFO as model.safetensors, in a --data directory or as a
 * --prompt_file therefore hung the run (issue 38). Every input goes through
 * fl_open_regular: stat() first (following links, as open does), so a
 * device is refused before it is opened at all (opening one can have
 * effects); then open with O_NONBLOCK (a FIFO that appears in between opens
 * at once instead of waiting) and fstat of the descriptor, which is what is
 * then read, so the check and the read are of the same file. The error
 * names the file and what it is instead. A whole-file read
 * (fl_file_read_all) stops at its bound, named by the caller, whatever the
 * file's size claims to be (files in /proc say 0 and hold more).
 */
#include "error.h"
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

static int refuse(const char *path, mode_t m) {
    const char *kind = kind_of(m);
    if (strcmp(kind, "not a regular file") == 0) return fl_fail(FL_ERR_IO, "%s is not a regular file", path);
    return fl_fail(FL_ERR_IO, "%s is %s, not a regular file", path, kind);
}

int fl_file_check_regular(const char *path) {
    if (!path) return fl_fail(FL_ERR_ARG, "input file: path is NULL");
    struct stat st;
    if (stat(path, &st) != 0) return fl_fail(FL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return refuse(path, st.st_mode);
    return FL_OK;
}

int fl_open_regular(const char *path, struct stat *st) {
    if (fl_file_check_regular(path) != FL_OK) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        fl_fail(FL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat own;
    if (!st) st = &own;
    if (fstat(fd, st) != 0) {
        fl_fail(FL_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st->st_mode)) { /* replaced since the stat above */
        refuse(path, st->st_mode);
        close(fd);
        return -1;
    }
    /* Regular files ignore O_NONBLOCK; cleared so the descriptor is an
     * ordinary one for whoever reads it (stdio, mmap). */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

/* "16 MiB" for a multiple of a MiB or KiB, else the bytes. */
static void size_text(size_t n, char *out, size_t cap) {
    if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(out, cap, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0) snprintf(out, cap, "%zu KiB", n >> 10);
    else snprintf(out, cap, "%zu bytes", n);
}

char *fl_file_read_all(const char *path, size_t max_bytes, const char *what, size_t *len) {
    if (len) *len = 0;
    struct stat st;
    int fd = fl_open_regular(path, &st);
    if (fd < 0) return NULL;
    char limit[32];
    size_text(max_bytes, limit, sizeof limit);
    const char *name = what && what[0] ? what : "such a file";
    if (st.st_size > 0 && (uint64_t)st.st_size > max_bytes) {
        close(fd);
        return FL_FAIL_NULL(FL_ERR_IO, "%s is larger than %s, the limit for %s", path, limit, name);
    }
    /* The size is a hint only: the file may grow, and /proc files say 0. */
    size_t cap = (st.st_size > 0 ? (size_t)st.st_size : 4096) + 1, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory for %zu bytes", path, cap);
    }
    for (;;) {
        if (n == cap) {
            size_t grown = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
            char *p = grown > cap ? realloc(buf, grown + 1) : NULL;
            if (!p) {
                free(buf);
                close(fd);
                return FL_FAIL_NULL(FL_ERR_OOM, "%s: out of memory for %zu bytes", path, grown);
            }
            buf = p;
            cap = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int err = errno;
            free(buf);
            close(fd);
            return FL_FAIL_NULL(FL_ERR_IO, "%s: cannot read: %s", path, strerror(err));
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n > max_bytes) {
            free(buf);
            close(fd);
            return FL_FAIL_NULL(FL_ERR_IO, "%s is larger than %s, the limit for %s", path, limit, name);
        }
    }
    close(fd);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

void fl_file_buffer_free(char *buf) { free(buf); }
