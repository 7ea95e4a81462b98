/*
 * embed.c: fsdp-lua embedded in a C program through its public API (the
 * example of docs/embedding.md, "Embedding fsdp-lua"; built as build/bin/fsdp-embed
 * and run by tests/embed/run.sh).
 *
 *   fsdp-embed [ROOT]    ROOT: the project root (the directory holding
 *                        lua/fsdp/); default $FSDP_LUA_HOME
 *
 * The program makes its own LuaJIT state (Debian's shared libluajit-5.1,
 * not fsdp-lua's host), puts ROOT/lua on package.path and runs a Lua chunk
 * that builds a tiny classifier and returns its training step. Each step
 * hands the loss to C as an fl_tensor * (a new reference), which C reads
 * with fl_to_host and releases with fl_tensor_release. It prints one line
 * per step and fails (exit 1) unless the loss fell: the optimizer ran.
 *
 * Lua reaches the core through ffi.C, because this program links
 * libfsdp.so ([Note: finding the core library] in lua/fsdp/core.lua).
 */
#include <stdio.h>
#include <stdlib.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "fsdp.h"

enum { STEPS = 3 };

/* Run in the program's state; returns step(slot): one training step, the
 * loss stored through slot (an fl_tensor ** passed as a light userdata)
 * as a reference the caller owns. Tensor.cptr and Tensor.wrap are the
 * Lua side of the bridge: a tensor's C handle, and the way back. */
static const char STEP_CHUNK[] =
    "local ffi = require 'ffi'\n"
    "local fsdp = require 'fsdp'\n"
    "local nn, F = fsdp.nn, fsdp.F\n"
    "local model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"
    "model:init_weights({seed = 0})\n"
    "local opt = fsdp.optim.AdamW(model:named_parameters(), {lr = 1e-2})\n"
    "local x = fsdp.randn({32, 8}, {seed = 1})\n"
    "local y = fsdp.randint(0, 4, {32}, {seed = 2})\n"
    "return function(slot)\n"
    "  local loss = F.cross_entropy(model:forward(x), y)\n"
    "  loss:backward()\n"
    "  opt:step()\n"
    "  opt:zero_grad()\n"
    "  ffi.cast('fl_tensor **', slot)[0] = fsdp.C.fl_tensor_retain(fsdp.Tensor.cptr(loss))\n"
    "end\n";

/* Prepend ROOT's Lua directories to package.path, as fsdp-lua does. */
static void set_package_path(lua_State *L, const char *root) {
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s", root, root, lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
}

/* Report the Lua error on top of the stack; returns 1 (the exit status). */
static int lua_failed(lua_State *L, const char *what) {
    fprintf(stderr, "fsdp-embed: %s: %s\n", what, lua_tostring(L, -1));
    lua_close(L);
    return 1;
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : getenv("FSDP_LUA_HOME");
    if (argc > 2 || root == NULL || root[0] == '\0') {
        fprintf(stderr, "usage: fsdp-embed [ROOT] (the directory holding lua/fsdp/; "
                        "default $FSDP_LUA_HOME)\n");
        return 2;
    }
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        fprintf(stderr, "fsdp-embed: cannot create a Lua state\n");
        return 1;
    }
    luaL_openlibs(L);
    set_package_path(L, root);

    if (luaL_loadbuffer(L, STEP_CHUNK, sizeof STEP_CHUNK - 1, "=step") != 0 ||
        lua_pcall(L, 0, 1, 0) != 0)
        return lua_failed(L, "building the model");
    int step_fn = luaL_ref(L, LUA_REGISTRYINDEX);

    double losses[STEPS];
    for (int s = 0; s < STEPS; s++) {
        fl_tensor *loss = NULL;
        lua_rawgeti(L, LUA_REGISTRYINDEX, step_fn);
        lua_pushlightuserdata(L, &loss);
        if (lua_pcall(L, 1, 0, 0) != 0) return lua_failed(L, "training step");
        /* The loss is ours now: a 0-d f32 tensor on the cpu. */
        int rc = fl_to_host(loss, &losses[s], FL_F64, 1);
        fl_tensor_release(loss);
        if (rc != FL_OK) {
            fprintf(stderr, "fsdp-embed: reading the loss: %s\n", fl_last_error());
            lua_close(L);
            return 1;
        }
        printf("step %d loss %.6f\n", s + 1, losses[s]);
    }
    lua_close(L);
    if (!(losses[STEPS - 1] < losses[0])) {
        fprintf(stderr, "fsdp-embed: the loss did not fall (%.6f -> %.6f)\n", losses[0],
                losses[STEPS - 1]);
        return 1;
    }
    return 0;
}
