#!/usr/bin/env bash
# benchmarks/startup.sh: what every fsdp-lua process pays before its first
# line runs: the wall time and the resident memory of `fsdp-lua -e ''`.
# Prints the median and best wall time and the median peak RSS of --runs
# starts (default 20); asserts nothing.
#
#   benchmarks/startup.sh [BINARY] [RUNS]     (BINARY: build/bin/fsdp-lua)
#
# Only CUDA's libraries dominated this cost while libfsdp.so linked them
# (0.44 s, 224 MB); the CUDA backend is now a plugin opened on first use
# (docs/ARCHITECTURE.md, "Backends are plugins"), so a CPU run loads none
# of them. FSDP_STARTUP_PRELOAD="lib..." preloads libraries into each start,
# e.g. the CUDA ones to reproduce the cost of linking them.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin/fsdp-lua}
runs=${2:-20}
[ -x "$bin" ] || { echo "startup.sh: $bin is not an executable (build first)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "startup.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
ms=() kb=()
for ((i = 0; i < runs; i++)); do
  # Wall time from the shell's nanosecond clock (time(1) reports 10 ms
  # steps); the peak RSS from time(1), in a second start.
  t0=$(date +%s%N)
  LD_PRELOAD="${FSDP_STARTUP_PRELOAD:-}" "$bin" -e '' >/dev/null
  t1=$(date +%s%N)
  ms+=("$(( (t1 - t0 + 500000) / 1000000 ))")
  kb+=("$(LD_PRELOAD="${FSDP_STARTUP_PRELOAD:-}" /usr/bin/time -f '%M' "$bin" -e '' 2>&1 >/dev/null | tail -n 1)")
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
best=$(printf '%s\n' "${ms[@]}" | sort -n | head -n 1)
printf 'fsdp-lua -e "" (%s, %d runs): median %d ms, best %d ms, median RSS %.1f MB\n' \
  "$bin" "$runs" "$(median "${ms[@]}")" "$best" "$(echo "$(median "${kb[@]}") / 1024" | bc -l)"
