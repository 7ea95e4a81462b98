#!/usr/bin/env bash
# tests/mpi/seed_args.sh NP: the seed's TRAINING_ARGS line (its
# llama2_7b-training.sbatch) runs unchanged on recipes/llama2_7b.lua on NP
# ranks (1: no mpirun), at reduced sizes, the option names and value forms
# exactly as the seed writes them: --model_type=llama_v2,
# --sharding_strategy=full, --offload_activations=1, --bf16,
# --resume_from_checkpoint=./checkpoints, --dataset as token shards written
# here by tools/tokenize.lua with --tokenizer=byte. Then the same line with
# more steps resumes from the last checkpoint, and --grad_accum_steps=2
# trains on the same line. Last, the seed's data arguments as it writes
# them, --dataset=c4 --dataset_config_name=en
# --tokenizer=hf-internal-testing/llama-tokenizer, stream C4-like shards
# generated under FSDP_DATA with the Llama-2-style SentencePiece model of
# tests/golden placed in a Hugging Face cache (fsdp.data.hub).
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

NP=${1:?usage: tests/mpi/seed_args.sh NP}
ROOT=$PWD
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
case "$EXE" in /*) ;; *) EXE=$ROOT/$EXE ;; esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-seed-args.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

# A small corpus, tokenized byte-level into $WORK/corpus.
awk 'BEGIN { srand(1); split("the cat sat on a mat and the dog ran far away", w, " ");
             for (d = 0; d < 200; d++) { line = ""; for (i = 0; i < 60; i++) line = line w[int(rand() * 13) + 1] " ";
                                         print line; print "" } }' >"$WORK/corpus.txt"
if ! tok=$("$EXE" tools/tokenize.lua --input="$WORK/corpus.txt" --output="$WORK/corpus" --tokenizer=byte \
      --val_fraction=0.1 2>&1); then
  not_ok "tokenize the corpus"
  comment "$tok"
  exit 0
fi

# The seed's TRAINING_ARGS, reduced: 4096 -> 32 tokens, 32 -> 2 layers,
# 4096 -> 64 wide, 5000 -> 12 steps (default warmup 10 < 12), checkpoints
# and validation every 6 steps.
SEED_ARGS=(--max_context_width=32 --num_key_value_heads=4 --intermediate_size=128 --hidden_width=64
           --num_layers=2 --num_heads=4 --model_type=llama_v2 --tokenizer=byte
           --checkpoint_freq=6 --validation_freq=6 --max_steps=12 --checkpoint_dir=./checkpoints
           --dataset=corpus --resume_from_checkpoint=./checkpoints --train_batch_size=1
           --val_batch_size=1 --sharding_strategy=full --offload_activations=1 --bf16)

run() {
  if [ "$NP" = 1 ]; then
    out=$(cd "$WORK" && timeout -k 5 60 "$EXE" "$ROOT/recipes/llama2_7b.lua" "$@" 2>&1)
  else
    out=$(cd "$WORK" && timeout -k 5 60 mpirun -np "$NP" "$EXE" "$ROOT/recipes/llama2_7b.lua" "$@" 2>&1)
  fi
  rc=$?
}

# check DESCRIPTION NEEDLE...: exit 0 and every needle in the output.
check() {
  local what=$1 needle missing=(); shift
  for needle in "$@"; do grep -qF -- "$needle" <<<"$out" || missing+=("$needle"); done
  if [ "$rc" -ne 0 ] || [ ${#missing[@]} -gt 0 ]; then
    not_ok "$what ($NP ranks): exit $rc, missing: ${missing[*]:-}"
    comment "$out"
  else
    ok "$what ($NP ranks)"
  fi
}

s=s; [ "$NP" = 1 ] && s=
run "${SEED_ARGS[@]}"
check "the seed's TRAINING_ARGS line (reduced sizes) trains" \
  "sharding: FULL_SHARD over $NP rank$s, 3 units, compute bf16, reduce bf16, activations offloaded" \
  "model: 2 layers, width 64, 4 heads (4 kv), ffn 128, vocab 257" \
  "checkpoint: no complete checkpoint in ./checkpoints: starting fresh" \
  "Validation at batch 6" "checkpoint: saved ./checkpoints/step-000006" \
  "Batch 12 Loss" "checkpoint: saved ./checkpoints/step-000012"
a=$(grep -o 'Batch 12 Loss: [0-9.]*' <<<"$out")

# The same line again with 2 more steps: --resume_from_checkpoint=DIR resumes.
run "${SEED_ARGS[@]/--max_steps=12/--max_steps=14}"
check "the same line resumes from its last checkpoint" \
  "checkpoint: resumed from ./checkpoints/step-000012 (step 12" "Batch 14 Loss"
if [ "$rc" -ne 0 ] || grep -q 'Batch [0-9] Loss\|Batch 1[0-2] Loss' <<<"$out"; then not_ok "the resumed run trains only steps 13 and 14 ($NP ranks)"; comment "$out"
else ok "the resumed run trains only steps 13 and 14 ($NP ranks)"; fi

# With --grad_accum_steps=2: a run killed (SIGKILL, rank 0) right after
# the checkpoint of step 6 and started again with the same command logs
# exactly the losses of an uninterrupted run: the data position after k
# micro-batches per step is in the checkpoint.
losses() { grep '"type":"train"' "$1" | while IFS= read -r l; do
  echo "$(grep -o '"step":[0-9]*' <<<"$l") $(grep -o '"loss":[^,}]*' <<<"$l")"; done | sort -t: -k2 -n; }
rm -rf "$WORK/checkpoints"
run "${SEED_ARGS[@]}" --grad_accum_steps=2 --metrics_file=straight.jsonl
check "the seed's line with --grad_accum_steps=2" "Batch 12 Loss" "checkpoint: saved ./checkpoints/step-000012"
rm -rf "$WORK/checkpoints"
FSDP_TEST_KILL_AT_STEP=6 run "${SEED_ARGS[@]}" --grad_accum_steps=2 --metrics_file=resumed.jsonl
killed=$rc
run "${SEED_ARGS[@]}" --grad_accum_steps=2 --metrics_file=resumed.jsonl
want=$(losses "$WORK/straight.jsonl") got=$(losses "$WORK/resumed.jsonl")
if [ "$killed" -ne 0 ] && grep -qF 'resumed from ./checkpoints/step-000006' <<<"$out" \
   && [ "$(wc -l <<<"$want")" -eq 12 ] && [ "$want" = "$got" ]; then
  ok "--grad_accum_steps=2 killed after step 6 and resumed: the losses of the uninterrupted run ($NP ranks)"
else
  not_ok "--grad_accum_steps=2 killed after step 6 and resumed: the losses of the uninterrupted run ($NP ranks)"
  comment "killed run exit $killed; straight: $want; resumed: $got"
  comment "$out"
fi

# The seed's data arguments unchanged: C4-like shards in $FSDP_DATA/c4/en,
# the tokenizer from a Hugging Face cache laid out as huggingface-cli
# download leaves it.
snap="$WORK/hf/hub/models--hf-internal-testing--llama-tokenizer/snapshots/0000"
mkdir -p "$snap" "$WORK/hf/hub/models--hf-internal-testing--llama-tokenizer/refs"
cp tests/golden/tokenizers/spm.model "$snap/tokenizer.model"
printf 0000 >"$WORK/hf/hub/models--hf-internal-testing--llama-tokenizer/refs/main"
"$EXE" -e "local c = require 'tests.data.corpus'
  c.write_c4('$WORK/data/c4/en', { shards = 2, documents = 60 })
  c.write_c4('$WORK/data/c4/en', { shards = 1, documents = 30, split = 'validation', seed = 5 })"
DATA_ARGS=("${SEED_ARGS[@]/--dataset=corpus/--dataset=c4}")
DATA_ARGS=("${DATA_ARGS[@]/--tokenizer=byte/--tokenizer=hf-internal-testing/llama-tokenizer}")
rm -rf "$WORK/checkpoints"
FSDP_DATA=$WORK/data HF_HUB_CACHE=$WORK/hf/hub run "${DATA_ARGS[@]}" --dataset_config_name=en --max_steps=6 \
  --warmup_steps=2 --checkpoint_freq=0
check "the seed's --dataset=c4 --dataset_config_name=en --tokenizer=hf-internal-testing/llama-tokenizer" \
  "data: --dataset c4 (config en): 2 training shards in $WORK/data/c4/en, 1 validation shards" \
  "vocab 600" "Validation at batch 6" "Batch 6 Loss"
