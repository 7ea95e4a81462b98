/*
 * flops.h: counting what an op costs: saturating FLOP arithmetic (the
 * public fl_flops_add is in fsdp.h) and the bytes each kernel moves
 * (core/tensor/bytes_moved.c).
 */
#ifndef FL_FLOPS_H
#define FL_FLOPS_H

#include "fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* FL_FLOPS_H */
