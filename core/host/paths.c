/*
 * paths.c: finding the project root, so `require 'fsdp'`, `require
 * 'models.llama'` and `require 'recipes.x'` work from any current directory.
 *
 * The root is the directory holding lua/fsdp/ (and models/, recipes/). It is
 * $FSDP_LUA_HOME when set; otherwise it is found from the executable's own
 * path: <root>/build/bin/fsdp-lua (or <root>/build/<config>/bin/fsdp-lua)
 * in a build tree, or <prefix>/bin/fsdp-lua with the root at
 * <prefix>/share/fsdp-lua once installed. The executable's path comes from /proc/self/exe, which is right
 * however the program was started (PATH lookup, symlink, relative path).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "host.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>

static bool is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Copy src into dst of size bytes; false (dst untouched) if it does not fit. */
static bool copy_path(char *dst, size_t size, const char *src) {
    size_t n = strlen(src);
    if (n >= size) return false;
    memcpy(dst, src, n + 1);
    return true;
}

/* If candidate is a project root (it has lua/fsdp/), store its canonical
 * path in root and return true. */
static bool try_root(const char *candidate, char *root, size_t size) {
    char resolved[PATH_MAX];
    char probe[PATH_MAX + 16];
    if (realpath(candidate, resolved) == NULL) return false;
    snprintf(probe, sizeof probe, "%s/lua/fsdp", resolved);
    if (!is_directory(probe)) return false;
    return copy_path(root, size, resolved);
}

/* The executable's absolute path: /proc/self/exe, or argv[0] resolved when
 * /proc is not mounted (a path with a slash only; no PATH search). */
static void find_exe(char *exe, size_t size, const char *argv0) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    exe[0] = '\0';
    if (n > 0) {
        buf[n] = '\0';
        copy_path(exe, size, buf);
    } else if (argv0 != NULL && strchr(argv0, '/') != NULL &&
               realpath(argv0, buf) != NULL) {
        copy_path(exe, size, buf);
    }
}

/* Try the build-tree and installed layouts around the executable:
 * <root>/build/bin (release), <root>/build/<config>/bin (debug, asan) and
 * <prefix>/bin with <prefix>/share/fsdp-lua. */
static void root_from_exe(const char *exe, char *root, size_t size) {
    static const char *const layouts[] = {"../..", "../../..",
                                          "../share/fsdp-lua"};
    char dir[PATH_MAX];
    char candidate[PATH_MAX + 32];
    if (!copy_path(dir, sizeof dir, exe)) return;
    char *slash = strrchr(dir, '/');
    if (slash == NULL) return;
    *slash = '\0';
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        snprintf(candidate, sizeof candidate, "%s/%s", dir, layouts[i]);
        if (try_root(candidate, root, size)) return;
    }
}

bool host_find_paths(host_paths *paths, const char *argv0, char *err,
                     size_t err_size) {
    find_exe(paths->exe, sizeof paths->exe, argv0);
    paths->root[0] = '\0';
    const char *home = getenv("FSDP_LUA_HOME");
    if (home != NULL && home[0] != '\0') {
        if (try_root(home, paths->root, sizeof paths->root)) return true;
        snprintf(err, err_size,
                 "FSDP_LUA_HOME is set to '%s', which is not an fsdp-lua "
                 "project root (it has no lua/fsdp directory)",
                 home);
        return false;
    }
    if (paths->exe[0] != '\0') {
        root_from_exe(paths->exe, paths->root, sizeof paths->root);
    }
    return true;
}

void host_set_package_path(lua_State *L, const char *root) {
    if (root == NULL || root[0] == '\0') return;
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    const char *old_path = lua_tostring(L, -1);
    /* The library first, then models.* and recipes.* from the root; the
     * default path stays after so Debian's Lua modules (busted) load. */
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s/?.lua;%s/?/init.lua;%s",
                    root, root, root, root, old_path != NULL ? old_path : "");
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
}
