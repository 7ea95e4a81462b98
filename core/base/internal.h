/*
 * internal.h: declarations shared by the files of the core, never installed.
 *
 * Error helpers (fl_fail), invariant checks (FL_ASSERT), the storage layout,
 * and the per-device backend vtable through which every kernel is reached.
 */
#ifndef FL_INTERNAL_H
#define FL_INTERNAL_H

#include "fsdp.h"

#include <stdio.h>
#include <stdlib.h>

/* Internal functions a backend plugin calls ([Note: the device interface]):
 * exported from libfsdp.so, while every other internal symbol stays
 * hidden. */
#define FL_PLUGIN_API __attribute__((visibility("default")))

/* ---- errors ------------------------------------------------------------ */

/* Record an error for this thread and return `status` (so callers can write
 * `return fl_fail(FL_ERR_ARG, "narrow: ...", ...)`). */
FL_PLUGIN_API int fl_fail(fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the error recorded last with a formatted context and ": " (its
 * status kept); returns that status. */
FL_PLUGIN_API int fl_fail_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Same, for functions that return a pointer: records and returns NULL. */
#define FL_FAIL_NULL(status, ...) (fl_fail((status), __VA_ARGS__), (void *)0)

/* Broken internal invariant: not a user mistake. Abort with location. */
#define FL_ASSERT(cond)                                                       \
    do {                                                                      \
        if (!(cond)) fl_abort(__FILE__, __LINE__, #cond);                     \
    } while (0)
FL_PLUGIN_API void fl_abort(const char *file, int line, const char *what)
    __attribute__((noreturn));

/* ---- files ------------------------------------------------------------- */

/* fsync the directory holding `path` (after a rename into it). */
int fl_sync_parent_dir(const char *path);

/* Open an input for reading: a descriptor of a regular file (its stat in
 * *st when st is not NULL), or -1 with an error naming the path and what it
 * is instead (a FIFO, a device, a directory), without ever blocking
 * (io/input_file.c: [Note: inputs are regular files]). */
struct stat;
int fl_open_regular(const char *path, struct stat *st);

/* The integer in environment variable `name`, or fallback when it is unset,
 * empty or not a whole int (base/launcher.c). */
int fl_env_int(const char *name, int fallback);

/* ---- shapes ------------------------------------------------------------ */

/* Normalise a possibly negative dim against ndim (ndim_extra lets unsqueeze
 * accept dim == ndim). Returns the dim or -1 after recording an error that
 * names `op` and the tensor's shape. */
int fl_wrap_dim(const char *op, const fl_tensor *t, int dim, int ndim_extra);
/* Validate ndim and sizes for a new tensor; computes numel. */
int fl_check_shape(const char *op, int ndim, const int64_t *shape,
                   int64_t *numel);
/* "[3, 4]" of a tensor into a caller buffer (for messages). */
FL_PLUGIN_API const char *fl_shape_str(const fl_tensor *t, char *buf, size_t size);
/* Row-major contiguous strides for shape. */
void fl_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);

/* ---- storage ----------------------------------------------------------- */

struct fl_storage {
    void *data;
    int64_t nbytes;
    int32_t refcount;
    fl_device device;
    /* For storage the core did not allocate (e.g. mmap of a file): called
     * instead of the device allocator's free when the last reference goes. */
    void (*release)(void *ctx, void *data, int64_t nbytes);
    void *release_ctx;
    /* Unique for the life of the process (never reused like an address):
     * allocator and virtual storage get one (fl_storage_new,
     * fl_storage_virtual), other storage 0.
     * Activation offload keys its deduplication by it. */
    uint64_t id;
    /* Viewed by a leaf that requires grad (a parameter, or a sharded
     * unit's segment of its shard): set by fl_requires_grad_, never
     * cleared. Activation offload never moves such memory. */
    bool holds_params;
    /* For storage that maps a file: its path (owned by release_ctx), and
     * check(release_ctx): FL_OK while the file still holds the mapped
     * bytes (its last page reads), else an error naming it. Every op checks its inputs with it
     * (fl_check_tensor), and copies out of the mapping are guarded besides
     * (fault.c): see [Note: mapped files that shrink] in tensor.c. */
    const char *file;
    int (*check)(void *ctx);
};

/* Reading mapped files that may shrink (core/base/fault.c). Register a
 * mapping so a SIGBUS inside it ends the process with a message naming the
 * file; fl_guarded_memcpy copies with a SIGBUS guard on this thread and
 * returns -1 instead of faulting. */
void fl_fault_register(const void *begin, size_t size, const char *path);
void fl_fault_unregister(const void *begin);
int fl_guarded_memcpy(void *dst, const void *src, size_t n);

fl_storage *fl_storage_new(fl_device device, int64_t nbytes);
/* A function fl_storage_new calls after each allocation it makes (NULL:
 * none): how the distributed layer above progresses collectives between
 * kernels ([Note: progress from compute], core/comm/dist.c) without this
 * layer knowing of it. */
void fl_set_allocation_hook(void (*hook)(void));
/* Storage that holds nothing and counts nbytes in the meta device's memory
 * statistics while it lives ([Note: virtual storage], storage.c). */
fl_storage *fl_storage_virtual(int64_t nbytes);
/* A meta tensor that only carries a shape and dtype for a backward (what
 * an op saves of an input it needs no values of): it stands for no bytes,
 * so it has no virtual storage and the engine keeps it ([Note: virtual
 * storage]). */
fl_tensor *fl_shape_carrier(int ndim, const int64_t *shape, fl_dtype dtype);
void fl_storage_retain(fl_storage *s);
void fl_storage_release(fl_storage *s);

/* A fresh tensor header (refcount 1) with the given geometry and no data;
 * storage is attached by the caller. */
fl_tensor *fl_tensor_header(int ndim, const int64_t *shape, fl_dtype dtype,
                            fl_device device);
/* A new view header sharing t's storage with the given geometry. */
fl_tensor *fl_tensor_view_of(const fl_tensor *t, int ndim,
                             const int64_t *shape, const int64_t *stride,
                             int64_t offset);
/* fl_clone, fl_contiguous and fl_to (non_blocking: fl_to_non_blocking)
 * without autograd: core/tensor's copies, which core/ops/copy.c records. */
fl_tensor *fl_tensor_clone(const fl_tensor *t);
fl_tensor *fl_tensor_contiguous(const fl_tensor *t);
fl_tensor *fl_tensor_to(const fl_tensor *t, fl_dtype dtype, fl_device device, bool non_blocking);
/* Fail unless t is non-NULL and, if need_data, has host-usable storage. */
int fl_check_tensor(const char *op, const fl_tensor *t, bool need_data);

/* ---- pinned host memory (core/tensor/pinned.c) ------------------------- */

/* Whether s came from the pinned host pool (a cpu storage). */
bool fl_storage_is_pinned(const fl_storage *s);
/* Pinned storage of nbytes on the cpu device; NULL with an error naming
 * `op` without a CUDA device or when out of memory. */
fl_storage *fl_pinned_storage_new(const char *op, int64_t nbytes);
/* Queue a copy of nbytes between pinned host memory (inside the storage
 * `pinned`) and memory of `device` on its compute stream, and record the
 * use so the pinned block is not reused before the copy ran. */
int fl_pinned_copy_async(fl_device device, void *dst, const void *src, int64_t nbytes,
                         bool to_host, fl_storage *pinned);
/* The same with the copy queued on `stream` of the device, which must be
 * its compute stream (0) or its copy stream (FL_STREAM_COPY); the pinned
 * block records that stream as a user. FL_OK or the error set. */
int fl_pinned_copy_async_on(fl_device device, uint64_t stream, void *dst, const void *src,
                            int64_t nbytes, bool to_host, fl_storage *pinned);

/* ---- allocators and memory statistics ---------------------------------- */

/* Account for an allocation of nbytes on device; fails (FL_ERR_OOM, with a
 * message naming the device, the request and the statistics) when a limit
 * would be exceeded. Call fl_memory_note_free when it is returned. */
int fl_memory_note_alloc(fl_device device, int64_t nbytes);
void fl_memory_note_free(fl_device device, int64_t nbytes);
void fl_memory_note_failure(fl_device device);
/* Raise the device's peak as if nbytes more were in use for a moment
 * (scratch that meta tensors stand for, fl_meta_set_f32_gemm). */
void fl_memory_note_transient(fl_device device, int64_t nbytes);

/* The CPU's caching allocator (core/cpu/cpu_alloc.c): 64-byte aligned
 * blocks; fl_cpu_free must get the size the block was allocated with. */
void *fl_cpu_alloc(int64_t nbytes);
void fl_cpu_free(void *ptr, int64_t nbytes);
int64_t fl_cpu_reserved_bytes(void);
/* Whether large host blocks and reserved ranges ask for transparent huge
 * pages (FSDP_CPU_HUGE_PAGES, default 1; cpu_alloc.c). */
bool fl_cpu_huge_pages(void);
enum { FL_CPU_HUGE_PAGE = 2 * 1024 * 1024 };
int64_t fl_cpu_empty_cache(void);

/* ---- backends: one vtable per device kind ------------------------------ */

/* [Note: the device interface]
 * Everything the core does with a device goes through its fl_backend:
 * memory and its cache, copies and fills, streams, events, asynchronous
 * copies, pinned host memory, memory statistics, the kernel table of every
 * op family and the device's collective library. No file outside a
 * backend's folder (core/cpu, core/cuda) names a backend, so core/tensor,
 * ops, autograd, optim and dist work unchanged on any device. The cpu
 * backend is built in; the cuda backend is a plugin, libfsdp_cuda.so,
 * opened by core/tensor/backend.c on the first use of a cuda device
 * (docs/ARCHITECTURE.md, "Backends are plugins"). A plugin calls only
 * FL_API functions and the internal ones marked FL_PLUGIN_API below, and
 * FL_BACKEND_ABI changes whenever this struct, the kernel tables or the
 * tensor struct they take change, so a stale plugin is refused with a
 * message instead of misbehaving (2: fl_tensor gained virtual_storage;
 * 3: fl_linear_kernels gained matmul_scratch; 4: fl_elementwise_kernels
 * gained moe_route and moe_route_backward; 5: fl_optim_kernels gained
 * update_multi, fl_backend gained kernel_launches). */
enum { FL_BACKEND_ABI = 5 };

/* The symbol a backend plugin (libfsdp_cuda.so) exports: returns its
 * vtable. */
#define FL_BACKEND_PLUGIN_ENTRY "fl_backend_plugin_entry"

/* What a random fill generates: distribution, key and parameters. */
typedef struct fl_random_spec {
    enum { FL_RANDOM_UNIFORM, FL_RANDOM_NORMAL, FL_RANDOM_INT } kind;
    uint64_t seed, stream, first_index;
    double a, b;          /* uniform: low, high; normal: mean, std */
    int64_t ilow, ihigh;  /* randint */
} fl_random_spec;

/* The streams beside the compute stream (stream id 0, where every kernel
 * runs), one of each kind per device, made on first use. */
enum { FL_STREAM_COPY = 0, FL_STREAM_COMM = 1 };

struct fl_binary_kernels;      /* core/ops/binary.h */
struct fl_elementwise_kernels; /* core/ops/elementwise.h */
struct fl_linear_kernels;      /* core/ops/linear.h */
struct fl_fused_kernels;       /* core/ops/fused.h */
struct fl_optim_kernels;       /* core/optim/optim_update.h */
struct fl_device_comm_ops;     /* core/comm/dist.h */

typedef struct fl_backend {
    int abi; /* FL_BACKEND_ABI */
    const char *name;

    /* ---- the devices -------------------------------------------------- */
    /* How many devices of this kind are usable (0 without hardware or a
     * driver), and the name of device 0 or why there is none. */
    int (*device_count)(void);
    const char *(*status)(void);
    /* The kernels run on the CPU under a simulator (tests/cudasim). */
    bool simulated;

    /* ---- memory ------------------------------------------------------- */
    void *(*alloc)(int index, int64_t nbytes);
    void (*free)(int index, void *ptr, int64_t nbytes);
    /* dst and src on this device, same numel (src may broadcast: stride 0),
     * any dtypes and strides. */
    int (*copy)(fl_tensor *dst, const fl_tensor *src);
    int (*fill)(fl_tensor *t, double value);
    int (*random)(fl_tensor *t, const fl_random_spec *spec);
    /* Contiguous bytes between host memory and this device. */
    int (*to_host)(int index, void *host_dst, const void *src, int64_t nbytes);
    int (*from_host)(int index, void *dst, const void *host_src,
                     int64_t nbytes);
    /* The allocator's cache: bytes held from the system (in use included),
     * and giving the free part back (returns the bytes released). */
    int64_t (*reserved_bytes)(int index);
    int64_t (*empty_cache)(int index);
    /* Why the last alloc of this device returned NULL, into buf; NULL for
     * the generic message. */
    const char *(*describe_oom)(int index, char *buf, size_t size);
    /* Address ranges whose memory comes and goes while the addresses stay
     * (a sharded unit's gathered buffer: [Note: the gathered buffer keeps
     * its address] in core/include/fsdp.h). vm_reserve: at least nbytes of
     * addresses and no memory (*granted: the size, rounded up to the
     * device's granularity), NULL on failure; vm_commit: memory behind the
     * whole range (FL_OK, or an error naming the device); vm_decommit: the
     * memory released, the addresses kept; vm_unreserve: the addresses
     * given back (decommitted first). */
    void *(*vm_reserve)(int index, int64_t nbytes, int64_t *granted);
    int (*vm_commit)(int index, void *base, int64_t nbytes);
    void (*vm_decommit)(int index, void *base, int64_t nbytes);
    void (*vm_unreserve)(int index, void *base, int64_t nbytes);

    /* ---- streams, events, asynchronous copies --------------------------
     * NULL on a device whose work is done when its call returns (cpu).
     * Stream ids are the backend's own values, 0 the compute stream. Each
     * returns FL_OK (or non-NULL) or records an error naming the device. */
    /* Wait for everything queued on the device. */
    int (*synchronize)(int index);
    /* The side stream of kind FL_STREAM_*. */
    int (*side_stream)(int index, int which, uint64_t *stream);
    /* Later work on `waiter` runs after the work queued on `waited`. */
    int (*stream_wait_stream)(int index, uint64_t waiter, uint64_t waited);
    /* Ordering events (no timing): recorded on a stream, polled, made a
     * stream's dependency, destroyed. */
    void *(*event_record)(int index, uint64_t stream);
    bool (*event_done)(void *event);
    int (*stream_wait_event)(int index, uint64_t stream, void *event);
    void (*event_destroy)(void *event);
    /* The allocation starting at `block` is also used by `stream`: once
     * freed, it is not handed out again before the work queued there by
     * then has run. false, with the error set, for a block the device's
     * pool does not know or without host memory to note the stream. */
    bool (*record_stream)(int index, void *block, uint64_t stream);
    /* Queue a copy of nbytes between page-locked host memory (host_alloc)
     * and the device on `stream`. */
    int (*memcpy_async)(int index, uint64_t stream, void *dst, const void *src, int64_t nbytes,
                        bool to_host);
    /* Page-locked host memory the device can copy from and to without the
     * host waiting (core/tensor/pinned.c caches it); NULL with an error. */
    void *(*host_alloc)(int64_t nbytes);
    void (*host_free)(void *ptr);
    /* The public events (core/tensor/event.c), with timing if asked. */
    void *(*user_event_new)(int index, bool timing);
    void (*user_event_free)(void *event);
    int (*user_event_record)(int index, void *event);
    int (*user_event_query)(int index, void *event, bool *done);
    int (*user_event_synchronize)(int index, void *event);
    int (*user_event_elapsed)(int index, void *start, void *end, double *ms);

    /* ---- kernels ------------------------------------------------------ */
    /* One table per op family; the optimizers' NULL means the host loops
     * of core/optim, which need memory the CPU addresses (cpu). */
    const struct fl_binary_kernels *binary;
    const struct fl_elementwise_kernels *elementwise;
    const struct fl_linear_kernels *linear;
    const struct fl_fused_kernels *fused;
    const struct fl_optim_kernels *optim;
    /* Which paths scaled_dot_product_attention took (fsdp.h:
     * fl_attention_paths); NULL: it has one path only. */
    void (*attention_paths)(int64_t counts[4]);
    /* The kernel launches counted (fsdp.h: fl_kernel_launches) into
     * counts, then set back to 0 when reset. NULL: it launches none. */
    void (*kernel_launches)(int64_t counts[2], bool reset);
    /* The version of a library the backend loaded, as that library
     * reports it (fsdp.h: fl_device_library_version); -1 for one it does
     * not use. NULL: none to report. */
    int64_t (*library_version)(const char *library);

    /* ---- collectives -------------------------------------------------- */
    /* The library that moves this device's memory between ranks itself
     * (NCCL), or NULL (none, not found at run time, or FSDP_NCCL=0). */
    const struct fl_device_comm_ops *(*comm_ops)(void);
} fl_backend;

/* A backend plugin's entry point (FL_BACKEND_PLUGIN_ENTRY). */
typedef const fl_backend *(*fl_backend_entry)(void);

/* The backend of a device kind with storage, opening its plugin on first
 * use; NULL (meta; or a plugin that is not installed or cannot be loaded:
 * fl_device_status says why) with no error recorded. */
FL_PLUGIN_API const fl_backend *fl_backend_of(fl_device device);
/* The backend of the first usable device of the accelerator kind (cuda)
 * that offers pinned host memory, or NULL (none, or no device). */
const fl_backend *fl_pinning_backend(void);

extern const fl_backend fl_cpu_backend;

/* ---- scalar element access used by kernels ------------------------------ */

FL_PLUGIN_API double fl_load_f64(const void *p, fl_dtype dtype);
FL_PLUGIN_API int64_t fl_load_i64(const void *p, fl_dtype dtype);
FL_PLUGIN_API void fl_store_f64(void *p, fl_dtype dtype, double v);
FL_PLUGIN_API void fl_store_i64(void *p, fl_dtype dtype, int64_t v);

/* The value of element `index` of a random fill, as double: the generator is
 * evaluated at spec->first_index + index (rng.c documents the mapping). */
double fl_random_value(const fl_random_spec *spec, uint64_t index);
/* The same for FL_RANDOM_INT, exact over the whole int64 range. */
int64_t fl_random_int64(const fl_random_spec *spec, uint64_t index);
/* Elements index ... index + n - 1 at once, with the same bits as the
 * calls above: into f64 (uniform, normal) or i64 (int). Philox runs on
 * FL_PHILOX_LANES blocks at a time. */
void fl_random_fill(const fl_random_spec *spec, uint64_t index, int64_t n, double *f64,
                    int64_t *i64);
/* Words of Philox blocks first_block ... + FL_PHILOX_LANES - 1 under
 * (spec->seed, spec->stream): out[word][lane]. */
enum { FL_PHILOX_LANES = 8 };
void fl_philox_lanes(const fl_random_spec *spec, uint64_t first_block,
                     uint32_t out[4][FL_PHILOX_LANES]);

/* ---- autograd: what ops need to record backward nodes ------------------- */

/* An edge from a node to where the gradient of one of its inputs goes: the
 * node that produced the input (and which of its outputs), or the input
 * itself when it is a leaf that requires grad, or nowhere. */
typedef enum fl_edge_kind { FL_EDGE_NONE = 0, FL_EDGE_NODE = 1, FL_EDGE_LEAF = 2 } fl_edge_kind;

typedef struct fl_edge {
    fl_edge_kind kind;
    int32_t index;   /* output index of `node` */
    fl_node *node;   /* FL_EDGE_NODE: owned reference */
    fl_tensor *leaf; /* FL_EDGE_LEAF: owned reference */
} fl_edge;

/* Shape of an output, kept to create zero gradients for outputs that no
 * gradient reached. */
typedef struct fl_output_meta {
    int32_t ndim;
    fl_dtype dtype;
    fl_device device;
    int64_t shape[FL_MAX_DIMS];
} fl_output_meta;

typedef struct fl_node_type {
    const char *name; /* "MulBackward" */
    /* grads_out has n_outputs entries, never NULL (zeros are filled in)
     * unless null_grads below.
     * Write a new reference into grads_in[i] for each input i whose edge is
     * not FL_EDGE_NONE (leave the others NULL). Runs with grad mode off. */
    int (*backward)(fl_node *node, fl_tensor *const *grads_out, fl_tensor **grads_in);
    /* Optional, for backwards whose gradient touches a small part of their
     * input (embedding: the rows of the ids; narrow: a slice): add the
     * gradient of input `input` into `into`, a tensor the engine owns and
     * may write (the input's shape; [Note: gradients added where they
     * land] in engine.c), instead of making a new dense one. Sets *done, or
     * leaves it false to decline (then backward runs). Grad mode is off. */
    int (*backward_into)(fl_node *node, fl_tensor *const *grads_out, int input, fl_tensor *into,
                         bool *done);
    /* Optional: free node->extra. */
    void (*release)(fl_node *node);
    /* The backward takes NULL in grads_out for outputs no gradient reached
     * (instead of zeros made for it): a fused op with two outputs whose
     * kernel can skip a missing one (add_rms_norm, core/ops/norm.c). */
    bool null_grads;
} fl_node_type;

enum { FL_NODE_MAX_SAVED = 8 };

struct fl_node {
    const fl_node_type *type;
    int32_t refcount;
    /* What to do when the last reference goes (fl_node_new sets it: the
     * autograd layer's freeing). A tensor drops its grad_fn through it, so
     * core/tensor frees nodes without calling the layer above it, as it
     * reaches backends through their vtables. */
    void (*last_release)(fl_node *node);
    int32_t n_inputs, n_outputs, n_saved;
    uint64_t sequence;         /* creation order: backward runs newest first */
    fl_edge *inputs;           /* n_inputs */
    fl_output_meta *outputs;   /* n_outputs */
    fl_tensor *saved[FL_NODE_MAX_SAVED];
    double f[4];               /* op parameters */
    int64_t i[8];
    void *extra;
    int64_t lua_id;            /* nodes whose backward runs in Lua; else 0 */
    /* A backward without retain_graph ran this node and freed what it kept
     * for backward (saved tensors, a Lua node's handler): running it again
     * is refused (engine.c). */
    bool spent;
    /* Saved tensors moved to host memory by activation offload: NULL, or
     * FL_NODE_MAX_SAVED entries, packed[k] set while saved[k] is NULL
     * (core/autograd/offload.c). */
    struct fl_packed **packed;
};

extern const fl_node_type fl_lua_node_type;

/* Should an op with these inputs record a node? (grad mode on and some
 * input requires grad; NULL entries are skipped.) */
bool fl_needs_grad(int n, const fl_tensor *const *inputs);
/* A node (refcount 1, owned by the caller) with edges to `inputs`. NULL
 * with FL_ERR_OOM set on allocation failure. */
fl_node *fl_node_new(const fl_node_type *type, int n_inputs, const fl_tensor *const *inputs,
                     int n_outputs);
/* Keep t for backward (as a detached alias, so saving an op's own output
 * creates no reference cycle). Saved in order: node->saved[k]. */
void fl_node_save(fl_node *node, const fl_tensor *t);
/* Inside an offload scope, move t to pinned host memory as saved slot k of
 * node (true), or leave it to the caller (false: no scope, a cpu tensor, a
 * parameter...). Never fails: a copy that cannot be made keeps t on its
 * device. core/autograd/offload.c. */
bool fl_offload_save(fl_node *node, int k, const fl_tensor *t);
/* Bring the node's offloaded saved tensors back to their device (the
 * engine calls it just before the node's backward). */
int fl_node_unpack_saved(fl_node *node);
/* Drop the node's offloaded entries (when it is freed or has run). */
void fl_node_drop_packed(fl_node *node);
/* Record out as output `index` of node: out->grad_fn takes a reference. */
void fl_node_set_output(fl_node *node, int index, fl_tensor *out);
void fl_node_retain(fl_node *node);
void fl_node_release(fl_node *node);
/* Whether backward must produce the gradient of input i. */
static inline bool fl_node_wants(const fl_node *node, int i) {
    return node->inputs[i].kind != FL_EDGE_NONE;
}
/* Record a one-output node for an op whose inputs need grad: the common
 * tail of every op. Saves `saved` (n_saved entries, NULL allowed), sets
 * out's grad_fn, copies params. Returns FL_OK or FL_ERR_OOM. */
int fl_record(const fl_node_type *type, int n_inputs, const fl_tensor *const *inputs,
              fl_tensor *out, int n_saved, const fl_tensor *const *saved, fl_node **node_out);

/* Gradient to the shape of an input that was broadcast: sum over the
 * broadcast dims (new reference). */
fl_tensor *fl_reduce_grad_to(const fl_tensor *grad, const fl_tensor *input);

/* ---- BLAS ------------------------------------------------------------------- */

/* C = alpha * op(A) @ op(B) + beta * C in f32, row-major: op(A) is [m, k],
 * op(B) is [k, n], C is [m, n]; lda/ldb/ldc are row strides in elements
 * (of A and B as stored, before transposition). MKL or OpenBLAS
 * underneath ([Note: GEMM libraries], core/cpu/cpu_gemm.c). */
void fl_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc);
/* From this many multiply-adds (m * n * k) on, oneDNN and MKL take a
 * product; below, OpenBLAS does. */
