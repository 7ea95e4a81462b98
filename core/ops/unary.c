/*
 * unary.c: elementwise functions of one tensor (exp, log, sqrt, rsqrt, tanh,
 * sigmoid, abs, relu, gelu in both forms, silu, square, pow by a scalar,
 * clamp), the fused silu(gate) * up of SwiGLU MLPs, and dropout; with their
 * backward.
 *
 * Every op here follows binary.c's pattern: validate, infer dtype and shape
 * (the same on every device), create the output (no storage on meta or
 * fake inputs), count FLOPs, run the device kernel, record a node. The
 * backward of each is one fused kernel (gx = gy * f'(.)) rather than a
 * chain of ops, so a GELU backward reads two tensors and writes one instead
 * of making five temporaries.
 *
 * FLOPs: one per output element for every forward (transcendental functions
 * are not weighted more: the counter measures work for MFU, where
 * elementwise ops are noise next to matrix products), two per element for
 * a fused backward (the derivative and the product with the gradient).
 */
#include "elementwise.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"
#include "op_common.h"

#include <math.h>

static const char *unary_names[FL_UNARY_KERNEL_COUNT] = {
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "abs", "relu",
    "gelu", "gelu_tanh", "silu", "square", "pow", "clamp",
};

static const fl_node_type unary_types[FL_UNARY_KERNEL_COUNT];

static bool no_storage(const fl_tensor *t) { return !t->storage; }

/* Ops that keep an integer dtype (their results are integers). */
static bool keeps_integers(int op) {
    return op == FL_ABS || op == FL_RELU || op == FL_SQUARE || op == FL_UNARY_CLAMP;
}

/* out = op(x) with parameters; records the node when x needs grad. */
static fl_tensor *unary_impl(int op, const fl_tensor *x, double p0, double p1,
                             fl_dtype out_dtype) {
    const char *name = unary_names[op];
    fl_tensor *out = fl_op_output(x->ndim, x->shape, out_dtype, x->device, no_storage(x));
    if (!out) return NULL;
    fl_flops_add(out->numel);
    fl_count_bytes(name, 2, (const fl_tensor *[]){x, out});
    if (!no_storage(x)) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of(name, x->device);
        if (!k || k->unary(op, out, x, p0, p1) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    if (fl_needs_grad(1, &x)) {
        const fl_tensor *saved[1] = {fl_unary_saves_output(op) ? out : x};
        fl_node *node;
        if (fl_record(&unary_types[op], 1, &x, out, 1, saved, &node) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
        node->i[0] = op;
        node->f[0] = p0;
        node->f[1] = p1;
    }
    return out;
}

/* The output dtype of op on x, or -1 with an error (bool where the op
 * keeps integers: PyTorch refuses abs/relu/square of bool too). */
static int unary_dtype(int op, const fl_tensor *x, bool integral_params) {
    if (fl_dtype_is_float(x->dtype)) return x->dtype;
    if (keeps_integers(op) && integral_params) {
        if (x->dtype == FL_BOOL) {
            fl_fail(FL_ERR_ARG, "%s: bool tensors are not supported", unary_names[op]);
            return -1;
        }
        return x->dtype;
    }
    return FL_F32;
}

fl_tensor *fl_unary(fl_unary_op op, const fl_tensor *x) {
    if ((int)op < 0 || op >= FL_UNARY_OP_COUNT)
        return FL_FAIL_NULL(FL_ERR_ARG, "unary: invalid op %d", (int)op);
    if (fl_check_tensor(unary_names[op], x, false)) return NULL;
    int dtype = unary_dtype(op, x, true);
    if (dtype < 0) return NULL;
    return unary_impl(op, x, 0, 0, (fl_dtype)dtype);
}

fl_tensor *fl_pow_scalar(const fl_tensor *x, double exponent) {
    if (fl_check_tensor("pow", x, false)) return NULL;
    return unary_impl(FL_UNARY_POW, x, exponent, 0, (fl_dtype)unary_dtype(FL_UNARY_POW, x, false));
}

static bool integral_or_infinite(double v) {
    return isinf(v) || v == floor(v);
}

fl_tensor *fl_clamp(const fl_tensor *x, double lo, double hi, bool has_lo, bool has_hi) {
    if (fl_check_tensor("clamp", x, false)) return NULL;
    if (!has_lo && !has_hi)
        return FL_FAIL_NULL(FL_ERR_ARG, "clamp: at least one of min and max must be given");
    if ((has_lo && isnan(lo)) || (has_hi && isnan(hi)))
        return FL_FAIL_NULL(FL_ERR_ARG, "clamp: a bound is NaN");
    /* A missing bound is an infinite one: the kernels need no flags, and
     * the gradient rule lo <= x <= hi then holds for every number. */
    if (!has_lo) lo = -INFINITY;
    if (!has_hi) hi = INFINITY;
    bool integral = integral_or_infinite(lo) && integral_or_infinite(hi);
    int dtype = unary_dtype(FL_UNARY_CLAMP, x, integral);
    if (dtype < 0) return NULL;
    return unary_impl(FL_UNARY_CLAMP, x, lo, hi, (fl_dtype)dtype);
}

static int unary_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    int op = (int)node->i[0];
    const fl_tensor *s = node->saved[0];
    fl_tensor *gx = fl_op_output(s->ndim, s->shape, s->dtype, s->device,
                                     no_storage(s) || no_storage(go[0]));
    if (!gx) return fl_last_status();
    fl_flops_add(2 * gx->numel);
    fl_count_bytes(unary_names[op], 3, (const fl_tensor *[]){go[0], s, gx});
    if (!no_storage(gx)) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of(unary_names[op], gx->device);
        if (!k || k->unary_backward(op, gx, go[0], s, node->f[0], node->f[1]) != FL_OK) {
            fl_tensor_release(gx);
            return fl_last_status();
        }
    }
    gi[0] = gx;
    return FL_OK;
}

