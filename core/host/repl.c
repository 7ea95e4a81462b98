/*
 * repl.c: the built-in REPL, used only when lua/fsdp/repl/init.lua cannot be
 * loaded (no project root found, or a broken library), so that the
 * executable is still a working Lua prompt to find out what is wrong.
 *
 * It follows lua.c: a line is compiled as "return <line>" first so that
 * expressions print their values, else as a statement; input whose error is
 * at '<eof>' is incomplete and more lines are read.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>

#define CHUNK_NAME "=stdin"

/* Whether the compile error on top of the stack means "input incomplete". */
static bool error_at_eof(lua_State *L) {
    size_t len;
    const char *msg = lua_tolstring(L, -1, &len);
    static const char mark[] = "'<eof>'";
    size_t mark_len = sizeof mark - 1;
    return msg != NULL && len >= mark_len &&
           strcmp(msg + len - mark_len, mark) == 0;
}

/* Compile code as an expression, else as a statement. Leaves the function
 * (returns 0) or the statement's error message (returns the status); sets
 * *incomplete when either form failed only for lack of input. */
static int compile(lua_State *L, const char *code, bool *incomplete) {
    lua_pushfstring(L, "return %s", code);
    size_t len;
    const char *expr = lua_tolstring(L, -1, &len);
    int status = luaL_loadbuffer(L, expr, len, CHUNK_NAME);
    lua_remove(L, -2);
    if (status == LUA_OK) return status;
    bool expr_incomplete = error_at_eof(L);
    lua_pop(L, 1);
    status = luaL_loadbuffer(L, code, strlen(code), CHUNK_NAME);
    *incomplete = status != LUA_OK && (expr_incomplete || error_at_eof(L));
    return status;
}

/* Print the values above `base` with the global print, as lua.c does. */
static void print_results(lua_State *L, int base) {
    int n = lua_gettop(L) - base;
    if (n == 0) return;
    lua_getglobal(L, "print");
    lua_insert(L, base + 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK) {
        fprintf(stderr, "error calling 'print' (%s)\n", lua_tostring(L, -1));
        lua_pop(L, 1);
    }
}

static void print_error(lua_State *L) {
    const char *msg = lua_tostring(L, -1);
    fflush(stdout);
    fprintf(stderr, "%s\n", msg != NULL ? msg : "(error object is not a string)");
    fflush(stderr);
    lua_pop(L, 1);
}

/* Append line (and a newline if code is not empty) to the malloc'd code. */
static char *append_line(char *code, const char *line) {
    size_t old = code != NULL ? strlen(code) : 0;
    size_t add = strlen(line);
    char *grown = realloc(code, old + add + 2);
    if (grown == NULL) {
        free(code);
        return NULL;
    }
    if (old > 0) grown[old++] = '\n';
    memcpy(grown + old, line, add + 1);
    return grown;
}

/* Run one complete input: compile, call, print. Returns false when more
 * input is needed. */
static bool eval(lua_State *L, const char *code) {
    int base = lua_gettop(L);
    bool incomplete = false;
    int status = compile(L, code, &incomplete);
    if (incomplete) {
        lua_pop(L, 1);
        return false;
    }
    if (status == LUA_OK) status = host_docall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) {
        print_results(L, base);
    } else {
        print_error(L);
    }
    lua_settop(L, base);
    return true;
}

void host_fallback_repl(lua_State *L) {
    char *code = NULL;
    for (;;) {
        char *line = NULL;
        host_read_status st = host_read_line(code != NULL ? ">> " : "> ", &line);
        if (st == HOST_READ_EOF) break;
        if (st == HOST_READ_INTERRUPTED) {
            free(code);
            code = NULL;
            continue;
        }
        host_add_history(line);
        code = append_line(code, line);
        free(line);
        if (code == NULL) luaL_error(L, "not enough memory");
        if (eval(L, code)) {
            free(code);
            code = NULL;
        }
    }
    free(code);
    /* End the prompt's line so the shell's prompt starts on its own. */
    if (isatty(STDIN_FILENO)) fputs("\n", stdout);
    fflush(stdout);
}
