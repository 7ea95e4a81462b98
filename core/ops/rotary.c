/*
 * rotary.c: rotary position embeddings in Hugging Face's convention: the
 * cos/sin tables (with Llama 3's frequency scaling) and their application
 * to queries and keys, forward and backward.
 *
 * Tables: inv_freq[i] = 1 / theta^(2i / D) for i < D/2, computed the way
 * transformers' _compute_default_rope_parameters and
 * _compute_llama3_parameters compute it, operation by operation in f32
 * (the exponent 2i/D, the power, the reciprocal; for llama3 the wavelength
 * 2*pi/inv_freq as reciprocal-times-2pi, the low/high frequency bands and
 * the smooth interpolation), so the tables agree with HF's to the last bit
 * but for the last-ulp differences of the f32 libm functions (cos, sin and
 * pow are evaluated in f64 and rounded). Then freqs[t, i] = t * inv_freq[i]
 * in f32, emb = cat(freqs, freqs) (HF builds from the two halves, not from
 * interleaved pairs), cos = cos(emb), sin = sin(emb), converted to the
 * requested dtype.
 *
 * Application: y = x * cos + rotate_half(x) * sin with rotate_half(x) =
 * cat(-x[D/2:], x[:D/2]), one pass over x, f32 math (f64 for f64), result
 * in x's dtype. Its backward is the transposed map, the rotation by -theta
 * (rotate_half is antisymmetric): dx = g * cos - rotate_half(g * sin).
 * cos and sin are constants (buffers); gradients do not flow to them.
 *
 * FLOPs: apply_rotary 3 per element each way; rope_tables T * D/2 (the
 * products t * inv_freq; the trigonometry is not counted).
 */
#include "fused.h"

#include <math.h>
#include <stdlib.h>

/* ---- tables ------------------------------------------------------------------ */

/* inv_freq as transformers computes it, in f32 (see the file comment). */
static void inverse_frequencies(int64_t half, int64_t dim, const fl_rope_options *o,
                                float *inv) {
    const float base = (float)o->theta;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)dim;
        float p = (float)pow((double)base, (double)e);
        inv[i] = 1.0f / p;
    }
    if (o->scaling != FL_ROPE_LLAMA3) return;
    const float factor = (float)o->factor;
    const float low = (float)o->low_freq_factor;
    const float old_len = (float)o->original_max_position_embeddings;
    const float low_wavelen = (float)(o->original_max_position_embeddings / o->low_freq_factor);
    const float high_wavelen = (float)(o->original_max_position_embeddings / o->high_freq_factor);
    const float two_pi = (float)(2 * M_PI);
    const float band = (float)(o->high_freq_factor - o->low_freq_factor);
    for (int64_t i = 0; i < half; i++) {
        float wavelen = (1.0f / inv[i]) * two_pi;
        /* Long wavelengths (low frequencies) are divided by the factor,
         * short ones kept, the band between interpolated smoothly. */
        float scaled = wavelen > low_wavelen ? inv[i] / factor : inv[i];
        float smooth = ((1.0f / wavelen) * old_len - low) / band;
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv[i] = medium ? smoothed : scaled;
    }
}

static int check_rope_options(const fl_rope_options *o) {
    const char *op = "rope_tables";
    if (!(o->theta > 0) || !isfinite(o->theta))
        return fl_fail(FL_ERR_ARG, "%s: theta must be a finite number > 0, got %g", op, o->theta);
    if (o->scaling == FL_ROPE_DEFAULT) return FL_OK;
    if (o->scaling != FL_ROPE_LLAMA3)
        return fl_fail(FL_ERR_ARG, "%s: unknown scaling %d (default 0, llama3 1)", op,
                       (int)o->scaling);
    if (!(o->factor > 0) || !(o->low_freq_factor > 0) || !(o->high_freq_factor > 0) ||
        !(o->original_max_position_embeddings > 0))
        return fl_fail(FL_ERR_ARG, "%s: llama3 scaling needs factor (%g), low_freq_factor (%g), "
                                   "high_freq_factor (%g) and original_max_position_embeddings "
                                   "(%g) all > 0",
                       op, o->factor, o->low_freq_factor, o->high_freq_factor,
                       o->original_max_position_embeddings);
    if (o->high_freq_factor == o->low_freq_factor)
        return fl_fail(FL_ERR_ARG, "%s: llama3 scaling needs high_freq_factor != low_freq_factor "
                                   "(both %g)",
                       op, o->low_freq_factor);
    return FL_OK;
}

