/*
 * hostlib.c: the `fsdp.host` module, what the executable tells Lua about
 * itself.
 *
 *   root         project root (lua/, models/, recipes/), nil if not found
 *   exe          absolute path of this executable
 *   version      fl_version() of the core
 *   build_info   fl_build_info() of the core
 *   cuda_built   whether the CUDA backend (its plugin) is installed
 *   interactive  true when the REPL will run in this process
 *   readline(prompt)   -> line; nil at end of input; nil, "interrupted"
 *                         after Ctrl-C at the prompt
 *   add_history(line)  remember a line for the terminal's line editor
 *   history_file()     -> path of the history file, nil without $HOME
 *   isatty(fd)         -> whether file descriptor fd is a terminal
 *   set_completer(fn)  Tab in the terminal line editor calls
 *                      fn(line_before_cursor, word) -> {replacement, ...}
 *                      (nil: no completion); errors in fn complete nothing
 *   set_exit_status(n) the status the process exits with when its script
 *                      (and REPL) end without an error (default 0): a run
 *                      that finished but lost some of its output says so
 *                      by its status ([Note: failed output writes] in
 *                      lua/fsdp/observe/outputs.lua); an error still exits 1
 *   exit_status()      -> that status
 *
 * It is built in C and needs nothing from lua/, so the REPL works even when
 * the Lua library cannot load.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "host.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>

#include "fsdp.h"

/* The Lua completer (a registry reference) and the state that is reading a
 * line, in which it runs: the editor calls it from inside host.readline. */
static int completer_ref = LUA_NOREF;

static char **complete_in_lua(void *data, const char *before, const char *word) {
    lua_State *L = data;
    int top = lua_gettop(L);
    if (!lua_checkstack(L, 4)) return NULL;
    lua_rawgeti(L, LUA_REGISTRYINDEX, completer_ref);
    lua_pushstring(L, before);
    lua_pushstring(L, word);
    if (lua_pcall(L, 2, 1, 0) != LUA_OK || !lua_istable(L, -1)) {
        lua_settop(L, top);
        return NULL;
    }
    size_t n = lua_objlen(L, -1);
    char **items = calloc(n + 1, sizeof *items);
    size_t k = 0;
    for (size_t i = 1; items != NULL && i <= n; i++) {
        lua_rawgeti(L, -1, (int)i);
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (s != NULL && (items[k] = strdup(s)) != NULL) k++;
        lua_pop(L, 1);
    }
    lua_settop(L, top);
    return items;
}

static int host_set_completer_lua(lua_State *L) {
    if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TFUNCTION);
    luaL_unref(L, LUA_REGISTRYINDEX, completer_ref);
    lua_settop(L, 1);
    completer_ref = lua_isnil(L, 1) ? LUA_NOREF : luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

static int host_readline(lua_State *L) {
    const char *prompt = luaL_optstring(L, 1, "> ");
    char *line = NULL;
    host_set_completer(completer_ref != LUA_NOREF ? complete_in_lua : NULL, L);
    host_read_status status = host_read_line(prompt, &line);
    host_set_completer(NULL, NULL);
    switch (status) {
    case HOST_READ_LINE:
        lua_pushstring(L, line);
        free(line);
        return 1;
    case HOST_READ_INTERRUPTED:
        lua_pushnil(L);
        lua_pushliteral(L, "interrupted");
        return 2;
    case HOST_READ_EOF:
    default:
        lua_pushnil(L);
        return 1;
    }
}

static int host_add_history_lua(lua_State *L) {
    host_add_history(luaL_checkstring(L, 1));
    return 0;
}

static int host_history_file_lua(lua_State *L) {
    const char *file = host_history_file();
    if (file == NULL) {
        lua_pushnil(L);
    } else {
        lua_pushstring(L, file);
    }
    return 1;
}

static int exit_status;

int host_exit_status(void) { return exit_status; }

static int host_set_exit_status_lua(lua_State *L) {
    int n = luaL_checkint(L, 1);
    luaL_argcheck(L, n >= 0 && n <= 255, 1, "an exit status is 0 to 255");
    exit_status = n;
    return 0;
}

static int host_exit_status_lua(lua_State *L) {
    lua_pushinteger(L, exit_status);
    return 1;
}

static int host_isatty(lua_State *L) {
    lua_pushboolean(L, isatty(luaL_checkint(L, 1)));
    return 1;
}

/* The loader in package.preload; upvalues: root (or nil), exe, interactive. */
static int open_host_module(lua_State *L) {
    static const luaL_Reg functions[] = {
        {"readline", host_readline},
        {"add_history", host_add_history_lua},
        {"history_file", host_history_file_lua},
        {"isatty", host_isatty},
        {"set_completer", host_set_completer_lua},
        {"set_exit_status", host_set_exit_status_lua},
        {"exit_status", host_exit_status_lua},
        {NULL, NULL},
    };
    lua_newtable(L);
    luaL_register(L, NULL, functions);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_setfield(L, -2, "root");
    lua_pushvalue(L, lua_upvalueindex(2));
    lua_setfield(L, -2, "exe");
    lua_pushvalue(L, lua_upvalueindex(3));
    lua_setfield(L, -2, "interactive");
    lua_pushstring(L, fl_version());
    lua_setfield(L, -2, "version");
    lua_pushstring(L, fl_build_info());
    lua_setfield(L, -2, "build_info");
    lua_pushboolean(L, fl_backend_installed(FL_DEVICE_CUDA));
    lua_setfield(L, -2, "cuda_built");
    return 1;
}

void host_preload_module(lua_State *L, const host_paths *paths,
                         bool interactive) {
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    if (paths->root[0] != '\0') {
        lua_pushstring(L, paths->root);
    } else {
        lua_pushnil(L);
    }
    lua_pushstring(L, paths->exe);
    lua_pushboolean(L, interactive);
    lua_pushcclosure(L, open_host_module, 3);
    lua_setfield(L, -2, "fsdp.host");
    lua_pop(L, 2);
}
