/*
 * fuzz_safetensors.c: libFuzzer harness for the safetensors reader
 * (core/io/safetensors.c): the header (length, JSON, entries, shapes,
 * offsets, metadata) and reading every tensor out of the mapping.
 *
 * Any input must either be refused with an error or open into a file whose
 * every tensor reads back; the sanitizers and the checks below catch the
 * rest (out-of-bounds reads, overflows, lookups that disagree).
 */
#include <stdlib.h>
#include <string.h>

#include "fsdp.h"
#include "fuzz_input.h"

/* Tensors larger than this are read through a slice only, to keep each
 * input fast (shapes in hostile headers can be huge and still valid when
 * their bytes are present). */
enum { MAX_READ = 1 << 16 };

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: %s\n", what);
        abort();
    }
}

static void read_tensor(fl_tensor *t) {
    fl_device cpu = fl_device_make(FL_DEVICE_CPU, 0);
    fl_tensor *part = t;
    if (t->numel > MAX_READ) part = fl_narrow(t, 0, 0, 1);
    if (!part) return;
    /* Copy out of the mapping with conversion (every bit pattern of every
     * dtype goes through the converters), and a plain clone. */
    fl_tensor *f32 = part->numel <= MAX_READ ? fl_to(part, FL_F32, cpu) : NULL;
    fl_tensor *same = part->numel <= MAX_READ ? fl_clone(part) : NULL;
    if (same) check(memcmp(same->data, part->data, (size_t)part->numel * fl_dtype_size(part->dtype)) == 0,
                    "a clone differs from the mapped bytes");
    fl_tensor_release(f32);
    fl_tensor_release(same);
    if (part != t) fl_tensor_release(part);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    fl_safetensors *f = fl_safetensors_open(path);
    if (f) {
        int n = fl_safetensors_count(f);
        for (int i = 0; i < n; i++) {
            const char *name = fl_safetensors_name(f, i);
            check(name != NULL, "a tensor without a name");
            check(fl_safetensors_find(f, name) == i, "find disagrees with the name's index");
            fl_dtype dtype;
            int ndim;
            int64_t shape[FL_MAX_DIMS];
            check(fl_safetensors_info(f, i, &dtype, &ndim, shape) == FL_OK, "info of a listed tensor failed");
            if (i < 64) {
                fl_tensor *t = fl_safetensors_get(f, i);
                check(t != NULL, "get of a validated tensor failed");
                read_tensor(t);
                fl_tensor_release(t);
            }
        }
        check(fl_safetensors_find(f, "") < 0 || n > 0, "found a name in an empty file");
        for (int k = 0; k < fl_safetensors_metadata_count(f); k++) {
            const char *key = fl_safetensors_metadata_key(f, k);
            check(key && fl_safetensors_metadata(f, key) != NULL, "a metadata key without its value");
        }
        fl_safetensors_close(f);
    }
    fl_clear_error();
    close(fd);
    return 0;
}
