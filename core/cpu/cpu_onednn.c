/*
 * cpu_onednn.c: the CPU backend's bf16 matrix products, and f32 ones in the
 * linear forward's layout, through oneDNN's matmul primitive.
 *
 * Debian's OpenBLAS has no bf16 GEMM (cblas_sbgemm is declared, not
 * exported), so without oneDNN a bf16 product is converted to f32 and run
 * by sgemm at f32 speed. oneDNN multiplies bf16 operands as they are, with
 * f32 accumulation, and on CPUs with AMX (Sapphire Rapids:
 * brg:avx512_core_amx_bf16) does so several times faster: GPT-2 124M's
 * linear shapes at 256 tokens (forward, dx, dW) ran at ~1350-1570 GFLOP/s
 * against ~200-270 on 2 cores (benchmarks/gemm.lua --dtype=bf16 prints
 * both libraries).
 *
 * What comes here ([Note: GEMM libraries], cpu_gemm.c, has the whole
 * division of work):
 * - bf16 products (bf16 operands, f32 accumulation) where the CPU has bf16
 *   dot products (routed(), below; elsewhere cpu_matmul.c converts them
 *   to f32 and they come here as f32 products), and f32 products laid
 *   out as x W^T (A as stored, B transposed: F.linear's forward). On the
 *   latter oneDNN's brgemm kernels ran 15-25% faster than OpenBLAS
 *   0.3.21's sgemm (GPT-2's five linear shapes at 256 tokens: 326-372
 *   against 245-323 GFLOP/s on 2 threads, `gemm.lua`'s fwd column, both
 *   libraries in one run), and a GPT-2 f32 step's forward went from
 *   271-285 to 227-236 ms. In the other layouts (NN: the input gradient;
 *   TN: the weight gradient) oneDNN was no faster, and for some shapes
 *   much slower (dx = dy W at 256 x 768 x 3072: 120 against 296), so
 *   those stay with fl_cpu_sgemm (MKL or OpenBLAS), as does f16: oneDNN
 *   2.6 has no f16 matmul on the CPU (primitive creation fails). Except
 *   where OpenBLAS's kernels are narrower than the CPU and oneDNN's are
 *   AVX-512 (fl_cpu_openblas_narrow; on the Zen 5 machines, whose
 *   OPENBLAS_CORETYPE=Haswell halves OpenBLAS's vectors): there oneDNN
 *   takes every large f32 product (GPT-2's gradient products 400-440
 *   GFLOP/s against 225).
 * - Small products (under FL_CPU_LARGE_PRODUCT multiply-adds) stay on the
 *   conversion path: a primitive lookup costs more than they gain. They
 *   include every product cpu_matmul.c runs inside an OpenMP parallel
 *   region (the asserted FL_CPU_SMALL_GEMM bound), so no taken product
 *   runs on threads the caller already owns.
 * - A primitive is built for one fl_onednn_product (dtypes, transposes,
 *   sizes, strides, bias or not): building costs tens of microseconds, so
 *   the last CACHE_SIZE are kept, refusals included. A primitive whose
 *   implementation is a reference kernel ("ref:...", plain loops) is
 *   refused: those products keep the conversion path and OpenBLAS.
 * - Both paths accumulate in f32, add the bias in f32 and round once to
 *   the output dtype: the conversion path in cpu_matmul.c's f32 buffer,
 *   oneDNN in its accumulators, writing bf16 (or f32) straight into the
 *   output (measured: a separate f32 buffer and rounding pass made a
 *   GPT-2-sized product 2-3 times slower). Their sums differ only in
 *   order, so results agree to bf16 rounding, and f32 ones to f32
 *   rounding of the sums (tests/lua/gemm_library_spec.lua).
 */
#include "error.h"
#include "cpu_blas.h"
#include "cpu_linear.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Not in the sanitized build (asan): after oneDNN has run on several
 * OpenMP threads, LeakSanitizer's exit check crashes ("Tracer caught
 * signal 11", libdnnl.so.2's thread-local storage of a dlopened library;
 * with use_tls=0 it reports a 32-byte allocation of libdnnl instead), so
 * every sanitized process that ran a large bf16 product would fail. That
 * build keeps the conversion path, and says so (fl_cpu_gemm_library). */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED_BUILD 1
#elif __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#define HAVE_ONEDNN_HEADER 1
#endif

