#!/usr/bin/env bash
# tests/cudasim/run.sh: the cudasim suite, in TAP (tests/run.sh counts it).
#   1. the simulator's self-test and its two library checks (cuBLASLt
#      against BLAS, cuDNN by adjoint identities), so a fault found below is
#      the backend's and not the simulator's;
#   2. the specs that test the CUDA backend on a GPU (every op against the
#      CPU, the large-kernel specs, training), run by the cudasim build,
#      whose cuda:0 runs the backend's kernels on the CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=build/cudasim/bin
rc=0

"$bin/cudasim-selftest" || rc=1

n=100
for check in check_sim_cublas check_sim_cudnn; do
  n=$((n + 1))
  if out=$("$bin/$check" 2>&1); then
    echo "ok $n - $check: $(tail -n 1 <<<"$out")"
  else
    grep -E '^(FAIL|not ok)' <<<"$out" | head -n 20 | sed 's/^/# /'
    echo "not ok $n - $check: $(tail -n 1 <<<"$out")"
    rc=1
  fi
done

"$bin/fsdp-lua" tests/busted.lua -o TAP tests/lua/backend_ops_spec.lua tests/lua/cuda_elem_spec.lua \
  tests/lua/cuda_linear_spec.lua tests/lua/cuda_fused_spec.lua tests/lua/cuda_training_spec.lua || rc=1
exit $rc
