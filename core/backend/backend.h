/*
 * backend.h: the device-backend interface: everything a device backend
 * (core/cpu, core/cuda) implements and everything the layers above reach
 * it through: the vtable (fl_backend: memory, copies, streams, events,
 * pinned memory) and the kernel table of every op family with the argument
 * structs its kernels take. A backend includes this header, core/base and
 * core/tensor, and nothing of the layers above it (tools/includes.lua
 * checks). Plain C, included by nvcc too.
 */
#ifndef FL_BACKEND_H
#define FL_BACKEND_H

#include "element.h"
#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* [Note: the device interface]
 * Everything the core does with a device goes through its fl_backend:
 * memory and its cache, copies and fills, streams, events, asynchronous
 * copies, pinned host memory, memory statistics, the kernel table of every
 * op family and the device's collective library. No file outside a
 * backend's folder (core/cpu, core/cuda) names a backend, so core/tensor,
 * ops, autograd, optim and dist work unchanged on any device. The cpu
 * backend is built in; the cuda backend is a plugin, libfsdp_cuda.so,
 * opened by core/tensor/backend.c on the first use of a cuda device
 * (docs/ARCHITECTURE.md, "Backends are plugins"). A plugin calls only
 * FL_API functions and the internal ones marked FL_PLUGIN_API (error.h), and
 * FL_BACKEND_ABI changes whenever this struct, the kernel tables or the
 * tensor struct they take change, so a stale plugin is refused with a
 * message instead of misbehaving (2: fl_tensor gained virtual_storage;
 * 3: fl_linear_kernels gained matmul_scratch; 4: fl_elementwise_kernels
 * gained moe_route and moe_route_backward; 5: fl_optim_kernels gained
 * update_multi, fl_backend gained kernel_launches). */
enum { FL_BACKEND_ABI = 5 };

/* The symbol a backend plugin (libfsdp_cuda.so) exports: returns its
 * vtable. */
#define FL_BACKEND_PLUGIN_ENTRY "fl_backend_plugin_entry"

/* ---- kernel tables, one per op family ---------------------------------- */

/* Each op family's kernels as one table per device (fl_backend.binary, ...).
 * The op files of core/ops validate, infer shapes and dtypes (the same on
 * every device, meta included), count FLOPs and record autograd, then call
 * the table of the tensors' device (fl_binary_kernels_of, ...): ops own
 * their dispatch, backends own kernels. Each kernel's signature is written
 * once, as a function type (fl_rms_norm_kernel): the table's field points
 * to one, and a backend declares its kernel with it
 * (`fl_rms_norm_kernel fl_cpu_rms_norm;`), so the compiler checks every
 * backend's definition against the contract. */

/* ---- binary: add, sub, mul, div, and a += alpha * b -------------------- */

/* Internal op code beyond the public ones: out = a + alpha * b. */
enum { FL_AXPY = FL_BINARY_OP_COUNT };

/* out = a op b elementwise; a and b are views with out's shape (stride
 * 0 where they broadcast); any dtypes; alpha is used by FL_AXPY. */
typedef int fl_binary_kernel(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b,
                             double alpha);

typedef struct fl_binary_kernels {
    fl_binary_kernel *binary;
} fl_binary_kernels;

/* ---- elementwise: unary math, reductions, comparisons, routing --------- */

/* Unary kernel op codes beyond the public fl_unary_op ones: the ops with
 * scalar parameters (p0, p1 below). */
enum {
    FL_UNARY_POW = FL_UNARY_OP_COUNT, /* x ^ p0 */
    FL_UNARY_CLAMP,                   /* min(max(x, p0), p1); +-inf for no bound */
    FL_UNARY_KERNEL_COUNT
};

/* Does the backward of op read the op's output (rather than its input)?
 * exp, sqrt, rsqrt, tanh, sigmoid and relu express their derivative through
 * y, which the next op usually keeps anyway, so saving y costs no memory. */
