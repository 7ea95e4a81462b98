#!/usr/bin/env bash
# tests/mpi/stream_resume.sh [TOKENIZER]: recipes/llama2_7b.lua streaming a
# raw C4-like corpus (generated: five .json.gz shards of {"text",
# "timestamp", "url"} lines, so one rank owns three files and the other
# two) on 2 ranks, tokenized by TOKENIZER (default byte; a tokenizer.json
# or a SentencePiece .model) in 2 loader threads.
#
#   1. An uninterrupted run (the reference): 12 steps, validation on the
#      held-out documents every 4 steps; the validation loss falls.
#   2. The same run killed with SIGKILL after step 7
#      (FSDP_TEST_KILL_AT_STEP), then the same command again: it resumes
#      from the checkpoint of step 6, whose data state is each rank's file,
#      document and consumed tokens, and logs exactly the reference's loss,
#      lr and gradient norm for steps 7..12.
#   3. A shard removed, the same command again: both ranks refuse the
#      resume ([Note: the fingerprint of a data position]) and the job
#      ends at once, exit 1, with one line from rank 0 naming the shard
#      (rank 1's position holds no list; the ranks agree on rank 0's
#      message); with --data_changed=continue it says so and goes on.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap).
# Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
TOKENIZER=${1:-byte}
MAX=12 FREQ=3 K=7 R=6
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-stream-resume.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$EXE" - "$WORK/c4/en" <<'LUA' || { echo "not ok - generating the corpus"; exit 0; }
package.path = './?.lua;' .. package.path
require('tests.data.corpus').write_c4(arg[1], { shards = 5, documents = 120 })
LUA

ARGS=(recipes/llama2_7b.lua "--data=$WORK/c4/en/c4-train.*-of-00005.json.gz" "--tokenizer=$TOKENIZER"
      --loader_threads=2 --val_fraction=0.05 --num_layers=2 --hidden_width=48 --num_heads=4
      --batch_size=2 --seq_len=48 --max_steps=$MAX --warmup_steps=2 --lr=3e-3 --validation_freq=4
      --val_batches=2 --checkpoint_freq=$FREQ --resume_from_checkpoint)

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

EXTRA=() # more options for run
run() {
  local name=$1; shift
  env "$@" timeout -k 5 120 mpirun -np 2 "$EXE" "${ARGS[@]}" "${EXTRA[@]}" --checkpoint_dir="$WORK/$name" \
    --metrics_file="$WORK/$name.jsonl" >>"$WORK/$name.log" 2>&1
}

# "step loss lr grad_norm" per train step (the last record of a step wins),
# or "val step loss" with `val`.
records() {
  "$EXE" - "$1" "${2:-train}" <<'LUA'
local cjson, last = require('cjson'), {}
for line in io.lines(arg[1]) do
  local r = cjson.decode(line)
  if r.type == arg[2] and arg[2] == 'train' then
    last[r.step] = ('%d %.17g %.17g %.17g'):format(r.step, r.loss, r.lr, r.grad_norm or 0)
  elseif r.type == 'val' and arg[2] == 'val' then
    last[r.step] = ('%d %.6f'):format(r.step, r.loss)
  end
end
for s = 1, table.maxn(last) do if last[s] then print(last[s]) end end
LUA
}

run ref
if [ "$(records "$WORK/ref.jsonl" | wc -l)" -eq $MAX ] && grep -q 'streamed, validation on' "$WORK/ref.log"; then
  ok "2 ranks stream the .json.gz shards through $TOKENIZER: $MAX steps"
else
  not_ok "the uninterrupted streaming run"
  comment "$(tail -20 "$WORK/ref.log")"
fi
val=$(records "$WORK/ref.jsonl" val)
first=$(head -1 <<<"$val" | cut -d' ' -f2) last=$(tail -1 <<<"$val" | cut -d' ' -f2)
if [ "$(wc -l <<<"$val")" -eq 3 ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }'; then
  ok "validation loss on the held-out documents falls: $first -> $last"
else
  not_ok "validation loss does not fall: $(tr '\n' ';' <<<"$val")"
fi

run kill FSDP_TEST_KILL_AT_STEP=$K
rc=$?
if [ $rc -ne 0 ] && grep -q "FSDP_TEST_KILL_AT_STEP=$K" "$WORK/kill.log"; then
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
  not_ok "restart after the kill (exit $rc) did not resume from step $R"
  comment "$(tail -20 "$WORK/kill.log")"
fi
want=$(records "$WORK/ref.jsonl" | awk -v f=$((R + 1)) '$1 >= f')
got=$(records "$WORK/kill.jsonl" | awk -v f=$((R + 1)) '$1 >= f')
if [ -n "$want" ] && [ "$want" = "$got" ]; then
  ok "the resumed streaming run logs the uninterrupted run's loss, lr and grad norm for steps $((R + 1))..$MAX"
else
  not_ok "steps after the resume differ from the uninterrupted run"
  comment "$(diff <(echo "$want") <(echo "$got"))"
fi

rm "$WORK/c4/en/c4-train.00004-of-00005.json.gz"
: >"$WORK/kill.log"
start=$(date +%s)
run kill
rc=$?
lines=$(grep '^fsdp-lua' "$WORK/kill.log")
want="fsdp-lua: $WORK/c4/en/c4-train.00004-of-00005.json.gz: removed since the data position was saved (5 files then, 4 now); resume refused (--data_changed=continue goes on with the data as it is)"
if [ $rc -eq 1 ] && [ "$lines" = "$want" ] && [ $(($(date +%s) - start)) -lt 60 ]; then
  ok "a shard removed since the checkpoint: the resume stops in one line naming it (exit 1)"
else
  not_ok "resume with a shard removed: exit $rc"
  comment "$(tail -20 "$WORK/kill.log")"
fi
: >"$WORK/kill.log"
EXTRA=(--data_changed=continue)
run kill
rc=$?
if [ $rc -eq 0 ] && grep -q "^\[rank 0\] data: $WORK/c4/en/c4-train.00004-of-00005.json.gz: removed since the data position was saved (5 files then, 4 now); going on with it as it is" "$WORK/kill.log"; then
  ok "with --data_changed=continue the same resume says so and goes on"
else
  not_ok "--data_changed=continue: exit $rc"
  comment "$(tail -20 "$WORK/kill.log")"
fi
