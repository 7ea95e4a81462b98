/*
 * test_optim.c: tests of the fused optimizer updates and norm kernels of
 * core/optim/ through the public API. Each optimizer runs several steps on
 * small tensors (sizes that are not a multiple of the kernels' chunk, and
 * one large enough for the threaded path) against a straightforward
 * double-precision implementation of the PyTorch formula written here;
 * AnyPrecisionAdamW's Kahan summation is checked by what it is for (bf16
 * params following an update too small for bf16); the errors name the
 * optimizer and the operand at fault.
 */
#include "fl_tests.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

/* ---- helpers -------------------------------------------------------------- */

/* Deterministic values in [-1, 1) without the library's generator, so the
 * references do not depend on what they test. */
static double lcg(uint64_t *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*state >> 11) / (double)(1ULL << 52) - 1.0;
}

static fl_tensor *vec(int64_t n, fl_dtype dtype, const double *values) {
    fl_tensor *t = fl_from_host(1, &n, dtype, CPU, values, FL_F64, n);
    if (!t) fail_msg("fl_from_host: %s", fl_last_error());
    return t;
}

static fl_tensor *zeros(int64_t n, fl_dtype dtype) {
    fl_tensor *t = fl_zeros(1, &n, dtype, CPU);
    if (!t) fail_msg("fl_zeros: %s", fl_last_error());
    return t;
}

static double *read_all(const fl_tensor *t) {
    double *out = malloc((size_t)t->numel * sizeof *out);
    if (fl_to_host(t, out, FL_F64, t->numel) != FL_OK) fail_msg("fl_to_host: %s", fl_last_error());
    return out;
}

/* Every element of t within rel * |want| + abs of want. */
static void assert_close_all(const fl_tensor *t, const double *want, double rel, double abs_tol,
                             const char *what) {
    double *got = read_all(t);
    for (int64_t i = 0; i < t->numel; i++) {
        double tol = rel * fabs(want[i]) + abs_tol;
        if (!(fabs(got[i] - want[i]) <= tol))
            fail_msg("%s[%lld] = %.9g, reference %.9g (tolerance %.3g)", what, (long long)i, got[i],
                     want[i], tol);
    }
    free(got);
}

static void random_values(double *x, int64_t n, uint64_t *state, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * lcg(state);
}

/* ---- AdamW ------------------------------------------------------------------ */

typedef struct adamw_ref {
    double lr, beta1, beta2, eps, wd;
} adamw_ref;

/* torch.optim.AdamW (single tensor) in double. */
static void adamw_reference(const adamw_ref *h, int64_t step, int64_t n, double *p,
                            const double *g, double *m, double *v) {
    double bc1 = 1 - pow(h->beta1, (double)step), bc2 = 1 - pow(h->beta2, (double)step);
    for (int64_t i = 0; i < n; i++) {
        p[i] *= 1 - h->lr * h->wd;
        m[i] = h->beta1 * m[i] + (1 - h->beta1) * g[i];
        v[i] = h->beta2 * v[i] + (1 - h->beta2) * g[i] * g[i];
        double m_hat = m[i] / bc1, v_hat = v[i] / bc2;
        p[i] -= h->lr * (m_hat / (sqrt(v_hat) + h->eps));
    }
}