static inline bool fl_unary_saves_output(int op) {
    return op == FL_EXP || op == FL_SQRT || op == FL_RSQRT || op == FL_TANH ||
           op == FL_SIGMOID || op == FL_RELU;
}

/* out = f(x); x has out's shape, any strides and dtype. */
typedef int fl_unary_kernel(int op, fl_tensor *out, const fl_tensor *x, double p0, double p1);
/* gx = gy * f'(.) where s is the op's input, or its output when
 * fl_unary_saves_output(op); all of gx's shape, any strides. */
typedef int fl_unary_backward_kernel(int op, fl_tensor *gx, const fl_tensor *gy, const fl_tensor *s,
                                     double p0, double p1);
/* out = silu(gate) * up, all of one shape. */
typedef int fl_silu_mul_kernel(fl_tensor *out, const fl_tensor *gate, const fl_tensor *up);
/* g_gate = gy * up * silu'(gate), g_up = gy * silu(gate); either output
 * may be NULL. Every tensor contiguous. */
typedef int fl_silu_mul_backward_kernel(fl_tensor *g_gate, fl_tensor *g_up, const fl_tensor *gy,
                                        const fl_tensor *gate, const fl_tensor *up);
/* out = x * keep_i / (1 - p), keep_i = (uniform value i of key >= p);
 * out and x of one shape (x any strides). Backward is the same call on
 * the output gradient. */
typedef int fl_dropout_kernel(fl_tensor *out, const fl_tensor *x, double p,
                              const fl_random_spec *key);
/* out = sum over the dims d of `in` with reduce[d], divided by divisor
 * (1 for a sum); in contiguous, out contiguous with the kept dims in
 * order. */
typedef int fl_sum_kernel(fl_tensor *out, const fl_tensor *in, const bool *reduce, double divisor);
/* values/indices = max (or min) of contiguous `in` along dim; outputs
 * contiguous, of in's shape without dim. */
typedef int fl_minmax_kernel(bool is_max, fl_tensor *values, fl_tensor *indices,
                             const fl_tensor *in, int dim);
/* out = 0 except out[..., indices[...], ...] = src[...] along dim (out
 * contiguous; src and indices contiguous, of out's shape without dim). */
typedef int fl_scatter_dim_kernel(fl_tensor *out, const fl_tensor *src, const fl_tensor *indices,
                                  int dim);
/* out (bool) = a op b; a and b are views with out's shape. */
typedef int fl_compare_kernel(int op, fl_tensor *out, const fl_tensor *a, const fl_tensor *b);
/* out = cond ? a : b; cond, a, b are views with out's shape. */
typedef int fl_where_kernel(fl_tensor *out, const fl_tensor *cond, const fl_tensor *a,
                            const fl_tensor *b);
/* Mixture-of-experts routing, row by row of logits [N, E] (contiguous,
 * any float dtype): p = softmax(logits) in the compute dtype (f64 for
 * f64, else f32), the k = ids->shape[1] largest p in descending order
 * (ties: the lower expert first), weights [N, k] (compute dtype) = those
 * p, divided by their sum when `normalize`; ids [N, k] i64. Outputs
 * contiguous. */
typedef int fl_moe_route_kernel(fl_tensor *weights, fl_tensor *ids, const fl_tensor *logits,
                                bool normalize);
/* Its backward: dlogits [N, E] (logits' dtype) from dweights [N, k]
 * (compute dtype), p recomputed from logits; all contiguous. */
typedef int fl_moe_route_backward_kernel(fl_tensor *dlogits, const fl_tensor *dweights,
                                         const fl_tensor *logits, const fl_tensor *ids,
                                         bool normalize);

typedef struct fl_elementwise_kernels {
    fl_unary_kernel *unary;
    fl_unary_backward_kernel *unary_backward;
    fl_silu_mul_kernel *silu_mul;
    fl_silu_mul_backward_kernel *silu_mul_backward;
    fl_dropout_kernel *dropout;
    fl_sum_kernel *sum;
    fl_minmax_kernel *minmax;
    fl_scatter_dim_kernel *scatter_dim;
    fl_compare_kernel *compare;
    fl_where_kernel *where;
    fl_moe_route_kernel *moe_route;
    fl_moe_route_backward_kernel *moe_route_backward;
} fl_elementwise_kernels;

