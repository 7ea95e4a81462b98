/*
 * selftest.cu: checks of the simulator itself, in TAP: that what the
 * backend's kernels rely on works (thread indices, shared memory,
 * barriers, shuffles, ballots, atomics, dynamic shared memory) and that
 * what would hang or fail on a GPU becomes an error naming the kernel
 * (divergent barriers, shuffling with a lane that has returned, bad
 * launch configurations, too much shared memory). Each case runs in a
 * child process, because a fault is sticky for the process, as a CUDA
 * context's is.
 *
 * Built by mk/extra.mk in the cudasim configuration as
 * build/cudasim/bin/cudasim-selftest; run by tests/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int tests_run, tests_failed;

static void report(bool ok, const char *what) {
    tests_run++;
    if (!ok) tests_failed++;
    printf("%s %d - cudasim %s\n", ok ? "ok" : "not ok", tests_run, what);
    fflush(stdout);
}

/* ---- kernels that must work -------------------------------------------------- */

/* Per block: the sum of the linear thread indices, by warp shuffles and a
 * shared array of warp sums, as the backend's reductions do. */
__global__ void block_sum(long long *out) {
    __shared__ long long warp_sums[32];
    int t = threadIdx.x + threadIdx.y * blockDim.x;
    long long v = t + (long long)blockIdx.x * 1000;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (t % 32 == 0) warp_sums[t / 32] = v;
    __syncthreads();
    if (t == 0) {
        long long s = 0;
        for (int w = 0; w < (int)(blockDim.x * blockDim.y + 31) / 32; w++) s += warp_sums[w];
        out[blockIdx.x] = s;
    }
}

/* shfl_down reduction, a broadcast from lane 3, a ballot of odd lanes. */
__global__ void warp_ops(int *out) {
    int lane = threadIdx.x;
    int v = lane;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int b = __shfl_sync(0xffffffffu, lane * 10, 3);
    unsigned odd = __ballot_sync(0xffffffffu, lane & 1);
    if (lane == 0) out[0] = v;
    out[1 + lane] = b;
    if (lane == 31) out[33] = (int)odd;
}

__global__ void count_atomic(unsigned long long *n) { atomicAdd(n, 1ULL); }

__global__ void dynamic_smem_fill(int *out, int n) {
    extern __shared__ int buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long s = 0;
        for (int i = 0; i < n; i++) s += buf[i];
        out[0] = (int)(s % 1000003);
    }
}

/* ---- kernels that must fail ---------------------------------------------------- */

/* Half a warp at a shuffle, the other half at __syncthreads: hangs on a GPU. */
__global__ void divergent_barrier(int *out) {
    int v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else __syncthreads();
    out[threadIdx.x] = v;
}

