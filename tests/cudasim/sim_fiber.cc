/*
 * sim_fiber.cc: runs a simulated kernel launch on the CPU.
 *
 * Blocks run one after another; the threads of a block run as fibers
 * (ucontext) on the calling thread, in order of their linear index, each
 * until it finishes or waits at a barrier. When no fiber can run, the
 * scheduler looks at what they wait for:
 *   - a warp collective (__shfl*_sync, __ballot_sync, __syncwarp) is
 *     released once every live lane its mask names has arrived at one;
 *     the results are computed then, from the values all lanes gave;
 *   - __syncthreads is released once every live thread of the block waits
 *     there (threads that returned count as arrived, as on the GPU).
 * Anything else is a kernel that would hang or misbehave on the GPU
 * (divergent barriers, a shuffle reading a lane that does not take part):
 * it becomes a launch failure with a message naming the kernel, the block
 * and what each group of threads was doing, instead of a hang.
 *
 * Why fibers and not OS threads: barriers are frequent in reductions and a
 * block holds up to 1024 threads; a context switch without the kernel's
 * scheduler is cheap, and the order of execution is deterministic, so a
 * failure reproduces. On x86-64 the switch is a few instructions of our
 * own (callee-saved registers, the stack pointer, MXCSR and the x87
 * control word, as the ABI requires); glibc's swapcontext also saves the
 * signal mask with a system call per switch, which made it the cost of a
 * simulated launch. Elsewhere ucontext is used.
 *
 * When a launch runs is the runtime's business (sim_runtime.cc: at once on
 * stream 0, when forced on a deferred stream); this file checks a launch's
 * configuration when it is issued (fl_sim_launch_valid) and runs it
 * (fl_sim_run), under the runtime's lock.
 */
#include "cudasim.h"
#include "sim_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

#if defined(__x86_64__)
#define FL_SIM_FAST_SWITCH 1
/* Save the callee-saved state on the current stack, store the stack
 * pointer in *from, continue on the stack `to` (as saved by this function
 * or prepared by fiber_stack_init). */
extern "C" void fl_sim_switch(void **from, void *to);
__asm__(".text\n"
        ".p2align 4\n"
        ".hidden fl_sim_switch\n"
        ".globl fl_sim_switch\n"
        ".type fl_sim_switch,@function\n"
        "fl_sim_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size fl_sim_switch, .-fl_sim_switch\n");
#endif

fl_sim_thread *fl_sim_self;
uint3 fl_sim_block_idx;
dim3 fl_sim_block_dim, fl_sim_grid_dim;

