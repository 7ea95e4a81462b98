/*
 * fuzz_input.h: the fuzzer's bytes as a file the readers can open and map.
 *
 * The readers take paths (they map files), so each input is written to an
 * anonymous in-memory file (memfd) and opened through /proc/self/fd: no
 * disk, nothing left behind, and every input gets a fresh file.
 */
#ifndef FUZZ_INPUT_H
#define FUZZ_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Write data to a new memfd; path receives its /proc name. Returns the fd
 * (close it when done) or aborts: a harness that cannot make its file is
 * broken, not the reader. */
static int fuzz_file(const uint8_t *data, size_t size, char *path, size_t path_size) {
    int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd < 0) {
        perror("memfd_create");
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0) {
            perror("write");
            abort();
        }
        done += (size_t)n;
    }
    snprintf(path, path_size, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
