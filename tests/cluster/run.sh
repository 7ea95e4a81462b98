#!/usr/bin/env bash
# tests/cluster/run.sh: the `cluster` suite of tests/run.sh, as TAP. On a
# Slurm cluster in a box (tests/cluster/cluster.sh: 3 nodes, each its own
# network, hostname and /tmp) it runs recipes/llama2_7b.sbatch as users do:
#
#   1. the box comes up (every node idle in sinfo);
#   2. sbatch on 2 nodes x 2 ranks, HYBRID_SHARD with Slurm's nodes as the
#      shard groups: the job COMPLETED, every rank saw 2 nodes, its log and
#      checkpoints are in the job's directory, and its losses equal one
#      process training the same global batch (f32, within 1e-4);
#   3. the same job again with the link of its second node cut mid-run
#      (`ip link set ... down` on the bridge): every rank ends within the
#      collective timeout, the survivors naming the all-reduce and the rank
#      they lost; Slurm marks the node DOWN, requeues the job onto the other
#      two nodes, and it resumes from the newest complete checkpoint and
#      logs the uninterrupted job's losses exactly for every later step;
#   4. teardown leaves no daemon, namespace or mount behind.
# The box is torn down on every exit, also when a step fails or the suite
# is killed (a trap, and a keeper process for what a trap cannot catch).
#
#   tests/cluster/run.sh                 the suite
#   KEEP=1 tests/cluster/run.sh          leave the box's directory (logs)
#
# Skipped (one "ok ... # SKIP" line) where it cannot run: not root, no
# network namespaces, slurm-wlm or munge not installed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
EXE=${FSDP_LUA:-$ROOT/build/bin/fsdp-lua}
BOX=$ROOT/tests/cluster/cluster.sh

