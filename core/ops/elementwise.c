/*
 * elementwise.c: the kernel table lookup of the elementwise family (its
 * shared op helpers, broadcasting and promotion, are in op_common.c).
 */
#include "elementwise.h"
#include "op_common.h"

const fl_elementwise_kernels *fl_elementwise_kernels_of(const char *op, fl_device device) {
    const fl_backend *be = fl_backend_of(device);
    return be && be->elementwise ? be->elementwise : fl_no_kernel(op, device);
}
