/*
 * fused.h: the kernel table of the fused family (RMS and layer norms,
 * softmax and log-softmax, cross-entropy and NLL loss, rotary embeddings,
 * scaled dot-product attention) and the helpers its op files share.
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
#ifndef FL_OPS_FUSED_H
#define FL_OPS_FUSED_H

#include "internal.h"

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

typedef struct fl_fused_kernels {
    /* Over the last dim of x ([rows, n] seen row by row). w, b may be NULL.
     * rstd, mean: [rows]. out is rounded to x's dtype before the weight
     * multiply (Llama's RMSNorm), see norm.c. */
    int (*rms_norm)(fl_tensor *out, fl_tensor *rstd, const fl_tensor *x, const fl_tensor *w,
                    double eps);
    int (*rms_norm_backward)(fl_tensor *dx, fl_tensor *dw, const fl_tensor *g, const fl_tensor *x,
                             const fl_tensor *w, const fl_tensor *rstd);
    /* h = x + a rounded to h's dtype (x's), then rms_norm of h into out
     * and rstd, as rms_norm would from h ([Note: residual add fused with
     * RMSNorm], norm.c). x and a: same shape and dtype, any strides. */
    int (*add_rms_norm)(fl_tensor *h, fl_tensor *out, fl_tensor *rstd, const fl_tensor *x,
                        const fl_tensor *a, const fl_tensor *w, double eps);
    /* dh = gh + rms_norm_backward's dx of gy (gh NULL: none), rounded once
     * to dh's dtype; dw as rms_norm_backward's. dh or dw may be NULL. */
    int (*add_rms_norm_backward)(fl_tensor *dh, fl_tensor *dw, const fl_tensor *gh,
                                 const fl_tensor *gy, const fl_tensor *h, const fl_tensor *w,
                                 const fl_tensor *rstd);
    int (*layer_norm)(fl_tensor *out, fl_tensor *mean, fl_tensor *rstd, const fl_tensor *x,
                      const fl_tensor *w, const fl_tensor *b, double eps);
    /* dx, dw, db may each be NULL (not wanted). */
    int (*layer_norm_backward)(fl_tensor *dx, fl_tensor *dw, fl_tensor *db, const fl_tensor *g,
                               const fl_tensor *x, const fl_tensor *w, const fl_tensor *mean,
                               const fl_tensor *rstd);
    /* Along dim of x; y is the forward output (softmax or log-softmax). */
    int (*softmax)(fl_tensor *out, const fl_tensor *x, int dim, bool log);
    int (*softmax_backward)(fl_tensor *dx, const fl_tensor *g, const fl_tensor *y, int dim,
                            bool log);
    /* logits [rows, C] (last dim), targets [rows] of an integer dtype.
     * rows_out: NULL, or [rows] per-row losses (reduction 'none'); lse:
     * [rows]. *total gets the sum of the row losses, *count the number of
     * rows whose target is not ignore_index. */
    int (*cross_entropy)(fl_tensor *rows_out, fl_tensor *lse, const fl_tensor *logits,
                         const fl_tensor *targets, const fl_loss_params *p, double *total,
                         int64_t *count);
    /* dlogits = scale_r * (softmax - (1 - ls) * onehot - ls / C), with
     * scale_r = g_rows[r] if g_rows else g_scalar; 0 for ignored rows. */
    int (*cross_entropy_backward)(fl_tensor *dlogits, const fl_tensor *g_rows, double g_scalar,
                                  const fl_tensor *logits, const fl_tensor *targets,
                                  const fl_tensor *lse, const fl_loss_params *p);
    int (*nll_loss)(fl_tensor *rows_out, const fl_tensor *log_probs, const fl_tensor *targets,
                    const fl_loss_params *p, double *total, int64_t *count);
    /* dlp must be zeroed: only the target entries are written. */
    int (*nll_loss_backward)(fl_tensor *dlp, const fl_tensor *g_rows, double g_scalar,
                             const fl_tensor *targets, const fl_loss_params *p);
    /* out = x*cos + rotate_half(x)*sin over x's last two dims [T, D];
     * inverse: the transposed map (the backward). positions: NULL or
     * integer [T] or [x.shape[0], T], rows of cos/sin to use. */
    int (*rotary)(fl_tensor *out, const fl_tensor *x, const fl_tensor *cos, const fl_tensor *sin,
                  const fl_tensor *positions, bool inverse);
    int (*attention)(const fl_attention_args *a);
    int (*attention_backward)(const fl_attention_args *a);
    /* Optional (NULL where the device has none): attention through a
     * library's fused kernels on the inputs' own 16-bit dtype: q, k, v,
     * bias, o, dout, out, dq, dk, dv all in q's dtype (bf16 or f16), lse in
     * f32, dbias never. q, k, v and bias keep the caller's strides. Sets
     * *done when it ran; leaves it false, without an error, where the
     * library does not cover the configuration (layout, sizes, dtype), and
     * the op then runs the kernels above on f32 copies. */
    int (*attention_native)(const fl_attention_args *a, bool *done);
    int (*attention_native_backward)(const fl_attention_args *a, bool *done);
} fl_fused_kernels;

extern const fl_fused_kernels fl_cpu_fused_kernels;

/* The table for a device, or NULL with an error naming the op. */
const fl_fused_kernels *fl_fused_kernels_of(const char *op, fl_device device);

/* ---- helpers shared by the op files (fused_common.c) ---------------------- */

/* f64 for f64, f32 for the other float dtypes. */
fl_dtype fl_fused_compute_dtype(fl_dtype dtype);
/* Fail unless t is a floating point tensor ("rms_norm: weight must be a
 * floating point tensor, got i64"). */
int fl_fused_check_float(const char *op, const char *what, const fl_tensor *t);
/* Fail unless t is on `device` (names both). */
int fl_fused_check_device(const char *op, const char *what, const fl_tensor *t,
                          fl_device device);
/* True if any non-NULL tensor has no storage (meta or fake): the op then
 * only infers shapes. */
bool fl_fused_no_storage(int n, const fl_tensor *const *ts);
/* A new output: fake (no storage) when no_storage, else allocated. */
fl_tensor *fl_fused_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                           bool no_storage);
/* t converted to dtype with a contiguous last dim (t itself when it
 * already is), outside autograd: kernels' view of an input. */
fl_tensor *fl_fused_prepare(const fl_tensor *t, fl_dtype dtype);
/* Record a one-output node saving `saved`; on failure releases out and
 * returns NULL. Returns out otherwise. node_out may be NULL. */
fl_tensor *fl_fused_record(const fl_node_type *type, int n_in, const fl_tensor *const *inputs,
                           fl_tensor *out, int n_saved, const fl_tensor *const *saved,
                           fl_node **node_out);
/* The gradient g converted to `like`'s dtype (new reference; g consumed). */
fl_tensor *fl_fused_as_dtype(fl_tensor *g, fl_dtype dtype);

#endif /* FL_OPS_FUSED_H */
