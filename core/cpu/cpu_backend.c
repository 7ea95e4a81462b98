/*
 * cpu_backend.c: the CPU device: aligned host allocation and the element
 * kernels of the tensor core (strided copy with dtype conversion, fill,
 * counter-based random numbers), and its vtable with the kernel tables of
 * the op families (defined in the other files of cpu/).
 */
#include "cpu_iter.h"
#include "cpu_kernels.h"
#include "files.h"
#include "cpu_alloc.h"

#include <omp.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Host memory comes from the caching allocator (cpu_alloc.c). */
static void *cpu_alloc(int index, int64_t nbytes) {
    (void)index;
    return fl_cpu_alloc(nbytes);
}

static void cpu_free(int index, void *ptr, int64_t nbytes) {
    (void)index;
    fl_cpu_free(ptr, nbytes);
}

/* ---- copy --------------------------------------------------------------- */

typedef struct copy_ctx {
    fl_dtype dst_dtype, src_dtype;
} copy_ctx;

static void copy_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                       int64_t index) {
    (void)index;
    const copy_ctx *c = vctx;
    size_t dsize = fl_dtype_size(c->dst_dtype), ssize = fl_dtype_size(c->src_dtype);
    if (inner[0] == 1 && inner[1] == 1) {
        fl_convert(ptrs[0], c->dst_dtype, ptrs[1], c->src_dtype, count);
        return;
    }
    if (c->dst_dtype == c->src_dtype) { /* strided, same type: move elements */
        if (inner[1] == 1) {
            fl_cpu_scatter(ptrs[0], inner[0], ptrs[1], count, dsize);
        } else {
            _Alignas(8) char tmp[FL_CPU_SCRATCH * 8];
            for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
                int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
                fl_cpu_gather(tmp, ptrs[1] + i * inner[1] * (int64_t)ssize, inner[1], n, ssize);
                fl_cpu_scatter(ptrs[0] + i * inner[0] * (int64_t)dsize, inner[0], tmp, n, dsize);
            }
        }
        return;
    }
    /* Strided with conversion: densify, convert, scatter, FL_CPU_SCRATCH at a time. */
    _Alignas(8) char in[FL_CPU_SCRATCH * 8], out[FL_CPU_SCRATCH * 8];
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        const char *s = ptrs[1] + i * inner[1] * (int64_t)ssize;
        char *d = ptrs[0] + i * inner[0] * (int64_t)dsize;
        const void *dense = s;
        if (inner[1] != 1) {
            fl_cpu_gather(in, s, inner[1], n, ssize);
            dense = in;
        }
        if (inner[0] == 1) {
            fl_convert(d, c->dst_dtype, dense, c->src_dtype, n);
        } else {
            fl_convert(out, c->dst_dtype, dense, c->src_dtype, n);
            fl_cpu_scatter(d, inner[0], out, n, dsize);
        }
    }
}

/* A batch of transposed matrices into dense rows: the last two dims (after
 * the iterator merged what it could) have dst's elements along the last
 * and src's along the one before. Such a copy goes block by block
 * (fl_cpu_transpose); element by element, every element would cost a cache
 * line. Returns whether it took the copy. */
static bool copy_transposed(const fl_cpu_iter *it, fl_dtype dtype) {
    int L = it->ndim - 1, P = it->ndim - 2;
    size_t es = fl_dtype_size(dtype);
    if (it->ndim < 2 || it->stride[0][L] != 1 || it->stride[1][P] != 1 || it->numel < 4096 ||
        (es != 2 && es != 4 && es != 8))
        return false;
    int64_t rows = it->shape[P], cols = it->shape[L], batch = it->numel / (rows * cols);
    int64_t ldd = it->stride[0][P], lds = it->stride[1][L];
#pragma omp parallel for schedule(static) if (batch > 1 && it->numel >= (1 << 16))
    for (int64_t b = 0; b < batch; b++) {
        int64_t od = 0, os = 0, rest = b;
        for (int d = P - 1; d >= 0; d--) {
            od += rest % it->shape[d] * it->stride[0][d];
            os += rest % it->shape[d] * it->stride[1][d];
            rest /= it->shape[d];
        }
        fl_cpu_transpose(it->base[0] + od * (int64_t)es, ldd, it->base[1] + os * (int64_t)es, lds,
                         rows, cols, es);
    }
    return true;
}