static void run_adamw_case(int64_t n, const adamw_ref *h, int steps) {
    uint64_t rng = 42 + (uint64_t)n;
    double *p = malloc((size_t)n * sizeof *p), *g = malloc((size_t)n * sizeof *g);
    double *m = calloc((size_t)n, sizeof *m), *v = calloc((size_t)n, sizeof *v);
    random_values(p, n, &rng, 1.0);
    fl_tensor *tp = vec(n, FL_F32, p), *tm = zeros(n, FL_F32), *tv = zeros(n, FL_F32);
    for (int64_t i = 0; i < n; i++) p[i] = (float)p[i]; /* the reference starts from f32 values */
    for (int s = 1; s <= steps; s++) {
        random_values(g, n, &rng, 0.5);
        fl_tensor *tg = vec(n, FL_F32, g);
        for (int64_t i = 0; i < n; i++) g[i] = (float)g[i];
        fl_adamw_options o = {h->lr, h->beta1, h->beta2, h->eps, h->wd, s};
        assert_int_equal(fl_adamw_step_(tp, tg, tm, tv, &o), FL_OK);
        adamw_reference(h, s, n, p, g, m, v);
        fl_tensor_release(tg);
    }
    assert_close_all(tp, p, 1e-5, 1e-6, "adamw param");
    assert_close_all(tm, m, 1e-5, 1e-7, "adamw exp_avg");
    assert_close_all(tv, v, 1e-5, 1e-9, "adamw exp_avg_sq");
    fl_tensor_release(tp);
    fl_tensor_release(tm);
    fl_tensor_release(tv);
    free(p), free(g), free(m), free(v);
}

static void test_adamw_matches_reference(void **state) {
    (void)state;
    adamw_ref h = {1e-2, 0.9, 0.999, 1e-8, 0.1};
    run_adamw_case(37, &h, 6);
    adamw_ref torch_defaults = {1e-3, 0.9, 0.999, 1e-8, 1e-2};
    run_adamw_case(1, &torch_defaults, 3);
    adamw_ref llama = {3e-4, 0.9, 0.95, 1e-8, 0.1};
    run_adamw_case(2049, &llama, 4);
    /* beta1 < 0.5 takes lerp's other branch */
    adamw_ref low_beta = {1e-2, 0.3, 0.9, 1e-6, 0};
    run_adamw_case(17, &low_beta, 3);
}

static void test_adamw_threaded_path(void **state) {
    (void)state;
    adamw_ref h = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    run_adamw_case((1 << 17) + 123, &h, 3);
}

/* bf16 params and grads: f32 math, one rounding per step; within one bf16
 * spacing of a reference that rounds the param to bf16 after each step. */
static void test_adamw_bf16_param(void **state) {
    (void)state;
    int64_t n = 301;
    uint64_t rng = 7;
    double p[301], g[301], m[301] = {0}, v[301] = {0};
    random_values(p, n, &rng, 2.0);
    fl_tensor *tp = vec(n, FL_BF16, p), *tm = zeros(n, FL_F32), *tv = zeros(n, FL_F32);
    for (int64_t i = 0; i < n; i++) p[i] = fl_bf16_to_f32(fl_f32_to_bf16((float)p[i]));
    adamw_ref h = {1e-2, 0.9, 0.999, 1e-8, 0.1};
    for (int s = 1; s <= 4; s++) {
        random_values(g, n, &rng, 1.0);
        fl_tensor *tg = vec(n, FL_BF16, g);
        for (int64_t i = 0; i < n; i++) g[i] = fl_bf16_to_f32(fl_f32_to_bf16((float)g[i]));
        fl_adamw_options o = {h.lr, h.beta1, h.beta2, h.eps, h.wd, s};
        assert_int_equal(fl_adamw_step_(tp, tg, tm, tv, &o), FL_OK);
        adamw_reference(&h, s, n, p, g, m, v);
        for (int64_t i = 0; i < n; i++) p[i] = fl_bf16_to_f32(fl_f32_to_bf16((float)p[i]));
        fl_tensor_release(tg);
    }
    assert_int_equal(tp->dtype, FL_BF16);
    assert_close_all(tp, p, 1.0 / 128, 1e-6, "adamw bf16 param");
    assert_close_all(tm, m, 1e-5, 1e-7, "adamw exp_avg");
    fl_tensor_release(tp);
    fl_tensor_release(tm);
    fl_tensor_release(tv);
}

/* A flat shard: the state may be 1-d while the param is 2-d (same numel);
 * the grad may be f32 for a bf16 param. */
