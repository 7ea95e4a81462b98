/*
 * cpu_conv2d.c: CPU kernels of conv2d by im2col + GEMM, and its backward
 * (dw by GEMM against the same columns, dx by GEMM into columns and col2im,
 * db by sums).
 *
 * Per image: the receptive fields are unrolled into columns col [C*kh*kw,
 * Ho*Wo] and out = W [O, C*kh*kw] @ col is one GEMM. When one image's GEMM
 * is small (MNIST sizes: OpenBLAS would run it on one thread anyway),
 * images are spread over OpenMP threads, each with its own column buffer
 * (and its own dw accumulator, summed at the end in a fixed order);
 * otherwise images go one after another and each GEMM is threaded by
 * OpenBLAS. im2col and col2im stay serial: they are short next to the GEMM,
 * and an OpenMP region right before a GEMM leaves libgomp's workers
 * spinning on the cores OpenBLAS's threads need (measured on 2 cores:
 * conv2d of MNIST's second layer took 21 ms with a parallel im2col, 15 ms
 * with a serial one). A 1x1 kernel with stride 1 and no padding needs no
 * columns: the image is already [C, H*W].
 *
 * bf16/f16 tensors are converted to f32 once per call and results rounded
 * once back; f64 stays f64.
 */
#include "cpu_iter.h"
#include "cpu_linear.h"

#include <omp.h>
#include <string.h>

enum { PARALLEL_MIN = 1 << 16 };

typedef struct geom {
    int64_t N, C, H, W, O, kh, kw, Ho, Wo, sh, sw, ph, pw, dh, dw;
    int64_t K, P; /* rows (C*kh*kw) and columns (Ho*Wo) of one image's col */
} geom;

static geom make_geom(const fl_tensor *x, const fl_tensor *w, int64_t Ho, int64_t Wo,
                      const fl_conv2d_options *o) {
    geom g = {
        .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
        .O = w->shape[0], .kh = w->shape[2], .kw = w->shape[3], .Ho = Ho, .Wo = Wo,
        .sh = o->stride[0], .sw = o->stride[1], .ph = o->padding[0], .pw = o->padding[1],
        .dh = o->dilation[0], .dw = o->dilation[1],
    };
    g.K = g.C * g.kh * g.kw;
    g.P = g.Ho * g.Wo;
    return g;
}