/* Rows dense on both sides, same dtype, strided between rows (a permuted
 * view whose last dim stayed last: attention's heads moved next to the
 * tokens): one memcpy per row, the rows walked by an odometer rather than
 * located one by one with divisions. The generic loop spent ~100 ns per
 * 64-element row on bookkeeping. Returns whether it took the copy. */
static bool copy_rows(const fl_cpu_iter *it, size_t es) {
    int L = it->ndim - 1;
    if (it->ndim < 2 || it->stride[0][L] != 1 || it->stride[1][L] != 1 || it->numel < 4096)
        return false;
    int64_t inner = it->shape[L], rows = it->numel / inner;
    size_t bytes = (size_t)inner * es;
#pragma omp parallel if (it->numel >= (1 << 16))
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t r = rows * t / nt, end = rows * (t + 1) / nt;
        int64_t idx[FL_MAX_DIMS] = {0}, od = 0, os = 0, rest = r;
        for (int d = L - 1; d >= 0; d--) {
            idx[d] = rest % it->shape[d];
            rest /= it->shape[d];
            od += idx[d] * it->stride[0][d];
            os += idx[d] * it->stride[1][d];
        }
        for (; r < end; r++) {
            memcpy(it->base[0] + od * (int64_t)es, it->base[1] + os * (int64_t)es, bytes);
            for (int d = L - 1; d >= 0; d--) { /* the odometer's next row */
                od += it->stride[0][d];
                os += it->stride[1][d];
                if (++idx[d] < it->shape[d]) break;
                od -= it->shape[d] * it->stride[0][d];
                os -= it->shape[d] * it->stride[1][d];
                idx[d] = 0;
            }
        }
    }
    return true;
}

static int cpu_copy(fl_tensor *dst, const fl_tensor *src) {
    const fl_tensor *ts[2] = {dst, src};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 2, ts);
    if (dst->dtype == src->dtype &&
        (copy_transposed(&it, dst->dtype) || copy_rows(&it, fl_dtype_size(dst->dtype))))
        return FL_OK;
    copy_ctx c = {dst->dtype, src->dtype};
    fl_cpu_iter_run(&it, copy_chunk, &c);
    return FL_OK;
}

/* ---- fill --------------------------------------------------------------- */

typedef struct fill_ctx {
    _Alignas(8) char value[8]; /* one element of the tensor's dtype */
    size_t size;
    bool zero;
} fill_ctx;

static void fill_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                       int64_t index) {
    (void)index;
    const fill_ctx *c = vctx;
    if (c->zero && inner[0] == 1) {
        memset(ptrs[0], 0, (size_t)count * c->size);
        return;
    }
    _Alignas(8) char tmp[FL_CPU_SCRATCH * 8];
    int64_t n = count < FL_CPU_SCRATCH ? count : FL_CPU_SCRATCH;
    for (int64_t i = 0; i < n; i++) memcpy(tmp + (size_t)i * c->size, c->value, c->size);
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t m = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_cpu_scatter(ptrs[0] + i * inner[0] * (int64_t)c->size, inner[0], tmp, m, c->size);
    }
}

static int cpu_fill(fl_tensor *t, double value) {
    fill_ctx c = {.size = fl_dtype_size(t->dtype)};
    fl_store_f64(c.value, t->dtype, value);
    c.zero = true;
    for (size_t i = 0; i < c.size; i++) c.zero &= c.value[i] == 0;
    const fl_tensor *ts[1] = {t};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 1, ts);
    fl_cpu_iter_run(&it, fill_chunk, &c);
    return FL_OK;
}

