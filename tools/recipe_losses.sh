#!/usr/bin/env bash
# tools/recipe_losses.sh: the losses of every CPU recipe, as exact as each
# logs them, so that a refactoring can show it changed no arithmetic: run
# it on the tree before and after and compare the two outputs.
#
#   tools/recipe_losses.sh > before.txt      (on the old tree)
#   tools/recipe_losses.sh > after.txt       (on the new tree)
#   diff before.txt after.txt && echo "the same losses, bit for bit"
#
# One line per run: its name, then its training (and validation) losses.
# The decoder and DeepViT recipes write them to a metrics file as JSON
# numbers (printed with 17 significant digits: every bit of an f64); T5
# and MNIST log them on the console only (4 and 6 decimals), which is what
# this compares for them. Tiny configurations, one process and two ranks
# (FULL_SHARD), f32 and bf16 mixed precision: about a minute in all.
# Exit status: 0, or 1 when a run failed (its name and log's end on stderr).
set -uo pipefail
cd "$(dirname "$0")/.."
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
[ -x "$EXE" ] || { echo "recipe_losses: $EXE is missing: run ./build.sh first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
status=0
# The "loss" fields of a metrics file, 17 significant digits, after their record's type.
cat >"$tmp/losses.lua" <<'LUA'
local cjson = require 'cjson'
local out = {}
for line in io.lines(arg[1]) do
  local r = cjson.decode(line)
  if r.loss then out[#out + 1] = ('%s:%.17g'):format(r.type or 'train', r.loss) end
end
io.write(table.concat(out, ' '))
LUA

LLAMA=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=64 --num_heads=4 --num_kv_heads=2 --vocab_size=128
       --seq_len=16 --batch_size=2 --max_steps=6 --warmup_steps=1 --lr=1e-2 --validation_freq=3 --val_batches=1
       --skip_fit_check)
GPT2=(recipes/llama2_7b.lua --model=gpt2-tiny --seq_len=16 --batch_size=2 --max_steps=6 --warmup_steps=1 --lr=1e-2
      --validation_freq=3 --val_batches=1 --skip_fit_check)
QWEN3_MOE=(recipes/llama2_7b.lua --init_from=tests/golden/hf/qwen3_moe_tiny --seq_len=16 --batch_size=2
           --max_steps=6 --warmup_steps=1 --lr=1e-2 --validation_freq=3 --val_batches=1 --skip_fit_check)
DEEPVIT=(recipes/deepvit_8b.lua --model=tiny --depth=2 --dim=32 --heads=2 --mlp_dim=64 --image_size=16
         --patch_size=8 --num_classes=4 --batch_size=2 --max_steps=6 --dropout=0 --validation_freq=3 --val_batches=1
         --skip_fit_check)
T5=(recipes/t5_3b.lua --model=tiny --num_layers=1 --d_model=32 --d_ff=64 --d_kv=8 --num_heads=4 --vocab_size=16
    --batch_size=2 --max_len=4 --max_steps=6 --warmup_steps=1 --log_every=1 --eval_examples=2 --skip_fit_check)
MNIST=(recipes/mnist.lua --epochs=1 --train_size=16 --test_size=4 --batch_size=4 --test_batch_size=2 --log_interval=1)

# run NAME NP KIND ARGS...: the recipe on NP ranks (1: one process); KIND
# json reads the metrics file's "loss" fields, console the logged lines
# that carry a loss.
run() {
  local name=$1 np=$2 kind=$3; shift 3
  local log=$tmp/$name.log metrics=$tmp/$name.jsonl launch=()
  [ "$np" -gt 1 ] && launch=(mpirun -np "$np")
  local extra=()
  [ "$kind" = json ] && extra=(--metrics_file="$metrics")
  if ! "${launch[@]}" "$EXE" "$@" "${extra[@]}" >"$log" 2>&1; then
    echo "recipe_losses: $name failed; the end of its log:" >&2
    tail -5 "$log" >&2
    status=1
    return
  fi
  if [ "$kind" = json ]; then
    printf '%s %s\n' "$name" "$("$EXE" "$tmp/losses.lua" "$metrics")"
  else
    printf '%s %s\n' "$name" "$(grep -iE 'loss' "$log" | grep -oiE '(loss|accuracy)[^,]*' | tr '\n' ' ')"
  fi
}

for np in 1 2; do
  for mp in f32 bf16; do
    flag=(--mixed_precision=); [ "$mp" = bf16 ] && flag=(--mixed_precision=bf16)
    run "llama.$mp.np$np" "$np" json "${LLAMA[@]}" "${flag[@]}"
    run "gpt2.$mp.np$np" "$np" json "${GPT2[@]}" "${flag[@]}"
    run "qwen3_moe.$mp.np$np" "$np" json "${QWEN3_MOE[@]}" "${flag[@]}"
    run "deepvit.$mp.np$np" "$np" json "${DEEPVIT[@]}" "${flag[@]}"
    run "t5.$mp.np$np" "$np" console "${T5[@]}" "${flag[@]}"
  done
  run "mnist.np$np" "$np" console "${MNIST[@]}"
done
exit $status
