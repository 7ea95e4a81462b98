/*
 * cpu_gemm.c: the one place the CPU backend calls BLAS, and the choice of
 * GEMM library. Every f32 matrix product of every op (matmul, linear,
 * attention, convolution) comes to fl_cpu_sgemm, so threading and the
 * library are decided once.
 *
 * [Note: GEMM libraries]
 * Three libraries run the CPU's matrix products, each where it was
 * measured fastest on this project's machines (2 cores of Intel Sapphire
 * Rapids, and of AMD Zen 5):
 * - oneDNN (cpu_onednn.c, asked by cpu_matmul.c before it converts
 *   anything): every large bf16 product where the CPU has bf16 dot
 *   products (AMX tiles or AVX512-BF16; below that level a bf16 product
 *   is converted to f32 and takes the f32 route: [Note: the bf16 routes],
 *   cpu_matmul.c), and large f32 ones laid out as x W^T (F.linear's
 *   forward). Also every
 *   other large f32 product where OpenBLAS's kernels are narrower than
 *   the CPU (fl_cpu_openblas_narrow: OpenBLAS picks its kernels when it
 *   loads, and OPENBLAS_CORETYPE=Haswell, as set on the Zen 5 machines,
 *   gives it 256-bit ones; oneDNN's AVX-512 ones then ran GPT-2's
 *   gradient products at 400-440 GFLOP/s against 225).
 * - MKL (cpu_mkl.c, asked here): the other large f32 products with B as
 *   stored (NN, TN: the gradients' products).
 * - OpenBLAS: the rest (small products, products inside a parallel
 *   region, f64, TT), and everything where the others are not installed.
 * "Large" is FL_CPU_LARGE_PRODUCT multiply-adds and more: below it a
 * library's set-up costs more than it gains. oneDNN and MKL are opened
 * with dlopen at the first question, never linked, so the binary starts
 * without them (the GPU machine carries no Debian packages; MKL is in
 * Debian's non-free archive). The choice (FSDP_CPU_GEMM at start,
 * fl_cpu_gemm_use later) is 'auto' (each where installed), 'openblas'
 * (OpenBLAS only), or 'onednn' / 'mkl' (that one and OpenBLAS, for
 * comparisons). Whether a product is taken depends only on dtypes,
 * layout, sizes, that choice and the process's fixed facts (OpenBLAS's
 * kernels, oneDNN's ISA), never on data or threads, so the
 * planner's meta model asks the same rule (cpu_matmul.c's matmul_scratch)
 * and agrees with the run. The libraries sum in different orders: results
 * agree to rounding (tests/lua/gemm_library_spec.lua compares each with
 * OpenBLAS in one process).
 *
 * OpenBLAS keeps its own thread pool next to OpenMP's where it is not
 * Debian's OpenMP build. Both get the same thread count (OMP_NUM_THREADS,
 * or OPENBLAS_NUM_THREADS if set); they never run at the same time, since
 * ops run one after another.
 */
#include "error.h"
#include "cpu_blas.h"
#include "cpu_rows_avx512.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

static void set_threads(void) {
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(omp_get_max_threads());
}