namespace {

enum fiber_state { READY, WAIT_BLOCK, WAIT_WARP, DONE };

/* Big enough for the kernels' register arrays (attention keeps a row of
 * up to 256 floats per thread); pages are touched only as used. */
constexpr size_t STACK_BYTES = 256 << 10;
constexpr int MAX_THREADS = 1024;

struct fiber {
    fl_sim_thread t;
#if FL_SIM_FAST_SWITCH
    void *sp;
#else
    ucontext_t ctx;
#endif
    void *stack;
    fiber_state state;
    /* the warp collective it waits at */
    fl_sim_warp_op op;
    unsigned mask;
    uint64_t value;
    int src;
    uint64_t result;
};

fiber fibers[MAX_THREADS];
#if FL_SIM_FAST_SWITCH
void *scheduler;
#else
ucontext_t scheduler;
#endif
fiber *running;
void (*body)(void *);
void *closure;
fl_sim_site site;
int nthreads;
bool abandoned; /* the block was given up (divergence): fibers are not resumed */
unsigned char *dynamic_smem;
size_t dynamic_smem_bytes;
pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;

const char *basename_of(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* A launch failure naming the kernel and the block. */
void block_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void block_fault(const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fl_sim_fault(cudaErrorLaunchFailure, "%s:%d %s, block (%u,%u,%u): %s", basename_of(site.file),
                 site.line, site.kernel, fl_sim_block_idx.x, fl_sim_block_idx.y, fl_sim_block_idx.z,
                 what);
    abandoned = true;
}

void fiber_main(void) {
    body(closure);
    running->state = DONE;
#if FL_SIM_FAST_SWITCH
    void *unused;
    fl_sim_switch(&unused, scheduler); /* never comes back */
    __builtin_unreachable();
#endif
    /* with ucontext, returning resumes uc_link: the scheduler */
}

void suspend(fiber_state why) {
    fiber *self = running;
    self->state = why;
#if FL_SIM_FAST_SWITCH
    fl_sim_switch(&self->sp, scheduler);
#else
    swapcontext(&self->ctx, &scheduler);
#endif
}

/* Make f start at fiber_main when next switched to. */
void fiber_start(fiber &f) {
#if FL_SIM_FAST_SWITCH
    /* The frame fl_sim_switch pops: MXCSR and x87 control word (defaults),
     * six zeroed registers, then the return address fiber_main, entered
     * with the stack aligned as after a call (rsp % 16 == 8). */
    uintptr_t top = ((uintptr_t)f.stack + STACK_BYTES) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                     /* fiber_main's return address: never used */
    *--sp = (uint64_t)(uintptr_t)fiber_main;
    for (int i = 0; i < 6; i++) *--sp = 0;
    *--sp = 0x1F80ull | (0x037Full << 32);
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = &scheduler;
    makecontext(&f.ctx, fiber_main, 0);
#endif
}

void resume(fiber &f) {
    running = &f;
    fl_sim_self = &f.t;
#if FL_SIM_FAST_SWITCH
    fl_sim_switch(&scheduler, f.sp);
#else
    swapcontext(&scheduler, &f.ctx);
#endif
}

const char *state_name(const fiber &f) {
    switch (f.state) {
    case WAIT_BLOCK: return "wait at __syncthreads";
    case WAIT_WARP:
        return f.op == FL_SIM_SHFL ? "wait at a shuffle" : f.op == FL_SIM_BALLOT ? "wait at a ballot"
                                                                                 : "wait at __syncwarp";
    case DONE: return "have returned";
    default: return "are running";
    }
}

/* "threads 0-31 wait at ..., threads 32-63 have returned": runs of equal state. */
void describe_threads(char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < nthreads && used + 80 < size;) {
        int j = i;
        while (j + 1 < nthreads && fibers[j + 1].state == fibers[i].state &&
               (fibers[i].state != WAIT_WARP || fibers[j + 1].op == fibers[i].op))
            j++;
        used += (size_t)snprintf(buf + used, size - used, "%sthreads %d-%d %s", i ? ", " : "", i, j,
                                 state_name(fibers[i]));
        i = j + 1;
    }
}

/* Release warp w's collective if every lane it needs has arrived; false if
 * not yet. A lane named in a mask that has returned is a fault. */
bool try_release_warp(int w) {
    int first = w * 32, last = first + 32 < nthreads ? first + 32 : nthreads;
    unsigned needed = 0, waiting = 0;
    for (int i = first; i < last; i++)
        if (fibers[i].state == WAIT_WARP) {
            needed |= fibers[i].mask;
            waiting |= 1u << (i - first);
        }
    if (!waiting) return false;
    for (int i = first; i < last; i++) {
        unsigned bit = 1u << (i - first);
        if (!(needed & bit) || (waiting & bit)) continue;
        if (fibers[i].state == DONE) {
            block_fault("lane %d of warp %d is named in a warp collective's mask but has returned",
                        i - first, w);
            return true;
        }
        return false; /* still running or at another barrier */
    }
    fl_sim_warp_op op = fibers[first + __builtin_ctz(waiting)].op;
    uint64_t ballot = 0;
    for (int i = first; i < last; i++) {
        if (!(waiting & (1u << (i - first)))) continue;
        if (fibers[i].op != op) {
            block_fault("the lanes of warp %d wait at different warp collectives", w);
            return true;
        }
        if (fibers[i].value) ballot |= 1u << (i - first);
    }
    for (int i = first; i < last; i++) {
        fiber &f = fibers[i];
        if (!(waiting & (1u << (i - first)))) continue;
        if (op == FL_SIM_BALLOT) {
            f.result = ballot & needed;
        } else if (op == FL_SIM_SHFL) {
            if (f.src < 0) {
                f.result = f.value;
            } else {
                int s = first + f.src;
                if (f.src > 31 || s >= last || !(waiting & (1u << f.src))) {
                    block_fault("lane %d of warp %d shuffles from lane %d, which does not take part",
                                i - first, w, f.src);
                    return true;
                }
                f.result = fibers[s].value;
            }
        }
        f.state = READY;
    }
    return true;
}

/* Run one block to completion; false if it faulted. */
bool run_block(void) {
    for (int i = 0; i < nthreads; i++) {
        fiber &f = fibers[i];
        if (!f.stack) {
            f.stack = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (f.stack == MAP_FAILED) {
                f.stack = NULL;
                fl_sim_fault(cudaErrorMemoryAllocation, "cudasim: no memory for a fiber stack");
                return false;
            }
        }
        unsigned x = fl_sim_block_dim.x, y = fl_sim_block_dim.y;
        f.t.idx = make_uint3(i % x, (i / x) % y, i / (x * y));
        f.t.lane = i % 32;
        f.t.warp = i / 32;
        f.state = READY;
        fiber_start(f);
    }
    abandoned = false;
    for (;;) {
        for (int i = 0; i < nthreads && !abandoned; i++) {
            if (fibers[i].state == READY) resume(fibers[i]);
        }
        if (abandoned) return false;
        int live = 0, at_barrier = 0;
        for (int i = 0; i < nthreads; i++) {
            live += fibers[i].state != DONE;
            at_barrier += fibers[i].state == WAIT_BLOCK;
        }
        if (!live) return true;
        bool released = false;
        for (int w = 0; w * 32 < nthreads; w++) released |= try_release_warp(w);
        if (abandoned) return false;
        if (!released && at_barrier == live) {
            for (int i = 0; i < nthreads; i++)
                if (fibers[i].state == WAIT_BLOCK) fibers[i].state = READY;
            released = true;
        }
        if (!released) {
            char what[768];
            describe_threads(what, sizeof what);
            block_fault("the threads can never all meet (this hangs on a GPU): %s", what);
            return false;
        }
    }
}

bool valid_config(const fl_sim_site &where, dim3 grid, dim3 block, size_t smem, const void *kernel) {
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    const char *bad = NULL;
    if (!grid.x || !grid.y || !grid.z || !threads) bad = "a zero grid or block dimension";
    else if (block.x > 1024 || block.y > 1024 || block.z > 64 || threads > MAX_THREADS)
        bad = "more than 1024 threads per block";
    else if (grid.y > 65535 || grid.z > 65535) bad = "a grid y or z dimension above 65535";
    if (bad) {
        fl_sim_launch_error(cudaErrorInvalidConfiguration,
                            "%s:%d %s: invalid launch: %s (grid %u,%u,%u, block %u,%u,%u)",
                            basename_of(where.file), where.line, where.kernel, bad, grid.x, grid.y,
                            grid.z, block.x, block.y, block.z);
        return false;
    }
    size_t limit = fl_sim_smem_limit(kernel);
    if (smem > limit) {
        fl_sim_launch_error(cudaErrorInvalidValue,
                            "%s:%d %s: %zu bytes of dynamic shared memory, the limit is %zu "
                            "(cudaFuncSetAttribute raises it up to 227 KiB)",
                            basename_of(where.file), where.line, where.kernel, smem, limit);
        return false;
    }
    return true;
}

} // namespace

