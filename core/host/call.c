/*
 * call.c: running Lua code protected, the way lua.c does.
 *
 * Every chunk the host runs (script, -e code, stdin, the REPL) goes through
 * host_docall: errors come back with a traceback appended, whatever the type
 * of the error object, and Ctrl-C while Lua runs becomes an "interrupted!"
 * error raised from a debug hook, so the script's own pcalls and the REPL can
 * catch it like any other error. Reporting an error that ends the run also
 * ends the other ranks of a multi-rank job (fl_dist_abort_on_error).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "host.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>

#include "fsdp.h"

/* The state that SIGINT interrupts, and how many host_docall frames are
 * active (the REPL run from a script nests them). Signal handlers may only
 * touch the state through lua_sethook, which LuaJIT allows asynchronously. */
static lua_State *volatile interrupt_state;
static int docall_depth;
/* SIGINT's disposition before the outermost host_docall, restored after. */
static struct sigaction outer_sigint;

/* Message handler: turn any error object into "message\nstack traceback:".
 * busted raises error(nil) when specs fail, and libraries raise tables with
 * __tostring, so a non-string must still give a readable message. */
static int message_handler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_isstring(L, -1)) {
            msg = lua_tostring(L, -1);
        } else {
            msg = lua_pushfstring(L, "(error object is a %s value)",
                                  luaL_typename(L, 1));
        }
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Debug hook installed by the signal handler: raise the error at the next
 * call, return or instruction count, then remove itself. Code compiled by the
 * JIT does not run hooks; a second Ctrl-C then ends the process (the handler
 * is one-shot), as with luajit. */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted!");
}

static void on_sigint(int sig) {
    (void)sig;
    lua_sethook(interrupt_state, interrupt_hook,
                LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static void install_sigint_handler(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_sigint;
    sigemptyset(&action.sa_mask);
    /* One-shot, and blocking reads (io.read) restart rather than fail. */
    action.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &action, NULL);
}

void host_interrupt_rearm(void) {
    if (docall_depth == 0) return;
    /* A Ctrl-C that reached our handler while the line editor owned SIGINT
     * was meant for the prompt, not for the next chunk. */
    if (lua_gethook(interrupt_state) == interrupt_hook) {
        lua_sethook(interrupt_state, NULL, 0, 0);
    }
    install_sigint_handler();
}

int host_docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;  /* where the function is */
    lua_pushcfunction(L, message_handler);
    lua_insert(L, base);
    if (docall_depth++ == 0) {
        sigaction(SIGINT, NULL, &outer_sigint);
        interrupt_state = L;
    }
    install_sigint_handler();
    int status = lua_pcall(L, narg, nres, base);
    if (--docall_depth == 0) {
        sigaction(SIGINT, &outer_sigint, NULL);
        if (lua_gethook(L) == interrupt_hook) lua_sethook(L, NULL, 0, 0);
    }
    lua_remove(L, base);
    return status;
}

void host_message(const char *message) {
    fflush(stdout);
    fprintf(stderr, "%s: %s\n", HOST_PROGNAME, message);
    fflush(stderr);
}

int host_report(lua_State *L, int status) {
    if (status == LUA_OK) return status;
    const char *msg = lua_tostring(L, -1);
    if (msg == NULL) msg = "(error object is not a string)";
    /* Every report ends the run. In a job with several ranks the others
     * would wait for this one forever: this prints the rank and ends the
     * whole job instead (it returns only in a single-process run). */
    fl_dist_abort_on_error(msg);
    host_message(msg);
    lua_pop(L, 1);
    return status;
}
