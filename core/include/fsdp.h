/*
 * fsdp.h: the one public header of the fsdp-lua core.
 *
 * Every exported symbol starts with `fl_` (types, functions) or `FL_` (enum
 * constants). The Lua FFI declarations are generated from this file at build
 * time (preprocessed with -DFL_FFI_CDEF, see mk/cdef.mk) and compiled into
 * the library, so `fl_ffi_cdef()` always describes the binary that is loaded.
 * Rules for this file that keep the generation working:
 *   - constants are enums, never #define (the preprocessor removes macros);
 *   - no function bodies, no attributes outside FL_API, no system types
 *     beyond <stdint.h>/<stddef.h>/<stdbool.h> (LuaJIT knows those).
 *
 * Conventions
 *   - Dimensions and indices are 0-based; a negative dim counts from the end.
 *   - Functions that return a tensor return a NEW reference (refcount owned by
 *     the caller) or NULL on error. Functions that return int return FL_OK (0)
 *     or an fl_status. On error fl_last_error() says what went wrong, naming
 *     the operation and the shapes involved. No user mistake aborts the
 *     process; only broken internal invariants do (with file and line).
 *   - Tensor arguments are borrowed: the callee takes its own reference when
 *     it keeps one.
 */
#ifndef FSDP_H
#define FSDP_H

