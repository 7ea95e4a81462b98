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

/* [Note: virtual storage]: meta tensors count the bytes they stand for in
 * the meta statistics, views share their base's, the bytes go with the
 * last reference, and none of it paces the collector (allocated_total). */
static void meta_counts_virtual_bytes(void **state) {
    (void)state;
    fl_memory_stats s;
    fl_memory_stats_get(META, &s);
    int64_t base = s.in_use, total = fl_memory_allocated_total();
    fl_tensor *m = fl_zeros(SHAPE(1 << 20, 1 << 20), FL_F32, META);
    fl_tensor *v = fl_narrow(m, 0, 0, 10);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use - base, (int64_t)4 << 40);
    fl_tensor_release(m);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use - base, (int64_t)4 << 40); /* the view keeps it */
    fl_tensor_release(v);
    fl_memory_stats_get(META, &s);
    assert_int_equal(s.in_use, base);
    assert_int_equal(fl_memory_allocated_total(), total);
    m = fl_empty(SHAPE(3), FL_F32, META);
    assert_int_equal(fl_tensor_storage_bytes(m), 0); /* still no values */
    fl_tensor_release(m);
}

/* fl_meta_set_f32_gemm: a bf16 product on meta raises the peak by the f32
 * copies the CPU backend stages (operands, result), leaving in_use alone. */
static void meta_f32_gemm_staging(void **state) {
    (void)state;
    fl_tensor *x = fl_empty(SHAPE(8, 16), FL_BF16, META);
    fl_tensor *w = fl_empty(SHAPE(4, 16), FL_BF16, META);
    bool was = fl_meta_set_f32_gemm(true);
    fl_memory_stats_reset(META);
    fl_memory_stats s0, s1;
    fl_memory_stats_get(META, &s0);
    fl_tensor *y = fl_linear(x, w, NULL);
    fl_memory_stats_get(META, &s1);
    assert_int_equal(s1.in_use - s0.in_use, 8 * 4 * 2);
    assert_int_equal(s1.peak - s1.in_use, (8 * 16 + 16 * 4 + 8 * 4) * 4);
    fl_meta_set_f32_gemm(false);
    fl_tensor_release(y);
    fl_memory_stats_reset(META);
    y = fl_linear(x, w, NULL);
    fl_memory_stats_get(META, &s1);
    assert_int_equal(s1.peak, s1.in_use);
    fl_meta_set_f32_gemm(was);
    fl_tensor_release(y);
    fl_tensor_release(x);
    fl_tensor_release(w);
}

int fl_test_memory(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(statistics_follow_allocations),
        cmocka_unit_test(limit_gives_oom_error),
        cmocka_unit_test(meta_counts_virtual_bytes),
        cmocka_unit_test(meta_f32_gemm_staging),
    };
    return cmocka_run_group_tests_name("memory", tests, NULL, NULL);
}
