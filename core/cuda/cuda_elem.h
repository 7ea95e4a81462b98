/*
 * cuda_elem.h: the C entry points of the tensor core's element kernels on
 * the GPU (cuda_copy.cu), called by the device vtable in cuda_backend.c.
 * Contracts are those of fl_backend's copy, fill and random (core/backend/backend.h).
 */
#ifndef FL_CUDA_ELEM_H
#define FL_CUDA_ELEM_H

#include "element.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst = src converted (same device, src may broadcast with stride 0). */
int fl_cuda_copy_kernel(fl_tensor *dst, const fl_tensor *src);
/* Every element of t = the element at `element` (one element of t's dtype,
 * converted on the host with the CPU's rules). */
int fl_cuda_fill_kernel(fl_tensor *t, const void *element);
/* Uniform and int random fills on the device, bit-identical to rng.c;
 * FL_ERR_UNSUPPORTED for normal fills (generated on the host instead: see
 * cuda_random in cuda_backend.c). */
int fl_cuda_random_kernel(fl_tensor *t, const fl_random_spec *spec);

#ifdef __cplusplus
}
#endif

#endif /* FL_CUDA_ELEM_H */
