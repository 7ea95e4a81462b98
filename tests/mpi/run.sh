#!/usr/bin/env bash
# tests/mpi/run.sh: the multi-rank tests, as TAP (the `mpi` suite of
# tests/run.sh). Each script runs under mpirun with 2 and 4 ranks (4 ranks
# oversubscribe a 2-core machine), every run bounded by `timeout`, and
# failure cases are checked from the outside: exit status, time taken and
# the message.
#
#   tests/mpi/run.sh            everything
#   FSDP_LUA=path tests/mpi/run.sh   another build of the executable
#   FSDP_LUA=build/cudasim/bin/fsdp-lua tests/mpi/run.sh cuda
#                               only the cuda collectives (tests/cudasim/run.sh)
#   FSDP_CPU_ISA=avx2 tests/mpi/run.sh isa
#                               only the f32 training comparisons (tests/isa)
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
if ! command -v mpirun >/dev/null; then
  echo "1..0 # SKIP mpirun not found (install openmpi-bin)"
  exit 0
fi
if [ ! -x "$EXE" ]; then
  echo "not ok 1 - $EXE is not built (./build.sh)"
  exit 1
fi

# Open MPI on these machines (docs: TOOLCHAIN): root, more ranks than cores,
# containers that forbid cross-process reads. One thread per rank: 4 ranks
# on 2 cores are oversubscribed already.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# A broken collective fails a test in seconds rather than at the default
# ten minutes.
export FSDP_COLLECTIVE_TIMEOUT=${FSDP_COLLECTIVE_TIMEOUT:-20}
LIMIT=60 # seconds for any one short command (see bounded for the cases)

# bounded COMMAND...: COMMAND's output and status, stopped when it printed
# nothing for IDLE seconds or ran CAP seconds (tests/bounded.sh).
IDLE=60 CAP=900
source tests/bounded.sh

n=0 failed=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# run_tap LABEL ENV... -- COMMAND...: a script that prints "ok - name" /
# "not ok - name" lines (tests/mpi/tap.lua); they are numbered here.
run_tap() {
  local label=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local out rc start line count=0
  start=$(now)
  out=$(bounded env "${envs[@]}" "$@")
  rc=$?
  while IFS= read -r line; do
    case "$line" in
      "ok - "*) ok "${line#ok - } [$label]"; count=$((count + 1)) ;;
      "not ok - "*) not_ok "${line#not ok - } [$label]"; count=$((count + 1)) ;;
      "#"*) echo "$line" ;;
    esac
  done <<<"$out"
  if [ "$rc" -ne 0 ] || [ "$count" -eq 0 ]; then
    not_ok "$label: exited with status $rc after $(elapsed "$start") s ($count tests reported)"
    comment "$out"
  else
    echo "# $label: $count tests in $(elapsed "$start") s"
  fi
}

