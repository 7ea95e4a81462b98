/*
 * main.c: the fsdp-lua executable's command line.
 *
 *   fsdp-lua [options] [script [args...]]
 *   fsdp-lua --nproc N [options] script [args...]   (N ranks under mpirun)
 *
 * It behaves like lua.c where the two overlap: -e chunks run in order, then
 * the script with the `arg` table and `...`, then the REPL with -i; with no
 * script and no -e it is a REPL on a terminal and runs standard input
 * otherwise. An error anywhere prints "fsdp-lua: <message>" and a traceback
 * and exits 1; a bad command line exits 2; a run that ended without an
 * error exits with what fsdp.host.set_exit_status asked (0 by default).
 *
 * Before any user code runs, package.path gets the project root (see
 * paths.c) and package.preload gets `fsdp.host` (hostlib.c) and the old
 * names of renamed modules (lua/fsdp/renamed.lua).
 *
 * --nproc N replaces this process with `mpirun -np N` running the same
 * executable and arguments (see launch_ranks), so mpirun's exit status is
 * the command's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "host.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>

#include "fsdp.h"

enum { EXIT_USAGE = 2 };

typedef struct options {
    int script;        /* argv index of the script; 0 when there is none */
    bool has_e;        /* at least one -e */
    bool interactive;  /* -i */
    bool version;      /* -v, --version */
    bool help;         /* -h, --help */
    bool list;         /* --list, or the script `recipes`: list the recipes */
    int nproc;         /* --nproc N: ranks to start under mpirun; 0: none */
    int nproc_arg;     /* argv index of --nproc */
    int nproc_args;    /* 1 for --nproc=N, 2 for --nproc N */
    const char *bad;   /* the argument that made the command line invalid */
    const char *why;   /* what is wrong with it */
} options;

/* Everything pmain needs, passed through lua_cpcall. */
typedef struct run_context {
    int argc;
    char **argv;
    options opts;
    bool ok;  /* false after any error */
} run_context;

static void print_usage(FILE *out) {
    fputs(
        "usage: " HOST_PROGNAME " [options] [script [args...]]\n"
        "\n"
        "Runs a Lua script with the fsdp-lua library (LuaJIT and the fsdp core).\n"
        "Without a script and -e it starts a REPL when standard input is a\n"
        "terminal, and runs standard input as a chunk otherwise.\n"
        "\n"
        "Options:\n"
        "  -e CODE        run the Lua code CODE (repeatable, run in order,\n"
        "                 before the script)\n"
        "  -i             enter the REPL after running the script and -e code\n"
        "  -v, --version  print version and build information\n"
        "  -h, --help     print this help and exit\n"
        "  --list         list the recipes (recipes/*.lua), one line each; also\n"
        "                 `" HOST_PROGNAME " recipes`. A recipe's options:\n"
        "                 " HOST_PROGNAME " recipes/NAME.lua --help\n"
        "  --nproc N      run as N ranks: starts `mpirun -np N` with this\n"
        "                 executable and the other arguments; allows root and\n"
        "                 more ranks than cores when needed, and gives each\n"
        "                 rank its share of the cores' threads unless\n"
        "                 OMP_NUM_THREADS or OPENBLAS_NUM_THREADS is set;\n"
        "                 N is at most FSDP_MAX_NPROC (see below)\n"
        "  --             stop handling options; the next argument is the script\n"
        "  -              as the script: read it from standard input\n"
        "\n"
        "The script gets its arguments as `...` and in the table `arg`\n"
        "(arg[0] is the script, arg[1] the first argument, as in lua).\n"
        "\n"
        "Environment:\n"
        "  FSDP_LUA_HOME         project root holding lua/, models/ and recipes/\n"
        "                        (default: found from this executable's path)\n"
        "  OMP_NUM_THREADS       threads of the OpenMP CPU kernels\n"
        "  OPENBLAS_NUM_THREADS  threads of OpenBLAS matrix products\n"
        "  OMP_WAIT_POLICY       passive unless set (idle OpenMP threads would\n"
        "                        spin on the cores OpenBLAS needs); then\n"
        "  GOMP_SPINCOUNT        5000 unless set: a short spin before sleeping\n"
        "  FSDP_CPU_ISA          auto (the CPU's), avx2, avx512, avx512_bf16 or\n"
        "                        amx: the highest instructions the CPU kernels and\n"
        "                        libraries use (--version prints the level)\n"
        "  LUA_PATH, LUA_CPATH   module search paths, as in LuaJIT; the\n"
        "                        project's lua/ and root come first\n"
        "  FSDP_BACKEND          mpi, self or auto (default: mpi when a launcher\n"
        "                        such as mpirun or srun started the process)\n"
        "  FSDP_COLLECTIVE_TIMEOUT  seconds a collective may wait (default 600)\n"
        "  FSDP_RANKS_PER_NODE   treat blocks of N consecutive ranks as nodes\n"
        "  FSDP_MPI_LIBRARY      the mpi backend plugin (default: libfsdp_mpi.so\n"
        "                        next to libfsdp.so)\n"
        "  FSDP_MPIRUN           the launcher --nproc runs (default: mpirun)\n"
        "  FSDP_MAX_NPROC        the most ranks --nproc starts (default: 8 per\n"
        "                        usable core, at least 16)\n"
        "  FSDP_PROGRESS_THREAD  0: no thread advancing MPI transfers while the\n"
        "                        rank computes (they advance only in waits)\n"
        "\n"
        "Files:\n"
        "  ~/.fsdp_lua_history   REPL history\n",
        out);
}

