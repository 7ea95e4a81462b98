/*
 * test_util.h: shared helpers of the C tests: cmocka includes, shorthand
 * constructors, and element reads through the public API.
 */
#ifndef FL_TEST_UTIL_H
#define FL_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fsdp.h"

#define CPU fl_device_make(FL_DEVICE_CPU, 0)
#define META fl_device_make(FL_DEVICE_META, 0)

/* Shapes as literals: SHAPE(2, 3) -> 2, (int64_t[]){2, 3}. */
#define SHAPE(...) \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]) { __VA_ARGS__ }

/* Element at a flat row-major position, as double. */
static inline double at(const fl_tensor *t, int64_t flat) {
    int64_t index[FL_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        index[d] = flat % t->shape[d];
        flat /= t->shape[d];
    }
    double v = 0;
    assert_int_equal(fl_get(t, index, &v), FL_OK);
    return v;
}

/* The last error contains every given fragment. */
static inline void assert_error_mentions(const char *a, const char *b) {
    const char *msg = fl_last_error();
    if (a && !strstr(msg, a)) fail_msg("error '%s' does not mention '%s'", msg, a);
    if (b && !strstr(msg, b)) fail_msg("error '%s' does not mention '%s'", msg, b);
}

#endif /* FL_TEST_UTIL_H */
