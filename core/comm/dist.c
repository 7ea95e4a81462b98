/*
 * dist.c: starting and stopping the distributed runtime: which backend
 * runs, loading the MPI plugin, where this rank stands (rank, node), the
 * collective timeout, and ending the whole job when a rank fails. The
 * bottom of the API layer ([Note: the layers of core/comm] in
 * collectives.c): it fills the runtime's state (fl_dist, in transport.c)
 * and calls only the work and transport layers; groups and collectives
 * call it.
 *
 * [Note: choosing the backend]
 * libfsdp.so never links libmpi. A process started by a launcher
 * (OMPI_COMM_WORLD_SIZE from mpirun, PMI_SIZE or PMIX_RANK from PMI
 * launchers, SLURM_PROCID with SLURM_NTASKS > 1 from srun) or with
 * FSDP_BACKEND=mpi dlopen()s libfsdp_mpi.so, found next to libfsdp.so (or
 * at FSDP_MPI_LIBRARY); anything else is one rank on the `self` backend
 * and never loads MPI, so a plain `fsdp-lua x.lua` starts fast, prints no
 * MPI noise and runs where MPI is not installed. The plugin is opened with
 * RTLD_GLOBAL because Open MPI's own components are shared objects that
 * expect libmpi's symbols in the global scope.
 *
 * [Note: failing without hanging]
 * A rank that dies while the others wait in a collective would leave them
 * waiting forever. Three things bound that: (1) the host calls
 * fl_dist_abort_on_error when a script ends with an uncaught error, which
 * prints the rank and the message and calls MPI_Abort, so mpirun kills the
 * job within seconds; (2) every wait polls with a deadline (the collective
 * timeout) and fails naming the collective and the group, and which
 * members are not in a collective or did not answer (the roll call of
 * [Note: the watch channel]); (3) the monitored barrier names the ranks
 * that did not arrive; (4) a rank leaving before its run finished ends
 * the job ([Note: leaving the job]). A rank that dies without finalizing
 * (a signal, SIGKILL, _exit) is mpirun's to notice: Open MPI 4.1 ends the
 * job within a second or two when a process exits after MPI_Init without
 * MPI_Finalize, whatever its exit status, or on a signal, naming the rank.
 *
 * [Note: leaving the job]
 * os.exit() in a script (or exit() from C) runs the atexit handlers
 * without the script finishing. Finalizing then is wrong: MPI_Finalize
 * waits for every rank, and the others wait in a collective for this one,
 * so the job hung until the collective timeout and blamed the collective.
 * The host finalizes explicitly when its script (or REPL) finished, so the
 * atexit hook runs only for such an early exit: it tells every rank it
 * leaves (the watch channel), then waits up to LEAVE_PATIENCE seconds for
 * all of them to leave as well, as they do when every rank ends with
 * os.exit (tests/mpi/tap.lua after its last barrier). If they did, the
 * runtime finalizes and the exit status stands; otherwise the rank prints
 * why it left (the host notes "os.exit(N) at file:line",
 * fl_dist_note_exit) and which ranks are still running, and aborts the
 * job.
 *
 * [Note: progress from compute]
 * Open MPI moves a non-blocking collective only inside MPI calls, and the
 * progress thread makes them every FSDP_PROGRESS_INTERVAL_US while the
 * rank computes ([Note: progress and waiting], work.c). When ranks' compute
 * threads fill every core, as they do when a node runs one rank per core
 * (and on this project's 2-core machine with 4 ranks), that thread waits
 * for a core at each wake-up, and a prefetched all-gather that should
 * hide behind a layer's compute finishes late (HYBRID_SHARD's node
 * all-gathers took 46-55 ms with prefetch against 16-21 waited for
 * outright, benchmarks/cluster_link.sh). So the thread that computes
 * progresses them too: every storage allocation (every op's output; the
 * tensor layer calls a hook this file sets, fl_set_allocation_hook) makes
 * one pass over the requests in flight, at most every POKE_GAP_US, on the
 * thread that started the runtime (MPI may allow no other), and never
 * waits for the progress thread's lock. FSDP_PROGRESS_FROM_COMPUTE=0
 * turns it off.
 */