#define CACHE_SIZE 64

/* cpu_matmul.c runs a batch's products in a parallel region only when each
 * has at most FL_CPU_SMALL_GEMM multiply-adds: none of those is taken. */
_Static_assert((int)FL_CPU_SMALL_GEMM < (int)FL_CPU_LARGE_PRODUCT,
               "a product in a parallel region could be taken");

#ifdef SANITIZED_BUILD
#define NO_ONEDNN "not in the sanitized build (LeakSanitizer fails at exit after oneDNN ran)"
#else
#define NO_ONEDNN "built without oneDNN's header (libdnnl-dev)"
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool tried, open_ok, wide;
static char why_not[256] = "not tried yet";

#ifdef HAVE_ONEDNN_HEADER
/* clang-format off */
#define ONEDNN_FUNCTIONS(X)                                                                        \
    X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_memory_desc_init_by_strides)               \
    X(dnnl_memory_create) X(dnnl_memory_destroy) X(dnnl_matmul_desc_init)                         \
    X(dnnl_primitive_desc_destroy) X(dnnl_primitive_desc_query)                                   \
    X(dnnl_primitive_create) X(dnnl_primitive_destroy) X(dnnl_primitive_execute) X(dnnl_version)   \
    X(dnnl_get_effective_cpu_isa) X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy)     \
    X(dnnl_post_ops_create) X(dnnl_post_ops_destroy) X(dnnl_post_ops_append_sum)                  \
    X(dnnl_primitive_attr_set_post_ops) X(dnnl_primitive_desc_iterator_create)                    \
    X(dnnl_primitive_desc_iterator_next) X(dnnl_primitive_desc_iterator_fetch)                    \
    X(dnnl_primitive_desc_iterator_destroy) X(dnnl_set_max_cpu_isa)
/* clang-format on */

#define DECLARE(f) static __typeof__(f) *p_##f;
ONEDNN_FUNCTIONS(DECLARE)
#undef DECLARE

static dnnl_engine_t engine;
static char version[32];

typedef struct cached_product {
    fl_onednn_product key;      /* zeroed padding included: keys are compared bytewise */
    dnnl_primitive_t primitive; /* NULL: refused (oneDNN failed, or a reference kernel) */
    dnnl_memory_desc_t a, b, c, bias;
} cached_product;

static cached_product cache[CACHE_SIZE];
static int cache_used, cache_next;

/* Open libdnnl and make its CPU engine; false (with why_not) when either
 * fails. Callers hold the lock. */
static bool open_onednn(void) {
    void *lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *err = dlerror();
        snprintf(why_not, sizeof why_not, "%s", err ? err : "libdnnl.so.2 cannot be opened");
        return false;
    }