static void test_adamw_shapes_and_grad_dtype(void **state) {
    (void)state;
    fl_tensor *p = fl_full(SHAPE(3, 4), 1.0, FL_BF16, CPU);
    fl_tensor *g = fl_full(SHAPE(12), 0.5, FL_F32, CPU);
    fl_tensor *m = zeros(12, FL_BF16), *v = zeros(12, FL_F32);
    fl_adamw_options o = {0.25, 0.9, 0.999, 1e-8, 0, 1};
    assert_int_equal(fl_adamw_step_(p, g, m, v, &o), FL_OK);
    /* first step: m_hat = g, v_hat = g^2, update = lr * sign(g) */
    assert_true(fabs(at(p, 5) - 0.75) < 1e-6);
    assert_true(fabs(at(m, 0) - 0.05) < 1e-3);
    fl_tensor_release(p), fl_tensor_release(g), fl_tensor_release(m), fl_tensor_release(v);
}

/* ---- SGD -------------------------------------------------------------------- */

typedef struct sgd_ref {
    double lr, momentum, dampening, wd;
    bool nesterov;
} sgd_ref;

static void sgd_reference(const sgd_ref *h, int64_t step, int64_t n, double *p, const double *g,
                          double *buf) {
    for (int64_t i = 0; i < n; i++) {
        double d = g[i] + h->wd * p[i];
        if (h->momentum != 0) {
            buf[i] = step == 1 ? d : h->momentum * buf[i] + (1 - h->dampening) * d;
            d = h->nesterov ? d + h->momentum * buf[i] : buf[i];
        }
        p[i] -= h->lr * d;
    }
}

static void run_sgd_case(const sgd_ref *h) {
    int64_t n = 1029;
    uint64_t rng = 3;
    double *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g), *b = calloc(n, sizeof *b);
    random_values(p, n, &rng, 1.0);
    fl_tensor *tp = vec(n, FL_F32, p), *tb = zeros(n, FL_F32);
    for (int64_t i = 0; i < n; i++) p[i] = (float)p[i];
    for (int s = 1; s <= 5; s++) {
        random_values(g, n, &rng, 1.0);
        fl_tensor *tg = vec(n, FL_F32, g);
        for (int64_t i = 0; i < n; i++) g[i] = (float)g[i];
        fl_sgd_options o = {h->lr, h->momentum, h->dampening, h->wd, h->nesterov, s};
        assert_int_equal(fl_sgd_step_(tp, tg, h->momentum != 0 ? tb : NULL, &o), FL_OK);
        sgd_reference(h, s, n, p, g, b);
        fl_tensor_release(tg);
    }
    assert_close_all(tp, p, 1e-5, 1e-6, "sgd param");
    if (h->momentum != 0) assert_close_all(tb, b, 1e-5, 1e-6, "sgd momentum_buffer");
    fl_tensor_release(tp), fl_tensor_release(tb);
    free(p), free(g), free(b);
}

static void test_sgd_matches_reference(void **state) {
    (void)state;
    sgd_ref plain = {0.1, 0, 0, 0, false};
    sgd_ref momentum = {0.05, 0.9, 0.1, 1e-3, false};
    sgd_ref nesterov = {0.05, 0.9, 0, 1e-2, true};
    run_sgd_case(&plain);
    run_sgd_case(&momentum);
    run_sgd_case(&nesterov);
}

/* ---- Adadelta ------------------------------------------------------------------ */