enum { FL_CPU_LARGE_PRODUCT = 1 << 20 };
/* The GEMM libraries FSDP_CPU_GEMM / fl_cpu_gemm_use choose among, in the
 * order of their names there ("auto": each where installed). */
typedef enum fl_gemm_library {
    FL_GEMM_AUTO,
    FL_GEMM_OPENBLAS,
    FL_GEMM_ONEDNN,
    FL_GEMM_MKL
} fl_gemm_library;
/* Whether the choice lets `lib` run the products it takes. */
bool fl_cpu_gemm_allows(fl_gemm_library lib);
/* Whether oneDNN / MKL opened (once, at the first question): true with
 * *version, or false with *why (either may be NULL). */
bool fl_cpu_onednn_available(const char **version, const char **why);
bool fl_cpu_mkl_available(const char **version, const char **why);
/* Whether OpenBLAS runs kernels for narrower vectors than the CPU has (its
 * Haswell or Zen kernels on a CPU with AVX-512, as OPENBLAS_CORETYPE can
 * force), and the name of its kernels ([Note: GEMM libraries]). */
bool fl_cpu_openblas_narrow(const char **core);
/* Whether OpenBLAS runs one of its AVX-512 kernel sets (chosen when it
 * loaded: fl_cpu_isa_openblas_coretype caps it below the avx512 level). */