#include "dist.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* [Note: progress from compute] */
enum { POKE_GAP_US = 50 };
static pthread_t poke_thread;

static void poke_between_kernels(void) {
    static double last;
    if (!pthread_equal(pthread_self(), poke_thread)) return;
    double now = fl_dist_now();
    if (now - last < 1e-6 * POKE_GAP_US) return;
    last = now;
    fl_dist.backend->poke();
}

static void start_pokes(void) {
    const char *env = getenv("FSDP_PROGRESS_FROM_COMPUTE");
    if (!fl_dist.backend->poke || (env && strcmp(env, "0") == 0)) return;
    poke_thread = pthread_self();
    fl_set_allocation_hook(poke_between_kernels);
}

extern const fl_dist_backend fl_dist_self_backend;

enum { DEFAULT_TIMEOUT_SECONDS = 600 };
/* [Note: leaving the job]: how long a rank leaving early waits for the
 * others to leave too (at most the collective timeout). */
static const double LEAVE_PATIENCE = 3.0;
/* ... and how long it lets ranks still in a collective finish it before
 * taking them to be waiting for this one. */
static const double WAITED_FOR_GRACE = 1.0;

/* ---- the environment --------------------------------------------------------- */

/* Why a launcher started this process ("OMPI_COMM_WORLD_SIZE=4"), or NULL. */
static const char *launcher_reason(char *buf, size_t size) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            snprintf(buf, size, "%s=%s set by the launcher", vars[i], v);
            return buf;
        }
    }
    /* Inside an allocation SLURM_PROCID is set even for a single process;
     * only a multi-task step means the ranks expect each other. */
    if (getenv("SLURM_PROCID") && fl_env_int("SLURM_NTASKS", 1) > 1) {
        snprintf(buf, size, "SLURM_NTASKS=%d set by srun", fl_env_int("SLURM_NTASKS", 1));
        return buf;
    }
    return NULL;
}

/* ---- loading the MPI plugin -------------------------------------------------- */

static int plugin_path(char *path, size_t size) {
    const char *env = getenv("FSDP_MPI_LIBRARY");
    if (env && *env) {
        snprintf(path, size, "%s", env);
        return FL_OK;
    }
    /* Next to this library: build/lib, build/debug/lib or an install. */
    Dl_info info;
    if (!dladdr((const void *)(uintptr_t)&fl_dist_init, &info) || !info.dli_fname)
        return fl_fail(FL_ERR_DEVICE, "dist: cannot find where libfsdp.so was loaded from "
                                      "(set FSDP_MPI_LIBRARY to libfsdp_mpi.so)");
    const char *slash = strrchr(info.dli_fname, '/');
    int dir_len = slash ? (int)(slash - info.dli_fname) : 1;
    const char *dir = slash ? info.dli_fname : ".";
    snprintf(path, size, "%.*s/libfsdp_mpi.so", dir_len, dir);
    return FL_OK;
}

