/*
 * fuzz_lua.c: libFuzzer harness for the readers written in Lua, run in the
 * embedded LuaJIT as fsdp-lua runs them: the token-shard reader
 * (fsdp.data.tokens) and the checkpoint index reader
 * (fsdp.checkpointing.directory.read_index), over the C core below them.
 *
 * FUZZ_TARGET names a script in tests/fuzz/targets/ returning a function
 * of the input file's path; a Lua error is a refusal (fine), anything the
 * sanitizers see or a signal is a bug. The project root is the current
 * directory or $FUZZ_ROOT.
 */
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "fuzz_input.h"

/* No leak checks here: the Lua state lives for the whole run and keeps
 * what it cached (modules, cjson's buffers), which LeakSanitizer would
 * report at exit and, with libFuzzer's per-input checks, after inputs that
 * grew a cache. Memory errors are still checked (AddressSanitizer). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "detect_leaks=0"; }

static lua_State *L;
static int target_ref = LUA_NOREF;

/* Lua line coverage for the fuzzer: libFuzzer reads extra counters from
 * this section, so it is guided by the Lua lines an input reaches (the
 * readers' checks are Lua; their JSON decoder, lua-cjson, is not
 * instrumented), not only by the C core's branches. A line is its chunk's
 * interned source string and its number, hashed into the array. */
enum { LUA_COUNTERS = 1 << 16 };
__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t lua_counters[LUA_COUNTERS];

static void line_hook(lua_State *Ls, lua_Debug *ar) {
    if (!lua_getinfo(Ls, "S", ar)) return;
    uint64_t h = ((uint64_t)(uintptr_t)ar->source * 31 + (uint64_t)ar->currentline) * 0x9E3779B97F4A7C15ull;
    uint8_t *c = &lua_counters[h >> 48];
    if (*c < 255) (*c)++;
}
static unsigned long runs;

static void die(const char *what) {
    fprintf(stderr, "fuzz_lua: %s: %s\n", what, L ? lua_tostring(L, -1) : "");
    exit(2);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *root = getenv("FUZZ_ROOT") ? getenv("FUZZ_ROOT") : ".";
    const char *target = getenv("FUZZ_TARGET");
    if (!target) {
        fprintf(stderr, "fuzz_lua: set FUZZ_TARGET to a script of tests/fuzz/targets/ (tokens, index, tokenizer, corpus, position)\n");
        exit(2);
    }
    L = luaL_newstate();
    luaL_openlibs(L);
    lua_pushfstring(L, "package.path = '%s/lua/?.lua;%s/lua/?/init.lua;' .. package.path\n"
                       "require('jit').off()\n"
                       "return dofile('%s/tests/fuzz/targets/%s.lua')",
                    root, root, root, target);
    if (luaL_loadstring(L, lua_tostring(L, -1)) != 0 || lua_pcall(L, 0, 1, 0) != 0)
        die("loading the target");
    if (!lua_isfunction(L, -1)) die("the target script must return a function");
    target_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    lua_rawgeti(L, LUA_REGISTRYINDEX, target_ref);
    lua_pushstring(L, path);
    lua_sethook(L, line_hook, LUA_MASKLINE, 0);
    lua_pcall(L, 1, 0, 0); /* an error is the reader refusing the input */
    lua_sethook(L, NULL, 0, 0);
    lua_settop(L, 0);
    /* Files the reader left open are closed when collected: collect often
     * enough that descriptors and mappings do not pile up. */
    if (++runs % 16 == 0) lua_gc(L, LUA_GCCOLLECT, 0);
    close(fd);
    return 0;
}
