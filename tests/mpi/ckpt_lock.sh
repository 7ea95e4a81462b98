#!/usr/bin/env bash
# tests/mpi/ckpt_lock.sh: one job per checkpoint directory, from the
# outside (issue 38; [Note: one job per checkpoint directory] in
# lua/fsdp/checkpointing/lock.lua), with recipes/llama2_7b.lua:
#
#   1. A 2-rank job (the first) trains with checkpoints. Once it has saved
#      one it is paused (SIGSTOP: on this 2-core machine its ranks would
#      otherwise take the cores the second job is timed on; a paused
#      process holds its lock like a running one), and the same command is
#      started again, as one process and as 2 ranks: each is refused with
#      one line naming the first job's host and pid, exit status 4, the line
#      within 1 s of its start (for 2 ranks, beyond what mpirun takes to
#      start ranks that only start MPI: ~0.4 s here), and every file of the directory and the
#      shared metrics file is as it was (names, sizes, checksums). The
#      first job then goes on: every step logged once, exit 0, its newest
#      checkpoint intact (fsdp.checkpointing.check).
#   2. Two single-process jobs: the same.
#   3. The first job killed with kill -9 after a step, then the same
#      command: it takes the lock over (naming the killed pid) and resumes.
#   4. A requeue: SIGTERM to a running 2-rank job's mpirun (what Slurm
#      sends a job it requeues), then the same command at once: the lock
#      is free, the run resumes and finishes.
#   5. Ranks given different directories are refused naming both, exit 4,
#      without waiting in a collective.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-ckpt-lock.XXXXXX")
JOB=
cleanup() {
  [ -n "$JOB" ] && kill -CONT -- $(pgrep -P "$JOB") "$JOB" 2>/dev/null && kill -- "$JOB" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

ARGS=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64
      --batch_size=2 --seq_len=16 --warmup_steps=2 --validation_freq=0 --checkpoint_freq=10
      --keep_checkpoints=2 --resume_from_checkpoint)

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }
now() { date +%s.%N; }

# snapshot DIR FILE...: every file under DIR and each FILE, with its size
# and checksum, one per line.
snapshot() {
  find "$@" -type f -print0 | sort -z | xargs -0 md5sum | while read -r sum path; do
    echo "$path $(stat -c %s "$path") $sum"
  done
}

# refused LABEL HOLDER_PID LAUNCH COMMAND...: the command must exit 4 with
# one "fsdp-lua: --checkpoint_dir ... in use by another job" line naming
# the holder's host and pid, printed within 1 s of its start, not counting
# LAUNCH seconds (what mpirun itself takes to start ranks that do nothing,
# or what one process takes to check the same options).
refused() {
  local label=$1 pid=$2 launch=$3; shift 3
  local start out rc line took
  start=$(now)
  # each line with the seconds since the start at which it came
  out=$(timeout -k 5 60 "$@" 2>&1 | while IFS= read -r l; do
    printf '%s %s\n' "$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')" "$l"; done
    exit "${PIPESTATUS[0]}")
  rc=$?
  line=$(grep -m1 ' fsdp-lua: ' <<<"$out")
  took=${line%% *}
  if [ "$rc" -eq 4 ] && [ "$(grep -c ' fsdp-lua: ' <<<"$out")" -eq 1 ] &&
     grep -qF -- "fsdp-lua: --checkpoint_dir $WORK/" <<<"$line" &&
     grep -qF "is in use by another job (host $(hostname), pid $pid, since " <<<"$line" &&
     awk -v t="$took" -v l="$launch" 'BEGIN { exit !(t - l < 1.0) }'; then
    ok "$label: refused in $took s (launch $launch s), exit 4: ${line#* fsdp-lua: }"
  else
    not_ok "$label: exit $rc, the line at ${took:-?} s, launch $launch s (want exit 4 and one line naming pid $pid within 1 s)"
    comment "$out"
  fi
}

# steps_logged FILE: the training steps of a metrics file, one per line.
steps_logged() { grep -o '"step":[0-9]*,"step_time"' "$1" | grep -o '[0-9]*'; }

# intact DIR: the newest complete checkpoint of DIR passes every check.
intact() {
  "$EXE" -e "local ck = require('fsdp.checkpointing'); local d = assert(ck.latest('$1'), 'no checkpoint')
             local index, why = ck.check(d); if not index then error(why, 0) end; print(d)" 2>&1
}

# 1. A 2-rank job against the same command as one process and as 2 ranks.
CK=$WORK/ck1
mpirun -np 2 "$EXE" "${ARGS[@]}" --max_steps=200 --checkpoint_dir="$CK" --metrics_file="$WORK/m1.jsonl" \
  >"$WORK/first.log" 2>&1 &
JOB=$!
for _ in $(seq 600); do [ -f "$CK/step-000010/COMPLETE" ] && break; sleep 0.05; done
holder=$(sed -n 's/.*pid \([0-9]*\),.*/\1/p' "$CK/LOCK")
ranks=$(pgrep -P "$JOB" | tr '\n' ' ')
kill -STOP $ranks
before=$(snapshot "$CK" "$WORK/m1.jsonl")
if [ -f "$CK/step-000010/COMPLETE" ] && [ -n "$holder" ] && grep -q ', 2 ranks$' "$CK/LOCK"; then
  ok "a 2-rank job holds its --checkpoint_dir: $(cat "$CK/LOCK")"
else
  not_ok "a 2-rank job holds its --checkpoint_dir (LOCK: $(cat "$CK/LOCK" 2>/dev/null))"
  comment "$(cat "$WORK/first.log")"