/* No columns needed: every output pixel reads exactly its own input pixel. */
static bool is_pointwise(const geom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* im2col of one image x [C, H, W] into col [K, P]: pure data movement, so
 * byte-generic (es = 4 or 8); zeros where a window reaches into padding. */
static void im2col(const char *x, char *col, const geom *g, size_t es) {
    for (int64_t r = 0; r < g->K; r++) {
        int64_t c = r / (g->kh * g->kw), ki = (r / g->kw) % g->kh, kj = r % g->kw;
        int64_t off = kj * g->dw - g->pw; /* iw = ow * sw + off */
        for (int64_t oh = 0; oh < g->Ho; oh++) {
            char *dst = col + (r * g->P + oh * g->Wo) * (int64_t)es;
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;
            if (ih < 0 || ih >= g->H) {
                memset(dst, 0, (size_t)g->Wo * es);
                continue;
            }
            const char *src = x + ((c * g->H + ih) * g->W) * (int64_t)es;
            if (g->sw == 1) { /* one contiguous run between two zero margins */
                int64_t lo = off < 0 ? -off : 0, hi = g->W - off;
                if (hi > g->Wo) hi = g->Wo;
                if (hi < lo) hi = lo;
                if (lo > g->Wo) lo = hi = g->Wo;
                memset(dst, 0, (size_t)lo * es);
                memcpy(dst + lo * (int64_t)es, src + (lo + off) * (int64_t)es, (size_t)(hi - lo) * es);
                memset(dst + hi * (int64_t)es, 0, (size_t)(g->Wo - hi) * es);
            } else if (es == 4) {
                float *d = (float *)dst;
                const float *s = (const float *)src;
                for (int64_t ow = 0; ow < g->Wo; ow++) {
                    int64_t iw = ow * g->sw + off;
                    d[ow] = iw >= 0 && iw < g->W ? s[iw] : 0.0f;
                }
            } else {
                double *d = (double *)dst;
                const double *s = (const double *)src;
                for (int64_t ow = 0; ow < g->Wo; ow++) {
                    int64_t iw = ow * g->sw + off;
                    d[ow] = iw >= 0 && iw < g->W ? s[iw] : 0.0;
                }
            }
        }
    }
}

/* col2im: x [C, H, W] = the sum of the columns' entries at the pixels
 * they were read from. */
#define DEFINE_COL2IM_CHANNEL(T, NAME)                                                        \
    static void NAME(const T *col, T *x, const geom *g, int64_t c) {                          \
        for (int64_t ki = 0; ki < g->kh; ki++) {                                              \
            for (int64_t kj = 0; kj < g->kw; kj++) {                                          \
                const T *row = col + ((c * g->kh + ki) * g->kw + kj) * g->P;                   \
                int64_t off = kj * g->dw - g->pw;                                             \
                for (int64_t oh = 0; oh < g->Ho; oh++) {                                      \
                    int64_t ih = oh * g->sh - g->ph + ki * g->dh;                             \
                    if (ih < 0 || ih >= g->H) continue;                                       \
                    T *dst = x + (c * g->H + ih) * g->W;                                      \
                    const T *src = row + oh * g->Wo;                                          \
                    for (int64_t ow = 0; ow < g->Wo; ow++) {                                  \
                        int64_t iw = ow * g->sw + off;                                        \
                        if (iw >= 0 && iw < g->W) dst[iw] += src[ow];                         \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }
DEFINE_COL2IM_CHANNEL(float, col2im_channel_f32)
DEFINE_COL2IM_CHANNEL(double, col2im_channel_f64)

static void col2im(const char *col, char *x, const geom *g, fl_dtype ct) {
    memset(x, 0, (size_t)(g->C * g->H * g->W) * fl_dtype_size(ct));
    for (int64_t c = 0; c < g->C; c++) {
        if (ct == FL_F32) col2im_channel_f32((const float *)col, (float *)x, g, c);
        else col2im_channel_f64((const double *)col, (double *)x, g, c);
    }
}

/* ---- dtype handling ------------------------------------------------------------ */

/* t's values in the compute dtype: t's own memory when it already is (t is
 * contiguous), else a converted copy in *owned. */
static int in_ct(const fl_tensor *t, fl_dtype ct, const char **data, fl_tensor **owned) {
    *owned = NULL;
    *data = t->data;
    if (t->dtype == ct) return FL_OK;
    *owned = fl_empty(t->ndim, t->shape, ct, t->device);
    if (!*owned) return fl_last_status();
    *data = (*owned)->data;
    return fl_convert((*owned)->data, ct, t->data, t->dtype, t->numel);
}

/* Where a kernel writes t in the compute dtype: t itself, or a scratch
 * tensor (*owned) converted into t by put_back. */
static int out_ct(fl_tensor *t, fl_dtype ct, char **data, fl_tensor **owned) {
    *owned = NULL;
    *data = t->data;
    if (t->dtype == ct) return FL_OK;
    *owned = fl_empty(t->ndim, t->shape, ct, t->device);
    if (!*owned) return fl_last_status();
    *data = (*owned)->data;
    return FL_OK;
}

static int put_back(fl_tensor *t, const fl_tensor *owned) {
    return owned ? fl_convert(t->data, t->dtype, owned->data, owned->dtype, t->numel) : FL_OK;
}

/* A scratch buffer of n elements of ct (counted in the memory statistics,
 * so a memory limit applies to it like to any tensor). */
static fl_tensor *scratch(int64_t n, fl_dtype ct) {
    return fl_empty(1, &n, ct, fl_device_make(FL_DEVICE_CPU, 0));
}

/* ---- forward ---------------------------------------------------------------------- */

typedef struct conv_ctx {
    geom g;
    fl_dtype ct;
    size_t cs;
    const char *x, *w, *gy;
    const double *bias; /* O values, or NULL */
    char *out, *gx;
} conv_ctx;

static void forward_image(const conv_ctx *c, int64_t n, char *col) {
    const geom *g = &c->g;
    const char *xn = c->x + n * g->C * g->H * g->W * (int64_t)c->cs;
    char *on = c->out + n * g->O * g->P * (int64_t)c->cs;
    double beta = 0;
    if (c->bias) { /* bias rows first; the GEMM adds to them */
        for (int64_t o = 0; o < g->O; o++) {
            if (c->ct == FL_F32) {
                float *row = (float *)on + o * g->P, v = (float)c->bias[o];
                for (int64_t p = 0; p < g->P; p++) row[p] = v;
            } else {
                double *row = (double *)on + o * g->P, v = c->bias[o];
                for (int64_t p = 0; p < g->P; p++) row[p] = v;
            }
        }
        beta = 1;
    }
    const char *cols = xn;
    if (!is_pointwise(g)) {
        im2col(xn, col, g, c->cs);
        cols = col;
    }
    fl_cpu_gemm_ct(c->ct, false, false, g->O, g->P, g->K, c->w, g->K, cols, g->P, beta, on, g->P);
}

/* How many threads take whole images: all of them when one image's GEMM is
 * too small for OpenBLAS to thread, else one. */
static int image_threads(const geom *g) {
    return g->N > 1 && g->O * g->P * g->K <= FL_CPU_SMALL_GEMM ? omp_get_max_threads() : 1;
}

int fl_cpu_conv2d(fl_tensor *out, const fl_tensor *x, const fl_tensor *w, const fl_tensor *bias,
                  const fl_conv2d_options *o) {
    conv_ctx c = {.g = make_geom(x, w, out->shape[2], out->shape[3], o)};
    const geom *g = &c.g;
    c.ct = x->dtype == FL_F64 ? FL_F64 : FL_F32;
    c.cs = fl_dtype_size(c.ct);
    fl_tensor *xo = NULL, *wo = NULL, *oo = NULL, *cols = NULL, *bo = NULL;
    int rc = in_ct(x, c.ct, &c.x, &xo);
    if (rc == FL_OK) rc = in_ct(w, c.ct, &c.w, &wo);
    if (rc == FL_OK) rc = out_ct(out, c.ct, &c.out, &oo);
    if (rc == FL_OK && bias) {
        bo = fl_empty(1, &g->O, FL_F64, out->device);
        rc = bo ? fl_cpu_backend.copy(bo, bias) : (int)fl_last_status();
        if (rc == FL_OK) c.bias = bo->data;
    }
    int threads = image_threads(g);
    if (rc == FL_OK && !is_pointwise(g)) {
        cols = scratch(threads * g->K * g->P, c.ct);
        if (!cols) rc = fl_last_status();
    }
    if (rc == FL_OK) {
        char *colbase = cols ? cols->data : NULL;
        int64_t colbytes = g->K * g->P * (int64_t)c.cs;
        /* [Note: no library call inside an idle OpenMP region], cpu_matmul.c */
        if (threads > 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t n = 0; n < g->N; n++)
                forward_image(&c, n, colbase ? colbase + omp_get_thread_num() * colbytes : NULL);
        } else {
            for (int64_t n = 0; n < g->N; n++) forward_image(&c, n, colbase);
        }
        rc = put_back(out, oo);
    }
    fl_tensor_release(xo);
    fl_tensor_release(wo);
    fl_tensor_release(oo);
    fl_tensor_release(cols);
    fl_tensor_release(bo);
    return rc;
}

/* ---- backward --------------------------------------------------------------------- */

/* dw_acc [O, K] += gy[n] @ col^T; gx[n] = col2im(W^T @ gy[n]). */
static void backward_image(const conv_ctx *c, int64_t n, char *col, char *dcol, char *dw_acc) {
    const geom *g = &c->g;
    int64_t xsize = g->C * g->H * g->W * (int64_t)c->cs;
    const char *gyn = c->gy + n * g->O * g->P * (int64_t)c->cs;
    bool pointwise = is_pointwise(g);
    if (dw_acc) {
        const char *cols = c->x + n * xsize;
        if (!pointwise) {
            im2col(cols, col, g, c->cs);
            cols = col;
        }
        fl_cpu_gemm_ct(c->ct, false, true, g->O, g->K, g->P, gyn, g->P, cols, g->P, 1.0, dw_acc,
                       g->K);
    }
    if (c->gx) {
        char *gxn = c->gx + n * xsize;
        fl_cpu_gemm_ct(c->ct, true, false, g->K, g->P, g->O, c->w, g->K, gyn, g->P, 0.0,
                       pointwise ? gxn : dcol, g->P);
        if (!pointwise) col2im(dcol, gxn, g, c->ct);
    }
}

/* gb[o] = sum of gy over images and pixels, in double. */
static int bias_grad(fl_tensor *gb, const fl_tensor *gy, const geom *g) {
    fl_tensor *acc = scratch(g->O, FL_F64);
    if (!acc) return fl_last_status();
    double *a = acc->data;
    size_t es = fl_dtype_size(gy->dtype);
    const char *base = gy->data;
#pragma omp parallel for schedule(static) if (g->N * g->O * g->P >= PARALLEL_MIN)
    for (int64_t o = 0; o < g->O; o++) {
        double s = 0, tmp[FL_CPU_SCRATCH];
        for (int64_t n = 0; n < g->N; n++) {
            const char *row = base + ((n * g->O + o) * g->P) * (int64_t)es;
            for (int64_t p = 0; p < g->P; p += FL_CPU_SCRATCH) {
                int64_t len = g->P - p < FL_CPU_SCRATCH ? g->P - p : FL_CPU_SCRATCH;
                fl_cpu_load(tmp, FL_F64, row + p * (int64_t)es, gy->dtype, 1, len);
                for (int64_t j = 0; j < len; j++) s += tmp[j];
            }
        }
        a[o] = s;
    }
    int rc = fl_convert(gb->data, gb->dtype, a, FL_F64, g->O);
    fl_tensor_release(acc);
    return rc;
}

/* What the threads of backward_images share. */
typedef struct backward_share {
    const conv_ctx *c;
    bool want_gx;
    char *gwd, *buf;  /* dw (ct, [O, K]) or NULL; the threads' scratch */
    int64_t per;      /* scratch elements per thread */
    bool private_dw;  /* each thread sums dw into its own accumulator */
} backward_share;

/* One thread's images (all of them on one thread, outside a region). */
static void backward_thread(const backward_share *sh) {
    const conv_ctx *c = sh->c;
    const geom *g = &c->g;
    bool pointwise = is_pointwise(g);
    int64_t kp = g->K * g->P, ok = g->O * g->K;
    size_t cs = c->cs;
    char *p = sh->buf ? sh->buf + omp_get_thread_num() * sh->per * (int64_t)cs : NULL;
    char *col = NULL, *dcol = NULL, *acc = sh->gwd;
    if (sh->gwd && !pointwise) col = p, p += kp * (int64_t)cs;
    if (sh->want_gx && !pointwise) dcol = p, p += kp * (int64_t)cs;
    if (sh->gwd && sh->private_dw) {
        acc = p;
        memset(acc, 0, (size_t)ok * cs);
    }
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g->N; n++) backward_image(c, n, col, dcol, acc);
}

/* The per-image part of the backward: dw into gwd (ct, [O, K]) when
 * wanted, gx (in c->gx) when wanted. */
static int backward_images(const conv_ctx *c, bool want_gx, char *gwd) {
    const geom *g = &c->g;
    int threads = image_threads(g);
    bool pointwise = is_pointwise(g);
    size_t cs = c->cs;
    /* Per thread: columns for dw, columns for dx, and (with several
     * threads) a private dw accumulator, last. */
    int64_t kp = g->K * g->P, ok = g->O * g->K;
    int64_t per = (gwd && !pointwise ? kp : 0) + (want_gx && !pointwise ? kp : 0) +
                  (gwd && threads > 1 ? ok : 0);
    fl_tensor *scr = NULL;
    if (per > 0 && !(scr = scratch(threads * per, c->ct))) return fl_last_status();
    char *buf = scr ? scr->data : NULL;
    if (gwd) memset(gwd, 0, (size_t)ok * cs);
    backward_share sh = {c, want_gx, gwd, buf, per, threads > 1};
    /* [Note: no library call inside an idle OpenMP region], cpu_matmul.c */
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        backward_thread(&sh);
    } else {
        backward_thread(&sh);
    }
    if (gwd && threads > 1) { /* the private accumulators, added in thread order */
        for (int t = 0; t < threads; t++) {
            const char *acc = buf + (t * per + per - ok) * (int64_t)cs;
            if (c->ct == FL_F32)
                for (int64_t i = 0; i < ok; i++) ((float *)gwd)[i] += ((const float *)acc)[i];
            else
                for (int64_t i = 0; i < ok; i++) ((double *)gwd)[i] += ((const double *)acc)[i];
        }
    }
    fl_tensor_release(scr);
    return FL_OK;
}

int fl_cpu_conv2d_backward(fl_tensor *gx, fl_tensor *gw, fl_tensor *gb, const fl_tensor *gy,
                           const fl_tensor *x, const fl_tensor *w, const fl_conv2d_options *o) {
    conv_ctx c = {.g = make_geom(x, w, gy->shape[2], gy->shape[3], o)};
    c.ct = x->dtype == FL_F64 ? FL_F64 : FL_F32;
    c.cs = fl_dtype_size(c.ct);
    fl_tensor *own[5] = {NULL};
    enum { GY, X, W, GX, GW };
    char *gwd = NULL;
    int rc = FL_OK;
    if (gx || gw) rc = in_ct(gy, c.ct, &c.gy, &own[GY]);
    if (rc == FL_OK && gw) rc = in_ct(x, c.ct, &c.x, &own[X]);
    if (rc == FL_OK && gx) rc = in_ct(w, c.ct, &c.w, &own[W]);
    if (rc == FL_OK && gx) rc = out_ct(gx, c.ct, &c.gx, &own[GX]);
    if (rc == FL_OK && gw) rc = out_ct(gw, c.ct, &gwd, &own[GW]);
    if (rc == FL_OK && (gx || gw)) rc = backward_images(&c, gx != NULL, gwd);
    if (rc == FL_OK && gx) rc = put_back(gx, own[GX]);
    if (rc == FL_OK && gw) rc = put_back(gw, own[GW]);
    /* Last: its parallel loop would slow the GEMMs if it ran before them. */
    if (rc == FL_OK && gb) rc = bias_grad(gb, gy, &c.g);
    for (int i = 0; i < 5; i++) fl_tensor_release(own[i]);
    return rc;
}
