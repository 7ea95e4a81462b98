#!/usr/bin/env bash
# tests/embed/run.sh: the framework used from outside fsdp-lua, as TAP (the
# `embed` suite of tests/run.sh). A few seconds in all.
#   1. build/bin/fsdp-embed (tests/embed/embed.c): a C program with its own
#      LuaJIT state trains three steps and reads each loss through the C API.
#   2-3. Debian's stock `luajit` (not our host) requires 'fsdp' with the
#      paths docs/embedding.md documents and trains a step: libfsdp.so found
#      beside the sources (the build tree), and through LUA_CPATH by a copy
#      of the sources that has no build tree.
#   4. That copy without LUA_CPATH: one clear error, exit 1.
# The release build (the stock interpreter cannot load the sanitized one).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=build

IDLE=60 CAP=300
source tests/bounded.sh

n=0 failed=0
# check NAME EXPECT COMMAND...: ok when COMMAND exits 0 and prints a line
# matching the extended regular expression EXPECT.
check() {
  local name=$1 expect=$2 out rc
  shift 2
  n=$((n + 1))
  out=$(bounded "$@")
  rc=$?
  if [ "$rc" -eq 0 ] && grep -qE "$expect" <<<"$out"; then
    echo "ok $n - $name"
  else
    echo "not ok $n - $name (exit $rc)"
    sed 's/^/# /' <<<"$out"
    failed=$((failed + 1))
  fi
}

# A training step in plain Lua, for the stock interpreter.
STEP="local fsdp = require 'fsdp'
local m = fsdp.nn.Linear(4, 2)
local loss = fsdp.F.cross_entropy(m:forward(fsdp.randn({8, 4}, {seed = 1})),
                                  fsdp.randint(0, 2, {8}, {seed = 2}))
loss:backward()
fsdp.optim.SGD(m:named_parameters(), {lr = 0.1}):step()
assert(m.weight.grad, 'no gradient')
print(('luajit loss %.4f'):format(loss:item()))"
LUA_DIRS="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;$ROOT/?.lua;;"

check "fsdp-embed: a C program trains through the Lua library and reads the loss in C" \
  '^step 3 loss [0-9.]+$' "$BUILD/bin/fsdp-embed" "$ROOT"

if ! command -v luajit >/dev/null; then
  echo "ok $((n + 1)) # SKIP luajit not found (./build.sh installs it)"
  echo "1..$((n + 1))"
  exit "$((failed > 0))"
fi

# From another directory, so nothing is found relative to the current one;
# a copy of the sources where no build tree is beside them.
cd /tmp
copy=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-embed.XXXXXX")
trap 'rm -rf "$copy"' EXIT
cp -r "$ROOT/lua" "$copy/"
COPY_DIRS="$copy/lua/?.lua;$copy/lua/?/init.lua;;"
check "stock luajit: libfsdp.so found in the build tree beside the sources" '^luajit loss [0-9.]+$' \
  env LUA_PATH="$LUA_DIRS" luajit -e "$STEP"
check "stock luajit: libfsdp.so found through LUA_CPATH" '^luajit loss [0-9.]+$' \
  env LUA_PATH="$COPY_DIRS" LUA_CPATH="$ROOT/$BUILD/lib/lib?.so;;" luajit -e "$STEP"

n=$((n + 1))
out=$(env LUA_PATH="$COPY_DIRS" LD_LIBRARY_PATH= luajit -e "require 'fsdp'" 2>&1)
rc=$?
if [ "$rc" -eq 1 ] && grep -qF "fsdp: cannot load the core library libfsdp.so (tried $copy/lua/fsdp/../../build/lib/libfsdp.so" <<<"$out"; then
  echo "ok $n - stock luajit without the library: one error naming the places tried"
else
  echo "not ok $n - stock luajit without the library (exit $rc)"
  sed 's/^/# /' <<<"$out"
  failed=$((failed + 1))
fi
echo "1..$n"
[ "$failed" -eq 0 ]
