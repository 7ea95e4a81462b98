/*
 * error.c: the thread-local "last error" of the core.
 *
 * Fallible calls record a message here and return a status (or NULL); the
 * Lua binding turns the message into a Lua error. Messages name the
 * operation and the shapes involved so the user can find the mistake without
 * a debugger. Broken internal invariants are not errors: fl_abort stops the
 * process with the location, because continuing would corrupt results.
 */
#include "error.h"

#include <stdarg.h>
#include <string.h>

enum { FL_ERROR_CAPACITY = 1024 };

static _Thread_local char last_message[FL_ERROR_CAPACITY];
static _Thread_local fl_status last_status = FL_OK;

int fl_fail(fl_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    last_status = status;
    return status;
}

int fl_fail_prefix(const char *fmt, ...) {
    char message[FL_ERROR_CAPACITY];
    memcpy(message, last_message, sizeof message);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : (size_t)n;
    if (used < sizeof last_message)
        snprintf(last_message + used, sizeof last_message - used, ": %s", message);
    if (last_status == FL_OK) last_status = FL_ERR_DEVICE;
    return last_status;
}

int fl_set_error(fl_status status, const char *message) {
    return fl_fail(status, "%s", message ? message : "(no message)");
}

fl_status fl_last_status(void) { return last_status; }

const char *fl_last_error(void) { return last_message; }

void fl_clear_error(void) {
    last_message[0] = '\0';
    last_status = FL_OK;
}

void fl_abort(const char *file, int line, const char *what) {
    /* Name the rank: in a job of many processes, which one broke matters. */
    int rank = fl_dist_launcher_rank();
    if (rank >= 0)
        fprintf(stderr, "fsdp-lua: rank %d: internal error at %s:%d: %s\n", rank, file, line, what);
    else
        fprintf(stderr, "fsdp-lua: internal error at %s:%d: %s\n", file, line, what);
    fflush(stderr);
    abort();
}
