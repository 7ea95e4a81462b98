/*
 * test_threads.c: products that a library threads start no threads once
 * warm ([Note: no library call inside an idle OpenMP region],
 * core/cpu/cpu_matmul.c). A threaded library called inside an OpenMP
 * region of one thread starts a nested team, which libgomp creates afresh
 * for every call; a GPT-2 step did that ~100 times. This file defines
 * pthread_create, so every thread the process starts (libgomp's and
 * OpenBLAS's included) passes through the counter below.
 */
#include "test_util.h"

#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "fl_tests.h"

static atomic_int created;

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *),
                   void *arg) {
    static create_fn real;
    if (!real) real = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
    atomic_fetch_add(&created, 1);
    return real(thread, attr, start, arg);
}

static fl_tensor *filled(int ndim, const int64_t *shape, double value) {
    fl_tensor *t = fl_full(ndim, shape, value, FL_F32, CPU);
    assert_non_null(t);
    return t;
}

/* Threads started by `reps` calls of run(arg) after one call to warm up. */
static int threads_started(void (*run)(void *), void *arg, int reps) {
    run(arg);
    int before = atomic_load(&created);
    for (int i = 0; i < reps; i++) run(arg);
    return atomic_load(&created) - before;
}

/* x^T @ w for x [768, 256] (a transposed view: no rows to fold, so the
 * product takes the per-batch loop) and w [768, 3072]. */
static void transposed_product(void *arg) {
    (void)arg;
    fl_tensor *x = filled(SHAPE(768, 256), 0.5);
    fl_tensor *w = filled(SHAPE(768, 3072), 0.25);
    fl_tensor *xt = fl_transpose(x, 0, 1);
    fl_tensor *y = fl_matmul(xt, w);
    assert_non_null(y);
    assert_float_equal(at(y, 0), 768 * 0.125, 1e-3);
    fl_tensor_release(y);
    fl_tensor_release(xt);
    fl_tensor_release(w);
    fl_tensor_release(x);
}

/* One image through a convolution large enough for a threaded GEMM per
 * image, forward and backward (the images-one-at-a-time path). */
static void one_image_convolution(void *arg) {
    (void)arg;
    fl_tensor *x = filled(SHAPE(1, 64, 40, 40), 0.5);
    fl_tensor *w = filled(SHAPE(128, 64, 3, 3), 0.25);
    assert_int_equal(fl_requires_grad_(x, true), FL_OK);
    assert_int_equal(fl_requires_grad_(w, true), FL_OK);
    fl_tensor *y = fl_conv2d(x, w, NULL, NULL);
    assert_non_null(y);
    fl_tensor *gy = fl_full(y->ndim, y->shape, 1.0, FL_F32, CPU);
    assert_int_equal(fl_backward(1, &y, &gy), FL_OK);
    fl_tensor *gw = fl_grad(w);
    assert_non_null(gw);
    assert_float_equal(at(gw, 0), 38 * 38 * 0.5, 1e-2);
    fl_tensor_release(gw);
    fl_tensor_release(gy);
    fl_tensor_release(y);
    fl_tensor_release(w);
    fl_tensor_release(x);
}

/* Two OpenMP threads at least, whatever OMP_NUM_THREADS says: one thread
 * starts no team, and the tests would prove nothing. */
static void skip_on_one_thread(void) {
    if (omp_get_max_threads() < 2) omp_set_num_threads(2);
}

static void products_start_no_threads(void **state) {
    (void)state;
    skip_on_one_thread();
    /* on OpenBLAS: oneDNN, where it takes f32 products, calls from no region */
    char previous[16];
    snprintf(previous, sizeof previous, "%s", fl_cpu_gemm_chosen());
    assert_int_equal(fl_cpu_gemm_use("openblas"), FL_OK);
    int started = threads_started(transposed_product, NULL, 8);
    assert_int_equal(fl_cpu_gemm_use(previous), FL_OK);
    assert_int_equal(started, 0);
}

static void convolutions_start_no_threads(void **state) {
    (void)state;
    skip_on_one_thread();
    assert_int_equal(threads_started(one_image_convolution, NULL, 4), 0);
}

/* The counter sees the threads libgomp starts: the team of a region
 * inside a region of one thread, the pattern the Note forbids, is made
 * afresh each time. */
static void the_counter_counts(void **state) {
    (void)state;
    skip_on_one_thread();
    int before = atomic_load(&created);
    atomic_int ran = 0; /* a body with an effect: an empty region may be left out */
    for (int i = 0; i < 3; i++) {
        volatile int one = 0; /* not known when compiled: a real region */
#pragma omp parallel if (one)
        {
#pragma omp parallel num_threads(2)
            atomic_fetch_add(&ran, 1);
        }
    }
    assert_int_equal(atomic_load(&ran), 6);
    assert_true(atomic_load(&created) - before >= 3);
}

int fl_test_threads(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_counter_counts),
        cmocka_unit_test(products_start_no_threads),
        cmocka_unit_test(convolutions_start_no_threads),
    };
    return cmocka_run_group_tests_name("threads", tests, NULL, NULL);
}