/* ---- linear: matmul, linear, embedding, conv2d, max_pool2d ------------- */

/* out[batch..., m, n] = a[batch..., m, k] @ b[batch..., k, n], plus
 * bias[n] on every row when bias is not NULL. a and b have out's ndim
 * (>= 2) and batch sizes, with stride 0 on broadcast batch dims, and any
 * strides otherwise; out is contiguous. a, b and out share one float
 * dtype; bias is 1-d of any float dtype. */
typedef int fl_matmul_kernel(fl_tensor *out, const fl_tensor *a, const fl_tensor *b,
                             const fl_tensor *bias);
/* Bytes matmul would allocate for a while beyond out for the same
 * views (staging copies, a wider result), from shapes, strides and
 * dtypes only: what a meta product imitating this device counts
 * ([Note: virtual storage], core/ops/matmul.c). NULL: none. */
typedef int64_t fl_matmul_scratch_kernel(const fl_tensor *out, const fl_tensor *a,
                                         const fl_tensor *b, const fl_tensor *bias);
/* out [m, n] (contiguous, f32 or f64) += a [m, k] @ b [k, n]: a and b
 * 2-d of one float dtype (any strides), the sum in out's dtype. The
 * chunked accumulation of a weight gradient (core/ops/linear_cross_entropy.c):
 * every chunk adds onto one wide sum, rounded once at the end. */
typedef int fl_matmul_acc_kernel(fl_tensor *out, const fl_tensor *a, const fl_tensor *b);
/* out[n] = sum over the rows of in [rows, n] (any strides): the bias
 * gradient. out is contiguous, in's dtype. */
typedef int fl_sum_rows_kernel(fl_tensor *out, const fl_tensor *in);
/* out[i, :] = w[ids[i], :] for the flattened contiguous ids (i64 or
 * i32); out is [numel(ids), D] contiguous. Fails, writing nothing, when
 * an id is outside [0, V). */
typedef int fl_embedding_kernel(fl_tensor *out, const fl_tensor *ids, const fl_tensor *w);
/* gw ([V, D] contiguous: zeros, or a gradient to add to) += rows of gy
 * [numel(ids), D] at ids, skipping padding_idx (-1: none). */
typedef int fl_embedding_backward_kernel(fl_tensor *gw, const fl_tensor *ids, const fl_tensor *gy,
                                         int64_t padding_idx);
/* out [N, O, Ho, Wo] contiguous = conv2d(x [N, C, H, W], w [O, C, kh,
 * kw]) + bias [O] (or NULL); same float dtype. */
typedef int fl_conv2d_kernel(fl_tensor *out, const fl_tensor *x, const fl_tensor *w,
                             const fl_tensor *bias, const fl_conv2d_options *o);
/* The gradients of conv2d for gy [N, O, Ho, Wo]: gx (x's shape), gw
 * (w's shape), gb [O]; each contiguous and may be NULL when not wanted;
 * they are written, not accumulated. */
typedef int fl_conv2d_backward_kernel(fl_tensor *gx, fl_tensor *gw, fl_tensor *gb,
                                      const fl_tensor *gy, const fl_tensor *x, const fl_tensor *w,
                                      const fl_conv2d_options *o);
/* out and indices [P, Ho, Wo] contiguous (P planes of x [P, H, W]). */
typedef int fl_max_pool2d_kernel(fl_tensor *out, fl_tensor *indices, const fl_tensor *x, int64_t kh,
                                 int64_t kw, const fl_conv2d_options *o);
/* gx [P, H, W] (zeros on entry) += gy [P, Ho, Wo] at indices. */
typedef int fl_max_pool2d_backward_kernel(fl_tensor *gx, const fl_tensor *gy,
                                          const fl_tensor *indices);