static int load_mpi_plugin(const char *why) {
    char path[4096];
    if (plugin_path(path, sizeof path)) return fl_last_status();
    dlerror();
    void *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
        const char *err = dlerror();
        return fl_fail(FL_ERR_DEVICE,
                       "dist: the mpi backend is needed (%s) but %s cannot be loaded: %s "
                       "(it is built when Open MPI's development files are installed: "
                       "libopenmpi-dev)",
                       why, path, err ? err : "unknown error");
    }
    fl_dist_backend_entry entry;
    void *sym = dlsym(handle, FL_DIST_MPI_ENTRY);
    memcpy(&entry, &sym, sizeof entry);
    if (!entry) {
        dlclose(handle);
        return fl_fail(FL_ERR_DEVICE, "dist: %s does not export %s: not an fsdp-lua mpi backend",
                       path, FL_DIST_MPI_ENTRY);
    }
    const fl_dist_backend *b = entry();
    if (!b || b->abi != FL_DIST_BACKEND_ABI) {
        dlclose(handle);
        return fl_fail(FL_ERR_DEVICE,
                       "dist: %s was built for backend interface %d, this core has %d: "
                       "rebuild both",
                       path, b ? b->abi : -1, FL_DIST_BACKEND_ABI);
    }
    fl_dist.plugin = handle;
    fl_dist.backend = b;
    return FL_OK;
}

/* ---- init and finalize ------------------------------------------------------- */

static int read_timeout(double *out) {
    const char *v = getenv("FSDP_COLLECTIVE_TIMEOUT");
    *out = DEFAULT_TIMEOUT_SECONDS;
    if (!v || !*v) return FL_OK;
    char *end;
    double t = strtod(v, &end);
    if (*end || !(t > 0) || !isfinite(t))
        return fl_fail(FL_ERR_ARG, "dist: FSDP_COLLECTIVE_TIMEOUT=%s is not a positive number "
                                   "of seconds", v);
    *out = t;
    return FL_OK;
}

/* FSDP_RANKS_PER_NODE=n: consecutive blocks of n ranks act as nodes, so
 * hybrid sharding can be exercised on one machine. Meaningless for one
 * rank, where it is ignored. */
static int apply_ranks_per_node(fl_dist_topology *t) {
    const char *v = getenv("FSDP_RANKS_PER_NODE");
    if (!v || !*v || t->size == 1) return FL_OK;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > t->size || t->size % n != 0)
        return fl_fail(FL_ERR_ARG, "dist: FSDP_RANKS_PER_NODE=%s must be a positive divisor of "
                                   "the world size %d",
                       v, t->size);
    t->local_rank = t->rank % (int)n;
    t->local_size = (int)n;
    t->node = t->rank / (int)n;
    t->nodes = t->size / (int)n;
    return FL_OK;
}

static bool is_job(void) {
    return fl_dist.backend && fl_dist.backend != &fl_dist_self_backend && fl_dist.topo.size > 1;
}

static void end_job(const char *why) {
    fflush(stdout);
    fprintf(stderr, "fsdp-lua: rank %d: %s; aborting the job (%d ranks)\n", fl_dist.topo.rank,
            why, fl_dist.topo.size);
    fflush(stderr);
    fl_dist.backend->abort(1);
}

/* "0, 2, 3" from the ranks not flagged in left; returns how many. */
static int still_running(const bool *left, int size, char *names, size_t cap) {
    size_t len = 0;
    int running = 0;
    names[0] = '\0';
    for (int r = 0; r < size && len < cap; r++)
        if (!left[r])
            len += (size_t)snprintf(names + len, cap - len, "%s%d", running++ ? ", " : "", r);
    return running;
}