#define RESOLVE(f)                                                                                 \
    if (!(p_##f = (__typeof__(f) *)dlsym(lib, #f))) {                                              \
        snprintf(why_not, sizeof why_not, "libdnnl.so.2 lacks %s", #f);                            \
        return false;                                                                              \
    }
    ONEDNN_FUNCTIONS(RESOLVE)
#undef RESOLVE
    /* Within the level in force ([Note: CPU ISA levels], cpu_isa.c), set
     * before anything asks oneDNN for its ISA. Below its own best oneDNN
     * builds reference kernels for what it cannot run there (bf16 below
     * avx512), and those are refused: the conversion path takes them. */
    static const dnnl_cpu_isa_t caps[] = {dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2,
                                          dnnl_cpu_isa_avx512_core, dnnl_cpu_isa_avx512_core_bf16,
                                          dnnl_cpu_isa_avx512_core_amx};
    fl_cpu_isa level = fl_cpu_isa_level();
    if (level < fl_cpu_isa_cpu() && p_dnnl_set_max_cpu_isa(caps[level]) != dnnl_success) {
        snprintf(why_not, sizeof why_not, "oneDNN refused the cap at %s (dnnl_set_max_cpu_isa)",
                 fl_cpu_isa_name(level));
        return false;
    }
    if (p_dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
        engine = NULL;
        snprintf(why_not, sizeof why_not, "oneDNN could not create its CPU engine");
        return false;
    }
    dnnl_cpu_isa_t isa = p_dnnl_get_effective_cpu_isa();
    wide = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    const dnnl_version_t *v = p_dnnl_version();
    snprintf(version, sizeof version, "%d.%d.%d", v->major, v->minor, v->patch);
    return true;
}

/* The row-major operand [rows, cols] of a product as stored with row
 * stride ld, or transposed (stored [cols, rows]). */
static bool describe(dnnl_memory_desc_t *d, dnnl_data_type_t dt, int64_t rows, int64_t cols,
                     int64_t ld, bool trans) {
    dnnl_dims_t dims = {rows, cols}, strides = {trans ? 1 : ld, trans ? ld : 1};
    return p_dnnl_memory_desc_init_by_strides(d, 2, dims, dt, strides) == dnnl_success;
}

/* [Note: oneDNN's two matmul kernels]
 * oneDNN 2.6 offers a matmul in two implementations, listed best first
 * by its own ranking: brgemm ("brg:avx512_core...") and its older packed
 * GEMM ("gemm:jit"). On the Zen 5 machine brgemm loses in two places,
 * measured one primitive against the other on the same buffers, in
 * alternation, 10 rounds each, 2 threads (GFLOP/s, brgemm -> gemm:jit):
 * - f32 products with B as stored (NN: the input gradient dx = dy W) of
 *   few rows against a B beyond the L2 (4 MB and more): GPT-2's at 256
 *   tokens, 256x768x3072 364-382 -> 466-495, 256x3072x768 384-407 ->
 *   433-449, 256x768x2304 410-423 -> 471-492. With B of 768x768 or 1024
 *   rows (the small Llama) neither wins (0.98-1.0).
 * - weight gradients (TN: dW = dy^T x) of a vocabulary head over few
 *   tokens (m >= 32 n, k <= 256): GPT-2's 50257x768x256 in f32 415 ->
 *   468, in bf16 633-642 -> 700. With 1024 tokens (the small Llama's
 *   head) neither wins, and for the blocks' weight gradients brgemm is
 *   ahead in bf16 (768x3072x256 950 against 872) and either way in f32.
 * Elsewhere brgemm, oneDNN's first choice, stays. The choice is a fixed
 * rule of dtype, layout and sizes, never a timing: a product runs the
 * same kernel, and sums in the same order, in every run. */
static bool prefers_gemm(const fl_onednn_product *key) {
    if (key->trans_b) return false;
    if (!key->trans_a)
        return key->dtype == FL_F32 && key->m <= 256 && key->n * key->k >= ((int64_t)1 << 20);
    return key->m >= 32 * key->n && key->k <= 256;
}

/* The implementation to build for key from op and attr: the first that is
 * not a reference kernel ("ref:...", plain loops, far slower than the
 * conversion path's sgemm: odd strides can lead there), or "gemm:jit"
 * where prefers_gemm and oneDNN offers it. NULL when none. */
static dnnl_primitive_desc_t choose(const fl_onednn_product *key, const dnnl_matmul_desc_t *op,
                                    const_dnnl_primitive_attr_t attr) {
    dnnl_primitive_desc_iterator_t it = NULL;
    if (p_dnnl_primitive_desc_iterator_create(&it, op, attr, engine, NULL) != dnnl_success)
        return NULL;
    dnnl_primitive_desc_t chosen = NULL;
    bool want_gemm = prefers_gemm(key);
    do {
        dnnl_primitive_desc_t pd = p_dnnl_primitive_desc_iterator_fetch(it); /* ours to destroy */
        if (!pd) break;
        const char *impl = NULL;
        bool usable =
            p_dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl && strncmp(impl, "ref", 3) != 0;
        bool gemm = usable && strncmp(impl, "gemm:jit", 8) == 0;
        if (usable && (!chosen || (want_gemm && gemm))) {
            if (chosen) p_dnnl_primitive_desc_destroy(chosen);
            chosen = pd;
            if (!want_gemm || gemm) break;
        } else {
            p_dnnl_primitive_desc_destroy(pd);
        }
    } while (p_dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    p_dnnl_primitive_desc_iterator_destroy(it);
    return chosen;
}

/* Build the primitive for key into e; e->primitive stays NULL when oneDNN
 * refuses the product or would run it with a reference kernel. */
static void build(cached_product *e, const fl_onednn_product *key) {
    e->key = *key;
    e->primitive = NULL;
    dnnl_dims_t bias_dims = {1, key->n}, bias_strides = {key->n, 1};
    dnnl_data_type_t dt = key->dtype == FL_BF16 ? dnnl_bf16 : dnnl_f32;
    if (!describe(&e->a, dt, key->m, key->k, key->lda, key->trans_a) ||
        !describe(&e->b, dt, key->k, key->n, key->ldb, key->trans_b) ||
        !describe(&e->c, key->c_dtype == FL_BF16 ? dnnl_bf16 : dnnl_f32, key->m, key->n, key->ldc,
                  false) ||
        p_dnnl_memory_desc_init_by_strides(&e->bias, 2, bias_dims, dnnl_f32, bias_strides) !=
            dnnl_success)
        return;
    /* The bias joins the f32 accumulators before the one rounding to C's
     * dtype, as the conversion path adds it in f32. */
    dnnl_matmul_desc_t op;
    if (p_dnnl_matmul_desc_init(&op, &e->a, &e->b, key->bias ? &e->bias : NULL, &e->c) !=
        dnnl_success)
        return;
    /* A piece of a long sum adds to what C holds (a sum post-op). */
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    if (key->accumulate && (p_dnnl_primitive_attr_create(&attr) != dnnl_success ||
                            p_dnnl_post_ops_create(&post) != dnnl_success ||
                            p_dnnl_post_ops_append_sum(post, 1.0f) != dnnl_success ||
                            p_dnnl_primitive_attr_set_post_ops(attr, post) != dnnl_success)) {
        if (post) p_dnnl_post_ops_destroy(post);
        if (attr) p_dnnl_primitive_attr_destroy(attr);
        return;
    }
    dnnl_primitive_desc_t pd = choose(key, &op, attr);
    if (post) p_dnnl_post_ops_destroy(post);
    if (attr) p_dnnl_primitive_attr_destroy(attr);
    if (pd && p_dnnl_primitive_create(&e->primitive, pd) != dnnl_success) e->primitive = NULL;
    if (pd) p_dnnl_primitive_desc_destroy(pd);
}

/* The cached entry for key, built on a miss (replacing the oldest).
 * Callers hold the lock. */
static cached_product *lookup(const fl_onednn_product *key) {
    for (int i = 0; i < cache_used; i++)
        if (memcmp(&cache[i].key, key, sizeof *key) == 0) return &cache[i];
    cached_product *e;
    if (cache_used < CACHE_SIZE) {
        e = &cache[cache_used++];
    } else {
        e = &cache[cache_next];
        cache_next = (cache_next + 1) % CACHE_SIZE;
        if (e->primitive) p_dnnl_primitive_destroy(e->primitive);
    }
    build(e, key);
    return e;
}

/* One stream per thread: a oneDNN stream is not to be shared by threads
 * running at once. */
static __thread dnnl_stream_t stream;

static bool run(cached_product *e, const void *a, const void *b, const float *bias, void *c) {
    if (!stream &&
        p_dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        stream = NULL;
        return false;
    }
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, mbias = NULL;
    bool ok = p_dnnl_memory_create(&ma, &e->a, engine, (void *)a) == dnnl_success &&
              p_dnnl_memory_create(&mb, &e->b, engine, (void *)b) == dnnl_success &&
              p_dnnl_memory_create(&mc, &e->c, engine, c) == dnnl_success &&
              (!e->key.bias ||
               p_dnnl_memory_create(&mbias, &e->bias, engine, (void *)bias) == dnnl_success);
    if (ok) {
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_BIAS, mbias}};
        ok = p_dnnl_primitive_execute(e->primitive, stream, e->key.bias ? 4 : 3, args) ==
             dnnl_success;
    }
    if (ma) p_dnnl_memory_destroy(ma);
    if (mb) p_dnnl_memory_destroy(mb);
    if (mc) p_dnnl_memory_destroy(mc);
    if (mbias) p_dnnl_memory_destroy(mbias);
    return ok;
}
#endif /* HAVE_ONEDNN_HEADER */

