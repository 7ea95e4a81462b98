/*
 * fault.c: reading memory-mapped files that may shrink under us.
 *
 * A file mapped with mmap raises SIGBUS when a page past its current end is
 * read, which happens when another process truncates the file while it is
 * open (a checkpoint being rewritten, a token shard replaced). The core
 * never lets that become a crash on the paths it controls:
 *
 *   - fl_guarded_memcpy copies out of a mapping with a SIGBUS guard on the
 *     calling thread (sigsetjmp; the handler jumps back only to a thread that
 *     armed a guard, so it is thread-safe) and reports failure instead;
 *     copy_ from a file-backed tensor goes through it (tensor.c), so loading
 *     checkpoints, state dicts and token batches fail with a message naming
 *     the file.
 *   - A SIGBUS outside any guard (an op reading a mapped tensor directly)
 *     whose address lies in a registered mapping ends the process with one
 *     line naming the file and exit status 1, not a signal and a core dump.
 *
 * Other faults are passed on to whatever handler was installed before ours
 * (AddressSanitizer's, or the default action).
 */
#include "storage.h"

#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

enum { MAX_MAPPINGS = 1024 };

/* Registered mappings: lock-free slots, read by the signal handler. A slot
 * is claimed by compare-and-swap of its begin address from 0. */
typedef struct mapping_slot {
    _Atomic(uintptr_t) begin;
    _Atomic(uintptr_t) end;
    const char *_Atomic path;
} mapping_slot;

static mapping_slot mappings[MAX_MAPPINGS];
/* volatile: the stores around the memcpy must happen, though nothing the
 * compiler can see reads them (only the signal handler does). */
static _Thread_local sigjmp_buf *volatile guard;
static struct sigaction previous;
static pthread_once_t installed = PTHREAD_ONCE_INIT;

static void write_str(const char *s) {
    ssize_t unused = write(STDERR_FILENO, s, strlen(s));
    (void)unused;
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    if (guard) siglongjmp(*guard, 1);
    uintptr_t addr = (uintptr_t)info->si_addr;
    for (int k = 0; k < MAX_MAPPINGS; k++) {
        uintptr_t b = atomic_load(&mappings[k].begin), e = atomic_load(&mappings[k].end);
        const char *path = atomic_load(&mappings[k].path);
        if (b && path && addr >= b && addr < e) {
            write_str("fsdp-lua: ");
            write_str(path);
            write_str(": the file shrank while it was mapped (truncated or rewritten in place by "
                      "another process?); reading past its new end\n");
            _exit(1);
        }
    }
    /* Not ours: the handler before us, or the default action. */
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, uctx);
    } else if (previous.sa_handler != SIG_IGN && previous.sa_handler != SIG_DFL) {
        previous.sa_handler(sig);
    } else {
        signal(SIGBUS, SIG_DFL);
        raise(SIGBUS);
    }
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous);
}

void fl_fault_register(const void *begin, size_t size, const char *path) {
    pthread_once(&installed, install);
    for (int k = 0; k < MAX_MAPPINGS; k++) {
        uintptr_t expected = 0;
        if (atomic_compare_exchange_strong(&mappings[k].begin, &expected, (uintptr_t)begin)) {
            atomic_store(&mappings[k].path, path);
            atomic_store(&mappings[k].end, (uintptr_t)begin + size);
            return;
        }
    }
    /* More mappings than slots: guarded copies still work, only the message
     * of an unguarded fault loses the file name. */
}

void fl_fault_unregister(const void *begin) {
    for (int k = 0; k < MAX_MAPPINGS; k++) {
        if (atomic_load(&mappings[k].begin) == (uintptr_t)begin) {
            atomic_store(&mappings[k].path, NULL);
            atomic_store(&mappings[k].end, 0);
            atomic_store(&mappings[k].begin, 0);
            return;
        }
    }
}

int fl_guarded_memcpy(void *dst, const void *src, size_t n) {
    pthread_once(&installed, install);
    sigjmp_buf env;
    /* The mask is not saved (no system call per copy): the handler runs
     * with SA_NODEFER, so jumping out of it leaves SIGBUS unblocked. */
    if (sigsetjmp(env, 0)) {
        guard = NULL;
        return -1;
    }
    guard = &env;
    memcpy(dst, src, n);
    guard = NULL;
    return 0;
}