int fl_rope_tables(int64_t seq_len, int64_t head_dim, const fl_rope_options *opts,
                   fl_dtype dtype, fl_device device, fl_tensor **cos_out, fl_tensor **sin_out) {
    const char *op = "rope_tables";
    if (!cos_out || !sin_out) return fl_fail(FL_ERR_ARG, "%s: NULL output pointer", op);
    *cos_out = *sin_out = NULL;
    fl_rope_options defaults = {.theta = 10000.0, .scaling = FL_ROPE_DEFAULT};
    const fl_rope_options *o = opts ? opts : &defaults;
    if (seq_len < 0)
        return fl_fail(FL_ERR_ARG, "%s: seq_len must be >= 0, got %lld", op, (long long)seq_len);
    if (head_dim <= 0 || head_dim % 2)
        return fl_fail(FL_ERR_ARG, "%s: head_dim must be even and > 0, got %lld", op,
                       (long long)head_dim);
    if (!fl_dtype_is_float(dtype))
        return fl_fail(FL_ERR_ARG, "%s: dtype must be a floating point type, got %s", op,
                       fl_dtype_name(dtype));
    if (check_rope_options(o)) return fl_last_status();
    int64_t shape[2] = {seq_len, head_dim};
    int64_t n;
    if (fl_check_shape(op, 2, shape, &n)) return fl_last_status();
    fl_flops_add(seq_len * (head_dim / 2));
    if (fl_device_kind_of(device) == FL_DEVICE_META) {
        *cos_out = fl_empty(2, shape, dtype, device);
        *sin_out = *cos_out ? fl_empty(2, shape, dtype, device) : NULL;
    } else {
        int64_t half = head_dim / 2;
        float *inv = malloc((size_t)half * sizeof *inv);
        float *c = malloc((size_t)(n ? n : 1) * sizeof *c);
        float *s = malloc((size_t)(n ? n : 1) * sizeof *s);
        if (!inv || !c || !s) {
            free(inv);
            free(c);
            free(s);
            return fl_fail(FL_ERR_OOM, "%s: out of host memory for [%lld, %lld] tables", op,
                           (long long)seq_len, (long long)head_dim);
        }
        inverse_frequencies(half, head_dim, o, inv);
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
        for (int64_t t = 0; t < seq_len; t++) {
            for (int64_t i = 0; i < half; i++) {
                float f = (float)t * inv[i];
                float cv = (float)cos((double)f), sv = (float)sin((double)f);
                c[t * head_dim + i] = c[t * head_dim + half + i] = cv;
                s[t * head_dim + i] = s[t * head_dim + half + i] = sv;
            }
        }
        *cos_out = fl_from_host(2, shape, dtype, device, c, FL_F32, n);
        *sin_out = *cos_out ? fl_from_host(2, shape, dtype, device, s, FL_F32, n) : NULL;
        free(inv);
        free(c);
        free(s);
    }
    if (!*sin_out) {
        fl_tensor_release(*cos_out);
        *cos_out = NULL;
        return fl_last_status();
    }
    return FL_OK;
}

/* ---- application ---------------------------------------------------------------- */

static const fl_node_type rotary_type;

static int check_table(const char *op, const char *what, const fl_tensor *t, const fl_tensor *x) {
    if (fl_fused_check_float(op, what, t) || fl_fused_check_device(op, what, t, x->device))
        return fl_last_status();
    if (t->ndim != 2 || t->shape[1] != x->shape[x->ndim - 1]) {
        char a[128], b[128];
        return fl_fail(FL_ERR_ARG, "%s: %s of shape %s must be [positions, %lld] for input %s", op,
                       what, fl_shape_str(t, a, sizeof a), (long long)x->shape[x->ndim - 1],
                       fl_shape_str(x, b, sizeof b));
    }
    if (fl_grad_enabled() && fl_requires_grad(t))
        return fl_fail(FL_ERR_ARG, "%s: %s requires grad, but the tables are constants (no "
                                   "gradient flows to them): detach() it",
                       op, what);
    return FL_OK;
}