skip() { echo "ok 1 - cluster suite # SKIP $*"; echo "1..1"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
for c in slurmctld slurmd munged sbatch ip unshare nsenter; do
  command -v "$c" >/dev/null || skip "$c not found (./build.sh installs slurm-wlm and munge)"
done
probe=fsdpc-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then skip "cannot create network namespaces (needs CAP_SYS_ADMIN)"; fi
ip netns del "$probe"
if [ ! -x "$EXE" ]; then
  echo "not ok 1 - $EXE is not built (./build.sh)"
  exit 1
fi

n=0 failed=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $*"; }
# A job's output without the per-rank option dumps, its last 60 lines.
comment() { grep -vE '^(  |config:$)' <<<"$1" | tail -n 60 | sed 's/^/#   /'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The box's directory is not under /tmp: every node has its own /tmp.
DIR=$(mktemp -d /var/tmp/fsdp-cluster.XXXXXX)
box() { "$BOX" run "$DIR" "$@"; }
teardown() {
  "$BOX" down "$DIR" >/dev/null 2>&1
  [ "${KEEP:-0}" = 1 ] && echo "# kept $DIR" || rm -rf "$DIR"
}
trap teardown EXIT
trap 'exit 130' INT TERM
# The trap is not enough: SIGKILL skips it, and so did a SIGTERM that came
# while this shell waited in a command substitution (wait_job): bash died
# at once with the box up in 3 of 5 tries. So a keeper, deaf to those
# signals and to the suite's pipes, tears the box down once this shell is
# gone, however it went (after the trap's teardown it finds nothing).
keeper() {
  trap '' INT TERM HUP
  while kill -0 "$1" 2>/dev/null; do sleep 1; done
  teardown
}
keeper $$ </dev/null >/dev/null 2>&1 &

# What every rank needs: Open MPI as root (TOOLCHAIN), one thread per rank
# (4 ranks share 2 cores), the executable's checkout, and a collective
# timeout short enough to end the ranks before Slurm marks the node DOWN
# (SlurmdTimeout=6 in cluster.sh), so their own message is seen.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export FSDP_HOME=$ROOT FSDP_DEBUG=INFO
export FSDP_COLLECTIVE_TIMEOUT=4
export TMPDIR=/var/tmp

# 1. Up.
start=$(now)
out=$("$BOX" up "$DIR" 3 2>&1)
rc=$?
took_up=$(since "$start")
if [ "$rc" -eq 0 ] && [ "$(box sinfo -h -N -t idle -o %N | sort -u | tr '\n' ' ')" = "n1 n2 n3 " ]; then
  ok "cluster in a box: slurmctld and 3 nodes idle in sinfo after $took_up s"
else
  not_ok "cluster in a box did not come up (status $rc)"
  comment "$out"
  echo "1..$n"
  exit 1
fi

# The recipe reduced to seconds through its arguments; sbatch's options
# override the script's #SBATCH lines (no GPUs here, 2 ranks per node).
STEPS=60 FREQ=4 CUT=8
RECIPE=(--data= --dtype=f32 --num_layers=2 --hidden_width=64 --num_heads=4 --vocab_size=128
        --seq_len=32 --max_steps=$STEPS --warmup_steps=4 --log_every=5 --validation_freq=0 --peak_tflops=0)
SBATCH=(--parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=10)

# submit JOBDIR: the sbatch from JOBDIR (the job's directory); prints the id.
submit() {
  mkdir -p "$1/logs"
  (cd "$1" && box sbatch "${SBATCH[@]}" "$ROOT/recipes/llama2_7b.sbatch" "${RECIPE[@]}" --batch_size=2 \
    --sharding_strategy=HYBRID_SHARD --checkpoint_freq=$FREQ --keep_checkpoints=2)
}

field() { box scontrol show job "$1" | grep -oE "(^| )$2=[^ ]*" | head -1 | cut -d= -f2; }

# wait_job ID JOBDIR: until the job ends (a state other than pending,
# running, completing, requeued). Progress bounds it: the job's state, the
# nodes' states or the job's files changing; 120 s without any is a hang.
# (A requeued job waits for Slurm to mark the silent node DOWN, which
# takes SlurmdTimeout plus its ping and message timeouts: 20-40 s here,
# and then for its BeginTime: Slurm may hold a requeued job back for a
# while, Reason=BeginTime, which is a wait with an end, not a hang.)
wait_job() {
  local id=$1 jobdir=$2 state reason last="" changed=$SECONDS
  while :; do
    # The box torn down under it (the suite was killed): nothing to wait for.
    [ -d "$DIR" ] || { echo GONE; return 1; }
    reason=$(field "$id" Reason)
    state="$(field "$id" JobState) $reason $(field "$id" Restarts) $(cat "$jobdir"/logs/* 2>/dev/null | wc -c)"
    state+=" $(box sinfo -h -N -o %N=%T | tr '\n' ' ')"
    case "${state%% *}" in
      PENDING | RUNNING | COMPLETING | CONFIGURING | REQUEUED | REQUEUE_FED | REQUEUE_HOLD | "") ;;
      *) echo "${state%% *}"; return 0 ;;
    esac
    if [ "$state" != "$last" ] || [ "$reason" = BeginTime ]; then last=$state changed=$SECONDS; fi
    if ((SECONDS - changed >= 120)); then echo "HUNG(${state// /,})"; return 1; fi
    sleep 0.5
  done
}

# "step loss" per train step of a metrics file, the last record of a step
# winning (a resumed job logs the steps after its checkpoint again).
losses() {
  "$EXE" - "$1" <<'LUA'
local cjson, last = require('cjson'), {}
for line in io.lines(arg[1]) do
  local r = cjson.decode(line)
  if r.type == 'train' then last[r.step] = ('%d %.17g'):format(r.step, r.loss) end
end
for s = 1, table.maxn(last) do if last[s] then print(last[s]) end end
LUA
}