static void print_version(void) {
    printf("%s %s\n", HOST_PROGNAME, fl_version());
    printf("%s, cuda=%s; %s\n", fl_build_info(),
           fl_backend_installed(FL_DEVICE_CUDA) ? "plugin" : "off", LUAJIT_VERSION);
    printf("cpu: %s\n", fl_cpu_isa_text());
    fflush(stdout);
}

/* Mark the command line invalid; parsing stops. */
static void reject(options *opts, const char *arg, const char *why) {
    opts->bad = arg;
    opts->why = why;
}

/* Handle argv[*i], an option; may consume the next argument (-e CODE).
 * Returns false when option processing is over (script found or error). */
static bool parse_option(options *opts, int argc, char **argv, int *i) {
    const char *arg = argv[*i];
    if (strcmp(arg, "--") == 0) {
        opts->script = *i + 1 < argc ? *i + 1 : 0;
        return false;
    }
    if (strcmp(arg, "-") == 0) {
        opts->script = *i;
        return false;
    }
    if (strcmp(arg, "-i") == 0) {
        opts->interactive = true;
    } else if (strcmp(arg, "-v") == 0 || strcmp(arg, "--version") == 0) {
        opts->version = true;
    } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
        opts->help = true;
    } else if (strcmp(arg, "--list") == 0) {
        opts->list = true;
    } else if (strcmp(arg, "--nproc") == 0 || strncmp(arg, "--nproc=", 8) == 0) {
        const char *value = arg[7] == '=' ? arg + 8 : NULL;
        opts->nproc_arg = *i;
        opts->nproc_args = value ? 1 : 2;
        if (!value && ++*i < argc) value = argv[*i];
        if (!value) {
            reject(opts, arg, "needs a number of ranks");
            return false;
        }
        char *end;
        errno = 0;
        long n = strtol(value, &end, 10);
        if (errno || *end || end == value || n < 1 || n > 100000) {
            reject(opts, value, "is not a number of ranks for --nproc (1 or more)");
            return false;
        }
        opts->nproc = (int)n;
    } else if (strncmp(arg, "-e", 2) == 0) {
        /* "-e CODE" or "-eCODE", as lua.c accepts both. */
        if (arg[2] == '\0' && ++*i >= argc) {
            reject(opts, arg, "needs an argument");
            return false;
        }
        opts->has_e = true;
    } else {
        reject(opts, arg, "is not a known option");
        return false;
    }
    return true;
}

static options parse_args(int argc, char **argv) {
    options opts = {0};
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-') {
            opts.script = i;
            break;
        }
        if (!parse_option(&opts, argc, argv, &i)) break;
    }
    /* `fsdp-lua recipes` (the directory, not a script) lists them too. */
    if (opts.script != 0 && opts.script == argc - 1 &&
        (strcmp(argv[opts.script], "recipes") == 0 || strcmp(argv[opts.script], "recipes/") == 0)) {
        opts.list = true;
        opts.script = 0;
    }
    return opts;
}

/* Whether the REPL runs at the end: with -i, or when there is nothing else
 * to do and a person is typing. */
static bool repl_will_run(const options *opts) {
    if (opts->interactive) return true;
    if (opts->script != 0 || opts->has_e || opts->version || opts->list) return false;
    return isatty(STDIN_FILENO);
}

/* The global `arg`, as lua.c builds it: arg[0] is the script, arg[1..n] its
 * arguments, and negative indices the interpreter and options before it.
 * Without a script arg[0] is the interpreter and the options follow. */
static void create_arg_table(lua_State *L, int argc, char **argv, int script) {
    lua_createtable(L, argc - script - 1, script + 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script);
    }
    lua_setglobal(L, "arg");
}

