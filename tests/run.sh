#!/usr/bin/env bash
# tests/run.sh: run every test suite and print one summary line,
# "N passed, N failed, N skipped", exiting non-zero on any failure.
#
# Suites (each speaks TAP, which is how the counts are gathered):
#   c        the core's C tests (cmocka), release build
#   c-asan   the same under AddressSanitizer + UndefinedBehaviorSanitizer
#   lua      busted specs run inside fsdp-lua (tests/lua/*_spec.lua), a
#            process per file (tests/lua/run.sh)
#   lua-asan the same specs through the sanitized build
#   readme   every command and Lua snippet of README.md and docs/*.md (tests/readme/run.lua)
#   embed    a C program embedding the framework, and a stock luajit
#            requiring it (tests/embed/run.sh)
#   cudasim  the CUDA backend's kernels run on the CPU (tests/cudasim/run.sh)
#   kernels  ptxas's report of the CUDA kernels built for sm_90: no register
#            spills, static shared memory within the limit
#            (tools/kernel_resources.lua --check; skipped without nvcc)
#   mpi      multi-rank scripts under mpirun, 2 and 4 ranks (tests/mpi/run.sh)
#   isa      the CPU kernels' specs and the f32 training comparisons again
#            at avx2 and avx512 where this CPU has more
#            (FSDP_CPU_ISA; tests/isa/run.sh)
#   fuzz     libFuzzer on the file readers, a short run (tests/fuzz/run.sh)
#   cluster  Slurm in a box: sbatch on 2 nodes, a node lost and the job
#            requeued (tests/cluster/run.sh; skipped where it cannot run)
# A suite that exits non-zero without reporting a failed test (a crash, a
# sanitizer report) counts as one failure.
#   tests/run.sh            all suites
#   tests/run.sh lua c      only these
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0 failed=0 skipped=0
failures=()

run_suite() { # run_suite NAME COMMAND...
  local name=$1; shift
  local out rc p f s start=$SECONDS
  echo "=== $name: $*"
  out=$("$@" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  p=$(grep -cE '^ok [0-9]+' <<<"$out" | tr -d ' ')
  s=$(grep -ciE '^ok [0-9]+.*# *skip' <<<"$out" | tr -d ' ')
  f=$(grep -cE '^not ok [0-9]+' <<<"$out" | tr -d ' ')
  p=$((p - s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1
    failures+=("$name: exited with status $rc without a failed test (crash?)")
  fi
  while IFS= read -r line; do failures+=("$name: $line"); done < <(grep -E '^not ok [0-9]+' <<<"$out")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  echo "=== $name: $p passed, $f failed, $s skipped in $((SECONDS - start)) s"
}

SUITES="$*"
want() { [ -z "$SUITES" ] || [[ " $SUITES " == *" $1 "* ]]; }

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
want c && run_suite c env CMOCKA_MESSAGE_OUTPUT=TAP build/bin/fsdp-ctest
if want c-asan; then
  if [ -x build/asan/bin/fsdp-ctest ]; then
    run_suite c-asan env CMOCKA_MESSAGE_OUTPUT=TAP \
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
      build/asan/bin/fsdp-ctest
  else
    echo "=== c-asan: skipped (build/asan/bin/fsdp-ctest not built; ./build.sh test builds it)"
    skipped=$((skipped + 1))
  fi
fi
want lua && run_suite lua tests/lua/run.sh build/bin/fsdp-lua
want readme && run_suite readme build/bin/fsdp-lua tests/readme/run.lua
want embed && run_suite embed tests/embed/run.sh
# The specs again through the sanitized core: memory errors in C reached
# from Lua (autograd graphs, views) show up here.
if want lua-asan; then
  if [ -x build/asan/bin/fsdp-lua ]; then
    run_suite lua-asan env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      LSAN_OPTIONS=suppressions="$PWD/tests/lsan.supp":print_suppressions=0 tests/lua/run.sh build/asan/bin/fsdp-lua
  else
    echo "=== lua-asan: skipped (build/asan/bin/fsdp-lua not built; ./build.sh test builds it)"
    skipped=$((skipped + 1))
  fi
fi

# The CUDA backend without a GPU: the cudasim build runs its kernels on
# the CPU (tests/cudasim) under the specs that compare it with the CPU.
if want cudasim; then
  if [ -x build/cudasim/bin/fsdp-lua ]; then
    run_suite cudasim tests/cudasim/run.sh
  else
    echo "=== cudasim: skipped (build/cudasim not built; ./build.sh test builds it where the CUDA toolkit is)"
    skipped=$((skipped + 1))
  fi
fi

if want kernels; then
  if [ -n "$(ls build/obj/release/fsdp_cuda/*.ptxas 2>/dev/null)" ]; then
    run_suite kernels build/bin/fsdp-lua tools/kernel_resources.lua --check
  else
    echo "=== kernels: skipped (no ptxas reports: the CUDA plugin is built where nvcc is)"
    skipped=$((skipped + 1))
  fi
fi

if want mpi; then
  if command -v mpirun >/dev/null; then
    run_suite mpi tests/mpi/run.sh
  else
    echo "=== mpi: skipped (mpirun not found; ./build.sh installs openmpi-bin)"
    skipped=$((skipped + 1))
  fi
fi

# The fallbacks: what the other suites ran at this CPU's level, again at
# avx2 and avx512 below it (an AVX-512 machine proves the AVX2 paths).
want isa && run_suite isa tests/isa/run.sh

# A short fuzzing run of the file readers (the long one: tests/fuzz/README.md).
if want fuzz; then
  if command -v clang >/dev/null; then
    run_suite fuzz tests/fuzz/run.sh "${FUZZ_SECONDS:-12}"
  else
    echo "=== fuzz: skipped (clang not found; ./build.sh installs it)"
    skipped=$((skipped + 1))
  fi
fi

# The cluster in a box needs root and network namespaces; it says SKIP
# (counted as skipped) where it has neither, or no Slurm.
want cluster && run_suite cluster tests/cluster/run.sh

if [ ${#failures[@]} -gt 0 ]; then
  echo
  echo "Failures:"
  printf '  %s\n' "${failures[@]}"
fi
echo
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
