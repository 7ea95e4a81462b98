/*
 * matmul.c: matmul (torch.matmul semantics), linear (y = x @ w^T + b) and
 * their backward, the batched product both are built on (fl_linear_bmm),
 * and the helpers the linear family's op files share.
 *
 * Operands reach the kernel as stack views (headers copied and re-strided,
 * not reference counted): a transpose or a broadcast costs nothing and the
 * kernel decides from the strides whether BLAS can read a matrix in place.
 * Backward of both ops is again made of products: dA = dC @ B^T and
 * dB = A^T @ dC, summed over broadcast batch dims; for linear, whose rows
 * are flattened, dW = dY^T @ X is one product over all rows.
 */
#include "linear.h"
#include "shape.h"
#include "storage.h"
#include "memory.h"
#include "flops.h"
#include "node.h"
#include "op_common.h"

#include <stdatomic.h>
#include <string.h>

const fl_linear_kernels *fl_linear_kernels_of(const char *op, fl_device device) {
    const fl_backend *be = fl_backend_of(device);
    return be && be->linear ? be->linear : fl_no_kernel(op, device);
}

fl_tensor *fl_linear_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                            bool no_storage) {
    return no_storage ? fl_fake(ndim, shape, dtype, device) : fl_empty(ndim, shape, dtype, device);
}

/* A stack copy of t's header without autograd state: kernels see plain
 * data, and nothing they do can touch t's graph. */
static void plain_view(const fl_tensor *t, fl_tensor *v) {
    *v = *t;
    v->grad = NULL;
    v->grad_fn = NULL;
    v->flags &= ~(uint32_t)FL_TENSOR_REQUIRES_GRAD;
}

void fl_linear_swap_view(const fl_tensor *t, int d0, int d1, fl_tensor *v) {
    plain_view(t, v);
    if (d0 < 0) d0 += t->ndim;
    if (d1 < 0) d1 += t->ndim;
    v->shape[d0] = t->shape[d1];
    v->shape[d1] = t->shape[d0];
    v->stride[d0] = t->stride[d1];
    v->stride[d1] = t->stride[d0];
}

int fl_linear_check_same(const char *op, int n, const fl_tensor *const *ts,
                         const char *const *what) {
    const fl_tensor *first = NULL;
    int fi = 0;
    for (int i = 0; i < n; i++) {
        const fl_tensor *t = ts[i];
        if (!t) continue;
        if (!fl_dtype_is_float(t->dtype))
            return fl_fail(FL_ERR_ARG, "%s: %s must be a floating point tensor, got %s", op,
                           what[i], fl_dtype_name(t->dtype));
        if (!first) {
            first = t;
            fi = i;
            continue;
        }
        if (t->device != first->device) {
            char a[32], b[32];
            fl_device_format(first->device, a, sizeof a);
            fl_device_format(t->device, b, sizeof b);
            return fl_fail(FL_ERR_ARG, "%s: %s is on %s but %s is on %s", op, what[fi], a,
                           what[i], b);
        }
        if (t->dtype != first->dtype)
            return fl_fail(FL_ERR_ARG, "%s: %s is %s but %s is %s (convert one with to())", op,
                           what[fi], fl_dtype_name(first->dtype), what[i],
                           fl_dtype_name(t->dtype));
    }
    return FL_OK;
}

/* Run a kernel with grad mode off: kernels may call public functions
 * (fl_to, fl_empty) on plain views, which must never be recorded. */
#define WITHOUT_GRAD(rc, call)                                                                \
    do {                                                                                      \
        bool was_ = fl_set_grad_enabled(false);                                               \
        (rc) = (call);                                                                        \
        fl_set_grad_enabled(was_);                                                            \
    } while (0)

/* ---- the batched product ---------------------------------------------------------- */

/* t seen with `nd` dims and out's batch sizes: broadcast batch dims get
 * stride 0; the matrix dims keep t's. */
static void batch_view(const fl_tensor *t, int nd, const int64_t *shape, fl_tensor *v) {
    plain_view(t, v);
    int shift = nd - t->ndim;
    for (int d = nd - 1; d >= 0; d--) {
        int sd = d - shift;
        if (d >= nd - 2) {
            v->shape[d] = t->shape[sd];
            v->stride[d] = t->stride[sd];
        } else {
            v->shape[d] = shape[d];
            v->stride[d] = sd >= 0 && t->shape[sd] == shape[d] ? t->stride[sd] : 0;
        }
    }
    v->ndim = nd;
    v->numel = 1;
    for (int d = 0; d < nd; d++) v->numel *= v->shape[d];
}

