#!/usr/bin/env bash
# tests/mpi/observe.sh: what a 2-rank run of recipes/llama2_7b.lua shows,
# from the outside (issue 20): --metrics_file, --tensorboard_dir and --plot
# across a kill and a resume.
#
#   1. The run killed with SIGKILL after step 8 (FSDP_TEST_KILL_AT_STEP;
#      checkpoints every 3 steps), then the same command again: it resumes
#      at step 6.
#   2. The resumed run's log: every line starts with "[rank r] ", the
#      configuration is printed once, the step lines average their interval
#      (--log_every=4: "Batch 8" is the mean of steps 7 and 8 of the JSONL).
#   3. The JSONL file has every training step 1..12 and every validation
#      once, its time never goes back; the TensorBoard event files (read
#      by fsdp.tensorboard, CRCs checked) have every step of train/loss
#      once, val/loss at 3, 6, 9, 12, the configuration as text.
#   4. --plot drew a 1200x800 PNG and an SVG beside the JSONL file.
#   5. --profile_steps=3:4 (traced by the killed run): one Chrome trace
#      per rank, each on its rank's track, all-gathers and reduce-scatters
#      with their bytes; tools/trace_summary.lua --merge puts both ranks in
#      one trace and reports each rank's exposed communication.
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh's run_tap
# numbers them). Needs the MPI environment run.sh exports.
set -uo pipefail
cd "$(dirname "$0")/../.."

EXE=${FSDP_LUA:-build/bin/fsdp-lua}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-observe.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

ARGS=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64
      --batch_size=2 --seq_len=16 --max_steps=12 --warmup_steps=2 --validation_freq=3 --val_batches=1
      --checkpoint_dir="$WORK/ckpt" --checkpoint_freq=3 --resume_from_checkpoint --log_every=4
      --metrics_file="$WORK/m.jsonl" --tensorboard_dir="$WORK/tb" --plot
      --profile_steps=3:4 --profile_dir="$WORK/profile")

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; }
comment() { sed 's/^/#   /' <<<"$1"; }

FSDP_TEST_KILL_AT_STEP=8 timeout -k 5 60 mpirun -np 2 "$EXE" "${ARGS[@]}" >"$WORK/killed.log" 2>&1
killed=$?
out=$(timeout -k 5 60 mpirun -np 2 "$EXE" "${ARGS[@]}" 2>&1)
rc=$?
if [ "$killed" -ne 0 ] && grep -qF 'Batch 8 Loss' "$WORK/killed.log" && [ "$rc" -eq 0 ] &&
   grep -qF 'checkpoint: resumed from' <<<"$out" && grep -qF '(step 6,' <<<"$out"; then
  ok "killed after step 8, restarted: resumes at step 6"
else
  not_ok "killed after step 8, restarted: resumes at step 6 (exit $killed, then $rc)"
  comment "$(cat "$WORK/killed.log")"; comment "$out"
fi

unprefixed=$(grep -v '^\[rank [01]\] ' <<<"$out")
configs=$(grep -c '^\[rank 0\] config:$' <<<"$out")
if [ -z "$unprefixed" ] && [ "$configs" -eq 1 ]; then
  ok "every line of the 2-rank run starts with [rank r], the configuration printed once"
else
  not_ok "every line of the 2-rank run starts with [rank r] ($configs configurations)"
  comment "$unprefixed"
fi

# The checks of the files, in Lua: prints "ok - ..." / "not ok - ..." lines.
"$EXE" - "$WORK" "$out" <<'LUA'
local cjson = require 'cjson'
local tb = require 'fsdp.observe.tensorboard'
local plot = require 'fsdp.observe.plot'
local dir, out = arg[1], arg[2]
local function check(what, cond, detail)
  print((cond and 'ok - ' or 'not ok - ') .. what)
  if not cond and detail then print('#   ' .. tostring(detail):gsub('\n', '\n#   ')) end
