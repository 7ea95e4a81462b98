/*
 * optim_kernel.c: the operand checks and the chunked f32 driver shared by
 * the fused optimizer updates (see optim_kernel.h).
 */
#include "optim_kernel.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Elements per chunk: the scratch arrays of all operands (5 x 4 KiB) stay
 * in L1, and a chunk is enough work to amortise the conversions. */
enum { CHUNK = FL_OPTIM_CHUNK };
/* Below this many elements threads cost more than they save. */
enum { PARALLEL_MIN = 1 << 16 };

static bool is_update_dtype(fl_dtype d) {
    return d == FL_F32 || d == FL_BF16 || d == FL_F16;
}

static bool is_metadata_only(const fl_tensor *t) {
    return fl_device_kind_of(t->device) == FL_DEVICE_META || (t->flags & FL_TENSOR_FAKE);
}

static int check_operand(const char *op, const fl_optim_operand *o, const fl_tensor *param) {
    const fl_tensor *t = o->t;
    char s[128], ps[128], dev[32], pdev[32];
    fl_shape_str(t, s, sizeof s);
    fl_shape_str(param, ps, sizeof ps);
    if (t->device != param->device) {
        fl_device_format(t->device, dev, sizeof dev);
        fl_device_format(param->device, pdev, sizeof pdev);
        return fl_fail(FL_ERR_ARG, "%s: %s is on %s but param is on %s", op, o->name, dev, pdev);
    }
    if (t->numel != param->numel)
        return fl_fail(FL_ERR_ARG, "%s: %s has %lld elements (shape %s) but param has %lld (shape %s)",
                       op, o->name, (long long)t->numel, s, (long long)param->numel, ps);
    /* Any of f32, bf16, f16 for any operand: the loop reads each through
     * f32 scratch. A low-precision gradient of an f32 parameter is what
     * sharded units keep with keep_low_precision_grads. */
    if (!is_update_dtype(t->dtype)) {
        return fl_fail(FL_ERR_ARG, "%s: %s has dtype %s; supported are f32, bf16 and f16", op,
                       o->name, fl_dtype_name(t->dtype));
    }
    if (!fl_tensor_is_contiguous(t))
        return fl_fail(FL_ERR_ARG, "%s: %s of shape %s is not contiguous; fused updates need dense "
                       "tensors (call contiguous() first)", op, o->name, s);
    return FL_OK;
}

/* Two operands over the same bytes would make the update order-dependent
 * (and break the no-alias assumption of the inner loops). */
static int check_overlap(const char *op, int n, const fl_optim_operand *ops) {
    for (int a = 0; a < n; a++) {
        if (!ops[a].t) continue;
        const char *a0 = ops[a].t->data;
        const char *a1 = a0 + ops[a].t->numel * (int64_t)fl_dtype_size(ops[a].t->dtype);
        for (int b = a + 1; b < n; b++) {
            if (!ops[b].t) continue;
            const char *b0 = ops[b].t->data;
            const char *b1 = b0 + ops[b].t->numel * (int64_t)fl_dtype_size(ops[b].t->dtype);
            if (a0 < b1 && b0 < a1 && a0 != a1 && b0 != b1)
                return fl_fail(FL_ERR_ARG, "%s: %s and %s share memory; each operand needs its own",
                               op, ops[a].name, ops[b].name);
        }
    }
    return FL_OK;
}

int fl_optim_check_lr(const char *op, double lr, double weight_decay) {
    if (!(lr >= 0) || isinf(lr)) return fl_fail(FL_ERR_ARG, "%s: lr must be >= 0 and finite, got %g", op, lr);
    if (!(weight_decay >= 0) || isinf(weight_decay))
        return fl_fail(FL_ERR_ARG, "%s: weight_decay must be >= 0 and finite, got %g", op, weight_decay);
    return FL_OK;
}

/* The checks of one operand set that need no storage: present param and
 * grad, supported dtypes, one device, equal sizes, dense. `label` names
 * the op (and, in a multi-tensor call, the set) in messages. *metadata_only:
 * some operand is meta or fake, so there are no values to update. */
static int check_set(const char *label, int n, const fl_optim_operand *ops, bool *metadata_only) {
    const fl_tensor *param = ops[0].t;
    if (!param) return fl_fail(FL_ERR_ARG, "%s: param is NULL (freed?)", label);
    if (!ops[1].t) return fl_fail(FL_ERR_ARG, "%s: grad is NULL (freed?)", label);
    if (!is_update_dtype(param->dtype))
        return fl_fail(FL_ERR_ARG, "%s: param has dtype %s; supported are f32, bf16 and f16", label,
                       fl_dtype_name(param->dtype));
    *metadata_only = false;
    for (int k = 0; k < n; k++) {
        if (!ops[k].t) continue;
        if (check_operand(label, &ops[k], param)) return fl_last_status();
        *metadata_only |= is_metadata_only(ops[k].t);
    }
    return FL_OK;
}