/* [Note: leaving the job] */
static void leave_at_exit(void) {
    if (!fl_dist.backend || fl_dist.finalized) return;
    if (!is_job() || !fl_dist.backend->leave || !fl_dist.initialized) {
        fl_dist_finalize();
        return;
    }
    char why[1024];
    const char *how = fl_dist.exit_note[0] ? fl_dist.exit_note
                                           : "exit() before the script finished";
    if (fl_dist.broken) {
        snprintf(why, sizeof why, "%s after a collective failed (%.480s)", how,
                 fl_dist.broken_message);
        end_job(why);
    }
    fl_dist.backend->leave(how);
    int size = fl_dist.topo.size;
    bool *left = calloc((size_t)size, sizeof *left);
    if (!left) end_job("out of memory while leaving");
    char names[256];
    /* A rank waiting in a collective while this one has none in flight
     * waits for this one: end the job without the patience, after a short
     * grace. The grace is for a collective this rank has just completed
     * and the others have not yet seen complete (MPI completes it on each
     * rank at its own pace): when every rank stops together after a last
     * all-reduce (the non-finite guard), a loaded machine showed a rank
     * ending the job for the others' in-flight count of that very one. */
    double grace_start = fl_dist_now();
    while (fl_dist.backend->peers_left(left) < size) {
        fl_roll_answer *a = fl_dist_roll_call(fl_dist.world, FL_ROLL_CALL_SECONDS);
        fl_dist.backend->peers_left(left);
        bool mine = false, waited_for = false;
        for (int r = 0; a && r < size; r++) {
            if (a[r].world_rank == fl_dist.topo.rank) mine = a[r].in_flight > 0;
            else if (!left[a[r].world_rank] && a[r].answered && a[r].in_flight > 0)
                waited_for = true;
        }
        free(a);
        if (!waited_for || mine) break;
        double waited = fl_dist_now() - grace_start;
        if (waited > WAITED_FOR_GRACE) {
            int running = still_running(left, size, names, sizeof names);
            snprintf(why, sizeof why, "left the job before its run finished (%s) while world "
                     "rank%s %s %s waiting in collectives",
                     how, running > 1 ? "s" : "", names, running > 1 ? "are" : "is");
            end_job(why);
        }
        fl_dist_pause(waited);
    }
    double start = fl_dist_now();
    double patience = LEAVE_PATIENCE < fl_dist.timeout ? LEAVE_PATIENCE : fl_dist.timeout;
    for (;;) {
        if (fl_dist.backend->peers_left(left) == size) {
            free(left);
            fl_dist_finalize();
            return;
        }
        double waited = fl_dist_now() - start;
        if (waited > patience) break;
        fl_dist_pause(waited);
    }
    int running = still_running(left, size, names, sizeof names);
    snprintf(why, sizeof why, "left the job before its run finished (%s) while world rank%s %s "
             "%s still running", how, running > 1 ? "s" : "", names, running > 1 ? "are" : "is");
    free(left);
    end_job(why);
}

