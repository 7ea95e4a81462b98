/*
 * selftest.cu: checks of the simulator itself, in TAP: that what the
 * backend's kernels rely on works (thread indices, shared memory,
 * barriers, shuffles, ballots, atomics, dynamic shared memory) and that
 * what would hang or fail on a GPU becomes an error naming the kernel
 * (divergent barriers, shuffling with a lane that has returned, bad
 * launch configurations, too much shared memory). Then the stream model
 * (sim_runtime.cc): work on a stream from cudaStreamCreate* is deferred
 * until something forces it, so a reader that does not wait sees the old
 * data every time; events and waits order it (also between two deferred
 * streams, and a wait names the record made before it); blocking streams
 * run before stream-0 work, non-blocking ones do not; event queries force
 * progress; kernel arguments are copied at the launch; elapsed times and
 * their error codes; a fault in a deferred kernel surfaces at the call
 * that forced it, naming the kernel; two host threads may share the
 * runtime; FSDP_CUDASIM_STREAMS=eager runs everything at once. Each case
 * runs in a child process, because a fault is sticky for the process, as a
 * CUDA context's is.
 *
 * Built by mk/cuda.mk in the cudasim configuration as
 * build/cudasim/bin/cudasim-selftest; run by tests/run.sh.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

__global__ void fill_ints(int *dst, int value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = value;
}

__global__ void copy_ints(int *dst, const int *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

/* An argument bigger than a register: a launch must copy all of it. */
struct many_ints {
    int v[16];
};
__global__ void sum_struct(int *dst, many_ints m) {
    int s = 0;
    for (int i = 0; i < 16; i++) s += m.v[i];
    dst[threadIdx.x] = s;
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

/* ---- streams ----------------------------------------------------------------------- */

constexpr int N = 32;
constexpr size_t BYTES = N * sizeof(int);

/* N ints of device memory, each v (device memory is host memory here, so
 * the tests set and look at it directly, outside any stream). */
static int *ints(int v) {
    int *p;
    if (cudaMalloc((void **)&p, BYTES) != cudaSuccess) abort();
    for (int i = 0; i < N; i++) p[i] = v;
    return p;
}

static bool all(const int *p, int v) {
    for (int i = 0; i < N; i++)
        if (p[i] != v) {
            fprintf(stderr, "element %d is %d, want %d\n", i, p[i], v);
            return false;
        }
    return true;
}

static cudaStream_t nonblocking(void) {
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) abort();
    return s;
}

static cudaEvent_t event(unsigned flags) {
    cudaEvent_t e;
    if (cudaEventCreateWithFlags(&e, flags) != cudaSuccess) abort();
    return e;
}

/* (a) Queued work has not run before the stream is synchronised. */
static bool deferred_until_sync(void) {
    int *a = ints(1), *b = ints(1);
    cudaStream_t s = nonblocking();
    bool ok = cudaMemsetAsync(a, 0, BYTES, s) == cudaSuccess;
    fill_ints<<<1, N, 0, s>>>(b, 7, N);
    ok = ok && cudaGetLastError() == cudaSuccess && all(a, 1) && all(b, 1);
    ok = ok && cudaStreamSynchronize(s) == cudaSuccess && all(a, 0) && all(b, 7);
    return ok;
}

/* (b) A stream-0 kernel reading what a deferred copy or kernel writes:
 * without a wait it sees the old contents, with cudaStreamWaitEvent(0, e)
 * the new. */