# expect_failure LABEL MAX_SECONDS 'NEEDLE|NEEDLE...' ENV... -- COMMAND...:
# the command must fail (not time out) within MAX_SECONDS and its output
# must contain every needle.
expect_failure() {
  local label=$1 max=$2 needles=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local out rc start took missing=() needle fault
  start=$(now)
  out=$(bounded env "${envs[@]}" "$@")
  rc=$?
  # A script that prints "fault at <epoch seconds>" is timed from its
  # fault: a slow start on a loaded machine is not the fault's to answer.
  fault=$(grep -m1 -oE '^fault at [0-9.]+' <<<"$out" | awk '{print $3}')
  took=$(elapsed "${fault:-$start}")
  IFS='|' read -r -a list <<<"$needles"
  for needle in "${list[@]}"; do
    grep -qF -- "$needle" <<<"$out" || missing+=("$needle")
  done
  if [ "$rc" -eq 0 ]; then
    not_ok "$label: exited 0, expected a failure"
    comment "$out"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    not_ok "$label: stopped after printing nothing for $IDLE s (hang)"
    comment "$out"
  elif awk -v t="$took" -v m="$max" 'BEGIN { exit !(t > m) }'; then
    not_ok "$label: took $took s, more than $max s"
    comment "$out"
  elif [ ${#missing[@]} -gt 0 ]; then
    not_ok "$label: output lacks: ${missing[*]}"
    comment "$out"
  else
    ok "$label: exit $rc after $took s, message names the rank"
  fi
}

# Collectives and training on cuda tensors, through NCCL and, with
# FSDP_NCCL=0, through host copies; the cudasim suite runs these alone.
# In cudasim an event query reports "not ready" twice before the queued
# work runs, so results used after a query but without a wait are stale
# (tests/cudasim/README.md: streams); a GPU ignores the variable.
if [ "${1:-}" = cuda ]; then
  export FSDP_CUDASIM_QUERY_DELAY=2
  for np in 2 4; do
    run_tap "cuda, $np ranks, nccl" FSDP_EXPECT_DEVICE_LIBRARY=nccl -- \
      mpirun -np $np "$EXE" tests/mpi/cuda_collectives.lua
    run_tap "cuda, $np ranks, host copies" FSDP_NCCL=0 "FSDP_EXPECT_DEVICE_LIBRARY=host copies" -- \
      mpirun -np $np "$EXE" tests/mpi/cuda_collectives.lua
  done
  run_tap "cuda, 4 ranks on cuda:<local rank>, nccl" FSDP_EXPECT_DEVICE_LIBRARY=nccl \
    FSDP_TEST_CUDA_DEVICE=local FSDP_CUDASIM_DEVICES=4 -- mpirun -np 4 "$EXE" tests/mpi/cuda_collectives.lua
  # TP x FSDP (and sequence parallelism) with the TP model's shards on cuda:0, against one CPU process
  run_tap "TP on cuda, tp 2, 2 ranks, host copies" FSDP_NCCL=0 FSDP_TEST_DEVICE=cuda:0 FSDP_TEST_STEPS=10 -- \
    mpirun -np 2 "$EXE" tests/mpi/tp_equivalence.lua 2 f32
  run_tap "TP + SP on cuda, tp 2, 2 ranks, nccl" FSDP_TEST_DEVICE=cuda:0 FSDP_TEST_STEPS=10 -- \
    mpirun -np 2 "$EXE" tests/mpi/tp_equivalence.lua 2 f32 sp
  expect_failure "a cuda collective rank 1 never joins fails on rank 0 and ends the job" 20 \
    "fsdp-lua: rank 0:|all_reduce on group world (rank 0 of 2, world rank 0)" \
    FSDP_COLLECTIVE_TIMEOUT=1 -- mpirun -np 2 "$EXE" tests/mpi/collective_timeout.lua cuda
  echo "1..$n"
  [ "$failed" -eq 0 ]
  exit
fi

# The short training comparisons the isa suite runs again at each CPU
# level below the machine's own (tests/isa/run.sh; FSDP_CPU_ISA is set by
# it): sharded f32 training and gradient accumulation against one rank.
if [ "${1:-}" = isa ]; then
  run_tap "sharded training = one rank, f32, 2 ranks, ISA ${FSDP_CPU_ISA:-auto}" -- \
    mpirun -np 2 "$EXE" tests/mpi/fsdp_equivalence.lua f32
  run_tap "gradient accumulation = the larger batch, 2 ranks, ISA ${FSDP_CPU_ISA:-auto}" -- \
    mpirun -np 2 "$EXE" tests/mpi/grad_accum.lua
  run_tap "token-mean loss = one process, 2 ranks, ISA ${FSDP_CPU_ISA:-auto}" -- \
    mpirun -np 2 "$EXE" tests/mpi/token_mean.lua
  echo "1..$n"
  [ "$failed" -eq 0 ]
  exit
fi

for np in 2 4; do
  run_tap "collectives, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/collectives.lua
done
# The plugin's ring collectives (core/comm/mpi/ring.c): on every buffer
# (FSDP_RING_MIN_BYTES=0, so blocks of one element and odd rank counts
# too) and with the default threshold, which leaves small ones to MPI.
for np in 2 3 4; do
  run_tap "ring collectives, $np ranks, every buffer" FSDP_RING_MIN_BYTES=0 -- \
    mpirun -np $np "$EXE" tests/mpi/ring.lua
done
run_tap "ring collectives, 4 ranks, default threshold" -- mpirun -np 4 "$EXE" tests/mpi/ring.lua
# The plugin's log of completed collectives and the time from each one's
# last member (fsdp.observe.joined).
for np in 2 4; do
  run_tap "collective log and joined time, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/joined.lua
done
# Collectives progress between kernels on the computing thread ([Note:
# progress from compute], core/comm/dist.c): without the progress thread an
# all-gather completes during 0.4 s of ops; with the pokes off too it waits.
run_tap "an all-gather progresses while the rank computes, 2 ranks" FSDP_PROGRESS_THREAD=0 -- \
  mpirun -np 2 "$EXE" tests/mpi/progress.lua
run_tap "an all-gather waits without progress calls, 2 ranks" FSDP_PROGRESS_THREAD=0 FSDP_PROGRESS_FROM_COMPUTE=0 -- \
  mpirun -np 2 "$EXE" tests/mpi/progress.lua
run_tap "groups, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/groups.lua
run_tap "groups, 2 ranks as 2 nodes of 1" FSDP_RANKS_PER_NODE=1 -- \
  mpirun -np 2 "$EXE" tests/mpi/groups.lua
# The device mesh (fsdp.mesh): coordinates and groups of 5 meshes, and
# FSDP whose groups come from one = HYBRID_SHARD by nodes = one process.
run_tap "device mesh, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/mesh.lua
run_tap "the decoder recipe's --tp and --dp_shard, 2 and 4 ranks" -- tests/mpi/mesh_recipe.sh
for np in 2 4; do
  run_tap "monitored barrier, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/monitored_barrier.lua
done

# Sharding: every strategy x precision x checkpointing x prefetch mode
# against one rank; hybrid sharding as 2 nodes of 1 and 2 nodes of 2.
run_tap "sharded training = one rank, 2 ranks on one node" -- \
  mpirun -np 2 "$EXE" tests/mpi/fsdp_equivalence.lua
run_tap "sharded training = one rank, 2 ranks as 2 nodes of 1" FSDP_RANKS_PER_NODE=1 -- \
  mpirun -np 2 "$EXE" tests/mpi/fsdp_equivalence.lua f32
run_tap "sharded training = one rank, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/fsdp_equivalence.lua
run_tap "gradient accumulation = the larger batch, 1 rank" -- "$EXE" tests/mpi/grad_accum.lua
run_tap "gradient accumulation = the larger batch, gradients reduced once, 2 ranks" -- \
  mpirun -np 2 "$EXE" tests/mpi/grad_accum.lua
run_tap "gradient accumulation, HYBRID_SHARD too, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/grad_accum.lua
# The loss over the step's target tokens (masked labels, unequal counts
# per micro-batch and rank) = one process on the whole batch.
run_tap "token-mean loss = one process, 1 rank" -- "$EXE" tests/mpi/token_mean.lua
run_tap "token-mean loss = one process, 2 ranks" -- mpirun -np 2 "$EXE" tests/mpi/token_mean.lua
run_tap "token-mean loss, HYBRID_SHARD too, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/token_mean.lua
# Tensor parallelism (fsdp.tp): the layers against one rank, then TP x FSDP
# training (50 AdamW steps) against one process.
for np in 2 4; do
  run_tap "TP layers, loss and gradients = one rank, tp $np" -- mpirun -np $np "$EXE" tests/mpi/tp_layers.lua
done
run_tap "TP training = one process, tp 2 on 2 ranks" -- mpirun -np 2 "$EXE" tests/mpi/tp_equivalence.lua 2
run_tap "TP x FSDP training = one process, tp 2 x dp 2" -- mpirun -np 4 "$EXE" tests/mpi/tp_equivalence.lua 2
run_tap "TP training = one process, tp 4 x dp 1, f32" -- mpirun -np 4 "$EXE" tests/mpi/tp_equivalence.lua 4 f32
run_tap "TP x HSDP on a mesh (dp_replicate 2 x tp 2) = one process, f32" -- \
  mpirun -np 4 "$EXE" tests/mpi/tp_equivalence.lua 2 f32 hsdp
# Sequence parallelism: the same bounds, and the activation memory it saves.
run_tap "TP + SP training = one process, tp 2 on 2 ranks" -- mpirun -np 2 "$EXE" tests/mpi/tp_equivalence.lua 2 both sp
run_tap "TP + SP x FSDP training = one process, tp 2 x dp 2, f32" -- \
  mpirun -np 4 "$EXE" tests/mpi/tp_equivalence.lua 2 f32 sp
run_tap "LoRA: adapters sharded over a frozen base = one rank, 2 ranks" -- \
  mpirun -np 2 "$EXE" tests/mpi/lora.lua
run_tap "LoRA, HYBRID_SHARD too, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/lora.lua
for np in 2 4; do
  run_tap "sharding features, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/fsdp_api.lua
  run_tap "sharded memory, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/fsdp_memory.lua
done
# The planner's persistent and peak bytes against the allocator's, every
# strategy in f32 and in bf16 with checkpointing, gradient accumulation and
# LoRA; hybrid as 2 nodes of 2.
run_tap "planned = measured memory, 2 ranks" -- mpirun -np 2 "$EXE" tests/mpi/plan_memory.lua
# A model defined only in the test file: planned by tracing its step.
run_tap "planned = measured memory, a model the planner was never taught, 2 ranks" -- \
  mpirun -np 2 "$EXE" tests/mpi/plan_any_model.lua
# The planner's collectives (calls and bytes of a step, per kind) against
# what core/comm counted, every strategy in f32 and bf16; hybrid as 2 nodes of 2.
run_tap "planned = measured collectives, 2 ranks" -- mpirun -np 2 "$EXE" tests/mpi/plan_comm.lua
run_tap "planned = measured collectives, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/plan_comm.lua
run_tap "planned = measured memory, 4 ranks as 2 nodes of 2" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "$EXE" tests/mpi/plan_memory.lua
# Device meshes: tp 2 x dp 2, tp 4, tp 1 x dp 4 planned (fsdp.plan's tp, dp_shard) against measured.
run_tap "planned = measured memory on device meshes, 4 ranks" -- mpirun -np 4 "$EXE" tests/mpi/plan_memory.lua mesh
# The Llama recipe, sharded: 2 ranks of batch 2 log the losses of 1 rank of
# batch 4 (f32: equal to the printed 4 decimals, within 2e-4).
recipe_losses() { grep -oE 'Batch [0-9]+ Loss: [0-9.]+' | awk '{print $4}'; }
RECIPE=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=64 --num_heads=4 --vocab_size=128
        --max_steps=20 --log_every=5 --seq_len=32 --validation_freq=0)
one=$(timeout -k 5 "$LIMIT" "$EXE" "${RECIPE[@]}" --batch_size=4 2>&1 | recipe_losses)
for strategy in FULL_SHARD HYBRID_SHARD; do
  two=$(timeout -k 5 "$LIMIT" mpirun -np 2 "$EXE" "${RECIPE[@]}" --batch_size=2 \
        --sharding_strategy=$strategy --activation_checkpointing 2>&1 | recipe_losses)
  if [ -n "$one" ] && [ "$(wc -l <<<"$one")" -eq 4 ] &&
     paste <(echo "$one") <(echo "$two") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (NF != 2 || d > 2e-4) bad = 1 } END { exit bad }'; then
    ok "recipes/llama2_7b.lua on 2 ranks ($strategy, checkpointed) logs the losses of 1 rank: $(echo $two)"
  else
    not_ok "recipes/llama2_7b.lua on 2 ranks ($strategy): losses [$(echo $two)], one rank [$(echo $one)]"
  fi