static void test_adadelta_matches_reference(void **state) {
    (void)state;
    int64_t n = 515;
    uint64_t rng = 11;
    double lr = 1.0, rho = 0.9, eps = 1e-6, wd = 1e-2;
    double *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
    double *s = calloc(n, sizeof *s), *a = calloc(n, sizeof *a);
    random_values(p, n, &rng, 1.0);
    fl_tensor *tp = vec(n, FL_F32, p), *ts = zeros(n, FL_F32), *ta = zeros(n, FL_F32);
    for (int64_t i = 0; i < n; i++) p[i] = (float)p[i];
    for (int step = 1; step <= 6; step++) {
        random_values(g, n, &rng, 1.0);
        fl_tensor *tg = vec(n, FL_F32, g);
        for (int64_t i = 0; i < n; i++) g[i] = (float)g[i];
        fl_adadelta_options o = {lr, rho, eps, wd};
        assert_int_equal(fl_adadelta_step_(tp, tg, ts, ta, &o), FL_OK);
        for (int64_t i = 0; i < n; i++) {
            double d = g[i] + wd * p[i];
            s[i] = rho * s[i] + (1 - rho) * d * d;
            double delta = sqrt(a[i] + eps) / sqrt(s[i] + eps) * d;
            a[i] = rho * a[i] + (1 - rho) * delta * delta;
            p[i] -= lr * delta;
        }
        fl_tensor_release(tg);
    }
    assert_close_all(tp, p, 1e-5, 1e-6, "adadelta param");
    assert_close_all(ts, s, 1e-5, 1e-9, "adadelta square_avg");
    assert_close_all(ta, a, 1e-4, 1e-10, "adadelta acc_delta");
    fl_tensor_release(tp), fl_tensor_release(ts), fl_tensor_release(ta);
    free(p), free(g), free(s), free(a);
}

/* ---- AnyPrecisionAdamW ----------------------------------------------------------- */

/* f32 states, no compensation: the torchdistx formula in double. */
static void test_anyprecision_f32_matches_reference(void **state) {
    (void)state;
    int64_t n = 77;
    uint64_t rng = 5;
    double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.05;
    double p[77], g[77], m[77] = {0}, v[77] = {0};
    random_values(p, n, &rng, 1.0);
    fl_tensor *tp = vec(n, FL_F32, p), *tm = zeros(n, FL_F32), *tv = zeros(n, FL_F32);
    for (int64_t i = 0; i < n; i++) p[i] = (float)p[i];
    for (int s = 1; s <= 5; s++) {
        random_values(g, n, &rng, 1.0);
        fl_tensor *tg = vec(n, FL_F32, g);
        for (int64_t i = 0; i < n; i++) g[i] = (float)g[i];
        fl_adamw_options o = {lr, b1, b2, eps, wd, s};
        assert_int_equal(fl_anyprecision_adamw_step_(tp, tg, tm, tv, NULL, &o), FL_OK);
        double step_size = lr / (1 - pow(b1, s)), dc = sqrt(1 - pow(b2, s));
        for (int64_t i = 0; i < n; i++) {
            p[i] *= 1 - lr * wd;
            m[i] = m[i] * b1 + (1 - b1) * g[i];
            v[i] = v[i] * b2 + (1 - b2) * g[i] * g[i];
            p[i] -= step_size * m[i] / (sqrt(v[i]) / dc + eps);
        }
        fl_tensor_release(tg);
    }
    assert_close_all(tp, p, 1e-5, 1e-6, "anyprecision param");
    assert_close_all(tm, m, 1e-5, 1e-7, "anyprecision exp_avg");
    fl_tensor_release(tp), fl_tensor_release(tm), fl_tensor_release(tv);
}

/* bf16 param at 1.0 (spacing 2^-8 below) with steps of 1e-4: alone each
 * step rounds away; with Kahan the param follows the trajectory of an f32
 * param (given the same bf16 moments) to within one bf16 spacing, and
 * param + compensation follows it closely. The same for weight decay alone
 * (zero grads): lr * wd = 1e-4 per step, which torchdistx's bf16 multiply
 * would lose entirely. */
