/*
 * node.c: the tape's nodes and the autograd state of tensors: grad mode,
 * requires_grad, .grad, detach, and nodes whose backward runs in Lua.
 *
 * [Note: autograd references]
 * A tensor produced by an op owns a reference to its grad_fn node; a node
 * owns references to the nodes (or leaf tensors) its input gradients flow
 * to, and to the tensors it saved. Saved tensors are detached aliases, so a
 * node that saves its own output (softmax, exp) makes no cycle. Releasing a
 * long chain of nodes is iterative (a worklist), not recursive, so a deep
 * model's graph cannot overflow the C stack when it is dropped.
 */
#include "error.h"
#include "shape.h"
#include "storage.h"
#include "flops.h"
#include "node.h"

#include <stdatomic.h>
#include <string.h>

static _Thread_local bool grad_disabled; /* grad mode is on by default */
static _Atomic uint64_t next_sequence = 1;

bool fl_grad_enabled(void) { return !grad_disabled; }

bool fl_set_grad_enabled(bool enabled) {
    bool previous = !grad_disabled;
    grad_disabled = !enabled;
    return previous;
}

bool fl_requires_grad(const fl_tensor *t) {
    return t && (t->flags & FL_TENSOR_REQUIRES_GRAD);
}

int fl_requires_grad_(fl_tensor *t, bool requires_grad) {
    if (fl_check_tensor("requires_grad_", t, false)) return fl_last_status();
    if (t->grad_fn)
        return fl_fail(FL_ERR_ARG, "requires_grad_: only leaf tensors can change requires_grad "
                                   "(this one was computed by %s; detach() it first)",
                       t->grad_fn->type->name);
    if (requires_grad && !fl_dtype_is_float(t->dtype))
        return fl_fail(FL_ERR_ARG, "requires_grad_: only floating point tensors can require "
                                   "grad, not %s", fl_dtype_name(t->dtype));
    if (requires_grad && t->storage) t->storage->holds_params = true; /* see offload.c */
    if (requires_grad)
        t->flags |= FL_TENSOR_REQUIRES_GRAD;
    else
        t->flags &= ~(uint32_t)FL_TENSOR_REQUIRES_GRAD;
    return FL_OK;
}

fl_tensor *fl_grad(const fl_tensor *t) {
    return t ? fl_tensor_retain(t->grad) : NULL;
}

int fl_set_grad(fl_tensor *t, fl_tensor *grad) {
    if (fl_check_tensor("set_grad", t, false)) return fl_last_status();
    if (grad) {
        bool same = grad->ndim == t->ndim && grad->device == t->device;
        for (int d = 0; same && d < t->ndim; d++) same = grad->shape[d] == t->shape[d];
        if (!same) {
            char a[128], b[128], da[32], db[32];
            fl_device_format(grad->device, da, sizeof da);
            fl_device_format(t->device, db, sizeof db);
            return fl_fail(FL_ERR_ARG, "set_grad: gradient of shape %s on %s for a tensor of shape "
                                       "%s on %s",
                           fl_shape_str(grad, a, sizeof a), da, fl_shape_str(t, b, sizeof b), db);
        }
        fl_tensor_retain(grad);
    }
    fl_tensor_release(t->grad);
    t->grad = grad;
    return FL_OK;
}

fl_tensor *fl_detach(const fl_tensor *t) {
    if (fl_check_tensor("detach", t, false)) return NULL;
    fl_tensor *d = fl_tensor_view_of(t, t->ndim, t->shape, t->stride, t->offset);
    if (d) d->flags &= ~(uint32_t)FL_TENSOR_REQUIRES_GRAD;
    return d;
}

const char *fl_grad_fn_name(const fl_tensor *t) {
    return t && t->grad_fn ? t->grad_fn->type->name : NULL;
}

/* ---- nodes -------------------------------------------------------------- */

bool fl_needs_grad(int n, const fl_tensor *const *inputs) {
    if (grad_disabled) return false;
    for (int i = 0; i < n; i++)
        if (fl_requires_grad(inputs[i])) return true;
    return false;
}

static void release_last(fl_node *node);

