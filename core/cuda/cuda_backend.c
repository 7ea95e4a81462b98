/*
 * cuda_backend.c: the vtable of the cuda device (compiled only with the
 * CUDA backend). Allocation and transfers go to cuda_runtime.cu; element
 * kernels (strided copy with conversion, fill, random) come with the GPU
 * kernel work: until then the core routes cuda tensors through the host
 * where it can (random numbers, contiguous same-dtype copies) and otherwise
 * reports which kernel this build lacks.
 */
#ifdef FL_HAVE_CUDA
#include "internal.h"
#include "cuda_backend.h"

bool fl_cuda_built(void) { return true; }
int fl_cuda_device_count(void) { return fl_cuda_probe(); }
const char *fl_cuda_status(void) { return fl_cuda_probe_status(); }

static void *cuda_alloc(int index, int64_t nbytes) {
    if (index >= fl_cuda_probe()) return NULL;
    return fl_cuda_malloc(index, nbytes);
}

static void cuda_free(int index, void *ptr, int64_t nbytes) {
    (void)nbytes;
    fl_cuda_free(index, ptr);
}

static int transfer_failed(const char *what) {
    return fl_fail(FL_ERR_DEVICE, "%s: %s", what, fl_cuda_last_problem());
}

static int cuda_to_host(int index, void *host_dst, const void *src, int64_t nbytes) {
    return fl_cuda_memcpy(index, host_dst, src, nbytes, 1) == 0
               ? FL_OK
               : transfer_failed("copy from cuda");
}

static int cuda_from_host(int index, void *dst, const void *host_src, int64_t nbytes) {
    return fl_cuda_memcpy(index, dst, host_src, nbytes, 0) == 0
               ? FL_OK
               : transfer_failed("copy to cuda");
}

/* Same-device copy: only the dense, same-dtype case is a plain transfer. */
static int cuda_copy(fl_tensor *dst, const fl_tensor *src) {
    if (dst->dtype != src->dtype || !fl_tensor_is_contiguous(dst) ||
        !fl_tensor_is_contiguous(src) || dst->numel != src->numel)
        return fl_fail(FL_ERR_UNSUPPORTED,
                       "copy_ on cuda: strided or converting device-to-device copies need the "
                       "CUDA element kernels, which this build does not have");
    int64_t nbytes = dst->numel * (int64_t)fl_dtype_size(dst->dtype);
    /* Through the host: correct, if slow, until a device kernel exists. */
    void *tmp = malloc((size_t)nbytes + 1);
    if (!tmp) return fl_fail(FL_ERR_OOM, "copy_ on cuda: no host memory for %lld bytes",
                             (long long)nbytes);
    int index = fl_device_index(dst->device);
    int rc = cuda_to_host(fl_device_index(src->device), tmp, src->data, nbytes);
    if (rc == FL_OK) rc = cuda_from_host(index, dst->data, tmp, nbytes);
    free(tmp);
    return rc;
}

static int cuda_fill(fl_tensor *t, double value) {
    if (value == 0.0 && fl_tensor_is_contiguous(t)) {
        int64_t nbytes = t->numel * (int64_t)fl_dtype_size(t->dtype);
        return fl_cuda_memset(fl_device_index(t->device), t->data, 0, nbytes) == 0
                   ? FL_OK
                   : transfer_failed("fill_ on cuda");
    }
    /* Other values: build the pattern on the host and transfer it. */
    fl_tensor *host = fl_full(t->ndim, t->shape, value, t->dtype, fl_device_make(FL_DEVICE_CPU, 0));
    if (!host) return fl_last_status();
    int rc = fl_copy_(t, host);
    fl_tensor_release(host);
    return rc;
}

const fl_backend fl_cuda_backend = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .random = NULL, /* generated on the host: see random_fill in tensor.c */
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
};
#endif /* FL_HAVE_CUDA */
