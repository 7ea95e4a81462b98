#!/usr/bin/env bash
# tests/mpi/lora_resume.sh FAMILY: a LoRA run killed and resumed on 2 ranks
# trains on its pretrained base exactly as the run that was not killed
# ([Note: the fingerprint of a LoRA base], models/pretrained.lua), and a
# base replaced under the same path is refused by every later load.
#
#   1. FAMILY's tiny Hugging Face directory (the stored goldens) is the
#      --init_from base; a LoRA run of 6 steps saves at 3 and 6;
#   2. the same run killed right after its save of step 3
#      (FSDP_TEST_KILL_AT_STEP), then the same command with
#      --resume_from_checkpoint: steps 4-6 log the uninterrupted run's
#      losses bit for bit (the metrics JSONL's full-precision numbers);
#   3. the base's weights replaced by another model of the same shapes (its
#      weights scaled): resuming, recipes/generate.lua (llama) and
#      tools/export.lua on the checkpoint each refuse it in one line naming the checkpoint,
#      the base and both fingerprints.
#
#   FAMILY: llama (recipes/llama2_7b.lua) or t5 (recipes/t5_3b.lua)
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

FAMILY=${1:?usage: tests/mpi/lora_resume.sh llama|t5}
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
case $FAMILY in
  llama) GOLDEN=tests/golden/hf/llama3_tiny_v5 RECIPE=recipes/llama2_7b.lua
         ARGS=(--seq_len=16 --batch_size=4) ;;
  t5) GOLDEN=tests/golden/hf/t5_v1_1_tiny_v5 RECIPE=recipes/t5_3b.lua
      ARGS=(--batch_size=4) ;;
  *) echo "not ok - unknown family $FAMILY"; exit 1 ;;
esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-lora-resume.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

TAP_TAG=$FAMILY
. tests/mpi/tap.sh

BASE=$WORK/base
mkdir -p "$BASE"
cp "$GOLDEN/config.json" "$GOLDEN/model.safetensors" "$BASE/"
TRAIN=("$RECIPE" --init_from="$BASE" --lora_rank=4 --lora_alpha=8 --max_steps=6 --warmup_steps=0
       --lr=3e-3 --validation_freq=0 --checkpoint_freq=3 "${ARGS[@]}")

# 1. Uninterrupted.
run mpirun -np 2 "$EXE" "${TRAIN[@]}" --checkpoint_dir="$WORK/a" --metrics_file="$WORK/a.jsonl"
if [ "$rc" -ne 0 ]; then not_ok "the uninterrupted LoRA run: exit $rc"; comment "$out"; exit 1; fi

# 2. Killed after the save of step 3, then resumed by the same command.
run env FSDP_TEST_KILL_AT_STEP=3 mpirun -np 2 "$EXE" "${TRAIN[@]}" --checkpoint_dir="$WORK/b" \
  --metrics_file="$WORK/b.jsonl"
if [ "$rc" -eq 0 ] || [ ! -d "$WORK/b/step-000003" ]; then
  not_ok "the run killed after step 3: exit $rc, checkpoint $(ls "$WORK/b" 2>&1)"; comment "$out"; exit 1
fi
run mpirun -np 2 "$EXE" "${TRAIN[@]}" --checkpoint_dir="$WORK/b" --metrics_file="$WORK/b.jsonl" \
  --resume_from_checkpoint
want=$(losses "$WORK/a.jsonl" 4 6)
got=$(losses "$WORK/b.jsonl" 4 6)
if [ "$rc" -eq 0 ] && grep -qF "init_from: loaded the LoRA base Hugging Face directory $BASE" <<<"$out" &&
   [ "$(wc -l <<<"$want")" -eq 3 ] && [ "$got" = "$want" ]; then
  ok "killed after step 3 and resumed: steps 4-6 log the uninterrupted run's losses exactly, on the reloaded base"
else
  not_ok "killed and resumed: exit $rc; losses 4-6 $(tr '\n' ' ' <<<"$got")against $(tr '\n' ' ' <<<"$want")"
  comment "$out"
fi

# 3. Another model of the same shapes under the base's path.
run "$EXE" -e "
local fsdp = require 'fsdp'
local t = fsdp.safetensors.load('$BASE/model.safetensors')
for name, x in pairs(t) do t[name] = x * 1.25 end
fsdp.safetensors.save('$WORK/other.safetensors', t, { format = 'pt' })"
if [ "$rc" -ne 0 ]; then not_ok "could not write the other base: $out"; exit 1; fi
mv "$WORK/other.safetensors" "$BASE/model.safetensors"
refused() { # WHAT: the last command failed in one line naming the base and both fingerprints
  local line
  line=$(grep -m1 'fsdp-lua: ' <<<"$out")
  if [ "$rc" -ne 0 ] && grep -qE "holds LoRA adapters trained on a base with fingerprint xxh3-64:[0-9a-f]{16}, but Hugging Face directory $BASE \(.*\) now has xxh3-64:[0-9a-f]{16}" <<<"$line"; then
    ok "$1 refuses the replaced base: $line"
  else
    not_ok "$1 with the replaced base: exit $rc"
    comment "$out"
  fi
}
run mpirun -np 2 "$EXE" "${TRAIN[@]/--max_steps=6/--max_steps=7}" --checkpoint_dir="$WORK/b" --resume_from_checkpoint
refused "resuming"
if [ "$FAMILY" = llama ]; then # (recipes/generate.lua takes decoders)
  run "$EXE" recipes/generate.lua --init_from="$WORK/b" --prompt_ids=1,5,9 --max_new_tokens=4 --stop_ids=none
  refused "recipes/generate.lua"
fi
run "$EXE" tools/export.lua "$WORK/b" "$WORK/export"
refused "tools/export.lua"