done

# Sharded checkpoints (fsdp.checkpointing): saved on 4 ranks, loaded on 2
# and 1 and with other strategies (each load also saves, so every layout's
# files are read back once), whole parameters identical at the resume
# point; the streamed full state dict; the recipe killed and restarted.
CK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-ckpt-reshard.XXXXXX")
RESHARD=("$EXE" tests/mpi/ckpt_reshard.lua)
run_tap "checkpoint saved on 4 ranks, FULL_SHARD" -- mpirun -np 4 "${RESHARD[@]}" save "$CK" FULL_SHARD transformer
run_tap "4-rank checkpoint loaded on 2 ranks" -- mpirun -np 2 "${RESHARD[@]}" load "$CK" FULL_SHARD transformer
run_tap "4-rank checkpoint loaded on 1 rank, one unit" -- "${RESHARD[@]}" load "$CK" FULL_SHARD none
run_tap "4-rank checkpoint loaded as HYBRID_SHARD on 2 nodes of 2, saved again" FSDP_RANKS_PER_NODE=2 -- \
  mpirun -np 4 "${RESHARD[@]}" load "$CK" HYBRID_SHARD transformer a b
run_tap "hybrid checkpoint loaded as NO_SHARD on 2 ranks, saved again" -- \
  mpirun -np 2 "${RESHARD[@]}" load "$CK" NO_SHARD transformer b c
