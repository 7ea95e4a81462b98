/*
 * fused.h: the dispatch of the fused family (RMS and layer norms,
 * softmax and log-softmax, cross-entropy and NLL loss, rotary embeddings,
 * scaled dot-product attention) and the helpers its op files share.
 *
 * These are the memory-bound chains of a transformer: each is one kernel
 * (fl_fused_kernels, core/backend/backend.h, with the kernel conventions)
 * that reads its input once (forward) and once or twice (backward) instead
 * of a sequence of elementwise ops with temporaries. The op files
 * (core/ops/norm.c, softmax.c, cross_entropy.c, rotary.c, attention.c)
 * validate, infer shapes and dtypes (the same on every device, meta
 * included), count FLOPs and record autograd; the kernels only compute.
 */
#ifndef FL_OPS_FUSED_H
#define FL_OPS_FUSED_H

#include "backend.h"
#include "node.h"

/* The table for a device, or NULL with an error naming the op. */
const fl_fused_kernels *fl_fused_kernels_of(const char *op, fl_device device);

/* ---- helpers shared by the op files (fused_common.c) ---------------------- */

/* f64 for f64, f32 for the other float dtypes. */
fl_dtype fl_fused_compute_dtype(fl_dtype dtype);
/* Fail unless t is a floating point tensor ("rms_norm: weight must be a
 * floating point tensor, got i64"). */
int fl_fused_check_float(const char *op, const char *what, const fl_tensor *t);
/* Fail unless t is on `device` (names both). */
int fl_fused_check_device(const char *op, const char *what, const fl_tensor *t,
                          fl_device device);
/* True if any non-NULL tensor has no storage (meta or fake): the op then
 * only infers shapes. */
bool fl_fused_no_storage(int n, const fl_tensor *const *ts);
/* A new output: fake (no storage) when no_storage, else allocated. */
fl_tensor *fl_fused_output(int ndim, const int64_t *shape, fl_dtype dtype, fl_device device,
                           bool no_storage);
/* t converted to dtype with a contiguous last dim (t itself when it
 * already is), outside autograd: kernels' view of an input. */
fl_tensor *fl_fused_prepare(const fl_tensor *t, fl_dtype dtype);
/* Record a one-output node saving `saved`; on failure releases out and
 * returns NULL. Returns out otherwise. node_out may be NULL. */
fl_tensor *fl_fused_record(const fl_node_type *type, int n_in, const fl_tensor *const *inputs,
                           fl_tensor *out, int n_saved, const fl_tensor *const *saved,
                           fl_node **node_out);
/* The gradient g converted to `like`'s dtype (new reference; g consumed). */
fl_tensor *fl_fused_as_dtype(fl_tensor *g, fl_dtype dtype);

#endif /* FL_OPS_FUSED_H */
