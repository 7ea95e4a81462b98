/*
 * engine.c: backpropagation over the tape.
 *
 * From the roots, the engine discovers the nodes that gradients reach,
 * counts for each how many edges feed it, and runs a node once all of them
 * have delivered (its gradient buffers are complete), newest node first
 * among the ready ones (a max-heap on creation order: that is reverse
 * execution order, the order the sharding layer's prefetching expects).
 * Gradients reaching a leaf are accumulated into its .grad. A node's saved
 * tensors and buffers are freed as soon as it has run (unless the caller
 * asked to retain the graph, as PyTorch's retain_graph=True); saved tensors
 * that activation offload moved to host memory come back just before it
 * runs.
 *
 * [Note: spent nodes]
 * A node whose saved state was freed is marked spent; a later backward
 * that reaches it fails with PyTorch's message instead of handing the
 * backward formula NULL saved tensors. The check is here, once, so every
 * node type (C or Lua) is covered and no formula checks its own inputs.
 * Nodes that keep no values for backward (add; views, whose saved meta
 * tensor only carries a shape) are not marked: backpropagating through
 * them twice is well defined, as in PyTorch.
 *
 * Nodes implemented in Lua pause the engine: fl_engine_step returns
 * FL_ENGINE_LUA_NODE with the node's output gradients, and the caller
 * resumes it with fl_engine_provide. C never calls into Lua.
 */
#include "error.h"
#include "shape.h"
#include "storage.h"
#include "node.h"

#include <string.h>
#include <time.h>

/* ---- spans of backward nodes (fl_engine_record_spans) -------------------- */

/* The engine runs on the thread that called backward; profilers record on
 * that thread too, so the buffer is plain process state. */
static fl_node_span *spans;
static int span_cap, span_len;
static int64_t spans_dropped;

static void span_events_free(fl_node_span *sp) {
    fl_event_free(sp->device_start);
    fl_event_free(sp->device_end);
    sp->device_start = sp->device_end = NULL;
}

int fl_engine_record_spans(int capacity) {
    if (capacity < 0)
        return fl_fail(FL_ERR_ARG, "record spans: capacity %d is negative (0 stops)", capacity);
    for (int i = 0; i < span_len; i++) span_events_free(&spans[i]);
    free(spans);
    spans = NULL;
    span_cap = span_len = 0;
    spans_dropped = 0;
    if (capacity == 0) return FL_OK;
    spans = calloc((size_t)capacity, sizeof *spans);
    if (!spans) return fl_fail(FL_ERR_OOM, "record spans: out of CPU memory for %d spans", capacity);
    span_cap = capacity;
    return FL_OK;
}

int fl_engine_take_spans(fl_node_span *out, int max, int64_t *dropped) {
    int n = span_len < max ? span_len : max;
    if (n > 0) {
        memcpy(out, spans, (size_t)n * sizeof *spans);
        memmove(spans, spans + n, (size_t)(span_len - n) * sizeof *spans);
        span_len -= n;
    }
    if (dropped) *dropped = spans_dropped;
    spans_dropped = 0;
    return n;
}

static double wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* A timing event recorded now on the device of the node's incoming
 * gradient, when that device queues work (cuda); NULL otherwise or when
 * the event cannot be made (the span then has host time only). */
static fl_event *device_mark(fl_tensor *const *incoming, int n) {
    for (int i = 0; i < n; i++) {
        if (!incoming[i]) continue;
        if (fl_device_kind_of(incoming[i]->device) != FL_DEVICE_CUDA) return NULL;
        fl_event *e = fl_event_new(incoming[i]->device, true);
        if (e && fl_event_record(e) != FL_OK) {
            fl_event_free(e);
            e = NULL;
        }
        if (!e) fl_clear_error();
        return e;
    }
    return NULL;
}

