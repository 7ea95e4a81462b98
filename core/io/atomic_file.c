/*
 * atomic_file.c: publishing files so that a crash never leaves a torn one.
 *
 * A file is written under a temporary name in its own directory
 * ("<path>.tmp.<pid>"), flushed to the disk (fsync), renamed over the final
 * name (atomic within one file system), and the directory is fsynced so the
 * rename itself is durable. A reader therefore sees either the old file or
 * the whole new one. Checkpoints (lua/fsdp/checkpointing/) rely on this for
 * index.json and the COMPLETE marker; the safetensors writer uses the same
 * steps for its files.
 *
 * A directory of several files (an export) is published the same way one
 * level up (lua/fsdp/io/publish.lua): built under a temporary sibling name,
 * then swapped with the old directory in one step (fl_path_exchange) or
 * renamed into place (fl_rename_durable), the parent fsynced after.
 */
#include "error.h"
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1) /* linux/fs.h; glibc before 2.28 lacks it */
#endif

/* fsync a file or a directory by path. Some file systems refuse fsync on a
 * directory (EINVAL): there is nothing more to do on those. */
int fl_fsync_path(const char *path) {
    if (!path) return fl_fail(FL_ERR_ARG, "fsync: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fl_fail(FL_ERR_IO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL && err != EROFS)
        return fl_fail(FL_ERR_IO, "%s: fsync failed: %s", path, strerror(err));
    return FL_OK;
}

int fl_sync_parent_dir(const char *path) {
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return fl_fail(FL_ERR_ARG, "%s: path too long", path);
    char *slash = strrchr(dir, '/');
    if (!slash) {
        snprintf(dir, sizeof dir, ".");
    } else if (slash == dir) {
        dir[1] = '\0'; /* the root directory */
    } else {
        *slash = '\0';
    }
    return fl_fsync_path(dir);
}

static int write_all(int fd, const char *p, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int fl_file_write_atomic(const char *path, const void *data, size_t len) {
    if (!path || !*path) return fl_fail(FL_ERR_ARG, "write_atomic: path is empty");
    if (!data && len > 0) return fl_fail(FL_ERR_ARG, "%s: write_atomic: data is NULL", path);
    size_t cap = strlen(path) + 32;
    char *tmp = malloc(cap);
    if (!tmp) return fl_fail(FL_ERR_OOM, "%s: out of memory", path);
    snprintf(tmp, cap, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fl_fail(FL_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return fl_last_status();
    }
    const char *what = NULL;
    if (write_all(fd, data, len) != 0) what = "cannot write";
    else if (fsync(fd) != 0) what = "cannot fsync";
    int err = errno;
    if (close(fd) != 0 && !what) {
        what = "cannot close";
        err = errno;
    }
    if (!what && rename(tmp, path) != 0) {
        what = "cannot rename into place";
        err = errno;
    }
    if (what) {
        unlink(tmp);
        fl_fail(FL_ERR_IO, "%s: %s: %s", tmp, what, strerror(err));
        free(tmp);
        return fl_last_status();
    }
    free(tmp);
    return fl_sync_parent_dir(path);
}

/* Both directories of a rename made durable: the destination's, and the
 * source's when it is another one. */
static int sync_both(const char *from, const char *to) {
    int rc = fl_sync_parent_dir(to);
    if (rc != FL_OK) return rc;
    const char *a = strrchr(from, '/'), *b = strrchr(to, '/');
    size_t la = a ? (size_t)(a - from) : 0, lb = b ? (size_t)(b - to) : 0;
    if (la == lb && strncmp(from, to, la) == 0) return FL_OK;
    return fl_sync_parent_dir(from);
}

int fl_rename_durable(const char *from, const char *to) {
    if (!from || !to) return fl_fail(FL_ERR_ARG, "rename: path is NULL");
    if (rename(from, to) != 0)
        return fl_fail(FL_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
    return sync_both(from, to);
}

/* renameat2(RENAME_EXCHANGE) through syscall(): the call is Linux's (3.15),
 * and a libc may lack the wrapper. A file system that cannot exchange
 * (EINVAL: NFS, older overlayfs) or a kernel without the call (ENOSYS)
 * is FL_ERR_UNSUPPORTED, so the caller can take its two-rename path. */
int fl_path_exchange(const char *a, const char *b) {
    if (!a || !b) return fl_fail(FL_ERR_ARG, "exchange: path is NULL");
#ifdef SYS_renameat2
    long rc = syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, (unsigned)RENAME_EXCHANGE);
    int err = errno;
#else
    long rc = -1;
    int err = ENOSYS;
#endif
    if (rc != 0) {
        fl_status st = (err == EINVAL || err == ENOSYS || err == EOPNOTSUPP) ? FL_ERR_UNSUPPORTED : FL_ERR_IO;
        return fl_fail(st, "cannot exchange %s and %s: %s", a, b, strerror(err));
    }
    return sync_both(a, b);
}
