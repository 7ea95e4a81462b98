/*
 * test_tensor.c: creation, references, fill/copy/conversion, random
 * numbers and element access of the tensor core, on cpu, meta and fake.
 */
#include "test_util.h"

#include "fl_tests.h"

#include <math.h>

static void creation_fills_values(void **state) {
    (void)state;
    fl_tensor *z = fl_zeros(SHAPE(2, 3), FL_F32, CPU);
    fl_tensor *f = fl_full(SHAPE(4), 2.5, FL_BF16, CPU);
    fl_tensor *a = fl_arange(1, 2, 0.25, FL_F64, CPU);
    assert_non_null(z);
    assert_non_null(f);
    assert_non_null(a);
    assert_int_equal(z->numel, 6);
    for (int i = 0; i < 6; i++) assert_true(at(z, i) == 0.0);
    for (int i = 0; i < 4; i++) assert_true(at(f, i) == 2.5);
    assert_int_equal(a->numel, 4);
    assert_true(at(a, 3) == 1.75);
    fl_tensor *down = fl_arange(5, 0, -2, FL_I64, CPU);
    assert_int_equal(down->numel, 3);
    assert_true(at(down, 2) == 1.0);
    fl_tensor_release(z);
    fl_tensor_release(f);
    fl_tensor_release(a);
    fl_tensor_release(down);
}

static void zero_d_and_empty_tensors(void **state) {
    (void)state;
    fl_tensor *s = fl_full(0, NULL, 7, FL_I32, CPU);
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->numel, 1);
    assert_true(at(s, 0) == 7);
    fl_tensor *e = fl_zeros(SHAPE(3, 0), FL_F32, CPU);
    assert_non_null(e);
    assert_int_equal(e->numel, 0);
    assert_int_equal(fl_fill_(e, 1), FL_OK);
    fl_tensor_release(s);
    fl_tensor_release(e);
}

static void from_host_converts(void **state) {
    (void)state;
    double values[] = {1.5, -2.25, 3.0, 65504.0, 1e-7, -0.0};
    fl_tensor *h = fl_from_host(SHAPE(2, 3), FL_F16, CPU, values, FL_F64, 6);
    assert_non_null(h);
    assert_true(at(h, 0) == 1.5);
    assert_true(at(h, 3) == 65504.0);
    assert_true(at(h, 4) == 0x1p-23); /* 1e-7 -> 2 x 2^-24: subnormal f16, not flushed */
    fl_tensor *bad = fl_from_host(SHAPE(2, 2), FL_F32, CPU, values, FL_F64, 6);
    assert_null(bad);
    assert_error_mentions("6 values", "[2, 2]");
    fl_tensor_release(h);
}

static void copy_converts_and_broadcasts(void **state) {
    (void)state;
    int32_t row[] = {1, 2, 3};
    fl_tensor *r = fl_from_host(SHAPE(3), FL_I32, CPU, row, FL_I32, 3);
    fl_tensor *m = fl_empty(SHAPE(2, 3), FL_BF16, CPU);
    assert_int_equal(fl_copy_(m, r), FL_OK);
    for (int i = 0; i < 6; i++) assert_true(at(m, i) == row[i % 3]);
    /* into a strided destination: the transpose of a [3, 2] buffer */
    fl_tensor *buf = fl_zeros(SHAPE(3, 2), FL_F32, CPU);
    fl_tensor *bt = fl_transpose(buf, 0, 1);
    assert_int_equal(fl_copy_(bt, m), FL_OK);
    assert_true(at(buf, 0) == 1 && at(buf, 1) == 1 && at(buf, 2) == 2 && at(buf, 5) == 3);
    fl_tensor *wrong = fl_zeros(SHAPE(4), FL_F32, CPU);
    assert_int_not_equal(fl_copy_(m, wrong), FL_OK);
    assert_error_mentions("[4]", "[2, 3]");
    fl_tensor_release(r);
    fl_tensor_release(m);
    fl_tensor_release(buf);
    fl_tensor_release(bt);
    fl_tensor_release(wrong);
}

static void large_strided_copy_matches(void **state) {
    (void)state;
    /* Big enough to run in parallel chunks, strided on both sides. */
    fl_tensor *a = fl_arange(0, 300 * 500, 1, FL_F32, CPU);
    fl_tensor *a2 = fl_view(a, SHAPE(300, 500));
    fl_tensor *t = fl_transpose(a2, 0, 1);
    fl_tensor *c = fl_contiguous(t);
    assert_true(fl_tensor_is_contiguous(c));
    for (int64_t i = 0; i < 500; i += 37)
        for (int64_t j = 0; j < 300; j += 29) assert_true(at(c, i * 300 + j) == (double)(j * 500 + i));
    fl_tensor *d = fl_to(t, FL_F64, CPU);
    assert_true(at(d, 499 * 300 + 299) == 299.0 * 500 + 499);
    fl_tensor_release(a);
    fl_tensor_release(a2);
    fl_tensor_release(t);
    fl_tensor_release(c);
    fl_tensor_release(d);
}