#ifndef FL_FFI_CDEF
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#define FL_API __attribute__((visibility("default")))
#ifdef __cplusplus
extern "C" {
#endif
#else
#define FL_API
#endif

/* ------------------------------------------------------------------------ */
/* Library                                                                   */
/* ------------------------------------------------------------------------ */

/* Semantic version of the core, e.g. "0.1.0". */
FL_API const char *fl_version(void);
/* One line describing how the core was built: compiler, CUDA, OpenMP. */
FL_API const char *fl_build_info(void);
/* This header, preprocessed for LuaJIT's ffi.cdef (generated at build time). */
FL_API const char *fl_ffi_cdef(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum fl_status {
    FL_OK = 0,
    FL_ERR_ARG = 1,         /* invalid argument: shape, dim, dtype, value */
    FL_ERR_OOM = 2,         /* allocation refused: system or memory limit */
    FL_ERR_DEVICE = 3,      /* device missing or device runtime failure */
    FL_ERR_IO = 4,          /* file system or file format problem */
    FL_ERR_STATE = 5,       /* object in the wrong state (e.g. freed storage) */
    FL_ERR_UNSUPPORTED = 6  /* no kernel for this dtype/device in this build */
} fl_status;

/* Status of the last failed call on this thread (FL_OK if none since clear). */
FL_API fl_status fl_last_status(void);
/* Message of the last failed call on this thread ("" if none). */
FL_API const char *fl_last_error(void);
/* Forget the last error of this thread. */
FL_API void fl_clear_error(void);
/* Set this thread's error (used by bindings to report their own failures). */
FL_API int fl_set_error(fl_status status, const char *message);

/* ------------------------------------------------------------------------ */
/* Data types                                                                */
/* ------------------------------------------------------------------------ */

typedef enum fl_dtype {
    FL_F32 = 0,
    FL_F64 = 1,
    FL_F16 = 2,   /* IEEE 754 binary16 */
    FL_BF16 = 3,  /* bfloat16: the top 16 bits of an f32 */
    FL_I64 = 4,
    FL_I32 = 5,
    FL_I16 = 6,
    FL_I8 = 7,
    FL_U32 = 8,
    FL_U16 = 9,
    FL_U8 = 10,
    FL_BOOL = 11, /* one byte, 0 or 1 */
    FL_DTYPE_COUNT = 12
} fl_dtype;

/* Bytes per element; 0 for an invalid dtype. */
FL_API size_t fl_dtype_size(fl_dtype dtype);
/* Canonical short name ("f32", "bf16", "i64", "bool"); "?" if invalid. */
FL_API const char *fl_dtype_name(fl_dtype dtype);
/* Parse a name or alias ("float32", "half", "bfloat16", "long", "uint8"...).
 * Returns the dtype, or -1 with the error set if the name is unknown. */
FL_API int fl_dtype_parse(const char *name);
/* True for f32, f64, f16, bf16. */
FL_API bool fl_dtype_is_float(fl_dtype dtype);

/* Scalar conversions. f32 -> bf16/f16 round to nearest even; NaN stays NaN
 * (quiet), overflow gives infinity, f16 subnormals are exact. */
FL_API uint16_t fl_f32_to_bf16(float value);
FL_API float fl_bf16_to_f32(uint16_t bits);
FL_API uint16_t fl_f32_to_f16(float value);
FL_API float fl_f16_to_f32(uint16_t bits);

/* Convert n contiguous elements from one dtype to another (src and dst must
 * not overlap). Float to integer truncates toward zero and saturates at the
 * target's range (NaN becomes 0); anything to bool is (x != 0). */
FL_API int fl_convert(void *dst, fl_dtype dst_dtype, const void *src,
                      fl_dtype src_dtype, int64_t n);

/* ------------------------------------------------------------------------ */
/* Devices and memory                                                        */
/* ------------------------------------------------------------------------ */

typedef enum fl_device_kind {
    FL_DEVICE_META = 0, /* shapes only, never any storage */
    FL_DEVICE_CPU = 1,
    FL_DEVICE_CUDA = 2,
    FL_DEVICE_KIND_COUNT = 3
} fl_device_kind;

enum { FL_MAX_DEVICE_INDEX = 63 };

/* A device is kind | index << 8 (e.g. cuda:1 == FL_DEVICE_CUDA | 1 << 8). */
typedef int32_t fl_device;

FL_API fl_device fl_device_make(fl_device_kind kind, int index);
FL_API fl_device_kind fl_device_kind_of(fl_device device);
FL_API int fl_device_index(fl_device device);
/* Parse "cpu", "meta", "cuda", "cuda:1". Returns FL_OK and sets *out. */
FL_API int fl_device_parse(const char *name, fl_device *out);
/* Write the canonical name ("cpu", "meta", "cuda:0") into buf. */
FL_API int fl_device_format(fl_device device, char *buf, size_t size);

/* The backend of a device kind: built in (cpu), or a plugin opened on the
 * first use of the kind (cuda: libfsdp_cuda.so next to libfsdp.so, or
 * FSDP_CUDA_LIBRARY). True when the kind's backend is installed: cpu
 * always, cuda when its plugin file is there (checked without opening it,
 * so asking is cheap). */
FL_API bool fl_backend_installed(fl_device_kind kind);
/* True in the cudasim test build, where the CUDA backend's kernels run on
 * the CPU (tests/cudasim): correct but slow, so tests use smaller sizes. */
FL_API bool fl_backend_simulated(fl_device_kind kind);
/* Number of usable devices of the kind: 1 for cpu; for cuda 0 without a
 * GPU, a driver, or the backend's plugin (opened by this call). */
FL_API int fl_device_count(fl_device_kind kind);
/* Why fl_device_count(kind) is 0 (the plugin is missing or cannot be
 * loaded, and why; no driver; no GPU), or the name of device 0. */
FL_API const char *fl_device_status(fl_device_kind kind);
/* Which path scaled_dot_product_attention took on devices of the kind
 * since the process started: counts[0] forward calls through cuDNN's fused
 * attention, counts[1] forward calls through the flash-style kernels,
 * counts[2] and counts[3] the same for backward (core/cuda/cuda_sdpa.cu;
 * calls with a sliding window or a softcap always take the kernels).
 * Zeros for a kind with one path (cpu) or whose backend is not open. */
FL_API void fl_attention_paths(fl_device_kind kind, int64_t counts[4]);
/* Kernel launches by the backend of the kind since the process started or
 * fl_kernel_launches_reset: counts[0] the launches of the backend's own
 * kernels ([Note: kernel launches counted] in core/cuda/cuda_common.cuh;
 * the kernels cuBLAS, cuDNN and NCCL launch inside a call are not among
 * them); counts[1] the launches the device itself saw where the backend
 * can ask (the simulator of the cudasim build, so a test can compare the
 * two), else -1. Zero and -1 for a kind without kernels (cpu) or whose
 * backend is not open. */
FL_API void fl_kernel_launches(fl_device_kind kind, int64_t counts[2]);
FL_API void fl_kernel_launches_reset(fl_device_kind kind);
/* The version of a library the backend of the kind uses, as the library
 * loaded at run time reports it: "cudnn" gives cudnnGetVersion() (91400
 * for 9.14.0), which decides what cuDNN's attention takes
 * (core/cuda/cuda_sdpa.cu). -1 for a library the backend does not use or
 * a backend that cannot be opened. */
FL_API int64_t fl_device_library_version(fl_device_kind kind, const char *library);

typedef struct fl_memory_stats {
    int64_t in_use;      /* bytes allocated now */
    int64_t peak;        /* high-water mark of in_use since the last reset */
    int64_t allocations; /* allocations since the last reset */
    int64_t frees;       /* frees since the last reset */
    int64_t failures;    /* allocations refused since the last reset */
    int64_t limit;       /* refuse allocations beyond this many bytes; 0 = none */
    int64_t reserved;    /* bytes held from the system, the allocator's cache
                            included (>= in_use) */
} fl_memory_stats;

/* Statistics of the allocator of one device. Meta: the bytes meta and
 * fake tensors stand for (their virtual storage, a view sharing its
 * base's), never allocated: how fsdp.plan traces a step. */
FL_API int fl_memory_stats_get(fl_device device, fl_memory_stats *out);
/* Reset peak to in_use and the counters to 0; in_use and limit stay. */
FL_API int fl_memory_stats_reset(fl_device device);
/* Make allocations that would exceed `bytes` in use fail with FL_ERR_OOM. */
FL_API int fl_memory_set_limit(fl_device device, int64_t bytes);
/* Bytes allocated for storage on all devices since the process started
 * (monotonic): how a garbage-collected binding paces its collections. */
FL_API int64_t fl_memory_allocated_total(void);
/* Return the allocator's cached free blocks to the system; returns the
 * number of bytes released. */
FL_API int64_t fl_memory_empty_cache(fl_device device);
/* The libraries that run the CPU backend's matrix products, in words:
 * "oneDNN 2.6.3 (bf16 products, and f32 ones as x W^T, of ...
 * multiply-adds and more), MKL 2020.0.4 (the other f32 products with B
 * untransposed, ...), OpenBLAS (the rest)", with the reason for each one
 * not used ("OpenBLAS (the rest; MKL: libmkl_rt.so not found ...)")
 * ([Note: GEMM libraries], core/cpu/cpu_gemm.c). The text stays valid
 * until the next call. */
FL_API const char *fl_cpu_gemm_library(void);
/* Choose the libraries: "auto" (oneDNN and MKL where installed, for what
 * each takes; the default), "openblas" (OpenBLAS only, bf16 products
 * converted to f32), "onednn" or "mkl" (that one and OpenBLAS; fails when
 * it cannot be opened, and in the sanitized build). FSDP_CPU_GEMM chooses
 * at start (an unknown value chooses "openblas", and the library text
 * says why). Benchmarks and tests compare them in one process. */
FL_API int fl_cpu_gemm_use(const char *library);
/* The name of the current choice ("auto", "openblas", "onednn", "mkl"). */
FL_API const char *fl_cpu_gemm_chosen(void);
/* The kernels of the CPU backend's attention, in words: "AMX bf16 tiles
 * (bf16 q, k, v with head dims multiples of 32 and no bias), f32 blocks
 * (the rest)", "AVX512-BF16 dot products (...), f32 blocks (the rest; AMX:
 * why not)" or "f32 blocks (why not the others)" ([Note: bf16 attention
 * kernels], core/cpu/cpu_attention_native.c). Valid until the next call. */
FL_API const char *fl_cpu_attention_kernel(void);
/* Run bf16 attention on "amx" tiles or "avx512_bf16" dot products (each
 * fails where the CPU or the kernel does not offer it), on "f32" copies
 * like the rest, or on the best available ("auto", the default);
 * FSDP_CPU_ATTENTION chooses at start. */
FL_API int fl_cpu_attention_use(const char *kernel);

/* The CPU backend's instruction-set levels, lowest first ([Note: CPU ISA
 * levels], core/base/cpu_isa.c): every kernel choice that depends on the
 * CPU (our kernels, oneDNN's, MKL's, OpenBLAS's) stays within the level
 * in force, the CPU's or the lower one FSDP_CPU_ISA names. */
typedef enum fl_cpu_isa {
    FL_CPU_ISA_BASELINE,    /* x86-64 without AVX2 + FMA, or not x86-64 */
    FL_CPU_ISA_AVX2,        /* AVX2 + FMA */
    FL_CPU_ISA_AVX512,      /* AVX-512 F, BW, DQ, VL */
    FL_CPU_ISA_AVX512_BF16, /* ... and AVX512-BF16 dot products */
    FL_CPU_ISA_AMX          /* ... and AMX-BF16 tiles the kernel grants */
} fl_cpu_isa;
/* The level in force, and the CPU's own (decided once per process). */
FL_API fl_cpu_isa fl_cpu_isa_level(void);
FL_API fl_cpu_isa fl_cpu_isa_cpu(void);
/* "baseline", "avx2", "avx512", "avx512_bf16", "amx" (FSDP_CPU_ISA's
 * spellings; "unknown" out of range). */
FL_API const char *fl_cpu_isa_name(fl_cpu_isa isa);
/* FL_OK, or FL_ERR_ARG when FSDP_CPU_ISA names no level or one the CPU
 * cannot run (the CPU's level then stands). */
FL_API int fl_cpu_isa_check(void);
/* Why `isa` is not in force ("FSDP_CPU_ISA=avx2 caps it", "the CPU has no
 * AVX512-BF16"), or NULL when it is. Valid until the thread's next call. */
FL_API const char *fl_cpu_isa_why_not(fl_cpu_isa isa);
/* The level for logs: "avx2 (FSDP_CPU_ISA; the CPU offers avx512_bf16),
 * AMD EPYC". Valid until the thread's next call. */
FL_API const char *fl_cpu_isa_text(void);
/* The loops compiled once per level and run at the one in force ([Note:
 * ISA clones], core/base/cpu_isa_dispatch.h): how many families the
 * library has, and family i's "file.c: function", with the widest level
 * it has a variant for in *widest and, in *ran, the level of the variant
 * it runs in this process (-1 until its first call). NULL when i is out
 * of range. The name is valid until the thread's next call. */
FL_API int fl_cpu_isa_clone_count(void);
FL_API const char *fl_cpu_isa_clone(int i, int *widest, int *ran);
/* The OPENBLAS_CORETYPE that keeps OpenBLAS within the level when its
 * kernels (chosen when it loaded) are above it, or NULL. OpenBLAS reads
 * it only when loaded: the host sets it and executes itself again. */
FL_API const char *fl_cpu_isa_openblas_coretype(void);
/* Whether products on meta count the scratch of a backend that computes
 * 16-bit products in f32 (the CPU backend): what its matmul stages for
 * the same views (the f32 result, bias and operand copies when OpenBLAS
 * runs the product; the f32 bias and bf16 copies of strided operands when
 * oneDNN takes it) raises the meta peak without staying in use. Off by
 * default; fsdp.plan turns it on while it traces for such a device.
 * Returns the previous setting. */
FL_API bool fl_meta_set_f32_gemm(bool on);
/* Bracket a trace on meta tensors (fsdp.plan's): between the two, a meta
 * tensor made before the begin and freed inside stays counted in the meta
 * device's bytes in use until the end ([Note: frees from before a trace],
 * storage.c). Nests; the outermost end lets the held bytes go. */
FL_API void fl_meta_trace_begin(void);
FL_API void fl_meta_trace_end(void);

/* Events and synchronisation (core/tensor/event.c), as torch.cuda.Event:
 * an event recorded on a device marks the work queued there so far and is
 * done once that work has run. On cuda the work is the compute stream's
 * (every kernel and copy; NCCL collectives join it when waited for); on
 * the CPU work runs when called, so an event is done when recorded. A
 * timing event also holds when it was reached (the device's clock on
 * cuda, the host's on the CPU), for fl_event_elapsed_ms. Waiting (event or
 * device synchronize) first settles the collectives the device waits for,
 * so it fails after the collective timeout instead of hanging. Meta
 * devices have no work: events on them are refused. */
typedef struct fl_event fl_event;
FL_API fl_event *fl_event_new(fl_device device, bool timing);
FL_API void fl_event_free(fl_event *e);
FL_API int fl_event_record(fl_event *e);
/* *done: everything before the record has run (true if never recorded). */
FL_API int fl_event_query(fl_event *e, bool *done);
FL_API int fl_event_synchronize(fl_event *e);
/* Milliseconds from start to end, both timing events recorded on one
 * device and done. */
FL_API int fl_event_elapsed_ms(const fl_event *start, const fl_event *end, double *ms);
/* Block until everything queued on the device has run. */
FL_API int fl_device_synchronize(fl_device device);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */
/* ------------------------------------------------------------------------ */

enum { FL_MAX_DIMS = 8 };

/* Flags of fl_tensor.flags. */
enum {
    FL_TENSOR_FAKE = 1,         /* real target device, no storage yet */
    FL_TENSOR_REQUIRES_GRAD = 2 /* gradients flow to (or through) it */
};

typedef struct fl_storage fl_storage;
typedef struct fl_node fl_node;

/* A strided view of a storage. Read the fields freely; change them only
 * through the functions below. A meta tensor (device kind META) or a fake one
 * (FL_TENSOR_FAKE) has storage == NULL and data == NULL, and a `virtual`
 * storage instead: the bytes it would hold, counted in the meta device's
 * memory statistics ([Note: virtual storage] in core/tensor/storage.c). */
typedef struct fl_tensor {
    fl_storage *storage;            /* owned reference, NULL without storage */
    void *data;                     /* address of element [0,...,0] or NULL */
    int64_t shape[FL_MAX_DIMS];
    int64_t stride[FL_MAX_DIMS];    /* in elements, may be 0 (broadcast) */
    int64_t offset;                 /* elements from the start of storage */
    int64_t numel;                  /* product of shape (1 for a 0-d tensor) */
    int32_t refcount;
    fl_device device;
    fl_dtype dtype;
    int32_t ndim;                   /* 0 ... FL_MAX_DIMS */
    uint32_t flags;
    /* autograd (see "Autograd" below) */
    struct fl_tensor *grad;         /* accumulated gradient of a leaf, or NULL */
    fl_node *grad_fn;               /* the op that produced it, or NULL (leaf) */
    int32_t output_index;           /* which output of grad_fn this is */
    fl_storage *virtual_storage;    /* meta and fake tensors: owned reference to
                                       the bytes they stand for, else NULL */
} fl_tensor;

/* Take or drop a reference. Dropping the last frees the tensor and, with its
 * last view, the storage. Both accept NULL. */
FL_API fl_tensor *fl_tensor_retain(fl_tensor *t);
FL_API void fl_tensor_release(fl_tensor *t);
/* Bytes of storage the tensor refers to (0 for meta and fake tensors). */
FL_API int64_t fl_tensor_storage_bytes(const fl_tensor *t);
/* True if t has its own memory (not meta, not fake). */
FL_API bool fl_tensor_has_storage(const fl_tensor *t);
/* True if the elements are laid out densely in row-major order. */
FL_API bool fl_tensor_is_contiguous(const fl_tensor *t);
/* Write "[3, 4]" into buf. */
FL_API int fl_shape_format(int ndim, const int64_t *shape, char *buf, size_t size);

/* --- creation. shape has ndim entries, each >= 0. --- */
FL_API fl_tensor *fl_empty(int ndim, const int64_t *shape, fl_dtype dtype,
                           fl_device device);
/* Like fl_empty but never allocates: the tensor reports `device` and has no
 * storage (for planning at full size on a machine that cannot hold it). */
FL_API fl_tensor *fl_fake(int ndim, const int64_t *shape, fl_dtype dtype,
                          fl_device device);
FL_API fl_tensor *fl_zeros(int ndim, const int64_t *shape, fl_dtype dtype,
                           fl_device device);
FL_API fl_tensor *fl_full(int ndim, const int64_t *shape, double value,
                          fl_dtype dtype, fl_device device);
/* [start, end) by step, as PyTorch: ceil((end - start) / step) elements. */
FL_API fl_tensor *fl_arange(double start, double end, double step,
                            fl_dtype dtype, fl_device device);
/* A tensor holding `n` values read from host memory of dtype src_dtype,
 * converted to dtype (n must equal the product of shape). */
FL_API fl_tensor *fl_from_host(int ndim, const int64_t *shape, fl_dtype dtype,
                               fl_device device, const void *src,
                               fl_dtype src_dtype, int64_t n);

/* --- in place (the trailing underscore marks mutation) --- */
FL_API int fl_fill_(fl_tensor *t, double value);
/* Copy src into dst: same numel, src broadcastable to dst's shape or with
 * the same number of elements laid out the same; converts dtypes and crosses
 * devices. dst may be a strided view. */
FL_API int fl_copy_(fl_tensor *dst, const fl_tensor *src);

/* Counter-based random numbers. Element i of t in row-major order takes the
 * value the generator gives for index (first_index + i) under (seed, stream):
 * any part of a tensor can be generated alone and equals the same part of
 * the whole. The generator is Philox-4x32-10. */
FL_API int fl_uniform_(fl_tensor *t, uint64_t seed, uint64_t stream,
                       uint64_t first_index, double low, double high);
FL_API int fl_normal_(fl_tensor *t, uint64_t seed, uint64_t stream,
                      uint64_t first_index, double mean, double std);
/* Integers uniform in [low, high). */
FL_API int fl_randint_(fl_tensor *t, uint64_t seed, uint64_t stream,
                       uint64_t first_index, int64_t low, int64_t high);
/* The raw generator: 4 words for counter (c0..c3) under key (k0, k1). */
FL_API void fl_philox4x32(const uint32_t counter[4], const uint32_t key[2],
                          uint32_t out[4]);

/* --- copies --- */
/* A contiguous copy (new storage) with the same dtype and device. */
FL_API fl_tensor *fl_clone(const fl_tensor *t);
/* t itself (new reference) if contiguous, else a contiguous clone. */
FL_API fl_tensor *fl_contiguous(const fl_tensor *t);
/* Convert to dtype and move to device; t itself (new reference) if both
 * already match. */
FL_API fl_tensor *fl_to(const fl_tensor *t, fl_dtype dtype, fl_device device);

/* --- pinned host memory and non-blocking copies (core/tensor/pinned.c) ---
 * A pinned tensor is a cpu tensor in page-locked memory (cudaMallocHost,
 * from a caching pool): every CPU op reads it as usual, and copies between
 * it and a cuda device can be queued without blocking the host. Pinning
 * needs a CUDA device: without one these fail with FL_ERR_DEVICE saying so
 * (rather than returning pageable memory under a pinned name). */
/* t itself (new reference) when already pinned, else a pinned copy; cpu
 * tensors only. */
FL_API fl_tensor *fl_pin_memory(const fl_tensor *t);
FL_API bool fl_is_pinned(const fl_tensor *t);
/* An uninitialised pinned cpu tensor. */
FL_API fl_tensor *fl_empty_pinned(int ndim, const int64_t *shape, fl_dtype dtype);
/* fl_copy_ that returns before a host<->cuda transfer has run when it can:
 * the host side pinned, both sides of one dtype, dense (else it is
 * fl_copy_, synchronous, as PyTorch's non_blocking). The copy is queued on
 * the device's compute stream, in order with its kernels. Do not read a
 * pinned destination on the host, nor write a pinned source, before
 * fl_device_synchronize; freeing either is safe at any time. */
FL_API int fl_copy_non_blocking_(fl_tensor *dst, const fl_tensor *src);
/* fl_to with a non-blocking transfer: to the cpu from a cuda device the
 * result is pinned; from the cpu it is non-blocking when t is pinned. */
FL_API fl_tensor *fl_to_non_blocking(const fl_tensor *t, fl_dtype dtype, fl_device device);
/* Bytes of the pinned pool handed out and held from the system. */
FL_API int fl_pinned_stats(int64_t *allocated, int64_t *reserved);
/* Give the pinned pool's free blocks back (returns the bytes). */
FL_API int64_t fl_pinned_empty_cache(void);

/* --- views: share storage with t, never copy --- */
/* New shape with the same numel; one entry may be -1. Fails if the strides
 * cannot express it (use fl_reshape). */
FL_API fl_tensor *fl_view(const fl_tensor *t, int ndim, const int64_t *shape);
/* Like fl_view, but copies when a view is impossible. */
FL_API fl_tensor *fl_reshape(const fl_tensor *t, int ndim,
                             const int64_t *shape);
/* Elements [start, start + length) of dimension dim. */
FL_API fl_tensor *fl_narrow(const fl_tensor *t, int dim, int64_t start,
                            int64_t length);
/* Elements start, start+step, ... below stop (Python slice semantics:
 * negative start/stop count from the end and are clamped; step > 0). */
FL_API fl_tensor *fl_slice(const fl_tensor *t, int dim, int64_t start,
                           int64_t stop, int64_t step);
/* Index `index` of dimension dim, removing that dimension. */
FL_API fl_tensor *fl_select(const fl_tensor *t, int dim, int64_t index);
FL_API fl_tensor *fl_transpose(const fl_tensor *t, int dim0, int dim1);
/* dims is a permutation of 0 ... ndim-1 (negative entries allowed). */
FL_API fl_tensor *fl_permute(const fl_tensor *t, int ndim, const int *dims);
/* Broadcast size-1 dims (and new leading dims) to shape; -1 keeps a size. */
FL_API fl_tensor *fl_expand(const fl_tensor *t, int ndim,
                            const int64_t *shape);
/* Insert a size-1 dimension at dim (dim may equal ndim). */
FL_API fl_tensor *fl_unsqueeze(const fl_tensor *t, int dim);
/* Remove dimension dim, which must have size 1. */
FL_API fl_tensor *fl_squeeze(const fl_tensor *t, int dim);
/* Collapse dims start ... end (inclusive) into one; view when possible. */
FL_API fl_tensor *fl_flatten(const fl_tensor *t, int start_dim, int end_dim);

/* --- element access (for printing and tests; not for compute) --- */
/* Value of the element at `index` (ndim entries) as double / int64. The
 * tensor must have host-readable storage (CPU). */
FL_API int fl_get(const fl_tensor *t, const int64_t *index, double *out);
FL_API int fl_get_i64(const fl_tensor *t, const int64_t *index, int64_t *out);
FL_API int fl_set(fl_tensor *t, const int64_t *index, double value);
/* Copy all elements, in row-major order, to host memory as dst_dtype. */
FL_API int fl_to_host(const fl_tensor *t, void *dst, fl_dtype dst_dtype,
                      int64_t n);


/* ------------------------------------------------------------------------ */
/* Autograd                                                                  */
/* ------------------------------------------------------------------------ */
/* Ops record a node on the tape when grad mode is on and an input requires
 * grad; fl_backward walks the nodes from a scalar loss in reverse creation
 * order and accumulates (+=) into the .grad of leaf tensors that require
 * grad. Backward kernels run with grad mode off (no double backward). The
 * engine can also be stepped: nodes implemented in Lua (activation
 * checkpointing, the sharding layer's boundary hooks) pause it and hand
 * their gradients to the caller, which answers with fl_engine_provide. */

/* Grad mode of this thread (on by default). set returns the previous. */
FL_API bool fl_grad_enabled(void);
FL_API bool fl_set_grad_enabled(bool enabled);
/* Mark a leaf tensor (no grad_fn) as requiring grad; float dtypes only. */
FL_API int fl_requires_grad_(fl_tensor *t, bool requires_grad);
FL_API bool fl_requires_grad(const fl_tensor *t);
/* The accumulated gradient (new reference) or NULL when there is none. */
FL_API fl_tensor *fl_grad(const fl_tensor *t);
/* Replace the gradient (NULL clears it); shape must match. */
FL_API int fl_set_grad(fl_tensor *t, fl_tensor *grad);
/* A view of t's storage outside the graph (no grad_fn, no requires_grad). */
FL_API fl_tensor *fl_detach(const fl_tensor *t);
/* Name of the node that produced t ("MulBackward"), or NULL for a leaf. */
FL_API const char *fl_grad_fn_name(const fl_tensor *t);

/* Backpropagate from roots (usually one scalar loss) with the given output
 * gradients (NULL entries, or grads == NULL, mean ones for a scalar).
 * Fails if a Lua node is reached: use the stepping API for graphs that
 * have them. */
FL_API int fl_backward(int n, fl_tensor *const *roots, fl_tensor *const *grads);

typedef struct fl_engine fl_engine;

enum { FL_ENGINE_DONE = 0, FL_ENGINE_LUA_NODE = 1 };

/* What fl_engine_step stopped for. For a Lua node: its id (given to
 * fl_lua_node_attach) and the gradients of its outputs (borrowed, valid
 * until the next call on the engine; NULL for an output no gradient
 * reached). */
typedef struct fl_engine_event {
    int32_t kind;
    int32_t n_grads;
    int64_t lua_id;
    fl_tensor **grads;
} fl_engine_event;

FL_API fl_engine *fl_engine_start(int n, fl_tensor *const *roots,
                                  fl_tensor *const *grads);
/* Keep the graph's saved tensors after it ran (PyTorch's retain_graph), so
 * a later backward can run through it again; set before the first step.
 * Without it, a second backward through a node that saved tensors fails
 * with "trying to backward through the graph a second time". */
FL_API int fl_engine_retain_graph(fl_engine *e, bool retain);
/* Run C nodes until the graph is done or a Lua node is ready. */
FL_API int fl_engine_step(fl_engine *e, fl_engine_event *event);
/* Gradients for the inputs of the Lua node last returned (NULL entries for
 * inputs that get none). */
FL_API int fl_engine_provide(fl_engine *e, int n, fl_tensor *const *grads);
FL_API void fl_engine_free(fl_engine *e);

/* Spans of the backward nodes the engine runs, for profilers
 * (fsdp.observe.profiler): while recording, each C node's backward is timed
 * on the wall clock (CLOCK_REALTIME in microseconds, the Lua profiler's
 * clock) with its name, the FLOPs it counted, the bytes of the gradients
 * it returned, the shape and dtype of the first, and the memory in use on
 * its device when the node ended (a memory timeline at op granularity,
 * where the allocator's peak can be placed). Spans are kept in a
 * buffer of `capacity` entries; when it is full the newest are counted as
 * dropped, not stored. Recording costs one branch per node when off. */
typedef struct fl_node_span {
    const char *name;     /* the node's type, e.g. "LinearBackward" (static) */
    double start_us, duration_us;
    int64_t flops;
    int64_t bytes;        /* of the gradients it returned */
    fl_dtype dtype;       /* of the first of them (or of nothing: FL_F32) */
    int32_t ndim;
    int64_t shape[FL_MAX_DIMS];
    fl_device device;     /* of the first gradient (cpu when none) */
    int64_t in_use;       /* bytes in use on that device when the node ended */
    /* A node whose incoming gradient lives on a device with a queue (cuda):
     * timing events recorded there before and after its backward, for its
     * time on the device (fl_event_elapsed_ms once done); the taker frees
     * them (fl_event_free). NULL on the CPU. */
    fl_event *device_start, *device_end;
} fl_node_span;
/* Start recording into a buffer of capacity spans (> 0), or stop and free
 * it (0). Spans not yet taken are dropped (their events freed). */
FL_API int fl_engine_record_spans(int capacity);
/* Move up to max of the recorded spans, oldest first, into out; returns
 * how many. *dropped (if not NULL) gets the spans lost to a full buffer
 * since the last call. */
FL_API int fl_engine_take_spans(fl_node_span *out, int max, int64_t *dropped);

/* Activation offload (core/autograd/offload.c). While a scope is open on
 * this thread, tensors that ops save for backward and that live on a cuda
 * device are copied to pinned host memory (queued, non-blocking) and kept
 * there; the engine copies them back just before the backward that reads
 * them. Never offloaded: leaves that require grad (parameters) and views
 * of them, a sharded unit's gathered parameters, cpu tensors. A storage
 * view saved by several nodes in one scope is copied once. Scopes nest;
 * the outermost one's end forgets what was shared. */
FL_API int fl_offload_begin(void);
/* Fails (FL_ERR_STATE) when no scope is open. */
FL_API int fl_offload_end(void);
FL_API int fl_offload_depth(void);

typedef struct fl_offload_stats {
    int64_t saved;          /* saved tensors held on the host */
    int64_t copies;         /* device -> host copies made (one per shared view) */
    int64_t bytes;          /* bytes of those copies */
    int64_t shared;         /* saves that reused a copy of the same view */
    int64_t kept;           /* saves in a scope left where they were */
    int64_t kept_params;    /* ... of which parameters (or views of them) */
    int64_t restores;       /* host -> device copies made */
    int64_t restored_bytes;
    int64_t failed;         /* copies that could not be made (kept on device) */
    int64_t pinned_allocated; /* bytes of the pinned pool in use now */
    int64_t pinned_reserved;  /* bytes it holds from the system */
    int64_t prefetched;     /* restores started ahead on the copy stream (FSDP_OFFLOAD_PREFETCH) */
} fl_offload_stats;

FL_API void fl_offload_stats_get(fl_offload_stats *out);
/* Counters to 0 (the pinned pool's figures are not counters). */
FL_API void fl_offload_stats_reset(void);

/* A tensor moved to host memory outside a node (activation checkpointing
 * keeps its inputs this way inside a scope). */
typedef struct fl_packed fl_packed;
/* *out = a packed copy of t when a scope is open and t would be offloaded,
 * else NULL (keep t). */
FL_API int fl_offload_pack(const fl_tensor *t, fl_packed **out);
/* The tensor back on its device (new reference; the first call copies). */
FL_API fl_tensor *fl_offload_unpack(fl_packed *p);
FL_API void fl_packed_release(fl_packed *p);

/* Make `outputs` (tensors without grad_fn, e.g. fresh detach()es) the
 * outputs of a node whose backward runs in Lua, with `inputs` as the
 * tensors its gradients flow to. No-op when grad mode is off or no input
 * requires grad. */
FL_API int fl_lua_node_attach(int64_t lua_id, const char *name, int n_inputs,
                              fl_tensor *const *inputs, int n_outputs,
                              fl_tensor *const *outputs);
/* Ids of Lua nodes freed since the last call (graphs dropped without
 * backward), so the Lua side can forget their handlers. Returns the count
 * written (at most max). */
FL_API int fl_lua_nodes_released(int64_t *ids, int max);

/* FLOPs counted by ops since the last reset (on every device, meta too).
 * The count saturates at INT64_MAX (huge meta models) and stays there. */
FL_API int64_t fl_flops(void);
FL_API void fl_flops_reset(void);
/* Set the count, returning the one it replaces: a measurement (fsdp.plan's
 * trace) counts from zero, so a count saturated by earlier work cannot
 * hide its FLOPs, and adds its own back (fl_flops_add) when done. */
FL_API int64_t fl_flops_exchange(int64_t count);
/* Add n to the count, saturating. */
FL_API void fl_flops_add(int64_t n);

/* Bytes that memory-bound ops read and write since the last reset (every
 * op but matmul, linear, conv2d and attention; each operand counted once,
 * on every device, meta too; saturating): the cost model of the kernels
 * that bandwidth bounds, as fl_flops is the GEMMs'. core/tensor/bytes_moved.c. */
FL_API int64_t fl_bytes_moved(void);
FL_API void fl_bytes_moved_reset(void);
/* The count per op: up to max entries of (op name, calls, bytes) in the
 * order ops first counted; returns how many were written. */
FL_API int fl_bytes_moved_by_op(int max, const char **names, int64_t *calls, int64_t *bytes);
/* Add bytes under an op name (a string that lives as long as the process). */
FL_API void fl_bytes_moved_add(const char *op, int64_t bytes);

/* ------------------------------------------------------------------------ */
/* Ops                                                                       */
/* ------------------------------------------------------------------------ */
/* Every op: shape inference shared by all devices (on meta it returns a
 * correctly shaped tensor, allocates nothing and still counts FLOPs), a
 * kernel per backend, and a backward node when grad is needed. Inputs
 * broadcast with numpy rules where the op says so. */

/* ---- ops: elementwise binary and scalar (core/ops/binary.c) ---- */
typedef enum fl_binary_op {
    FL_ADD = 0, FL_SUB = 1, FL_MUL = 2, FL_DIV = 3, FL_BINARY_OP_COUNT = 4
} fl_binary_op;
/* a op b with broadcasting; the result dtype is the promotion of both
 * (float over int, wider over narrower; f16 with bf16 gives f32). */
FL_API fl_tensor *fl_binary(fl_binary_op op, const fl_tensor *a,
                            const fl_tensor *b);
/* a op s (reverse: s op a) for a scalar s, in a's dtype. */
FL_API fl_tensor *fl_binary_scalar(fl_binary_op op, const fl_tensor *a,
                                   double s, bool reverse);
/* In place: a = a op b (b broadcasts to a). Not recorded for autograd: a
 * tensor that requires grad cannot be updated in place with grad mode on. */
FL_API int fl_binary_(fl_binary_op op, fl_tensor *a, const fl_tensor *b);
/* a += alpha * b (b broadcasts to a), the accumulation of gradients and
 * optimizers; not recorded. */
FL_API int fl_add_scaled_(fl_tensor *a, const fl_tensor *b, double alpha);
/* Sum t down to `shape` (t's shape with leading dims dropped and some dims
 * reduced to 1), undoing a broadcast: PyTorch's sum_to_size. */
FL_API fl_tensor *fl_sum_to(const fl_tensor *t, int ndim, const int64_t *shape);

/* ---- ops: unary, activations, reductions, dropout (core/ops/unary.c, reduce.c) ---- */
/* Elementwise functions of one tensor. The output is a new contiguous tensor
 * of x's shape. Floats keep their dtype (f32 arithmetic for bf16/f16, f64
 * for f64); integer and bool inputs give f32, except abs, relu and square,
 * which keep an integer dtype (and refuse bool). Gradients follow PyTorch,
 * subgradients included: relu' = (x > 0), abs' = sign(x) (0 at 0). */
typedef enum fl_unary_op {
    FL_EXP = 0,
    FL_LOG = 1,
    FL_SQRT = 2,
    FL_RSQRT = 3,       /* 1 / sqrt(x) */
    FL_TANH = 4,
    FL_SIGMOID = 5,
    FL_ABS = 6,
    FL_RELU = 7,
    FL_GELU = 8,        /* x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
    FL_GELU_TANH = 9,   /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))):
                         * PyTorch's approximate='tanh', HF's gelu_new */
    FL_SILU = 10,       /* x * sigmoid(x) */
    FL_SQUARE = 11,
    FL_UNARY_OP_COUNT = 12
} fl_unary_op;
FL_API fl_tensor *fl_unary(fl_unary_op op, const fl_tensor *x);
/* x ^ exponent (float result; d/dx = exponent * x^(exponent - 1)). */
FL_API fl_tensor *fl_pow_scalar(const fl_tensor *x, double exponent);
/* min(max(x, lo), hi); a bound is ignored when its has_ flag is false (a
 * lo above hi gives hi everywhere, a NaN element stays NaN, a NaN bound is
 * refused). The gradient passes where lo <= x <= hi, boundaries included,
 * as in PyTorch. Integer tensors stay integer when the bounds are integral. */
FL_API fl_tensor *fl_clamp(const fl_tensor *x, double lo, double hi, bool has_lo, bool has_hi);
/* silu(gate) * up in one pass (the SwiGLU of Llama's MLP): same shapes and
 * float dtype. */
FL_API fl_tensor *fl_silu_mul(const fl_tensor *gate, const fl_tensor *up);

/* Mixture of experts as transformers 5's Mixtral and Qwen3-MoE blocks
 * compute it (core/ops/moe.c). fl_moe_route: logits [N, E] -> the top_k
 * experts of softmax(logits) (computed in f32; f64 for f64) per row,
 * descending, ties to the lower expert: *weights [N, top_k] (f32, f64 for
 * f64 logits; renormalised to sum 1 when `normalize`), differentiable in
 * the logits, and *ids [N, top_k] i64. fl_moe_experts: x [..., h] (N
 * tokens), weights [N, k] (any float dtype), ids [N, k] (i64/i32 in
 * [0, E)), gate_up_proj [E, 2ff, h] (gate rows first), down_proj [E, h, ff]
 * in x's dtype -> y (x's shape and dtype), y[n] = sum_j weights[n, j] *
 * down_e(silu(gate_e x[n]) * up_e x[n]) with e = ids[n, j]; the tokens are
 * sorted by expert and each expert's rows go through one product per
 * projection. Differentiable in x, weights, gate_up_proj and down_proj. */
FL_API int fl_moe_route(const fl_tensor *logits, int64_t top_k, bool normalize,
                        fl_tensor **weights, fl_tensor **ids);
FL_API fl_tensor *fl_moe_experts(const fl_tensor *x, const fl_tensor *weights,
                                 const fl_tensor *ids, const fl_tensor *gate_up_proj,
                                 const fl_tensor *down_proj);

/* Inverted dropout with a counter-based mask: element i (row-major) is kept
 * iff u_i >= p, where u_i is the value fl_uniform_(t, seed, stream, offset,
 * 0, 1) would give element i, and kept elements are scaled by 1/(1 - p).
 * The mask is not stored: backward regenerates it from the key. p = 0
 * returns x itself (a new reference); p = 1 gives zeros. Float tensors. */
FL_API fl_tensor *fl_dropout(const fl_tensor *x, double p, uint64_t seed, uint64_t stream,
                             uint64_t offset);

/* Sum or mean over the dims listed (ndims == 0: over all dims; negative
 * dims count from the end; a dim may not repeat). keepdim leaves the
 * reduced dims with size 1. Floats are accumulated in f64 and the result
 * keeps x's dtype; integers and bool sum exactly in i64 and give i64; mean
 * needs a float tensor (mean of no elements is NaN). The result does not
 * depend on the number of threads. */
FL_API fl_tensor *fl_sum(const fl_tensor *x, int ndims, const int *dims, bool keepdim);
FL_API fl_tensor *fl_mean(const fl_tensor *x, int ndims, const int *dims, bool keepdim);
/* Variance over dims: sum((x - mean)^2) / max(0, N - correction)
 * (correction 1: the unbiased estimate, PyTorch's default); std is its
 * square root. Float tensors. */
FL_API fl_tensor *fl_var(const fl_tensor *x, int ndims, const int *dims, int64_t correction,
                         bool keepdim);
FL_API fl_tensor *fl_std(const fl_tensor *x, int ndims, const int *dims, int64_t correction,
                         bool keepdim);
/* Largest (smallest) values along dim and their indices (i64): the first
 * index on ties, NaN counted as larger (smaller) than any number, so a NaN
 * propagates as in PyTorch. The gradient goes to the chosen positions.
 * *values and *indices receive new references. */
FL_API int fl_max_dim(const fl_tensor *x, int dim, bool keepdim, fl_tensor **values,
                      fl_tensor **indices);
FL_API int fl_min_dim(const fl_tensor *x, int dim, bool keepdim, fl_tensor **values,
                      fl_tensor **indices);

/* Comparisons with broadcasting, giving bool tensors; not differentiable.
 * Values compare exactly (integers as i64, anything with a float as f64). */
typedef enum fl_compare_op {
    FL_EQ = 0, FL_NE = 1, FL_LT = 2, FL_LE = 3, FL_GT = 4, FL_GE = 5, FL_COMPARE_OP_COUNT = 6
} fl_compare_op;
FL_API fl_tensor *fl_compare(fl_compare_op op, const fl_tensor *a, const fl_tensor *b);
/* a op s for a scalar s. */
FL_API fl_tensor *fl_compare_scalar(fl_compare_op op, const fl_tensor *a, double s);
/* cond ? a : b elementwise; cond is bool; all three broadcast together and
 * the result dtype is the promotion of a and b (as fl_binary). Gradients
 * flow to a where cond holds and to b elsewhere. */
FL_API fl_tensor *fl_where(const fl_tensor *cond, const fl_tensor *a, const fl_tensor *b);

/* ---- ops: matmul, linear, embedding, conv2d, pooling, cat/split (core/ops/) ---- */
/* Float operands of one dtype (f32, f64, bf16, f16); bf16/f16 products are
 * computed in f32 and rounded once to the input dtype. FLOPs: 2*m*n*k per
 * matrix product (plus one per bias element added); backward counts its own
 * products. Operands that are transposed contiguous views are used in place
 * (BLAS transposition), never copied. */

/* torch.matmul: 1-d @ 1-d is a dot product (0-d result); 2-d @ 2-d a matrix
 * product; a 1-d operand gets a dim of 1 prepended (left) or appended
 * (right) that is removed from the result; beyond 2-d, [..., m, k] @
 * [..., k, n] with the batch dims broadcast. */
FL_API fl_tensor *fl_matmul(const fl_tensor *a, const fl_tensor *b);
/* y = x @ w^T + bias: x [..., in], w [out, in], bias [out] or NULL ->
 * [..., out]; one product over all rows of x. */
FL_API fl_tensor *fl_linear(const fl_tensor *x, const fl_tensor *w, const fl_tensor *bias);
/* Rows of w [V, D] picked by ids (i64 or i32, any shape) -> [..., D]. An id
 * outside [0, V) is an error (nothing is written). Rows whose id equals
 * padding_idx (in [0, V); -1 for none) get no gradient. */
FL_API fl_tensor *fl_embedding(const fl_tensor *ids, const fl_tensor *w, int64_t padding_idx);

/* Geometry of a 2-d window op, per spatial dim (height, width). */
typedef struct fl_conv2d_options {
    int64_t stride[2];   /* >= 1 */
    int64_t padding[2];  /* >= 0, zeros on both sides */
    int64_t dilation[2]; /* >= 1 */
} fl_conv2d_options;
/* Convolution (cross-correlation, as PyTorch) of x [N, C, H, W] with w [O,
 * C, kh, kw] plus bias [O] (or NULL) -> [N, O, Ho, Wo], Ho = (H + 2*ph -
 * dh*(kh-1) - 1) / sh + 1. im2col + GEMM. opts NULL means stride 1, no
 * padding, dilation 1. */
FL_API fl_tensor *fl_conv2d(const fl_tensor *x, const fl_tensor *w, const fl_tensor *bias,
                            const fl_conv2d_options *opts);
/* Max over kh x kw windows of each plane of x [N, C, H, W] (or [C, H, W]);
 * padding counts as -infinity. When `indices` is not NULL it receives a new
 * i64 tensor of the output's shape holding, for each output, the flat index
 * (h * W + w) of the chosen input in its plane (PyTorch's return_indices).
 * opts NULL means stride = kernel, no padding, dilation 1; padding may be at
 * most half the (dilated) kernel. FLOPs: one comparison per window element. */
FL_API fl_tensor *fl_max_pool2d(const fl_tensor *x, int64_t kh, int64_t kw,
                                const fl_conv2d_options *opts, fl_tensor **indices);

/* The tensors (n >= 1, same dtype, device and ndim, equal sizes except in
 * dim) joined along dim into a new tensor. */
FL_API fl_tensor *fl_cat(int n, const fl_tensor *const *tensors, int dim);

/* ---- ops: norms, softmax, cross-entropy, rotary, attention (core/ops/) ---- */
/* Fused kernels: one pass over the input forward, one or two backward.
 * Inputs may be strided; math is f32 for f32/f16/bf16 and f64 for f64;
 * results come back in the input's dtype. FLOP conventions are in each
 * op's file (core/ops/norm.c, softmax.c, cross_entropy.c, rotary.c,
 * attention.c). */

/* RMSNorm over the last dim with Llama's semantics (T5LayerNorm is the
 * same with eps 1e-6): y = weight * to(x.dtype, x32 * rsqrt(mean(x32^2) +
 * eps)), normalised in f32 and rounded to x's dtype BEFORE the weight
 * multiply. weight: NULL or [x.shape[-1]]. Result dtype: x's (the
 * promotion of x's and weight's when they differ, as weight * x). */
FL_API fl_tensor *fl_rms_norm(const fl_tensor *x, const fl_tensor *weight, double eps);
/* A residual add and the RMSNorm that follows it, in one kernel each way
 * (core/ops/norm.c): *h = x + a (x's dtype, rounded as fl_add rounds) and
 * *y = fl_rms_norm(*h, weight, eps), the same bits as the two ops. x and a
 * of one shape and float dtype. Backward: one gradient for h, the sum of
 * h's own and the norm's, delivered to both x and a as an add's is. */
FL_API int fl_add_rms_norm(const fl_tensor *x, const fl_tensor *a, const fl_tensor *weight,
                           double eps, fl_tensor **h, fl_tensor **y);
/* LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * weight +
 * bias with the biased variance; weight and bias NULL or [x.shape[-1]]. */
FL_API fl_tensor *fl_layer_norm(const fl_tensor *x, const fl_tensor *weight,
                                const fl_tensor *bias, double eps);
/* Softmax and log-softmax along dim (stable: the max is subtracted). */
FL_API fl_tensor *fl_softmax(const fl_tensor *x, int dim);
FL_API fl_tensor *fl_log_softmax(const fl_tensor *x, int dim);

typedef enum fl_loss_reduction {
    FL_LOSS_NONE = 0, /* one loss per target (0 where ignored) */
    FL_LOSS_MEAN = 1, /* sum / number of non-ignored targets (nan if none, as PyTorch) */
    FL_LOSS_SUM = 2
} fl_loss_reduction;

/* Cross-entropy fused with log-softmax: logits [..., C] (classes on the
 * LAST dim), targets [...] i64 or i32 class indices; targets equal to
 * ignore_index (PyTorch: -100) contribute nothing; any other target
 * outside [0, C) is an error naming it. label_smoothing in [0, 1]. The
 * result is 0-d for mean/sum, the targets' shape for none, in the compute
 * dtype (f32 for bf16/f16 logits, as transformers' upcast; no f32 copy of
 * the logits is made); the gradient to the logits is in their dtype.
 * Saves only the per-row logsumexp for backward. */
FL_API fl_tensor *fl_cross_entropy(const fl_tensor *logits, const fl_tensor *targets,
                                   int64_t ignore_index, fl_loss_reduction reduction,
                                   double label_smoothing);
/* A language model's head and cross-entropy in one op, over chunks of rows:
 * the loss of logits = h @ w^T (h [N, D], w [V, D], one float dtype) against
 * targets [N], without the [N, V] logits or their gradient ever whole
 * ([Note: the fused head and loss] in core/ops/linear_cross_entropy.c).
 * reduction mean or sum; ignore_index, label_smoothing and the result's
 * dtype as fl_cross_entropy. With grad, the gradients to h and w are
 * computed here, chunk by chunk, and the backward only scales them.
 * chunk_rows <= 0: rows such that a chunk's logits are about 256 MB. */
FL_API fl_tensor *fl_linear_cross_entropy(const fl_tensor *h, const fl_tensor *w,
                                          const fl_tensor *targets, int64_t ignore_index,
                                          fl_loss_reduction reduction, double label_smoothing,
                                          int64_t chunk_rows);
/* The rows per chunk fl_linear_cross_entropy takes for a vocabulary of
 * `vocab` in `dtype` and a requested chunk_rows (<= 0: automatic). */
FL_API int64_t fl_linear_cross_entropy_chunk_rows(int64_t vocab, fl_dtype dtype, int64_t chunk_rows);
/* Negative log-likelihood of log-probabilities [..., C] (e.g. the output of
 * fl_log_softmax) at targets [...]: -log_probs[..., target]; reductions and
 * ignore_index as fl_cross_entropy. */
FL_API fl_tensor *fl_nll_loss(const fl_tensor *log_probs, const fl_tensor *targets,
                              int64_t ignore_index, fl_loss_reduction reduction);

/* Rotary position embeddings, Hugging Face's convention (rotate_half over
 * the two halves of the head dim). The scalings are transformers' rope
 * types (modeling_rope_utils.py), computed as it computes them. */
typedef enum fl_rope_scaling {
    FL_ROPE_DEFAULT = 0,  /* inv_freq = 1 / theta^(2i/D) */
    FL_ROPE_LLAMA3 = 1,   /* Llama 3.1's frequency scaling (transformers' "llama3") */
    FL_ROPE_LINEAR = 2,   /* inv_freq / factor */
    FL_ROPE_DYNAMIC = 3,  /* dynamic NTK: theta grows with context_len past max_position_embeddings */
    FL_ROPE_YARN = 4,     /* YaRN: a ramp between interpolated and extrapolated frequencies */
    FL_ROPE_LONGROPE = 5  /* LongRoPE: per-frequency factors, short or long by context_len */
} fl_rope_scaling;
typedef struct fl_rope_options {
    double theta;             /* base: 1e4 (Llama 2), 5e5 (Llama 3) */
    int32_t scaling;          /* fl_rope_scaling */
    double factor;            /* llama3: 8 (3.1), 32 (3.2); linear, dynamic, yarn, longrope
                                 (yarn, longrope: 0 = max_position_embeddings / original) */
    double low_freq_factor;   /* llama3: 1 */
    double high_freq_factor;  /* llama3: 4 */
    double original_max_position_embeddings; /* llama3: 8192; yarn, longrope */
    /* (fields below: zero means transformers' default) */
    double max_position_embeddings; /* dynamic; yarn and longrope when factor is 0 */
    double context_len;       /* dynamic, longrope: the sequence length the frequencies serve (the
                                 forward's largest position + 1); 0 = the table's seq_len */
    double attention_factor;  /* yarn, longrope: multiplies cos and sin; 0 = derived from factor */
    double beta_fast;         /* yarn: 32 */
    double beta_slow;         /* yarn: 1 */
    double mscale;            /* yarn: with mscale_all_dim, derives attention_factor */
    double mscale_all_dim;
    int32_t no_truncate;      /* yarn: 1 = transformers' truncate: false (no floor/ceil) */
    int64_t n_factors;        /* longrope: entries of short_factor and long_factor (head_dim / 2) */
    const double *short_factor; /* longrope: used while context_len <= original_max_position_embeddings */
    const double *long_factor;  /* longrope: used past it */
} fl_rope_options;
/* cos and sin tables [seq_len, head_dim] for positions 0 ... seq_len-1,
 * built as transformers builds them (f32 arithmetic, cat(freqs, freqs),
 * times the attention factor of yarn and longrope), then converted to
 * dtype on device (meta: shapes only). opts NULL means theta 1e4 without
 * scaling. Partial rotary (partial_rotary_factor) is the caller's: pass
 * the rotary dim int(head_dim * factor) as head_dim. New references in
 * *cos and *sin. */
FL_API int fl_rope_tables(int64_t seq_len, int64_t head_dim, const fl_rope_options *opts,
                          fl_dtype dtype, fl_device device, fl_tensor **cos, fl_tensor **sin);
/* x * cos + rotate_half(x) * sin for x [..., T, D] (e.g. [B, H, T, D]).
 * cos, sin: [P, D] tables; row t of the tables serves position t, or
 * positions[t] when positions (i64/i32, [T] or [x.shape[0], T]) is given.
 * Gradients flow to x only (the tables are constants). */
FL_API fl_tensor *fl_apply_rotary(const fl_tensor *x, const fl_tensor *cos, const fl_tensor *sin,
                                  const fl_tensor *positions);

/* How fl_attention masks and scales the scores. causal: key j is hidden
 * from query i when j > i (PyTorch's is_causal, aligned top-left). scale
 * multiplies q k^T (PyTorch's default is 1/sqrt(D); T5 uses 1; Gemma 2
 * query_pre_attn_scalar^-0.5). window > 0, only with causal: query i sees
 * keys i - window < j <= i, the last `window` tokens including itself
 * (Mistral's and Gemma's sliding window; 0 = none). softcap > 0: scores
 * become softcap * tanh(scores / softcap) before the bias and the masks
 * (Gemma 2's attention logit softcapping; 0 = none). segments (NULL =
 * none; only with causal and Tq == Tk): packed sequences, an i64 or i32
 * [B, T] tensor on q's device of document ids, each maximal run of equal
 * ids one document, negative ids padding: key j is visible from query i
 * only when both lie in one run (block-diagonal causal attention); a
 * padding query sees nothing (zeros out, zero gradients) and a padding
 * key is seen by nothing ([Note: packed sequences], core/ops/attention.c).
 * None of them materialises a [Tq, Tk] mask. */
typedef struct fl_attention_options {
    bool causal;
    double scale;
    int64_t window;
    double softcap;
    const fl_tensor *segments;
} fl_attention_options;

/* softmax(softcap(scale * q @ k^T) + bias, masks) @ v, flash-attention
 * style (query blocks; saves only q, k, v, the output and the per-row
 * logsumexp). q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] ->
 * [B, Hq, Tq, Dv]; Hq a multiple of Hkv (grouped-query attention: head h
 * reads kv head h / (Hq / Hkv)). bias: NULL or additive, broadcastable to
 * [B, Hq, Tq, Tk] (T5's relative position bias, or 0/-inf masks), and it
 * gets a gradient when it requires one. opts: fl_attention_options (NULL
 * is not accepted: scale has no default here). A query row with every key
 * masked gives zeros. */
FL_API fl_tensor *fl_attention(const fl_tensor *q, const fl_tensor *k, const fl_tensor *v,
                               const fl_tensor *bias, const fl_attention_options *opts);
/* fl_attention with {causal, scale} and no window or softcap. */
FL_API fl_tensor *fl_scaled_dot_product_attention(const fl_tensor *q, const fl_tensor *k,
                                                  const fl_tensor *v, const fl_tensor *bias,
                                                  bool causal, double scale);

/* ------------------------------------------------------------------------ */
/* Files: safetensors                                                        */
/* ------------------------------------------------------------------------ */
/* The format: 8 bytes little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 * "__metadata__": {"k": "v"}}), then the data; offsets are relative to the
 * end of the header. Reading maps the file and validates every entry before
 * any tensor is made: a truncated or hostile file gives an error naming the
 * file, the tensor and the problem, never an out-of-bounds read. */

typedef struct fl_safetensors fl_safetensors;

/* Open and validate a file. Tensors taken from it keep the mapping alive,
 * so fl_safetensors_close may come before they are released. */
FL_API fl_safetensors *fl_safetensors_open(const char *path);
FL_API void fl_safetensors_close(fl_safetensors *f);
/* Number of tensors, and the name of the i-th (in file data order). */
FL_API int fl_safetensors_count(const fl_safetensors *f);
FL_API const char *fl_safetensors_name(const fl_safetensors *f, int i);
/* Index of a tensor by name, or -1 (no error set). */
FL_API int fl_safetensors_find(const fl_safetensors *f, const char *name);
/* Shape and dtype of the i-th tensor without reading it. */
FL_API int fl_safetensors_info(const fl_safetensors *f, int i, fl_dtype *dtype, int *ndim,
                               int64_t *shape);
/* The i-th tensor as a CPU tensor over the mapped file (a copy when the
 * data is not aligned for its dtype). Read-only by convention. */
FL_API fl_tensor *fl_safetensors_get(fl_safetensors *f, int i);
/* A value of "__metadata__", or NULL. Number of keys and the k-th key. */
FL_API const char *fl_safetensors_metadata(const fl_safetensors *f, const char *key);
FL_API int fl_safetensors_metadata_count(const fl_safetensors *f);
FL_API const char *fl_safetensors_metadata_key(const fl_safetensors *f, int k);

/* Streaming writer: declare every tensor (name, dtype, shape) and the
 * metadata, then write the tensors' data one at a time in declaration
 * order (so a caller can gather and write one unit's parameters at a time),
 * then finish. The file appears atomically at finish (temporary file,
 * fsync, rename); abort or a failure leaves any previous file untouched. */
typedef struct fl_safetensors_writer fl_safetensors_writer;

FL_API fl_safetensors_writer *fl_safetensors_writer_new(const char *path);
FL_API int fl_safetensors_writer_declare(fl_safetensors_writer *w, const char *name,
                                         fl_dtype dtype, int ndim, const int64_t *shape);
FL_API int fl_safetensors_writer_metadata(fl_safetensors_writer *w, const char *key,
                                          const char *value);
/* Write the next declared tensor's data (any device, layout; must match
 * the declared shape and dtype). The header is written before the first. */
FL_API int fl_safetensors_writer_write(fl_safetensors_writer *w, const fl_tensor *t);
FL_API int fl_safetensors_writer_finish(fl_safetensors_writer *w);
/* Discard the temporary file and free the writer (also after finish). */
FL_API void fl_safetensors_writer_free(fl_safetensors_writer *w);

/* Publish a small file atomically (index.json, markers): write `len`
 * bytes to "<path>.tmp.<pid>" in the same directory, fsync, rename over
 * `path`, fsync the directory. On failure the temporary file is removed
 * and any previous file at `path` is untouched. (core/io/atomic_file.c) */
FL_API int fl_file_write_atomic(const char *path, const void *data, size_t len);
/* fsync a file or directory by path (after creating or removing entries
 * in a directory, so the change survives a crash). */
FL_API int fl_fsync_path(const char *path);
/* rename(2), then fsync the directories involved, so the rename survives
 * a crash. */
FL_API int fl_rename_durable(const char *from, const char *to);
/* Swap two existing paths in one atomic step (Linux renameat2 with
 * RENAME_EXCHANGE; both must be on one file system), then fsync their
 * directories: at no moment is either missing. FL_ERR_UNSUPPORTED where
 * the kernel or the file system cannot (callers rename twice instead).
 * lua/fsdp/io/publish.lua swaps a new export with the old one this way. */
FL_API int fl_path_exchange(const char *a, const char *b);

/* Inputs are regular files (core/io/input_file.c: [Note: inputs are
 * regular files]): a FIFO would block its reader, a device never ends.
 * FL_OK when `path` is a regular file (links followed), else FL_ERR_IO
 * naming it and what it is ("x is a FIFO, not a regular file") or why it
 * cannot be opened. Nothing is opened. */
FL_API int fl_file_check_regular(const char *path);
/* The whole of a regular file, never more than max_bytes: a new buffer
 * with a NUL after the *len bytes (free it with fl_file_buffer_free), or
 * NULL with an error naming the file: not a regular file, unreadable, or
 * "x is larger than 16 MiB, the limit for <what>". */
FL_API char *fl_file_read_all(const char *path, size_t max_bytes, const char *what, size_t *len);
FL_API void fl_file_buffer_free(char *buf);
/* Files that grow by whole records (core/io/append_file.c): the metrics
 * JSONL, TensorBoard event files. Each append is written straight to the
 * file (no stdio buffer that fails later, unseen); a failed or short write
 * is an error naming the file, the bytes written and why, and what part of
 * the record reached the file is cut off again, so the file always ends
 * with a whole record. create_new: fail if the file exists (O_EXCL). */
typedef struct fl_append_file fl_append_file;

FL_API fl_append_file *fl_append_open(const char *path, bool create_new);
FL_API int fl_append_write(fl_append_file *f, const void *data, size_t len);
/* Close (checked: late write errors surface here) and free. */
FL_API int fl_append_close(fl_append_file *f);

/* An advisory lock on a file (flock; core/io/lock_file.c) that one process
 * at a time holds, released by the kernel when the holder dies however it
 * dies. The file (created if missing, never removed) holds the holder's
 * line: "host H, pid P, since T, <note>". Returns a handle >= 0, or one of
 * the codes below with the error set. `holder` receives the file's line as
 * it was found: the holder's when FL_LOCK_HELD; when locked, the line of a
 * previous holder that did not release it (it died), "" otherwise. The
 * same file locked again by this process returns the same handle with one
 * more reference. */
typedef enum fl_lock_result {
    FL_LOCK_FAILED = -1,      /* the file cannot be opened or written */
    FL_LOCK_HELD = -2,        /* another process holds the lock */
    FL_LOCK_UNSUPPORTED = -3  /* the file system refuses locks (ENOLCK, ...) */
} fl_lock_result;

FL_API int fl_file_lock(const char *path, const char *note, char *holder, size_t holder_size);
/* Drop one reference; the last one empties the file and releases it. */
FL_API int fl_file_unlock(int handle);

/* ------------------------------------------------------------------------ */
/* Files: integrity (core/io/checksum.c)                                    */
/* ------------------------------------------------------------------------ */
/* An XXH3-64 checksum (libxxhash) of the bytes of a file's tensor data,
 * streamed as they are written, and a scan for NaN/infinity in the same
 * pass. Checkpoint files keep it in their safetensors metadata under
 * "fsdp_checksum" as text "xxh3-64:<16 hex digits>". */
typedef struct fl_digest fl_digest;
enum { FL_CHECKSUM_TEXT = 25 }; /* bytes of the text form, with its NUL */
/* The value is XXH3-64 over the XXH3-64 of each FL_CHECKSUM_BLOCK bytes
 * (checksum.c: [Note: the checksum of a file's data]), so a reader
 * verifies on all cores. */
enum { FL_CHECKSUM_BLOCK = 4 << 20 };

FL_API fl_digest *fl_digest_new(void);
FL_API void fl_digest_free(fl_digest *d);
FL_API void fl_digest_reset(fl_digest *d);
/* Add nbytes of `dtype` elements. With `finite` and a floating-point dtype
 * the bytes are scanned first: returns the index (in elements, from
 * `data`) of the first NaN or infinity, which is then not hashed; else -1. */
FL_API int64_t fl_digest_update(fl_digest *d, const void *data, size_t nbytes, fl_dtype dtype,
                                bool finite);
FL_API uint64_t fl_digest_value(const fl_digest *d);
/* One-shot checksum of n bytes, the blocks hashed in parallel (the same
 * value as a digest of them). */
FL_API uint64_t fl_checksum(const void *data, size_t n);
/* Index of the first NaN or infinity among n elements, or -1 (also for
 * integer dtypes). */
FL_API int64_t fl_first_nonfinite(const void *data, int64_t n, fl_dtype dtype);
/* The text form "xxh3-64:<16 hex>" into out[FL_CHECKSUM_TEXT]. */
FL_API void fl_checksum_text(uint64_t v, char *out);
/* CRC-32C (Castagnoli) of n bytes, continuing from crc (0 to start):
 * fl_crc32c(0, "123456789", 9) is 0xE3069283 (core/io/crc32c.c). The
 * checksum of TensorBoard event records, not of checkpoints. */
FL_API uint32_t fl_crc32c(uint32_t crc, const void *data, size_t n);

/* Safetensors with a checksum (core/io/safetensors.c). Before the first
 * write: store the checksum of all tensor data in the metadata
 * (fsdp_checksum; other readers ignore it). */
FL_API int fl_safetensors_writer_checksum(fl_safetensors_writer *w);
/* Refuse (error naming the tensor and element) a NaN or infinity in the
 * floating-point tensors written from now on; off by default. */
FL_API int fl_safetensors_writer_finite(fl_safetensors_writer *w, bool on);
/* After finish: the checksum's text form, or NULL without a checksum. */
FL_API const char *fl_safetensors_writer_checksum_value(const fl_safetensors_writer *w);
/* Recompute the checksum of the data and compare it with the file's
 * fsdp_checksum: FL_OK when they agree or the file has none (*checked
 * says which), else an error naming the file and both values. */
FL_API int fl_safetensors_verify(const fl_safetensors *f, bool *checked);

/* ---- optim: fused optimizer updates and norms (core/optim/) ---- */
/* One fused update of one tensor per call (later: one flat shard per unit).
 * param, grad and the state tensors are contiguous, on one device, with the
 * same number of elements (shapes may differ: a flat shard's state is 1-d)
 * and no shared memory. Math is f32 whatever the storage; every stored value
 * is rounded once (nearest even). param: f32, bf16 or f16; grad: f32 or the
 * param's dtype; state: f32, bf16 or f16 (zeros before the first step).
 * Meta and fake operands are checked and left alone. Each device's backend
 * runs its own kernels (its optim table: OpenMP on the cpu, the CUDA
 * plugin's on cuda); a device whose backend has none reports
 * FL_ERR_UNSUPPORTED. `step` counts the updates of
 * this tensor including the current one (1 on the first call). Nothing is
 * recorded for autograd. */

/* AdamW (PyTorch's torch.optim.AdamW, decoupled weight decay):
 *   p *= 1 - lr*wd;  m = lerp(m, g, 1 - beta1);  v = beta2*v + (1-beta2)*g*g
 *   p -= lr/(1 - beta1^step) * m / (sqrt(v)/sqrt(1 - beta2^step) + eps) */
typedef struct fl_adamw_options {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;
} fl_adamw_options;
FL_API int fl_adamw_step_(fl_tensor *param, const fl_tensor *grad, fl_tensor *exp_avg,
                          fl_tensor *exp_avg_sq, const fl_adamw_options *opts);
/* The same step of `count` tensors at once (PyTorch's fused multi-tensor
 * AdamW): tensor i is params[i], grads[i], exp_avgs[i], exp_avg_sqs[i],
 * each checked as fl_adamw_step_ checks one (an error names the tensor's
 * index, and no tensor is updated then), all on one device, no tensor
 * sharing memory with another. One options (one step count) for all. Each
 * tensor ends bit for bit as fl_adamw_step_ would leave it; on cuda the
 * update is one kernel launch per batch of tensors of the same dtypes
 * (dtypes may differ between tensors). The bytes moved are counted once
 * per call. count 0 does nothing. */
FL_API int fl_adamw_step_multi_(int count, fl_tensor *const *params, const fl_tensor *const *grads,
                                fl_tensor *const *exp_avgs, fl_tensor *const *exp_avg_sqs,
                                const fl_adamw_options *opts);

/* AnyPrecisionAdamW (torchdistx): AdamW with exp_avg and exp_avg_sq in any
 * state dtype (bf16 typically), m = beta1*m + (1-beta1)*g, and, when
 * `compensation` is not NULL, Kahan summation for low-precision params: the
 * whole change of p (decay and step) goes into the compensation buffer, p
 * takes what its dtype can hold and the buffer keeps the rest for the next
 * step (so a small decay is not rounded away in bf16). */
FL_API int fl_anyprecision_adamw_step_(fl_tensor *param, const fl_tensor *grad,
                                       fl_tensor *exp_avg, fl_tensor *exp_avg_sq,
                                       fl_tensor *compensation,
                                       const fl_adamw_options *opts);

/* SGD (torch.optim.SGD): d = g + wd*p; with momentum, buf = d on step 1 and
 * buf = momentum*buf + (1 - dampening)*d after, then d = nesterov ?
 * d + momentum*buf : buf; finally p -= lr*d. momentum_buffer may be NULL
 * when momentum == 0. */
typedef struct fl_sgd_options {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
    int64_t step;
} fl_sgd_options;
FL_API int fl_sgd_step_(fl_tensor *param, const fl_tensor *grad, fl_tensor *momentum_buffer,
                        const fl_sgd_options *opts);

/* Adadelta (torch.optim.Adadelta): d = g + wd*p; s = rho*s + (1-rho)*d*d;
 * delta = sqrt(a + eps) / sqrt(s + eps) * d; a = rho*a + (1-rho)*delta^2;
 * p -= lr*delta. */
typedef struct fl_adadelta_options {
    double lr, rho, eps, weight_decay;
} fl_adadelta_options;
FL_API int fl_adadelta_step_(fl_tensor *param, const fl_tensor *grad, fl_tensor *square_avg,
                             fl_tensor *acc_delta, const fl_adadelta_options *opts);

/* Sum of the squares of all elements of a contiguous float tensor on any
 * device with optim kernels, accumulated in double in a fixed order (the
 * result does not depend on the thread count): the local part of
 * clip-by-global-norm. */
FL_API int fl_grad_sq_norm(const fl_tensor *t, double *out);
/* t *= alpha in place (contiguous float tensor; f32 arithmetic for the
 * 16-bit floats): the scaling of clip-by-norm. No-op on meta and fake. */
FL_API int fl_grad_scale_(fl_tensor *t, double alpha);

/* ---- distributed: process groups and collectives (core/comm/) ---- */
/* One interface over two backends, chosen by fl_dist_init:
 *   self  one rank, no MPI: collectives are copies or nothing;
 *   mpi   Open MPI over cpu tensors. It lives in libfsdp_mpi.so next to
 *         this library and is loaded only when a launcher started the
 *         process (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, or
 *         SLURM_PROCID with SLURM_NTASKS > 1) or FSDP_BACKEND=mpi, so a
 *         plain run never touches MPI. FSDP_BACKEND=self forces one rank;
 *         FSDP_MPI_LIBRARY names another plugin file.
 * Collectives start at once and return a work handle (non-blocking MPI
 * underneath, so compute overlaps communication); fl_work_wait finishes
 * one. Every rank of a group starts the same collectives on it in the same
 * order. Tensors are contiguous, on one device; cuda tensors move through
 * NCCL when every rank of the group can use it, else through host copies
 * ([Note: collectives on device tensors] in core/comm/device_path.c);
 * meta and fake tensors are checked and left alone, so planning code runs
 * unchanged. bf16 and f16
 * reductions accumulate in f32. A wait gives up after the collective
 * timeout (FSDP_COLLECTIVE_TIMEOUT seconds, default 600) with an error
 * naming the collective, the group and the rank instead of hanging. Calls
 * come from one thread. A NULL group means the world. Anything that needs
 * the backend initialises it on first use. Errors: FL_ERR_ARG for a
 * misuse, FL_ERR_DEVICE when the backend cannot load, communication fails
 * or a wait times out. */

typedef struct fl_group fl_group;
typedef struct fl_work fl_work;

typedef enum fl_reduce_op {
    FL_REDUCE_SUM = 0,
    FL_REDUCE_AVG = 1, /* the sum divided by the group size; float dtypes */
    FL_REDUCE_MAX = 2,
    FL_REDUCE_MIN = 3,
    FL_REDUCE_OP_COUNT = 4
} fl_reduce_op;

/* Start the backend (idempotent). Fails naming the plugin path and the
 * loader's message when the mpi backend is wanted and cannot load, and
 * when FSDP_RANKS_PER_NODE does not divide the world size. */
FL_API int fl_dist_init(void);
FL_API bool fl_dist_is_initialized(void);
/* "self" or "mpi"; NULL with the error set if initialisation fails. */
FL_API const char *fl_dist_backend_name(void);
/* Where this process stands (initialise on first use; -1 on failure). The
 * node of a rank comes from MPI's shared-memory split, or, with
 * FSDP_RANKS_PER_NODE=n, from consecutive blocks of n ranks (4 ranks on one
 * machine then act as 2 nodes of 2). */
FL_API int fl_dist_rank(void);
FL_API int fl_dist_world_size(void);
FL_API int fl_dist_local_rank(void);  /* index of this rank on its node */
FL_API int fl_dist_local_size(void);  /* ranks on this node */
FL_API int fl_dist_node(void);        /* index of this node */
FL_API int fl_dist_nodes(void);       /* number of nodes */
/* The rank a launcher gave this process, read from its environment without
 * initialising anything; -1 when no launcher started it. */
FL_API int fl_dist_launcher_rank(void);
/* Seconds a wait may last before it fails (FSDP_COLLECTIVE_TIMEOUT, else
 * 600); set_timeout changes it for this process (seconds > 0). */
FL_API double fl_dist_timeout(void);
FL_API int fl_dist_set_timeout(double seconds);
/* For the host, when a script ends with an uncaught error: in a job with a
 * launcher, print "fsdp-lua: rank R: message" and end every rank of the job
 * (MPI_Abort; before the backend started, exit(1), which the launcher
 * turns into the end of the job), so no rank waits forever for this one.
 * Returns without doing anything in a run without a launcher. */
FL_API void fl_dist_abort_on_error(const char *message);
/* Complete dropped works (bounded by the timeout), free the groups and
 * shut the backend down (MPI_Finalize); nothing distributed may be called
 * after it. The host calls it when its script finished. init registers an
 * atexit hook for a process that exits before that (os.exit mid-run): in a
 * job it ends the job unless every rank is leaving too ([Note: leaving
 * the job] in core/comm/dist.c). */
FL_API void fl_dist_finalize(void);
/* For the host's os.exit: what ends the process if it exits before
 * fl_dist_finalize ("os.exit(0) at x.lua:12"). Exiting early in a job of
 * several ranks ends the job unless every rank leaves within seconds
 * ([Note: leaving the job] in core/comm/dist.c); the message names this. */
FL_API void fl_dist_note_exit(const char *how);
/* A 64-bit digest (FNV-1a) of n bytes: what ranks exchange to agree on
 * their configuration before comparing it whole (fsdp.dist.agree). */
FL_API uint64_t fl_dist_digest(const void *data, size_t n);

/* Groups are reference counted: every function returning one returns a
 * new reference. Creating a group is collective over its parent: every
 * rank of the parent calls, members or not, in the same order. */
FL_API fl_group *fl_group_world(void);
/* The world ranks `ranks` (n distinct, in group-rank order). A rank not
 * listed gets a group that is not a member (rank -1, size 0). */
FL_API fl_group *fl_group_new(int n, const int *ranks);
/* MPI_Comm_split of parent (NULL: world): ranks passing the same color
 * form a group ordered by key, then by parent rank; color < 0 gives a
 * non-member group. name labels it in messages (copied; NULL: a default). */
FL_API fl_group *fl_group_split(fl_group *parent, int color, int key, const char *name);
/* The groups of hybrid sharding, collective over the world: shard = the
 * ranks of this node (full sharding inside it), replicate = the ranks with
 * this local rank on every node (replicas across nodes). */
FL_API int fl_group_hybrid(fl_group **shard, fl_group **replicate);
FL_API fl_group *fl_group_retain(fl_group *g);
FL_API void fl_group_release(fl_group *g);
FL_API bool fl_group_is_member(const fl_group *g);
FL_API int fl_group_rank(const fl_group *g);  /* -1 outside the group */
FL_API int fl_group_size(const fl_group *g);  /* 0 outside the group */
/* How the group moves device tensors, decided by its first collective on
 * them: "nccl" (GPU to GPU), "host copies" (no NCCL, or NCCL refused:
 * ranks sharing a GPU), "undecided" before. */
FL_API const char *fl_group_device_library(const fl_group *g);
/* World rank of group rank i; -1 when i is out of range. */
FL_API int fl_group_world_rank(const fl_group *g, int i);
/* "world", "shard(node 1)", "replicate(local rank 0)", "group[0, 2]". */
FL_API const char *fl_group_name(const fl_group *g);

/* Collectives: each returns a new work (NULL with the error set on a
 * misuse, before anything was sent). The tensors stay referenced by the
 * work until it completes; do not read an output or write an input
 * before fl_work_wait (or fl_work_test) reports completion. */
/* out = the inputs of every group rank concatenated in rank order: in has
 * n elements, out size*n of the same dtype. in may be out's own slot
 * (elements rank*n ... rank*n+n-1 of out): gathered in place, no copy. */
FL_API fl_work *fl_all_gather_into(fl_group *g, fl_tensor *out, const fl_tensor *in);
/* out = the reduction over the group of chunk r of every rank's in, on
 * group rank r: in has size * out->numel elements; in and out do not
 * overlap. op: sum, avg (floats), max, min. */
FL_API fl_work *fl_reduce_scatter(fl_group *g, fl_tensor *out, const fl_tensor *in,
                                  fl_reduce_op op);
/* t = the reduction of t over the group, in place. */
FL_API fl_work *fl_all_reduce(fl_group *g, fl_tensor *t, fl_reduce_op op);
/* t = group rank root's t, in place. */
FL_API fl_work *fl_broadcast(fl_group *g, fl_tensor *t, int root);
FL_API fl_work *fl_barrier(fl_group *g);
/* A barrier that cannot hang (blocking): every rank reports to group rank
 * 0 by point-to-point messages; after `timeout` seconds rank 0 fails
 * naming the world ranks that did not arrive and tells the ranks that did,
 * which fail with the same names; a rank that hears nothing from rank 0
 * within 2 * timeout + 1 seconds fails saying so. FL_OK when every rank
 * arrived. */
FL_API int fl_monitored_barrier(fl_group *g, double timeout);

/* Block until the collective completes (its outputs are then valid). Fails
 * after the collective timeout naming the collective, the group and this
 * rank; a work that failed stays failed. A collective moved by the
 * device's library (NCCL) is waited for on the device instead: everything
 * queued on the device afterwards runs after it and the host goes on (as
 * PyTorch's NCCL works), so its outputs are valid for every later op and
 * copy; a host read that would block behind a collective that never
 * completes fails after the timeout instead, and the communicator is
 * aborted ([Note: ordered collectives] in core/cuda/cuda_nccl.cu). */
FL_API int fl_work_wait(fl_work *w);
/* Progress the collective; *done says whether it has completed. */
FL_API int fl_work_test(fl_work *w, bool *done);
FL_API bool fl_work_is_completed(const fl_work *w);
/* Whether the backend may still read or write the work's buffers: in
 * flight, or failed (timed out) with its request still outstanding. Such
 * buffers must stay mapped: the work keeps its tensors referenced, and a
 * caller that unmaps pages itself must not unmap these. */
FL_API bool fl_work_is_pending(const fl_work *w);
/* The collective's name, e.g. "all_reduce". */
FL_API const char *fl_work_name(const fl_work *w);
/* How many collectives of a kind ("all_gather", "reduce_scatter",
 * "all_reduce", "broadcast", "barrier") this process has started with data
 * to move between ranks (groups of one and empty tensors do not count);
 * -1 for an unknown kind. Tests count communication with it. */
FL_API int64_t fl_dist_collective_count(const char *kind);
/* The same collectives of a kind with what they moved: how many, the bytes
 * of their buffers as the backend got them (an all_gather's gathered
 * output, a reduce_scatter's whole input, an all_reduce's or broadcast's
 * tensor; 16-bit reductions through the host backend are staged in f32,
 * so they count 4 bytes an element), and the seconds the host spent
 * blocked in fl_work_wait for them (exposed communication: a collective
 * that finished behind compute adds nothing; one on a device library adds
 * nothing, the device waits), and the seconds during which at least one
 * of them was in flight on the host backend (the link's busy time,
 * overlapped or not; 0 for a backend whose collectives complete at once).
 * kind "any" gives busy seconds of all kinds together (count, bytes and
 * wait summed). NULL outputs are skipped. */
FL_API int fl_dist_collective_stats(const char *kind, int64_t *count, int64_t *bytes,
                                    double *wait_seconds, double *busy_seconds);
/* The kinds of collective, in the order fl_coll_record.kind numbers them. */
typedef enum fl_coll_kind {
    FL_COLL_ALL_GATHER = 0,
    FL_COLL_REDUCE_SCATTER = 1,
    FL_COLL_ALL_REDUCE = 2,
    FL_COLL_BROADCAST = 3,
    FL_COLL_BARRIER = 4
} fl_coll_kind;
/* One completed collective as the host backend saw it, for measuring
 * communication from the moment the last member joined ([Note: joined
 * time] in core/comm/mpi/backend_mpi.c). comm and sequence name the same
 * collective on every member of its group: comm the communicator (a number
 * derived from how it was split, equal on its members), sequence its
 * collectives counted from 0. start and end are seconds on world rank 0's
 * monotonic clock (other nodes' clocks are shifted by an offset measured
 * at start): when this rank started it, and when the backend saw it
 * complete here. */
typedef struct fl_coll_record {
    uint32_t comm;
    uint32_t kind; /* fl_coll_kind */
    int64_t sequence;
    double start, end;
} fl_coll_record;
/* Move up to max of the oldest records of completed collectives into out,
 * oldest first; returns how many (0 with a backend that keeps none, e.g.
 * one process), or -1 with max < 0. The backend keeps the newest
 * FL_COLL_LOG_CAPACITY; *lost (optional) = how many older ones it dropped
 * since the previous call. */
enum { FL_COLL_LOG_CAPACITY = 8192 };
FL_API int fl_dist_collective_log(fl_coll_record *out, int max, int64_t *lost);
/* Drop the handle (NULL is fine). An unfinished collective carries on with
 * its tensors referenced and completes during later calls or at finalize;
 * its outputs are defined only after a wait. */
FL_API void fl_work_release(fl_work *w);

/* ---- sharded units (core/sharding/) ---- */
/* A unit is the FSDP flat parameter of one wrapped module (DESIGN.md,
 * decision 6): its parameters, in order, laid end to end in one flat
 * buffer padded to a multiple of the shard group's size, so every group
 * rank holds one equal contiguous shard. The master shard (master dtype,
 * e.g. f32) is what the optimizer updates; fl_unit_unshard all-gathers it
 * in the param dtype into the gathered buffer, whose per-parameter views
 * the module computes with; fl_unit_reshard frees that buffer again.
 *
 * [Note: the gathered buffer keeps its address]
 * Autograd saves views of the gathered parameters (a linear saves its
 * weight) and derived views cache data pointers, while FULL_SHARD frees the
 * buffer after forward and gathers it again before backward. The buffer is
 * therefore one reserved range of virtual addresses (the backend's
 * vm_reserve): resharding releases the memory behind it and keeps the
 * addresses, unsharding puts memory back at the same addresses. On the CPU
 * the pages go back to the system lazily (madvise MADV_FREE: [Note: lazily
 * freed gathered pages] in core/cpu/cpu_backend.c) and are protected, so a
 * stray read faults loudly instead of seeing stale values; on CUDA the range is
 * cuMemAddressReserve'd and physical memory is cuMemCreate'd and mapped at
 * unshard, unmapped and released at reshard (the driver's virtual memory
 * management, reached through the runtime so the core never links
 * libcuda). Every view ever taken stays valid across the cycle; the
 * allocator's statistics count the bytes only while gathered.
 *
 * Gradients: the views' gradients are packed into one flat buffer in the
 * reduce dtype (fl_unit_pack_grads), reduce-scattered with averaging over
 * the shard group, all-reduced (averaged) over the replicate group when
 * there is one (hybrid sharding, NO_SHARD), and added into the sharded
 * gradient in the grad dtype (fl_unit_finish_reduce). Strategies are
 * choices of groups: FULL_SHARD and SHARD_GRAD_OP shard over the world;
 * NO_SHARD shards over a group of one and replicates over the world; the
 * hybrids shard inside a node and replicate across nodes. When to reshard
 * is the caller's (lua/fsdp/sharding/). States:
 *   SHARDED --unshard--> UNSHARDING --wait--> UNSHARDED --reshard--> SHARDED
 * A meta unit (device meta) moves through the same states without storage
 * or communication: the planner's and the REPL's view of a huge model. */

typedef struct fl_unit fl_unit;

typedef enum fl_unit_state {
    FL_UNIT_SHARDED = 0,
    FL_UNIT_UNSHARDING = 1, /* all-gather in flight */
    FL_UNIT_UNSHARDED = 2
} fl_unit_state;

typedef struct fl_unit_config {
    fl_group *shard_group;     /* ranks that split the flat parameter; NULL: world */
    fl_group *replicate_group; /* ranks with equal shards (gradients averaged over
                                  it); NULL: none */
    fl_dtype master_dtype;     /* master shard and its gradient */
    fl_dtype param_dtype;      /* all-gather and compute */
    fl_dtype reduce_dtype;     /* gradient reduction */
    fl_dtype grad_dtype;       /* the sharded gradient: the master dtype, or a
                                  low precision one (keep_low_precision_grads) */
    fl_device device;          /* cpu, cuda:N, or meta for a unit without storage:
                                  where parameters are gathered and used */
    bool cpu_offload;          /* the master shard and its gradient (so the
                                  optimizer step and its state) on the host,
                                  copied to device at unshard and from it after
                                  the reduction */
} fl_unit_config;

/* A unit over n parameters (names, shapes given as ndims[i] sizes each,
 * concatenated in dims), its master shard allocated and zero. The groups
 * are retained. name labels the unit in messages ("" for the root). */
FL_API fl_unit *fl_unit_new(const char *name, int n, const char *const *names,
                            const int *ndims, const int64_t *dims,
                            const fl_unit_config *config);
FL_API void fl_unit_free(fl_unit *u);
FL_API const char *fl_unit_name(const fl_unit *u);
FL_API fl_unit_state fl_unit_state_of(const fl_unit *u);
FL_API int fl_unit_param_count(const fl_unit *u);
FL_API const char *fl_unit_param_name(const fl_unit *u, int i);
/* Element offset of parameter i in the flat parameter. */
FL_API int64_t fl_unit_param_offset(const fl_unit *u, int i);
FL_API int64_t fl_unit_numel(const fl_unit *u);        /* sum over parameters */
FL_API int64_t fl_unit_padded_numel(const fl_unit *u); /* multiple of the group size */
FL_API int64_t fl_unit_shard_numel(const fl_unit *u);  /* padded / group size */
/* Where parameter i meets this rank's shard: its elements [*param_start,
 * *param_start + *len) are shard elements [*shard_start, ... + *len).
 * *len is 0 when they do not meet. */
FL_API int fl_unit_param_shard_range(const fl_unit *u, int i, int64_t *param_start,
                                     int64_t *shard_start, int64_t *len);
/* The master shard, 1-d [shard numel] (new reference). */
FL_API fl_tensor *fl_unit_shard(fl_unit *u);
/* The sharded gradient (new reference), or NULL before the first reduce. */
FL_API fl_tensor *fl_unit_grad(fl_unit *u);
/* Drop the sharded gradient: the next reduce starts it afresh. True when
 * its memory went with it (no other reference held it, views included);
 * false when something still holds it, or there was none. */
FL_API bool fl_unit_zero_grad(fl_unit *u);
/* Start gathering (SHARDED -> UNSHARDING); nothing to do when UNSHARDED. */
FL_API int fl_unit_unshard(fl_unit *u);
/* Finish gathering (UNSHARDING -> UNSHARDED); fine when UNSHARDED. */
FL_API int fl_unit_wait(fl_unit *u);
/* Free the gathered buffer (-> SHARDED). Fails while UNSHARDING. */
FL_API int fl_unit_reshard(fl_unit *u);
/* A view of gathered parameter i in the param dtype (new tensor, no
 * autograd); its values are defined while the unit is UNSHARDED. */
FL_API fl_tensor *fl_unit_param_view(fl_unit *u, int i);
/* Bytes of the gathered buffer (counted only while gathered). */
FL_API int64_t fl_unit_gathered_bytes(const fl_unit *u);
/* Blocking: the whole flat parameter (numel elements, padding dropped) in
 * dtype, gathered from the master shards (state dicts, summon). */
FL_API fl_tensor *fl_unit_gather_master(fl_unit *u, fl_dtype dtype);
/* Write elements of a whole flat parameter `full` (numel elements) that
 * fall in this rank's shard into the master shard (summon's writeback). */
FL_API int fl_unit_scatter_master(fl_unit *u, const fl_tensor *full);
/* A flat [padded numel] tensor in the reduce dtype (the grad dtype for a
 * unit that communicates nothing: one rank, no replicas) holding grads[i] (shaped
 * like parameter i; NULL: zeros) at each parameter's offset, plus `extra`
 * (a flat tensor of padded numel, any float dtype) when not NULL. */
FL_API fl_tensor *fl_unit_pack_grads(fl_unit *u, int n, fl_tensor *const *grads,
                                     const fl_tensor *extra);
/* Start reducing a packed gradient (reduce-scatter over the shard group);
 * the unit owns flat_grad from then on (do not write it). A reduce still
 * pending on this unit is finished first. */
FL_API int fl_unit_reduce(fl_unit *u, fl_tensor *flat_grad);
FL_API bool fl_unit_reduce_pending(const fl_unit *u);
/* Finish the pending reduce (if any): wait, average over the replicate
 * group, then grad = reduced (first time, or after zero_grad) or
 * grad += reduced. */
FL_API int fl_unit_finish_reduce(fl_unit *u);

/* ------------------------------------------------------------------------ */
/* Tokenizers (core/text)                                                    */
/* ------------------------------------------------------------------------ */

/* A Hugging Face tokenizer.json byte-level BPE (GPT-2, Llama 3 style):
 * results identical to the `tokenizers` package (core/text/bpe.c says which
 * parts of the format it implements; load refuses the others naming the
 * file and the field). One thread at a time per handle: fl_bpe_clone makes
 * another handle on the same loaded model for another thread. */
typedef struct fl_bpe fl_bpe;
FL_API fl_bpe *fl_bpe_load(const char *path);
FL_API fl_bpe *fl_bpe_clone(const fl_bpe *t);
/* Frees a handle; the model goes with its last handle. */
FL_API void fl_bpe_free(fl_bpe *t);
/* Largest id + 1 (model vocabulary and added tokens). */
FL_API int64_t fl_bpe_vocab_size(const fl_bpe *t);
/* Ids of len bytes of text, with the post-processor's special tokens when
 * add_special; *ids points into t (valid until its next call). -1: error. */
FL_API int64_t fl_bpe_encode(fl_bpe *t, const char *text, size_t len, bool add_special, const int32_t **ids);
/* The text of n ids (without special tokens when skip_special), invalid
 * UTF-8 replaced by U+FFFD; *text points into t, NUL-ended. -1: error. */
FL_API int64_t fl_bpe_decode(fl_bpe *t, const int32_t *ids, int64_t n, bool skip_special, const char **text);
/* The id of a token as the file writes it (added tokens too), -1 if none. */
FL_API int64_t fl_bpe_token_to_id(const fl_bpe *t, const char *token, size_t len);
FL_API const char *fl_bpe_id_to_token(const fl_bpe *t, int64_t id, size_t *len);
FL_API bool fl_bpe_is_special(const fl_bpe *t, int64_t id);

/* A SentencePiece model (tokenizer.model) through libsentencepiece, in
 * process. One thread at a time per object. Ids of absent specials: -1. */
typedef struct fl_spm fl_spm;
FL_API fl_spm *fl_spm_load(const char *path);
FL_API void fl_spm_free(fl_spm *t);
FL_API int64_t fl_spm_vocab_size(const fl_spm *t);
FL_API int64_t fl_spm_bos_id(const fl_spm *t);
FL_API int64_t fl_spm_eos_id(const fl_spm *t);
FL_API int64_t fl_spm_unk_id(const fl_spm *t);
FL_API int64_t fl_spm_pad_id(const fl_spm *t);
/* Same contracts as fl_bpe_encode/decode (no specials added; decode drops
 * control pieces, as SentencePiece does). */
FL_API int64_t fl_spm_encode(fl_spm *t, const char *text, size_t len, const int32_t **ids);
FL_API int64_t fl_spm_decode(fl_spm *t, const int32_t *ids, int64_t n, const char **text);
FL_API int64_t fl_spm_piece_to_id(const fl_spm *t, const char *piece, size_t len);
FL_API const char *fl_spm_id_to_piece(const fl_spm *t, int64_t id, size_t *len);
FL_API bool fl_spm_is_control(const fl_spm *t, int64_t id);
/* Train a model: n options of SentencePiece's trainer as key/value strings
 * (input, model_prefix, vocab_size, model_type, random_seed, ...; what
 * spm_train takes as --key=value). Writes <model_prefix>.model and .vocab. */
FL_API int fl_spm_train(int n, const char *const *keys, const char *const *values);

/* ------------------------------------------------------------------------ */
/* Corpus readers and the streaming token loader (core/data)                 */
/* ------------------------------------------------------------------------ */

/* A document reader over one file, streamed in constant memory. The name
 * gives the format: .txt (a document per blank-line-separated paragraph),
 * .jsonl/.json (a JSON object per line, the document its text_field), each
 * optionally .gz (gzip) or .zst (zstd). Errors name the file and the line
 * and byte offset (compressed byte offset for a corrupt or truncated
 * stream); invalid UTF-8 and documents longer than max_doc_bytes are
 * errors. core/data/reader.c has the details. One thread at a time. */
typedef struct fl_reader fl_reader;
typedef struct fl_reader_opts {
    const char *text_field; /* JSON lines: the field of the text (NULL: "text") */
    int64_t max_doc_bytes;  /* the longest document accepted (0: 8 MiB) */
    bool whole_record;      /* JSON lines: the document is the whole line, checked to be a JSON
                             * object, for a caller that reads several fields (chat records,
                             * lua/fsdp/data/chat.lua); text_field is unused */
} fl_reader_opts;
/* Where a document starts: uncompressed byte offset, index among the
 * file's documents (0-based), line number (1-based); and the fingerprint of
 * what was read to get there: XXH3-64 of the file's (decompressed) bytes
 * before the document, and of them with the document's own lines (and a
 * paragraph's closing blank line) after them ([Note: the fingerprint of a
 * data position] in lua/fsdp/data/corpus.lua). */
typedef struct fl_doc_position {
    int64_t offset, index, line;
    uint64_t before, through;
} fl_doc_position;
FL_API fl_reader *fl_reader_open(const char *path, const fl_reader_opts *opts);
FL_API void fl_reader_free(fl_reader *r);
/* The next document: 1 with *text (NUL-ended, valid until the next call)
 * and *len, 0 at the end of the file, -1 on error. */
FL_API int fl_reader_next(fl_reader *r, const char **text, size_t *len);
/* The position of the document fl_reader_next returned last. */
FL_API void fl_reader_position(const fl_reader *r, fl_doc_position *p);
/* Continue at a position fl_reader_position gave: the bytes before it are
 * read (decompressed) and hashed again. With check, a file whose bytes up
 * to the position, or the document there (at the next fl_reader_next),
 * are not the ones fingerprinted is an error naming it; without, the
 * reader goes on as near the position as the file now allows (at its end
 * when it ends before the offset, at the next line when the offset falls
 * inside one). */
FL_API int fl_reader_seek(fl_reader *r, const fl_doc_position *p, bool check);
/* The next fl_reader_next gives the last document again (a document read
 * to check a position, then handed on). */
FL_API void fl_reader_again(fl_reader *r);

/* The files of a corpus: a file, a directory (its .txt/.jsonl/.json files,
 * also .gz/.zst, not recursive) or a glob pattern; sorted by name. Fails
 * naming the path when nothing matches. */
typedef struct fl_file_list fl_file_list;
FL_API fl_file_list *fl_file_list_open(const char *spec);
FL_API void fl_file_list_free(fl_file_list *l);
FL_API int64_t fl_file_list_count(const fl_file_list *l);
FL_API const char *fl_file_list_path(const fl_file_list *l, int64_t i);
/* The file's size in bytes (as stored: compressed) when it was listed. */
FL_API int64_t fl_file_list_size(const fl_file_list *l, int64_t i);

/* [Note: the tokenizer hook] How the streaming loader tokenizes: one
 * instance per worker thread, made by open(arg) in the thread that opens
 * the stream and used by one worker only (so a tokenizer that is "one
 * thread at a time per object" needs nothing more). encode writes the ids
 * of len bytes of text (no special tokens: the loader places eos) to *ids,
 * valid until the instance's next call, and returns their number, or -1
 * with the core's error set. close frees an instance. A new tokenizer is
 * plugged in by giving these three functions (fl_byte_tokenizer_hook is
 * the one built in: a token per byte). They must be C functions, never
 * LuaJIT callbacks (the workers are other threads); arg is read only by
 * open, during fl_stream_open. A tokenizer object with a load function and
 * "one thread at a time" encode adapts as, e.g.,
 *   open(arg) = load((const char *)arg),
 *   encode(self, text, len, ids) = its encode without special tokens,
 *   close(self) = its free,
 * and its Lua object's c_hook() returns the hook (fsdp.data.corpus). */
typedef struct fl_tokenizer_hook {
    void *(*open)(void *arg);
    int64_t (*encode)(void *self, const char *text, size_t len, const int32_t **ids);
    void (*close)(void *self);
    void *arg;
} fl_tokenizer_hook;
FL_API fl_tokenizer_hook fl_byte_tokenizer_hook(void);
/* The core's tokenizers as hooks (core/data/tokenizer_hooks.c): each
 * worker gets a clone of t / loads the SentencePiece model at path (t and
 * path must live until fl_stream_open returns). */
FL_API fl_tokenizer_hook fl_bpe_hook(const fl_bpe *t);
FL_API fl_tokenizer_hook fl_spm_hook(const char *path);

/* Which documents a stream reads. A document of a file goes to validation
 * when floor((k+1) f) > floor(k f) for its index k in the file and
 * f = val_fraction (tools/tokenize.lua's rule, spread evenly). */
typedef enum fl_stream_split {
    FL_SPLIT_ALL = 0,
    FL_SPLIT_TRAIN = 1, /* the documents not held out */
    FL_SPLIT_VAL = 2    /* the held-out documents */
} fl_stream_split;

typedef struct fl_stream_opts {
    const char *path;          /* file, directory or glob (fl_file_list) */
    fl_reader_opts reader;
    fl_tokenizer_hook tokenizer;
    int64_t eos_id;            /* placed after every document */
    int64_t vocab_size;        /* an id outside [0, vocab_size) is an error */
    int64_t seq_len;           /* a row is seq_len + 1 tokens */
    uint64_t seed;             /* the file order of each epoch */
    bool shuffle;              /* false: files in name order every epoch */
    bool once;                 /* one pass (validation): next returns fewer rows at the end */
    int32_t rank, world_size;  /* which part this stream reads */
    int32_t threads;           /* worker threads (>= 1) */
    int32_t split;             /* fl_stream_split */
    double val_fraction;
    int64_t ahead_tokens;      /* tokens a file may queue ahead (0: 1 Mi) */
} fl_stream_opts;

/* Where a stream is: `file` counts the rank's files across epochs (epoch =
 * file / files_per_epoch), the document being consumed is at `doc` of that
 * file with `consumed` of its tokens (its eos counted) already in rows, and
 * `carry` is the token the next row starts with (rows overlap by one so no
 * token is lost as a target), -1 when none. */
typedef struct fl_stream_state {
    int64_t file;
    fl_doc_position doc;
    int64_t consumed;
    int64_t carry;
} fl_stream_state;

/* The loader: files read and tokenized ahead by worker threads, documents
 * packed with eos between them into rows of seq_len + 1 tokens, the same
 * rows for any number of threads. Ranks read disjoint parts: whole files
 * (file i of an epoch's order to rank i mod world_size) when there are at
 * least world_size files, else every world_size-th document of each file.
 * core/data/stream.c has the details. */
typedef struct fl_stream fl_stream;
FL_API fl_stream *fl_stream_open(const fl_stream_opts *opts);
FL_API void fl_stream_free(fl_stream *s);
/* Fill up to rows rows of seq_len + 1 tokens into out (i64, row-major).
 * Returns the rows filled: rows, fewer only at the end of a `once`
 * stream; -1 on error (naming the file and the document's line). */
FL_API int64_t fl_stream_next(fl_stream *s, int64_t rows, int64_t *out);
FL_API void fl_stream_get_state(const fl_stream *s, fl_stream_state *st);
/* Continue from a state get_state gave (stops and restarts the workers).
 * With check, the file of the state is read up to its document and that
 * document too before anything changes, and a file that is not as the
 * state's fingerprint says is an error naming it (the stream is left as it
 * was); without, the stream goes on as near the state as the data allows
 * (fl_reader_seek). */
FL_API int fl_stream_set_state(fl_stream *s, const fl_stream_state *st, bool check);
FL_API int64_t fl_stream_files_per_epoch(const fl_stream *s);
/* The path of the rank's file at a position of fl_stream_state.file. */
FL_API const char *fl_stream_file_path(const fl_stream *s, int64_t file);
/* The corpus's files as the stream listed them when it opened (names and
 * sizes then). */
FL_API const fl_file_list *fl_stream_files(const fl_stream *s);
/* Documents and tokens (eos included) delivered into rows so far. */
FL_API int64_t fl_stream_documents(const fl_stream *s);
FL_API int64_t fl_stream_tokens(const fl_stream *s);

#ifndef FL_FFI_CDEF
#ifdef __cplusplus
}
#endif
#endif

#endif /* FSDP_H */
