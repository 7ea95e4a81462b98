/*
 * fma_peak.c: this machine's f32 multiply-add peak, the ceiling under any
 * f32 training step, and with AVX512-BF16 its bf16 dot-product peak, the
 * ceiling under a bf16 one on CPUs without AMX tiles
 * (benchmarks/cpu_compare.sh prints them beside the comparison).
 *
 *   cc -O2 -fopenmp [-mavx512f [-mavx512bf16] | -mfma] benchmarks/fma_peak.c -o fma_peak
 *   OMP_NUM_THREADS=2 ./fma_peak      # RESULT {"fma_peak_gflops": ...}
 *
 * Every thread runs 12 independent chains of vector multiply-adds on
 * registers (no memory traffic), which covers the latency of two FMA units
 * (4 cycles x 2 per cycle needs 8). Built with -mavx512f it uses 512-bit
 * vectors, with -mfma 256-bit ones; with -mavx512bf16 it then also times
 * chains of vdpbf16ps (per f32 lane, two bf16 products added: 4 FLOPs). No
 * GEMM can beat these rates: a matrix product's FLOPs divided by one is a
 * floor on its time.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define STORE _mm512_storeu_ps
#elif defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define STORE _mm256_storeu_ps
#else
#error "build with -mavx512f or -mfma"
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The sum of every lane of 12 chains: it keeps them live. */
static float sum_of(const vec c[12]) {
    vec s = c[0];
    for (int i = 1; i < 12; i++) s = ADD(s, c[i]);
    float lanes[LANES], total = 0;
    STORE(lanes, s);
    for (int j = 0; j < LANES; j++) total += lanes[j];
    return total;
}

/* n rounds of 12 multiply-adds per thread; the sum keeps them live. */
static float run(long n) {
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
        vec m = SET1(0.999999f), a = SET1(1e-7f);
        vec c0 = SET1(0), c1 = SET1(1), c2 = SET1(2), c3 = SET1(3), c4 = SET1(4), c5 = SET1(5);
        vec c6 = SET1(6), c7 = SET1(7), c8 = SET1(8), c9 = SET1(9), c10 = SET1(10), c11 = SET1(11);
        for (long i = 0; i < n; i++) {
            c0 = FMA(c0, m, a), c1 = FMA(c1, m, a), c2 = FMA(c2, m, a), c3 = FMA(c3, m, a);
            c4 = FMA(c4, m, a), c5 = FMA(c5, m, a), c6 = FMA(c6, m, a), c7 = FMA(c7, m, a);
            c8 = FMA(c8, m, a), c9 = FMA(c9, m, a), c10 = FMA(c10, m, a), c11 = FMA(c11, m, a);
        }
        total += sum_of((vec[12]){c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11});
    }
    return total;
}

#if defined(__AVX512BF16__)
/* The same with vdpbf16ps: 12 chains of 16 f32 sums, each step adding two
 * bf16 products per lane. */
static float run_bf16(long n) {
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
        __m512bh m = _mm512_cvtne2ps_pbh(SET1(0.999f), SET1(0.999f));
        __m512bh a = _mm512_cvtne2ps_pbh(SET1(1e-7f), SET1(1e-7f));
        vec c0 = SET1(0), c1 = SET1(1), c2 = SET1(2), c3 = SET1(3), c4 = SET1(4), c5 = SET1(5);
        vec c6 = SET1(6), c7 = SET1(7), c8 = SET1(8), c9 = SET1(9), c10 = SET1(10), c11 = SET1(11);
        for (long i = 0; i < n; i++) {
            c0 = _mm512_dpbf16_ps(c0, m, a), c1 = _mm512_dpbf16_ps(c1, m, a);
            c2 = _mm512_dpbf16_ps(c2, m, a), c3 = _mm512_dpbf16_ps(c3, m, a);
            c4 = _mm512_dpbf16_ps(c4, m, a), c5 = _mm512_dpbf16_ps(c5, m, a);
            c6 = _mm512_dpbf16_ps(c6, m, a), c7 = _mm512_dpbf16_ps(c7, m, a);
            c8 = _mm512_dpbf16_ps(c8, m, a), c9 = _mm512_dpbf16_ps(c9, m, a);
            c10 = _mm512_dpbf16_ps(c10, m, a), c11 = _mm512_dpbf16_ps(c11, m, a);
        }
        total += sum_of((vec[12]){c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11});
    }
    return total;
}
#endif

/* The best of 5 timings of f(n), in GFLOP/s at flops_per_round FLOPs per
 * round and thread. */
static double best_rate(float (*f)(long), long n, double flops_per_round, float *sink) {
    f(n / 10); /* wake the threads and the clocks */
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        *sink += f(n);
        double rate = flops_per_round * (double)n * omp_get_max_threads() / (now() - t0) / 1e9;
        if (rate > best) best = rate;
    }
    return best;
}

int main(void) {
    long n = 20000000;
    float sink = 0;
    double best = best_rate(run, n, 2.0 * 12 * LANES, &sink);
    printf("f32 multiply-add peak: %.1f GFLOP/s (%d threads, %d-bit vectors; checksum %g)\n", best,
           omp_get_max_threads(), LANES * 32, (double)sink);
#if defined(__AVX512BF16__)
    double bf16 = best_rate(run_bf16, n, 4.0 * 12 * LANES, &sink);
    printf("bf16 dot-product peak (vdpbf16ps): %.1f GFLOP/s (checksum %g)\n", bf16, (double)sink);
    printf("RESULT {\"fma_peak_gflops\": %.1f, \"bf16_dot_peak_gflops\": %.1f, \"threads\": %d, "
           "\"vector_bits\": %d}\n",
           best, bf16, omp_get_max_threads(), LANES * 32);
#else
    printf("RESULT {\"fma_peak_gflops\": %.1f, \"threads\": %d, \"vector_bits\": %d}\n", best,
           omp_get_max_threads(), LANES * 32);
#endif
    return 0;
}