static void test_anyprecision_kahan_bf16(void **state) {
    (void)state;
    int64_t n = 64;
    int steps = 100;
    double lr = 1e-4;
    for (int decay_only = 0; decay_only <= 1; decay_only++) {
        fl_tensor *p_plain = fl_full(SHAPE(64), 1.0, FL_BF16, CPU);
        fl_tensor *p_kahan = fl_full(SHAPE(64), 1.0, FL_BF16, CPU);
        fl_tensor *p_f32 = fl_full(SHAPE(64), 1.0, FL_F32, CPU);
        double gv = decay_only ? 0.0 : 0.3;
        fl_tensor *g = fl_full(SHAPE(64), gv, FL_BF16, CPU);
        fl_tensor *g32 = fl_full(SHAPE(64), fl_bf16_to_f32(fl_f32_to_bf16((float)gv)), FL_F32, CPU);
        fl_tensor *st[6];
        for (int k = 0; k < 6; k++) st[k] = zeros(n, FL_BF16);
        fl_tensor *comp = zeros(n, FL_BF16);
        for (int s = 1; s <= steps; s++) {
            fl_adamw_options o = {lr, 0.9, 0.999, 1e-8, decay_only ? 1.0 : 0.0, s};
            assert_int_equal(fl_anyprecision_adamw_step_(p_plain, g, st[0], st[1], NULL, &o), FL_OK);
            assert_int_equal(fl_anyprecision_adamw_step_(p_kahan, g, st[2], st[3], comp, &o), FL_OK);
            assert_int_equal(fl_anyprecision_adamw_step_(p_f32, g32, st[4], st[5], NULL, &o), FL_OK);
        }
        double f32 = at(p_f32, 0);
        double want = decay_only ? pow(1 - lr, steps) : 1 - steps * lr;
        assert_true(fabs(f32 - want) < (decay_only ? 1e-5 : 5e-4)); /* bf16 moments drift */
        assert_true(at(p_plain, 0) == 1.0);                         /* every step rounded away */
        assert_true(at(p_plain, 0) - f32 > 0.009);
        assert_true(fabs(at(p_kahan, 63) - f32) <= 1.0 / 256);     /* one bf16 spacing */
        /* (the bf16 compensation rounds too: ~4e-6 per step at most) */
        if (!(fabs(at(p_kahan, 7) + at(comp, 7) - f32) < 5e-5))
            fail_msg("decay_only %d: kahan %.9g + compensation %.9g vs f32 %.9g", decay_only,
                     at(p_kahan, 7), at(comp, 7), f32);
        fl_tensor_release(p_plain), fl_tensor_release(p_kahan), fl_tensor_release(p_f32);
        fl_tensor_release(g), fl_tensor_release(g32), fl_tensor_release(comp);
        for (int k = 0; k < 6; k++) fl_tensor_release(st[k]);
    }
}

/* ---- errors and devices -------------------------------------------------------------- */