static bool run_string(lua_State *L, const char *code) {
    int status = luaL_loadbuffer(L, code, strlen(code), "=(command line)");
    if (status == LUA_OK) status = host_docall(L, 0, 0);
    return host_report(L, status) == LUA_OK;
}

/* All -e chunks, in the order given, up to the script. */
static bool run_e_options(lua_State *L, int argc, char **argv, int end) {
    for (int i = 1; i < end && i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strncmp(argv[i], "-e", 2) != 0) continue;
        const char *code = argv[i][2] != '\0' ? argv[i] + 2 : argv[++i];
        if (!run_string(L, code)) return false;
    }
    return true;
}

/* The script (NULL name: standard input) with args[0..nargs-1] as `...`. */
static bool run_file(lua_State *L, const char *name, char **args, int nargs) {
    int status = luaL_loadfile(L, name);
    if (status == LUA_OK) {
        luaL_checkstack(L, nargs, "too many arguments to script");
        for (int i = 0; i < nargs; i++) lua_pushstring(L, args[i]);
        status = host_docall(L, nargs, 0);
    }
    return host_report(L, status) == LUA_OK;
}

static bool run_script(lua_State *L, int argc, char **argv, int script) {
    const char *name = argv[script];
    /* "-" is standard input, unless it came after "--" (then it is a file). */
    if (strcmp(name, "-") == 0 && strcmp(argv[script - 1], "--") != 0) {
        name = NULL;
    }
    return run_file(L, name, argv + script + 1, argc - script - 1);
}

/* The REPL of lua/fsdp/repl/init.lua, or the built-in one if that cannot load. */
static bool run_repl(lua_State *L) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "fsdp.repl");
    int status = lua_pcall(L, 1, 1, 0);
    if (status == LUA_OK && !lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_pushliteral(L, "it did not return a table");
        status = LUA_ERRRUN;
    }
    if (status != LUA_OK) {
        const char *why = lua_tostring(L, -1);
        lua_pushfstring(L, "cannot load the REPL module fsdp.repl (%s); "
                           "using the built-in REPL",
                        why != NULL ? why : "error object is not a string");
        host_message(lua_tostring(L, -1));
        lua_pop(L, 2);
        host_fallback_repl(L);
        return true;
    }
    lua_getfield(L, -1, "run");
    lua_remove(L, -2);
    return host_report(L, host_docall(L, 0, 0)) == LUA_OK;
}

static void open_libraries(lua_State *L) {
    lua_gc(L, LUA_GCSTOP, 0);  /* no collections while building the state */
    luaL_openlibs(L);
    host_wrap_os_exit(L);
    lua_gc(L, LUA_GCRESTART, -1);
}

/* Set up the state, then -e chunks, the script and the REPL in order. */
static bool run_all(lua_State *L, run_context *ctx) {
    const options *opts = &ctx->opts;
    host_paths paths;
    char err[8192];
    if (!host_find_paths(&paths, ctx->argv[0], err, sizeof err)) {
        host_message(err);
        return false;
    }
    bool repl = repl_will_run(opts);
    open_libraries(L);
    host_set_package_path(L, paths.root);
    host_preload_module(L, &paths, repl);
    /* A root without the library (a bare FSDP_LUA_HOME) has nothing to
     * alias; a library whose renamed.lua fails still reports it. */
    if (paths.root[0] != '\0' &&
        !run_string(L, "if package.searchpath('fsdp.renamed', package.path) then "
                       "require('fsdp.renamed').install(package.preload) end")) {
        return false;
    }
    create_arg_table(L, ctx->argc, ctx->argv, opts->script);
    int end = opts->script != 0 ? opts->script : ctx->argc;
    if (!run_e_options(L, ctx->argc, ctx->argv, end)) return false;
    if (opts->list && !run_string(L, "require('fsdp.options').list()")) return false;
    if (opts->script != 0) {
        if (!run_script(L, ctx->argc, ctx->argv, opts->script)) return false;
    }
    if (repl) return run_repl(L);
    if (opts->script == 0 && !opts->has_e && !opts->version && !opts->list) {
        return run_file(L, NULL, NULL, 0);
    }
    return true;
}

/* Runs under lua_cpcall so that a memory error while setting up the state
 * is reported rather than aborting. */
static int pmain(lua_State *L) {
    run_context *ctx = lua_touserdata(L, 1);
    ctx->ok = run_all(L, ctx);
    return 0;
}

