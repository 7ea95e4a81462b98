/*
 * cpu_isa_dispatch.h: plain C loops compiled once per instruction-set
 * level and run at the level in force (FL_ISA_CLONES).
 *
 * [Note: ISA clones]
 * A loop in plain C (`omp simd`, libmvec's vector expf and friends)
 * vectorises at the width of the code it is compiled for: 4 f32 lanes in
 * the baseline x86-64 build, 8 for AVX2, 16 for AVX-512. Such loops used
 * to carry GCC's target_clones, whose resolver picks a clone by the CPU
 * when the library loads, so FSDP_CPU_ISA=avx2 on an AVX-512 machine
 * still ran the AVX-512 clones ([Note: CPU ISA levels] did not hold for
 * them). Now the loop is written once as NAME_body (FL_ISA_BODY: forced
 * inline) and
 *     FL_ISA_CLONES(WIDEST, RET, NAME, (params), (args))   (value)
 *     FL_ISA_CLONES_VOID(WIDEST, NAME, (params), (args))   (void)
 * defines NAME_avx512 (target arch=x86-64-v4, only when WIDEST is
 * AVX512), NAME_avx2 (arch=x86-64-v3) and NAME_baseline (the build's own
 * flags), each with the body inlined into it, and NAME, which calls the
 * one for the level in force. The arch names are the ones the clones
 * had, and a variant is opaque to its callers as a clone was
 * (FL_ISA_VARIANT), so each is vectorised as its clone was and computes
 * the same bits (checked against the clones' disassembly when they were
 * replaced: the same instructions but for registers and scheduling).
 * The variant run: the level in force, no wider than WIDEST (the fused
 * row loops stop at AVX2: cpu_fused_math.h says why) nor than the x86-64
 * level the CPU offers in full (x86-64-v3 also has F16C, BMI2, MOVBE,
 * which the avx2 level does not ask for). The level is fixed for the
 * process, so a family chooses at its first call and keeps the choice in
 * its record. The dispatcher reaches the record through a pointer in the
 * section fl_isa_families, so the linker gathers one per family that a
 * file calls (one it never calls, such as a row loop cpu_fused_rows.h
 * instantiates for a file that has no use for it, is dropped with its
 * dispatcher), and fl_cpu_isa_clone lists them with the variant each ran
 * (cpu_isa_spec checks them at each level).
 * Put it on a function of plain loops, not on one holding an OpenMP
 * region: the callers split the work among threads and call NAME per
 * span, which also keeps the per-call choice (a load and a switch) off
 * the elements. Outside GCC on x86-64, only NAME_baseline is built.
 */
#ifndef FL_CPU_ISA_DISPATCH_H
#define FL_CPU_ISA_DISPATCH_H

#include "fsdp.h"

/* One family of variants: where it was built, its name, the widest level
 * it has a variant for, and the level of the variant its dispatcher
 * calls (-1 until its first call). */
typedef struct fl_isa_family {
    const char *file, *name;
    int widest;
    int chosen;
} fl_isa_family;

/* Choose f's variant at the level in force and record it (cpu_isa.c). */
int fl_isa_family_choose(fl_isa_family *f);

static inline int fl_isa_family_variant(fl_isa_family *f) {
    int v = __atomic_load_n(&f->chosen, __ATOMIC_RELAXED);
    return v >= 0 ? v : fl_isa_family_choose(f);
}

#define FL_ISA_BODY static inline __attribute__((always_inline))
/* A variant stays a function of its own that the optimiser knows nothing
 * about at its call sites (no inlining, no constants or alignments
 * carried in), as the target_clones clones were: inlined into a caller,
 * a loop could be peeled or split otherwise and sum in another order. */
