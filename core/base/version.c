/*
 * version.c: the core's version and a one-line description of its build,
 * shown by `fsdp-lua --version` and recorded in benchmark output.
 */
#include "error.h"

#define FL_VERSION_STRING "0.1.0"

#define FL_STR2(x) #x
#define FL_STR(x) FL_STR2(x)

#ifdef _OPENMP
#define FL_OMP_INFO "openmp=" FL_STR(_OPENMP)
#else
#define FL_OMP_INFO "openmp=off"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define FL_SAN_INFO " asan"
#else
#define FL_SAN_INFO ""
#endif

const char *fl_version(void) { return FL_VERSION_STRING; }

const char *fl_build_info(void) {
    /* What the compiler fixed; whether the CUDA backend's plugin is
     * installed is a run-time fact (fl_backend_installed), which the host
     * and fsdp.build_info add. */
    return "gcc " __VERSION__ ", " FL_OMP_INFO FL_SAN_INFO;
}
