#!/usr/bin/env bash
# tests/lua/run.sh: the busted specs of tests/lua, each file in a process
# of its own, as one TAP stream (the `lua` and `lua-asan` suites of
# tests/run.sh).
#
#   tests/lua/run.sh EXE [SPEC_FILE ...]     default: every tests/lua/*_spec.lua
#
# Why a process per file: one busted process over every file took 1445 s
# where the files one by one took 339 s (2026-12-06, 109 files, an idle
# 2-core Zen 5). What a file leaves behind (tensors, caches, loaded
# models) stays in one process's Lua heap, and code that collects to count
# memory exactly (fsdp.plan's trace collects before every wrap: [Note:
# exact collection while tracing]) pays for a full collection of that heap
# each time: planning the tiny Llama took 0.03 s beside a 1 MB heap and
# 70 s beside a 400 MB one. A process per file also keeps one file's state
# (collection budget, default dtype, a current mesh) from reaching the next.
#
# Each file's "ok N" / "not ok N" lines are renumbered into one sequence,
# its other lines passed on; a file that exits non-zero without a failed
# test (a crash, a sanitizer's report, an error outside any spec) is one
# "not ok" naming it. Exit status: 0, or 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
EXE=${1:?usage: tests/lua/run.sh EXE [SPEC_FILE ...]}
shift
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/lua/*_spec.lua)
n=0 failed=0
for f in "${files[@]}"; do
  out=$("$EXE" tests/busted.lua -o TAP "$f" 2>&1)
  rc=$?
  file_failed=0
  while IFS= read -r line; do
    if [[ $line =~ ^(not\ ok|ok)\ [0-9]+(.*)$ ]]; then
      n=$((n + 1))
      [ "${BASH_REMATCH[1]}" = "not ok" ] && file_failed=1
      echo "${BASH_REMATCH[1]} $n${BASH_REMATCH[2]}"
    elif [[ ! $line =~ ^1\.\.[0-9]+$ ]]; then
      echo "$line"
    fi
  done <<<"$out"
  if [ "$rc" -ne 0 ] && [ "$file_failed" -eq 0 ]; then
    n=$((n + 1))
    echo "not ok $n - $f: exited with status $rc without a failed test"
    file_failed=1
  fi
  failed=$((failed + file_failed))
done
echo "1..$n"
[ "$failed" -eq 0 ]