static void test_errors_name_optimizer_and_operand(void **state) {
    (void)state;
    fl_tensor *p = fl_zeros(SHAPE(4, 4), FL_F32, CPU);
    fl_tensor *g = fl_zeros(SHAPE(4, 4), FL_F32, CPU);
    fl_tensor *m = fl_zeros(SHAPE(3, 4), FL_F32, CPU);
    fl_tensor *v = fl_zeros(SHAPE(16), FL_F32, CPU);
    fl_adamw_options o = {1e-3, 0.9, 0.999, 1e-8, 0.01, 1};
    assert_int_equal(fl_adamw_step_(p, g, m, v, &o), FL_ERR_ARG);
    assert_error_mentions("adamw: exp_avg has 12 elements (shape [3, 4])", "param has 16 (shape [4, 4])");

    fl_tensor *p64 = fl_zeros(SHAPE(16), FL_F64, CPU);
    assert_int_equal(fl_adamw_step_(p64, g, v, v, &o), FL_ERR_ARG);
    assert_error_mentions("adamw: param has dtype f64", "f32, bf16 and f16");

    fl_tensor *gi = fl_zeros(SHAPE(16), FL_I32, CPU);
    assert_int_equal(fl_adamw_step_(p, gi, g, v, &o), FL_ERR_ARG);
    assert_error_mentions("adamw: grad has dtype i32", "f32, bf16 and f16");

    fl_tensor *gt = fl_transpose(g, 0, 1);
    fl_tensor *m2 = fl_zeros(SHAPE(16), FL_F32, CPU);
    assert_int_equal(fl_adamw_step_(p, gt, m2, v, &o), FL_ERR_ARG);
    assert_error_mentions("adamw: grad of shape [4, 4] is not contiguous", NULL);

    assert_int_equal(fl_adamw_step_(p, g, v, v, &o), FL_ERR_ARG);
    assert_error_mentions("adamw: exp_avg and exp_avg_sq share memory", NULL);

    fl_adamw_options bad = o;
    bad.beta2 = 1.0;
    assert_int_equal(fl_adamw_step_(p, g, m2, v, &bad), FL_ERR_ARG);
    assert_error_mentions("adamw: betas must be in [0, 1)", NULL);
    bad = o;
    bad.step = 0;
    assert_int_equal(fl_anyprecision_adamw_step_(p, g, m2, v, NULL, &bad), FL_ERR_ARG);
    assert_error_mentions("anyprecision_adamw: step must be >= 1", NULL);
    bad = o;
    bad.lr = -1;
    assert_int_equal(fl_adamw_step_(p, g, m2, v, &bad), FL_ERR_ARG);
    assert_error_mentions("adamw: lr must be >= 0", NULL);

    fl_sgd_options so = {0.1, 0.9, 0.1, 0, true, 1};
    assert_int_equal(fl_sgd_step_(p, g, v, &so), FL_ERR_ARG);
    assert_error_mentions("sgd: nesterov momentum requires momentum > 0 and zero dampening", NULL);
    so.nesterov = false;
    assert_int_equal(fl_sgd_step_(p, g, NULL, &so), FL_ERR_ARG);
    assert_error_mentions("sgd: momentum 0.9 needs a momentum_buffer", NULL);
    fl_adadelta_options ao = {1.0, 1.5, 1e-6, 0};
    assert_int_equal(fl_adadelta_step_(p, g, m2, v, &ao), FL_ERR_ARG);
    assert_error_mentions("adadelta: rho must be in [0, 1]", NULL);
    assert_int_equal(fl_adamw_step_(p, NULL, m2, v, &o), FL_ERR_ARG);
    assert_error_mentions("adamw: grad is NULL", NULL);

    fl_tensor *list[] = {p, g, m, v, p64, gi, gt, m2};
    for (size_t k = 0; k < sizeof list / sizeof list[0]; k++) fl_tensor_release(list[k]);
}

/* Meta operands: checked, nothing computed, nothing allocated. */
static void test_meta_is_checked_and_left_alone(void **state) {
    (void)state;
    fl_memory_stats before, after;
    fl_memory_stats_get(CPU, &before);
    fl_tensor *p = fl_empty(SHAPE(8192, 8192), FL_BF16, META);
    fl_tensor *g = fl_empty(SHAPE(8192, 8192), FL_BF16, META);
    fl_tensor *m = fl_empty(SHAPE(8192 * 8192), FL_F32, META);
    fl_tensor *v = fl_empty(SHAPE(8192 * 8192), FL_F32, META);
    fl_tensor *small = fl_empty(SHAPE(8192), FL_F32, META);
    fl_adamw_options o = {1e-3, 0.9, 0.999, 1e-8, 0.01, 1};
    assert_int_equal(fl_adamw_step_(p, g, m, v, &o), FL_OK);
    assert_int_equal(fl_adamw_step_(p, g, small, v, &o), FL_ERR_ARG);
    assert_error_mentions("adamw: exp_avg has 8192 elements", NULL);
    assert_int_equal(fl_grad_scale_(g, 0.5), FL_OK);
    double sq = -1;
    assert_int_equal(fl_grad_sq_norm(g, &sq), FL_ERR_STATE);
    assert_error_mentions("grad_sq_norm", "meta device");
    fl_memory_stats_get(CPU, &after);
    assert_int_equal(after.allocations, before.allocations);
    fl_tensor *cpu = fl_zeros(SHAPE(8192, 8192 / 64), FL_BF16, CPU);
    fl_tensor *cm = fl_zeros(SHAPE(8192 * 8192 / 64), FL_F32, CPU);
    assert_int_equal(fl_adamw_step_(cpu, g, cm, cm, &o), FL_ERR_ARG);
    fl_tensor *list[] = {p, g, m, v, small, cpu, cm};
    for (size_t k = 0; k < sizeof list / sizeof list[0]; k++) fl_tensor_release(list[k]);
}