fi
# mpirun's own start: 2 ranks that only start MPI and end
start=$(now)
mpirun -np 2 "$EXE" -e "require('fsdp').dist.init()" >/dev/null 2>&1
launch=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
# the recipe's own start: one process that checks the same options and
# ends (--validate_options; on a loaded machine that alone can take a
# second, on an idle one 0.3 s)
start=$(now)
"$EXE" "${ARGS[@]}" --max_steps=50 --validate_options >/dev/null 2>&1
solo=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
refused "the same command as one process while a 2-rank job holds the directory" "$holder" "$solo" \
  "$EXE" "${ARGS[@]}" --max_steps=50 --checkpoint_dir="$CK" --metrics_file="$WORK/m1.jsonl"
refused "the same command on 2 ranks while a 2-rank job holds the directory" "$holder" "$launch" \
  mpirun -np 2 "$EXE" "${ARGS[@]}" --max_steps=50 --checkpoint_dir="$CK" --metrics_file="$WORK/m1.jsonl"
after=$(snapshot "$CK" "$WORK/m1.jsonl")
if [ "$before" = "$after" ]; then
  ok "the refused jobs changed nothing: $(wc -l <<<"$after") files of the first job as they were"
else
  not_ok "the refused jobs changed the first job's files"
  comment "$(diff <(echo "$before") <(echo "$after"))"
fi
kill -CONT $ranks
wait "$JOB"
rc=$?
JOB=
check=$(intact "$CK")
if [ "$rc" -eq 0 ] && [ "$(steps_logged "$WORK/m1.jsonl" | tr '\n' ' ')" = "$(seq -s ' ' 1 200) " ] &&
   [ "$check" = "$CK/step-000200" ]; then
  ok "the first job finished: exit 0, steps 1..200 logged once, $check intact"
else
  not_ok "the first job finished: exit $rc, check: $check"
  comment "$(tail -5 "$WORK/first.log")"
fi

# 2. Two single-process jobs.
CK=$WORK/ck2
"$EXE" "${ARGS[@]}" --max_steps=100000 --checkpoint_dir="$CK" >"$WORK/single.log" 2>&1 &
JOB=$!
for _ in $(seq 600); do [ -f "$CK/step-000010/COMPLETE" ] && break; sleep 0.05; done
kill -STOP "$JOB"
start=$(now)
"$EXE" "${ARGS[@]}" --max_steps=50 --validate_options >/dev/null 2>&1
solo=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
refused "a second single-process job while a single-process job holds the directory" "$JOB" "$solo" \
  "$EXE" "${ARGS[@]}" --max_steps=50 --checkpoint_dir="$CK"
kill -CONT "$JOB"
kill "$JOB"
wait "$JOB" 2>/dev/null
JOB=

# 3. kill -9 after step 15, then the same command.
CK=$WORK/ck3
out=$(FSDP_TEST_KILL_AT_STEP=15 timeout -k 5 60 "$EXE" "${ARGS[@]}" --max_steps=30 --checkpoint_dir="$CK" 2>&1)
killed=$(sed -n 's/.*pid \([0-9]*\),.*/\1/p' "$CK/LOCK")
out=$(timeout -k 5 60 "$EXE" "${ARGS[@]}" --max_steps=30 --checkpoint_dir="$CK" 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && [ -n "$killed" ] &&
   grep -qF "checkpoint: took over $CK/LOCK from a job that ended without releasing it (host $(hostname), pid $killed," <<<"$out" &&
   grep -qF "checkpoint: resumed from $CK/step-000010 (step 10," <<<"$out" && [ "$(intact "$CK")" = "$CK/step-000030" ] &&
   [ ! -s "$CK/LOCK" ]; then
  ok "killed with kill -9, the same command takes over the lock of pid $killed and resumes; released at its end"
else
  not_ok "killed with kill -9, the same command (exit $rc, killed pid '${killed}')"
  comment "$out"
fi

# 4. A requeue: SIGTERM to mpirun mid-run, then the same command at once.
CK=$WORK/ck4
mpirun -np 2 "$EXE" "${ARGS[@]}" --max_steps=600 --checkpoint_dir="$CK" >"$WORK/requeued.log" 2>&1 &
JOB=$!
for _ in $(seq 600); do [ -f "$CK/step-000020/COMPLETE" ] && break; sleep 0.05; done
kill -TERM "$JOB"
wait "$JOB" 2>/dev/null
JOB=
out=$(timeout -k 5 60 mpirun -np 2 "$EXE" "${ARGS[@]}" --max_steps=600 --checkpoint_dir="$CK" 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && grep -qF "[rank 0] checkpoint: resumed from $CK/step-000" <<<"$out" &&
   [ "$(intact "$CK")" = "$CK/step-000600" ]; then
  ok "requeued (SIGTERM to mpirun, then the same command at once): the lock is free, the run resumes and finishes"
else
  not_ok "requeued (SIGTERM to mpirun, then the same command): exit $rc"
  comment "$out"
fi

# 5. Ranks given different directories.
start=$(now)
out=$(timeout -k 5 60 mpirun -np 1 "$EXE" "${ARGS[@]}" --max_steps=4 --checkpoint_dir="$WORK/a" \
  : -np 1 "$EXE" "${ARGS[@]}" --max_steps=4 --checkpoint_dir="$WORK/b" 2>&1)
rc=$?
took=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
if [ "$rc" -eq 4 ] && grep -qF "fsdp-lua: --checkpoint_dir: the ranks disagree on the checkpoint directory: checkpoint_dir (rank 0 = $WORK/a; rank 1 = $WORK/b)" <<<"$out" &&
   [ ! -e "$WORK/a/LOCK" ]; then
  ok "ranks given different directories: refused naming both, exit 4, in $took s, nothing locked"
else
  not_ok "ranks given different directories: exit $rc after $took s"
  comment "$out"
fi
