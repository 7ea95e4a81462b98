/*
 * launcher.c: which rank a launcher (mpirun, srun) started this process as,
 * read from its environment before any backend is loaded. In base, below
 * dist, because the error layer names the rank when it aborts (error.c).
 */
#include "files.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>

int fl_env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < INT_MIN || x > INT_MAX) return fallback;
    return (int)x;
}

int fl_dist_launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        int r = fl_env_int(vars[i], -1);
        if (r >= 0) return r;
    }
    if (fl_env_int("SLURM_NTASKS", 1) > 1) return fl_env_int("SLURM_PROCID", -1);
    return -1;
}