typedef struct fl_linear_kernels {
    fl_matmul_kernel *matmul;
    fl_matmul_scratch_kernel *matmul_scratch;
    fl_matmul_acc_kernel *matmul_acc;
    fl_sum_rows_kernel *sum_rows;
    fl_embedding_kernel *embedding;
    fl_embedding_backward_kernel *embedding_backward;
    fl_conv2d_kernel *conv2d;
    fl_conv2d_backward_kernel *conv2d_backward;
    fl_max_pool2d_kernel *max_pool2d;
    fl_max_pool2d_backward_kernel *max_pool2d_backward;
} fl_linear_kernels;

/* ---- fused: norms, softmax, losses, rotary, attention ------------------ */

/* The fused family (core/ops/norm.c, softmax.c, cross_entropy.c, rotary.c,
 * attention.c).
 *
 * These are the memory-bound chains of a transformer: each is one kernel
 * that reads its input once (forward) and once or twice (backward) instead
 * of a sequence of elementwise ops with temporaries. The op files
 * (core/ops/norm.c, softmax.c, cross_entropy.c, rotary.c, attention.c)
 * validate, infer shapes and dtypes (the same on every device, meta
 * included), count FLOPs and record autograd; the kernels only compute.
 *
 * Kernel conventions: inputs may be strided and of any float dtype (f32,
 * f64, f16, bf16); the math is f64 for f64 tensors and f32 otherwise (the
 * "compute dtype"); outputs are contiguous tensors the op created. Saved
 * per-row statistics (rstd, mean, logsumexp) are contiguous tensors in the
 * compute dtype. A kernel that finds bad values (a target out of range)
 * records the error itself and returns its status.
 */

/* Cross-entropy and NLL loss options as the kernels see them. */
typedef struct fl_loss_params {
    int64_t ignore_index;
    double label_smoothing; /* cross-entropy only */
} fl_loss_params;

/* Scaled dot-product attention. q, k, v (and dout, o in backward) are in
 * the compute dtype with a contiguous last dim (row strides are free, so a
 * transposed [B, T, H, D] projection needs no copy); bias is NULL or a
 * [B, Hq, Tq, Tk] view in the compute dtype with stride 0 where it
 * broadcasts. out, lse, dq, dk, dv are contiguous in the compute dtype;
 * dk and dv start zeroed. dbias is NULL or a zeroed contiguous tensor of
 * the bias's shape seen as 4-d (size 1 where it broadcasts): the kernel
 * sums dS over the broadcast dims into it. window > 0 (only with causal)
 * also hides key j from query i when j <= i - window; softcap > 0 maps the
 * scaled scores s to softcap * tanh(s / softcap) before the bias and the
 * masks ([Note: attention window and softcap], core/ops/attention.c). */
typedef struct fl_attention_args {
    const fl_tensor *q, *k, *v, *bias;
    bool causal;
    double scale;
    int64_t window;  /* 0: none */
    double softcap;  /* 0: none */
    /* Packed sequences: NULL, or i64 [B, Tq] contiguous on q's device (only
     * with causal and Tq == Tk): starts[b, i] is query i's first visible
     * key, the start of its document (i + 1 for padding, which sees
     * nothing); keys before it are hidden like the window's. The op derives
     * it from the caller's segment ids ([Note: packed sequences],
     * core/ops/attention.c); it never decreases along i. */
    const fl_tensor *starts;
    fl_tensor *out; /* [B, Hq, Tq, Dv] */
    fl_tensor *lse; /* [B, Hq, Tq]: logsumexp of each row of scores */
    /* backward only */
    const fl_tensor *dout, *o;
    fl_tensor *dq, *dk, *dv, *dbias;
} fl_attention_args;

/* Over the last dim of x ([rows, n] seen row by row). w, b may be NULL.
 * rstd, mean: [rows]. out is rounded to x's dtype before the weight
 * multiply (Llama's RMSNorm), see norm.c. */
typedef int fl_rms_norm_kernel(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x,
                               const fl_tensor *w, double eps);