/* ---- norms ------------------------------------------------------------------------- */

static void test_grad_sq_norm(void **state) {
    (void)state;
    int64_t sizes[] = {0, 1, 7, 4096, 4097, (1 << 17) + 5};
    fl_dtype dtypes[] = {FL_F32, FL_BF16, FL_F16, FL_F64};
    uint64_t rng = 99;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
        random_values(x, n, &rng, 3.0);
        for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
            fl_tensor *t = fl_from_host(1, &n, dtypes[di], CPU, x, FL_F64, n);
            double *stored = read_all(t);
            long double want = 0;
            for (int64_t i = 0; i < n; i++) want += (long double)stored[i] * stored[i];
            double got = -1, again = -2;
            assert_int_equal(fl_grad_sq_norm(t, &got), FL_OK);
            assert_int_equal(fl_grad_sq_norm(t, &again), FL_OK);
            assert_true(got == again); /* deterministic */
            if (!(fabs(got - (double)want) <= 1e-12 * (double)want))
                fail_msg("grad_sq_norm %s n=%lld: %.17g, reference %.17g", fl_dtype_name(dtypes[di]),
                         (long long)n, got, (double)want);
            free(stored);
            fl_tensor_release(t);
        }
        free(x);
    }
    fl_tensor *ints = fl_zeros(SHAPE(3), FL_I64, CPU);
    double out;
    assert_int_equal(fl_grad_sq_norm(ints, &out), FL_ERR_ARG);
    assert_error_mentions("grad_sq_norm: tensor of shape [3] has dtype i64", NULL);
    fl_tensor_release(ints);
}

static void test_grad_scale(void **state) {
    (void)state;
    double x[5] = {1, -2, 3.5, 0.25, 100};
    fl_dtype dtypes[] = {FL_F32, FL_BF16, FL_F64};
    for (size_t di = 0; di < 3; di++) {
        fl_tensor *t = vec(5, dtypes[di], x);
        assert_int_equal(fl_grad_scale_(t, 0.5), FL_OK);
        double want[5];
        for (int i = 0; i < 5; i++) want[i] = x[i] * 0.5;
        assert_close_all(t, want, 0, 0, "grad_scale_");
        fl_tensor_release(t);
    }
    int64_t n = (1 << 17) + 3;
    fl_tensor *big = fl_full(1, &n, 2.0, FL_F32, CPU);
    assert_int_equal(fl_grad_scale_(big, 0.25), FL_OK);
    assert_true(at(big, 0) == 0.5 && at(big, n - 1) == 0.5);
    fl_tensor_release(big);
}

int fl_test_optim(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_adamw_threaded_path),
        cmocka_unit_test(test_adamw_bf16_param),
        cmocka_unit_test(test_adamw_shapes_and_grad_dtype),
        cmocka_unit_test(test_sgd_matches_reference),
        cmocka_unit_test(test_adadelta_matches_reference),
        cmocka_unit_test(test_anyprecision_f32_matches_reference),
        cmocka_unit_test(test_anyprecision_kahan_bf16),
        cmocka_unit_test(test_errors_name_optimizer_and_operand),
        cmocka_unit_test(test_meta_is_checked_and_left_alone),
        cmocka_unit_test(test_grad_sq_norm),
        cmocka_unit_test(test_grad_scale),
    };
    return cmocka_run_group_tests_name("optim", tests, NULL, NULL);
}
