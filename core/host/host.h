/*
 * host.h: declarations shared by the files of the fsdp-lua executable.
 *
 * The executable is a LuaJIT host in the manner of lua.c: main.c parses the
 * command line and runs chunks; call.c runs them protected (tracebacks,
 * Ctrl-C); paths.c finds the project root so `require` works from any
 * directory; lineedit.c reads lines (libedit on a terminal) and keeps the
 * history; hostlib.c exposes all of that to Lua as the module `fsdp.host`;
 * repl.c is the small built-in REPL used when lua/fsdp/repl/init.lua cannot load.
 */
#ifndef FL_HOST_H
#define FL_HOST_H

#include <stdbool.h>
#include <stddef.h>

#include <lua.h>

#define HOST_PROGNAME "fsdp-lua"

/* ---- call.c: protected calls -------------------------------------------- */

/* Call the function below `narg` arguments on the stack like lua_pcall, with
 * a traceback for errors and Ctrl-C turned into an "interrupted!" error. */
int host_docall(lua_State *L, int narg, int nres);
/* If status is an error, print "fsdp-lua: <message>" (the message already
 * carries its traceback) to stderr and pop it. Returns status. */
int host_report(lua_State *L, int status);
/* Print "fsdp-lua: <message>" to stderr, after flushing stdout so the two
 * streams interleave in the order things happened. */
void host_message(const char *message);
/* While host_docall runs, SIGINT interrupts Lua. host_interrupt_rearm puts
 * that handler back after something (the line editor) replaced it, and drops
 * an interrupt that arrived meanwhile; it does nothing outside host_docall. */
void host_interrupt_rearm(void);

/* ---- paths.c: where the executable and the project live ----------------- */

typedef struct host_paths {
    char exe[4096];   /* absolute path of the executable ("" if unknown) */
    char root[4096];  /* project root holding lua/fsdp ("" if not found) */
} host_paths;

/* Fill paths. Returns false, with a message in err, only when FSDP_LUA_HOME
 * is set and does not name a project root; a root that simply cannot be
 * found leaves paths->root empty and returns true. */
bool host_find_paths(host_paths *paths, const char *argv0, char *err,
                     size_t err_size);
/* Prepend the root's Lua directories to package.path (no-op without root). */
void host_set_package_path(lua_State *L, const char *root);

/* ---- lineedit.c: reading lines and the history -------------------------- */

typedef enum host_read_status {
    HOST_READ_LINE,        /* a line was read */
    HOST_READ_EOF,         /* end of input (Ctrl-D) */
    HOST_READ_INTERRUPTED  /* Ctrl-C at the prompt: the line is dropped */
} host_read_status;

/* Read one line without its newline into *line (malloc'd, caller frees).
 * On a terminal this is libedit with history; otherwise a plain read with no
 * prompt, so piped input gives clean output. */
host_read_status host_read_line(const char *prompt, char **line);
/* Remember a line in the history (empty lines and repeats are skipped). */
void host_add_history(const char *line);
/* $HOME/.fsdp_lua_history, or NULL when HOME is unset. */
const char *host_history_file(void);
/* Tab completion: given the line up to the cursor and the word being
 * completed (its tail), return a malloc'd NULL-terminated array of malloc'd
 * replacements for the word, or NULL for none. */
typedef char **(*host_completer)(void *data, const char *before, const char *word);
/* Set (or with NULL clear) the completer the terminal line editor uses. */
void host_set_completer(host_completer fn, void *data);

/* ---- hostlib.c: the `fsdp.host` Lua module ------------------------------ */

/* Register `fsdp.host` in package.preload. interactive says whether the REPL
 * will run; the strings are copied. */
void host_preload_module(lua_State *L, const host_paths *paths,
                         bool interactive);
/* The status set by fsdp.host.set_exit_status (0 unless set): what the
 * process exits with when everything ran without an error. */
int host_exit_status(void);

/* ---- repl.c: the built-in fallback REPL --------------------------------- */

/* A minimal read-eval-print loop in C (expressions print their values,
 * multi-line input, errors do not stop it). Returns at end of input. */
void host_fallback_repl(lua_State *L);

/* exit.c: os.exit notes where the script left (for the distributed
 * runtime's message); host_finish ends the runtime after a finished run. */
void host_wrap_os_exit(lua_State *L);
void host_finish(void);

#endif /* FL_HOST_H */
