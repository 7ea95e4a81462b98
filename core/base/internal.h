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

/* ---- errors ------------------------------------------------------------ */

/* Record an error for this thread and return `status` (so callers can write
 * `return fl_fail(FL_ERR_ARG, "narrow: ...", ...)`). */
int fl_fail(fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Same, for functions that return a pointer: records and returns NULL. */
#define FL_FAIL_NULL(status, ...) (fl_fail((status), __VA_ARGS__), (void *)0)

/* Broken internal invariant: not a user mistake. Abort with location. */
#define FL_ASSERT(cond)                                                       \
    do {                                                                      \
        if (!(cond)) fl_abort(__FILE__, __LINE__, #cond);                     \
    } while (0)
void fl_abort(const char *file, int line, const char *what)
    __attribute__((noreturn));

/* ---- files ------------------------------------------------------------- */

/* fsync the directory holding `path` (after a rename into it). */
int fl_sync_parent_dir(const char *path);

/* ---- shapes ------------------------------------------------------------ */

/* Normalise a possibly negative dim against ndim (ndim_extra lets unsqueeze
 * accept dim == ndim). Returns the dim or -1 after recording an error that
 * names `op` and the tensor's shape. */
int fl_wrap_dim(const char *op, const fl_tensor *t, int dim, int ndim_extra);
/* Validate ndim and sizes for a new tensor; computes numel. */
int fl_check_shape(const char *op, int ndim, const int64_t *shape,
                   int64_t *numel);
/* "[3, 4]" of a tensor into a caller buffer (for messages). */
const char *fl_shape_str(const fl_tensor *t, char *buf, size_t size);
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
     * allocator storage gets one in fl_storage_new, other storage 0.
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
/* Fail unless t is non-NULL and, if need_data, has host-usable storage. */
int fl_check_tensor(const char *op, const fl_tensor *t, bool need_data);

/* ---- pinned host memory (core/tensor/pinned.c) ------------------------- */

/* Whether s came from the pinned host pool (a cpu storage). */
bool fl_storage_is_pinned(const fl_storage *s);
/* Pinned storage of nbytes on the cpu device; NULL with an error naming
 * `op` without a CUDA device or when out of memory. */
fl_storage *fl_pinned_storage_new(const char *op, int64_t nbytes);
/* Queue a copy of nbytes between pinned host memory (inside the storage
 * `pinned`) and memory of cuda `device` on its compute stream, and record
 * the use so the pinned block is not reused before the copy ran. */
int fl_pinned_copy_async(fl_device device, void *dst, const void *src, int64_t nbytes,
                         bool to_host, fl_storage *pinned);

/* ---- allocators and memory statistics ---------------------------------- */

/* Account for an allocation of nbytes on device; fails (FL_ERR_OOM, with a
 * message naming the device, the request and the statistics) when a limit
 * would be exceeded. Call fl_memory_note_free when it is returned. */
int fl_memory_note_alloc(fl_device device, int64_t nbytes);
void fl_memory_note_free(fl_device device, int64_t nbytes);
void fl_memory_note_failure(fl_device device);

/* The CPU's caching allocator (core/cpu/cpu_alloc.c): 64-byte aligned
 * blocks; fl_cpu_free must get the size the block was allocated with. */
void *fl_cpu_alloc(int64_t nbytes);
void fl_cpu_free(void *ptr, int64_t nbytes);
int64_t fl_cpu_reserved_bytes(void);
int64_t fl_cpu_empty_cache(void);

/* ---- backends: one vtable per device kind ------------------------------ */

/* What a random fill generates: distribution, key and parameters. */
typedef struct fl_random_spec {
    enum { FL_RANDOM_UNIFORM, FL_RANDOM_NORMAL, FL_RANDOM_INT } kind;
    uint64_t seed, stream, first_index;
    double a, b;          /* uniform: low, high; normal: mean, std */
    int64_t ilow, ihigh;  /* randint */
} fl_random_spec;

typedef struct fl_backend {
    const char *name;
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
     * its address] in core/fsdp/unit.c). vm_reserve: at least nbytes of
     * addresses and no memory (*granted: the size, rounded up to the
     * device's granularity), NULL on failure; vm_commit: memory behind the
     * whole range (FL_OK, or an error naming the device); vm_decommit: the
     * memory released, the addresses kept; vm_unreserve: the addresses
     * given back (decommitted first). */
    void *(*vm_reserve)(int index, int64_t nbytes, int64_t *granted);
    int (*vm_commit)(int index, void *base, int64_t nbytes);
    void (*vm_decommit)(int index, void *base, int64_t nbytes);
    void (*vm_unreserve)(int index, void *base, int64_t nbytes);
} fl_backend;

/* The backend of a device kind with storage, or NULL (meta, or cuda when the
 * build lacks it). */
const fl_backend *fl_backend_of(fl_device device);

extern const fl_backend fl_cpu_backend;
#ifdef FL_HAVE_CUDA
extern const fl_backend fl_cuda_backend;
#endif

/* ---- scalar element access used by kernels ------------------------------ */

double fl_load_f64(const void *p, fl_dtype dtype);
int64_t fl_load_i64(const void *p, fl_dtype dtype);
void fl_store_f64(void *p, fl_dtype dtype, double v);
void fl_store_i64(void *p, fl_dtype dtype, int64_t v);

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
    /* grads_out has n_outputs entries, never NULL (zeros are filled in).
     * Write a new reference into grads_in[i] for each input i whose edge is
     * not FL_EDGE_NONE (leave the others NULL). Runs with grad mode off. */
    int (*backward)(fl_node *node, fl_tensor *const *grads_out, fl_tensor **grads_in);
    /* Optional: free node->extra. */
    void (*release)(fl_node *node);
} fl_node_type;

enum { FL_NODE_MAX_SAVED = 8 };

struct fl_node {
    const fl_node_type *type;
    int32_t refcount;
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
 * (of A and B as stored, before transposition). OpenBLAS underneath. */
void fl_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc);

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

void fl_flops_add(int64_t n);
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

#endif /* FL_INTERNAL_H */