#if defined(__GNUC__) && !defined(__clang__)
#define FL_ISA_VARIANT static __attribute__((noipa))
#else
#define FL_ISA_VARIANT static __attribute__((noinline))
#endif
/* NAME_body for a NAME that is a macro call (FN(row_max) -> row_max_f32_body). */
#define FL_ISA_BODY_NAME(NAME) FL_ISA_PASTE_(NAME, _body)
#define FL_ISA_PASTE_(A, B) A##B

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FL_ISA_HAVE_VARIANTS 1
#define FL_ISA_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define FL_ISA_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#define FL_ISA_WIDEST_AVX512 FL_CPU_ISA_AVX512
#define FL_ISA_WIDEST_AVX2 FL_CPU_ISA_AVX2
/* The variants above the baseline, and the dispatcher's cases for them. */
#define FL_ISA_VARIANTS_AVX2(RET, RETURN, NAME, PARAMS, ARGS)                                      \
    FL_ISA_TARGET_AVX2 FL_ISA_VARIANT RET NAME##_avx2 PARAMS { RETURN NAME##_body ARGS; }
#define FL_ISA_VARIANTS_AVX512(RET, RETURN, NAME, PARAMS, ARGS)                                    \
    FL_ISA_TARGET_AVX512 FL_ISA_VARIANT RET NAME##_avx512 PARAMS { RETURN NAME##_body ARGS; }      \
    FL_ISA_VARIANTS_AVX2(RET, RETURN, NAME, PARAMS, ARGS)
#define FL_ISA_CASES_AVX2(RETURN, NAME, ARGS)                                                      \
    case FL_CPU_ISA_AVX2: RETURN NAME##_avx2 ARGS; break;
#define FL_ISA_CASES_AVX512(RETURN, NAME, ARGS)                                                    \
    case FL_CPU_ISA_AVX512: RETURN NAME##_avx512 ARGS; break;                                      \
    FL_ISA_CASES_AVX2(RETURN, NAME, ARGS)
#else
#define FL_ISA_WIDEST_AVX512 FL_CPU_ISA_BASELINE
#define FL_ISA_WIDEST_AVX2 FL_CPU_ISA_BASELINE
#define FL_ISA_VARIANTS_AVX2(RET, RETURN, NAME, PARAMS, ARGS)
#define FL_ISA_VARIANTS_AVX512(RET, RETURN, NAME, PARAMS, ARGS)
#define FL_ISA_CASES_AVX2(RETURN, NAME, ARGS)
#define FL_ISA_CASES_AVX512(RETURN, NAME, ARGS)
#endif

/* WIDEST: AVX512 or AVX2. NAME may be a macro call (FN(row_max)): the
 * extra level expands it before it is pasted. */
#define FL_ISA_CLONES(WIDEST, RET, NAME, PARAMS, ARGS)                                             \
    FL_ISA_CLONES_(WIDEST, RET, return, NAME, PARAMS, ARGS)
#define FL_ISA_CLONES_VOID(WIDEST, NAME, PARAMS, ARGS)                                             \
    FL_ISA_CLONES_(WIDEST, void, , NAME, PARAMS, ARGS)
#define FL_ISA_CLONES_(WIDEST, RET, RETURN, NAME, PARAMS, ARGS)                                    \
    FL_ISA_CLONES__(WIDEST, RET, RETURN, NAME, PARAMS, ARGS)
#define FL_ISA_CLONES__(WIDEST, RET, RETURN, NAME, PARAMS, ARGS)                                   \
    static fl_isa_family NAME##_family = {__BASE_FILE__, #NAME, FL_ISA_WIDEST_##WIDEST, -1};       \
    static fl_isa_family *NAME##_family_entry                                                      \
        __attribute__((section("fl_isa_families"), aligned(sizeof(void *)))) = &NAME##_family;     \
    FL_ISA_VARIANTS_##WIDEST(RET, RETURN, NAME, PARAMS, ARGS)                                      \
    FL_ISA_VARIANT RET NAME##_baseline PARAMS { RETURN NAME##_body ARGS; }                         \
    static inline RET NAME PARAMS {                                                                \
        fl_isa_family *f_ = __atomic_load_n(&NAME##_family_entry, __ATOMIC_RELAXED);               \
        switch (fl_isa_family_variant(f_)) {                                                       \
        FL_ISA_CASES_##WIDEST(RETURN, NAME, ARGS)                                                  \
        default: RETURN NAME##_baseline ARGS; break;                                               \
        }                                                                                          \
    }

#endif /* FL_CPU_ISA_DISPATCH_H */