run_tap "NO_SHARD checkpoint loaded on 1 rank" -- "${RESHARD[@]}" load "$CK" FULL_SHARD transformer c
rm -rf "$CK"
# Across meshes (issue 43): a tp 2 x dp_shard 2 checkpoint at tp 4, dp_shard 4
# and no mesh, and back, bit for bit; the recipe killed and resumed across them.
CK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-ckpt-mesh.XXXXXX")
run_tap "TP checkpoint across meshes, 4 ranks" -- mpirun -np 4 "$EXE" tests/mpi/ckpt_mesh.lua "$CK"
rm -rf "$CK"
run_tap "llama2_7b.lua --tp: killed and resumed across meshes; init_from, exports" -- tests/mpi/ckpt_mesh_recipe.sh
for np in 2 4; do
  run_tap "streamed full state dict, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/ckpt_full_state_dict.lua
done
run_tap "llama2_7b.lua on 2 ranks killed (kill -9) and restarted" -- tests/mpi/ckpt_recipe.sh
# The same through each kind of tokenizer (about 20 s each).
for tok in byte tests/golden/tokenizers/gpt2_style.json tests/golden/tokenizers/spm.model; do
  run_tap "llama2_7b.lua streaming .json.gz shards on 2 ranks ($tok), killed and resumed: identical losses" -- \
    tests/mpi/stream_resume.sh "$tok"