typedef int fl_rms_norm_backward_kernel(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g,
                                        const fl_tensor *x, const fl_tensor *w,
                                        const fl_tensor *rstd);
/* h = x + a rounded to h's dtype (x's), then rms_norm of h into out
 * and rstd, as rms_norm would from h ([Note: residual add fused with
 * RMSNorm], norm.c). x and a: same shape and dtype, any strides. */
typedef int fl_add_rms_norm_kernel(fl_tensor *h, fl_tensor *out, fl_tensor *rstd,
                                   const fl_tensor *x, const fl_tensor *a, const fl_tensor *w,
                                   double eps);
/* dh = gh + rms_norm_backward's dx of gy (gh NULL: none), rounded once
 * to dh's dtype; dw as rms_norm_backward's. dh or dw may be NULL. */
typedef int fl_add_rms_norm_backward_kernel(fl_tensor *dh, fl_tensor *dw, const fl_tensor *gh,
                                            const fl_tensor *gy, const fl_tensor *h,
                                            const fl_tensor *w, const fl_tensor *rstd);
typedef int fl_layer_norm_kernel(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd,
                                 const fl_tensor *x, const fl_tensor *w, const fl_tensor *b,
                                 double eps);
/* dx, dw, db may each be NULL (not wanted). */
typedef int fl_layer_norm_backward_kernel(fl_tensor *dx, fl_tensor *dw, fl_tensor *db,
                                          const fl_tensor *g, const fl_tensor *x,
                                          const fl_tensor *w, const fl_tensor *mean,
                                          const fl_tensor *rstd);
/* Along dim of x; y is the forward output (softmax or log-softmax). */
typedef int fl_softmax_kernel(fl_tensor *out, const fl_tensor *x, int dim, bool log);
typedef int fl_softmax_backward_kernel(fl_tensor *dx, const fl_tensor *g, const fl_tensor *y,
                                       int dim, bool log);
/* logits [rows, C] (last dim), targets [rows] of an integer dtype.
 * rows_out: NULL, or [rows] per-row losses (reduction 'none'); lse:
 * [rows]. *total gets the sum of the row losses, *count the number of
 * rows whose target is not ignore_index. */
typedef int fl_cross_entropy_kernel(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                                    const fl_tensor *targets, const fl_loss_params *p,
                                    double *total, int64_t *count);
/* dlogits = scale_r * (softmax - (1 - ls) * onehot - ls / C), with
 * scale_r = g_rows[r] if g_rows else g_scalar; 0 for ignored rows. */
typedef int fl_cross_entropy_backward_kernel(fl_tensor *dlogits, const fl_tensor *g_rows,
                                             double g_scalar, const fl_tensor *logits,
                                             const fl_tensor *targets, const fl_tensor *lse,
                                             const fl_loss_params *p);
typedef int fl_nll_loss_kernel(fl_tensor *rows_out, const fl_tensor *log_probs,
                               const fl_tensor *targets, const fl_loss_params *p, double *total,
                               int64_t *count);
/* dlp must be zeroed: only the target entries are written. */
typedef int fl_nll_loss_backward_kernel(fl_tensor *dlp, const fl_tensor *g_rows, double g_scalar,
                                        const fl_tensor *targets, const fl_loss_params *p);
/* out = x*cos + rotate_half(x)*sin over x's last two dims [T, D];
 * inverse: the transposed map (the backward). positions: NULL or
 * integer [T] or [x.shape[0], T], rows of cos/sin to use. */
typedef int fl_rotary_kernel(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos,
                             const fl_tensor *sin, const fl_tensor *positions, bool inverse);
typedef int fl_attention_kernel(const fl_attention_args *a);
typedef int fl_attention_backward_kernel(const fl_attention_args *a);
/* Optional (NULL where the device has none): attention through a
 * library's fused kernels on the inputs' own 16-bit dtype: q, k, v,
 * bias, o, dout, out, dq, dk, dv all in q's dtype (bf16 or f16), lse in
 * f32, dbias never. q, k, v and bias keep the caller's strides. Sets
 * *done when it ran; leaves it false, without an error, where the
 * library does not cover the configuration (layout, sizes, dtype), and
 * the op then runs the kernels above on f32 copies. */