/* The storage checks of a set with values: allocated, and no two operands
 * over the same bytes. */
static int check_storage(const char *label, int n, const fl_optim_operand *ops) {
    for (int k = 0; k < n; k++)
        if (ops[k].t && fl_check_tensor(label, ops[k].t, true)) return fl_last_status();
    return check_overlap(label, n, ops);
}

/* The tensors a set moves, into moved (2n at most): every operand read,
 * every one but the gradient written back ([Note: bytes moved]). */
static int moved_of(int n, const fl_optim_operand *ops, const fl_tensor **moved) {
    int n_moved = 0;
    for (int k = 0; k < n; k++) {
        moved[n_moved++] = ops[k].t;
        if (k != 1) moved[n_moved++] = ops[k].t;
    }
    return n_moved;
}

/* The device's optim kernels, NULL on the cpu (the host loops), or an
 * error (NULL with *rc set) for a device without any. */
static const fl_optim_kernels *kernels_for(const char *label, fl_device device, int *rc) {
    const fl_backend *be = fl_backend_of(device);
    const fl_optim_kernels *kernels = be ? be->optim : NULL;
    *rc = FL_OK;
    if (!kernels && fl_device_kind_of(device) != FL_DEVICE_CPU) {
        char dev[32];
        fl_device_format(device, dev, sizeof dev);
        *rc = fl_fail(FL_ERR_UNSUPPORTED, "%s: no fused update for device %s%s%s", label, dev,
                      be ? "" : ": ", be ? "" : fl_device_status(fl_device_kind_of(device)));
    }
    return kernels;
}

/* The update of one checked set on the cpu: chunks over OpenMP threads,
 * each handed to `loop` as f32 arrays. */