done
run_tap "what a 2-rank run shows across a kill and a resume: log, JSONL, TensorBoard, plot" -- tests/mpi/observe.sh
# The non-finite guard: --lr=1e6 and NaN gradient shards stop every rank
# with one message naming the step and parameter, or are skipped.
for np in 2 4; do
  run_tap "non-finite guard of llama2_7b.lua, $np ranks" -- tests/mpi/nonfinite.sh $np
done
for np in 1 2; do
  run_tap "the seed's TRAINING_ARGS line on llama2_7b.lua, $np rank(s)" -- tests/mpi/seed_args.sh $np
done
# Issue 16's must-show: HF directory -> --init_from fine-tune on 2 ranks ->
# generate -> --export_hf, logits checked at both ends (variants pass
# their recipe options: tests/mpi/lifecycle.sh NAME ARGS...).
run_tap "lifecycle: HF directory, full fine-tune on 2 ranks, generate, export" -- tests/mpi/lifecycle.sh full
run_tap "sft.lua: LoRA on 2 ranks on chat data, answer loss falls; chat.lua on the export" -- tests/mpi/sft.sh
run_tap "lifecycle: HF directory, LoRA fine-tune on 2 ranks, generate, merged export" -- \
  tests/mpi/lifecycle.sh lora --lora_rank=4 --lora_alpha=8
