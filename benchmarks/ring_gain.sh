#!/usr/bin/env bash
# benchmarks/ring_gain.sh: what the MPI plugin's own rings ([Note: ring
# collectives] in core/comm/mpi/ring.c) gain over what they replaced, Open
# MPI's non-blocking collectives (libnbc), on this machine: the same
# all_gather, reduce_scatter and all_reduce of one f32 buffer
# (benchmarks/link_rate.lua) with the rings on (the default) and off
# (FSDP_MPI_RING=0), on 2 and 4 ranks in shared memory. Each
# configuration runs REPEATS times (default 3) and keeps its fastest round
# of all runs: on a shared machine the fastest is the least disturbed.
#
#   benchmarks/ring_gain.sh [MIB]      the gathered buffer, default 16 MiB
#   RING_GAIN_RANKS="2" REPEATS=5 benchmarks/ring_gain.sh 64
#
# Prints one line per ranks and kind: the ring's time, libnbc's, and
# libnbc's time over the ring's (> 1: the ring is faster).
set -euo pipefail
cd "$(dirname "$0")/.."

MIB=${1:-16}
REPEATS=${REPEATS:-3}
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# best NP RING KIND...: the fastest milliseconds of each kind over REPEATS
# runs, as "kind ms" lines.
best() {
  local np=$1 ring=$2 r
  for ((r = 0; r < REPEATS; r++)); do
    FSDP_MPI_RING=$ring mpirun -np "$np" "$EXE" benchmarks/link_rate.lua --mib="$MIB" |
      awk '$2 ~ /^[0-9.]+$/ && $3 == "ms" { print $1, $2 }'
  done | awk '!($1 in m) || $2 < m[$1] { m[$1] = $2 } END { for (k in m) print k, m[k] }' | sort
}

echo "# $(date -u +%Y-%m-%d) $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) cores;" \
  "Open MPI $(mpirun --version | awk 'NR == 1 { print $NF }'); $MIB MiB f32, best of $REPEATS runs"
printf '%-6s %-15s %10s %12s %12s\n' ranks kind 'ring ms' 'libnbc ms' 'libnbc/ring'
for np in ${RING_GAIN_RANKS:-2 4}; do
  join <(best "$np" 1) <(best "$np" 0) |
    awk -v np="$np" '{ printf "%-6s %-15s %10.1f %12.1f %12.2f\n", np, $1, $2, $3, $3 / $2 }'
done