/* [Note: virtual storage] (core/tensor/storage.c): with f32 GEMMs on, a
 * 16-bit product on meta raises the meta peak by what the CPU backend
 * stages for it, as that backend's matmul_scratch reports from the same
 * views its matmul would get (core/cpu/cpu_matmul.c): the f32 result,
 * bias and operand conversions when OpenBLAS runs the product; only the
 * f32 bias and bf16 copies of strided operands when oneDNN takes it
 * ([Note: GEMM libraries], core/cpu/cpu_gemm.c). Both sides decide
 * from dtypes, shapes, strides and the library chosen, never from data,
 * so the plan and the run agree. */
static _Atomic bool meta_f32_gemm;

bool fl_meta_set_f32_gemm(bool on) { return atomic_exchange(&meta_f32_gemm, on); }

static void note_meta_staging(const fl_tensor *va, const fl_tensor *vb, const fl_tensor *vbias,
                              const fl_tensor *vo) {
    if (!atomic_load(&meta_f32_gemm) || fl_device_kind_of(vo->device) != FL_DEVICE_META ||
        fl_dtype_size(vo->dtype) != 2)
        return;
    /* The device a meta trace with f32 GEMMs imitates (fsdp.plan: device
     * 'cpu'), reached through its kernel table like any other. */
    const fl_backend *be = fl_backend_of(fl_device_make(FL_DEVICE_CPU, 0));
    if (!be || !be->linear || !be->linear->matmul_scratch) return;
    fl_memory_note_transient(vo->device, be->linear->matmul_scratch(vo, va, vb, vbias));
}

