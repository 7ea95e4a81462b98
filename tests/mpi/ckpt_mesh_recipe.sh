#!/usr/bin/env bash
# tests/mpi/ckpt_mesh_recipe.sh: recipes/llama2_7b.lua killed and resumed
# across meshes on 4 ranks (issue 43), tiny Llama (4 kv heads, so tp 4
# divides them), synthetic data, f32, 6 steps, a checkpoint every step.
# Every mesh sees the same global batch per step (4 chain batches of
# --batch_size: tp 2 x dp 2 with 2 micro-batches, tp 4 with 4, dp 4 with
# 1; the data position continues across data-parallel sizes).
#   1. Uninterrupted at tp 2 x dp_shard 2, with --save_full_state_dict and
#      --export_hf.
#   2. Killed after step 2 (same mesh), resumed at tp 2 x dp 2 to step 3,
#      at tp 4 to 4, at tp 1 x dp_shard 4 to 5, back at tp 2 x dp 2 to 6:
#      steps 1-3 log the uninterrupted losses bit for bit (the same mesh:
#      the same arithmetic), steps 4-6 within 1e-5 relative (other meshes
#      only reorder additions: the bound of tests/mpi/tp_equivalence.lua).
#   3. The uninterrupted checkpoint of step 6 resumed at tp 4 and saved
#      whole (--save_full_state_dict, no step run): the bits of run 1's file.
#   4. The export of run 1 is the model trained without TP (tp 1 x dp 4,
#      uninterrupted): every tensor within 1e-5 norm-wise relative; its
#      full state dict file and its export hold the same bits.
#   5. --init_from run 1's export at tp 4 and at tp 1 x dp 4: the first
#      step's loss (of the loaded weights) agrees within 1e-5.
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh numbers them).
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-ckpt-mesh-recipe.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
. tests/mpi/tap.sh

BASE=(recipes/llama2_7b.lua --model=tiny --num_kv_heads=4 --max_steps=6 --warmup_steps=0 --validation_freq=0
      --log_every=1 --batch_size=2)
TP2=(--tp=2 --grad_accum_steps=2)
TP4=(--tp=4 --grad_accum_steps=4)
DP4=(--tp=1 --dp_shard=4 --grad_accum_steps=1)

# compare A B: "N WORST" over the tensors of two safetensors files or HF
# directories (WORST: the largest norm-wise relative difference; 0: same
# bits), or "names differ".
compare() {
  "$EXE" -e "
    local fsdp = require 'fsdp'
    local st = require 'fsdp.io.safetensors_sharded'
    local a, b = st.load_dir('$1'), st.load_dir('$2')
    local n, worst = 0, 0
    for name, t in pairs(b) do
      if not a[name] or table.concat(a[name].shape, 'x') ~= table.concat(t.shape, 'x') then
        print('names differ at ' .. name); os.exit(0)
      end
      local function norm(x) return math.sqrt((x * x):sum():item()) end
      local d = norm(a[name]:double() - t:double())
      worst = math.max(worst, d == 0 and 0 or d / norm(t:double()))
      n = n + 1
    end
    for name in pairs(a) do if not b[name] then print('names differ at ' .. name); os.exit(0) end end
    print(('%d %.3g'):format(n, worst))"
}
# rel_ok FILE_A FILE_B FIRST LAST TOL: the losses of steps FIRST..LAST,
# worst relative difference ("none" without them); status: within TOL.
rel_ok() {
  paste <(losses "$1" "$3" "$4") <(losses "$2" "$3" "$4") | awk -v tol="$5" '
    { d = $2 - $4; if (d < 0) d = -d; r = d / ($4 < 0 ? -$4 : $4); if (r > w) w = r; n++ }
    END { if (n == 0) { print "none"; exit 1 } printf "%.3g\n", w; exit !(w <= tol) }'
}

# 1. uninterrupted, tp 2 x dp 2
run mpirun -np 4 "$EXE" "${BASE[@]}" "${TP2[@]}" --checkpoint_dir="$WORK/a" --checkpoint_freq=1 \
  --metrics_file="$WORK/a.jsonl" \
  --save_full_state_dict="$WORK/a.safetensors" --export_hf="$WORK/a_hf"
if [ "$rc" -ne 0 ]; then not_ok "the uninterrupted run at tp 2 x dp_shard 2: exit $rc"; comment "$out"; exit 1; fi