static bool read_after(bool wait, bool by_kernel) {
    int *src = ints(5), *dst = ints(1), *out = ints(-1);
    cudaStream_t s = nonblocking();
    cudaEvent_t e = event(cudaEventDisableTiming);
    if (by_kernel) fill_ints<<<1, N, 0, s>>>(dst, 5, N);
    else cudaMemcpyAsync(dst, src, BYTES, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(e, s);
    if (wait) cudaStreamWaitEvent(0, e, 0);
    copy_ints<<<1, N>>>(out, dst, N);
    bool ok = cudaGetLastError() == cudaSuccess && all(out, wait ? 5 : 1);
    return ok && cudaStreamSynchronize(s) == cudaSuccess && all(dst, 5);
}
static bool missing_wait_copy(void) { return read_after(false, false); }
static bool missing_wait_kernel(void) { return read_after(false, true); }
static bool with_wait_copy(void) { return read_after(true, false); }
static bool with_wait_kernel(void) { return read_after(true, true); }

/* (b) A deferred read of a buffer that stream 0 then overwrites: without a
 * wait before the overwrite (what record_stream protects) the read sees
 * the new data; with one it sees what was there when it was queued. */
static bool reuse(bool protect) {
    int *buf = ints(1), *out = ints(-1);
    cudaStream_t s = nonblocking();
    cudaEvent_t read = event(cudaEventDisableTiming);
    cudaMemcpyAsync(out, buf, BYTES, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(read, s);
    if (protect) cudaStreamWaitEvent(0, read, 0);
    fill_ints<<<1, N>>>(buf, 2, N);
    return cudaStreamSynchronize(s) == cudaSuccess && all(buf, 2) && all(out, protect ? 1 : 2);
}
static bool reuse_unprotected(void) { return reuse(false); }
static bool reuse_protected(void) { return reuse(true); }

/* (c) Between two deferred streams: a wait forces the other stream up to
 * the event's record (and no further), only where it was issued. */
static bool two_streams(void) {
    int *a = ints(1), *b = ints(0), *c = ints(0);
    cudaStream_t s1 = nonblocking(), s2 = nonblocking();
    cudaEvent_t e = event(cudaEventDisableTiming);
    fill_ints<<<1, N, 0, s1>>>(a, 3, N);
    cudaEventRecord(e, s1);
    fill_ints<<<1, N, 0, s1>>>(a, 4, N); /* after the record: not waited for */
    cudaStreamWaitEvent(s2, e, 0);
    cudaMemcpyAsync(b, a, BYTES, cudaMemcpyDeviceToDevice, s2);
    bool ok = all(a, 1) && all(b, 0); /* nothing ran yet */
    ok = ok && cudaStreamSynchronize(s2) == cudaSuccess && all(b, 3) && all(a, 3);
    /* no wait: s2 copies what is there when it is forced */
    cudaMemcpyAsync(c, a, BYTES, cudaMemcpyDeviceToDevice, s2);
    ok = ok && cudaStreamSynchronize(s2) == cudaSuccess && all(c, 3);
    return ok && cudaStreamSynchronize(s1) == cudaSuccess && all(a, 4);
}

/* (c) The last record wins, but a wait keeps the record it was issued
 * after. */
static bool rerecord(void) {
    int *a = ints(1), *b = ints(0), *c = ints(0);
    cudaStream_t s1 = nonblocking(), s2 = nonblocking(), s3 = nonblocking();
    cudaEvent_t e = event(cudaEventDisableTiming);
    fill_ints<<<1, N, 0, s1>>>(a, 3, N);
    cudaEventRecord(e, s1);
    cudaStreamWaitEvent(s2, e, 0); /* waits for a == 3 */
    cudaMemcpyAsync(b, a, BYTES, cudaMemcpyDeviceToDevice, s2);
    fill_ints<<<1, N, 0, s1>>>(a, 4, N);
    cudaEventRecord(e, s1);
    cudaStreamWaitEvent(s3, e, 0); /* waits for a == 4 */
    cudaMemcpyAsync(c, a, BYTES, cudaMemcpyDeviceToDevice, s3);
    bool ok = cudaStreamSynchronize(s2) == cudaSuccess && all(b, 3);
    return ok && cudaStreamSynchronize(s3) == cudaSuccess && all(c, 4);
}

/* (d) A stream-0 operation runs the blocking streams' queues first, not
 * the non-blocking ones'. */
static bool blocking_streams(void) {
    int *a = ints(1), *b = ints(1), *oa = ints(0), *ob = ints(0), host[N];
    cudaStream_t blocking, nb = nonblocking();
    cudaStreamCreate(&blocking);
    fill_ints<<<1, N, 0, blocking>>>(a, 5, N);
    fill_ints<<<1, N, 0, nb>>>(b, 6, N);
    copy_ints<<<1, N>>>(oa, a, N);
    copy_ints<<<1, N>>>(ob, b, N);
    bool ok = all(oa, 5) && all(ob, 1);
    /* the synchronous copy to the host too */
    fill_ints<<<1, N, 0, blocking>>>(a, 7, N);
    fill_ints<<<1, N, 0, nb>>>(b, 8, N);
    ok = ok && cudaMemcpy(host, a, BYTES, cudaMemcpyDeviceToHost) == cudaSuccess && all(host, 7);
    ok = ok && cudaMemcpy(host, b, BYTES, cudaMemcpyDeviceToHost) == cudaSuccess && all(host, 1);
    ok = ok && cudaDeviceSynchronize() == cudaSuccess && all(b, 8);
    /* the flags are what tells them apart; priorities are clamped */
    unsigned fb = 9, fn = 9;
    int prio = 1;
    cudaStream_t p;
    ok = ok && cudaStreamGetFlags(blocking, &fb) == cudaSuccess && fb == cudaStreamDefault &&
         cudaStreamGetFlags(nb, &fn) == cudaSuccess && fn == cudaStreamNonBlocking;
    ok = ok && cudaStreamCreateWithPriority(&p, cudaStreamNonBlocking, -100) == cudaSuccess &&
         cudaStreamGetPriority(p, &prio) == cudaSuccess && prio == -5;
    return ok;
}

/* (e) Querying an event runs its stream up to the record and no further;
 * an event never recorded is complete. */
static bool query_forces(void) {
    int *a = ints(1), *b = ints(1);
    cudaStream_t s = nonblocking();
    cudaEvent_t e = event(cudaEventDisableTiming), never = event(0);
    fill_ints<<<1, N, 0, s>>>(a, 5, N);
    cudaEventRecord(e, s);
    fill_ints<<<1, N, 0, s>>>(b, 6, N);
    bool ok = all(a, 1) && cudaEventQuery(never) == cudaSuccess;
    ok = ok && cudaEventQuery(e) == cudaSuccess && all(a, 5) && all(b, 1);
    fill_ints<<<1, N, 0, s>>>(a, 9, N);
    cudaEventRecord(e, s);
    ok = ok && cudaEventSynchronize(e) == cudaSuccess && all(b, 6) && all(a, 9);
    fill_ints<<<1, N, 0, s>>>(b, 10, N);
    return ok && cudaStreamQuery(s) == cudaSuccess && all(b, 10);
}

/* (f) Arguments are copied at the launch, not when the kernel runs. */
static bool args_by_value(void) {
    int *a = ints(0), *b = ints(0);
    cudaStream_t s = nonblocking();
    int v = 11;
    many_ints m;
    for (int i = 0; i < 16; i++) m.v[i] = i;
    fill_ints<<<1, N, 0, s>>>(a, v, N);
    sum_struct<<<1, N, 0, s>>>(b, m);
    v = 99;
    for (int i = 0; i < 16; i++) m.v[i] = 1000;
    return cudaStreamSynchronize(s) == cudaSuccess && all(a, 11) && all(b, 15 * 16 / 2) && v == 99;
}

/* (g) Elapsed time between timing events whose records ran; NotReady
 * before, invalid handle for events without timing or never recorded. */
static bool elapsed_time(void) {
    int *a = ints(0);
    cudaStream_t s = nonblocking();
    cudaEvent_t t0 = event(cudaEventDefault), t1 = event(cudaEventDefault), never = event(0),
                untimed = event(cudaEventDisableTiming);
    float ms = -1;
    cudaEventRecord(t0, s);
    fill_ints<<<4, N, 0, s>>>(a, 1, N);
    cudaEventRecord(t1, s);
    cudaEventRecord(untimed, s);
    bool ok = cudaEventElapsedTime(&ms, t0, t1) == cudaErrorNotReady;
    ok = ok && cudaEventElapsedTime(&ms, t0, never) == cudaErrorInvalidResourceHandle;
    ok = ok && cudaEventSynchronize(t1) == cudaSuccess && cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms >= 0;
    ok = ok && cudaEventSynchronize(untimed) == cudaSuccess &&
         cudaEventElapsedTime(&ms, t0, untimed) == cudaErrorInvalidResourceHandle;
    /* on stream 0 the records run at once */
    cudaEventRecord(t0, 0);
    fill_ints<<<4, N>>>(a, 2, N);
    cudaEventRecord(t1, 0);
    ms = -1;
    ok = ok && cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms >= 0;
    /* the errors were not sticky */
    cudaGetLastError();
    return ok && cudaGetLastError() == cudaSuccess;
}

/* Catches what the runtime prints on stderr during a case. */
struct captured {
    FILE *file;
    int saved;
};
static captured capture_stderr(void) {
    fflush(stderr);
    captured c = {tmpfile(), dup(2)};
    dup2(fileno(c.file), 2);
    return c;
}
/* Ends the capture (echoing what was caught) and says whether it holds
 * every one of the strings. */
static bool caught(captured c, const char *a, const char *b) {
    fflush(stderr);
    dup2(c.saved, 2);
    close(c.saved);
    char text[4096] = {0};
    rewind(c.file);
    fread(text, 1, sizeof text - 1, c.file);
    fclose(c.file);
    fputs(text, stderr);
    bool ok = strstr(text, a) && strstr(text, b);
    if (!ok) fprintf(stderr, "expected the message to name %s and %s\n", a, b);
    return ok;
}

/* (h) A fault in a deferred kernel surfaces at the call that forced it,
 * naming the kernel (and the call). */
static bool deferred_fault(bool by_query) {
    int *b = ints(0);
    cudaStream_t s = nonblocking();
    cudaEvent_t e = event(cudaEventDisableTiming);
    divergent_barrier<<<1, 64, 0, s>>>(b);
    cudaEventRecord(e, s);
    bool ok = cudaGetLastError() == cudaSuccess; /* queued, not run */
    captured c = capture_stderr();
    cudaError_t got = by_query ? cudaEventQuery(e) : cudaStreamSynchronize(s);
    ok = caught(c, "divergent_barrier", by_query ? "cudaEventQuery" : "cudaStreamSynchronize") && ok;
    ok = ok && got == cudaErrorLaunchFailure;
    /* sticky: the next queued work does not run */
    b[0] = 7;
    cudaMemsetAsync(b, 0, BYTES, s);
    return ok && cudaStreamSynchronize(s) == cudaErrorLaunchFailure && b[0] == 7;
}
static bool deferred_fault_sync(void) { return deferred_fault(false); }
static bool deferred_fault_query(void) { return deferred_fault(true); }

/* Destroying a stream runs its queue; cudaDeviceSynchronize runs them all;
 * host functions run in stream order. */
static int host_calls[4], nhost_calls;
static void note_call(void *p) { host_calls[nhost_calls++] = (int)(intptr_t)p; }
static bool destroy_and_device_sync(void) {
    int *a = ints(1), *b = ints(1);
    cudaStream_t s1 = nonblocking(), s2 = nonblocking();
    fill_ints<<<1, N, 0, s1>>>(a, 3, N);
    cudaLaunchHostFunc(s2, note_call, (void *)1);
    fill_ints<<<1, N, 0, s2>>>(b, 4, N);
    cudaLaunchHostFunc(s2, note_call, (void *)2);
    bool ok = cudaStreamDestroy(s1) == cudaSuccess && all(a, 3) && all(b, 1) && nhost_calls == 0;
    ok = ok && cudaDeviceSynchronize() == cudaSuccess && all(b, 4) && nhost_calls == 2 && host_calls[0] == 1 &&
         host_calls[1] == 2;
    /* a destroyed stream's handle is refused */
    return ok && cudaStreamSynchronize(s1) == cudaErrorInvalidResourceHandle;
}

/* Two host threads: one launches and records on a deferred stream, the
 * other polls the event (as a watchdog would) and launches on stream 0;
 * the lock serialises them, so every result is right. */
struct shared_state {
    cudaStream_t s;
    cudaEvent_t e;
    int *poll_out;
    volatile int done;
    int bad;
};
static void *poller(void *p) {
    shared_state *st = (shared_state *)p;
    for (int i = 0; !st->done || i < 50; i++) {
        if (cudaEventQuery(st->e) != cudaSuccess) st->bad++;
        fill_ints<<<1, N>>>(st->poll_out, i, N);
        if (cudaGetLastError() != cudaSuccess || st->poll_out[0] != i) st->bad++;
    }
    return NULL;
}
static bool two_threads(void) {
    shared_state st = {nonblocking(), event(cudaEventDisableTiming), ints(0), 0, 0};
    int *a = ints(0);
    cudaEventRecord(st.e, st.s);
    pthread_t t;
    pthread_create(&t, NULL, poller, &st);
    bool ok = true;
    for (int i = 1; i <= 200; i++) {
        fill_ints<<<2, N / 2, 0, st.s>>>(a, i, N);
        cudaEventRecord(st.e, st.s);
        if (i % 50 == 0) ok = ok && cudaStreamSynchronize(st.s) == cudaSuccess && all(a, i);
    }
    st.done = 1;
    pthread_join(t, NULL);
    if (st.bad) fprintf(stderr, "%d bad answers on the polling thread\n", st.bad);
    return ok && st.bad == 0 && cudaStreamSynchronize(st.s) == cudaSuccess && all(a, 200);
}

/* What the simulated cuBLAS/cuDNN ask before computing at once: stream 0
 * runs the blocking streams' work first; a deferred stream is refused (1),
 * so a library call never runs ahead of its stream; a non-stream is -1. */
static bool library_streams(void) {
    int *a = ints(1), not_a_stream = 0;
    cudaStream_t blocking, nb = nonblocking();
    cudaStreamCreate(&blocking);
    fill_ints<<<1, N, 0, blocking>>>(a, 2, N);
    bool ok = fl_sim_stream_now(nb) == 1 && all(a, 1);
    ok = ok && fl_sim_stream_now(0) == 0 && all(a, 2);
    return ok && fl_sim_stream_now((cudaStream_t)&not_a_stream) == -1;
}

/* FSDP_CUDASIM_STREAMS=eager: every stream runs its work when issued. */
static bool eager_streams(void) {
    setenv("FSDP_CUDASIM_STREAMS", "eager", 1);
    int *a = ints(1), *out = ints(0);
    cudaStream_t s = nonblocking();
    fill_ints<<<1, N, 0, s>>>(a, 5, N);
    bool ok = all(a, 5);
    cudaMemsetAsync(a, 0, BYTES, s);
    copy_ints<<<1, N>>>(out, a, N); /* no wait, and yet it sees the new data */
    return ok && all(out, 0);
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
    report(in_child(deferred_until_sync), "a copy and a kernel on a non-blocking stream run at cudaStreamSynchronize, not before");
    report(in_child(missing_wait_copy), "stream 0 reading what a deferred copy writes, without a wait: the old data");
    report(in_child(missing_wait_kernel), "stream 0 reading what a deferred kernel writes, without a wait: the old data");
    report(in_child(with_wait_copy), "the same after cudaStreamWaitEvent(0, e) on the copy: the new data");
    report(in_child(with_wait_kernel), "the same after cudaStreamWaitEvent(0, e) on the kernel: the new data");
    report(in_child(reuse_unprotected), "stream 0 overwriting a buffer a deferred copy has yet to read: the copy reads the new data");
    report(in_child(reuse_protected), "the same with stream 0 waiting for the copy first: the copy reads the old data");
    report(in_child(two_streams), "a wait between two deferred streams runs the other up to the record, no further");
    report(in_child(rerecord), "re-recording an event: later waits see the new record, an earlier wait keeps its own");
    report(in_child(blocking_streams), "stream-0 kernels and cudaMemcpy run blocking streams first, not non-blocking ones");
    report(in_child(query_forces), "cudaEventQuery/Synchronize run the stream up to the record; never recorded is complete");
    report(in_child(args_by_value), "kernel arguments (an int, a 64-byte struct) are copied at the launch");
    report(in_child(elapsed_time), "cudaEventElapsedTime: >= 0 once run, NotReady before, invalid handle without timing");
    report(in_child(deferred_fault_sync), "a fault in a deferred kernel surfaces at cudaStreamSynchronize, naming the kernel");
    report(in_child(deferred_fault_query), "a fault in a deferred kernel surfaces at cudaEventQuery, naming the kernel");
    report(in_child(destroy_and_device_sync), "cudaStreamDestroy runs its queue, cudaDeviceSynchronize all, host functions in order");
    report(in_child(two_threads), "two host threads launching, recording and polling events are serialised");
    report(in_child(library_streams), "library calls: stream 0 runs blocking streams first, a deferred stream is refused");
    report(in_child(eager_streams), "FSDP_CUDASIM_STREAMS=eager: every stream runs its work when issued");
    printf("1..%d\n", tests_run);
    return tests_failed ? 1 : 0;
}