bool fl_cpu_openblas_wide(void);
/* Whether oneDNN opened and runs AVX-512 kernels (avx512_core or later). */
bool fl_cpu_onednn_wide(void);
/* fl_cpu_sgemm on MKL when it takes the product (B as stored, at least
 * FL_CPU_LARGE_PRODUCT multiply-adds, outside a parallel region, allowed
 * and installed): true when it ran it, false when the caller should. */
bool fl_cpu_mkl_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc);
/* One product for oneDNN: C [m, n] (row stride ldc, in c_dtype: f32 or
 * bf16) = op(A) @ op(B), plus bias [n] (f32) on every row when `bias`;
 * A and B in `dtype` (bf16, or f32 as x W^T), laid out as for
 * fl_cpu_sgemm. Accumulation is f32 and the bias joins it before the one
 * rounding to c_dtype. Zero unused fields: it is also a cache key. */
typedef struct fl_onednn_product {
    fl_dtype dtype, c_dtype;
    bool trans_a, trans_b, bias;
    bool accumulate; /* C += the product (cpu_onednn.c's pieces of a long sum) */
    int64_t m, n, k, lda, ldb, ldc;
} fl_onednn_product;
/* Whether oneDNN takes the product ([Note: GEMM libraries],
 * core/cpu/cpu_gemm.c). A pure function of *p and the library chosen:
 * the CPU matmul and its meta model ask it alike. */
