#!/usr/bin/env bash
# tests/mpi/ckpt_integrity.sh: damaged checkpoints on 2 ranks are refused
# by name and --resume_from_checkpoint falls back to the previous intact
# one, from the outside, as an operator would see it.
#
# An uninterrupted run of recipes/llama2_7b.lua saves steps 2, 4, 6, 8.
# Copies of its checkpoint directory then get one kind of damage each in
# step 8, and the same command is run again in each:
#   bitflip  one bit of rank 1's tensor data flipped (only rank 1 checks
#            that file: rank 0 must fall back with it, not hang)
#   swapped  the two rank files exchanged
#   stale    rank 1's file replaced by its file of step 6
#   foreign  rank 0's file replaced by rank 0's file of another run's step 8
# Each restart must name the file and the damage, fall back to step 6, and
# log for steps 7 and 8 exactly the uninterrupted run's loss, lr and grad
# norm. Then pruning among symbolic links and stray files (the end of
# this file). Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh numbers
# them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
MAX=8
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-ckpt-integrity.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

ARGS=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64
      --batch_size=2 --seq_len=16 --max_steps=$MAX --warmup_steps=2 --validation_freq=0
      --keep_checkpoints=0 --resume_from_checkpoint)

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

# run NAME FREQ [OPTION...]: the recipe on 2 ranks with checkpoint dir
# $WORK/NAME and metrics $WORK/NAME.jsonl (appended across restarts);
# output in NAME.log.
run() {
  local name=$1 freq=$2; shift 2
  timeout -k 5 60 mpirun -np 2 "$EXE" "${ARGS[@]}" --checkpoint_freq="$freq" --checkpoint_dir="$WORK/$name" \
    --metrics_file="$WORK/$name.jsonl" "$@" >>"$WORK/$name.log" 2>&1
}

# "step loss lr grad_norm" of train steps from FROM on, the last record of
# a step winning (a resumed run logs the steps after its checkpoint again).
steps_of() {
  "$EXE" - "$1" "$2" <<'LUA'
local cjson, last = require('cjson'), {}
for line in io.lines(arg[1]) do
  local r = cjson.decode(line)
  if r.type == 'train' and r.step >= tonumber(arg[2]) then
    last[r.step] = ('%d %.17g %.17g %.17g'):format(r.step, r.loss, r.lr, r.grad_norm or 0)
  end
end
for s = 1, table.maxn(last) do if last[s] then print(last[s]) end end
LUA
}

if run ref 2 && [ "$(steps_of "$WORK/ref.jsonl" 1 | wc -l)" -eq $MAX ] && run foreign-src $MAX; then
  ok "two uninterrupted 2-rank runs of $MAX steps with checkpoints"
else
  not_ok "uninterrupted 2-rank runs"
  comment "$(tail -20 "$WORK/ref.log" "$WORK/foreign-src.log" 2>&1)"
  exit 0
fi

S8=step-$(printf %06d $MAX)
R0=rank-00000-of-00002.safetensors
R1=rank-00001-of-00002.safetensors