fl_node *fl_node_new(const fl_node_type *type, int n_inputs, const fl_tensor *const *inputs,
                     int n_outputs) {
    fl_node *node = calloc(1, sizeof *node);
    fl_edge *edges = calloc((size_t)(n_inputs > 0 ? n_inputs : 1), sizeof *edges);
    fl_output_meta *outs = calloc((size_t)(n_outputs > 0 ? n_outputs : 1), sizeof *outs);
    if (!node || !edges || !outs) {
        free(node);
        free(edges);
        free(outs);
        return FL_FAIL_NULL(FL_ERR_OOM, "out of CPU memory for an autograd node");
    }
    node->type = type;
    node->refcount = 1;
    node->last_release = release_last;
    node->n_inputs = n_inputs;
    node->n_outputs = n_outputs;
    node->inputs = edges;
    node->outputs = outs;
    node->sequence = atomic_fetch_add(&next_sequence, 1);
    for (int i = 0; i < n_inputs; i++) {
        fl_tensor *in = (fl_tensor *)inputs[i];
        if (!fl_requires_grad(in)) continue;
        if (in->grad_fn) {
            edges[i].kind = FL_EDGE_NODE;
            edges[i].node = in->grad_fn;
            edges[i].index = in->output_index;
            fl_node_retain(in->grad_fn);
        } else {
            edges[i].kind = FL_EDGE_LEAF;
            edges[i].leaf = fl_tensor_retain(in);
        }
    }
    return node;
}

void fl_node_save(fl_node *node, const fl_tensor *t) {
    FL_ASSERT(node->n_saved < FL_NODE_MAX_SAVED);
    int k = node->n_saved++;
    /* Inside an offload scope a device tensor may go to host memory
     * instead (offload.c); the engine brings it back before backward. */
    if (t && fl_offload_save(node, k, t)) return;
    fl_tensor *alias = t ? fl_detach(t) : NULL;
    FL_ASSERT(t == NULL || alias != NULL);
    node->saved[k] = alias;
}

void fl_node_set_output(fl_node *node, int index, fl_tensor *out) {
    FL_ASSERT(index >= 0 && index < node->n_outputs && out->grad_fn == NULL);
    fl_output_meta *m = &node->outputs[index];
    m->ndim = out->ndim;
    m->dtype = out->dtype;
    m->device = out->device;
    memcpy(m->shape, out->shape, sizeof m->shape);
    fl_node_retain(node);
    out->grad_fn = node;
    out->output_index = index;
    out->flags |= FL_TENSOR_REQUIRES_GRAD;
}

int fl_record(const fl_node_type *type, int n_inputs, const fl_tensor *const *inputs,
              fl_tensor *out, int n_saved, const fl_tensor *const *saved, fl_node **node_out) {
    fl_node *node = fl_node_new(type, n_inputs, inputs, 1);
    if (!node) return fl_last_status();
    for (int k = 0; k < n_saved; k++) fl_node_save(node, saved[k]);
    fl_node_set_output(node, 0, out);
    if (node_out) *node_out = node; /* borrowed: out holds the reference */
    fl_node_release(node);
    return FL_OK;
}

void fl_node_retain(fl_node *node) {
    if (node) __atomic_fetch_add(&node->refcount, 1, __ATOMIC_RELAXED);
}

/* Lua nodes dropped without backward: their ids wait here for Lua. */
enum { RELEASED_CAPACITY = 4096 };
static int64_t released_ids[RELEASED_CAPACITY];
static int released_count;

/* Iterative release: nodes whose count reaches zero are queued, and
 * freeing one only queues its children, so the C stack stays flat. */
static _Thread_local fl_node **pending;
static _Thread_local int pending_len, pending_cap;
static _Thread_local bool releasing;

static void free_node(fl_node *node) {
    if (node->type->release) node->type->release(node);
    if (node->lua_id && released_count < RELEASED_CAPACITY)
        released_ids[released_count++] = node->lua_id;
    for (int k = 0; k < node->n_saved; k++) fl_tensor_release(node->saved[k]);
    fl_node_drop_packed(node);
    for (int i = 0; i < node->n_inputs; i++) {
        fl_edge *e = &node->inputs[i];
        if (e->kind == FL_EDGE_LEAF) fl_tensor_release(e->leaf);
        if (e->kind == FL_EDGE_NODE) fl_node_release(e->node); /* queued, not recursive */
    }
    free(node->inputs);
    free(node->outputs);
    free(node);
}