# 2. The sbatch, uninterrupted.
A=$DIR/job-a
ida=$(submit "$A")
state=$(wait_job "$ida" "$A")
outa=$(cat "$A"/logs/llama2-7b-"$ida".out "$A"/logs/llama2-7b-"$ida".err 2>/dev/null)
nodes2=$(grep -cE 'rank [0-3] of 4, local rank [01] of 2, node [01] of 2' <<<"$outa")
if [ "$state" = COMPLETED ] && [ "$(field "$ida" ExitCode)" = 0:0 ] && [ "$nodes2" -eq 4 ] &&
   [ -f "$A/checkpoints/llama2_7b/step-0000$STEPS/COMPLETE" ] && [ -s "$A/logs/llama2-7b-$ida.jsonl" ]; then
  ok "sbatch recipes/llama2_7b.sbatch on $(field "$ida" NodeList) (2 nodes x 2 ranks, HYBRID_SHARD): COMPLETED," \
     "every rank saw 2 nodes, log and checkpoints in the job's directory"
else
  not_ok "sbatch on 2 nodes: state $state, exit $(field "$ida" ExitCode), $nodes2 of 4 ranks saw 2 nodes"
  comment "$outa"
fi

# ... its losses against one process of the same global batch (4 x 2).
"$EXE" "$ROOT/recipes/llama2_7b.lua" "${RECIPE[@]}" --batch_size=8 --metrics_file="$DIR/one.jsonl" \
  >"$DIR/one.log" 2>&1
one=$(losses "$DIR/one.jsonl" 2>&1)
reference=$(losses "$A/logs/llama2-7b-$ida.jsonl" 2>&1)
if [ "$(wc -l <<<"$one")" -eq $STEPS ] &&
   paste -d' ' <(echo "$one") <(echo "$reference") |
     awk '{ d = $2 - $4; if (d < 0) d = -d; if (NF != 4 || $1 != $3 || d > 1e-4) bad = 1; if (d > m) m = d }
          END { printf "%.1e\n", m > "/dev/stderr"; exit bad }' 2>"$DIR/maxdiff"; then
  ok "the job's $STEPS losses equal one process of batch 8 (f32, largest difference $(cat "$DIR/maxdiff"), bound 1e-4)"
else
  not_ok "the job's losses differ from one process of batch 8"
  comment "$(paste <(echo "$one") <(echo "$reference"))"
fi

# 3. The same job with its second node's link cut as soon as a checkpoint
# at or after step CUT is complete (the metrics file is written in
# blocks; the checkpoint's COMPLETE marker is there the moment it is).
B=$DIR/job-b
idb=$(submit "$B")
metrics=$B/logs/llama2-7b-$idb.jsonl
newest() { ls -d "$B"/checkpoints/llama2_7b/step-*/COMPLETE 2>/dev/null | tail -1 | grep -oE 'step-0*[0-9]+' | grep -oE '[1-9][0-9]*$'; }
polls=0
while [ "$(newest || echo 0)" -lt "$CUT" ]; do
  # The job's state (a Slurm call, slow) only now and then: a step takes
  # a few hundredths of a second.
  if [ $((++polls % 40)) -eq 0 ]; then
    case $(field "$idb" JobState) in PENDING | RUNNING | CONFIGURING | "") ;; *) break ;; esac
  fi
  sleep 0.02
