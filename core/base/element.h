/*
 * element.h: single elements as kernels see them: loads and stores of one
 * value in any dtype (core/tensor/dtype.c), and the counter-based random
 * value of element i of a fill (core/tensor/rng.c), which every device
 * reproduces bit for bit.
 */
#ifndef FL_ELEMENT_H
#define FL_ELEMENT_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

FL_PLUGIN_API double fl_load_f64(const void *p, fl_dtype dtype);
FL_PLUGIN_API int64_t fl_load_i64(const void *p, fl_dtype dtype);
FL_PLUGIN_API void fl_store_f64(void *p, fl_dtype dtype, double v);
FL_PLUGIN_API void fl_store_i64(void *p, fl_dtype dtype, int64_t v);

/* What a random fill generates: distribution, key and parameters. */
typedef struct fl_random_spec {
    enum { FL_RANDOM_UNIFORM, FL_RANDOM_NORMAL, FL_RANDOM_INT } kind;
    uint64_t seed, stream, first_index;
    double a, b;          /* uniform: low, high; normal: mean, std */
    int64_t ilow, ihigh;  /* randint */
} fl_random_spec;

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

#ifdef __cplusplus
}
#endif

#endif /* FL_ELEMENT_H */
