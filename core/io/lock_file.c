/*
 * lock_file.c: an advisory lock on a file that says who holds it, so that
 * one process at a time owns a directory (a checkpoint directory: [Note:
 * one job per checkpoint directory] in lua/fsdp/checkpointing/lock.lua).
 *
 * The lock is flock(LOCK_EX | LOCK_NB) on "<dir>/LOCK", never a file whose
 * existence is the lock: the kernel drops a flock when the last descriptor
 * of its open file is closed, so a holder that dies by any means (kill -9,
 * a node's out-of-memory killer, a Slurm time limit) leaves a lock the next
 * job takes at once, with no stale-lock heuristics (pid checks cannot see
 * another host's processes). Linux's NFS client maps flock onto the
 * server's byte-range locks, so it also holds across the hosts of a job
 * sharing the directory.
 *
 * The holder writes one line into the file (host, pid, since when, and the
 * caller's note), so a refused process can name it. The file is never
 * unlinked: removing a lock file races with a process that opened it just
 * before and would then hold a lock on a file nobody else can find. A
 * clean release empties it instead, so what a new holder finds in it is
 * the line of one that ended without releasing (it died), which the caller
 * reports as a lock taken over.
 *
 * The descriptor is opened O_CLOEXEC: a program the holder starts (gnuplot,
 * `hostname`) must not inherit it and keep the lock past the holder.
 *
 * Within one process a second lock of the same file (another path to it)
 * returns the held descriptor with a reference more instead of opening it
 * again: a second open file would conflict with the first (flock is per
 * open file), and on NFS, where flock is a POSIX lock, closing any
 * descriptor of the file would drop the process's lock. Only the thread
 * that runs Lua takes locks, so the table is not guarded.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The locks this process holds: as many as it has file descriptors for
 * (a long-lived process, a test runner or a sweep, saves into many
 * directories; the table grows, and open() says when descriptors run
 * out). */
static struct held {
    int fd;
    int refs;
    dev_t dev;
    ino_t ino;
} *held;
static int n_held, cap_held;

static struct held *held_by_fd(int fd) {
    for (int i = 0; i < n_held; i++)
        if (held[i].fd == fd) return &held[i];
    return NULL;
}

/* Up to size-1 bytes of the file from its start, NUL-terminated, with the
 * trailing newline dropped (the holder's line). */
static void read_line(int fd, char *out, size_t size) {
    if (!out || size == 0) return;
    ssize_t n = pread(fd, out, size - 1, 0);
    if (n < 0) n = 0;
    out[n] = '\0';
    char *nl = strchr(out, '\n');
    if (nl) *nl = '\0';
}

static int write_owner(int fd, const char *path, const char *note) {
    char host[256] = "?";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    char since[64] = "?";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", &tm);
    char line[1024];
    int len = snprintf(line, sizeof line, "host %s, pid %d, since %s%s%s\n", host, (int)getpid(),
                       since, note && *note ? ", " : "", note ? note : "");
    if (len < 0 || len >= (int)sizeof line) len = (int)strlen(line);
    /* The line is information, the lock is the flock: a failure to write
     * it (a full disk) is reported, since a refused job could not name us. */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len || fsync(fd) != 0)
        return fl_fail(FL_ERR_IO, "%s: cannot write the holder's line: %s", path, strerror(errno));
    return FL_OK;
}

int fl_file_lock(const char *path, const char *note, char *holder, size_t holder_size) {
    if (holder && holder_size > 0) holder[0] = '\0';
    if (!path || !*path) {
        fl_fail(FL_ERR_ARG, "file lock: path is empty");
        return FL_LOCK_FAILED;
    }
    struct stat st;
    if (stat(path, &st) == 0) {
        for (int i = 0; i < n_held; i++) {
            if (held[i].dev == st.st_dev && held[i].ino == st.st_ino) {
                held[i].refs++;
                return held[i].fd;
            }
        }
    }
    if (n_held == cap_held) {
        int cap = cap_held ? 2 * cap_held : 16;
        struct held *grown = realloc(held, (size_t)cap * sizeof *held);
        if (!grown) {
            fl_fail(FL_ERR_OOM, "%s: no memory for the table of %d file locks", path, cap);
            return FL_LOCK_FAILED;
        }
        held = grown, cap_held = cap;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fl_fail(FL_ERR_IO, "%s: cannot open the lock file: %s", path, strerror(errno));
        return FL_LOCK_FAILED;
    }
    int rc;
    do rc = flock(fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        int err = errno;
        read_line(fd, holder, holder_size);
        close(fd);
        if (err == EWOULDBLOCK) {
            fl_fail(FL_ERR_STATE, "%s is locked by another process (%s)", path,
                    holder && *holder ? holder : "which did not say who it is");
            return FL_LOCK_HELD;
        }
        fl_fail(FL_ERR_IO, "%s: flock: %s", path, strerror(err));
        /* NFS without its lock service, Lustre mounted without -o flock. */
        return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL ? FL_LOCK_UNSUPPORTED
                                                                                  : FL_LOCK_FAILED;
    }
    read_line(fd, holder, holder_size);
    if (fstat(fd, &st) != 0 || write_owner(fd, path, note) != FL_OK) {
        if (fl_last_status() == FL_OK)
            fl_fail(FL_ERR_IO, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return FL_LOCK_FAILED;
    }
    held[n_held++] = (struct held){fd, 1, st.st_dev, st.st_ino};
    return fd;
}

int fl_file_unlock(int handle) {
    struct held *h = held_by_fd(handle);
    if (!h) return fl_fail(FL_ERR_ARG, "file unlock: %d is not a lock this process holds", handle);
    if (--h->refs > 0) return FL_OK;
    /* Emptied first: the next holder then knows this one let go. */
    int rc = ftruncate(handle, 0);
    int err = errno;
    close(handle);
    *h = held[--n_held];
    if (rc != 0) return fl_fail(FL_ERR_IO, "file unlock: cannot empty the lock file: %s", strerror(err));
    return FL_OK;
}