/* The last reference is gone (node->last_release). */
static void release_last(fl_node *node) {
    if (pending_len == pending_cap) {
        int cap = pending_cap ? 2 * pending_cap : 64;
        fl_node **grown = realloc(pending, (size_t)cap * sizeof *grown);
        FL_ASSERT(grown != NULL);
        pending = grown;
        pending_cap = cap;
    }
    pending[pending_len++] = node;
    if (releasing) return; /* the outer loop below will free it */
    releasing = true;
    while (pending_len > 0) free_node(pending[--pending_len]);
    releasing = false;
}

void fl_node_release(fl_node *node) {
    if (!node) return;
    int32_t left = __atomic_sub_fetch(&node->refcount, 1, __ATOMIC_ACQ_REL);
    FL_ASSERT(left >= 0);
    if (left == 0) release_last(node);
}

/* ---- nodes whose backward runs in Lua ----------------------------------- */

static int lua_node_backward(fl_node *node, fl_tensor *const *grads_out, fl_tensor **grads_in) {
    (void)grads_out;
    (void)grads_in;
    return fl_fail(FL_ERR_STATE, "backward reached %s, a node implemented in Lua: run backward "
                                 "from Lua (tensor:backward()), not fl_backward",
                   node->type->name);
}

const fl_node_type fl_lua_node_type = {.name = "LuaBackward", .backward = lua_node_backward};

typedef struct lua_node_extra {
    fl_node_type type; /* per node, to carry the Lua-given name */
    char name[64];
} lua_node_extra;

static void lua_node_release(fl_node *node) { free(node->extra); }

int fl_lua_node_attach(int64_t lua_id, const char *name, int n_inputs,
                       fl_tensor *const *inputs, int n_outputs, fl_tensor *const *outputs) {
    if (lua_id == 0) return fl_fail(FL_ERR_ARG, "lua_node_attach: id 0 is reserved");
    for (int k = 0; k < n_outputs; k++) {
        if (fl_check_tensor("lua_node_attach", outputs[k], false)) return fl_last_status();
        if (outputs[k]->grad_fn)
            return fl_fail(FL_ERR_ARG, "lua_node_attach: output %d already has grad_fn %s "
                                       "(detach it first)", k, outputs[k]->grad_fn->type->name);
    }
    if (!fl_needs_grad(n_inputs, (const fl_tensor *const *)inputs)) return FL_OK;
    lua_node_extra *extra = calloc(1, sizeof *extra);
    if (!extra) return fl_fail(FL_ERR_OOM, "out of CPU memory for an autograd node");
    snprintf(extra->name, sizeof extra->name, "%s", name && *name ? name : "LuaBackward");
    extra->type = fl_lua_node_type;
    extra->type.name = extra->name;
    extra->type.release = lua_node_release;
    fl_node *node = fl_node_new(&extra->type, n_inputs, (const fl_tensor *const *)inputs,
                                n_outputs);
    if (!node) {
        free(extra);
        return fl_last_status();
    }
    node->extra = extra;
    node->lua_id = lua_id;
    for (int k = 0; k < n_outputs; k++) fl_node_set_output(node, k, outputs[k]);
    fl_node_release(node);
    return FL_OK;
}

int fl_lua_nodes_released(int64_t *ids, int max) {
    int n = released_count < max ? released_count : max;
    memcpy(ids, released_ids + released_count - n, (size_t)n * sizeof *ids);
    released_count -= n;
    return n;
}

/* ---- FLOPs ---------------------------------------------------------------- */

static _Atomic int64_t flop_count;

/* Saturating: counts of huge meta models stop at INT64_MAX, never wrap. */
void fl_flops_add(int64_t n) {
    int64_t old = atomic_load(&flop_count), sum;
    do {
        sum = fl_flops_sum(old, n);
    } while (!atomic_compare_exchange_weak(&flop_count, &old, sum));
}
int64_t fl_flops(void) { return atomic_load(&flop_count); }
void fl_flops_reset(void) { atomic_store(&flop_count, 0); }
int64_t fl_flops_exchange(int64_t count) { return atomic_exchange(&flop_count, count); }