done
nodes=$(box scontrol show hostnames "$(field "$idb" NodeList)")
victim=$(tail -1 <<<"$nodes")
cut_at=$(newest)
box ip link set "v${victim#n}" down
cut=$(now)
# Every rank of the job, on both nodes, gone: progress is the count of
# ranks falling; the bound is the collective timeout, its roll call (3 s)
# and the abort's grace (2 s, backend_mpi.c) with slack for a loaded
# machine.
ranks() {
  local node pids
  for node in $nodes; do
    pids=$(ip netns pids "$("$BOX" ns "$DIR" "$node")" 2>/dev/null)
    [ -n "$pids" ] && ps -o args= -p "$(echo $pids | tr ' ' ,)" | awk '$1 ~ /fsdp-lua$/ && /llama2_7b/' | wc -l
  done | awk '{ s += $1 } END { print s + 0 }'
}
while [ "$(ranks)" -gt 0 ] && awk -v t="$(since "$cut")" 'BEGIN { exit !(t < 60) }'; do sleep 0.1; done
ended=$(since "$cut")
state=$(wait_job "$idb" "$B")
outb=$(cat "$B"/logs/llama2-7b-"$idb".out "$B"/logs/llama2-7b-"$idb".err 2>/dev/null)
# The collective is whichever the cut caught (the gradients' all-reduce,
# a checkpoint's all-gather); the ranks named must be the cut node's.
lost=$(grep -m1 -oE "[a-z_]+ on group [^:]*: not complete after waiting $FSDP_COLLECTIVE_TIMEOUT s \(the collective timeout, FSDP_COLLECTIVE_TIMEOUT\): world ranks? [23](, [23])* did not answer within [0-9.]+ s" <<<"$outb")
limit=$((FSDP_COLLECTIVE_TIMEOUT + 3 + 8))
if [ -n "$cut_at" ] && [ "$cut_at" -lt $STEPS ] && [ -n "$lost" ] &&
   awk -v t="$ended" -v m="$limit" 'BEGIN { exit !(t <= m) }'; then
  ok "link of $victim cut after the checkpoint of step $cut_at: every rank ended $ended s later (FSDP_COLLECTIVE_TIMEOUT=$FSDP_COLLECTIVE_TIMEOUT," \
     "bound $limit s); a survivor: \"$lost\""
else
  not_ok "link of $victim cut after checkpoint ${cut_at:-?}: ranks ended after $ended s (bound $limit s), message: ${lost:-none}"
  comment "$outb"
fi

resumed=$(grep -m1 -oE 'resumed from checkpoints/llama2_7b/step-0*[0-9]+' <<<"$outb" | grep -oE '[1-9][0-9]*$')
after=$(losses "$metrics" | awk -v r="${resumed:-0}" '$1 > r')
want=$(awk -v r="${resumed:-0}" '$1 > r' <<<"$reference")
if [ "$state" = COMPLETED ] && [ "$(field "$idb" Restarts)" -ge 1 ] && [ -n "$resumed" ] &&
   [ "$resumed" -ge "$cut_at" ] && [ -n "$after" ] && [ "$after" = "$want" ]; then
  ok "requeued (Restarts=$(field "$idb" Restarts)) onto $(field "$idb" NodeList) without $victim, resumed from step" \
     "$resumed, COMPLETED; steps $((resumed + 1))-$STEPS log the uninterrupted job's losses bit for bit"
else
  not_ok "requeue: state $state, restarts $(field "$idb" Restarts), nodes $(field "$idb" NodeList), resumed from ${resumed:-nothing}"
  comment "$outb"
  comment "$(box scontrol show job "$idb"; box sinfo -N; tail -n 30 "$DIR/ctl/slurmctld.log")"
  comment "$(paste <(echo "$want") <(echo "$after"))"
fi

# 4. Teardown, checked: no daemon, namespace or mount of the box left.
start=$(now)
prefix=$("$BOX" ns "$DIR" ctl | sed 's/-ctl$//')
"$BOX" down "$DIR" >/dev/null 2>&1
rc=$?
took_down=$(since "$start")
left=$(ps -eo stat=,args= | awk '$1 !~ /^Z/' | grep -F "$DIR" | grep -v grep)
nets=$(ip netns list | grep -F -- "${prefix:-none}-")
mounts=$(grep -F -e "$DIR" -e "${prefix:-none}-" /proc/self/mountinfo)
if [ "$rc" -eq 0 ] && [ -z "$left$nets$mounts" ]; then
  ok "cluster torn down in $took_down s (up took $took_up s): no daemon, namespace or mount left"
else
  not_ok "teardown (status $rc) left: ${left:+processes $left} ${nets:+namespaces $nets} ${mounts:+mounts $mounts}"
fi

echo "1..$n"
[ "$failed" -eq 0 ]
