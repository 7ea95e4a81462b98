/*
 * cpu_mkl.c: the f32 products of the gradients (op(A) @ B, B as stored:
 * NN and TN) through Intel MKL's sgemm where it is installed
 * ([Note: GEMM libraries], core/cpu/cpu_gemm.c).
 *
 * MKL is not part of Debian's main archive (libmkl-rt is in non-free), so
 * it is opened at the first large product with dlopen, never linked: the
 * binary starts and keeps OpenBLAS where it is absent. It is asked to
 * thread with GNU OpenMP (MKL_Set_Threading_Layer), so its products run
 * on libgomp's one pool with OpenBLAS, oneDNN and our own kernels, as the
 * OpenMP build of OpenBLAS does (two pools on 2 cores oversubscribe).
 *
 * Measured on this project's 2-core Sapphire Rapids machine, MKL 2020.4
 * (Debian's libmkl-rt) against OpenBLAS 0.3.21 on the same shapes in one
 * run (each sgemm alone, 2 threads; benchmarks/gemm.lua times F.linear on
 * each):
 * GPT-2's weight and input gradients at 256 tokens (TN, NN) 270-351
 * against 235-302 GFLOP/s, the small Llama's at 1024 tokens 272-346
 * against 259-317; an f32 GPT-2 step's backward took ~10% less. In the
 * forward's layout (NT) oneDNN is faster still, so those stay there.
 */
#include "cpu_blas.h"

#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Not in the sanitized build, as oneDNN (cpu_onednn.c): a dlopened
 * library's thread-local storage trips LeakSanitizer's exit check. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED_BUILD 1
#endif

/* cblas_sgemm's enums as MKL's header numbers them (the cblas standard). */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
/* MKL_THREADING_GNU in mkl_service.h (INTEL 0, SEQUENTIAL 1, PGI 2, GNU 3). */
enum { THREADING_GNU = 3 };

typedef void sgemm_fn(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                      const float *a, int lda, const float *b, int ldb, float beta, float *c,
                      int ldc);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sgemm_fn *mkl_sgemm;
static char version[64], why_not[160];

static void open_mkl(void) {
#ifdef SANITIZED_BUILD
    snprintf(why_not, sizeof why_not, "not in the sanitized build");
#else
    /* Within the level in force ([Note: CPU ISA levels], cpu_isa.c): MKL
     * reads its cap when it first computes, after the dlopen below. A cap
     * the user set stays. f32 products need nothing above AVX-512. */
    fl_cpu_isa level = fl_cpu_isa_level();
    if (level < fl_cpu_isa_cpu() && level < FL_CPU_ISA_AVX512_BF16 &&
        !getenv("MKL_ENABLE_INSTRUCTIONS"))
        setenv("MKL_ENABLE_INSTRUCTIONS",
               level >= FL_CPU_ISA_AVX512 ? "AVX512" : level >= FL_CPU_ISA_AVX2 ? "AVX2" : "SSE4_2", 1);
    /* Debian's libmkl-rt ships the unversioned name; oneAPI's MKL the
     * versioned ones. */
    const char *names[] = {"libmkl_rt.so.2", "libmkl_rt.so.1", "libmkl_rt.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why_not, sizeof why_not, "libmkl_rt.so not found (Debian: libmkl-rt, non-free)");
        return;
    }
    int (*set_layer)(int) = (int (*)(int))dlsym(lib, "MKL_Set_Threading_Layer");
    void (*get_version)(char *, int) = (void (*)(char *, int))dlsym(lib, "MKL_Get_Version_String");
    sgemm_fn *fn = (sgemm_fn *)dlsym(lib, "cblas_sgemm");
    if (!set_layer || !get_version || !fn) {
        snprintf(why_not, sizeof why_not, "libmkl_rt.so lacks %s",
                 !fn ? "cblas_sgemm" : !set_layer ? "MKL_Set_Threading_Layer"
                                                  : "MKL_Get_Version_String");
        return;
    }
    /* Before any computation, or MKL picks its own Intel OpenMP runtime. */
    if (set_layer(THREADING_GNU) != THREADING_GNU) {
        snprintf(why_not, sizeof why_not, "MKL refused GNU OpenMP threading");
        return;
    }
    char text[198] = "";
    get_version(text, (int)sizeof text);
    /* "Intel(R) Math Kernel Library Version 2020.0.4 Product Build ...": keep the number. */
    const char *v = strstr(text, "Version ");
    snprintf(version, sizeof version, "%.*s", v ? (int)strcspn(v + 8, " ") : 0, v ? v + 8 : "");
    mkl_sgemm = fn;
#endif
}

bool fl_cpu_mkl_available(const char **version_out, const char **why) {
    pthread_once(&once, open_mkl);
    if (version_out) *version_out = version;
    if (why) *why = why_not;
    return mkl_sgemm != NULL;
}

bool fl_cpu_mkl_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc) {
    /* Products inside a parallel region are a thread's share of an op's
     * work (attention's blocks): they stay on OpenBLAS, one thread each. */
    if (trans_b || m * n * k < FL_CPU_LARGE_PRODUCT || omp_in_parallel() ||
        !fl_cpu_gemm_allows(FL_GEMM_MKL) || !fl_cpu_mkl_available(NULL, NULL))
        return false;
    mkl_sgemm(ROW_MAJOR, trans_a ? TRANS : NO_TRANS, NO_TRANS, (int)m, (int)n, (int)k, alpha, a,
              (int)lda, b, (int)ldb, beta, c, (int)ldc);
    return true;
}
