/*
 * cpu_isa.c: the instruction-set level the CPU backend runs at: what the
 * CPU offers, capped by FSDP_CPU_ISA, decided once per process. Every
 * kernel choice that depends on the CPU asks here. In core/base, not
 * core/cpu, because the loops built for several levels ([Note: ISA
 * clones], cpu_isa_dispatch.h) include core/tensor's dtype conversions,
 * and the tensor layer calls nothing above it.
 *
 * [Note: CPU ISA levels]
 * One ordered scale, lowest first: baseline (x86-64 without AVX2: plain C
 * loops and BLAS), avx2 (AVX2 + FMA), avx512 (F, BW, DQ, VL), avx512_bf16
 * (AVX512-BF16 dot products besides), amx (AMX-BF16 tiles besides, with
 * the tile state granted by the kernel). The level in force is the CPU's,
 * or FSDP_CPU_ISA's when that names a lower one; a value the CPU lacks, or
 * no level, is an error (fl_cpu_isa_check, which the host and
 * `require 'fsdp'` raise at start) and leaves the CPU's level.
 * What follows the level:
 * - our kernels: the AVX-512 row loops and every other fl_cpu_avx512()
 *   caller (avx512 and up); bf16 attention on dot products (avx512_bf16)
 *   or tiles (amx, cpu_attention_native.c); attention's f32 block
 *   products (16 lanes from avx512, 8 at avx2, cpu_block_gemm.c); the
 *   AVX2 16x16 transposes (avx2); the plain C loops compiled for each
 *   level ([Note: ISA clones]: conversions, optimizer updates, unary
 *   math, the fused row loops' generic versions);
 * - oneDNN: capped with dnnl_set_max_cpu_isa before its engine exists
 *   (cpu_onednn.c), so it refuses what it cannot run at the level (bf16
 *   products below avx512 come back as reference kernels, which we never
 *   take) and the choice of library follows (cpu_gemm.c);
 * - MKL: MKL_ENABLE_INSTRUCTIONS before it is opened (cpu_mkl.c), unless
 *   the user set it;
 * - OpenBLAS picks its kernels when it is loaded, before main: below
 *   avx512 on a CPU with AVX-512 the host sets OPENBLAS_CORETYPE=Haswell
 *   and executes itself again (fl_cpu_isa_openblas_coretype, cpu_gemm.c;
 *   host/main.c).
 *   A program embedding the library sets it itself; the text says so.
 * The level is fixed for the process: oneDNN's cap and OpenBLAS's kernels
 * cannot change once chosen. Tests run each level as its own process
 * (tests/run.sh's isa suite).
 */
#include "error.h"
#include "cpu_isa_dispatch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_X86 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

static const char *const level_names[] = {"baseline", "avx2", "avx512", "avx512_bf16", "amx"};
#define LEVELS ((int)(sizeof level_names / sizeof level_names[0]))
#define KNOWN "auto, avx2, avx512, avx512_bf16, amx"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static fl_cpu_isa cpu_level, level;
/* The widest variant of [Note: ISA clones] to run: the level in force, no
 * wider than the x86-64 level (v3, v4) the CPU offers in full. */
static fl_cpu_isa clone_level;
/* Why the CPU lacks the level above its own ("the CPU has no AVX-512"),
 * the error FSDP_CPU_ISA made (empty when none), the CPU's model name. */
static char cpu_lacks[96], env_error[224], model[96];

/* The model name from /proc/cpuinfo, or "" where there is none. */
static void read_model(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v) snprintf(model, sizeof model, "%.*s", (int)strcspn(v + 2, "\n"), v + 2);
            break;
        }
    if (f) fclose(f);
}

/* The highest level this CPU (and kernel) offers; why not the next in
 * cpu_lacks. The AMX tile state is asked for only where the CPU has
 * tiles and the cap allows them (the kernel grants it per process). */
static fl_cpu_isa detect(bool want_tiles) {
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        snprintf(cpu_lacks, sizeof cpu_lacks, "the CPU has no AVX2 with FMA");
        return FL_CPU_ISA_BASELINE;
    }
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))) {
        snprintf(cpu_lacks, sizeof cpu_lacks, "the CPU has no AVX-512 (F, BW, DQ, VL)");
        return FL_CPU_ISA_AVX2;
    }
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1)) {
        snprintf(cpu_lacks, sizeof cpu_lacks, "the CPU has no AVX512-BF16");
        return FL_CPU_ISA_AVX512;
    }
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1) || !(d >> 24 & 1)) {
        snprintf(cpu_lacks, sizeof cpu_lacks, "the CPU has no AMX-BF16 tiles");
        return FL_CPU_ISA_AVX512_BF16;
    }
#if defined(__linux__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (want_tiles && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(cpu_lacks, sizeof cpu_lacks, "the kernel refused the AMX tile state (arch_prctl)");
        return FL_CPU_ISA_AVX512_BF16;
    }
    return FL_CPU_ISA_AMX;
#else
    (void)want_tiles;
    snprintf(cpu_lacks, sizeof cpu_lacks, "AMX tiles need Linux's arch_prctl");
    return FL_CPU_ISA_AVX512_BF16;