typedef int fl_attention_native_kernel(const fl_attention_args *a, bool *done);
typedef int fl_attention_native_backward_kernel(const fl_attention_args *a, bool *done);

typedef struct fl_fused_kernels {
    fl_rms_norm_kernel *rms_norm;
    fl_rms_norm_backward_kernel *rms_norm_backward;
    fl_add_rms_norm_kernel *add_rms_norm;
    fl_add_rms_norm_backward_kernel *add_rms_norm_backward;
    fl_layer_norm_kernel *layer_norm;
    fl_layer_norm_backward_kernel *layer_norm_backward;
    fl_softmax_kernel *softmax;
    fl_softmax_backward_kernel *softmax_backward;
    fl_cross_entropy_kernel *cross_entropy;
    fl_cross_entropy_backward_kernel *cross_entropy_backward;
    fl_nll_loss_kernel *nll_loss;
    fl_nll_loss_backward_kernel *nll_loss_backward;
    fl_rotary_kernel *rotary;
    fl_attention_kernel *attention;
    fl_attention_backward_kernel *attention_backward;
    fl_attention_native_kernel *attention_native;
    fl_attention_native_backward_kernel *attention_native_backward;
} fl_fused_kernels;

/* ---- optimizers: the fused updates (core/optim) ------------------------ */

/* What the CPU loops of the fused optimizer updates (the .c files of
 * core/optim) and a device's kernels (core/cuda/cuda_optim.cu) share: the
 * operands, each update's constants as its inner loop reads them, and the
 * table a device backend offers. Both devices compute from the same f32
 * constants, made once per call on the host, so a GPU update can repeat
 * the CPU's operations exactly. */

enum { FL_OPTIM_MAX_OPERANDS = 5 };

/* Operand 0 is always the parameter, 1 its gradient, the rest state. */
typedef struct fl_optim_operand {
    const char *name;  /* "param", "grad", "exp_avg": used in messages */
    fl_tensor *t;      /* NULL for an optional operand that is absent */
    bool write;        /* stored back after the inner loop */
} fl_optim_operand;

/* Which update a call is, for the device kernels. */
typedef enum fl_optim_kind {
    FL_OPTIM_ADAMW,
    FL_OPTIM_ANYPRECISION_ADAMW,
    FL_OPTIM_SGD,
    FL_OPTIM_ADADELTA,
} fl_optim_kind;

/* AdamW (adamw.c): operands param, grad, exp_avg, exp_avg_sq. */
typedef struct fl_adamw_ctx {
    float decay, weight1, beta2, one_minus_beta2, eps, neg_step_size, bc2_sqrt;
} fl_adamw_ctx;

/* AnyPrecisionAdamW (anyprecision_adamw.c): operands param, grad,
 * exp_avg, exp_avg_sq, compensation (NULL without Kahan summation). */
typedef struct fl_anyprecision_ctx {
    float neg_lr_wd, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size,
        bc2_sqrt;
    bool kahan;
} fl_anyprecision_ctx;

/* SGD (sgd.c): operands param, grad, momentum_buffer (NULL without
 * momentum). */
typedef struct fl_sgd_ctx {
    float lr, momentum, one_minus_dampening, weight_decay;
    bool use_momentum, nesterov, first;
} fl_sgd_ctx;

/* Adadelta (adadelta.c): operands param, grad, square_avg, acc_delta. */
typedef struct fl_adadelta_ctx {
    float lr, rho, one_minus_rho, eps, weight_decay;
} fl_adadelta_ctx;

/* grad_norm.c's chunk: the sum of squares adds the squares of each chunk
 * of this many elements in four interleaved accumulators, then the chunks
 * in order; the device kernel keeps the same order. */
enum { FL_GRAD_NORM_CHUNK = 4096 };