static void views_keep_storage_alive(void **state) {
    (void)state;
    fl_tensor *a = fl_arange(0, 10, 1, FL_I64, CPU);
    fl_tensor *v = fl_narrow(a, 0, 2, 3);
    fl_tensor_release(a); /* the view still holds the storage */
    assert_true(at(v, 0) == 2 && at(v, 2) == 4);
    fl_tensor *c = fl_contiguous(v);
    assert_ptr_equal(c, v); /* already contiguous: same tensor, new ref */
    assert_int_equal(v->refcount, 2);
    fl_tensor_release(c);
    fl_tensor_release(v);
}

static void random_slices_equal_whole(void **state) {
    (void)state;
    fl_tensor *whole = fl_empty(SHAPE(4, 5), FL_F32, CPU);
    assert_int_equal(fl_normal_(whole, 1, 0, 0, 0.0, 1.0), FL_OK);
    fl_tensor *part = fl_empty(SHAPE(2, 5), FL_F32, CPU);
    assert_int_equal(fl_normal_(part, 1, 0, 10, 0.0, 1.0), FL_OK);
    for (int i = 0; i < 10; i++) assert_true(at(part, i) == at(whole, 10 + i));
    /* the same again gives the same values; another seed does not */
    fl_tensor *again = fl_empty(SHAPE(4, 5), FL_F32, CPU);
    fl_normal_(again, 1, 0, 0, 0.0, 1.0);
    fl_tensor *other = fl_empty(SHAPE(4, 5), FL_F32, CPU);
    fl_normal_(other, 2, 0, 0, 0.0, 1.0);
    int same = 0;
    for (int i = 0; i < 20; i++) {
        assert_true(at(again, i) == at(whole, i));
        same += at(other, i) == at(whole, i);
    }
    assert_int_equal(same, 0);
    /* a strided destination takes values in its own row-major order */
    fl_tensor *buf = fl_empty(SHAPE(5, 4), FL_F32, CPU);
    fl_tensor *bt = fl_transpose(buf, 0, 1);
    fl_normal_(bt, 1, 0, 0, 0.0, 1.0);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) assert_true(at(buf, j * 4 + i) == at(whole, i * 5 + j));
    fl_tensor_release(whole);
    fl_tensor_release(part);
    fl_tensor_release(again);
    fl_tensor_release(other);
    fl_tensor_release(buf);
    fl_tensor_release(bt);
}

static void random_distributions(void **state) {
    (void)state;
    fl_tensor *u = fl_empty(SHAPE(100000), FL_F64, CPU);
    assert_int_equal(fl_uniform_(u, 3, 1, 0, -2.0, 2.0), FL_OK);
    fl_tensor *n = fl_empty(SHAPE(100000), FL_F32, CPU);
    assert_int_equal(fl_normal_(n, 3, 2, 0, 1.0, 0.5), FL_OK);
    fl_tensor *k = fl_empty(SHAPE(1000), FL_I64, CPU);
    assert_int_equal(fl_randint_(k, 3, 3, 0, 5, 9), FL_OK);
    double su = 0, sn = 0, sn2 = 0;
    for (int64_t i = 0; i < 100000; i++) {
        double x = at(u, i), y = at(n, i);
        assert_true(x >= -2.0 && x < 2.0);
        su += x;
        sn += y;
        sn2 += y * y;
    }
    double mean = sn / 1e5, var = sn2 / 1e5 - mean * mean;
    assert_true(fabs(su / 1e5) < 0.03);
    assert_true(fabs(mean - 1.0) < 0.01);
    assert_true(fabs(var - 0.25) < 0.01);
    int seen[4] = {0};
    for (int64_t i = 0; i < 1000; i++) {
        double x = at(k, i);
        assert_true(x >= 5 && x <= 8 && x == floor(x));
        seen[(int)x - 5] = 1;
    }
    assert_true(seen[0] && seen[1] && seen[2] && seen[3]);
    assert_int_not_equal(fl_uniform_(u, 1, 0, 0, 2.0, 1.0), FL_OK);
    assert_int_not_equal(fl_randint_(k, 1, 0, 0, 3, 3), FL_OK);
    /* ranges far from zero stay exact (no trip through a double) */
    int64_t big = (int64_t)1 << 60;
    assert_int_equal(fl_randint_(k, 1, 0, 0, big, big + 10), FL_OK);
    int64_t got[1000];
    assert_int_equal(fl_to_host(k, got, FL_I64, 1000), FL_OK);
    for (int i = 0; i < 1000; i++) assert_true(got[i] >= big && got[i] < big + 10);
    fl_tensor_release(u);
    fl_tensor_release(n);
    fl_tensor_release(k);
}