static const fl_node_type unary_types[FL_UNARY_KERNEL_COUNT] = {
    {.name = "ExpBackward", .backward = unary_backward},
    {.name = "LogBackward", .backward = unary_backward},
    {.name = "SqrtBackward", .backward = unary_backward},
    {.name = "RsqrtBackward", .backward = unary_backward},
    {.name = "TanhBackward", .backward = unary_backward},
    {.name = "SigmoidBackward", .backward = unary_backward},
    {.name = "AbsBackward", .backward = unary_backward},
    {.name = "ReluBackward", .backward = unary_backward},
    {.name = "GeluBackward", .backward = unary_backward},
    {.name = "GeluTanhBackward", .backward = unary_backward},
    {.name = "SiluBackward", .backward = unary_backward},
    {.name = "SquareBackward", .backward = unary_backward},
    {.name = "PowBackward", .backward = unary_backward},
    {.name = "ClampBackward", .backward = unary_backward},
};

/* ---- silu(gate) * up ----------------------------------------------------- */

static const fl_node_type silu_mul_type;

fl_tensor *fl_silu_mul(const fl_tensor *gate, const fl_tensor *up) {
    if (fl_check_tensor("silu_mul", gate, false) || fl_check_tensor("silu_mul", up, false))
        return NULL;
    const fl_tensor *ins[2] = {gate, up};
    if (fl_same_device("silu_mul", 2, ins)) return NULL;
    bool same = gate->ndim == up->ndim;
    for (int d = 0; same && d < gate->ndim; d++) same = gate->shape[d] == up->shape[d];
    if (!same) {
        char a[128], b[128];
        return FL_FAIL_NULL(FL_ERR_ARG, "silu_mul: gate of shape %s and up of shape %s differ",
                            fl_shape_str(gate, a, sizeof a), fl_shape_str(up, b, sizeof b));
    }
    if (gate->dtype != up->dtype || !fl_dtype_is_float(gate->dtype))
        return FL_FAIL_NULL(FL_ERR_ARG, "silu_mul: gate and up must share one float dtype, got %s "
                                        "and %s",
                            fl_dtype_name(gate->dtype), fl_dtype_name(up->dtype));
    bool meta = no_storage(gate) || no_storage(up);
    fl_tensor *out = fl_op_output(gate->ndim, gate->shape, gate->dtype, gate->device, meta);
    if (!out) return NULL;
    fl_flops_add(2 * out->numel); /* the activation and the product */
    fl_count_bytes("silu_mul", 3, (const fl_tensor *[]){gate, up, out});
    if (!meta) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of("silu_mul", gate->device);
        if (!k || k->silu_mul(out, gate, up) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    if (fl_needs_grad(2, ins) && fl_record(&silu_mul_type, 2, ins, out, 2, ins, NULL) != FL_OK) {
        fl_tensor_release(out);
        return NULL;
    }
    return out;
}

static int silu_mul_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *gate = node->saved[0], *up = node->saved[1];
    bool meta = no_storage(gate) || no_storage(up) || no_storage(go[0]);
    bool want_gate = fl_node_wants(node, 0), want_up = fl_node_wants(node, 1);
    fl_tensor *gg = want_gate ? fl_op_output(gate->ndim, gate->shape, gate->dtype,
                                                 gate->device, meta) : NULL;
    fl_tensor *gu = want_up ? fl_op_output(up->ndim, up->shape, up->dtype, up->device, meta)
                            : NULL;
    int rc = (want_gate && !gg) || (want_up && !gu) ? (int)fl_last_status() : FL_OK;
    fl_flops_add(4 * gate->numel);
    fl_count_bytes("silu_mul backward", 5, (const fl_tensor *[]){go[0], gate, up, gg, gu});
    if (rc == FL_OK && !meta) {
        /* The kernel walks flat memory: five operands are more than the
         * strided iterator takes, and gy is often a broadcast view. */
        fl_tensor *g = fl_contiguous(go[0]);
        fl_tensor *a = g ? fl_contiguous(gate) : NULL;
        fl_tensor *b = a ? fl_contiguous(up) : NULL;
        const fl_elementwise_kernels *k = b ? fl_elementwise_kernels_of("silu_mul", gate->device)
                                            : NULL;
        rc = k ? k->silu_mul_backward(gg, gu, g, a, b) : (int)fl_last_status();
        fl_tensor_release(g);
        fl_tensor_release(a);
        fl_tensor_release(b);
    }
    if (rc != FL_OK) {
        fl_tensor_release(gg);
        fl_tensor_release(gu);
        return rc;
    }
    gi[0] = gg;
    gi[1] = gu;
    return FL_OK;
}

