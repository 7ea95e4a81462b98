/*
 * data.h: what the files of core/data share (never installed).
 */
#ifndef FL_DATA_H
#define FL_DATA_H

#include "error.h"

/* The longest document a reader accepts unless told otherwise: larger than
 * any web document worth training on, small enough that a file without
 * newlines (a binary file named .jsonl) is refused before it fills memory. */
#define FL_READER_MAX_DOC_DEFAULT ((int64_t)8 << 20)

/* Record an error and give -1 (for functions returning a count or 1/0/-1). */
#define FL_FAIL_M1(...) (fl_fail(__VA_ARGS__), -1)

/* The format a file name says: *json (else text), *comp 0 none, 1 gzip,
 * 2 zstd. -1 for a name no reader knows. */
int fl_reader_format(const char *path, bool *json, int *comp);
const char *fl_reader_path(const fl_reader *r);
/* Skip JSON lines whose document index want() refuses without parsing or
 * checking them (the streaming loader: other ranks' documents, the other
 * split's). Text paragraphs are still assembled; the caller filters them. */
void fl_reader_filter(fl_reader *r, bool (*want)(void *arg, int64_t index), void *arg);

#endif