void fl_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc) {
    pthread_once(&threads_once, set_threads);
    FL_ASSERT(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && lda <= INT32_MAX &&
              ldb <= INT32_MAX && ldc <= INT32_MAX);
    if (m == 0 || n == 0) return;
    if (fl_cpu_mkl_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* ---- OpenBLAS's kernels ---------------------------------------------------------- */

static pthread_once_t core_once = PTHREAD_ONCE_INIT;
static bool core_wide;
static char core_name[32];

/* Whether OpenBLAS loaded one of its kernel sets for AVX-512 (its
 * DYNAMIC_ARCH names); any other on a CPU with AVX-512 uses half its
 * vector width. */
static void read_core(void) {
    static const char *const wide[] = {"skylakex", "cooperlake", "sapphirerapids"};
    const char *name = openblas_get_corename();
    snprintf(core_name, sizeof core_name, "%s", name ? name : "unknown");
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
        if (strcasecmp(core_name, wide[i]) == 0) core_wide = true;
}

bool fl_cpu_openblas_wide(void) {
    pthread_once(&core_once, read_core);
    return core_wide;
}

const char *fl_cpu_isa_openblas_coretype(void) {
    /* OpenBLAS's AVX-512 kernels run only on CPUs with AVX-512: below that
     * level on such a CPU, its Haswell kernels (AVX2 + FMA) keep within
     * the cap ([Note: CPU ISA levels]). Where OpenBLAS already runs
     * narrower kernels, nothing. */
    if (fl_cpu_isa_level() >= FL_CPU_ISA_AVX512 || fl_cpu_isa_cpu() < FL_CPU_ISA_AVX512) return NULL;
    return fl_cpu_openblas_wide() ? "Haswell" : NULL;
}

bool fl_cpu_openblas_narrow(const char **core) {
    pthread_once(&core_once, read_core);
    if (core) *core = core_name;
    return fl_cpu_avx512() && !core_wide;
}

/* ---- the choice -------------------------------------------------------------------- */

static const char *const names[] = {"auto", "openblas", "onednn", "mkl"};
#define KNOWN "auto, openblas, onednn, mkl"

/* -1 until FSDP_CPU_GEMM is read. env_note says why an unknown value
 * chose OpenBLAS, while that choice stands (env_choice). */
static atomic_int choice = -1;
static atomic_bool env_choice;
static char env_note[128];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* The library called `name`, or -1. */
static int library_named(const char *name) {
    for (int i = 0; name && i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

static void read_env(void) {
    const char *env = getenv("FSDP_CPU_GEMM");
    int c = FL_GEMM_AUTO;
    if (env && *env) {
        c = library_named(env);
        if (c < 0) {
            /* A misspelt value keeps the safe path, and the library text
             * (fsdp.cpu_gemm_library()) says why. */
            snprintf(env_note, sizeof env_note, "FSDP_CPU_GEMM=%.64s (known: " KNOWN ")", env);
            c = FL_GEMM_OPENBLAS;
        }
    }
    int unread = -1;
    if (atomic_compare_exchange_strong(&choice, &unread, c)) atomic_store(&env_choice, true);
}

static fl_gemm_library chosen(void) {
    pthread_once(&env_once, read_env);
    return (fl_gemm_library)atomic_load(&choice);
}

bool fl_cpu_gemm_allows(fl_gemm_library lib) {
    fl_gemm_library c = chosen();
    return c == FL_GEMM_AUTO || c == lib;
}

int fl_cpu_gemm_use(const char *library) {
    int c = library_named(library);
    if (c < 0)
        return fl_fail(FL_ERR_ARG, "cpu_gemm_use: unknown library '%s' (known: " KNOWN ")",
                       library ? library : "(null)");
    const char *version, *why;
    if (c == FL_GEMM_ONEDNN && !fl_cpu_onednn_available(&version, &why))
        return fl_fail(FL_ERR_UNSUPPORTED, "cpu_gemm_use: oneDNN is not available: %s", why);
    if (c == FL_GEMM_MKL && !fl_cpu_mkl_available(&version, &why))
        return fl_fail(FL_ERR_UNSUPPORTED, "cpu_gemm_use: MKL is not available: %s", why);
    pthread_once(&env_once, read_env);
    atomic_store(&env_choice, false);
    atomic_store(&choice, c);
    return FL_OK;
}

const char *fl_cpu_gemm_chosen(void) { return names[chosen()]; }

const char *fl_cpu_gemm_library(void) {
    static char text[512];
    fl_gemm_library c = chosen();
    const char *dnn_version, *dnn_why, *mkl_version, *mkl_why;
    bool dnn =
        fl_cpu_gemm_allows(FL_GEMM_ONEDNN) && fl_cpu_onednn_available(&dnn_version, &dnn_why);
    bool mkl = fl_cpu_gemm_allows(FL_GEMM_MKL) && fl_cpu_mkl_available(&mkl_version, &mkl_why);
    char off[160];
    if (env_note[0] && atomic_load(&env_choice)) snprintf(off, sizeof off, "%s", env_note);
    else snprintf(off, sizeof off, "not chosen ('%s')", names[c]);
    int len = 0;
    const char *core;
    bool narrow = fl_cpu_openblas_narrow(&core);
    const char *f32_layouts = narrow && fl_cpu_onednn_wide() ? "in every layout" : "as x W^T";
    if (dnn && fl_cpu_isa_level() >= FL_CPU_ISA_AVX512_BF16)
        len += snprintf(text + len, sizeof text - len,
                        "oneDNN %s (bf16 products, and f32 ones %s, of %d multiply-adds and "
                        "more), ",
                        dnn_version, f32_layouts, FL_CPU_LARGE_PRODUCT);
    else if (dnn) /* without bf16 dot products bf16 is converted ([Note: the bf16 routes]) */
        len += snprintf(text + len, sizeof text - len,
                        "oneDNN %s (f32 products %s, of %d multiply-adds and more; bf16 ones "
                        "converted to f32 below the avx512_bf16 level), ",
                        dnn_version, f32_layouts, FL_CPU_LARGE_PRODUCT);
    if (mkl)
        len += snprintf(text + len, sizeof text - len,
                        "MKL %s (the other f32 products with B untransposed, of %d multiply-adds "
                        "and more), ",
                        mkl_version, FL_CPU_LARGE_PRODUCT);
    len += snprintf(text + len, sizeof text - len, "OpenBLAS %s (the rest%s", core,
                    narrow ? "; its kernels are narrower than this CPU's AVX-512" : "");
    if (!dnn)
        len += snprintf(text + len, sizeof text - len, "; oneDNN: %s",
                        fl_cpu_gemm_allows(FL_GEMM_ONEDNN) ? dnn_why : off);
    if (!mkl)
        len += snprintf(text + len, sizeof text - len, "; MKL: %s",
                        fl_cpu_gemm_allows(FL_GEMM_MKL) ? mkl_why : off);
    snprintf(text + len, sizeof text - len, ")");
    return text;
}
