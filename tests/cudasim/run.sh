#!/usr/bin/env bash
# tests/cudasim/run.sh: the cudasim suite, in TAP (tests/run.sh counts it).
#   1. the simulator's self-test and its library checks (cuBLASLt against
#      BLAS, cuDNN by adjoint identities, cuDNN's graph API against host
#      attention, NCCL across forked processes), so
#      a fault found below is the backend's and not the simulator's;
#   2. collectives on cuda tensors and data-parallel training on cuda:0
#      under mpirun with 2 and 4 ranks (tests/mpi/cuda_collectives.lua);
#   3. the GPU benchmark's batch search on a small simulated device;
#   4. every training recipe with --device=cuda on 1 and 2 ranks against
#      --device=cpu (tests/cudasim/recipes.sh);
#   5. the specs that test the CUDA backend on a GPU (every op against the
#      CPU, the large-kernel specs, training, every op on zero-size
#      tensors), run by the cudasim build,
#      whose cuda:0 runs the backend's kernels on the CPU; the linears with
#      a bias again with the simulated cuBLASLt refusing the BIAS epilogue;
#   6. the GPU machine's archive (benchmarks/gpu_bundle.sh) run with the
#      system's MPI and Lua modules hidden (tests/gpu/bundle_check.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=build/cudasim/bin
rc=0

"$bin/cudasim-selftest" || rc=1

n=100
for check in check_sim_cublas check_sim_cudnn check_sim_cudnn_graph check_sim_nccl; do
  n=$((n + 1))
  if out=$("$bin/$check" 2>&1); then
    echo "ok $n - $check: $(tail -n 1 <<<"$out")"
  else
    grep -E '^(FAIL|not ok)' <<<"$out" | head -n 20 | sed 's/^/# /'
    echo "not ok $n - $check: $(tail -n 1 <<<"$out")"
    rc=1
  fi
done

# Collectives on cuda tensors and data-parallel and sharded training under
# mpirun, through the simulated NCCL and through host copies (the mpi
# suite's harness: tests/mpi/run.sh cuda).
FSDP_LUA="$bin/fsdp-lua" tests/mpi/run.sh cuda || rc=1

# The GPU benchmark's batch search against a 36 MiB device: out-of-memory
# from cudaMalloc through the caching allocator, retried after emptying the
# cache, until the largest batch that fits is measured.
n=$((n + 1))
out=$(FSDP_CUDASIM_MEMORY_MB=36 "$bin/fsdp-lua" benchmarks/llama_gpu.lua --device=cuda:0 --model=tiny \
  --seq=32 --find_batch --max_batch=64 --steps=1 --warmup=1 2>&1)
status=$?
largest=$(sed -n 's/^find_batch: largest batch \([0-9]*\)$/\1/p' <<<"$out")
if [ $status -eq 0 ] && [ "${largest:-0}" -ge 2 ] && grep -q 'is out of memory' <<<"$out" &&
   grep -q '^RESULT {' <<<"$out"; then
  echo "ok $n - llama_gpu.lua --find_batch on a 36 MiB cuda:0 finds batch $largest and measures it"
else
  echo "not ok $n - llama_gpu.lua --find_batch on a 36 MiB cuda:0 (status $status)"
  sed 's/^/#   /' <<<"$out" | tail -n 20
  rc=1
fi

# Every training recipe on cuda (shards, batches, loss) on 1 and 2 ranks
# gives the CPU's losses; the GPU defaults of --device=cuda.
FSDP_LUA="$bin/fsdp-lua" tests/cudasim/recipes.sh "$n" || rc=1

"$bin/fsdp-lua" tests/busted.lua -o TAP tests/lua/backend_ops_spec.lua tests/lua/cuda_elem_spec.lua \
  tests/lua/cuda_linear_spec.lua tests/lua/cuda_fused_spec.lua tests/lua/cuda_training_spec.lua \
  tests/lua/event_spec.lua tests/lua/cuda_host_spec.lua tests/lua/cuda_offload_spec.lua \
  tests/lua/empty_ops_spec.lua tests/lua/lora_spec.lua tests/lua/profiler_spec.lua \
  tests/lua/attention_window_spec.lua tests/lua/attention_packed_spec.lua tests/lua/moe_spec.lua \
  tests/lua/bytes_moved_spec.lua tests/lua/linear_cross_entropy_spec.lua tests/lua/cuda_launches_spec.lua \
  tests/lua/add_rms_norm_spec.lua || rc=1
# The attention paths for a cuDNN older than 9.16 (a backward with Tk not a
# multiple of 128 goes to the kernels), as an H100 machine's system library was.
FSDP_CUDASIM_CUDNN_VERSION=91400 "$bin/fsdp-lua" tests/busted.lua -o TAP --filter='attention' \
  tests/lua/cuda_fused_spec.lua tests/lua/backend_ops_spec.lua || rc=1
# cuBLASLt refusing the BIAS epilogue with INVALID_VALUE, as it did on an
# H100 for small linears: the product without it and the bias added by a
# kernel must give the same results.
FSDP_CUDASIM_LT_REFUSE_BIAS=1 "$bin/fsdp-lua" tests/busted.lua -o TAP --filter='bias' \
  --filter='values linear' tests/lua/cuda_linear_spec.lua tests/lua/backend_ops_spec.lua || rc=1
# The archive a GPU session carries to the lent machine runs there without
# Debian's packages: checked here with the system's MPI and Lua hidden.
tests/gpu/bundle_check.sh 900 || rc=1
exit $rc