fl_tensor *fl_linear_bmm(const char *op, const fl_tensor *a, const fl_tensor *b,
                         const fl_tensor *bias, fl_tensor *into) {
    FL_ASSERT(a->ndim >= 2 && b->ndim >= 2);
    char x[128], y[128];
    int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1];
    int64_t kb = b->shape[b->ndim - 2], n = b->shape[b->ndim - 1];
    if (k != kb)
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: shapes %s and %s cannot be multiplied (%lld vs %lld)",
                            op, fl_shape_str(a, x, sizeof x), fl_shape_str(b, y, sizeof y),
                            (long long)k, (long long)kb);
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim, nb = nd - 2;
    int64_t shape[FL_MAX_DIMS];
    for (int d = 0; d < nb; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return FL_FAIL_NULL(FL_ERR_ARG,
                                "%s: batch dims of %s and %s do not broadcast (dim %d: %lld vs %lld)",
                                op, fl_shape_str(a, x, sizeof x), fl_shape_str(b, y, sizeof y), d,
                                (long long)sa, (long long)sb);
        shape[d] = sa == 1 ? sb : sa;
    }
    shape[nb] = m;
    shape[nb + 1] = n;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return FL_FAIL_NULL(FL_ERR_UNSUPPORTED,
                            "%s: %s @ %s: matrix dims of 2^31 or more are not supported", op,
                            fl_shape_str(a, x, sizeof x), fl_shape_str(b, y, sizeof y));
    bool no_storage = !a->storage || !b->storage || (bias && !bias->storage);
    fl_tensor *out;
    if (into) {
        out = fl_tensor_retain(into);
    } else {
        out = fl_linear_output(nd, shape, a->dtype, a->device, no_storage);
        if (!out) return NULL;
    }
    int64_t batch = 1;
    for (int d = 0; d < nb; d++) batch = fl_flops_mul(batch, shape[d]);
    int64_t outputs = fl_flops_mul(batch, fl_flops_mul(m, n));
    fl_flops_add(fl_flops_sum(fl_flops_mul(fl_flops_mul(2, outputs), k), bias ? outputs : 0));
    fl_tensor va, vb, vo;
    batch_view(a, nd, shape, &va);
    batch_view(b, nd, shape, &vb);
    /* `into` may have another shape with the same elements (x-shaped
     * gradients of linear): the kernel sees it as [batch..., m, n]. */
    plain_view(out, &vo);
    vo.ndim = nd;
    memcpy(vo.shape, shape, sizeof shape);
    fl_contiguous_strides(nd, vo.shape, vo.stride);
    fl_tensor vbias;
    if (bias) plain_view(bias, &vbias);
    if (no_storage || !out->storage) {
        note_meta_staging(&va, &vb, bias ? &vbias : NULL, &vo);
        return out;
    }
    FL_ASSERT(fl_tensor_is_contiguous(out) && out->numel == batch * m * n);
    const fl_linear_kernels *kern = fl_linear_kernels_of(op, out->device);
    int rc = FL_ERR_UNSUPPORTED;
    if (kern) WITHOUT_GRAD(rc, kern->matmul(&vo, &va, &vb, bias ? &vbias : NULL));
    if (rc != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

/* ---- flattening rows --------------------------------------------------------------- */

/* t [..., c] as a 2-d [rows, c] view when its leading dims are evenly
 * spaced (always for contiguous tensors); false otherwise. */
static bool rows_view(const fl_tensor *t, fl_tensor *v) {
    int nd = t->ndim;
    int64_t c = nd ? t->shape[nd - 1] : 1, rows = 1, inner = -1, expect = 0;
    for (int d = nd - 2; d >= 0; d--) {
        int64_t size = t->shape[d];
        rows *= size;
        /* Without values (meta, or no elements at all) only shapes matter. */
        if (size == 1 || !t->storage || t->numel == 0) continue;
        if (inner < 0) inner = t->stride[d];
        else if (t->stride[d] != expect) return false;
        expect = t->stride[d] * size;
    }
    plain_view(t, v);
    v->ndim = 2;
    v->shape[0] = rows;
    v->shape[1] = c;
    v->stride[0] = inner < 0 ? c : inner;
    v->stride[1] = nd ? t->stride[nd - 1] : 1;
    v->numel = rows * c;
    return true;
}

/* A [rows, c] view of t, through a contiguous copy (*keep, to release by
 * the caller) when t's rows are not evenly spaced. */
static int rows_of(const fl_tensor *t, fl_tensor *v, fl_tensor **keep) {
    *keep = NULL;
    if (rows_view(t, v)) return FL_OK;
    bool was = fl_set_grad_enabled(false);
    *keep = fl_contiguous(t);
    fl_set_grad_enabled(was);
    if (!*keep) return fl_last_status();
    bool ok = rows_view(*keep, v);
    FL_ASSERT(ok);
    return FL_OK;
}

/* ---- matmul -------------------------------------------------------------------------- */

static const fl_node_type matmul_type;

/* a and b as operands of at least 2 dims: a 1-d left operand is a row
 * [1, k], a 1-d right operand a column [k, 1]. */
static void as_matrix(const fl_tensor *t, bool left, fl_tensor *v) {
    plain_view(t, v);
    if (t->ndim != 1) return;
    v->ndim = 2;
    if (left) {
        v->shape[0] = 1;
        v->shape[1] = t->shape[0];
        v->stride[0] = t->shape[0] * t->stride[0];
        v->stride[1] = t->stride[0];
    } else {
        v->shape[0] = t->shape[0];
        v->shape[1] = 1;
        v->stride[0] = t->stride[0];
        v->stride[1] = 1;
    }
}

/* The result's shape: the product's, without the dims 1-d operands added. */
static int result_shape(const fl_tensor *prod, bool a1, bool b1, int64_t *shape) {
    int n = 0;
    for (int d = 0; d < prod->ndim; d++) {
        if (a1 && d == prod->ndim - 2) continue;
        if (b1 && d == prod->ndim - 1) continue;
        shape[n++] = prod->shape[d];
    }
    return n;
}

fl_tensor *fl_matmul(const fl_tensor *a, const fl_tensor *b) {
    const char *op = "matmul";
    if (fl_check_tensor(op, a, false) || fl_check_tensor(op, b, false)) return NULL;
    const fl_tensor *ins[2] = {a, b};
    const char *what[2] = {"the left operand", "the right operand"};
    if (fl_linear_check_same(op, 2, ins, what)) return NULL;
    char x[128], y[128];
    if (a->ndim == 0 || b->ndim == 0)
        return FL_FAIL_NULL(FL_ERR_ARG, "matmul: both operands need at least 1 dim, got shapes %s and %s",
                            fl_shape_str(a, x, sizeof x), fl_shape_str(b, y, sizeof y));
    int64_t k = a->shape[a->ndim - 1], kb = b->shape[b->ndim == 1 ? 0 : b->ndim - 2];
    if (k != kb)
        return FL_FAIL_NULL(FL_ERR_ARG, "matmul: shapes %s and %s cannot be multiplied (%lld vs %lld)",
                            fl_shape_str(a, x, sizeof x), fl_shape_str(b, y, sizeof y),
                            (long long)k, (long long)kb);
    fl_tensor va, vb;
    as_matrix(a, true, &va);
    as_matrix(b, false, &vb);
    fl_tensor *prod = fl_linear_bmm(op, &va, &vb, NULL, NULL);
    if (!prod) return NULL;
    fl_tensor *out = prod;
    if (a->ndim == 1 || b->ndim == 1) {
        int64_t shape[FL_MAX_DIMS];
        int n = result_shape(prod, a->ndim == 1, b->ndim == 1, shape);
        out = fl_view(prod, n, shape); /* prod is fresh and contiguous: never fails on strides */
        fl_tensor_release(prod);
        if (!out) return NULL;
    }
    if (fl_needs_grad(2, ins) && fl_record(&matmul_type, 2, ins, out, 2, ins, NULL) != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

/* g (shape of the result) as the product's shape [batch..., m, n]. */
static fl_tensor *grad_as_product(const fl_tensor *g, bool a1, bool b1) {
    int64_t shape[FL_MAX_DIMS];
    int n = g->ndim;
    memcpy(shape, g->shape, sizeof shape);
    if (b1) shape[n++] = 1;
    if (a1) {
        memmove(shape + n, shape + n - 1, sizeof *shape);
        shape[n - 1] = 1;
        n++;
    }
    return fl_reshape(g, n, shape);
}

/* The gradient of an operand from its product-shaped gradient: summed over
 * the batch dims the operand was broadcast along, in the operand's shape. */
static fl_tensor *to_operand(fl_tensor *g, const fl_tensor *mat, const fl_tensor *operand) {
    if (!g) return NULL;
    fl_tensor *r = g;
    if (g->ndim != mat->ndim || memcmp(g->shape, mat->shape, (size_t)g->ndim * sizeof *g->shape)) {
        r = fl_sum_to(g, mat->ndim, mat->shape);
        fl_tensor_release(g);
        if (!r) return NULL;
    }
    if (operand->ndim != r->ndim) {
        fl_tensor *v = fl_reshape(r, operand->ndim, operand->shape);
        fl_tensor_release(r);
        r = v;
    }
    return r;
}

static int matmul_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const char *op = "matmul backward";
    const fl_tensor *a = node->saved[0], *b = node->saved[1];
    bool a1 = a->ndim == 1, b1 = b->ndim == 1;
    fl_tensor va, vb;
    as_matrix(a, true, &va);
    as_matrix(b, false, &vb);
    fl_tensor *g = grad_as_product(go[0], a1, b1);
    if (!g) return fl_last_status();
    int rc = FL_OK;
    if (fl_node_wants(node, 0)) {
        fl_tensor bt;
        fl_linear_swap_view(&vb, -2, -1, &bt);
        gi[0] = to_operand(fl_linear_bmm(op, g, &bt, NULL, NULL), &va, a);
        if (!gi[0]) rc = fl_last_status();
    }
    if (rc == FL_OK && fl_node_wants(node, 1)) {
        fl_tensor at, ar, gr;
        fl_tensor *keep_a = NULL, *keep_g = NULL;
        if (vb.ndim == 2 && va.ndim > 2) {
            /* b was one matrix for the whole batch: dB = A^T @ dC over all
             * rows of the batch at once, one product instead of a batch of
             * products and a sum. */
            rc = rows_of(&va, &ar, &keep_a);
            if (rc == FL_OK) rc = rows_of(g, &gr, &keep_g);
            if (rc == FL_OK) {
                fl_linear_swap_view(&ar, 0, 1, &at);
                gi[1] = to_operand(fl_linear_bmm(op, &at, &gr, NULL, NULL), &vb, b);
            }
        } else {
            fl_linear_swap_view(&va, -2, -1, &at);
            gi[1] = to_operand(fl_linear_bmm(op, &at, g, NULL, NULL), &vb, b);
        }
        fl_tensor_release(keep_a);
        fl_tensor_release(keep_g);
        if (rc == FL_OK && !gi[1]) rc = fl_last_status();
    }
    fl_tensor_release(g);
    return rc;
}

static const fl_node_type matmul_type = {.name = "MatmulBackward", .backward = matmul_backward};

/* ---- linear ---------------------------------------------------------------------------- */

static const fl_node_type linear_type;

fl_tensor *fl_linear(const fl_tensor *x, const fl_tensor *w, const fl_tensor *bias) {
    const char *op = "linear";
    if (fl_check_tensor(op, x, false) || fl_check_tensor(op, w, false)) return NULL;
    const fl_tensor *ins[3] = {x, w, bias};
    const char *what[3] = {"input", "weight", "bias"};
    if (fl_linear_check_same(op, 3, ins, what)) return NULL;
    char s[128], t[128];
    if (w->ndim != 2)
        return FL_FAIL_NULL(FL_ERR_ARG, "linear: weight must be 2-d [out, in], got shape %s",
                            fl_shape_str(w, s, sizeof s));
    if (x->ndim == 0)
        return FL_FAIL_NULL(FL_ERR_ARG, "linear: input must have at least 1 dim, got a 0-d tensor");
    int64_t fout = w->shape[0], fin = w->shape[1];
    if (x->shape[x->ndim - 1] != fin)
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "linear: input of shape %s does not match weight of shape %s (last dim "
                            "%lld vs %lld in-features)",
                            fl_shape_str(x, s, sizeof s), fl_shape_str(w, t, sizeof t),
                            (long long)x->shape[x->ndim - 1], (long long)fin);
    if (bias && (bias->ndim != 1 || bias->shape[0] != fout))
        return FL_FAIL_NULL(FL_ERR_ARG,
                            "linear: bias of shape %s does not match weight of shape %s (expected [%lld])",
                            fl_shape_str(bias, s, sizeof s), fl_shape_str(w, t, sizeof t),
                            (long long)fout);
    int64_t shape[FL_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = fout;
    bool no_storage = !x->storage || !w->storage || (bias && !bias->storage);
    fl_tensor *out = fl_linear_output(x->ndim, shape, x->dtype, x->device, no_storage);
    if (!out) return NULL;
    fl_tensor xr, wt, *keep = NULL;
    int rc = rows_of(x, &xr, &keep);
    fl_linear_swap_view(w, 0, 1, &wt);
    fl_tensor *r = rc == FL_OK ? fl_linear_bmm(op, &xr, &wt, bias, out) : NULL;
    fl_tensor_release(keep);
    fl_tensor_release(r);
    if (!r) {
        fl_tensor_release(out);
        return NULL;
    }
    if (fl_needs_grad(3, ins) && fl_record(&linear_type, 3, ins, out, 2, ins, NULL) != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

/* Sum of g [rows, n] over its rows: the bias gradient. */
static fl_tensor *sum_rows(const char *op, const fl_tensor *g) {
    int64_t n = g->shape[1];
    fl_tensor *out = fl_linear_output(1, &n, g->dtype, g->device, !g->storage);
    if (!out) return NULL;
    fl_flops_add(g->shape[0] * n);
    if (!g->storage) return out;
    const fl_linear_kernels *kern = fl_linear_kernels_of(op, g->device);
    int rc = kern ? kern->sum_rows(out, g) : (int)fl_last_status();
    if (rc != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

static int linear_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const char *op = "linear backward";
    const fl_tensor *x = node->saved[0], *w = node->saved[1];
    fl_tensor gr, *keep_g = NULL, *keep_x = NULL;
    int rc = rows_of(go[0], &gr, &keep_g);
    if (rc == FL_OK && fl_node_wants(node, 0)) {
        /* dX = dY @ W, written straight into a tensor of x's shape. */
        bool no_storage = !gr.storage || !w->storage;
        fl_tensor *gx = fl_linear_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
        fl_tensor *r = gx ? fl_linear_bmm(op, &gr, w, NULL, gx) : NULL;
        fl_tensor_release(r);
        if (r) gi[0] = gx;
        else fl_tensor_release(gx);
        if (!r) rc = fl_last_status();
    }
    if (rc == FL_OK && fl_node_wants(node, 1)) {
        /* dW = dY^T @ X over all rows at once. */
        fl_tensor xr, gt;
        rc = rows_of(x, &xr, &keep_x);
        if (rc == FL_OK) {
            fl_linear_swap_view(&gr, 0, 1, &gt);
            gi[1] = fl_linear_bmm(op, &gt, &xr, NULL, NULL);
            if (!gi[1]) rc = fl_last_status();
        }
    }
    if (rc == FL_OK && fl_node_wants(node, 2)) {
        gi[2] = sum_rows(op, &gr);
        if (!gi[2]) rc = fl_last_status();
    }
    fl_tensor_release(keep_g);
    fl_tensor_release(keep_x);
    return rc;
}

static const fl_node_type linear_type = {.name = "LinearBackward", .backward = linear_backward};
