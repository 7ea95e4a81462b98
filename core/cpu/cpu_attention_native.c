/*
 * cpu_attention_native.c: whether bf16 attention runs on the bf16 kernels
 * (cpu_attention_bf16.c), on which products, and which calls they take:
 * the CPU table's attention_native entries (core/backend/backend.h).
 *
 * [Note: bf16 attention kernels]
 * - Without them a bf16 attention runs the f32 kernels (cpu_attention.c)
 *   on f32 copies of q, k, v: sgemm on 64-row blocks, 90-120 GFLOP/s on
 *   this project's 2-core machines, the largest cost of a bf16 Llama step
 *   after the linear layers. oneDNN (the bf16 GEMM library, cpu_onednn.c)
 *   has no fused attention, and its batched products were measured at
 *   most 1.3x faster: the softmax passes between them dominate. The bf16
 *   kernels multiply bf16 blocks with f32 sums and do the softmax on the
 *   f32 block while it is in cache, as FlashAttention does on GPUs.
 * - Two ways to multiply, one algorithm: AMX tiles (Intel Sapphire Rapids
 *   and later; Linux must grant the tile state, arch_prctl
 *   ARCH_REQ_XCOMP_PERM, asked once per process), else AVX512-BF16 dot
 *   products (also AMD Zen 4 and 5, and Intel Cooper Lake). `auto` (the
 *   default) takes the tiles where granted, else the dot products, else
 *   the f32 kernels. FSDP_CPU_ATTENTION (auto, amx, avx512_bf16, f32) or
 *   fl_cpu_attention_use chooses; the kernel text
 *   (fl_cpu_attention_kernel) says which runs and why not the others.
 * - Numerics as FlashAttention's and cuDNN's: scores and softmax in f32,
 *   the probabilities (and dS) rounded to bf16 for the products with V
 *   (K, Q), outputs and gradients rounded once to bf16. Results agree with
 *   the f32 kernels to bf16 rounding (tests/lua/attention_bf16_spec.lua);
 *   tiles and dot products add their pairs in different orders, so they
 *   agree with each other only as closely.
 * - Taken: q, k, v, out and gradients all bf16, head dims multiples of 32
 *   (64 and 128 in every model here), a dense last dim, no bias, at least
 *   one query and one key. Declined calls (T5's bias, f16, odd head dims)
 *   run the f32 kernels on copies. Whether a call is taken depends only on
 *   those and on the choice, never on data.
 */
#include "cpu_attention_bf16.h"
#include "cpu_rows_avx512.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernels, in the order `auto` prefers them last to first. */
typedef enum { KERNEL_F32, KERNEL_DOTS, KERNEL_TILES } kernel;
static const char *const kernel_names[] = {"f32", "avx512_bf16", "amx"};
#define KNOWN "auto, amx, avx512_bf16, f32"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool probed, has_dots, has_tiles, chosen;
static kernel use;
/* Why each is not in force (set by probe), and what the choice was when
 * it was not `auto` ("FSDP_CPU_ATTENTION=f32", "cpu_attention_use('f32')"). */
static char no_dots[160], no_tiles[160], choice[160];

/* What the level in force offers ([Note: CPU ISA levels], cpu_isa.c, which
 * also asks the kernel for the AMX tile state): avx512_bf16 for the dot
 * products, amx for the tiles. Callers hold the lock. */
static void probe(void) {
    if (probed) return;
    probed = true;
#if FL_ROWS_AVX512_BUILD && defined(__linux__)
    const char *why = fl_cpu_isa_why_not(FL_CPU_ISA_AVX512_BF16);
    has_dots = !why;
    if (why) snprintf(no_dots, sizeof no_dots, "%s", why);
    why = fl_cpu_isa_why_not(FL_CPU_ISA_AMX);
    has_tiles = !why;
    if (why) snprintf(no_tiles, sizeof no_tiles, "%s", why);
#else
    snprintf(no_dots, sizeof no_dots, "not built for x86-64 Linux with GCC");
    snprintf(no_tiles, sizeof no_tiles, "not built for x86-64 Linux with GCC");
#endif
}

static kernel best(void) { return has_tiles ? KERNEL_TILES : has_dots ? KERNEL_DOTS : KERNEL_F32; }

/* Why `k` cannot run here, or NULL when it can. */
static const char *missing(kernel k) {
    return k == KERNEL_TILES && !has_tiles ? no_tiles
           : k == KERNEL_DOTS && !has_dots ? no_dots
                                           : NULL;
}

static int kernel_named(const char *name) {
    for (int k = 0; k < 3; k++)
        if (strcmp(name, kernel_names[k]) == 0) return k;
    return -1;
}