static int check_positions(const char *op, const fl_tensor *pos, const fl_tensor *x) {
    if (fl_check_tensor(op, pos, false) || fl_fused_check_device(op, "positions", pos, x->device))
        return fl_last_status();
    if (pos->dtype != FL_I64 && pos->dtype != FL_I32)
        return fl_fail(FL_ERR_ARG, "%s: positions must be i64 (or i32), got %s", op,
                       fl_dtype_name(pos->dtype));
    int64_t t = x->shape[x->ndim - 2];
    bool ok = (pos->ndim == 1 && pos->shape[0] == t) ||
              (pos->ndim == 2 && x->ndim >= 3 && pos->shape[0] == x->shape[0] && pos->shape[1] == t);
    if (!ok) {
        char a[128], b[128];
        return fl_fail(FL_ERR_ARG, "%s: positions of shape %s must be [%lld] or [%lld, %lld] for "
                                   "input %s",
                       op, fl_shape_str(pos, a, sizeof a), (long long)t, (long long)x->shape[0],
                       (long long)t, fl_shape_str(x, b, sizeof b));
    }
    return FL_OK;
}

fl_tensor *fl_apply_rotary(const fl_tensor *x, const fl_tensor *cos, const fl_tensor *sin,
                           const fl_tensor *positions) {
    const char *op = "apply_rotary";
    if (fl_fused_check_float(op, "input", x)) return NULL;
    if (x->ndim < 2 || x->shape[x->ndim - 1] % 2) {
        char a[128];
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: input of shape %s must be [..., T, D] with an even D",
                            op, fl_shape_str(x, a, sizeof a));
    }
    if (check_table(op, "cos", cos, x) || check_table(op, "sin", sin, x)) return NULL;
    if (cos->shape[0] != sin->shape[0]) {
        char a[128], b[128];
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: cos %s and sin %s differ in shape", op,
                            fl_shape_str(cos, a, sizeof a), fl_shape_str(sin, b, sizeof b));
    }
    if (positions && check_positions(op, positions, x)) return NULL;
    int64_t t = x->shape[x->ndim - 2];
    if (!positions && cos->shape[0] < t) {
        char a[128], b[128];
        return FL_FAIL_NULL(FL_ERR_ARG, "%s: tables %s cover fewer positions than the %lld of input "
                                        "%s (give positions, or longer tables)",
                            op, fl_shape_str(cos, a, sizeof a), (long long)t,
                            fl_shape_str(x, b, sizeof b));
    }
    const fl_tensor *all[4] = {x, cos, sin, positions};
    bool no_storage = fl_fused_no_storage(4, all);
    fl_tensor *out = fl_fused_output(x->ndim, x->shape, x->dtype, x->device, no_storage);
    if (!out) return NULL;
    fl_flops_add(3 * x->numel);
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of(op, x->device);
        if (!k || k->rotary(out, x, cos, sin, positions, false) != FL_OK) {
            fl_tensor_release(out);
            return NULL;
        }
    }
    if (fl_needs_grad(1, &x)) {
        const fl_tensor *saved[3] = {cos, sin, positions};
        out = fl_fused_record(&rotary_type, 1, &x, out, 3, saved, NULL);
    }
    return out;
}

static int rotary_backward(fl_node *node, fl_tensor *const *go, fl_tensor **gi) {
    const fl_tensor *cos = node->saved[0], *sin = node->saved[1], *pos = node->saved[2];
    const fl_tensor *g = go[0];
    const fl_tensor *all[4] = {g, cos, sin, pos};
    bool no_storage = fl_fused_no_storage(4, all);
    /* The gradient goes back in x's dtype, which is the output's. */
    fl_dtype dtype = node->outputs[0].dtype;
    fl_tensor *dx = fl_fused_output(g->ndim, g->shape, dtype, g->device, no_storage);
    if (!dx) return fl_last_status();
    fl_flops_add(3 * g->numel);
    if (!no_storage) {
        const fl_fused_kernels *k = fl_fused_kernels_of("apply_rotary backward", g->device);
        if (!k || k->rotary(dx, g, cos, sin, pos, true) != FL_OK) {
            fl_tensor_release(dx);
            return fl_last_status();
        }
    }
    gi[0] = dx;
    return FL_OK;
}

static const fl_node_type rotary_type = {.name = "RotaryBackward", .backward = rotary_backward};
