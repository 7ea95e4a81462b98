#!/usr/bin/env bash
# tests/mpi/families_finetune.sh FAMILY: issue 39's fine-tune of each
# decoder family's tiny Hugging Face directory (the stored goldens, made
# by transformers) through recipes/llama2_7b.lua on 2 ranks, FULL_SHARD:
#
#   1. full fine-tune, 8 steps, checkpoints at 4 and 8: the loss falls
#      (the mean of the last quarter of the steps below the first quarter's);
#   2. the same run killed right after its save of step 4
#      (FSDP_TEST_KILL_AT_STEP) and resumed by the same command: steps 5-8
#      log the uninterrupted run's losses bit for bit;
#   3. LoRA (the family's default targets, lr 2e-2), 16 steps: the loss falls, and
#      the merged export loads back as the family and generates.
#
#   FAMILY: a declared family with a tests/golden/hf/FAMILY_tiny directory
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

FAMILY=${1:?usage: tests/mpi/families_finetune.sh FAMILY}
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
GOLDEN=tests/golden/hf/${FAMILY}_tiny
[ -d "$GOLDEN" ] || { echo "not ok - no $GOLDEN"; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-families.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

TAP_TAG=$FAMILY
. tests/mpi/tap.sh
# falls FILE STEPS: the mean loss of the last quarter of the steps below
# the first quarter's (each batch is another sample: one step is noise).
falls() {
  losses "$1" 1 "$2" | awk -v n="$2" '$1 <= n / 4 { a += $2; na++ } $1 > n - n / 4 { b += $2; nb++ }
    END { if (na && nb && na == nb && b / nb < a / na) { printf "%.4f -> %.4f", a / na, b / nb; exit 0 } exit 1 }'
}

TRAIN=(recipes/llama2_7b.lua --init_from="$GOLDEN" --max_steps=8 --warmup_steps=0 --lr=3e-3 --seq_len=16
       --batch_size=4 --validation_freq=0 --checkpoint_freq=4 --sharding_strategy=FULL_SHARD)

# 1. Full fine-tune, uninterrupted.
run mpirun -np 2 "$EXE" "${TRAIN[@]}" --checkpoint_dir="$WORK/a" --metrics_file="$WORK/a.jsonl"
if [ "$rc" -eq 0 ] && fell=$(falls "$WORK/a.jsonl" 8); then
  ok "full fine-tune on 2 ranks (FULL_SHARD): loss $fell"
else
  not_ok "full fine-tune: exit $rc, losses $(losses "$WORK/a.jsonl" 1 8 | tr '\n' ' ')"; comment "$out"
fi

# 2. Killed after the save of step 4, then resumed by the same command.
run env FSDP_TEST_KILL_AT_STEP=4 mpirun -np 2 "$EXE" "${TRAIN[@]}" --checkpoint_dir="$WORK/b" \
  --metrics_file="$WORK/b.jsonl"
if [ "$rc" -eq 0 ] || [ ! -d "$WORK/b/step-000004" ]; then
  not_ok "the run killed after step 4: exit $rc, checkpoint $(ls "$WORK/b" 2>&1)"; comment "$out"
else
  run mpirun -np 2 "$EXE" "${TRAIN[@]}" --checkpoint_dir="$WORK/b" --metrics_file="$WORK/b.jsonl" \
    --resume_from_checkpoint
  want=$(losses "$WORK/a.jsonl" 5 8)
  got=$(losses "$WORK/b.jsonl" 5 8)
  if [ "$rc" -eq 0 ] && [ "$(wc -l <<<"$want")" -eq 4 ] && [ "$got" = "$want" ]; then
    ok "killed after step 4 and resumed: steps 5-8 log the uninterrupted run's losses exactly"
  else
    not_ok "killed and resumed: exit $rc; losses 5-8 $(tr '\n' ' ' <<<"$got")against $(tr '\n' ' ' <<<"$want")"
    comment "$out"
  fi
fi

# 3. LoRA on the family's default targets, exported merged, loaded back and generating.
LORA=("${TRAIN[@]/--lr=3e-3/--lr=2e-2}")
run mpirun -np 2 "$EXE" "${LORA[@]/--max_steps=8/--max_steps=16}" --lora_rank=4 --lora_alpha=8 \
  --checkpoint_dir="$WORK/c" --metrics_file="$WORK/c.jsonl" --export_hf="$WORK/export"
if [ "$rc" -eq 0 ] && fell=$(falls "$WORK/c.jsonl" 16); then
  run "$EXE" recipes/generate.lua --init_from="$WORK/export" --prompt_ids=1,5,9 --max_new_tokens=4 --stop_ids=none
  if [ "$rc" -eq 0 ] && grep -q "\"model_type\": *\"$FAMILY\"" "$WORK/export/config.json"; then
    ok "LoRA fine-tune on 2 ranks: loss $fell; the merged export is a $FAMILY directory that generates"
  else
    not_ok "generation from the LoRA export: exit $rc"; comment "$out"
  fi
else
  not_ok "LoRA fine-tune: exit $rc, losses $(losses "$WORK/c.jsonl" 1 16 | tr '\n' ' ')"; comment "$out"
fi