/* ---- random ------------------------------------------------------------- */

typedef struct random_ctx {
    const fl_random_spec *spec;
    fl_dtype dtype;
} random_ctx;

static void random_chunk(void *vctx, char *const *ptrs, const int64_t *inner, int64_t count,
                         int64_t index) {
    const random_ctx *c = vctx;
    size_t size = fl_dtype_size(c->dtype);
    /* Integers go through int64 so values beyond 2^53 stay exact. */
    bool ints = c->spec->kind == FL_RANDOM_INT;
    fl_dtype via = ints ? FL_I64 : FL_F64;
    _Alignas(8) char values[FL_CPU_SCRATCH * 8], out[FL_CPU_SCRATCH * 8];
    for (int64_t i = 0; i < count; i += FL_CPU_SCRATCH) {
        int64_t n = count - i < FL_CPU_SCRATCH ? count - i : FL_CPU_SCRATCH;
        fl_random_fill(c->spec, (uint64_t)(index + i), n, (double *)values, (int64_t *)values);
        char *d = ptrs[0] + i * inner[0] * (int64_t)size;
        if (inner[0] == 1) {
            fl_convert(d, c->dtype, values, via, n);
        } else {
            fl_convert(out, c->dtype, values, via, n);
            fl_cpu_scatter(d, inner[0], out, n, size);
        }
    }
}

static int cpu_random(fl_tensor *t, const fl_random_spec *spec) {
    random_ctx c = {spec, t->dtype};
    const fl_tensor *ts[1] = {t};
    fl_cpu_iter it;
    fl_cpu_iter_init(&it, 1, ts);
    fl_cpu_iter_run(&it, random_chunk, &c);
    return FL_OK;
}

/* ---- host transfers (the CPU is the host) ------------------------------- */

static int cpu_to_host(int index, void *host_dst, const void *src, int64_t nbytes) {
    (void)index;
    memcpy(host_dst, src, (size_t)nbytes);
    return FL_OK;
}

static int cpu_from_host(int index, void *dst, const void *host_src, int64_t nbytes) {
    (void)index;
    memcpy(dst, host_src, (size_t)nbytes);
    return FL_OK;
}

static int64_t cpu_reserved_bytes(int index) {
    (void)index;
    return fl_cpu_reserved_bytes();
}

static int64_t cpu_empty_cache(int index) {
    (void)index;
    return fl_cpu_empty_cache();
}

/* ---- reserved ranges: pages that come and go ----------------------------------- */

/* A range of at least a huge page is aligned to one and asks for huge
 * pages, as the caching allocator's large blocks do (cpu_alloc.c): a unit's
 * gathered buffer is then a few 2 MiB pages rather than thousands of 4 KiB
 * ones, and giving them back and writing them again at every reshard and
 * unshard ([Note: lazily freed gathered pages]) touches one page-table
 * entry per 2 MiB. Measured on a bf16 small Llama step on one rank: each
 * unshard's cast into 6.4 MB of gathered pages took 1.8 ms on 4 KiB pages
 * and 1.0 with the pages never given back; most of the difference was
 * MADV_FREE and the writes after it, page by page. */