bool fl_cpu_onednn_takes(const fl_onednn_product *p);
/* The f32 scratch bytes fl_cpu_onednn_gemm needs for p: an [m, n]
 * accumulator when it sums a long K in pieces into a bf16 C, else 0. */
int64_t fl_cpu_onednn_scratch(const fl_onednn_product *p);
/* Run on oneDNN a product that fl_cpu_onednn_takes accepted (bias NULL
 * unless p->bias; scratch f32 of fl_cpu_onednn_scratch(p) bytes, or NULL
 * when that is 0); FL_OK, or an error naming the product. */
int fl_cpu_onednn_gemm(const fl_onednn_product *p, const void *a, const void *b, const float *bias,
                       void *c, float *scratch);

/* ---- what every op shares (core/ops/op_common.c) --------------------------- */

/* A new output: without storage (meta stays meta, fake stays fake) when
 * no_storage, else allocated on device. */
fl_tensor *fl_op_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                        bool no_storage);
/* Numpy broadcasting of n tensors' shapes; fails naming op and shapes. */
int fl_broadcast_shape(const char *op, int n, const fl_tensor *const *ts, int *ndim,
                       int64_t *shape);
/* A header-only view of t with shape (ndim, shape), stride 0 where t is
 * broadcast (for kernels; never retained or released). */