/* Open oneDNN once (callers hold the lock); false, with why_not, when it
 * cannot be. */
static bool opened(void) {
    if (!tried) {
        tried = true;
#ifdef HAVE_ONEDNN_HEADER
        open_ok = open_onednn();
#else
        snprintf(why_not, sizeof why_not, "%s", NO_ONEDNN);
#endif
    }
    return open_ok;
}

bool fl_cpu_onednn_available(const char **version_out, const char **why) {
    pthread_mutex_lock(&lock);
    bool ok = opened();
    pthread_mutex_unlock(&lock);
#ifdef HAVE_ONEDNN_HEADER
    if (version_out) *version_out = version;
#else
    if (version_out) *version_out = "";
#endif
    if (why) *why = why_not;
    return ok;
}

bool fl_cpu_onednn_wide(void) {
    pthread_mutex_lock(&lock);
    bool ok = opened() && wide;
    pthread_mutex_unlock(&lock);
    return ok;
}

/* Whether oneDNN runs products of p's dtypes and layout at all, before
 * sizes and the library chosen: bf16 products from the avx512_bf16 level,
 * and f32 ones in the linear forward's layout (A as stored, B transposed:
 * x W^T), or in any layout where OpenBLAS's kernels are narrower than the
 * CPU (entry_for then also asks that oneDNN's are not).
 *
 * bf16 needs the CPU's bf16 dot products. Below avx512 oneDNN has only
 * reference kernels for bf16 (never taken). At avx512 without AVX512-BF16
 * (Skylake-SP, Cascade Lake, Ice Lake servers) its packed GEMM emulates
 * bf16 and ran GPT-2's and the small Llama's linear shapes (forward, dx,
 * dW; 256 and 1024 tokens) at 76-86 GFLOP/s, where converting to f32 and
 * taking the f32 route (cpu_matmul.c's [Note: the bf16 routes]: oneDNN's
 * AVX-512 f32 kernels there) ran them at 163-230, conversions included;
 * with the dot products (avx512_bf16) oneDNN's bf16 kernels ran them at
 * 400-495 against 198-237 converted. Every shape measured went the same
 * way at each level (one Zen 5 thread capped by FSDP_CPU_ISA, process
 * CPU time, best of 2-3 alternating runs, 2026-12-06), so the rule is the
 * level alone. */