static void *cpu_vm_reserve(int index, int64_t nbytes, int64_t *granted) {
    (void)index;
    int64_t page = sysconf(_SC_PAGESIZE);
    bool huge = nbytes >= FL_CPU_HUGE_PAGE && fl_cpu_huge_pages();
    int64_t unit = huge ? FL_CPU_HUGE_PAGE : page;
    *granted = nbytes > 0 ? (nbytes + unit - 1) / unit * unit : page;
    /* Over-reserve by one huge page, then trim to an aligned range. */
    size_t span = (size_t)*granted + (huge ? FL_CPU_HUGE_PAGE : 0);
    char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return FL_FAIL_NULL(FL_ERR_OOM, "cpu: cannot reserve %lld bytes of address space",
                                             (long long)*granted);
    if (!huge) return p;
    char *base = (char *)(((uintptr_t)p + FL_CPU_HUGE_PAGE - 1) & ~(uintptr_t)(FL_CPU_HUGE_PAGE - 1));
    if (base > p) munmap(p, (size_t)(base - p));
    char *end = base + *granted;
    if (p + span > end) munmap(end, (size_t)(p + span - end));
    /* (advice only: where the kernel refuses, the range keeps small pages) */
    (void)madvise(base, (size_t)*granted, MADV_HUGEPAGE);
    return base;
}

static int cpu_vm_commit(int index, void *base, int64_t nbytes) {
    (void)index;
    return mprotect(base, (size_t)nbytes, PROT_READ | PROT_WRITE) == 0
               ? FL_OK
               : fl_fail(FL_ERR_OOM, "cpu: cannot map %lld bytes of pages", (long long)nbytes);
}

/* [Note: lazily freed gathered pages]
 * A unit's gathered pages are released at every reshard and needed again
 * at the next unshard: FULL_SHARD twice a step per unit. MADV_DONTNEED
 * returns them at once, so every unshard took a page fault and a zeroed
 * page per 4 KiB (a bf16 GPT-2 124M step on one rank spent 86 ms in its
 * gathers, 67 ms with the pages kept; the rest is the f32 -> bf16 cast at
 * the memory's rate). MADV_FREE gives them back lazily instead: the
 * kernel takes them when it needs memory (without writing them anywhere:
 * they hold nothing the run still needs), and otherwise the next unshard
 * finds them in place. Nothing reads what they held: an unshard overwrites
 * the whole buffer. They count in the process's RSS (as LazyFree in
 * /proc/PID/smaps) until taken; FSDP_CPU_LAZY_FREE=0 returns them at once,
 * as kernels before 4.5 (no MADV_FREE) do anyway. Either way the pages are
 * then protected, so a stray use of a resharded unit faults loudly instead
 * of reading stale values or zeros. Both are cheap only on huge pages
 * (cpu_vm_reserve). */
static _Atomic int lazy_free = -1;

static void cpu_vm_decommit(int index, void *base, int64_t nbytes) {
    (void)index;
    if (lazy_free < 0) lazy_free = fl_env_int("FSDP_CPU_LAZY_FREE", 1) != 0;
    if (!lazy_free || madvise(base, (size_t)nbytes, MADV_FREE) != 0)
        madvise(base, (size_t)nbytes, MADV_DONTNEED);
    mprotect(base, (size_t)nbytes, PROT_NONE);
}

static void cpu_vm_unreserve(int index, void *base, int64_t nbytes) {
    (void)index;
    munmap(base, (size_t)nbytes);
}

static int cpu_device_count(void) { return 1; }
static const char *cpu_status(void) { return "cpu"; }

/* Work is done when its call returns: no streams or events (event.c and
 * offload.c see NULL there), and the optimizers run core/optim's host
 * loops (.optim NULL). */
const fl_backend fl_cpu_backend = {
    .abi = FL_BACKEND_ABI,
    .name = "cpu",
    .device_count = cpu_device_count,
    .status = cpu_status,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .random = cpu_random,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
    .reserved_bytes = cpu_reserved_bytes,
    .empty_cache = cpu_empty_cache,
    .vm_reserve = cpu_vm_reserve,
    .vm_commit = cpu_vm_commit,
    .vm_decommit = cpu_vm_decommit,
    .vm_unreserve = cpu_vm_unreserve,
    .binary = &fl_cpu_binary_kernels,
    .elementwise = &fl_cpu_elementwise_kernels,
    .linear = &fl_cpu_linear_kernels,
    .fused = &fl_cpu_fused_kernels,
};