static void record_span(const fl_node *node, double t0, int64_t flops0, fl_tensor *const *grads,
                        fl_event *device_start) {
    if (span_len == span_cap) {
        spans_dropped++;
        fl_event_free(device_start);
        return;
    }
    fl_node_span *sp = &spans[span_len++];
    memset(sp, 0, sizeof *sp);
    sp->device_start = device_start;
    sp->device_end = device_start ? device_mark(grads, node->n_inputs) : NULL;
    if (!sp->device_end) span_events_free(sp);
    sp->name = node->type->name;
    sp->start_us = t0;
    sp->duration_us = wall_us() - t0;
    sp->flops = fl_flops() - flops0;
    sp->dtype = FL_F32;
    sp->device = fl_device_make(FL_DEVICE_CPU, 0);
    bool first = true;
    for (int i = 0; i < node->n_inputs; i++) {
        const fl_tensor *g = grads[i];
        if (!g) continue;
        sp->bytes += g->numel * (int64_t)fl_dtype_size(g->dtype);
        if (first) {
            first = false;
            sp->dtype = g->dtype;
            sp->ndim = g->ndim;
            memcpy(sp->shape, g->shape, (size_t)g->ndim * sizeof *g->shape);
            sp->device = g->device;
        }
    }
    fl_memory_stats st;
    if (fl_memory_stats_get(sp->device, &st) == FL_OK) sp->in_use = st.in_use;
}

typedef struct node_state {
    fl_node *node;
    int32_t deps;          /* edges still to deliver */
    fl_tensor **buffers;   /* n_outputs accumulated gradients */
} node_state;

/* ---- node lookup: open addressing on the node pointer ------------------- */

typedef struct node_map {
    fl_node **keys;
    int *values;
    int cap;
} node_map;

static size_t hash_ptr(const void *p) { return ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull; }

static int map_get(const node_map *m, const fl_node *n) {
    if (m->cap == 0) return -1;
    for (size_t i = hash_ptr(n) & (size_t)(m->cap - 1);; i = (i + 1) & (size_t)(m->cap - 1)) {
        if (m->keys[i] == n) return m->values[i];
        if (!m->keys[i]) return -1;
    }
}

static void map_put(node_map *m, fl_node *n, int v) {
    size_t i = hash_ptr(n) & (size_t)(m->cap - 1);
    while (m->keys[i]) i = (i + 1) & (size_t)(m->cap - 1);
    m->keys[i] = n;
    m->values[i] = v;
}

struct fl_engine {
    node_state *states;    /* one per discovered node */
    int n_states, cap_states;
    int *heap;             /* indices into states, max-heap on sequence */
    int heap_len;
    node_map map;          /* node -> index in states */
    int pending;           /* state index of the Lua node awaiting provide, or -1 */
    bool failed;
    bool retain_graph;     /* keep saved tensors: the graph can run again */
    bool started;          /* fl_engine_step was called */
};

/* ---- heap ------------------------------------------------------------------ */

static bool newer(const fl_engine *e, int a, int b) {
    return e->states[a].node->sequence > e->states[b].node->sequence;
}

static void heap_push(fl_engine *e, int s) {
    int i = e->heap_len++;
    e->heap[i] = s;
    while (i > 0 && newer(e, e->heap[i], e->heap[(i - 1) / 2])) {
        int p = (i - 1) / 2, tmp = e->heap[p];
        e->heap[p] = e->heap[i];
        e->heap[i] = tmp;
        i = p;
    }
}

static int heap_pop(fl_engine *e) {
    int top = e->heap[0];
    e->heap[0] = e->heap[--e->heap_len];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, best = i;
        if (l < e->heap_len && newer(e, e->heap[l], e->heap[best])) best = l;
        if (r < e->heap_len && newer(e, e->heap[r], e->heap[best])) best = r;
        if (best == i) break;
        int tmp = e->heap[best];
        e->heap[best] = e->heap[i];
        e->heap[i] = tmp;
        i = best;
    }
    return top;
}