uint64_t fl_dist_digest(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

void fl_dist_note_exit(const char *how) {
    snprintf(fl_dist.exit_note, sizeof fl_dist.exit_note, "%s", how ? how : "");
}

int fl_dist_init(void) {
    if (fl_dist.initialized) return FL_OK;
    if (fl_dist.finalized)
        return fl_fail(FL_ERR_STATE, "dist: the distributed runtime was already finalized");
    double timeout;
    if (read_timeout(&timeout)) return fl_last_status();
    const char *choice = getenv("FSDP_BACKEND");
    char why[128];
    const char *reason = launcher_reason(why, sizeof why);
    bool want_mpi;
    if (choice && *choice && strcmp(choice, "auto") != 0) {
        if (strcmp(choice, "mpi") != 0 && strcmp(choice, "self") != 0)
            return fl_fail(FL_ERR_ARG, "dist: FSDP_BACKEND=%s: expected mpi, self or auto", choice);
        want_mpi = strcmp(choice, "mpi") == 0;
        reason = "FSDP_BACKEND=mpi";
    } else {
        want_mpi = reason != NULL;
    }
    if (!fl_dist.backend) {
        if (want_mpi) {
            if (load_mpi_plugin(reason)) return fl_last_status();
        } else {
            fl_dist.backend = &fl_dist_self_backend;
        }
        fl_dist_topology topo;
        memset(&topo, 0, sizeof topo);
        if (fl_dist.backend->init(&topo) != FL_OK) {
            int status = fl_fail(fl_last_status() ? fl_last_status() : FL_ERR_DEVICE,
                                 "dist: the %s backend failed to start: %s",
                                 fl_dist.backend->name, fl_last_error());
            fl_dist.backend = NULL;
            return status;
        }
        fl_dist.topo = topo;
        /* From here MPI runs: finalize it at exit, or end the job when
         * the process leaves early ([Note: leaving the job]). */
        atexit(leave_at_exit);
    }
    fl_dist_topology topo = fl_dist.topo;
    if (apply_ranks_per_node(&topo)) return fl_last_status();
    fl_dist.topo = topo;
    fl_dist.timeout = timeout;
    fl_dist.world = fl_group_wrap(fl_dist.backend->world(), "world");
    if (!fl_dist.world) return fl_last_status();
    fl_dist.initialized = true;
    start_pokes();
    return FL_OK;
}

int fl_dist_ensure(void) { return fl_dist.initialized ? FL_OK : fl_dist_init(); }

bool fl_dist_is_initialized(void) { return fl_dist.initialized; }

const char *fl_dist_backend_name(void) {
    return fl_dist_ensure() ? NULL : fl_dist.backend->name;
}

#define TOPO_GETTER(fn, field)                                                \
    int fn(void) { return fl_dist_ensure() ? -1 : fl_dist.topo.field; }
TOPO_GETTER(fl_dist_rank, rank)
TOPO_GETTER(fl_dist_world_size, size)
TOPO_GETTER(fl_dist_local_rank, local_rank)
TOPO_GETTER(fl_dist_local_size, local_size)
TOPO_GETTER(fl_dist_node, node)
TOPO_GETTER(fl_dist_nodes, nodes)
#undef TOPO_GETTER

double fl_dist_timeout(void) {
    if (fl_dist.initialized) return fl_dist.timeout;
    double t;
    return read_timeout(&t) ? DEFAULT_TIMEOUT_SECONDS : t;
}

int fl_dist_set_timeout(double seconds) {
    if (!(seconds > 0) || !isfinite(seconds))
        return fl_fail(FL_ERR_ARG, "dist: the collective timeout must be a positive number of "
                                   "seconds, got %g",
                       seconds);
    if (fl_dist_ensure()) return fl_last_status();
    fl_dist.timeout = seconds;
    return FL_OK;
}

void fl_dist_finalize(void) {
    if (!fl_dist.backend || fl_dist.finalized) return;
    /* MPI_Finalize with a collective that may never complete could wait
     * for ever ([Note: a collective that never completes]). */
    if (fl_dist.broken && is_job()) end_job(fl_dist.broken_message);
    /* Ranks leaving early wait for the others to leave too. */
    fl_set_allocation_hook(NULL);
    if (fl_dist.initialized && is_job() && fl_dist.backend->leave)
        fl_dist.backend->leave("finished");
    if (fl_dist.initialized) {
        fl_dist_drain_dropped(fl_dist.timeout);
        fl_group_release(fl_dist.world);
        fl_dist.world = NULL;
        fl_dist_free_retired_comms();
    }
    fl_dist.initialized = false;
    fl_dist.finalized = true;
    fl_dist.backend->finalize();
}

void fl_dist_abort_on_error(const char *message) {
    int rank = fl_dist.backend ? fl_dist.topo.rank : fl_dist_launcher_rank();
    bool job = fl_dist_launcher_rank() >= 0 ||
               (fl_dist.backend && fl_dist.backend != &fl_dist_self_backend);
    if (!job) return;
    fflush(stdout);
    fprintf(stderr, "fsdp-lua: rank %d: %s\n", rank, message ? message : "(no message)");
    if (fl_dist.backend && fl_dist.backend != &fl_dist_self_backend && !fl_dist.finalized) {
        fprintf(stderr, "fsdp-lua: rank %d: aborting the job (%d ranks)\n", rank,
                fl_dist.topo.size);
        fflush(stderr);
        fl_dist.backend->abort(1);
    }
    /* No backend running: the launcher ends the job when a rank exits with
     * a failure (mpirun and srun both do by default). */
    exit(1);
}
