#!/usr/bin/env bash
# tests/mpi/output_errors.sh: failed output writes from the outside (issue
# 38; [Note: failed output writes] in lua/fsdp/observe/outputs.lua), with
# recipes/llama2_7b.lua:
#
#   1. --metrics_file=/dev/full, one process, checkpoints in a healthy
#      directory: one warning line at step 1, within 1 s of the start;
#      every step trained; one line at the end; exit status 5; the last
#      checkpoint intact (fsdp.checkpointing.check).
#   2. 2 ranks, --metrics_file, --tensorboard_dir and --profile_dir on a
#      64 KiB tmpfs that fills mid-run, checkpoints elsewhere: one warning
#      per output and rank, every step trained, the end line naming each
#      lost output (both ranks' traces), exit 5; the JSONL holds whole
#      records of steps 1..k, the event file reads (CRCs) to its last whole
#      record, the last checkpoint intact.
#   3. The same with --on_output_error=stop: the run stops after the step
#      whose write failed, naming the output and the newest checkpoint,
#      exit 5; no checkpoint after that step, the newest intact.
#   4. Checkpoints on the filling disk too (a 1.2 MiB tmpfs): the save that
#      cannot be written is one line naming the step, why and the newest
#      checkpoint, exit 1 on both ranks; that checkpoint intact, the JSONL
#      whole records.
# The tmpfs cases need root (mount -t tmpfs); where mounting fails they are
# reported as skipped. Every mount is unmounted on the way out.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-output-errors.XXXXXX")
MOUNTS=()
cleanup() {
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

ARGS=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64
      --batch_size=2 --seq_len=16 --warmup_steps=2 --validation_freq=0)

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
skip() { echo "ok - $* # SKIP"; }
comment() { sed 's/^/#   /' <<<"$1"; }
now() { date +%s.%N; }

# tmpfs DIR SIZE: a fresh tmpfs of SIZE at DIR (false where it cannot be mounted).
tmpfs() {
  mkdir -p "$1" && mount -t tmpfs -o "size=$2" tmpfs "$1" 2>/dev/null || return 1
  MOUNTS+=("$1")
}

# intact DIR: the newest complete checkpoint of DIR, after it passed every check.
intact() {
  "$EXE" -e "local ck = require('fsdp.checkpointing'); local d = assert(ck.latest('$1'), 'no checkpoint')
             local index, why = ck.check(d); if not index then error(why, 0) end; print(d)" 2>&1
}

# whole_jsonl FILE: "N LAST" when every line of FILE is a JSON record and
# its training steps are 1..LAST, each once.
whole_jsonl() {
  "$EXE" - "$1" <<'LUA'
local cjson, n, last = require('cjson'), 0, 0
for line in io.lines(arg[1]) do
  local r = cjson.decode(line)
  if r.type == 'train' then
    n = n + 1
    assert(r.step == last + 1, 'step ' .. r.step .. ' after ' .. last)
    last = r.step
  end
end
print(n .. ' ' .. last)
LUA
}

# tb_last DIR: the step of the last event of DIR's event file, read with CRCs checked.
tb_last() {
  "$EXE" -e "local tb = require 'fsdp.observe.tensorboard'; local e = tb.read(tb.files('$1')[1]); print(e[#e].step)" 2>&1
}

# 1. /dev/full, one process. The warning comes at step 1's record, before
# step 2 is logged (its time since the start is reported, not bounded: on
# a loaded machine the model's build alone can take seconds).
CK=$WORK/ck1
start=$(now)
out=$(timeout -k 5 60 "$EXE" "${ARGS[@]}" --max_steps=20 --checkpoint_dir="$CK" --checkpoint_freq=10 \
  --metrics_file=/dev/full 2>&1 | while IFS= read -r l; do
    printf '%s %s\n' "$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')" "$l"; done
  exit "${PIPESTATUS[0]}")
rc=$?
warning=$(grep -m1 ' fsdp-lua: warning: ' <<<"$out")
took=${warning%% *}
if [ "$rc" -eq 5 ] && [ "$(grep -c 'fsdp-lua: ' <<<"$out")" -eq 2 ] &&
   grep -qF 'fsdp-lua: warning: --metrics_file: writing step 1: /dev/full: write failed after 0 of ' <<<"$warning" &&
   grep -qF 'No space left on device; nothing more is written there; the run goes on and will exit with status 5' <<<"$warning" &&
   grep -qF ' Batch 20 Loss: ' <<<"$out" &&
   grep -qF 'fsdp-lua: output lost: --metrics_file /dev/full from step 1 (first failure: /dev/full: write failed' <<<"$out" &&
   [ "$(grep -n -m1 'fsdp-lua: warning: ' <<<"$out" | cut -d: -f1)" -lt "$(grep -n -m1 ' Batch 2 Loss: ' <<<"$out" | cut -d: -f1)" ] &&
   [ "$(intact "$CK")" = "$CK/step-000020" ]; then
  ok "--metrics_file=/dev/full: warned at step 1 after $took s, trained 20 steps, exit 5, checkpoint of step 20 intact: ${warning#* }"
else
  not_ok "--metrics_file=/dev/full: exit $rc, warning at ${took:-?} s"
  comment "$(grep -v '^[0-9.]*   ' <<<"$out")"
fi

# 2. A 64 KiB tmpfs filling under 2 ranks.
if ! tmpfs "$WORK/small" 64k; then
  skip "2 ranks, outputs on a 64 KiB tmpfs that fills (mount -t tmpfs failed: not root?)"
  skip "2 ranks, --on_output_error=stop on a filling tmpfs"
  skip "2 ranks, checkpoints on the filling tmpfs too"
  exit 0