# A LoRA run killed and resumed trains on its reloaded base exactly as the
# uninterrupted run; a base replaced under its path is refused by name.
for family in llama t5; do
  run_tap "LoRA: killed and resumed on 2 ranks = uninterrupted; a replaced base refused ($family)" -- \
    tests/mpi/lora_resume.sh "$family"
done
# Issue 39: each decoder family's tiny HF directory (transformers' goldens)
# fine-tuned on 2 ranks, FULL_SHARD: full (killed and resumed once = the
# uninterrupted run) and LoRA (merged export generating), losses falling.
for family in qwen2 qwen3 olmo2 phi3 mistral gemma2 gemma3_text mixtral qwen3_moe; do
  run_tap "family fine-tune on 2 ranks: full, resumed, LoRA ($family)" -- tests/mpi/families_finetune.sh "$family"
done
run_tap "damaged 2-rank checkpoints refused, resume falls back" -- tests/mpi/ckpt_integrity.sh
# One job per checkpoint directory: a second job refused naming the first,
# kill -9 and a requeue taken over (issue 38).
run_tap "two jobs on one checkpoint directory: the second refused, the first intact" -- tests/mpi/ckpt_lock.sh
# Failed output writes: /dev/full, and a tmpfs filling under 2 ranks (root)
# with checkpoints elsewhere and on it (issue 38).
run_tap "output writes on a full disk: one line, training goes on, exit 5; checkpoints intact" -- \
  tests/mpi/output_errors.sh
for np in 2 4; do
  run_tap "no checkpoint from non-finite state, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/ckpt_nonfinite.lua
done
# The chaos test, short: random kills, resumes of resumed runs, 2 <-> 4
# ranks, every number and checkpoint bit for bit (tests/chaos/chaos.sh long
# is the long version, docs/checkpoints.md). It bounds its own attempts.
run_tap "chaos: llama2_7b.lua killed at random, resumed on 2 and 4 ranks" -- tests/chaos/chaos.sh short

expect_failure "a rank failing inside a sharded backward ends the job, 4 ranks" 15 \
  "fsdp-lua: rank 3: in backward of Failing|deliberate failure in backward|aborting the job (4 ranks)" \
  -- mpirun -np 4 "$EXE" tests/mpi/fsdp_rank_error.lua

for np in 2 4; do
  run_tap "data pipeline across ranks, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/data_ranks.lua
done

for np in 2 4; do
  last=$((np - 1))
  expect_failure "rank $last raises an error while the others wait, $np ranks" 15 \
    "fsdp-lua: rank $last: tests/mpi/rank_error.lua|deliberate failure on the last rank|aborting the job ($np ranks)" \
    -- mpirun -np $np "$EXE" tests/mpi/rank_error.lua
done
expect_failure "rank 3 fails before the backend started, 4 ranks" 15 \
  "fsdp-lua: rank 3: tests/mpi/rank_error.lua|deliberate failure before init" \
  -- mpirun -np 4 "$EXE" tests/mpi/rank_error.lua early
expect_failure "a collective rank 1 never joins times out and ends the job" 15 \
  "fsdp-lua: rank 0:|all_reduce on group world (rank 0 of 2, world rank 0): not complete after waiting 1 s" \
  FSDP_COLLECTIVE_TIMEOUT=1 -- mpirun -np 2 "$EXE" tests/mpi/collective_timeout.lua

expect_failure "a rank waiting for one that waits for a stopped rank leaves the naming to it" 20 \
  "fsdp-lua: rank 1: all_reduce on group|world rank 0 waits in a collective of its own|all_reduce on group group[0, 2] (rank 0 of 2, world rank 0): not complete after waiting 2 s|world rank 2 did not answer within 3 s" \
  FSDP_COLLECTIVE_TIMEOUT=2 -- mpirun -np 3 "$EXE" tests/mpi/collective_timeout.lua chain