/* Lanes 16..31 return before a full-mask shuffle. */
__global__ void shuffle_after_return(int *out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void nothing(int *) {}

/* Uses 64 KiB of dynamic shared memory without asking for it. */
__global__ void unasked_smem(int *out) {
    extern __shared__ int big[];
    big[threadIdx.x] = 1;
    out[0] = big[0];
}

/* ---- harness --------------------------------------------------------------------- */

/* Runs fn in a child; true when the child exits 0. */
static bool in_child(bool (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(fn() ? 0 : 1);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static bool launch_fails_with(cudaError_t want, void (*launch)(int *)) {
    int *buf;
    cudaMalloc((void **)&buf, 4096 * sizeof(int));
    launch(buf);
    cudaError_t got = cudaGetLastError();
    if (got != want) fprintf(stderr, "expected error %d, got %d\n", (int)want, (int)got);
    return got == want;
}

static void launch_divergent(int *b) { divergent_barrier<<<1, 64>>>(b); }
static void launch_after_return(int *b) { shuffle_after_return<<<1, 32>>>(b); }
static void launch_too_many_threads(int *b) { nothing<<<1, 2048>>>(b); }
static void launch_too_much_smem(int *b) { unasked_smem<<<1, 128, 64 << 10>>>(b); }

static bool divergent(void) { return launch_fails_with(cudaErrorLaunchFailure, launch_divergent); }
static bool after_return(void) { return launch_fails_with(cudaErrorLaunchFailure, launch_after_return); }
static bool too_many_threads(void) {
    return launch_fails_with(cudaErrorInvalidConfiguration, launch_too_many_threads);
}
static bool too_much_smem(void) { return launch_fails_with(cudaErrorInvalidValue, launch_too_much_smem); }

/* A fault is sticky: the next launch does not run and reports it too. */
static bool fault_is_sticky(void) {
    int *b;
    cudaMalloc((void **)&b, 4096 * sizeof(int));
    divergent_barrier<<<1, 64>>>(b);
    cudaGetLastError();
    b[0] = 7;
    nothing<<<1, 1>>>(b);
    return cudaGetLastError() == cudaErrorLaunchFailure &&
           cudaMemcpy(b, b + 1, 4, cudaMemcpyDeviceToDevice) == cudaErrorLaunchFailure;
}

/* A shuffle past the end of a partial warp (120 threads: warp 3 has 24
 * lanes) reads a lane that does not exist. */
static void launch_partial_warp(int *b) { block_sum<<<1, 120>>>((long long *)b); }
static bool partial_warp(void) { return launch_fails_with(cudaErrorLaunchFailure, launch_partial_warp); }

static bool reduction(void) {
    long long *sums;
    cudaMalloc((void **)&sums, 8 * sizeof(long long));
    block_sum<<<5, dim3(32, 4)>>>(sums);
    bool ok = cudaGetLastError() == cudaSuccess;
    for (int b = 0; b < 5; b++) ok = ok && sums[b] == 127 * 128 / 2 + 128LL * b * 1000;
    return ok;
}

static bool warp_collectives(void) {
    int *w;
    cudaMalloc((void **)&w, 64 * sizeof(int));
    warp_ops<<<1, 32>>>(w);
    bool ok = cudaGetLastError() == cudaSuccess && w[0] == 31 * 32 / 2 && w[33] == (int)0xaaaaaaaau;
    for (int l = 0; l < 32; l++) ok = ok && w[1 + l] == 30;
    return ok;
}

static bool atomics(void) {
    unsigned long long *n;
    cudaMalloc((void **)&n, sizeof *n);
    *n = 0;
    count_atomic<<<7, 256>>>(n);
    return cudaGetLastError() == cudaSuccess && *n == 7 * 256;
}

static bool dynamic_smem(void) {
    int *w;
    cudaMalloc((void **)&w, sizeof(int));
    cudaFuncSetAttribute(dynamic_smem_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10);
    dynamic_smem_fill<<<2, 128, 64 << 10>>>(w, 16384);
    return cudaGetLastError() == cudaSuccess && w[0] == (int)((16383LL * 16384 / 2) % 1000003);
}

int main(void) {
    report(in_child(reduction), "block reduction through shuffles, shared memory and a barrier (2-d blocks)");
    report(in_child(warp_collectives), "shfl_down, shfl broadcast and ballot");
    report(in_child(atomics), "atomicAdd from every thread of the grid");
    report(in_child(dynamic_smem), "64 KiB of dynamic shared memory after cudaFuncSetAttribute");
    report(in_child(divergent), "half a warp at a shuffle, half at __syncthreads: a launch failure");
    report(in_child(after_return), "a full-mask shuffle after half the warp returned: a launch failure");
    report(in_child(partial_warp), "a shuffle past the end of a partial warp: a launch failure");
    report(in_child(too_many_threads), "2048 threads per block: invalid configuration");
    report(in_child(too_much_smem), "64 KiB of dynamic shared memory without the attribute: refused");
    report(in_child(fault_is_sticky), "a fault is sticky for the process");
    printf("1..%d\n", tests_run);
    return tests_failed ? 1 : 0;
}
