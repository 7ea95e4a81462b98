#!/usr/bin/env bash
# tests/mpi/lifecycle.sh NAME [RECIPE ARGS...]: the model's whole life from
# the recipes, on 2 ranks (issue 16's must-show).
#
#   1. a tiny Hugging Face Llama directory, written here from the stored
#      goldens (tests/golden/hf/llama3_tiny_v5: transformers 5 layout), loads
#      into 2-rank shards with the golden HF logits (f32, max abs err <= 1e-4);
#   2. recipes/llama2_7b.lua --init_from=DIR fine-tunes it 30 steps on 2 ranks,
#      saving a checkpoint at the end and --export_hf=EXPORT;
#   3. recipes/generate.lua prints a continuation from the checkpoint, and the
#      same one from the export;
#   4. the export loads back with our loader (models/hf.lua) with the
#      trained model's logits, and so does tools/export.lua's export of the
#      checkpoint;
#   5. the same command with --resume_from_checkpoint resumes the run's
#      checkpoint instead of loading --init_from again, and says so (a LoRA
#      run loads its base from --init_from under the resumed adapters).
#
# RECIPE ARGS go to the training runs (step 2 and 5): `lifecycle.sh full`
# is full fine-tuning; a variant adds its own options (a LoRA run:
# `lifecycle.sh lora --lora_rank=4 ...`) and reuses every check.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

NAME=${1:?usage: tests/mpi/lifecycle.sh NAME [RECIPE ARGS...]}
shift
EXTRA=("$@")
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
GOLDEN=tests/golden/hf/llama3_tiny_v5
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-lifecycle.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

ok() { echo "ok - $* ($NAME)"; }
not_ok() { echo "not ok - $* ($NAME)"; }
comment() { sed 's/^/#   /' <<<"$1"; }

# run COMMAND...: its output in $out, its status in $rc (bounded: 120 s).
run() {
  out=$(timeout -k 5 120 "$@" 2>&1)
  rc=$?
}
# check DESCRIPTION NEEDLE...: exit 0 and every needle in the output.
check() {
  local what=$1 needle missing=(); shift
  for needle in "$@"; do grep -qF -- "$needle" <<<"$out" || missing+=("$needle"); done
  if [ "$rc" -ne 0 ] || [ ${#missing[@]} -gt 0 ]; then
    not_ok "$what: exit $rc, missing: ${missing[*]:-}"
    comment "$out"
    return 1
  fi
  ok "$what"
}
# tap: pass lifecycle.lua's TAP lines on, suffixed with the variant.
tap() {
  grep '^ok - \|^not ok - \|^#' <<<"$out" | sed -E "s/^((not )?ok - .*)$/\1 ($NAME)/"
  if [ "$rc" -ne 0 ]; then not_ok "$1: exit $rc"; comment "$out"; fi
}

# 1. The directory: config.json and weights as transformers 5 saved them.
HF=$WORK/llama3-tiny
mkdir -p "$HF"
cp "$GOLDEN/config.json" "$GOLDEN/model.safetensors" "$HF/"
run mpirun -np 2 "$EXE" tests/mpi/lifecycle.lua golden "$HF" "$GOLDEN/golden.safetensors"
tap "golden logits"

# 2. Full fine-tune, 30 steps, 2 ranks.
TRAIN=(--init_from="$HF" --max_steps=30 --warmup_steps=3 --lr=3e-3 --seq_len=16 --batch_size=4
       --validation_freq=0 --checkpoint_dir="$WORK/ckpt" --checkpoint_freq=30 --export_hf="$WORK/export"
       "${EXTRA[@]}")
run mpirun -np 2 "$EXE" recipes/llama2_7b.lua "${TRAIN[@]}"
check "--init_from an HF directory trains 30 steps on 2 ranks and exports" \
  "sharding: FULL_SHARD over 2 ranks" "model: 2 layers, width 32, 4 heads (2 kv), ffn 48, vocab 64: 17568 parameters, f32, llama" \
  "init_from: loaded Hugging Face directory $HF (llama)" "Batch 30 Loss" \
  "checkpoint: saved $WORK/ckpt/step-000030" "export: wrote $WORK/export (Hugging Face llama)"
first=$(grep -o 'Batch 1 Loss: [0-9.]*' <<<"$out" | grep -o '[0-9.]*$')
last=$(grep -o 'Batch 30 Loss: [0-9.]*' <<<"$out" | grep -o '[0-9.]*$')
if awk -v a="${first:-0}" -v b="${last:-0}" 'BEGIN { exit !(b > 0 && b < a) }'; then
  ok "the loss falls while fine-tuning ($first -> $last)"
else
  not_ok "the loss falls while fine-tuning ($first -> $last)"
fi
for f in config.json generation_config.json model.safetensors; do
  [ -f "$WORK/export/$f" ] || { not_ok "the export holds $f"; comment "$(ls -la "$WORK/export")"; }
done

# 3. A continuation from the checkpoint, and the same from the export.
GEN=(--prompt_ids=1,5,9 --max_new_tokens=8 --stop_ids=none)
run "$EXE" recipes/generate.lua --init_from="$WORK/ckpt" "${GEN[@]}"
check "recipes/generate.lua continues a prompt from the fine-tuned checkpoint" "1 5 9 |" \
  "generated 8 tokens for 1 prompt"
from_ckpt=$(grep '^1 5 9 |' <<<"$out")
run "$EXE" recipes/generate.lua --init_from="$WORK/export" "${GEN[@]}"
from_export=$(grep '^1 5 9 |' <<<"$out")
if [ "$rc" -eq 0 ] && [ -n "$from_ckpt" ] && [ "$from_ckpt" = "$from_export" ]; then
  ok "the export generates the checkpoint's continuation: $from_export"
else
  not_ok "the export generates the checkpoint's continuation"
  comment "checkpoint: $from_ckpt"$'\n'"export: $from_export"$'\n'"$out"
fi

# 4. The exports load back with the trained model's logits.
run mpirun -np 2 "$EXE" tests/mpi/lifecycle.lua export "$WORK/ckpt" "$WORK/export" "$HF"
tap "--export_hf loads back"
run "$EXE" tools/export.lua "$WORK/ckpt" "$WORK/offline"
check "tools/export.lua exports the 2-rank checkpoint in one process" "export: checkpoint $WORK/ckpt/step-000030"
run "$EXE" tests/mpi/lifecycle.lua export "$WORK/ckpt" "$WORK/offline" "$HF"
tap "tools/export.lua's export loads back"

# 5. Restarted with --resume_from_checkpoint: the checkpoint wins, said in the log.
# A LoRA checkpoint holds the adapters only: its base is loaded again.
run mpirun -np 2 "$EXE" recipes/llama2_7b.lua "${TRAIN[@]/--max_steps=30/--max_steps=31}" --resume_from_checkpoint
if [ "$NAME" = lora ]; then
  init_line="init_from: loaded the LoRA base Hugging Face directory $HF (llama)"
else
  init_line="init_from: Hugging Face directory $HF (llama) not loaded"
fi
check "--init_from with --resume_from_checkpoint resumes the run's checkpoint" \
  "checkpoint: resumed from $WORK/ckpt/step-000030" "$init_line" "Batch 31 Loss"
