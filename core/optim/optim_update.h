/*
 * optim_update.h: what the CPU loops of the fused optimizer updates
 * (the .c files of core/optim) and their CUDA kernels (core/cuda/cuda_optim.cu) share:
 * the operands, each update's constants as its inner loop reads them, and
 * the table a device backend offers.
 * Both devices compute from the same f32 constants, made once per call on
 * the host, so a GPU update can repeat the CPU's operations exactly. Plain
 * C, included by nvcc too.
 */
#ifndef FL_OPTIM_UPDATE_H
#define FL_OPTIM_UPDATE_H

#include "internal.h"

enum { FL_OPTIM_MAX_OPERANDS = 5 };

/* Operand 0 is always the parameter, 1 its gradient, the rest state. */
typedef struct fl_optim_operand {
    const char *name;  /* "param", "grad", "exp_avg": used in messages */
    fl_tensor *t;      /* NULL for an optional operand that is absent */
    bool write;        /* stored back after the inner loop */
} fl_optim_operand;

/* Which update a call is, for the device kernels. */
typedef enum fl_optim_kind {
    FL_OPTIM_ADAMW,
    FL_OPTIM_ANYPRECISION_ADAMW,
    FL_OPTIM_SGD,
    FL_OPTIM_ADADELTA,
} fl_optim_kind;

/* AdamW (adamw.c): operands param, grad, exp_avg, exp_avg_sq. */
typedef struct fl_adamw_ctx {
    float decay, weight1, beta2, one_minus_beta2, eps, neg_step_size, bc2_sqrt;
} fl_adamw_ctx;

/* AnyPrecisionAdamW (anyprecision_adamw.c): operands param, grad,
 * exp_avg, exp_avg_sq, compensation (NULL without Kahan summation). */
typedef struct fl_anyprecision_ctx {
    float neg_lr_wd, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size,
        bc2_sqrt;
    bool kahan;
} fl_anyprecision_ctx;

/* SGD (sgd.c): operands param, grad, momentum_buffer (NULL without
 * momentum). */
typedef struct fl_sgd_ctx {
    float lr, momentum, one_minus_dampening, weight_decay;
    bool use_momentum, nesterov, first;
} fl_sgd_ctx;

/* Adadelta (adadelta.c): operands param, grad, square_avg, acc_delta. */
typedef struct fl_adadelta_ctx {
    float lr, rho, one_minus_rho, eps, weight_decay;
} fl_adadelta_ctx;

/* grad_norm.c's chunk: the sum of squares adds the squares of each chunk
 * of this many elements in four interleaved accumulators, then the chunks
 * in order; the device kernel keeps the same order. */
enum { FL_GRAD_NORM_CHUNK = 4096 };

/* A device backend's kernels of the family (fl_backend.optim; the cpu runs
 * the host loops of core/optim instead). update: the update of `kind` over
 * all elements of checked, dense, non-overlapping operands on one device,
 * one kernel launch; ctx is the kind's struct above. update_multi (NULL:
 * update is called per set): the same over `count` sets of n operands
 * (set i at ops + i*n), checked and not sharing memory, each set's result
 * that of update, in as few launches as the device allows. grad_sq_norm and
 * grad_scale_: grad_norm.c on a device tensor (checked, dense, float), the
 * sum of squares with the CPU's chunks and order of additions, and the
 * in-place scale. FL_OK or an error naming op. */
typedef struct fl_optim_kernels {
    int (*update)(const char *op, fl_optim_kind kind, const void *ctx, int n,
                  const fl_optim_operand *ops);
    int (*update_multi)(const char *op, fl_optim_kind kind, const void *ctx, int count, int n,
                        const fl_optim_operand *ops);
    int (*grad_sq_norm)(const fl_tensor *t, double *out);
    int (*grad_scale_)(fl_tensor *t, double alpha);
} fl_optim_kernels;

#endif /* FL_OPTIM_UPDATE_H */