fi
S=$WORK/small
CK=$WORK/ck2
out=$(timeout -k 5 120 mpirun -np 2 "$EXE" "${ARGS[@]}" --max_steps=200 --checkpoint_dir="$CK" --checkpoint_freq=50 \
  --metrics_file="$S/m.jsonl" --tensorboard_dir="$S/tb" --profile_steps=150:151 --profile_dir="$S/profile" 2>&1)
rc=$?
read -r n last <<<"$(whole_jsonl "$S/m.jsonl")"
m_step=$(grep -o 'warning: --metrics_file: writing step [0-9]*' <<<"$out" | grep -o '[0-9]*$')
tb_step=$(grep -o 'warning: --tensorboard_dir: writing step [0-9]*' <<<"$out" | grep -o '[0-9]*$')
tb_end=$(tb_last "$S/tb")
lost="fsdp-lua: output lost: --metrics_file $S/m.jsonl from step $m_step, --tensorboard_dir $S/tb from step $tb_step, --profile_dir $S/profile/trace-rank0.json, --profile_dir $S/profile/trace-rank1.json (rank 1's) (first failure: "
if [ "$rc" -eq 5 ] && [ "$(grep -c 'fsdp-lua: warning: ' <<<"$out")" -eq 4 ] &&
   grep -qF '[rank 0] fsdp-lua: warning: --profile_dir: ' <<<"$out" &&
   grep -qF '[rank 1] fsdp-lua: warning: --profile_dir: ' <<<"$out" &&
   grep -qF "$lost" <<<"$out" && [ -n "$m_step" ] && [ "$last" = $((m_step - 1)) ] &&
   [ "$tb_end" = $((tb_step - 1)) ] && [ "$(intact "$CK")" = "$CK/step-000200" ]; then
  ok "2 ranks, outputs on a 64 KiB tmpfs that fills: 4 warnings, exit 5; the JSONL whole to step $last, the event file to step $tb_end, checkpoint of step 200 intact"
else
  not_ok "2 ranks, outputs on a 64 KiB tmpfs that fills: exit $rc, JSONL to step ${last:-?} (warned at ${m_step:-?}), events to ${tb_end:-?} (warned at ${tb_step:-?})"
  comment "$(grep -v '^\[rank 0\] \(  \|Batch\)' <<<"$out")"
fi

# 3. The same with --on_output_error=stop.
umount "$S" && mount -t tmpfs -o size=64k tmpfs "$S"
CK=$WORK/ck3
out=$(timeout -k 5 120 mpirun -np 2 "$EXE" "${ARGS[@]}" --max_steps=200 --checkpoint_dir="$CK" --checkpoint_freq=20 \
  --metrics_file="$S/m.jsonl" --tensorboard_dir="$S/tb" --on_output_error=stop 2>&1)
rc=$?
first=$(grep -o 'warning: --[a-z_]*: writing step [0-9]*' <<<"$out" | head -1)
step=${first##* }
newest=$(intact "$CK")
saved=$(ls "$CK" | grep -c '^step-')
if [ "$rc" -eq 5 ] && [ -n "$step" ] &&
   grep -qF "fsdp-lua: stopped after step $step: a write to an output failed (--on_output_error=stop): " <<<"$out" &&
   grep -qF "; the newest checkpoint is $newest" <<<"$out" &&
   [ "$newest" = "$CK/step-$(printf '%06d' $((step - step % 20)))" ] &&
   ! grep -qF "Batch $((step + 1)) Loss" <<<"$out"; then
  ok "--on_output_error=stop: stopped after step $step (the failed write's), exit 5, newest checkpoint $(basename "$newest") intact ($saved kept)"
else
  not_ok "--on_output_error=stop: exit $rc, first failure '${first}', newest checkpoint '$newest'"
  comment "$(grep -v '^\[rank 0\] \(  \|Batch\)' <<<"$out")"
fi

# 4. Checkpoints on the filling disk too.
if tmpfs "$WORK/mid" 1200k; then
  M=$WORK/mid
  out=$(timeout -k 5 120 mpirun -np 2 "$EXE" "${ARGS[@]}" --max_steps=3000 --checkpoint_dir="$M/ck" --checkpoint_freq=100 \
    --keep_checkpoints=2 --metrics_file="$M/m.jsonl" 2>&1)
  rc=$?
  line=$(grep -m1 'fsdp-lua: checkpoint: step' <<<"$out")
  failed_step=$(sed -n 's/.*fsdp-lua: checkpoint: step \([0-9]*\) not saved.*/\1/p' <<<"$line")
  newest=$(intact "$M/ck")
  whole=$(whole_jsonl "$M/m.jsonl" 2>&1)
  if [ "$rc" -eq 1 ] && [ -n "$failed_step" ] && grep -qF 'No space left on device; the newest checkpoint is ' <<<"$line" &&
     [ "$newest" = "$M/ck/step-$(printf '%06d' $((failed_step - 100)))" ] && grep -qF "$newest" <<<"$line" &&
     [ ! -f "$M/ck/step-$(printf '%06d' "$failed_step")/COMPLETE" ] && [[ "$whole" =~ ^[0-9]+\ [0-9]+$ ]] &&
     ! grep -q 'stack traceback' <<<"$out"; then
    ok "checkpoints on the full disk too: one line, exit 1, step $failed_step not saved, $(basename "$newest") intact, JSONL whole ($whole)"
  else
    not_ok "checkpoints on the full disk too: exit $rc, failed step '${failed_step}', newest '$newest', JSONL: $whole"
    comment "$(grep -v '^\[rank 0\] \(  \|Batch\)' <<<"$out")"
  fi
else
  skip "2 ranks, checkpoints on the filling tmpfs too (mount -t tmpfs failed)"
fi