/* A device backend's kernels of the family (fl_backend.optim; the cpu runs
 * the host loops of core/optim instead). update: the update of `kind` over
 * all elements of checked, dense, non-overlapping operands on one device,
 * one kernel launch; ctx is the kind's struct above. update_multi (NULL:
 * update is called per set): the same over `count` sets of n operands
 * (set i at ops + i*n), checked and not sharing memory, each set's result
 * that of update, in as few launches as the device allows. grad_sq_norm and
 * grad_scale_: grad_norm.c on a device tensor (checked, dense, float), the
 * sum of squares with the CPU's chunks and order of additions, and the
 * in-place scale. FL_OK or an error naming op. */
typedef struct fl_optim_kernels {
    int (*update)(const char *op, fl_optim_kind kind, const void *ctx, int n,
                  const fl_optim_operand *ops);
    int (*update_multi)(const char *op, fl_optim_kind kind, const void *ctx, int count, int n,
                        const fl_optim_operand *ops);
    int (*grad_sq_norm)(const fl_tensor *t, double *out);
    int (*grad_scale_)(fl_tensor *t, double alpha);
} fl_optim_kernels;

/* ---- the vtable -------------------------------------------------------- */

/* The streams beside the compute stream (stream id 0, where every kernel
 * runs), one of each kind per device, made on first use. */
enum { FL_STREAM_COPY = 0, FL_STREAM_COMM = 1 };

struct fl_device_comm_ops; /* core/comm/dist.h: the device's collective library */

