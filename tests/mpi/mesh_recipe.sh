#!/usr/bin/env bash
# tests/mpi/mesh_recipe.sh: the decoder recipes' mesh options end to end on
# recipes/llama2_7b.lua (tiny model, synthetic data, f32): --tp=2 on 4
# ranks (tp 2 x dp_shard 2) logs the losses and gradient norms of 2 ranks
# without a mesh (the same data-parallel batches), so do --tp=2
# --sequence_parallel and --tp=2 --lora_rank=4 (against LoRA on 2 ranks),
# --dp_shard=2 on 2 ranks
# logs exactly the bits of no mesh, and --tp with an uncovered family or
# feature fails in one line before anything is built.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-mesh-recipe.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ARGS="--model=tiny --max_steps=4 --warmup_steps=0 --validation_freq=0 --log_every=1"

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

# run NAME NP ARGS...: the recipe's metrics file as "loss grad_norm" lines.
run() {
  local name=$1 np=$2; shift 2
  local out
  if ! out=$(timeout 300 mpirun -np "$np" "$EXE" recipes/llama2_7b.lua $ARGS \
               --metrics_file="$WORK/$name.jsonl" "$@" 2>&1); then
    not_ok "$name: the recipe failed"
    comment "$out"
    return 1
  fi
  "$EXE" -e "
    local cjson = require 'cjson'
    for line in io.lines('$WORK/$name.jsonl') do
      local r = cjson.decode(line)
      if r.loss and r.grad_norm then print(('%.17g %.17g'):format(r.loss, r.grad_norm)) end
    end" > "$WORK/$name.txt"
  [ -s "$WORK/$name.txt" ] || { not_ok "$name: no losses logged"; return 1; }
}

run dp2 2 && run dp2_mesh 2 --dp_shard=2 && {
  if cmp -s "$WORK/dp2.txt" "$WORK/dp2_mesh.txt"; then ok "--dp_shard=2 on 2 ranks logs the bits of no mesh"
  else
    not_ok "--dp_shard=2 on 2 ranks differs from no mesh"
    comment "$(paste "$WORK/dp2.txt" "$WORK/dp2_mesh.txt")"
  fi
}
# same_as BASE NAME WHAT: NAME's losses and gradient norms within 1e-5
# relative of BASE's (f32: TP changes only the order of additions: split
# GEMMs, all-reduced or reduce-scattered).
same_as() {
  local base=$1 name=$2 what=$3 worst
  worst=$(paste "$WORK/$base.txt" "$WORK/$name.txt" | awk '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (b < 0 ? -b : b) }
    { e = rel($3, $1); if (e > w) w = e; e = rel($4, $2); if (e > w) w = e; n++ }
    END { if (n == 0) print "none"; else printf "%.3g\n", w }')
  if [ "$worst" != none ] && awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }'; then
    ok "$what: worst relative loss/grad-norm error $worst"
  else
    not_ok "$what differs (worst $worst)"
    comment "$(paste "$WORK/$base.txt" "$WORK/$name.txt")"
  fi
}
run tp2 4 --tp=2 && same_as dp2 tp2 "--tp=2 on 4 ranks (tp 2 x dp_shard 2) = 2 ranks without TP"
run tp2sp 4 --tp=2 --sequence_parallel && \
  same_as dp2 tp2sp "--tp=2 --sequence_parallel on 4 ranks (tp 2 x dp_shard 2) = 2 ranks without TP"
# LoRA then TP then sharding: the adapters split with their layers
run dp2lora 2 --lora_rank=4 && {
  run tp2lora 4 --tp=2 --lora_rank=4 && \
    same_as dp2lora tp2lora "--tp=2 --lora_rank=4 on 4 ranks (tp 2 x dp_shard 2) = 2 ranks of LoRA without TP"
  run tp2lora_sp 4 --tp=2 --lora_rank=4 --sequence_parallel && \
    same_as dp2lora tp2lora_sp "--tp=2 --lora_rank=4 --sequence_parallel on 4 ranks = 2 ranks of LoRA without TP"
}
for bad in "--sequence_parallel|--sequence_parallel needs --tp > 1" \
           "--tp=2 --lora_rank=4 --lora_dropout=0.1|--tp=2 with --lora_dropout=0.1" \
           "--tp=2 --sequence_parallel --seq_len=33|--seq_len=33 is not divisible by --tp=2"; do
  flags=${bad%%|*} needle=${bad#*|}
  # shellcheck disable=SC2086
  out=$(timeout 120 mpirun -np 2 "$EXE" recipes/llama2_7b.lua $ARGS $flags 2>&1)
  if grep -qF -- "$needle" <<<"$out" && ! grep -q "Batch 1" <<<"$out"; then
    ok "$flags fails in one line before training"
  else
    not_ok "$flags was not refused as expected"; comment "$out"
  fi
done
out=$(timeout 120 mpirun -np 2 "$EXE" recipes/llama2_7b.lua $ARGS --model=gpt2-tiny --tp=2 2>&1)
if grep -qF -- "--tp=2: the gpt2 family has no tensor-parallel plan" <<<"$out" && ! grep -q "Batch 1" <<<"$out"; then
  ok "--tp=2 with a family without a TP plan fails in one line before training"
else
  not_ok "--tp=2 with gpt2 was not refused as expected"; comment "$out"
fi
