#!/usr/bin/env bash
# tests/mpi/ckpt_recipe.sh: crash and resume of recipes/llama2_7b.lua on 2
# ranks, from the outside, as Slurm would see it: the same command is run
# again after the job died.
#
#   1. An uninterrupted run (the reference), logging every step's numbers.
#   2. The run killed with SIGKILL right after a random step K in
#      [2, MAX-1] (FSDP_TEST_KILL_AT_STEP), then the same command again: it
#      resumes from the newest complete checkpoint (K rounded down to the
#      checkpoint frequency) and logs exactly the reference's loss, lr and
#      gradient norm for every later step; the last K checkpoints are kept.
#   3. The run killed in the middle of the save of step 6, after every
#      rank's file and the index are written, before COMPLETE
#      (FSDP_TEST_KILL_IN_SAVE): the restart skips step 6, loads step 4,
#      and again matches the reference.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
MAX=10 FREQ=2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-ckpt-recipe.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

ARGS=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64
      --batch_size=2 --seq_len=16 --max_steps=$MAX --warmup_steps=2 --validation_freq=0
      --checkpoint_freq=$FREQ --keep_checkpoints=2 --resume_from_checkpoint)

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

# run NAME [ENV=...]: the recipe on 2 ranks with its own checkpoint dir and
# metrics file (appended to across restarts); output in $WORK/NAME.log.
run() {
  local name=$1; shift
  env "$@" timeout -k 5 60 mpirun -np 2 "$EXE" "${ARGS[@]}" --checkpoint_dir="$WORK/$name" \
    --metrics_file="$WORK/$name.jsonl" >>"$WORK/$name.log" 2>&1
}

# "step loss lr grad_norm" for every train step, the last record of a step
# winning (a resumed run logs the steps after its checkpoint again).
steps_of() {
  "$EXE" - "$1" <<'LUA'
local cjson, last = require('cjson'), {}
for line in io.lines(arg[1]) do
  local r = cjson.decode(line)
  if r.type == 'train' then
    last[r.step] = ('%d %.17g %.17g %.17g'):format(r.step, r.loss, r.lr, r.grad_norm or 0)
  end
end
for s = 1, table.maxn(last) do if last[s] then print(last[s]) end end
LUA
}

# compare NAME FROM: NAME's steps FROM..MAX against the reference's.
compare() {
  local want got
  want=$(steps_of "$WORK/ref.jsonl" | awk -v f="$2" '$1 >= f')
  got=$(steps_of "$WORK/$1.jsonl" | awk -v f="$2" '$1 >= f')
  [ -n "$want" ] && [ "$want" = "$got" ]
}

complete_steps() {
  for d in "$WORK/$1"/step-*; do [ -f "$d/COMPLETE" ] && basename "$d"; done | tr '\n' ' '
}

run ref
if [ "$(steps_of "$WORK/ref.jsonl" | wc -l)" -eq $MAX ]; then
  ok "uninterrupted 2-rank run: $MAX steps, checkpoints every $FREQ"
else
  not_ok "uninterrupted 2-rank run"
  comment "$(tail -20 "$WORK/ref.log")"
fi

# 2. killed after a random step, restarted with the same command.
K=$((RANDOM % (MAX - 2) + 2))
R=$((K - K % FREQ))
echo "# killing rank 0 with SIGKILL after step $K (newest complete checkpoint: step $R)"
run kill FSDP_TEST_KILL_AT_STEP=$K
rc=$?
if [ $rc -ne 0 ] && grep -q "test hook: kill -9 (FSDP_TEST_KILL_AT_STEP=$K)" "$WORK/kill.log"; then
  ok "the run dies at step $K (exit $rc)"
else
  not_ok "the run killed at step $K exited $rc"
  comment "$(tail -20 "$WORK/kill.log")"
fi
: >"$WORK/kill.log"
run kill
rc=$?
if [ $rc -eq 0 ] && grep -q "checkpoint: resumed from $WORK/kill/step-$(printf %06d $R) (step $R," "$WORK/kill.log"; then
  ok "the same command resumes from step $R"
else
  not_ok "restart after the kill at step $K (exit $rc) did not resume from step $R"
  comment "$(grep -E 'checkpoint|rank' "$WORK/kill.log" | head -20)"
fi
if compare kill $((R + 1)); then
  ok "after resuming, steps $((R + 1))..$MAX log the uninterrupted run's loss, lr and grad norm exactly"
else
  not_ok "steps after the resume differ from the uninterrupted run"
  comment "$(diff <(steps_of "$WORK/ref.jsonl") <(steps_of "$WORK/kill.jsonl"))"
fi
kept=$(complete_steps kill)
if [ "$kept" = "step-$(printf %06d $((MAX - FREQ))) step-$(printf %06d $MAX) " ]; then
  ok "--keep_checkpoints=2 keeps the newest two: $kept"
else
  not_ok "--keep_checkpoints=2 left: $kept"
fi

# 3. killed inside the save of step 6, before COMPLETE.
run torn FSDP_TEST_KILL_IN_SAVE=6
rc=$?
if [ $rc -ne 0 ] && [ -f "$WORK/torn/step-000006/index.json" ] && [ ! -f "$WORK/torn/step-000006/COMPLETE" ]; then
  ok "killed inside the save of step 6: index written, no COMPLETE (exit $rc)"
else
  not_ok "the kill inside the save of step 6 (exit $rc) left: $(ls "$WORK/torn/step-000006" 2>&1 | tr '\n' ' ')"
  comment "$(tail -20 "$WORK/torn.log")"
fi
: >"$WORK/torn.log"
run torn
rc=$?
if [ $rc -eq 0 ] && grep -q "checkpoint: skipping $WORK/torn/step-000006: no COMPLETE" "$WORK/torn.log" &&
   grep -q "checkpoint: resumed from $WORK/torn/step-000004 (step 4," "$WORK/torn.log"; then
  ok "the restart skips the torn step 6 and loads step 4"
else
  not_ok "restart after the torn save (exit $rc)"
  comment "$(grep -E 'checkpoint|rank' "$WORK/torn.log" | head -20)"
fi
if compare torn 5; then
  ok "after the torn save, steps 5..$MAX equal the uninterrupted run's"
else
  not_ok "steps after the torn save differ"
  comment "$(diff <(steps_of "$WORK/ref.jsonl") <(steps_of "$WORK/torn.jsonl"))"
fi