# A timed-out all-gather that a late rank joins afterwards: its pages stay
# mapped (no signal inside MPI), and no collective starts again.
out=$(bounded mpirun -np 2 "$EXE" tests/mpi/collective_timeout.lua late)
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ! grep -qiE 'signal|segmentation' <<<"$out" &&
   grep -qF "no collective can start on this rank after an earlier one timed out" <<<"$out"; then
  ok "a timed-out all-gather joined late keeps its buffers; later collectives are refused"
else
  not_ok "a timed-out all-gather joined late: exit $rc"
  comment "$out"
fi

# A rank that leaves or stalls (tests/mpi/rank_exit.lua): os.exit mid-step
# ends the job within seconds naming the rank and where it left; every
# rank leaving together is a clean exit with its status; a rank spinning
# or stopped is named by the others' roll call at the collective timeout.
for np in 2 4; do
  expect_failure "rank 1 calls os.exit(0) mid-step, $np ranks: the job ends naming it" 10 \
    "fsdp-lua: rank 1: left the job before its run finished (os.exit(0) at tests/mpi/rank_exit.lua:" \
    -- mpirun -np $np "$EXE" tests/mpi/rank_exit.lua exit 0
done
expect_failure "rank 1 calls os.exit(3) mid-step, 4 ranks" 10 \
  "fsdp-lua: rank 1: left the job before its run finished (os.exit(3) at tests/mpi/rank_exit.lua:" \
  -- mpirun -np 4 "$EXE" tests/mpi/rank_exit.lua exit 3
for code in 0 3; do
  out=$(bounded mpirun -np 4 "$EXE" tests/mpi/rank_exit.lua all $code)
  rc=$?
  if [ "$rc" -eq "$code" ] && ! grep -q 'aborting\|MPI_ABORT' <<<"$out"; then
    ok "every rank calls os.exit($code) together, 4 ranks: exit $rc, nothing aborted"
  else
    not_ok "every rank calls os.exit($code) together: exit $rc"
    comment "$out"
  fi
done
expect_failure "rank 1 spins at step 2: named at the timeout as not in any collective" 15 \
  "world rank 1 is not in any collective (it started its last one" \
  FSDP_COLLECTIVE_TIMEOUT=2 -- mpirun -np 4 "$EXE" tests/mpi/rank_exit.lua spin
expect_failure "rank 1 stops itself (SIGSTOP): named at the timeout as not answering" 15 \
  "world rank 1 did not answer within 3 s (stopped, dead, or stuck outside MPI)" \
  FSDP_COLLECTIVE_TIMEOUT=2 -- mpirun -np 4 "$EXE" tests/mpi/rank_exit.lua stop

# Rank agreement (tests/mpi/rank_agreement.lua): configurations and model
# structures are compared before the first collective that depends on them.
for np in 2 4; do
  run_tap "rank agreement, $np ranks" -- mpirun -np $np "$EXE" tests/mpi/rank_agreement.lua
done
expect_failure "the last rank builds another model: fsdp.shard names the difference, 4 ranks" 10 \
  "the ranks disagree on the sharded model (fsdp.shard): n_units (ranks 0, 1, 2 = 3; rank 3 = 4)" \
  -- mpirun -np 4 "$EXE" tests/mpi/rank_agreement.lua shard
AGREE=(recipes/llama2_7b.lua --hidden_width=64 --num_heads=4 --vocab_size=128 --max_steps=4 --warmup_steps=1
       --seq_len=32 --validation_freq=0 --batch_size=2)
expect_failure "per-rank recipe options differ: the job ends naming the keys, 4 ranks" 10 \
  "the ranks disagree on recipes/llama2_7b.lua options: lr (ranks 0, 1 = 0.001; ranks 2, 3 = 0.002); num_layers (ranks 0, 1 = 2; ranks 2, 3 = 3); sharding_strategy (ranks 0, 1 = FULL_SHARD; ranks 2, 3 = SHARD_GRAD_OP)" \
  -- mpirun -np 2 "$EXE" "${AGREE[@]}" --num_layers=2 --lr=0.001 \
     : -np 2 "$EXE" "${AGREE[@]}" --num_layers=3 --lr=0.002 --sharding_strategy=SHARD_GRAD_OP

