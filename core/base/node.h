/*
 * node.h: the autograd tape's nodes as ops record them and tensors hold
 * them (grad_fn): edges, node types, saved tensors, and the recording API
 * (core/tape/node.c, core/tape/offload.c). The engine that runs them is
 * core/autograd. Here, in base, because core/tensor drops a tensor's node
 * without calling the layers above it ([Note: the device interface]).
 */
#ifndef FL_NODE_H
#define FL_NODE_H

#include "fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

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
     * (core/tape/offload.c). */
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
 * device. core/tape/offload.c. */
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

#ifdef __cplusplus
}
#endif

#endif /* FL_NODE_H */
