/*
 * bytes_moved.c: the bytes that memory-bound ops read and write, per op.
 *
 * Why: on a GPU most non-GEMM kernels are limited by memory bandwidth, so
 * their cost is their bytes, as a GEMM's is its FLOPs (fl_flops). Ops count
 * from their operands' shapes and dtypes when they run (on every device,
 * meta included, so a plan's trace counts a 70B step on a laptop): each
 * operand read once, each output written once, which is what a kernel that
 * streams its operands moves (a kernel that reads an operand twice moves
 * more, and that is the point of measuring it against this floor). Matmul,
 * linear, conv2d and attention are not counted: their bytes are small next
 * to their FLOPs. [Note: bytes moved] in core/base/flops.h names the
 * counting rule each op follows.
 *
 * The table is small and fixed: op names are the ops' string literals, so
 * there are a few dozen; any beyond the table's size count under "other".
 */
#include "flops.h"

#include <pthread.h>
#include <string.h>

enum { MAX_OPS = 96 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const char *name;
    int64_t calls, bytes;
} ops[MAX_OPS];
static int n_ops;
static int64_t total;

void fl_bytes_moved_add(const char *op, int64_t bytes) {
    if (bytes < 0) bytes = 0;
    pthread_mutex_lock(&lock);
    /* The op's own string literal first (the common case, a pointer
     * compare per entry); names compared only for a copy from elsewhere. */
    int i = 0;
    while (i < n_ops && ops[i].name != op) i++;
    if (i == n_ops) {
        i = 0;
        while (i < n_ops && strcmp(ops[i].name, op) != 0) i++;
    }
    if (i == n_ops) {
        if (n_ops < MAX_OPS - 1) {
            ops[n_ops++].name = op;
        } else {
            i = MAX_OPS - 1; /* the last entry collects the rest */
            ops[i].name = "other";
            if (n_ops < MAX_OPS) n_ops = MAX_OPS;
        }
    }
    ops[i].calls++;
    ops[i].bytes = fl_flops_sum(ops[i].bytes, bytes);
    total = fl_flops_sum(total, bytes);
    pthread_mutex_unlock(&lock);
}

void fl_count_bytes(const char *op, int n, const fl_tensor *const *ts) {
    int64_t bytes = 0;
    for (int k = 0; k < n; k++)
        if (ts[k]) bytes = fl_flops_sum(bytes, fl_flops_mul(ts[k]->numel, (int64_t)fl_dtype_size(ts[k]->dtype)));
    fl_bytes_moved_add(op, bytes);
}

int64_t fl_bytes_moved(void) {
    pthread_mutex_lock(&lock);
    int64_t t = total;
    pthread_mutex_unlock(&lock);
    return t;
}

void fl_bytes_moved_reset(void) {
    pthread_mutex_lock(&lock);
    n_ops = 0;
    total = 0;
    memset(ops, 0, sizeof ops);
    pthread_mutex_unlock(&lock);
}

int fl_bytes_moved_by_op(int max, const char **names, int64_t *calls, int64_t *bytes) {
    pthread_mutex_lock(&lock);
    int n = n_ops < max ? n_ops : max;
    for (int i = 0; i < n; i++) {
        names[i] = ops[i].name;
        calls[i] = ops[i].calls;
        bytes[i] = ops[i].bytes;
    }
    pthread_mutex_unlock(&lock);
    return n;
}