/* ---- gradient accumulation ---------------------------------------------------- */

/* *slot += g (taking g's reference; the first gradient is kept as is, later
 * ones are added into a private copy). */
static int accumulate(fl_tensor **slot, fl_tensor *g) {
    if (!*slot) {
        *slot = g;
        return FL_OK;
    }
    fl_tensor *sum = fl_binary(FL_ADD, *slot, g);
    fl_tensor_release(g);
    if (!sum) return fl_last_status();
    fl_tensor_release(*slot);
    *slot = sum;
    return FL_OK;
}

/* Whether g can become a .grad as it is: nobody else references it or its
 * storage, it is dense, covers its whole storage, and has the leaf's dtype
 * and device. (Most gradients are: a backward kernel's fresh output.) */
static bool can_adopt(const fl_tensor *leaf, const fl_tensor *g) {
    /* (a meta gradient is adopted by the same rule, through the bytes it
     * stands for: [Note: virtual storage]) */
    const fl_storage *s = g->storage ? g->storage : g->virtual_storage;
    return g->refcount == 1 && s && s->refcount == 1 && g->grad_fn == NULL && g->offset == 0 &&
           fl_tensor_is_contiguous(g) && g->dtype == leaf->dtype && g->device == leaf->device &&
           g->numel * (int64_t)fl_dtype_size(g->dtype) == s->nbytes;
}

/* leaf.grad += g. A new .grad is a private contiguous tensor: g itself when
 * it can be adopted, else a copy (g may be a broadcast view or shared with
 * another gradient). */
static int accumulate_leaf(fl_tensor *leaf, fl_tensor *g) {
    int rc;
    if (!leaf->grad && can_adopt(leaf, g)) {
        rc = fl_set_grad(leaf, g);
    } else if (!leaf->grad) {
        fl_tensor *own = fl_to(g, leaf->dtype, leaf->device);
        fl_tensor *dense = own && (own == g || !fl_tensor_is_contiguous(own)) ? fl_clone(own) : own;
        if (own && dense != own) fl_tensor_release(own);
        rc = dense ? fl_set_grad(leaf, dense) : (int)fl_last_status();
        fl_tensor_release(dense);
    } else {
        rc = fl_add_scaled_(leaf->grad, g, 1.0);
    }
    fl_tensor_release(g);
    return rc;
}

/* ---- gradients added where they land ------------------------------------------ */

/* [Note: gradients added where they land]
 * A tensor used twice gets two gradients, summed where they meet (a
 * node's buffer, accumulate; a leaf's .grad, accumulate_leaf). When one
 * of them comes from a backward that touches a small part of its input
 * (embedding: the rows of its ids; narrow: a slice) and the other has
 * already arrived, making the first as a dense zero-filled tensor only to
 * add it to the second costs a full-size allocation, fill and sum for a
 * few rows' worth of values: for GPT-2's tied embedding, 154 MB of zeros
 * and a 154 MB sum per step. Such nodes offer backward_into, and the
 * engine hands them the destination to add into when it may write it:
 * a leaf's .grad (accumulate_leaf adds into it in place anyway, as
 * PyTorch's AccumulateGrad does), or a node's buffer that nothing else
 * references (the rule for adopting a gradient as .grad, can_adopt). The
 * sum is the same; only its rounding order can differ (the new values are
 * added to the old instead of to zeros first), within float tolerance.
 * Meta and fake tensors take the same path, so the planner's trace sees
 * the memory a real step uses. */

/* Whether the engine may write t in place: no other reference to it or
 * its storage, dense over its whole storage (the rule of can_adopt,
 * without the leaf). */
static bool owned(const fl_tensor *t) {
    const fl_storage *s = t->storage ? t->storage : t->virtual_storage;
    return t->refcount == 1 && s && s->refcount == 1 && t->grad_fn == NULL && t->offset == 0 &&
           fl_tensor_is_contiguous(t) && t->numel * (int64_t)fl_dtype_size(t->dtype) == s->nbytes;
}