#endif
#else
    (void)want_tiles;
    snprintf(cpu_lacks, sizeof cpu_lacks, "not built for x86-64 with GCC");
    return FL_CPU_ISA_BASELINE;
#endif
}

static int level_named(const char *name) {
    for (int i = FL_CPU_ISA_AVX2; i < LEVELS; i++)
        if (strcmp(name, level_names[i]) == 0) return i;
    return -1;
}

/* The level of the x86-64 variants ([Note: ISA clones]) that `lv` may
 * run: arch=x86-64-v4 from avx512, v3 from avx2, where the CPU has all
 * of that arch level (v3 also has F16C, BMI2, MOVBE...). */
static fl_cpu_isa clone_level_at(fl_cpu_isa lv) {
#ifdef FL_ISA_HAVE_VARIANTS
    __builtin_cpu_init();
    if (lv >= FL_CPU_ISA_AVX512 && __builtin_cpu_supports("x86-64-v4")) return FL_CPU_ISA_AVX512;
    if (lv >= FL_CPU_ISA_AVX2 && __builtin_cpu_supports("x86-64-v3")) return FL_CPU_ISA_AVX2;
#else
    (void)lv;
#endif
    return FL_CPU_ISA_BASELINE;
}

static void decide_level(void) {
    read_model();
    const char *env = getenv("FSDP_CPU_ISA");
    bool capped = env && *env && strcmp(env, "auto") != 0;
    int want = capped ? level_named(env) : LEVELS - 1;
    /* An unknown level still detects the tiles: the CPU's level stands. */
    cpu_level = detect(want < 0 || want >= FL_CPU_ISA_AMX);
    level = cpu_level;
    if (!capped) return;
    if (want < 0)
        snprintf(env_error, sizeof env_error, "FSDP_CPU_ISA=%.48s: no such level (known: " KNOWN ")",
                 env);
    else if (want > (int)cpu_level)
        snprintf(env_error, sizeof env_error,
                 "FSDP_CPU_ISA=%s: this CPU cannot run it (%s; its level is %s)", env, cpu_lacks,
                 level_names[cpu_level]);
    else
        level = (fl_cpu_isa)want;
}

static void decide(void) {
    decide_level();
    clone_level = clone_level_at(level);
}

fl_cpu_isa fl_cpu_isa_level(void) {
    pthread_once(&once, decide);
    return level;
}

fl_cpu_isa fl_cpu_isa_cpu(void) {
    pthread_once(&once, decide);
    return cpu_level;
}

const char *fl_cpu_isa_name(fl_cpu_isa isa) {
    return (int)isa >= 0 && (int)isa < LEVELS ? level_names[isa] : "unknown";
}

int fl_cpu_isa_check(void) {
    pthread_once(&once, decide);
    return env_error[0] ? fl_fail(FL_ERR_ARG, "%s", env_error) : FL_OK;
}

const char *fl_cpu_isa_why_not(fl_cpu_isa isa) {
    pthread_once(&once, decide);
    static __thread char why[160];
    if (isa <= level) return NULL;
    if (isa <= cpu_level)
        snprintf(why, sizeof why, "FSDP_CPU_ISA=%s caps it", level_names[level]);
    else
        snprintf(why, sizeof why, "%s", cpu_lacks);
    return why;
}

const char *fl_cpu_isa_text(void) {
    pthread_once(&once, decide);
    static __thread char text[320];
    int n = snprintf(text, sizeof text, "%s", level_names[level]);
    if (level < cpu_level)
        n += snprintf(text + n, sizeof text - (size_t)n, " (capped by FSDP_CPU_ISA; the CPU offers %s)",
                      level_names[cpu_level]);
    else if (env_error[0])
        n += snprintf(text + n, sizeof text - (size_t)n, " (%s)", env_error);
    if (model[0] && n < (int)sizeof text)
        snprintf(text + n, sizeof text - (size_t)n, ", %s", model);
    return text;
}

int fl_isa_family_choose(fl_isa_family *f) {
    pthread_once(&once, decide);
    int v = (int)clone_level < f->widest ? (int)clone_level : f->widest;
    __atomic_store_n(&f->chosen, v, __ATOMIC_RELAXED);
    return v;
}

/* The families' records, gathered by the linker from every object
 * ([Note: ISA clones]). Weak: a build without families has no section. */
extern fl_isa_family *const __start_fl_isa_families[] __attribute__((weak, visibility("hidden")));
extern fl_isa_family *const __stop_fl_isa_families[] __attribute__((weak, visibility("hidden")));

int fl_cpu_isa_clone_count(void) {
    return (int)(__stop_fl_isa_families - __start_fl_isa_families);
}

const char *fl_cpu_isa_clone(int i, int *widest, int *ran) {
    if (i < 0 || i >= fl_cpu_isa_clone_count()) return NULL;
    const fl_isa_family *f = __start_fl_isa_families[i];
    static __thread char name[160];
    const char *file = strrchr(f->file, '/');
    snprintf(name, sizeof name, "%s: %s", file ? file + 1 : f->file, f->name);
    if (widest) *widest = f->widest;
    if (ran) *ran = __atomic_load_n(&f->chosen, __ATOMIC_RELAXED);
    return name;
}
