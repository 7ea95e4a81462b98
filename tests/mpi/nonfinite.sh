#!/usr/bin/env bash
# tests/mpi/nonfinite.sh NP: the non-finite guard (fsdp.nonfinite) of
# recipes/llama2_7b.lua on NP ranks, FULL_SHARD, from the outside: exit
# status, the message, the checkpoints on disk.
#
#   1. --lr=1e6 diverges at step 2: every rank exits with status 3 and
#      exactly one message names step 2 and the first parameter with a
#      non-finite gradient; only step-000001 is on disk, and it is finite.
#   2. NaN put into this rank's part of two gradients at step 5
#      (FSDP_TEST_NONFINITE_GRAD; under FULL_SHARD most ranks hold none of
#      a given parameter), --grad_clip=0: the message names the first in
#      model order on every world size; the checkpoints of steps 3 and 4
#      stay (--keep_checkpoints=2: a stop prunes nothing).
#   3. The same NaN at step 3 with --on_nonfinite=skip_step: the run
#      finishes, the skip is logged, the checkpoint of step 3 holds exactly
#      the tensors of step 2 (parameters and optimizer state) and step 4
#      trains again.
#   4. --lr=1e6 with skip_step and --max_nonfinite_skips=2: steps 2 and 3
#      are skipped, step 4 stops saying the bound was reached.
#   5. --lr=1e39: the gradients of step 1 are finite but its update
#      overflows the parameters: the run stops before step 1's checkpoint.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

NP=${1:?usage: tests/mpi/nonfinite.sh NP}
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-nonfinite.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

ARGS=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64
      --batch_size=2 --seq_len=16 --warmup_steps=2 --validation_freq=0 --checkpoint_freq=1)

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

# run NAME [ENV=...] -- ARGS...: the recipe on NP ranks, its checkpoints in
# $WORK/NAME; sets $out and $rc.
run() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  out=$(env "${envs[@]}" timeout -k 5 60 mpirun -np "$NP" "$EXE" "${ARGS[@]}" \
        --checkpoint_dir="$WORK/$name" "$@" 2>&1)
  rc=$?
}
on_disk() { [ -d "$WORK/$1" ] && (cd "$WORK/$1" && ls -d step-* 2>/dev/null | tr '\n' ' '); }
tensors() { "$EXE" tests/mpi/ckpt_tensors.lua "$@" 2>&1; }

# check DESCRIPTION CONDITION...: ok when every condition (a shell test
# expression run with eval) holds; otherwise the output as a comment.
check() {
  local what=$1 cond; shift
  for cond in "$@"; do
    if ! eval "$cond"; then
      not_ok "$what ($NP ranks): failed: $cond"
      comment "$(grep -v "^  " <<<"$out" | tail -20)"
      return
    fi
  done
  ok "$what ($NP ranks)"
}
messages() { grep -c 'fsdp-lua: recipes/llama2_7b.lua: step [0-9]*: non-finite' <<<"$out"; }
has() { grep -qE -- "$1" <<<"$out"; }

run lr -- --max_steps=8 --lr=1e6
check "--lr=1e6 exits 3 at step 2 with one message naming it; only the finite step-000001 on disk" \
  '[ "$rc" -eq 3 ]' '[ "$(messages)" -eq 1 ]' \
  'has "step 2: non-finite loss or gradient norm \(loss [0-9.e+]+, gradient norm nan\); first parameter with a non-finite gradient: model.embed_tokens.weight \(unit <root>\); stopped before applying it"' \
  'has "the newest checkpoint is $WORK/lr/step-000001"' \
  '[ "$(on_disk lr)" = "step-000001 " ]' 'tensors finite "$WORK/lr/step-000001" >/dev/null'

run stop FSDP_TEST_NONFINITE_GRAD=5:lm_head.weight,model.layers.1.mlp.up_proj.weight -- \
  --max_steps=8 --grad_clip=0 --keep_checkpoints=2
check "a NaN in two gradients' shards at step 5 stops naming the first in model order; steps 3 and 4 stay" \
  '[ "$rc" -eq 3 ]' '[ "$(messages)" -eq 1 ]' \
  'has "step 5: non-finite .*first parameter with a non-finite gradient: model.layers.1.mlp.up_proj.weight \(unit model.layers.1\)"' \
  '[ "$(on_disk stop)" = "step-000003 step-000004 " ]' 'tensors finite "$WORK/stop/step-000004" >/dev/null'

run skip FSDP_TEST_NONFINITE_GRAD=3:model.layers.0.mlp.down_proj.weight -- \
  --max_steps=4 --keep_checkpoints=0 --on_nonfinite=skip_step --metrics_file="$WORK/skip.jsonl"
check "skip_step: the run finishes, step 3 is logged as skipped, its checkpoint equals step 2's" \
  '[ "$rc" -eq 0 ]' \
  'has "step 3: non-finite .*model.layers.0.mlp.down_proj.weight \(unit model.layers.0\); step skipped: no update, gradients dropped \(skip 1 of at most 10"' \
  'has "Batch 3 Loss: .*skipped \(non-finite: no update\)"' \
  'grep -q "\"skipped\":true" "$WORK/skip.jsonl"' \
  'tensors same "$WORK/skip/step-000002" "$WORK/skip/step-000003" >/dev/null' \
  '! tensors same "$WORK/skip/step-000003" "$WORK/skip/step-000004" >/dev/null'

run bound -- --max_steps=8 --lr=1e6 --on_nonfinite=skip_step --max_nonfinite_skips=2
check "--lr=1e6 with skip_step: steps 2 and 3 skipped, step 4 stops at --max_nonfinite_skips=2" \
  '[ "$rc" -eq 3 ]' 'has "step 2: .*skip 1 of at most 2"' 'has "step 3: .*skip 2 of at most 2"' \
  'has "step 4: .*stopped: 2 steps were skipped already \(--max_nonfinite_skips=2\)"' \
  'tensors same "$WORK/bound/step-000002" "$WORK/bound/step-000003" >/dev/null'

run overflow -- --max_steps=4 --lr=1e39 --warmup_steps=0
check "--lr=1e39 overflows the parameters in step 1's update: stopped before its checkpoint" \
  '[ "$rc" -eq 3 ]' \
  'has "step 1: the update made parameters non-finite \(first: model.embed_tokens.weight \(unit <root>\)\); stopped before saving its checkpoint"' \
  '[ -z "$(on_disk overflow)" ]'
