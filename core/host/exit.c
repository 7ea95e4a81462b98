/*
 * exit.c: how the host's process ends, for the distributed runtime.
 *
 * A script that calls os.exit() leaves without finishing; in a job of
 * several ranks that must end the job rather than leave the others
 * waiting for this rank ([Note: leaving the job] in core/comm/dist.c).
 * os.exit is wrapped so the message can say where the script left
 * ("os.exit(0) at train.lua:12"); host_finish is the other end: the
 * script (or REPL) finished, so the runtime finalizes normally.
 */
#include "host.h"

#include <stdio.h>
#include <string.h>

#include <lauxlib.h>

#include "fsdp.h"

/* os.exit([code [, close]]) with a note first; upvalue 1 is the original. */
static int noted_exit(lua_State *L) {
    char code[32] = "";
    if (lua_type(L, 1) == LUA_TBOOLEAN)
        snprintf(code, sizeof code, "%s", lua_toboolean(L, 1) ? "true" : "false");
    else if (lua_type(L, 1) == LUA_TNUMBER)
        snprintf(code, sizeof code, "%d", (int)lua_tointeger(L, 1));
    luaL_where(L, 1); /* "file:line:" of the caller, or "" */
    const char *where = lua_tostring(L, -1);
    size_t n = where ? strlen(where) : 0;
    while (n > 0 && (where[n - 1] == ' ' || where[n - 1] == ':')) n--;
    char note[256];
    if (n > 0)
        snprintf(note, sizeof note, "os.exit(%s) at %.*s", code, (int)n, where);
    else
        snprintf(note, sizeof note, "os.exit(%s)", code);
    lua_pop(L, 1);
    fl_dist_note_exit(note);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

void host_wrap_os_exit(lua_State *L) {
    lua_getglobal(L, "os");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_getfield(L, -1, "exit");
    lua_pushcclosure(L, noted_exit, 1);
    lua_setfield(L, -2, "exit");
    lua_pop(L, 1);
}

void host_finish(void) { fl_dist_finalize(); }