end
local train, val, times, back, recs = {}, {}, {}, false, {}
for line in io.lines(dir .. '/m.jsonl') do
  local r = cjson.decode(line)
  local seen = r.type == 'train' and train or val
  seen[#seen + 1] = r.step
  if #times > 0 and r.time < times[#times] then back = true end
  times[#times + 1] = r.time
  if r.type == 'train' then recs[r.step] = r end
end
check('the JSONL has steps 1..12 and validations 3, 6, 9, 12 once each, its time never going back',
  table.concat(train, ',') == '1,2,3,4,5,6,7,8,9,10,11,12' and table.concat(val, ',') == '3,6,9,12' and not back,
  table.concat(train, ',') .. ' / ' .. table.concat(val, ',') .. ' / ' .. table.concat(times, ','))
local logged = tonumber(out:match('Batch 8 Loss: ([%d.]+)'))
local mean = recs[7] and recs[8] and (recs[7].loss + recs[8].loss) / 2
check('the resumed run\'s line at step 8 is the mean loss of steps 7 and 8',
  logged and mean and math.abs(logged - mean) < 6e-5, ('%s vs %s'):format(tostring(logged), tostring(mean)))
local steps, vsteps, config = {}, {}, 0
for _, path in ipairs(tb.files(dir .. '/tb')) do
  for _, e in ipairs(tb.read(path)) do
    for _, v in ipairs(e.values) do
      if v.tag == 'train/loss' then steps[#steps + 1] = e.step end
      if v.tag == 'val/loss' then vsteps[#vsteps + 1] = e.step end
      if v.tag == 'config' and v.text:find('| tensorboard_dir | ' .. dir .. '/tb |', 1, true) then config = config + 1 end
    end
  end
end
check('TensorBoard: train/loss at steps 1..12 and val/loss at 3, 6, 9, 12 once each, the configuration as text',
  table.concat(steps, ',') == '1,2,3,4,5,6,7,8,9,10,11,12' and table.concat(vsteps, ',') == '3,6,9,12' and config >= 1,
  table.concat(steps, ',') .. ' / ' .. table.concat(vsteps, ',') .. ' / configs ' .. config)
local w, h = plot.png_size(dir .. '/m.png')
local svg = io.open(dir .. '/m.svg') and io.open(dir .. '/m.svg'):read('*a') or ''
check('--plot drew m.png (1200x800) and m.svg', w == 1200 and h == 800 and svg:find('<svg', 1, true) ~= nil,
  ('%s x %s'):format(tostring(w), tostring(h)))
LUA

summary=$("$EXE" tools/trace_summary.lua "$WORK"/profile/trace-rank*.json --top=5 --merge="$WORK/profile/all.json" 2>&1)
if [ $? -eq 0 ] && grep -q '^rank 0: 2 steps traced' <<<"$summary" && grep -q '^rank 1: 2 steps traced' <<<"$summary" &&
   [ "$(grep -c 'exposed communication' <<<"$summary")" -eq 2 ]; then
  ok "tools/trace_summary.lua reads both ranks' traces and merges them"
else
  not_ok "tools/trace_summary.lua reads both ranks' traces and merges them"
  comment "$summary"
fi
"$EXE" - "$WORK/profile/all.json" <<'LUA'
local cjson = require 'cjson'
local f = assert(io.open(arg[1]))
local t = cjson.decode(f:read('*a'))
f:close()
local tracks, gathered, reduced = {}, {}, {}
for _, e in ipairs(t.traceEvents) do
  local bytes = e.args and e.args.bytes or 0
  if e.ph == 'M' and e.name == 'process_name' then tracks[e.pid] = e.args.name end
  if e.ph == 'X' and e.name:match('^all%-gather ') and bytes > 0 then gathered[e.pid] = true end
  if e.ph == 'X' and e.name:match('^reduce%-scatter ') and bytes > 0 then reduced[e.pid] = true end
end
local ok = tracks[0] == 'rank 0' and tracks[1] == 'rank 1' and gathered[0] and gathered[1] and reduced[0] and reduced[1]
print((ok and 'ok' or 'not ok') .. ' - the merged trace: a track per rank, all-gathers and reduce-scatters with bytes on both')
LUA