static bool routed(const fl_onednn_product *p) {
    if (p->dtype == FL_BF16)
        return (p->c_dtype == FL_F32 || p->c_dtype == FL_BF16) &&
               fl_cpu_isa_level() >= FL_CPU_ISA_AVX512_BF16;
    if (p->dtype != FL_F32 || p->c_dtype != FL_F32) return false;
    return (!p->trans_a && p->trans_b) || fl_cpu_openblas_narrow(NULL);
}

#ifdef HAVE_ONEDNN_HEADER
/* The entry for a product, or NULL when it is not taken. Callers hold the
 * lock. */
static cached_product *entry_for(const fl_onednn_product *p) {
    if (!routed(p) || p->m == 0 || p->n == 0 || p->k == 0 ||
        p->m * p->n * p->k < FL_CPU_LARGE_PRODUCT)
        return NULL;
    if (!fl_cpu_gemm_allows(FL_GEMM_ONEDNN) || !opened()) return NULL;
    if (p->dtype == FL_F32 && !(!p->trans_a && p->trans_b) && !wide) return NULL;
    fl_onednn_product key;
    memset(&key, 0, sizeof key); /* the padding too: keys are compared bytewise */
    key.dtype = p->dtype, key.c_dtype = p->c_dtype;
    key.trans_a = p->trans_a, key.trans_b = p->trans_b, key.bias = p->bias;
    key.accumulate = p->accumulate;
    key.m = p->m, key.n = p->n, key.k = p->k, key.lda = p->lda, key.ldb = p->ldb, key.ldc = p->ldc;
    cached_product *e = lookup(&key);
    return e->primitive ? e : NULL;
}
#endif

bool fl_cpu_onednn_takes(const fl_onednn_product *p) {
#ifdef HAVE_ONEDNN_HEADER
    if (!routed(p) || p->m * p->n * p->k < FL_CPU_LARGE_PRODUCT) return false; /* unlocked */
    pthread_mutex_lock(&lock);
    bool taken = entry_for(p) != NULL;
    pthread_mutex_unlock(&lock);
    return taken;
#else
    (void)p;
    return false;
#endif
}