typedef struct fl_backend {
    int abi; /* FL_BACKEND_ABI */
    const char *name;

    /* ---- the devices -------------------------------------------------- */
    /* How many devices of this kind are usable (0 without hardware or a
     * driver), and the name of device 0 or why there is none. */
    int (*device_count)(void);
    const char *(*status)(void);
    /* The kernels run on the CPU under a simulator (tests/cudasim). */
    bool simulated;

    /* ---- memory ------------------------------------------------------- */
    void *(*alloc)(int index, int64_t nbytes);
    void (*free)(int index, void *ptr, int64_t nbytes);
    /* dst and src on this device, same numel (src may broadcast: stride 0),
     * any dtypes and strides. */
    int (*copy)(fl_tensor *dst, const fl_tensor *src);
    int (*fill)(fl_tensor *t, double value);
    int (*random)(fl_tensor *t, const fl_random_spec *spec);
    /* Contiguous bytes between host memory and this device. */
    int (*to_host)(int index, void *host_dst, const void *src, int64_t nbytes);
    int (*from_host)(int index, void *dst, const void *host_src,
                     int64_t nbytes);
    /* The allocator's cache: bytes held from the system (in use included),
     * and giving the free part back (returns the bytes released). */
    int64_t (*reserved_bytes)(int index);
    int64_t (*empty_cache)(int index);
    /* Why the last alloc of this device returned NULL, into buf; NULL for
     * the generic message. */
    const char *(*describe_oom)(int index, char *buf, size_t size);
    /* Address ranges whose memory comes and goes while the addresses stay
     * (a sharded unit's gathered buffer: [Note: the gathered buffer keeps
     * its address] in core/include/fsdp.h). vm_reserve: at least nbytes of
     * addresses and no memory (*granted: the size, rounded up to the
     * device's granularity), NULL on failure; vm_commit: memory behind the
     * whole range (FL_OK, or an error naming the device); vm_decommit: the
     * memory released, the addresses kept; vm_unreserve: the addresses
     * given back (decommitted first). */
    void *(*vm_reserve)(int index, int64_t nbytes, int64_t *granted);
    int (*vm_commit)(int index, void *base, int64_t nbytes);
    void (*vm_decommit)(int index, void *base, int64_t nbytes);
    void (*vm_unreserve)(int index, void *base, int64_t nbytes);

    /* ---- streams, events, asynchronous copies --------------------------
     * NULL on a device whose work is done when its call returns (cpu).
     * Stream ids are the backend's own values, 0 the compute stream. Each
     * returns FL_OK (or non-NULL) or records an error naming the device. */
    /* Wait for everything queued on the device. */
    int (*synchronize)(int index);
    /* The side stream of kind FL_STREAM_*. */
    int (*side_stream)(int index, int which, uint64_t *stream);
    /* Later work on `waiter` runs after the work queued on `waited`. */
    int (*stream_wait_stream)(int index, uint64_t waiter, uint64_t waited);
    /* Ordering events (no timing): recorded on a stream, polled, made a
     * stream's dependency, destroyed. */
    void *(*event_record)(int index, uint64_t stream);
    bool (*event_done)(void *event);
    int (*stream_wait_event)(int index, uint64_t stream, void *event);
    void (*event_destroy)(void *event);
    /* The allocation starting at `block` is also used by `stream`: once
     * freed, it is not handed out again before the work queued there by
     * then has run. false, with the error set, for a block the device's
     * pool does not know or without host memory to note the stream. */
    bool (*record_stream)(int index, void *block, uint64_t stream);
    /* Queue a copy of nbytes between page-locked host memory (host_alloc)
     * and the device on `stream`. */
    int (*memcpy_async)(int index, uint64_t stream, void *dst, const void *src, int64_t nbytes,
                        bool to_host);
    /* Page-locked host memory the device can copy from and to without the
     * host waiting (core/tensor/pinned.c caches it); NULL with an error. */
    void *(*host_alloc)(int64_t nbytes);
    void (*host_free)(void *ptr);
    /* The public events (core/tensor/event.c), with timing if asked. */
    void *(*user_event_new)(int index, bool timing);
    void (*user_event_free)(void *event);
    int (*user_event_record)(int index, void *event);
    int (*user_event_query)(int index, void *event, bool *done);
    int (*user_event_synchronize)(int index, void *event);
    int (*user_event_elapsed)(int index, void *start, void *end, double *ms);

    /* ---- kernels ------------------------------------------------------ */
    /* One table per op family; the optimizers' NULL means the host loops
     * of core/optim, which need memory the CPU addresses (cpu). */
    const struct fl_binary_kernels *binary;
    const struct fl_elementwise_kernels *elementwise;
    const struct fl_linear_kernels *linear;
    const struct fl_fused_kernels *fused;
    const struct fl_optim_kernels *optim;
    /* Which paths scaled_dot_product_attention took (fsdp.h:
     * fl_attention_paths); NULL: it has one path only. */
    void (*attention_paths)(int64_t counts[4]);
    /* The kernel launches counted (fsdp.h: fl_kernel_launches) into
     * counts, then set back to 0 when reset. NULL: it launches none. */
    void (*kernel_launches)(int64_t counts[2], bool reset);
    /* The version of a library the backend loaded, as that library
     * reports it (fsdp.h: fl_device_library_version); -1 for one it does
     * not use. NULL: none to report. */
    int64_t (*library_version)(const char *library);

    /* ---- collectives -------------------------------------------------- */
    /* The library that moves this device's memory between ranks itself
     * (NCCL), or NULL (none, not found at run time, or FSDP_NCCL=0). */
    const struct fl_device_comm_ops *(*comm_ops)(void);
} fl_backend;

/* A backend plugin's entry point (FL_BACKEND_PLUGIN_ENTRY). */
typedef const fl_backend *(*fl_backend_entry)(void);

/* The backend of a device kind with storage, opening its plugin on first
 * use; NULL (meta; or a plugin that is not installed or cannot be loaded:
 * fl_device_status says why) with no error recorded. */
FL_PLUGIN_API const fl_backend *fl_backend_of(fl_device device);
/* The backend of the first usable device of the accelerator kind (cuda)
 * that offers pinned host memory, or NULL (none, or no device). */
const fl_backend *fl_pinning_backend(void);

extern const fl_backend fl_cpu_backend;

#ifdef __cplusplus
}
#endif

#endif /* FL_BACKEND_H */