# 2. killed and resumed across meshes
leg() { # leg KILL_AT MESH_ARGS...: resume (or start) in $WORK/b, killed after step KILL_AT (0: not killed)
  local kill=$1; shift
  local envs=()
  [ "$kill" -gt 0 ] && envs=(env FSDP_TEST_KILL_AT_STEP="$kill")
  run "${envs[@]}" mpirun -np 4 "$EXE" "${BASE[@]}" "$@" --checkpoint_dir="$WORK/b" --checkpoint_freq=1 \
    --metrics_file="$WORK/b.jsonl" --resume_from_checkpoint
  if [ "$kill" -gt 0 ] && [ ! -f "$WORK/b/step-$(printf %06d "$kill")/COMPLETE" ]; then
    not_ok "the leg killed after step $kill ($*) left no checkpoint of that step: exit $rc"; comment "$out"; exit 1
  fi
  if [ "$kill" -eq 0 ] && [ "$rc" -ne 0 ]; then not_ok "the last leg ($*): exit $rc"; comment "$out"; exit 1; fi
}
leg 2 "${TP2[@]}"
leg 3 "${TP2[@]}"
leg 4 "${TP4[@]}"
leg 5 "${DP4[@]}"
leg 0 "${TP2[@]}" --save_full_state_dict="$WORK/b.safetensors"
want=$(losses "$WORK/a.jsonl" 1 3)
got=$(losses "$WORK/b.jsonl" 1 3)
if [ "$(wc -l <<<"$want")" -eq 3 ] && [ "$got" = "$want" ]; then
  ok "killed at step 2, resumed on the same mesh (tp 2 x dp_shard 2): steps 1-3 log the uninterrupted losses' bits"
else
  not_ok "same-mesh resume: steps 1-3 $(tr '\n' ' ' <<<"$got")against $(tr '\n' ' ' <<<"$want")"
fi
if worst=$(rel_ok "$WORK/b.jsonl" "$WORK/a.jsonl" 4 6 1e-5) && [ "$(losses "$WORK/b.jsonl" 4 6 | wc -l)" -eq 3 ]; then
  ok "resumed at tp 4 (step 4), tp 1 x dp_shard 4 (5), tp 2 x dp_shard 2 (6): within 1e-5 of the uninterrupted \
losses (worst $worst)"
else
  not_ok "resumed across meshes: steps 4-6 differ from the uninterrupted run (worst $worst)"
  comment "$(losses "$WORK/b.jsonl" 1 6; losses "$WORK/a.jsonl" 1 6)"
fi
res=$(compare "$WORK/b.safetensors" "$WORK/a.safetensors")
if [[ "$res" =~ ^[0-9]+\ ([0-9.e+-]+)$ ]] && awk -v w="${BASH_REMATCH[1]}" 'BEGIN { exit !(w <= 1e-5) }'; then
  ok "the model after the resumes across meshes is the uninterrupted one within 1e-5 norm-wise ($res: tensors, worst)"
else
  not_ok "the model after the resumes across meshes: $res"
fi

# 3. the uninterrupted checkpoint of step 6 at tp 4, saved whole without a step
run mpirun -np 4 "$EXE" "${BASE[@]}" "${TP4[@]}" --checkpoint_dir="$WORK/a" --resume_from_checkpoint \
  --save_full_state_dict="$WORK/a_tp4.safetensors"
res=$(compare "$WORK/a_tp4.safetensors" "$WORK/a.safetensors")
if [ "$rc" -eq 0 ] && [[ "$res" =~ ^[1-9][0-9]*\ 0$ ]]; then
  ok "the tp 2 x dp_shard 2 checkpoint resumed at tp 4 and saved whole: the same bits ($res)"
else
  not_ok "the tp 2 checkpoint resumed at tp 4 and saved whole: exit $rc, $res"; comment "$out"
fi

# 4. the export equals the model trained without TP
run mpirun -np 4 "$EXE" "${BASE[@]}" "${DP4[@]}" --export_hf="$WORK/d_hf"
res=$(compare "$WORK/a_hf" "$WORK/d_hf")
same=$(compare "$WORK/a_hf" "$WORK/a.safetensors")
if [ "$rc" -eq 0 ] && [[ "$res" =~ ^[1-9][0-9]*\ ([0-9.e+-]+)$ ]] &&
   awk -v w="${BASH_REMATCH[1]}" 'BEGIN { exit !(w <= 1e-5) }' && [[ "$same" =~ ^[1-9][0-9]*\ 0$ ]]; then
  ok "--export_hf at tp 2 x dp_shard 2 = the model trained without TP within 1e-5 ($res); = its full state dict's bits"
else
  not_ok "--export_hf at tp 2: against no TP $res, against its full state dict $same (exit $rc)"; comment "$out"
fi

# 5. --init_from an HF directory into TP slices
run mpirun -np 4 "$EXE" "${BASE[@]}" "${TP4[@]}" --max_steps=1 --init_from="$WORK/a_hf" \
  --metrics_file="$WORK/i4.jsonl"
rc4=$rc out4=$out
run mpirun -np 4 "$EXE" "${BASE[@]}" "${DP4[@]}" --max_steps=1 --init_from="$WORK/a_hf" \
  --metrics_file="$WORK/i1.jsonl"
if [ "$rc4" -eq 0 ] && [ "$rc" -eq 0 ] && worst=$(rel_ok "$WORK/i4.jsonl" "$WORK/i1.jsonl" 1 1 1e-5) &&
   ! cmp -s <(losses "$WORK/i1.jsonl" 1 1) <(losses "$WORK/a.jsonl" 1 1); then
  ok "--init_from an HF directory at tp 4 = without TP: the first loss within 1e-5 (worst $worst)"
else
  not_ok "--init_from at tp 4 against no TP: exit $rc4/$rc, worst ${worst:-?}"; comment "$out4"; comment "$out"
fi