/* [Note: long sums in pieces]
 * A product summing far more terms than it has rows or columns (the
 * input gradient of a large vocabulary's head: 1024 x 512 summing over
 * 32000 logits) makes oneDNN stream all of B (32 MB in bf16) from memory
 * once per block of A's rows: 46 ms, 720 GFLOP/s on the Zen 5 machine.
 * Summed in pieces of PIECE terms, each piece's B stays in cache for all
 * the rows, and the pieces add up in an f32 accumulator (oneDNN's sum
 * post-op): 37 ms, 900 GFLOP/s. A bf16 C is rounded once from that
 * accumulator, so the results are those of one product summed in another
 * order. How many rows it takes to pay depends on the type (measured
 * there, n = 768, k = 50257): in f32 pieces paid from 128 rows (29.5 ->
 * 20.6 ms; GPT-2's head with 256 rows, 51 -> 41 ms), in bf16 they gained
 * nothing below 512 rows (256: 23.7 ms either way; 1024: 102 -> 87). */
enum { PIECE = 4096 };

static bool in_pieces(const fl_onednn_product *p) {
    int64_t side = p->m > p->n ? p->m : p->n;
    int64_t rows = p->dtype == FL_F32 ? 128 : 512;
    return p->k >= 4 * PIECE && p->m >= rows && p->k >= 8 * side;
}

int64_t fl_cpu_onednn_scratch(const fl_onednn_product *p) {
    return in_pieces(p) && p->c_dtype != FL_F32 ? p->m * p->n * (int64_t)sizeof(float) : 0;
}

#ifdef HAVE_ONEDNN_HEADER
/* p's product in pieces of PIECE terms into acc (f32, row stride ldc),
 * the bias with the first. Callers hold the lock. */
static bool run_pieces(const fl_onednn_product *p, const char *a, const char *b, const float *bias,
                       float *acc, int64_t ldc) {
    size_t es = fl_dtype_size(p->dtype);
    for (int64_t k0 = 0; k0 < p->k; k0 += PIECE) {
        fl_onednn_product q = *p;
        q.k = p->k - k0 < PIECE ? p->k - k0 : PIECE;
        q.c_dtype = FL_F32, q.ldc = ldc, q.bias = p->bias && k0 == 0, q.accumulate = k0 > 0;
        int64_t ao = p->trans_a ? k0 * p->lda : k0, bo = p->trans_b ? k0 : k0 * p->ldb;
        cached_product *e = entry_for(&q);
        if (!e || !run(e, a + ao * (int64_t)es, b + bo * (int64_t)es, q.bias ? bias : NULL, acc))
            return false;
    }
    return true;
}
#endif

int fl_cpu_onednn_gemm(const fl_onednn_product *p, const void *a, const void *b, const float *bias,
                       void *c, float *scratch) {
#ifdef HAVE_ONEDNN_HEADER
    pthread_mutex_lock(&lock);
    /* The entry is used under the lock: another thread's miss may replace it. */
    cached_product *e = entry_for(p);
    bool done = false;
    if (e && in_pieces(p)) {
        bool direct = p->c_dtype == FL_F32;
        FL_ASSERT(direct || scratch);
        done = run_pieces(p, a, b, bias, direct ? c : scratch, direct ? p->ldc : p->n);
        for (int64_t i = 0; done && !direct && i < p->m; i++)
            done = fl_convert((char *)c + i * p->ldc * (int64_t)fl_dtype_size(p->c_dtype),
                              p->c_dtype, scratch + i * p->n, FL_F32, p->n) == FL_OK;
    }
    /* Whole, also where a piece's primitive was refused (C is overwritten;
     * the pieces' lookups may have replaced e in the cache: look again). */
    if (e && !done && (e = entry_for(p)) != NULL) done = run(e, a, b, bias, c);
    pthread_mutex_unlock(&lock);
    if (done) return FL_OK;
    return fl_fail(FL_ERR_UNSUPPORTED,
                   e ? "matmul: oneDNN failed to run a %lldx%lldx%lld %s product"
                     : "matmul: oneDNN does not take this %lldx%lldx%lld %s product (the caller "
                       "should have asked fl_cpu_onednn_takes)",
                   (long long)p->m, (long long)p->n, (long long)p->k, fl_dtype_name(p->dtype));
#else
    (void)a, (void)b, (void)bias, (void)c, (void)scratch;
    return fl_fail(FL_ERR_UNSUPPORTED, "matmul: built without oneDNN (%lldx%lldx%lld product)",
                   (long long)p->m, (long long)p->n, (long long)p->k);
#endif
}