void fl_broadcast_view(const fl_tensor *t, int ndim, const int64_t *shape, fl_tensor *view);
/* The dtype two operands meet at: floats over integers, wider over
 * narrower, f16 with bf16 at f32, different integers at i64. */
fl_dtype fl_promote(fl_dtype a, fl_dtype b);
/* Fail unless all tensors share one device (naming op and the devices). */
int fl_same_device(const char *op, int n, const fl_tensor *const *ts);
/* Record "op: no kernel for device X in this build" and return NULL. */
const void *fl_no_kernel(const char *op, fl_device device);

/* ---- FLOP accounting ----------------------------------------------------- */

/* (fl_flops_add is public: fsdp.h.) */
/* a * b for FLOP counts, saturating at INT64_MAX instead of overflowing:
 * the factors are sizes of valid shapes, but their products (m * n * k of
 * a matmul on meta tensors of any size) are not bounded by any one shape. */
static inline int64_t fl_flops_mul(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}
static inline int64_t fl_flops_sum(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

/* [Note: bytes moved]
 * Every memory-bound op calls fl_count_bytes once per kernel it runs (on
 * meta too, before the storage check), with the tensors that kernel reads
 * and writes: its inputs as they are (a broadcast operand at its own size,
 * since a kernel reads it from cache after the first time) and its
 * outputs, NULL for an absent one. Gradient accumulation counts as the add
 * it is; copies and casts on one device count source and destination
 * (copies between devices are not counted: they cross a link); tensors made
 * from host values (fl_from_host, rope tables) count what is written, on
 * meta too. The counter
 * (core/tensor/bytes_moved.c) is what the plan's cost model divides by memory
 * bandwidth and what benchmarks/step_bytes.lua tabulates per op. */
void fl_count_bytes(const char *op, int n, const fl_tensor *const *ts);

#endif /* FL_INTERNAL_H */