static const fl_node_type silu_mul_type = {.name = "SiluMulBackward",
                                           .backward = silu_mul_backward};

/* ---- dropout --------------------------------------------------------------- */

/* [Note: dropout masks are regenerated, not saved]
 * The keep mask is a pure function of (seed, stream, offset + element
 * index) through the core's Philox generator (rng.c's uniform contract), so
 * the node keeps only the key and p, and the backward recomputes the mask
 * while it scales the gradient: no mask tensor lives between forward and
 * backward (for a Llama or DeepViT layer that is one byte or more per
 * activation element saved). The same property makes activation
 * checkpointing exact: a replayed forward draws the same key from the
 * global generator (fsdp.random's state is restored), hence the same mask. */

static const fl_node_type dropout_type;

static fl_random_spec dropout_key(uint64_t seed, uint64_t stream, uint64_t offset) {
    fl_random_spec key = {.kind = FL_RANDOM_UNIFORM, .seed = seed, .stream = stream,
                          .first_index = offset, .a = 0, .b = 1};
    return key;
}

/* out = dropout of x under key (the forward and, applied to gy, the
 * backward). */
static fl_tensor *dropout_apply(const fl_tensor *x, const fl_tensor *like, double p,
                                const fl_random_spec *key) {
    bool meta = no_storage(x);
    fl_tensor *out = fl_op_output(like->ndim, like->shape, like->dtype, like->device, meta);
    if (!out) return NULL;
    fl_flops_add(out->numel);
    fl_count_bytes("dropout", 2, (const fl_tensor *[]){x, out});
    if (!meta) {
        const fl_elementwise_kernels *k = fl_elementwise_kernels_of("dropout", x->device);
        if (!k || k->dropout(out, x, p, key) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

fl_tensor *fl_dropout(const fl_tensor *x, double p, uint64_t seed, uint64_t stream,
                      uint64_t offset) {
    if (fl_check_tensor("dropout", x, false)) return NULL;
    if (!fl_dtype_is_float(x->dtype))
        return FL_FAIL_NULL(FL_ERR_ARG, "dropout: expects a float tensor, got %s",
                            fl_dtype_name(x->dtype));
    if (!(p >= 0 && p <= 1))
        return FL_FAIL_NULL(FL_ERR_ARG, "dropout: probability must be in [0, 1], got %g", p);
    if (p == 0) return fl_tensor_retain((fl_tensor *)x);
    fl_random_spec key = dropout_key(seed, stream, offset);
    fl_tensor *out = dropout_apply(x, x, p, &key);
    if (out && fl_needs_grad(1, &x)) {
        /* Saved: x's shape only (a meta tensor), for a gradient of x's dtype. */
        fl_tensor *shape = fl_shape_carrier(x->ndim, x->shape, x->dtype);
        const fl_tensor *saved[1] = {shape};
        fl_node *node = NULL;
        int rc = shape ? fl_record(&dropout_type, 1, &x, out, 1, saved, &node)
                       : (int)fl_last_status();
        fl_tensor_release(shape);
        if (rc != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
        node->f[0] = p;
        node->i[0] = (int64_t)seed;
        node->i[1] = (int64_t)stream;
        node->i[2] = (int64_t)offset;
    }
    return out;
}

static int dropout_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    fl_random_spec key = dropout_key((uint64_t)node->i[0], (uint64_t)node->i[1],
                                     (uint64_t)node->i[2]);
    const fl_tensor *like = node->saved[0];
    /* On meta the gradient has no storage either; its device is gy's. */
    fl_tensor *gx = dropout_apply(go[0], go[0], node->f[0], &key);
    if (gx && gx->dtype != like->dtype) {
        fl_tensor *cast = fl_to(gx, like->dtype, gx->device);
        fl_tensor_release(gx);
        gx = cast;
    }
    gi[0] = gx;
    return gx ? FL_OK : (int)fl_last_status();
}

static const fl_node_type dropout_type = {.name = "DropoutBackward", .backward = dropout_backward};
