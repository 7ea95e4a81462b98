/*
 * test_view.c: every view function: geometry, shared storage, values seen
 * through the view, meta tensors, and the error for each misuse.
 */
#include "test_util.h"

#include "fl_tests.h"

static fl_tensor *range(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    fl_tensor *a = fl_arange(0, (double)n, 1, FL_F32, CPU);
    fl_tensor *v = fl_view(a, ndim, shape);
    fl_tensor_release(a);
    return v;
}

static void view_and_reshape(void **state) {
    (void)state;
    fl_tensor *a = range(SHAPE(2, 3, 4));
    fl_tensor *v = fl_view(a, SHAPE(6, -1));
    assert_non_null(v);
    assert_int_equal(v->shape[1], 4);
    assert_ptr_equal(v->storage, a->storage);
    fl_tensor *t = fl_transpose(a, 1, 2); /* [2, 4, 3], not viewable as [8, 3]... */
    fl_tensor *bad = fl_view(t, SHAPE(2, 12));
    assert_null(bad);
    assert_error_mentions("view", "[2, 4, 3]");
    fl_tensor *ok = fl_view(t, SHAPE(2, 4, 3, 1)); /* adding a size-1 dim is fine */
    assert_non_null(ok);
    fl_tensor *r = fl_reshape(t, SHAPE(2, 12)); /* reshape copies instead */
    assert_non_null(r);
    assert_ptr_not_equal(r->storage, a->storage);
    assert_true(at(r, 1) == 4.0); /* t[0][0][1] = a[0][1][0] */
    assert_null(fl_view(a, SHAPE(5, -1)));
    assert_error_mentions("[5, -1]", "24 elements");
    assert_null(fl_view(a, SHAPE(-1, -1)));
    fl_tensor *flat = fl_flatten(a, 1, -1);
    assert_int_equal(flat->ndim, 2);
    assert_int_equal(flat->shape[1], 12);
    fl_tensor_release(a);
    fl_tensor_release(v);
    fl_tensor_release(t);
    fl_tensor_release(ok);
    fl_tensor_release(r);
    fl_tensor_release(flat);
}

static void narrow_slice_select(void **state) {
    (void)state;
    fl_tensor *a = range(SHAPE(3, 4)); /* 0..11 */
    fl_tensor *n = fl_narrow(a, 1, 1, 2);
    assert_int_equal(n->shape[1], 2);
    assert_true(at(n, 0) == 1 && at(n, 3) == 6);
    assert_null(fl_narrow(a, 2, 0, 1));
    assert_string_equal(fl_last_error(), "narrow: dim 2 out of range for a 2-d tensor of shape [3, 4]");
    assert_null(fl_narrow(a, 1, 3, 2));
    assert_error_mentions("start 3, length 2", "size 4");
    fl_tensor *s = fl_slice(a, 1, 1, 100, 2); /* columns 1 and 3 */
    assert_int_equal(s->shape[1], 2);
    assert_true(at(s, 1) == 3 && at(s, 2) == 5);
    fl_tensor *neg = fl_slice(a, 0, -2, 3, 1);
    assert_int_equal(neg->shape[0], 2);
    assert_true(at(neg, 0) == 4);
    assert_null(fl_slice(a, 0, 0, 1, 0));
    fl_tensor *row = fl_select(a, 0, -1);
    assert_int_equal(row->ndim, 1);
    assert_true(at(row, 0) == 8);
    assert_null(fl_select(a, 1, 4));
    assert_error_mentions("index 4", "[3, 4]");
    fl_tensor_release(a);
    fl_tensor_release(n);
    fl_tensor_release(s);
    fl_tensor_release(neg);
    fl_tensor_release(row);
}

static void permute_expand_squeeze(void **state) {
    (void)state;
    fl_tensor *a = range(SHAPE(2, 3, 4));
    fl_tensor *p = fl_permute(a, 3, (int[]){2, 0, 1});
    assert_int_equal(p->shape[0], 4);
    assert_int_equal(p->stride[0], 1);
    assert_false(fl_tensor_is_contiguous(p));
    assert_true(at(p, 1) == 4.0); /* p[0][0][1] = a[0][1][0] */
    assert_null(fl_permute(a, 3, (int[]){0, 0, 1}));
    assert_error_mentions("more than once", NULL);
    assert_null(fl_permute(a, 2, (int[]){0, 1}));
    fl_tensor *col = range(SHAPE(3, 1));
    fl_tensor *e = fl_expand(col, SHAPE(2, 3, 5));
    assert_non_null(e);
    assert_int_equal(e->stride[0], 0);
    assert_int_equal(e->stride[2], 0);
    assert_true(at(e, 5 * 2 + 4) == 2.0);
    assert_null(fl_expand(a, SHAPE(2, 5, 4)));
    assert_error_mentions("[2, 3, 4]", "[2, 5, 4]");
    fl_tensor *u = fl_unsqueeze(a, -1);
    assert_int_equal(u->ndim, 4);
    assert_int_equal(u->shape[3], 1);
    fl_tensor *sq = fl_squeeze(u, 3);
    assert_int_equal(sq->ndim, 3);
    assert_null(fl_squeeze(a, 0));
    assert_error_mentions("size 2, not 1", NULL);
    fl_tensor_release(a);
    fl_tensor_release(p);
    fl_tensor_release(col);
    fl_tensor_release(e);
    fl_tensor_release(u);
    fl_tensor_release(sq);
}

static void views_work_on_meta(void **state) {
    (void)state;
    fl_tensor *m = fl_empty(SHAPE(8192, 28672), FL_BF16, META);
    fl_tensor *t = fl_transpose(m, 0, 1);
    fl_tensor *r = fl_reshape(t, SHAPE(-1)); /* would copy: on meta, no data */
    assert_non_null(r);
    assert_int_equal(r->numel, (int64_t)8192 * 28672);
    assert_null(r->data);
    fl_tensor *n = fl_narrow(m, 0, 4096, 4096);
    assert_int_equal(n->offset, (int64_t)4096 * 28672);
    fl_tensor_release(m);
    fl_tensor_release(t);
    fl_tensor_release(r);
    fl_tensor_release(n);
}

int fl_test_view(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(view_and_reshape),
        cmocka_unit_test(narrow_slice_select),
        cmocka_unit_test(permute_expand_squeeze),
        cmocka_unit_test(views_work_on_meta),
    };
    return cmocka_run_group_tests_name("view", tests, NULL, NULL);
}
