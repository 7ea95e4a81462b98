/*
 * rotary.c: rotary position embeddings in Hugging Face's convention: the
 * cos/sin tables (with transformers' rope types: default, llama3, linear,
 * dynamic NTK, yarn, longrope) and their application to queries and keys,
 * forward and backward.
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
 * interleaved pairs), cos = cos(emb) * a, sin = sin(emb) * a, converted to
 * the requested dtype; a is the attention factor (yarn, longrope; else 1).
 * The other types follow transformers' functions the same way (linear:
 * inv_freq / factor; yarn: the f32 ramp between 1/pos and 1/(factor*pos)
 * over correction dims computed in f64; longrope: 1/(ext[i] * pos) with
 * f32 factors); dynamic NTK's longer-context base is f32 arithmetic
 * because transformers' update computes it from a tensor length. The
 * length-dependent types (dynamic, longrope) take the length from
 * opts->context_len, else the table's length: a table serves one forward
 * of that many positions, as transformers recomputes per forward.
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
#include "shape.h"
#include "storage.h"
#include "flops.h"

#include <math.h>
#include <stdlib.h>

/* ---- tables ------------------------------------------------------------------ */

/* theta^(2i / D) in f32 as torch computes base ** (arange(0, D, 2).float() / D):
 * the exponent divided in f32, the power rounded from f64 (torch's f32 pow
 * is within an ulp of it). */
static float power(float base, int64_t i, int64_t dim) {
    float e = (float)(2 * i) / (float)dim;
    return (float)pow((double)base, (double)e);
}

static void default_frequencies(int64_t half, int64_t dim, float base, float *inv) {
    for (int64_t i = 0; i < half; i++) inv[i] = 1.0f / power(base, i, dim);
}

/* Llama 3.1: long wavelengths (low frequencies) are divided by the factor,
 * short ones kept, the band between interpolated smoothly. */
static void llama3_frequencies(int64_t half, const fl_rope_options *o, float *inv) {
    const float factor = (float)o->factor;
    const float low = (float)o->low_freq_factor;
    const float old_len = (float)o->original_max_position_embeddings;
    const float low_wavelen = (float)(o->original_max_position_embeddings / o->low_freq_factor);
    const float high_wavelen = (float)(o->original_max_position_embeddings / o->high_freq_factor);
    const float two_pi = (float)(2 * M_PI);
    const float band = (float)(o->high_freq_factor - o->low_freq_factor);
    for (int64_t i = 0; i < half; i++) {
        float wavelen = (1.0f / inv[i]) * two_pi;
        float scaled = wavelen > low_wavelen ? inv[i] / factor : inv[i];
        float smooth = ((1.0f / wavelen) * old_len - low) / band;
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv[i] = medium ? smoothed : scaled;
    }
}

/* Dynamic NTK past max_position_embeddings: transformers' update runs on a
 * tensor sequence length, so the new base is f32 arithmetic:
 * theta * ((factor * L / max) - (factor - 1)) ^ (D / (D - 2)). Within
 * max_position_embeddings the frequencies are the default ones. */
static void dynamic_frequencies(int64_t half, int64_t dim, const fl_rope_options *o, double len,
                                float *inv) {
    float base = (float)o->theta;
    if (len > o->max_position_embeddings) {
        float grown = (float)len * (float)o->factor / (float)o->max_position_embeddings -
                      (float)(o->factor - 1);
        float p = (float)pow((double)grown, (double)dim / (double)(dim - 2));
        base = base * p;
    }
    default_frequencies(half, dim, base, inv);
}