static int run(int argc, char **argv, options opts) {
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        host_message("cannot create the Lua state: not enough memory");
        return EXIT_FAILURE;
    }
    run_context ctx = {argc, argv, opts, false};
    int status = lua_cpcall(L, pmain, &ctx);
    host_report(L, status);
    lua_close(L);
    host_finish();
    return status == LUA_OK && ctx.ok ? host_exit_status() : EXIT_FAILURE;
}

/* Cores this process may run on, counting hyperthreads of one core once:
 * Open MPI gives one slot per core and refuses more ranks than slots
 * unless oversubscription is allowed. */
static int read_int(const char *fmt, int cpu, int fallback) {
    char path[128];
    snprintf(path, sizeof path, fmt, cpu);
    FILE *f = fopen(path, "r");
    int v = fallback;
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = fallback;
        fclose(f);
    }
    return v;
}

static int usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    static int seen[CPU_SETSIZE][2]; /* distinct (package, core) pairs */
    int cores = 0, logical = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        logical++;
        int core = read_int("/sys/devices/system/cpu/cpu%d/topology/core_id", cpu, -1);
        int package =
            read_int("/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu, 0);
        if (core < 0) continue;
        bool known = false;
        for (int c = 0; c < cores && !known; c++)
            known = seen[c][0] == package && seen[c][1] == core;
        if (!known) {
            seen[cores][0] = package;
            seen[cores][1] = core;
            cores++;
        }
    }
    return cores > 0 ? cores : logical > 0 ? logical : 1;
}

/* [Note: --nproc's maximum]
 * Ranks past the cores only oversubscribe them: each rank is a whole
 * process (its Lua state, the core, MPI's shared-memory segments), and a
 * mistyped count (--nproc 100000) ground mpirun for minutes before it
 * failed. So N is bounded by NPROC_PER_CORE ranks per usable core (at
 * least NPROC_FLOOR, which the multi-rank tests use on a 2-core machine)
 * and refused before mpirun starts; FSDP_MAX_NPROC sets another maximum
 * (a job that means it, or a launcher spreading ranks over hosts). */
enum { NPROC_PER_CORE = 8, NPROC_FLOOR = 16 };

static int usable_cores(void);

/* The largest --nproc this machine accepts, and whether FSDP_MAX_NPROC set
 * it; a bad FSDP_MAX_NPROC is reported and ignored. */
static int max_nproc(bool *from_env) {
    *from_env = false;
    const char *env = getenv("FSDP_MAX_NPROC");
    if (env != NULL && *env != '\0') {
        char *end;
        errno = 0;
        long n = strtol(env, &end, 10);
        if (!errno && *end == '\0' && n >= 1 && n <= 1000000) {
            *from_env = true;
            return (int)n;
        }
        fprintf(stderr, "%s: FSDP_MAX_NPROC='%s' is not a number of ranks (1 to 1000000); ignored\n",
                HOST_PROGNAME, env);
    }
    int cores = usable_cores();
    int n = cores * NPROC_PER_CORE;
    return n > NPROC_FLOOR ? n : NPROC_FLOOR;
}

/* --nproc N: exec `mpirun -np N <this executable> <the other arguments>`.
 * Only what the machine needs is added, through Open MPI's environment
 * variables so a user's own settings win: permission to run as root when
 * this is root, oversubscription when N exceeds the cores, shared-memory
 * transfers without cross-process reads (containers often forbid the
 * ptrace-like reads of the single-copy path, which then fails mid-run),
 * and one share of the cores per rank for OpenMP and OpenBLAS threads
 * unless the user set thread counts (N ranks each using every core would
 * oversubscribe them N times). Returns only if mpirun cannot start. */
static int launch_ranks(int argc, char **argv, const options *opts) {
    int rank = fl_dist_launcher_rank();
    if (rank >= 0) {
        fprintf(stderr, "%s: --nproc in a process a launcher already started (rank %d): run "
                        "the script without --nproc\n",
                HOST_PROGNAME, rank);
        return EXIT_USAGE;
    }
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        snprintf(exe, sizeof exe, "%s", argv[0]);
    } else {
        exe[len] = '\0';
    }
    const char *mpirun = getenv("FSDP_MPIRUN");
    if (mpirun == NULL || *mpirun == '\0') mpirun = "mpirun";
    char np[16];
    snprintf(np, sizeof np, "%d", opts->nproc);
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (args == NULL) {
        host_message("--nproc: out of memory");
        return EXIT_FAILURE;
    }
    int k = 0;
    args[k++] = (char *)mpirun;
    args[k++] = "-np";
    args[k++] = np;
    args[k++] = exe;
    for (int i = 1; i < argc; i++) {
        if (i >= opts->nproc_arg && i < opts->nproc_arg + opts->nproc_args) continue;
        args[k++] = argv[i];
    }
    args[k] = NULL;
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    int cores = usable_cores();
    if (opts->nproc > cores) setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
    if (!getenv("OMP_NUM_THREADS") && !getenv("OPENBLAS_NUM_THREADS")) {
        char threads[16];
        snprintf(threads, sizeof threads, "%d", cores / opts->nproc > 1 ? cores / opts->nproc : 1);
        setenv("OMP_NUM_THREADS", threads, 1);
        setenv("OPENBLAS_NUM_THREADS", threads, 1);
    }
    fflush(stdout);
    execvp(mpirun, args);
    fprintf(stderr, "%s: --nproc %d: cannot run %s: %s (install Open MPI's mpirun, or set "
                    "FSDP_MPIRUN)\n",
            HOST_PROGNAME, opts->nproc, mpirun, strerror(errno));
    free(args);
    return 127;
}