static void meta_and_fake_hold_no_storage(void **state) {
    (void)state;
    fl_memory_stats before;
    fl_memory_stats_get(CPU, &before);
    fl_tensor *m = fl_empty(SHAPE(100000, 100000), FL_F32, META);
    assert_non_null(m);
    assert_null(m->data);
    assert_int_equal(fl_normal_(m, 1, 0, 0, 0, 1), FL_OK); /* init code runs on meta */
    fl_tensor *v = fl_transpose(m, 0, 1);
    assert_int_equal(v->shape[0], 100000);
    fl_tensor *f = fl_fake(SHAPE(4096, 4096), FL_BF16, CPU);
    assert_true(f->flags & FL_TENSOR_FAKE);
    assert_false(fl_tensor_has_storage(f));
    assert_int_equal(f->device, CPU);
    fl_tensor *fc = fl_clone(f);
    assert_true(fc->flags & FL_TENSOR_FAKE);
    fl_memory_stats after;
    fl_memory_stats_get(CPU, &after);
    assert_int_equal(after.in_use, before.in_use);
    double x;
    int64_t idx[2] = {0, 0};
    assert_int_equal(fl_get(m, idx, &x), FL_ERR_STATE);
    assert_error_mentions("meta", "[100000, 100000]");
    assert_int_equal(fl_get(f, idx, &x), FL_ERR_STATE);
    assert_error_mentions("fake", "[4096, 4096]");
    fl_tensor_release(m);
    fl_tensor_release(v);
    fl_tensor_release(f);
    fl_tensor_release(fc);
}

static void bad_arguments_are_errors(void **state) {
    (void)state;
    assert_null(fl_empty(SHAPE(2, -3), FL_F32, CPU));
    assert_error_mentions("empty", "negative size -3");
    assert_int_equal(fl_last_status(), FL_ERR_ARG);
    assert_null(fl_empty(SHAPE(2), (fl_dtype)99, CPU));
    assert_error_mentions("invalid dtype", NULL);
    assert_null(fl_empty(9, (int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}, FL_F32, CPU));
    assert_error_mentions("9 dimensions", NULL);
    assert_null(fl_arange(0, 1, 0, FL_F32, CPU));
    assert_int_not_equal(fl_fill_(NULL, 0), FL_OK);
    assert_error_mentions("NULL", NULL);
    fl_device d;
    assert_int_not_equal(fl_device_parse("tpu", &d), FL_OK);
    assert_error_mentions("tpu", NULL);
    assert_int_equal(fl_device_parse("cuda:3", &d), FL_OK);
    assert_int_equal(fl_device_kind_of(d), FL_DEVICE_CUDA);
    assert_int_equal(fl_device_index(d), 3);
    fl_clear_error();
    assert_int_equal(fl_last_status(), FL_OK);
    assert_string_equal(fl_last_error(), "");
}

static void cuda_without_gpu_is_a_clean_error(void **state) {
    (void)state;
    if (fl_device_count(FL_DEVICE_CUDA) > 0) skip();
    fl_device cuda;
    fl_device_parse("cuda:0", &cuda);
    assert_null(fl_zeros(SHAPE(2), FL_F32, cuda));
    assert_int_equal(fl_last_status(), FL_ERR_DEVICE);
    assert_error_mentions("cuda:0", NULL);
    /* fake tensors on cuda need no GPU at all */
    fl_tensor *f = fl_fake(SHAPE(8192, 8192), FL_BF16, cuda);
    assert_non_null(f);
    fl_tensor_release(f);
}

int fl_test_tensor(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(creation_fills_values),
        cmocka_unit_test(zero_d_and_empty_tensors),
        cmocka_unit_test(from_host_converts),
        cmocka_unit_test(copy_converts_and_broadcasts),
        cmocka_unit_test(large_strided_copy_matches),
        cmocka_unit_test(views_keep_storage_alive),
        cmocka_unit_test(random_slices_equal_whole),
        cmocka_unit_test(random_distributions),
        cmocka_unit_test(meta_and_fake_hold_no_storage),
        cmocka_unit_test(bad_arguments_are_errors),
        cmocka_unit_test(cuda_without_gpu_is_a_clean_error),
    };
    return cmocka_run_group_tests_name("tensor", tests, NULL, NULL);
}