static double yarn_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* The correction dim of YaRN (f64, as transformers' Python floats). */
static double correction_dim(double rotations, int64_t dim, double base, double orig) {
    return ((double)dim * log(orig / (rotations * 2 * M_PI))) / (2 * log(base));
}

/* YaRN: extrapolated frequencies for the high ones, interpolated (divided
 * by the factor) for the low, a linear ramp between the correction dims. */
static void yarn_frequencies(int64_t half, int64_t dim, const fl_rope_options *o, double factor,
                             float *inv) {
    const double base = o->theta, orig = o->original_max_position_embeddings;
    double fast = o->beta_fast ? o->beta_fast : 32, slow = o->beta_slow ? o->beta_slow : 1;
    double lo = correction_dim(fast, dim, base, orig), hi = correction_dim(slow, dim, base, orig);
    if (!o->no_truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < (double)(dim - 1) ? hi : (double)(dim - 1);
    if (lo == hi) hi += 0.001; /* (transformers' guard against a zero-width ramp) */
    const float flo = (float)lo, width = (float)(hi - lo), ffactor = (float)factor;
    for (int64_t i = 0; i < half; i++) {
        float pos = power((float)base, i, dim);
        float extrapolated = 1.0f / pos, interpolated = 1.0f / (ffactor * pos);
        float ramp = ((float)i - flo) / width;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float keep = 1.0f - ramp; /* the share of the extrapolated frequency */
        float a = interpolated * (1.0f - keep), b = extrapolated * keep;
        inv[i] = a + b;
    }
}

/* LongRoPE: 1 / (ext[i] * theta^(2i/D)) with the short factors up to the
 * original length, the long ones past it. */
static void longrope_frequencies(int64_t half, int64_t dim, const fl_rope_options *o, double len,
                                 float *inv) {
    const double *ext = len > o->original_max_position_embeddings ? o->long_factor : o->short_factor;
    for (int64_t i = 0; i < half; i++)
        inv[i] = 1.0f / ((float)ext[i] * power((float)o->theta, i, dim));
}

/* The factor of yarn and longrope: given, else max / original positions. */
static double scale_factor(const fl_rope_options *o) {
    return o->factor ? o->factor : o->max_position_embeddings / o->original_max_position_embeddings;
}

/* inv_freq as transformers computes it, in f32 (see the file comment), and
 * the factor that multiplies cos and sin. */
static void inverse_frequencies(int64_t half, int64_t dim, const fl_rope_options *o, double len,
                                float *inv, double *attention) {
    *attention = 1.0;
    switch (o->scaling) {
    case FL_ROPE_LLAMA3:
        default_frequencies(half, dim, (float)o->theta, inv);
        llama3_frequencies(half, o, inv);
        return;
    case FL_ROPE_LINEAR:
        default_frequencies(half, dim, (float)o->theta, inv);
        for (int64_t i = 0; i < half; i++) inv[i] = inv[i] / (float)o->factor;
        return;
    case FL_ROPE_DYNAMIC: dynamic_frequencies(half, dim, o, len, inv); return;
    case FL_ROPE_YARN: {
        double factor = scale_factor(o);
        yarn_frequencies(half, dim, o, factor, inv);
        if (o->attention_factor) *attention = o->attention_factor;
        else if (o->mscale && o->mscale_all_dim)
            *attention = yarn_mscale(factor, o->mscale) / yarn_mscale(factor, o->mscale_all_dim);
        else *attention = yarn_mscale(factor, 1);
        return;
    }
    case FL_ROPE_LONGROPE: {
        double factor = scale_factor(o);
        longrope_frequencies(half, dim, o, len, inv);
        if (o->attention_factor) *attention = o->attention_factor;
        else if (factor > 1)
            *attention = sqrt(1 + log(factor) / log(o->original_max_position_embeddings));
        return;
    }
    default: default_frequencies(half, dim, (float)o->theta, inv); return;
    }
}

/* A finite number > 0 (or, where zero means a default, >= 0). */
static bool positive(double v) { return v > 0 && isfinite(v); }
static bool unset_or_positive(double v) { return v == 0 || positive(v); }

static int check_rope_options(const fl_rope_options *o, int64_t head_dim) {
    const char *op = "rope_tables";
    static const char *names[] = {"default", "llama3", "linear", "dynamic", "yarn", "longrope"};
    if (!positive(o->theta))
        return fl_fail(FL_ERR_ARG, "%s: theta must be a finite number > 0, got %g", op, o->theta);
    if (o->scaling < FL_ROPE_DEFAULT || o->scaling > FL_ROPE_LONGROPE)
        return fl_fail(FL_ERR_ARG, "%s: unknown scaling %d (default 0, llama3 1, linear 2, dynamic 3, "
                                   "yarn 4, longrope 5)",
                       op, (int)o->scaling);
    const char *kind = names[o->scaling];
    if (!(o->context_len >= 0) || !isfinite(o->context_len))
        return fl_fail(FL_ERR_ARG, "%s: context_len must be >= 0, got %g", op, o->context_len);
    switch (o->scaling) {
    case FL_ROPE_DEFAULT: return FL_OK;
    case FL_ROPE_LLAMA3:
        if (!positive(o->factor) || !positive(o->low_freq_factor) || !positive(o->high_freq_factor) ||
            !positive(o->original_max_position_embeddings))
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
    case FL_ROPE_LINEAR:
        if (!positive(o->factor))
            return fl_fail(FL_ERR_ARG, "%s: linear scaling needs factor > 0, got %g", op, o->factor);
        return FL_OK;
    case FL_ROPE_DYNAMIC:
        if (!positive(o->factor) || !positive(o->max_position_embeddings))
            return fl_fail(FL_ERR_ARG, "%s: dynamic scaling needs factor (%g) and "
                                       "max_position_embeddings (%g) > 0",
                           op, o->factor, o->max_position_embeddings);
        if (head_dim <= 2)
            return fl_fail(FL_ERR_ARG, "%s: dynamic scaling needs head_dim > 2, got %lld", op,
                           (long long)head_dim);
        return FL_OK;
    default: break;
    }
    /* yarn, longrope */
    if (!positive(o->original_max_position_embeddings) || !unset_or_positive(o->factor) ||
        !unset_or_positive(o->attention_factor))
        return fl_fail(FL_ERR_ARG, "%s: %s scaling needs original_max_position_embeddings (%g) > 0, "
                                   "factor (%g) and attention_factor (%g) >= 0 (0: derived)",
                       op, kind, o->original_max_position_embeddings, o->factor, o->attention_factor);
    if (!o->factor && !positive(o->max_position_embeddings))
        return fl_fail(FL_ERR_ARG, "%s: %s scaling without a factor needs max_position_embeddings > 0 "
                                   "(the factor is max_position_embeddings / "
                                   "original_max_position_embeddings), got %g",
                       op, kind, o->max_position_embeddings);
    if (o->scaling == FL_ROPE_YARN) {
        if (!isfinite(o->beta_fast) || !isfinite(o->beta_slow) || !isfinite(o->mscale) ||
            !isfinite(o->mscale_all_dim))
            return fl_fail(FL_ERR_ARG, "%s: yarn's beta_fast, beta_slow, mscale and mscale_all_dim "
                                       "must be finite",
                           op);
        return FL_OK;
    }
    if (o->n_factors != head_dim / 2 || !o->short_factor || !o->long_factor)
        return fl_fail(FL_ERR_ARG, "%s: longrope scaling needs short_factor and long_factor of "
                                   "head_dim / 2 = %lld entries each, got %lld",
                       op, (long long)(head_dim / 2), (long long)o->n_factors);
    for (int64_t i = 0; i < o->n_factors; i++) {
        if (!positive(o->short_factor[i]) || !positive(o->long_factor[i]))
            return fl_fail(FL_ERR_ARG, "%s: longrope factors must be finite numbers > 0, entry %lld "
                                       "is %g (short) and %g (long)",
                           op, (long long)i, o->short_factor[i], o->long_factor[i]);
    }
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
    if (check_rope_options(o, head_dim)) return fl_last_status();
    int64_t shape[2] = {seq_len, head_dim};
    int64_t n;
    if (fl_check_shape(op, 2, shape, &n)) return fl_last_status();
    fl_flops_add(seq_len * (head_dim / 2));
    if (fl_device_kind_of(device) == FL_DEVICE_META) {
        /* (counted as fl_from_host counts the other devices' tables) */
        *cos_out = fl_empty(2, shape, dtype, device);
        *sin_out = *cos_out ? fl_empty(2, shape, dtype, device) : NULL;
        if (*sin_out) {
            fl_count_bytes("from_host", 1, (const fl_tensor *[]){*cos_out});
            fl_count_bytes("from_host", 1, (const fl_tensor *[]){*sin_out});
        }
    } else {
        int64_t half = head_dim / 2;
        float *inv = malloc((size_t)half * sizeof *inv);
        float *c = malloc((size_t)(n ? n : 1) * sizeof *c);
        float *s = malloc((size_t)(n ? n : 1) * sizeof *s);
        if (!inv || !c || !s) {
            free(inv);
            free(c);
            free(s);
            return fl_fail(FL_ERR_OOM, "%s: out of CPU memory for [%lld, %lld] tables", op,
                           (long long)seq_len, (long long)head_dim);
        }
        double attention;
        double len = o->context_len > 0 ? o->context_len : (double)seq_len;
        inverse_frequencies(half, head_dim, o, len, inv, &attention);
        const float scale = (float)attention;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
        for (int64_t t = 0; t < seq_len; t++) {
            for (int64_t i = 0; i < half; i++) {
                float f = (float)t * inv[i];
                /* (times 1 leaves the default tables' bits alone) */
                float cv = (float)cos((double)f) * scale, sv = (float)sin((double)f) * scale;
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
    fl_count_bytes(op, 2, (const fl_tensor *[]){x, out}); /* (the tables' rows are small) */
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
    fl_count_bytes("apply_rotary backward", 2, (const fl_tensor *[]){g, dx});
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
