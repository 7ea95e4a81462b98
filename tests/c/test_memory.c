/*
 * test_memory.c: the allocator statistics (in use, peak, counts, reset)
 * and the memory limit that turns an allocation into a clean OOM error.
 */
#include "test_util.h"

#include "fl_tests.h"

static void statistics_follow_allocations(void **state) {
    (void)state;
    fl_memory_stats s0, s1, s2;
    fl_memory_stats_reset(CPU);
    fl_memory_stats_get(CPU, &s0);
    fl_tensor *a = fl_empty(SHAPE(1000), FL_F32, CPU);
    fl_tensor *b = fl_empty(SHAPE(500), FL_F64, CPU);
    fl_memory_stats_get(CPU, &s1);
    assert_int_equal(s1.in_use - s0.in_use, 8000);
    assert_int_equal(s1.allocations, 2);
    fl_tensor *v = fl_narrow(a, 0, 0, 10); /* views allocate nothing */
    fl_tensor_release(a);
    fl_tensor_release(b);
    fl_memory_stats_get(CPU, &s2);
    assert_int_equal(s2.in_use - s0.in_use, 4000); /* v keeps a's storage */
    assert_int_equal(s2.peak - s0.in_use, 8000);
    assert_int_equal(s2.frees, 1);
    fl_tensor_release(v);
    fl_memory_stats_reset(CPU);
    fl_memory_stats_get(CPU, &s2);
    assert_int_equal(s2.peak, s2.in_use);
    assert_int_equal(s2.allocations, 0);
}

static void limit_gives_oom_error(void **state) {
    (void)state;
    fl_memory_stats s;
    fl_memory_stats_get(CPU, &s);
    assert_int_equal(fl_memory_set_limit(CPU, s.in_use + 4096), FL_OK);
    fl_tensor *ok = fl_empty(SHAPE(1024), FL_F32, CPU);
    assert_non_null(ok);
    fl_tensor *big = fl_zeros(SHAPE(2, 1024), FL_F32, CPU);
    assert_null(big);
    assert_int_equal(fl_last_status(), FL_ERR_OOM);
    assert_error_mentions("zeros: out of memory on cpu", "requested 8192 bytes");
    fl_memory_stats after;
    fl_memory_stats_get(CPU, &after);
    assert_int_equal(after.failures, s.failures + 1);
    assert_int_equal(fl_memory_set_limit(CPU, 0), FL_OK);
    big = fl_zeros(SHAPE(2, 1024), FL_F32, CPU);
    assert_non_null(big);
    assert_int_not_equal(fl_memory_set_limit(CPU, -1), FL_OK);
    fl_tensor_release(ok);
    fl_tensor_release(big);
}

static void meta_counts_nothing(void **state) {
    (void)state;
    fl_tensor *m = fl_zeros(SHAPE(1 << 20, 1 << 20), FL_F32, META);
    fl_memory_stats s;
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.allocations, 0);
    fl_tensor_release(m);
}

int fl_test_memory(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(statistics_follow_allocations),
        cmocka_unit_test(limit_gives_oom_error),
        cmocka_unit_test(meta_counts_nothing),
    };
    return cmocka_run_group_tests_name("memory", tests, NULL, NULL);
}
