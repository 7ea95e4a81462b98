/*
 * error.h: how the core reports failures (core/base/error.c): the thread's
 * error message and status (fl_fail), and the abort on a broken internal
 * invariant (FL_ASSERT). Also FL_PLUGIN_API, the mark of the internal
 * functions a backend plugin may call ([Note: the device interface]).
 */
#ifndef FL_ERROR_H
#define FL_ERROR_H

#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Internal functions a backend plugin calls ([Note: the device interface]):
 * exported from libfsdp.so, while every other internal symbol stays
 * hidden. */
#define FL_PLUGIN_API __attribute__((visibility("default")))

/* Record an error for this thread and return `status` (so callers can write
 * `return fl_fail(FL_ERR_ARG, "narrow: ...", ...)`). */
FL_PLUGIN_API int fl_fail(fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the error recorded last with a formatted context and ": " (its
 * status kept); returns that status. */
FL_PLUGIN_API int fl_fail_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Same, for functions that return a pointer: records and returns NULL. */
#define FL_FAIL_NULL(status, ...) (fl_fail((status), __VA_ARGS__), (void *)0)

/* Broken internal invariant: not a user mistake. Abort with location. */
#define FL_ASSERT(cond)                                                       \
    do {                                                                      \
        if (!(cond)) fl_abort(__FILE__, __LINE__, #cond);                     \
    } while (0)
FL_PLUGIN_API void fl_abort(const char *file, int line, const char *what)
    __attribute__((noreturn));

#ifdef __cplusplus
}
#endif

#endif /* FL_ERROR_H */