static bool same_shape(const fl_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return false;
    return true;
}

static int state_of(const fl_engine *e, const fl_node *n);

/* The gradient already waiting where the gradient along `edge` goes, when
 * it can be written in place; NULL otherwise. */
static fl_tensor *destination(fl_engine *e, const fl_edge *edge) {
    if (edge->kind == FL_EDGE_LEAF) {
        fl_tensor *leaf = edge->leaf, *g = leaf->grad;
        return g && fl_tensor_is_contiguous(g) && g->dtype == leaf->dtype &&
                       g->device == leaf->device && same_shape(g, leaf->ndim, leaf->shape)
                   ? g
                   : NULL;
    }
    if (edge->kind != FL_EDGE_NODE) return NULL;
    node_state *next = &e->states[state_of(e, edge->node)];
    fl_tensor *b = next->buffers[edge->index];
    const fl_output_meta *m = &edge->node->outputs[edge->index];
    return b && owned(b) && b->dtype == m->dtype && b->device == m->device &&
                   same_shape(b, m->ndim, m->shape)
               ? b
               : NULL;
}

/* The node's backward: into the destination of its one wanted input when
 * the node offers that and the destination allows it, else as usual. */
static int run_backward(fl_engine *e, fl_node *node, fl_tensor *const *grads_out,
                        fl_tensor **grads_in) {
    if (node->type->backward_into) {
        int input = -1;
        for (int i = 0; i < node->n_inputs; i++) {
            if (!fl_node_wants(node, i)) continue;
            input = input == -1 ? i : -2;
        }
        fl_tensor *into = input >= 0 ? destination(e, &node->inputs[input]) : NULL;
        if (into) {
            bool done = false;
            int rc = node->type->backward_into(node, grads_out, input, into, &done);
            if (rc != FL_OK || done) return rc;
        }
    }
    return node->type->backward(node, grads_out, grads_in);
}

/* ---- discovery ----------------------------------------------------------------- */