# The same faults and a few ordinary cases on a loaded machine (CI runners
# and this project's machines are shared): two busy processes beside
# them, started here and always stopped. Bounds are timed from the fault.
yes >/dev/null &
busy1=$!
yes >/dev/null &
busy2=$!
trap 'kill $busy1 $busy2 2>/dev/null' EXIT
LOADED="two busy processes beside"
run_tap "collectives, 4 ranks, $LOADED" -- mpirun -np 4 "$EXE" tests/mpi/collectives.lua
run_tap "monitored barrier, 4 ranks, $LOADED" -- mpirun -np 4 "$EXE" tests/mpi/monitored_barrier.lua
expect_failure "rank 1 calls os.exit(0) mid-step, 4 ranks, $LOADED" 10 \
  "fsdp-lua: rank 1: left the job before its run finished (os.exit(0) at tests/mpi/rank_exit.lua:" \
  -- mpirun -np 4 "$EXE" tests/mpi/rank_exit.lua exit 0
expect_failure "rank 1 stops itself, 4 ranks, $LOADED" 15 \
  "world rank 1 did not answer within 3 s" \
  FSDP_COLLECTIVE_TIMEOUT=2 -- mpirun -np 4 "$EXE" tests/mpi/rank_exit.lua stop
expect_failure "the last rank builds another model, 4 ranks, $LOADED" 10 \
  "the ranks disagree on the sharded model (fsdp.shard): n_units" \
  -- mpirun -np 4 "$EXE" tests/mpi/rank_agreement.lua shard
kill $busy1 $busy2 2>/dev/null
wait $busy1 $busy2 2>/dev/null
trap - EXIT

# fsdp-lua --nproc starts mpirun itself, with no Open MPI variables set:
# with more ranks than cores it must allow oversubscription itself. One
# rank past the CPUs (nproc, which counts hyperthreads, so past the cores
# too; it would answer OMP_NUM_THREADS=1 from above), at least 4: 4 alone
# is no more than a developer's 16 cores.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
np=$((cpus + 1))
[ "$np" -ge 4 ] || np=4
out=$(env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
  -u OMPI_MCA_rmaps_base_oversubscribe -u OMPI_MCA_btl_vader_single_copy_mechanism \
  timeout -k 5 "$LIMIT" "$EXE" --nproc $np tests/mpi/nproc.lua first 'second arg' 2>&1)
rc=$?
lines=$(grep -c "transport=mpi size=$np sum=$np args=first,second arg" <<<"$out")
if [ "$rc" -eq 0 ] && [ "$lines" -eq $np ]; then
  ok "fsdp-lua --nproc $np (more ranks than the $cpus CPUs) forwards the arguments to every rank"
else
  not_ok "fsdp-lua --nproc $np: exit $rc, $lines of $np ranks reported"
  comment "$out"
fi
expect_failure "fsdp-lua --nproc 2 propagates a failing rank's exit status" 15 \
  "fsdp-lua: rank 1: tests/mpi/rank_error.lua" \
  -- "$EXE" --nproc 2 tests/mpi/rank_error.lua

# The mpi backend without a launcher: an MPI singleton of one rank.
out=$(env FSDP_BACKEND=mpi timeout -k 5 "$LIMIT" "$EXE" -e \
  "local d = require('fsdp').dist; local t = d.all_reduce(require('fsdp').ones(2)); print(d.transport(), d.world_size(), t:sum():item())" 2>&1)
if [ "$out" = "$(printf 'mpi\t1\t2')" ]; then
  ok "FSDP_BACKEND=mpi without a launcher runs as a one-rank MPI world"
else
  not_ok "FSDP_BACKEND=mpi singleton printed: $out"
fi

echo "1..$n"
[ "$failed" -eq 0 ]
