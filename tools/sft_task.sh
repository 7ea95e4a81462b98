#!/usr/bin/env bash
# tools/sft_task.sh [DIR] [LORA_STEPS]: the SFT learning task end to end
# (docs/sft.md): data and two tiny random models
# (tools/make_chat_task.lua), then for each family (qwen2 with the
# Qwen2.5-Instruct template, llama with SmolLM2's):
#   1. full-parameter training on the plain sums (facts.jsonl, no template): what a
#      pretrained base would know; a random model cannot learn sums through LoRA alone;
#   2. exact-match accuracy of greedy answers on the held-out conversations (before);
#   3. LoRA on the conversations, 2 ranks, merged export;
# (both training stages pack several short examples per row: --packing)
#   4. exact-match accuracy again (after).
# Needs mpirun (and the MPI environment of tests/mpi/run.sh on a small machine).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/sft_task} STEPS=${2:-1200}
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
rm -rf "$DIR"
"$EXE" tools/make_chat_task.lua --out="$DIR"
for fam in qwen2 llama; do
  mpirun -np 2 "$EXE" recipes/sft.lua --init_from="$DIR/$fam" --data="$DIR/facts.jsonl" --val_fraction=0 \
    --validation_freq=0 --max_steps=600 --lr=3e-3 --warmup_steps=10 --batch_size=16 --seq_len=160 --log_every=200 --packing \
    --export_hf="$DIR/$fam-base"
  mpirun -np 2 "$EXE" recipes/sft.lua --init_from="$DIR/$fam-base" --val_data="$DIR/test.jsonl" --eval --seq_len=160 \
    --num_samples=0 | grep 'eval:' | sed "s/^/before ($fam): /"
  mpirun -np 2 "$EXE" recipes/sft.lua --init_from="$DIR/$fam-base" --data="$DIR/train.jsonl" \
    --val_data="$DIR/test.jsonl" --seq_len=160 --lora_rank=16 --lora_alpha=32 --packing \
    --lora_targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --lr=3e-3 --warmup_steps=10 \
    --max_steps="$STEPS" --batch_size=16 --validation_freq=100 --val_batches=2 --num_samples=2 --log_every=50 \
    --export_hf="$DIR/$fam-chat"
  mpirun -np 2 "$EXE" recipes/sft.lua --init_from="$DIR/$fam-chat" --val_data="$DIR/test.jsonl" --eval --seq_len=160 \
    --num_samples=0 | grep 'eval:' | sed "s/^/after ($fam): /"
done
