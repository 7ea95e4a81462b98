/*
 * files.h: what the core's readers and writers of files share: durable
 * renames (io/atomic_file.c), inputs opened as regular files only
 * (io/input_file.c), and integers from the environment (base/launcher.c).
 */
#ifndef FL_FILES_H
#define FL_FILES_H

#include "fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fsync the directory holding `path` (after a rename into it). */
int fl_sync_parent_dir(const char *path);

/* Open an input for reading: a descriptor of a regular file (its stat in
 * *st when st is not NULL), or -1 with an error naming the path and what it
 * is instead (a FIFO, a device, a directory), without ever blocking
 * (io/input_file.c: [Note: inputs are regular files]). */
struct stat;
int fl_open_regular(const char *path, struct stat *st);

/* The integer in environment variable `name`, or fallback when it is unset,
 * empty or not a whole int (base/launcher.c). */
int fl_env_int(const char *name, int fallback);

#ifdef __cplusplus
}
#endif

#endif /* FL_FILES_H */