int fl_sim_launch_valid(fl_sim_site where, const void *kernel, dim3 grid, dim3 block, size_t smem) {
    return valid_config(where, grid, block, smem, kernel);
}

void fl_sim_run(fl_sim_site where, dim3 grid, dim3 block, size_t smem, void (*fn)(void *), void *arg) {
    pthread_mutex_lock(&launch_lock);
    if (fl_sim_faulted()) {
        pthread_mutex_unlock(&launch_lock);
        return;
    }
    site = where;
    body = fn;
    closure = arg;
    nthreads = (int)(block.x * block.y * block.z);
    fl_sim_block_dim = block;
    fl_sim_grid_dim = grid;
    if (smem > dynamic_smem_bytes) {
        free(dynamic_smem);
        dynamic_smem = (unsigned char *)aligned_alloc(256, (smem + 255) & ~(size_t)255);
        dynamic_smem_bytes = smem;
    }
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                fl_sim_block_idx = make_uint3(x, y, z);
                /* Shared memory starts undefined on the GPU: poison it so
                 * a kernel reading before writing sees NaNs, not zeros. */
                if (smem) memset(dynamic_smem, 0xff, smem);
                if (!run_block()) goto out;
            }
out:
    fl_sim_self = NULL;
    pthread_mutex_unlock(&launch_lock);
}

void fl_sim_syncthreads(void) { suspend(WAIT_BLOCK); }

unsigned char *fl_sim_dynamic_smem(void) { return dynamic_smem; }

uint64_t fl_sim_warp(fl_sim_warp_op op, unsigned mask, uint64_t value, int src) {
    fiber *self = running;
    self->op = op;
    self->mask = mask;
    self->value = value;
    self->src = src;
    suspend(WAIT_WARP);
    return self->result;
}
