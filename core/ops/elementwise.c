/*
 * elementwise.c: the kernel table lookup of the elementwise family (its
 * shared op helpers, broadcasting and promotion, are in op_common.c).
 */
#include "elementwise.h"

const fl_elementwise_kernels *fl_elementwise_kernels_of(const char *op, fl_device device) {
    if (fl_device_kind_of(device) == FL_DEVICE_CPU) return &fl_cpu_elementwise_kernels;
#ifdef FL_HAVE_CUDA
    if (fl_device_kind_of(device) == FL_DEVICE_CUDA) return &fl_cuda_elementwise_kernels;
#endif
    return fl_no_kernel(op, device);
}
