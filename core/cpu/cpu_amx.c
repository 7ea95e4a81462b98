/*
 * cpu_amx.c: whether bf16 attention runs on AMX tiles, and which calls it
 * takes: the CPU table's attention_native entries (core/ops/fused.h).
 *
 * [Note: attention on AMX tiles]
 * - Without this path a bf16 attention runs the f32 kernels
 *   (cpu_attention.c) on f32 copies of q, k, v: OpenBLAS sgemm on 64-row
 *   blocks, about 90 GFLOP/s on this project's 2-core machines, the
 *   largest cost of a bf16 Llama step after the linear layers. oneDNN (the
 *   bf16 GEMM library, cpu_onednn.c) has no fused attention, and its
 *   batched products were measured at most 1.3x faster: the softmax passes
 *   between them dominate. cpu_attention_amx.c multiplies bf16 blocks on
 *   AMX tiles with f32 sums and does the softmax on the f32 block while it
 *   is in cache, as FlashAttention does on GPUs.
 * - Numerics as FlashAttention's and cuDNN's: scores and softmax in f32,
 *   the probabilities (and dS) rounded to bf16 for the products with V
 *   (K, Q), outputs and gradients rounded once to bf16. Results agree with
 *   the f32 kernels to bf16 rounding (tests/lua/attention_amx_spec.lua).
 * - Taken: q, k, v, out and gradients all bf16, head dims multiples of 32
 *   (64 and 128 in every model here), a dense last dim, no bias, at least
 *   one query and one key. Declined calls (T5's bias, f16, odd head dims)
 *   run the f32 kernels on copies, as before. Whether a call is taken
 *   depends only on those and on the choice below, never on data.
 * - Runs where the CPU has AMX-BF16 and AVX512-BF16 (Intel Sapphire Rapids
 *   and later) and Linux grants the tile state (arch_prctl
 *   ARCH_REQ_XCOMP_PERM, once per process). FSDP_CPU_ATTENTION=f32, or
 *   fl_cpu_attention_use("f32"), keeps the f32 kernels; the kernel text
 *   (fl_cpu_attention_kernel) says which runs and why.
 */
#include "cpu_amx.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define HAVE_AMX_BUILD 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool chosen, use_amx, amx_granted;
static char why_not[160];

#ifdef HAVE_AMX_BUILD
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* The CPU's AMX-BF16, AMX-TILE, AVX512-BF16 (with AVX512F/BW/VL/DQ), the
 * OS's tile state, and the process's permission to use it. */
static bool grant_amx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    bool avx512 = (b >> 16 & 1) && (b >> 17 & 1) && (b >> 30 & 1) && (b >> 31 & 1);
    bool tiles = (d >> 22 & 1) && (d >> 24 & 1);
    if (!avx512 || !tiles) {
        snprintf(why_not, sizeof why_not, "the CPU has no %s",
                 avx512 ? "AMX-BF16 tiles" : "AVX-512");
        return false;
    }
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1)) {
        snprintf(why_not, sizeof why_not, "the CPU has no AVX512-BF16");
        return false;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(why_not, sizeof why_not, "the kernel refused the AMX tile state (arch_prctl)");
        return false;
    }
    return true;
}
#endif

/* Decide once (callers hold the lock): FSDP_CPU_ATTENTION, then the CPU. */
static void choose(void) {
    if (chosen) return;
    chosen = true;
    const char *env = getenv("FSDP_CPU_ATTENTION");
    if (env && *env && strcmp(env, "amx") != 0) {
        snprintf(why_not, sizeof why_not, "FSDP_CPU_ATTENTION=%.64s%s", env,
                 strcmp(env, "f32") == 0 ? "" : " (known: amx, f32)");
        return;
    }
#ifdef HAVE_AMX_BUILD
    use_amx = amx_granted = grant_amx();
#else
    snprintf(why_not, sizeof why_not, "not built for x86-64 Linux with GCC");
#endif
}

int fl_cpu_attention_use(const char *kernel) {
    if (!kernel || (strcmp(kernel, "amx") != 0 && strcmp(kernel, "f32") != 0))
        return fl_fail(FL_ERR_ARG, "cpu_attention_use: unknown kernel '%s' (known: amx, f32)",
                       kernel ? kernel : "(null)");
    pthread_mutex_lock(&lock);
    int rc = FL_OK;
    if (strcmp(kernel, "f32") == 0) {
        chosen = true;
        use_amx = false;
        snprintf(why_not, sizeof why_not, "switched off by cpu_attention_use('f32')");
    } else {
#ifdef HAVE_AMX_BUILD
        if (!amx_granted) amx_granted = grant_amx();
        chosen = true;
        use_amx = amx_granted;
#endif
        if (!use_amx)
            rc = fl_fail(FL_ERR_UNSUPPORTED, "cpu_attention_use: AMX is not available: %s",
                         why_not[0] ? why_not : "not built for x86-64 Linux with GCC");
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *fl_cpu_attention_kernel(void) {
    static char text[320];
    pthread_mutex_lock(&lock);
    choose();
    if (use_amx)
        snprintf(text, sizeof text,
                 "AMX bf16 tiles (bf16 q, k, v with head dims multiples of 32 and no bias), "
                 "f32 blocks (the rest)");
    else
        snprintf(text, sizeof text, "f32 blocks (AMX: %s)", why_not);
    pthread_mutex_unlock(&lock);
    return text;
}

static bool amx_on(void) {
    pthread_mutex_lock(&lock);
    choose();
    bool on = use_amx;
    pthread_mutex_unlock(&lock);
    return on;
}

static bool bf16_rows(const fl_tensor *t) {
    return !t || (t->dtype == FL_BF16 && t->ndim == 4 && t->stride[3] == 1);
}

/* Whether the AMX kernels take the call (see the Note). */
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
    if (!covers(a, false) || !amx_on()) return FL_OK;
    int rc = fl_amx_attention(a);
    *done = rc == FL_OK;
    return rc;
}

int fl_cpu_attention_native_backward(const fl_attention_args *a, bool *done) {
    *done = false;
    if (!covers(a, true) || !amx_on()) return FL_OK;
    int rc = fl_amx_attention_backward(a);
    *done = rc == FL_OK;
    return rc;
}
