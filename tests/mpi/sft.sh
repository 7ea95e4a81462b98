#!/usr/bin/env bash
# tests/mpi/sft.sh: recipes/sft.lua with LoRA on 2 ranks (FULL_SHARD) on
# the learning task's conversations (tools/make_chat_task.lua, a tiny
# Qwen2 with the Qwen2.5-Instruct template): the validation loss on the
# held-out answers falls from the first validation to the last, and the
# merged export answers through recipes/chat.lua from a pipe.
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-sft.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
comment() { sed 's/^/#   /' <<<"$1" | tail -n 40; }

out=$(timeout -k 5 60 "$EXE" tools/make_chat_task.lua --out="$WORK/task" --train=200 --test=16 --width=32 \
  --layers=2 2>&1) ||
  { echo "not ok - tools/make_chat_task.lua"; comment "$out"; exit 1; }
out=$(timeout -k 5 240 mpirun -np 2 "$EXE" recipes/sft.lua --init_from="$WORK/task/qwen2" \
  --data="$WORK/task/train.jsonl" \
  --val_data="$WORK/task/test.jsonl" --seq_len=160 --lora_rank=8 --lora_alpha=16 --lr=1e-2 --max_steps=30 \
  --batch_size=4 --validation_freq=10 --num_samples=1 --sample_max_new_tokens=4 --sharding_strategy=FULL_SHARD \
  --export_hf="$WORK/out" 2>&1)
rc=$?
first=$(grep -oE 'Validation at batch 10: loss [0-9.]+' <<<"$out" | awk '{print $NF}')
last=$(grep -oE 'Validation at batch 30: loss [0-9.]+' <<<"$out" | awk '{print $NF}')
if [ "$rc" -eq 0 ] && [ -n "$first" ] && [ -n "$last" ] &&
   awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
  echo "ok - sft.lua LoRA on 2 ranks: held-out answer loss $first -> $last"
else
  echo "not ok - sft.lua LoRA on 2 ranks: exit $rc, answer loss ${first:-?} -> ${last:-?}"; comment "$out"
fi
# (one line per answer, an empty answer too: counted in the file, not in $(...), which drops empty lines)
printf 'What is 2 + 3?\nAdd 4.\n' | timeout -k 5 60 "$EXE" recipes/chat.lua --init_from="$WORK/out" \
  --system='Answer with a number.' --max_new_tokens=4 >"$WORK/chat.txt" 2>&1
rc=$? out=$(cat "$WORK/chat.txt")
if [ "$rc" -eq 0 ] && [ "$(wc -l <"$WORK/chat.txt")" -eq 2 ]; then
  echo "ok - chat.lua on the LoRA export through a pipe: two answers"
else
  echo "not ok - chat.lua on the LoRA export"; comment "$out"
fi