/* [Note: OpenMP wait policy]
 * OpenMP's idle workers spin after each parallel region by default (about
 * 3 ms: libgomp's 300000 pauses), on the very cores the next kernel, a
 * pthread OpenBLAS or another rank needs: a training step ran 2x slower
 * that way. Sleeping at once (OMP_WAIT_POLICY=passive) costs a futex wake
 * per region instead, and a step has thousands of regions, each a few
 * tens of microseconds after the last: the bf16 small Llama step
 * (benchmarks/train_step.lua) took 390 ms passive and 353-360 ms with
 * workers spinning 2000-5000 pauses (20-50 us here) before they sleep,
 * with the sgemm rate unchanged (fully active spinning halved it). So the
 * host sets OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT=5000 (libgomp's
 * spin before sleeping, which its passive policy would set to 0), and
 * executes itself again once, as libgomp reads both when it is loaded,
 * before main. A policy or spin count the user set is kept. With more
 * OpenMP threads than cores (ranks sharing them) the passive policy still
 * never spins: libgomp's spin for that case stays 0 under it.
 * The same execution also caps OpenBLAS at the CPU level in force
 * ([Note: CPU ISA levels], core/base/cpu_isa.c): OpenBLAS picks its kernels
 * when it is loaded, so FSDP_CPU_ISA=avx2 on a CPU with AVX-512 sets
 * OPENBLAS_CORETYPE=Haswell (unless the user set one) before it. */
static void prepare_environment(char **argv) {
    bool again = false;
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) {
        again = true;
        if (!getenv("GOMP_SPINCOUNT")) setenv("GOMP_SPINCOUNT", "5000", 1);
    }
    const char *core = fl_cpu_isa_openblas_coretype();
    if (core && !getenv("OPENBLAS_CORETYPE") && setenv("OPENBLAS_CORETYPE", core, 1) == 0)
        again = true;
    if (again) execv("/proc/self/exe", argv);
    /* Exec failed: carry on with the default policy and kernels. */
}

int main(int argc, char **argv) {
    prepare_environment(argv);
    options opts = parse_args(argc, argv);
    if (opts.bad != NULL) {
        fprintf(stderr, "%s: '%s' %s\n", HOST_PROGNAME, opts.bad, opts.why);
        fprintf(stderr, "Try '%s --help' for more information.\n",
                HOST_PROGNAME);
        return EXIT_USAGE;
    }
    if (opts.help) {
        print_usage(stdout);
        return EXIT_SUCCESS;
    }
    if (fl_cpu_isa_check() != FL_OK) {
        fprintf(stderr, "%s: %s\n", HOST_PROGNAME, fl_last_error());
        return EXIT_USAGE;
    }
    if (opts.nproc > 0) {
        bool from_env;
        int max = max_nproc(&from_env);
        if (opts.nproc > max) {
            if (from_env) {
                fprintf(stderr, "%s: --nproc %d is more than FSDP_MAX_NPROC=%d ranks\n", HOST_PROGNAME,
                        opts.nproc, max);
            } else {
                fprintf(stderr, "%s: --nproc %d is more than this machine's maximum of %d ranks (%d per usable "
                                "core, %d cores); set FSDP_MAX_NPROC to allow more\n",
                        HOST_PROGNAME, opts.nproc, max, NPROC_PER_CORE, usable_cores());
            }
            return EXIT_USAGE;
        }
        return launch_ranks(argc, argv, &opts);
    }
    if (opts.version) print_version();
    /* -v alone only prints; it needs no Lua state and no project root. */
    if (opts.version && !opts.interactive && !opts.has_e && opts.script == 0) {
        return EXIT_SUCCESS;
    }
    return run(argc, argv, opts);
}