static void run_host(int n, const fl_optim_operand *ops, fl_optim_loop loop, const void *ctx) {
    fl_dtype dtypes[FL_OPTIM_MAX_OPERANDS] = {0};
    for (int k = 0; k < n; k++) dtypes[k] = ops[k].t ? ops[k].t->dtype : FL_F32;
    int64_t numel = ops[0].t->numel;
    int64_t chunks = (numel + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (numel >= PARALLEL_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t start = c * CHUNK;
        int64_t len = numel - start < CHUNK ? numel - start : CHUNK;
        _Alignas(64) float scratch[FL_OPTIM_MAX_OPERANDS][CHUNK];
        float *x[FL_OPTIM_MAX_OPERANDS] = {0};
        for (int k = 0; k < n; k++) {
            const fl_tensor *t = ops[k].t;
            if (!t) continue;
            char *p = (char *)t->data + start * (int64_t)fl_dtype_size(t->dtype);
            if (t->dtype == FL_F32) {
                x[k] = (float *)p;
            } else {
                fl_convert(scratch[k], FL_F32, p, t->dtype, len);
                x[k] = scratch[k];
            }
        }
        loop(ctx, len, x, dtypes);
        for (int k = 0; k < n; k++) {
            const fl_tensor *t = ops[k].t;
            if (!t || !ops[k].write || t->dtype == FL_F32) continue;
            char *p = (char *)t->data + start * (int64_t)fl_dtype_size(t->dtype);
            fl_convert(p, t->dtype, scratch[k], FL_F32, len);
        }
    }
}

int fl_optim_run(const char *op, int n, const fl_optim_operand *ops, fl_optim_loop loop,
                 fl_optim_kind kind, const void *ctx) {
    FL_ASSERT(n >= 2 && n <= FL_OPTIM_MAX_OPERANDS);
    bool metadata_only;
    if (check_set(op, n, ops, &metadata_only)) return fl_last_status();
    const fl_tensor *moved[2 * FL_OPTIM_MAX_OPERANDS];
    fl_count_bytes(op, moved_of(n, ops, moved), moved);
    if (metadata_only) return FL_OK;
    /* The device's kernel, or the host loops on the cpu. */
    int rc;
    const fl_optim_kernels *kernels = kernels_for(op, ops[0].t->device, &rc);
    if (rc) return rc;
    if (check_storage(op, n, ops)) return fl_last_status();
    if (kernels) return kernels->update(op, kind, ctx, n, ops);
    run_host(n, ops, loop, ctx);
    return FL_OK;
}

/* One operand's bytes in a multi-tensor call, for the overlap check. */
typedef struct span {
    const char *lo, *hi;
    int set, k;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* No two operands of different sets over the same bytes: one kernel
 * updates all sets at once, so an overlap would make the result depend on
 * the order of the threads (the sets' own operands are checked by
 * check_overlap, with its message). Sorted by start, a span overlaps an
 * earlier one iff it starts before the furthest end seen. */
static int check_overlap_sets(const char *op, int count, int n, const fl_optim_operand *ops,
                              const bool *skip) {
    span *s = malloc((size_t)count * (size_t)n * sizeof *s);
    if (!s) return fl_fail(FL_ERR_OOM, "%s: no host memory to check %d tensors for overlap", op, count);
    int m = 0;
    for (int i = 0; i < count; i++) {
        if (skip[i]) continue;
        for (int k = 0; k < n; k++) {
            const fl_tensor *t = ops[i * n + k].t;
            if (!t || t->numel == 0) continue;
            const char *lo = t->data;
            s[m++] = (span){lo, lo + t->numel * (int64_t)fl_dtype_size(t->dtype), i, k};
        }
    }
    qsort(s, (size_t)m, sizeof *s, span_cmp);
    int far = 0, rc = FL_OK;
    for (int j = 1; j < m && rc == FL_OK; j++) {
        if (s[j].lo < s[far].hi && s[j].set != s[far].set) {
            const span *a = s[far].set < s[j].set ? &s[far] : &s[j], *b = a == &s[far] ? &s[j] : &s[far];
            rc = fl_fail(FL_ERR_ARG, "%s: tensor %d's %s and tensor %d's %s share memory; each operand "
                         "needs its own", op, a->set, ops[a->set * n + a->k].name, b->set,
                         ops[b->set * n + b->k].name);
        }
        if (s[j].hi > s[far].hi) far = j;
    }
    free(s);
    return rc;
}

int fl_optim_run_multi(const char *op, int count, int n, const fl_optim_operand *ops,
                       fl_optim_loop loop, fl_optim_kind kind, const void *ctx) {
    FL_ASSERT(n >= 2 && n <= FL_OPTIM_MAX_OPERANDS);
    if (count < 0) return fl_fail(FL_ERR_ARG, "%s: %d tensors; the count must be >= 0", op, count);
    if (count == 0) return FL_OK;
    if (!ops) return fl_fail(FL_ERR_ARG, "%s: %d tensors but the arrays are NULL", op, count);
    /* Every set checked (naming its index) before anything is counted or
     * run, so a bad tensor leaves all of them as they were. */
    bool *skip = calloc((size_t)count, sizeof *skip);
    const fl_tensor **moved = malloc((size_t)count * 2 * (size_t)n * sizeof *moved);
    fl_optim_operand *real = malloc((size_t)count * (size_t)n * sizeof *real);
    int rc = FL_OK, n_moved = 0, n_real = 0;
    if (!skip || !moved || !real)
        rc = fl_fail(FL_ERR_OOM, "%s: no host memory for the operands of %d tensors", op, count);
    char label[96];
    fl_device device = 0;
    for (int i = 0; i < count && rc == FL_OK; i++) {
        const fl_optim_operand *set = ops + (size_t)i * n;
        snprintf(label, sizeof label, "%s: tensor %d", op, i);
        if ((rc = check_set(label, n, set, &skip[i]))) break;
        if (i == 0) device = set[0].t->device;
        if (set[0].t->device != device) {
            char d[32], d0[32];
            fl_device_format(set[0].t->device, d, sizeof d);
            fl_device_format(device, d0, sizeof d0);
            rc = fl_fail(FL_ERR_ARG, "%s: param is on %s but tensor 0's is on %s; one call updates "
                         "tensors of one device", label, d, d0);
            break;
        }
        n_moved += moved_of(n, set, moved + n_moved);
    }
    const fl_optim_kernels *kernels = NULL;
    if (rc == FL_OK) {
        /* One count for the call: the kernel moves all sets' bytes. */
        fl_count_bytes(op, n_moved, moved);
        bool all_meta = true;
        for (int i = 0; i < count; i++) all_meta &= skip[i];
        if (!all_meta) kernels = kernels_for(op, device, &rc);
        for (int i = 0; i < count && rc == FL_OK && !all_meta; i++) {
            if (skip[i]) continue;
            snprintf(label, sizeof label, "%s: tensor %d", op, i);
            rc = check_storage(label, n, ops + (size_t)i * n);
        }
        if (rc == FL_OK && !all_meta) rc = check_overlap_sets(op, count, n, ops, skip);
    }
    if (rc == FL_OK) {
        for (int i = 0; i < count; i++)
            if (!skip[i] && ops[(size_t)i * n].t->numel > 0)
                memcpy(real + (size_t)n_real++ * n, ops + (size_t)i * n, (size_t)n * sizeof *real);
        if (n_real > 0 && kernels && kernels->update_multi) {
            rc = kernels->update_multi(op, kind, ctx, n_real, n, real);
        } else {
            for (int i = 0; i < n_real && rc == FL_OK; i++) {
                const fl_optim_operand *set = real + (size_t)i * n;
                if (kernels) rc = kernels->update(op, kind, ctx, n, set);
                else run_host(n, set, loop, ctx);
            }
        }
    }
    free(skip);
    free(moved);
    free(real);
    return rc;
}