static int add_state(fl_engine *e, fl_node *n) {
    if (e->n_states == e->cap_states) {
        int cap = e->cap_states ? 2 * e->cap_states : 64;
        node_state *grown = realloc(e->states, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        e->states = grown;
        e->cap_states = cap;
    }
    int s = e->n_states++;
    e->states[s] = (node_state){.node = n, .deps = 0,
                                .buffers = calloc((size_t)n->n_outputs, sizeof(fl_tensor *))};
    if (!e->states[s].buffers) return -1;
    fl_node_retain(n);
    map_put(&e->map, n, s);
    return s;
}

/* Keep the map at most half full (linear probing stays short). */
static int reserve_map(fl_engine *e) {
    node_map *m = &e->map;
    if (m->cap && 2 * (e->n_states + 1) <= m->cap) return FL_OK;
    int cap = m->cap ? 2 * m->cap : 1024;
    node_map bigger = {calloc((size_t)cap, sizeof(fl_node *)), calloc((size_t)cap, sizeof(int)), cap};
    if (!bigger.keys || !bigger.values) {
        free(bigger.keys);
        free(bigger.values);
        return FL_ERR_OOM;
    }
    for (int k = 0; k < m->cap; k++)
        if (m->keys[k]) map_put(&bigger, m->keys[k], m->values[k]);
    free(m->keys);
    free(m->values);
    *m = bigger;
    return FL_OK;
}

/* Find every node reachable from the roots and count incoming edges. */
static int discover(fl_engine *e, int n_roots, fl_tensor *const *roots) {
    int *stack = NULL, len = 0, stack_cap = 0;
    bool oom = reserve_map(e) != FL_OK;
    for (int r = 0; !oom && r < n_roots; r++) {
        fl_node *n = roots[r]->grad_fn;
        if (!n || map_get(&e->map, n) >= 0) continue;
        int s = add_state(e, n);
        oom = s < 0;
        for (int cur_state = s; !oom && cur_state >= 0; cur_state = len > 0 ? stack[--len] : -1) {
            fl_node *cur = e->states[cur_state].node;
            for (int i = 0; !oom && i < cur->n_inputs; i++) {
                if (cur->inputs[i].kind != FL_EDGE_NODE) continue;
                fl_node *next = cur->inputs[i].node;
                int t = map_get(&e->map, next);
                if (t < 0) {
                    if (reserve_map(e) != FL_OK || (t = add_state(e, next)) < 0) {
                        oom = true;
                        break;
                    }
                    if (len == stack_cap) {
                        stack_cap = stack_cap ? 2 * stack_cap : 256;
                        int *grown = realloc(stack, (size_t)stack_cap * sizeof *stack);
                        if (!grown) { oom = true; break; }
                        stack = grown;
                    }
                    stack[len++] = t;
                }
                e->states[t].deps++;
            }
        }
    }
    free(stack);
    if (oom) return fl_fail(FL_ERR_OOM, "backward: out of CPU memory for the graph");
    return FL_OK;
}

/* ---- the engine -------------------------------------------------------------------- */

static int state_of(const fl_engine *e, const fl_node *n) {
    int s = map_get(&e->map, n);
    FL_ASSERT(s >= 0);
    return s;
}

fl_engine *fl_engine_start(int n, fl_tensor *const *roots, fl_tensor *const *grads) {
    fl_engine *e = calloc(1, sizeof *e);
    if (!e) return FL_FAIL_NULL(FL_ERR_OOM, "backward: out of CPU memory");
    e->pending = -1;
    for (int r = 0; r < n; r++) {
        fl_tensor *root = roots[r];
        if (fl_check_tensor("backward", root, false)) goto fail;
        if (!fl_requires_grad(root)) {
            fl_fail(FL_ERR_ARG, "backward: tensor %d does not require grad and has no grad_fn "
                                "(was it computed with grad mode off, or from tensors that do "
                                "not require grad?)", r);
            goto fail;
        }
        if (!(grads && grads[r]) && root->numel != 1) {
            char s[128];
            fl_fail(FL_ERR_ARG, "backward: gradient can be implicit only for a scalar; tensor "
                                "%d has shape %s", r, fl_shape_str(root, s, sizeof s));
            goto fail;
        }
    }
    if (discover(e, n, roots) != FL_OK) goto fail;
    e->heap = calloc((size_t)(e->n_states > 0 ? e->n_states : 1), sizeof(int));
    if (!e->heap) {
        fl_fail(FL_ERR_OOM, "backward: out of CPU memory");
        goto fail;
    }
    bool was = fl_set_grad_enabled(false);
    int rc = FL_OK;
    for (int r = 0; rc == FL_OK && r < n; r++) {
        fl_tensor *root = roots[r];
        fl_tensor *g = grads && grads[r] ? fl_tensor_retain(grads[r])
                                         : fl_full(root->ndim, root->shape, 1.0, root->dtype,
                                                   root->device);
        if (!g) { rc = fl_last_status(); break; }
        if (!root->grad_fn) {
            rc = accumulate_leaf(root, g);
        } else {
            node_state *st = &e->states[state_of(e, root->grad_fn)];
            rc = accumulate(&st->buffers[root->output_index], g);
        }
    }
    fl_set_grad_enabled(was);
    if (rc != FL_OK) goto fail;
    for (int s = 0; s < e->n_states; s++)
        if (e->states[s].deps == 0) heap_push(e, s);
    return e;
fail:
    fl_engine_free(e);
    return NULL;
}

/* Fill in zero gradients for outputs that none reached (unless the node
 * takes NULL for them: fl_node_type.null_grads). */
static int complete_buffers(node_state *st) {
    if (st->node->type->null_grads) return FL_OK;
    for (int k = 0; k < st->node->n_outputs; k++) {
        if (st->buffers[k]) continue;
        fl_output_meta *m = &st->node->outputs[k];
        st->buffers[k] = fl_zeros(m->ndim, m->shape, m->dtype, m->device);
        if (!st->buffers[k]) return fl_last_status();
    }
    return FL_OK;
}

/* Send input gradients along the node's edges; frees the node's state. */
static int deliver(fl_engine *e, int s, fl_tensor **grads_in) {
    node_state *st = &e->states[s];
    fl_node *node = st->node;
    int rc = FL_OK;
    for (int i = 0; i < node->n_inputs; i++) {
        fl_edge *edge = &node->inputs[i];
        fl_tensor *g = grads_in[i];
        grads_in[i] = NULL;
        if (edge->kind == FL_EDGE_NONE || !g || rc != FL_OK) {
            fl_tensor_release(g);
            if (edge->kind == FL_EDGE_NODE && rc == FL_OK) {
                /* no gradient, but the dependency is satisfied */
                node_state *next = &e->states[state_of(e, edge->node)];
                if (--next->deps == 0) heap_push(e, (int)(next - e->states));
            }
            continue;
        }
        if (edge->kind == FL_EDGE_LEAF) {
            rc = accumulate_leaf(edge->leaf, g);
        } else {
            int t = state_of(e, edge->node);
            node_state *next = &e->states[t];
            rc = accumulate(&next->buffers[edge->index], g);
            if (--next->deps == 0) heap_push(e, t);
        }
    }
    for (int k = 0; k < node->n_outputs; k++) {
        fl_tensor_release(st->buffers[k]);
        st->buffers[k] = NULL;
    }
    if (e->retain_graph) return rc;
    /* Free what backward no longer needs, now rather than with the graph
     * (see [Note: spent nodes]). */
    for (int k = 0; k < node->n_saved; k++) {
        fl_tensor *t = node->saved[k];
        /* (meta tensors too: their virtual storage counts the bytes a
         * device would free here, [Note: virtual storage]) */
        if (!t || (!t->storage && !t->virtual_storage)) continue;
        fl_tensor_release(t);
        node->saved[k] = NULL;
        node->spent = true;
    }
    if (node->packed) node->spent = true;
    fl_node_drop_packed(node);
    if (node->lua_id) node->spent = true;
    return rc;
}

int fl_engine_retain_graph(fl_engine *e, bool retain) {
    if (!e) return fl_fail(FL_ERR_ARG, "backward: engine is NULL");
    if (e->started)
        return fl_fail(FL_ERR_STATE, "backward: retain_graph must be set before the first step");
    e->retain_graph = retain;
    return FL_OK;
}

int fl_engine_step(fl_engine *e, fl_engine_event *event) {
    memset(event, 0, sizeof *event);
    if (e->failed) return fl_fail(FL_ERR_STATE, "backward: the engine already failed");
    if (e->pending >= 0)
        return fl_fail(FL_ERR_STATE, "backward: the Lua node %s is waiting for its gradients",
                       e->states[e->pending].node->type->name);
    e->started = true;
    bool was = fl_set_grad_enabled(false);
    int rc = FL_OK;
    while (e->heap_len > 0) {
        int s = heap_pop(e);
        node_state *st = &e->states[s];
        fl_node *node = st->node;
        if (node->spent) {
            rc = fl_fail(FL_ERR_STATE,
                         "backward: trying to backward through the graph a second time: %s "
                         "already ran and its saved tensors were freed; pass retain_graph=true "
                         "to the first backward if you need to backward twice",
                         node->type->name);
            break;
        }
        rc = complete_buffers(st);
        if (rc != FL_OK) break;
        if (node->lua_id) {
            e->pending = s;
            event->kind = FL_ENGINE_LUA_NODE;
            event->lua_id = node->lua_id;
            event->n_grads = node->n_outputs;
            event->grads = st->buffers;
            break;
        }
        fl_tensor *stack_in[8];
        fl_tensor **grads_in = node->n_inputs <= 8 ? stack_in
                                                  : calloc((size_t)node->n_inputs, sizeof *grads_in);
        if (!grads_in) { rc = fl_fail(FL_ERR_OOM, "backward: out of CPU memory"); break; }
        memset(grads_in, 0, (size_t)node->n_inputs * sizeof *grads_in);
        /* Saved tensors offloaded to host memory come back to their device
         * first (one place for every op: backward formulas never see
         * offload). */
        rc = fl_node_unpack_saved(node);
        double t0 = span_cap ? wall_us() : 0;
        int64_t flops0 = span_cap ? fl_flops() : 0;
        fl_event *device_start = span_cap && rc == FL_OK ? device_mark(st->buffers, node->n_outputs) : NULL;
        if (rc == FL_OK) rc = run_backward(e, node, st->buffers, grads_in);
        if (rc == FL_OK && span_cap) record_span(node, t0, flops0, grads_in, device_start);
        else fl_event_free(device_start);
        if (rc != FL_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "backward of %s: %s", node->type->name, fl_last_error());
            fl_set_error(fl_last_status(), msg);
            for (int i = 0; i < node->n_inputs; i++) fl_tensor_release(grads_in[i]);
        } else {
            rc = deliver(e, s, grads_in);
        }
        if (grads_in != stack_in) free(grads_in);
        if (rc != FL_OK) break;
    }
    fl_set_grad_enabled(was);
    if (rc != FL_OK) e->failed = true;
    return rc;
}