# flip_bit FILE: flip the lowest bit of the byte 100 bytes before the end
# (tensor data: the last tensor is far longer than that).
flip_bit() {
  local size pos byte
  size=$(stat -c %s "$1")
  pos=$((size - 100))
  byte=$(od -An -tu1 -j "$pos" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$1" bs=1 seek="$pos" conv=notrunc status=none
}

# check NAME FILE WHAT REASON: NAME's restart refused FILE of step 8 for
# REASON (a grep -E pattern; WHAT says it in words), fell back to step 6,
# and logged the reference's steps 7..MAX.
check() {
  local name=$1 file=$2 what=$3 reason=$4 log=$WORK/$1.log dir=$WORK/$1
  if grep -qE "checkpoint: refusing $dir/$S8: $dir/$S8/$file:? $reason" "$log" &&
     grep -q "checkpoint: falling back to $dir/step-000006, the newest intact checkpoint" "$log" &&
     grep -q "checkpoint: resumed from $dir/step-000006 (step 6," "$log"; then
    ok "$name: the restart refuses $file of step $MAX ($what) and falls back to step 6"
  else
    not_ok "$name: the restart did not refuse $file of step $MAX and fall back to step 6"
    comment "$(grep -E 'checkpoint|rank|error' "$log" | head -20)"
  fi
  if [ "$(steps_of "$WORK/ref.jsonl" 7)" = "$(steps_of "$WORK/$name.jsonl" 7)" ]; then
    ok "$name: steps 7..$MAX log the uninterrupted run's loss, lr and grad norm exactly"
  else
    not_ok "$name: steps after the fallback differ from the uninterrupted run"
    comment "$(diff <(steps_of "$WORK/ref.jsonl" 7) <(steps_of "$WORK/$name.jsonl" 7))"
  fi
}

for name in bitflip swapped stale foreign; do cp -r "$WORK/ref" "$WORK/$name"; done
flip_bit "$WORK/bitflip/$S8/$R1"
mv "$WORK/swapped/$S8/$R0" "$WORK/swapped/x" && mv "$WORK/swapped/$S8/$R1" "$WORK/swapped/$S8/$R0" &&
  mv "$WORK/swapped/x" "$WORK/swapped/$S8/$R1"
cp "$WORK/stale/step-000006/$R1" "$WORK/stale/$S8/$R1"
cp "$WORK/foreign-src/$S8/$R0" "$WORK/foreign/$S8/$R0"

run bitflip 2
check bitflip $R1 "damaged data" "the tensor data is damaged: it hashes to xxh3-64:[0-9a-f]+, the file records xxh3-64:[0-9a-f]+"
run swapped 2
check swapped $R0 "another rank's file" "holds rank 1 of 2's data, not rank 0 of 2's \(files swapped or renamed\)"
run stale 2
check stale $R1 "stale" "is from step 6, not step $MAX \(a stale file\)"
run foreign 2
check foreign $R0 "another run's file" "is from another run \([0-9a-f]+; this checkpoint is run [0-9a-f]+\)"

# Pruning next to symbolic links and stray files: links inside a step
# directory (named like its files and not) and as step directories point
# outside; a restart that saves steps 10 and 12 with --keep_checkpoints=2
# prunes steps 2..8 around them, deletes nothing outside, and every save
# succeeds.
OUT=$WORK/outside
mkdir -p "$OUT/sub" && for f in "$R0" index.json COMPLETE sub/victim; do echo keep >"$OUT/$f"; done
cp -r "$WORK/ref" "$WORK/links"
ln -s "$OUT/$R0" "$WORK/links/step-000002/$R0.tmp.99"
ln -s "$OUT/sub" "$WORK/links/step-000004/sub"
ln -s "$OUT" "$WORK/links/step-000003"
ln -s "$OUT/sub" "$WORK/links/step-000005"
echo mine >"$WORK/links/step-000006/notes.txt"
run links 2 --max_steps=12 --keep_checkpoints=2
rc=$?
kept=$(for d in "$WORK/links"/step-*; do [ -f "$d/COMPLETE" ] && [ ! -L "$d" ] && basename "$d"; done | tr '\n' ' ')
survived=$(cat "$OUT/$R0" "$OUT/index.json" "$OUT/COMPLETE" "$OUT/sub/victim" 2>/dev/null | tr -d '\n')
if [ $rc -eq 0 ] && [ "$kept" = "step-000010 step-000012 " ] && [ "$survived" = keepkeepkeepkeep ] &&
   [ -L "$WORK/links/step-000003" ] && [ -f "$WORK/links/step-000006/notes.txt" ]; then
  ok "pruning around links and stray files deletes nothing outside and every save succeeds (kept: $kept)"
else
  not_ok "pruning around links: exit $rc, kept '$kept', outside files '$survived'"
  comment "$(grep -E 'checkpoint|rank|error' "$WORK/links.log" | tail -20)"
fi