/* Decide once (callers hold the lock): FSDP_CPU_ATTENTION, then the CPU.
 * A value naming a kernel the CPU lacks, or no kernel, leaves `auto`,
 * and the kernel text says so. */
static void choose(void) {
    if (chosen) return;
    chosen = true;
    probe();
    use = best();
    const char *env = getenv("FSDP_CPU_ATTENTION");
    if (!env || !*env || strcmp(env, "auto") == 0) return;
    int k = kernel_named(env);
    if (k < 0)
        snprintf(choice, sizeof choice, "FSDP_CPU_ATTENTION=%.32s ignored (known: " KNOWN ")", env);
    else if (missing((kernel)k))
        snprintf(choice, sizeof choice, "FSDP_CPU_ATTENTION=%s ignored", env);
    else
        use = (kernel)k, snprintf(choice, sizeof choice, "FSDP_CPU_ATTENTION=%s", env);
}

int fl_cpu_attention_use(const char *name) {
    int k = !name ? -1 : strcmp(name, "auto") == 0 ? -2 : kernel_named(name);
    if (k == -1)
        return fl_fail(FL_ERR_ARG, "cpu_attention_use: unknown kernel '%s' (known: " KNOWN ")",
                       name ? name : "(null)");
    pthread_mutex_lock(&lock);
    choose(); /* a refusal below keeps the choice made at start */
    int rc = FL_OK;
    if (k == -2) {
        use = best();
        choice[0] = 0;
    } else if (missing((kernel)k)) {
        rc = fl_fail(FL_ERR_UNSUPPORTED, "cpu_attention_use: '%s' is not available: %s", name,
                     missing((kernel)k));
    } else {
        use = (kernel)k;
        snprintf(choice, sizeof choice, "cpu_attention_use('%s')", name);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *fl_cpu_attention_kernel(void) {
    static char text[520];
    pthread_mutex_lock(&lock);
    choose();
    const char *taken = "(bf16 q, k, v with head dims multiples of 32 and no bias)";
    char why[320];
    /* The kernels better than the one in use, and why each is not. */
    int n = snprintf(why, sizeof why, "%s", choice);
    for (int k = KERNEL_TILES; k > (int)use; k--)
        n += snprintf(why + n, sizeof why - (size_t)n, "%s%s: %s", n ? "; " : "",
                      k == KERNEL_TILES ? "AMX" : "AVX512-BF16",
                      missing((kernel)k) ? missing((kernel)k) : "not chosen");
    if (use == KERNEL_TILES)
        snprintf(text, sizeof text, "AMX bf16 tiles %s, f32 blocks (the rest)%s%s%s", taken,
                 n ? " (" : "", why, n ? ")" : "");
    else if (use == KERNEL_DOTS)
        snprintf(text, sizeof text, "AVX512-BF16 dot products %s, f32 blocks (the rest; %s)", taken,
                 why);
    else
        snprintf(text, sizeof text, "f32 blocks (%s)", why);
    pthread_mutex_unlock(&lock);
    return text;
}

/* The kernel calls run on now. */
static kernel in_use(void) {
    pthread_mutex_lock(&lock);
    choose();
    kernel k = use;
    pthread_mutex_unlock(&lock);
    return k;
}

static bool bf16_rows(const fl_tensor *t) {
    return !t || (t->dtype == FL_BF16 && t->ndim == 4 && t->stride[3] == 1);
}

/* Whether the bf16 kernels take the call (see the Note). */
static bool covers(const fl_attention_args *a, bool backward) {
    const fl_tensor *q = a->q, *k = a->k, *v = a->v;
    if (a->bias || q->shape[3] % 32 || v->shape[3] % 32 || q->shape[2] == 0 || k->shape[2] == 0)
        return false;
    if (!bf16_rows(q) || !bf16_rows(k) || !bf16_rows(v) || a->lse->dtype != FL_F32) return false;
    if (!backward) return bf16_rows(a->out);
    return a->o && a->dout && bf16_rows(a->o) && bf16_rows(a->dout) && bf16_rows(a->dq) &&
           bf16_rows(a->dk) && bf16_rows(a->dv);
}

int fl_cpu_attention_native(const fl_attention_args *a, bool *done) {
    *done = false;
    kernel k = covers(a, false) ? in_use() : KERNEL_F32;
    if (k == KERNEL_F32) return FL_OK;
    int rc = fl_bf16_attention(a, k == KERNEL_TILES);
    *done = rc == FL_OK;
    return rc;
}

int fl_cpu_attention_native_backward(const fl_attention_args *a, bool *done) {
    *done = false;
    kernel k = covers(a, true) ? in_use() : KERNEL_F32;
    if (k == KERNEL_F32) return FL_OK;
    int rc = fl_bf16_attention_backward(a, k == KERNEL_TILES);
    *done = rc == FL_OK;
    return rc;
}