int fl_engine_provide(fl_engine *e, int n, fl_tensor *const *grads) {
    if (e->pending < 0)
        return fl_fail(FL_ERR_STATE, "backward: no Lua node is waiting for gradients");
    fl_node *node = e->states[e->pending].node;
    if (n != node->n_inputs)
        return fl_fail(FL_ERR_ARG, "backward of %s: %d gradients given for %d inputs",
                       node->type->name, n, node->n_inputs);
    fl_tensor *stack_in[8];
    fl_tensor **grads_in = n <= 8 ? stack_in : calloc((size_t)n, sizeof *grads_in);
    if (!grads_in) return fl_fail(FL_ERR_OOM, "backward: out of CPU memory");
    for (int i = 0; i < n; i++) grads_in[i] = fl_tensor_retain(grads[i]);
    bool was = fl_set_grad_enabled(false);
    int s = e->pending;
    e->pending = -1;
    int rc = deliver(e, s, grads_in);
    fl_set_grad_enabled(was);
    if (grads_in != stack_in) free(grads_in);
    if (rc != FL_OK) e->failed = true;
    return rc;
}

void fl_engine_free(fl_engine *e) {
    if (!e) return;
    for (int s = 0; s < e->n_states; s++) {
        node_state *st = &e->states[s];
        for (int k = 0; k < st->node->n_outputs; k++) fl_tensor_release(st->buffers[k]);
        free(st->buffers);
        fl_node_release(st->node);
    }
    free(e->states);
    free(e->heap);
    free(e->map.keys);
    free(e->map.values);
    free(e);
}

int fl_backward(int n, fl_tensor *const *roots, fl_tensor *const *grads) {
    fl_engine *e = fl_engine_start(n, roots, grads);
    if (!e) return fl_last_status();
    fl_engine_event ev;
    int rc = fl_engine_step(e, &ev);
    if (rc == FL_OK && ev.kind == FL_ENGINE_LUA_NODE)
        rc = fl_fail(FL_ERR_STATE, "backward reached the Lua node %s: run backward from Lua "
                                   "(tensor:backward())",
                     e->states[e->pending].node->type->name);
    fl_engine_free(e);
    return rc;
}
