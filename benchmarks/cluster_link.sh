#!/usr/bin/env bash
# benchmarks/cluster_link.sh: training steps across a shaped link between
# two nodes of the cluster in a box (tests/cluster/cluster.sh), against the
# planner's communication model (issue 19 items 4-5, a first measurement).
#
#   benchmarks/cluster_link.sh [RATE]     default 1gbit
#   CLUSTER_LINK_CONFIGS="2 HYBRID_SHARD;1 FULL_SHARD" benchmarks/cluster_link.sh
#                                         only these (ranks per node, strategy)
#
# Each node's eth0 gets a token bucket (`tc qdisc ... tbf rate RATE`, each
# direction; no added delay: the kernels of these machines lack netem, so
# latency is the veth's, tens of microseconds); ranks on different nodes
# talk Open MPI's TCP transport across the bridge, ranks on one node
# shared memory. For 2 nodes x 1 rank (FULL_SHARD, SHARD_GRAD_OP) and
# 2 nodes x 2 ranks (FULL_SHARD, HYBRID_SHARD) it prints the fastest step
# of steps 4-16 over $CLUSTER_LINK_REPEATS runs (default 3; on a shared
# machine the fastest step is the one least disturbed: a median moved by
# hundreds of ms between runs here, and one run's fastest step by up to
# 40% between runs when 4 ranks share 2 cores) with the
# link unshaped and shaped, with prefetching
# off (no backward or forward prefetch, no all-gather limit) and on
# (backward PRE, forward prefetch). Columns: the bytes of a step's
# collectives planned (fsdp.plan) and measured (the metrics' comm_bytes,
# counted by core/comm; they differ by the recipe's own few-byte
# all-reduces of the loss and gradient norm); the communication time
# planned (fsdp.plan.cost: ring wire bytes / bandwidth, the node's link
# shared by the rings crossing it at once, no latency) with the link at
# RATE and with a device profile of the link as measured (the all-gather
# rate benchmarks/link_rate.lua gets on it, measured again before each
# configuration's runs, so the plan sees the link and the machine as they
# are then: between measurements minutes apart the rate moved 86-114 MB/s;
# written as a JSON profile for --plan_device), against the measured time some collective was in
# flight on rank 0 (the metrics' comm_busy_s: the link's time, hidden or
# not), and that time counted from each collective's last member's start
# ("joined", comm_joined_s: without the waits for late members, whose sum
# is "skew"; on this machine 4 ranks share 2 cores, so members of a
# collective start it milliseconds apart); the time rank 0 blocked
# waiting for them (comm_wait_s); the step
# times, and "exposed" = shaped - unshaped step time: the communication
# the link added that compute did not hide.
#
# Needs root and Slurm like the cluster suite; takes a few minutes. Step
# times on a shared 2-core machine are noisy: read them as sizes, not
# digits.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
EXE=$ROOT/build/bin/fsdp-lua
BOX=$ROOT/tests/cluster/cluster.sh
RATE=${1:-1gbit}

case "$RATE" in
  *gbit) BW=$(awk -v r="${RATE%gbit}" 'BEGIN { print r * 1e9 / 8 }') ;;
  *mbit) BW=$(awk -v r="${RATE%mbit}" 'BEGIN { print r * 1e6 / 8 }') ;;
  *) echo "RATE must end in gbit or mbit (tc's units), not $RATE" >&2; exit 2 ;;
esac
command -v tc >/dev/null || { echo "tc not found (iproute2)" >&2; exit 1; }

DIR=$(mktemp -d /var/tmp/fsdp-link.XXXXXX)
trap '"$BOX" down "$DIR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
trap 'exit 130' INT TERM
"$BOX" up "$DIR" 2 || exit 1
mkdir -p "$DIR/job"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_preconnect_mpi=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 FSDP_COLLECTIVE_TIMEOUT=120
# Fixed TCP socket buffers (4 MiB, this machine's net.core.wmem_max) instead
# of the kernel's autotuning: with autotuning a 16 MiB ring all-reduce
# across the shaped link took 250-280 ms in 2 jobs of 3 (its two directions
# taking turns, as if serialised) and 140 in the third; with fixed buffers
# 141-148 ms in 5 jobs of 6 and 212 in the sixth (reduce-scatter 71-73
# against 71-108). A shallower shaper queue (tbf latency 5 ms) did not
# change it.
export OMPI_MCA_btl_tcp_sndbuf=${OMPI_MCA_btl_tcp_sndbuf:-4194304}
export OMPI_MCA_btl_tcp_rcvbuf=${OMPI_MCA_btl_tcp_rcvbuf:-4194304}

MODEL=(--data= --dtype=f32 --num_layers=4 --hidden_width=256 --num_heads=4 --vocab_size=512
       --seq_len=64 --batch_size=2 --validation_freq=0 --peak_tflops=0 --warmup_steps=2)
STEPS=16
REPEATS=${CLUSTER_LINK_REPEATS:-3}
OFF=(--backward_prefetch=none --forward_prefetch=false --limit_all_gathers=false)
ON=(--backward_prefetch=pre --forward_prefetch=true --limit_all_gathers=true)

shape() { # shape on|off
  local node
  for node in n1 n2; do
    "$BOX" node "$DIR" "$node" tc qdisc del dev eth0 root 2>/dev/null
    # A burst of 128 KiB: above one GSO segment (64 KiB), far below a
    # step's messages (MiBs), so the rate holds for each collective.
    [ "$1" = on ] && "$BOX" node "$DIR" "$node" tc qdisc add dev eth0 root tbf rate "$RATE" burst 128kb latency 100ms
  done
  return 0
}

# step_once PER_NODE STRATEGY PREFETCH...: rank 0's fastest step of steps 4-16
# as "STEP_MS MIB WAIT_MS BUSY_MS JOINED_MS SKEW_MS KIND=BUSY/JOINED,...":
# its time, the bytes its collectives moved, the time it blocked waiting
# for them, the time some were in flight (the metrics' comm, counted by
# core/comm: fsdp.dist.collective_stats), that time counted from each
# collective's last member's start (--comm_joined: fsdp.observe.joined)
# and the waits for late members summed.
step_once() {
  local per=$1 strategy=$2; shift 2
  local m=$DIR/job/m.jsonl
  rm -f "$m"
  (cd "$DIR/job" && timeout 300 "$BOX" run "$DIR" srun --mpi=pmix -N2 --ntasks-per-node="$per" \
    "$EXE" "$ROOT/recipes/llama2_7b.lua" "${MODEL[@]}" --max_steps=$STEPS --sharding_strategy="$strategy" \
    --metrics_file="$m" --comm_joined=true "$@" >"$DIR/job/out.log" 2>&1) || {
    # Why, on stderr: the table keeps its columns.
    { echo "a step run failed ($per per node, $strategy $*):"; tail -5 "$DIR/job/out.log"; } >&2
    echo "failed - - - - - -"; return; }
  "$EXE" - "$m" <<'LUA'
local cjson, best = require('cjson'), nil
for line in io.lines(arg[1]) do
  local r = cjson.decode(line)
  if r.type == 'train' and r.step >= 4 and (not best or r.step_time < best.step_time) then best = r end
end
local kinds = {}
for _, k in ipairs({ 'all_gather', 'reduce_scatter', 'all_reduce' }) do
  local c = (best.comm or {})[k] or { busy_s = 0, joined_s = 0 }
  kinds[#kinds + 1] = ('%s=%.0f/%.0f'):format(k, 1000 * c.busy_s, 1000 * (c.joined_s or 0))
end
print(('%.0f %.2f %.0f %.0f %.0f %.0f %s'):format(1000 * best.step_time, (best.comm_bytes or 0) / 2^20,
  1000 * (best.comm_wait_s or 0), 1000 * (best.comm_busy_s or 0), 1000 * (best.comm_joined_s or 0),
  1000 * (best.comm_skew_s or 0), table.concat(kinds, ',')))
LUA
}

# step PER_NODE STRATEGY PREFETCH...: step_once's line of the fastest of
# REPEATS runs ("failed ..." only when every run failed).
step() {
  local best="" line r
  for r in $(seq 1 "$REPEATS"); do
    line=$(step_once "$@")
    case "$line" in failed*) continue ;; esac
    if [ -z "$best" ] || [ "${line%% *}" -lt "${best%% *}" ]; then best=$line; fi
  done
  echo "${best:-failed - - - - - -}"
}

# profile FILE INTER INTRA: a device profile (fsdp.devices.load) of CPU
# nodes joined by this link: the cpu profile with the inter-node bandwidth
# INTER (one link per node, shared by its ranks) and INTRA between the
# ranks of a node (empty: the cpu profile's).
profile() {
  printf '{"base": "cpu", "name": "cluster in a box, %s", "inter_bw": %s, "node_inter_bw": %s%s}\n' \
    "$RATE" "$2" "$2" "${3:+, \"intra_bw\": $3}" >"$1"
}

# planned PER_NODE STRATEGY PROFILE: "MIB MS KIND=MS,...": the bytes of a
# step's collectives (fsdp.plan's comm, the PLAN line of --plan) and their
# time on the device PROFILE (a JSON file), in all and per kind.
planned() {
  local plan
  plan=$("$EXE" "$ROOT/recipes/llama2_7b.lua" "${MODEL[@]}" --sharding_strategy="$2" --plan \
    --plan_world=$((2 * $1)) --plan_nodes=2 --plan_device="$3" 2>&1 | sed -n 's/^PLAN //p')
  "$EXE" - "$plan" <<'LUA'
local p = require('cjson').decode(arg[1])
local bytes, s, kinds = 0, 0, {}
for _, c in pairs(p.comm) do bytes, s = bytes + c.bytes, s + c.seconds end
for _, k in ipairs({ 'all_gather', 'reduce_scatter', 'all_reduce' }) do
  kinds[#kinds + 1] = ('%s=%.0f'):format(k, 1000 * (p.comm[k] or { seconds = 0 }).seconds)
end
print(('%.2f %.0f %s'):format(bytes / 2^20, 1000 * s, table.concat(kinds, ',')))
LUA
}

# The rate the shaped link really gives a ring all-gather (wire bytes per
# second, benchmarks/link_rate.lua, 2 nodes x 1 rank): the link as MPI's
# TCP transport sees it, headers and protocol taken off; and the rate
# between the 2 ranks of a node while the other node's do the same (2
# nodes x 2 ranks: 4 ranks sharing this machine's cores), which the
# "@link" profile takes for intra_bw.
rates() { # rates RANKS_PER_NODE LOG
  (cd "$DIR/job" && timeout 300 "$BOX" run "$DIR" srun --mpi=pmix -N2 --ntasks-per-node="$1" \
    "$EXE" "$ROOT/benchmarks/link_rate.lua" 2>&1 | tee "$2" | sed -n 's/^RATES //p')
}
field() { echo "print(require('cjson').decode(arg[1])$2)" | "$EXE" - "$1"; }
# measure_link PER_NODE: $DIR/link.json, the profile of the shaped link as
# the collectives get it now (its all-gather rate across nodes, and with 2
# ranks per node the rate within a node while the link is busy), and the
# rates on stdout, one line per kind.
measure_link() {
  local measured measured_2="" link_bw=$BW intra_bw=""
  shape on
  measured=$(rates 1 "$DIR/job/rate.log")
  [ "$1" -gt 1 ] && measured_2=$(rates 2 "$DIR/job/rate2.log")
  shape off
  grep -hE '^(all_gather|reduce_scatter|all_reduce) ' "$DIR/job/rate.log"
  [ "$1" -gt 1 ] && grep -hE '^(all_gather|reduce_scatter|all_reduce) .*within' "$DIR/job/rate2.log"
  [ -n "$measured" ] && link_bw=$(field "$measured" .all_gather)
  [ -n "$measured_2" ] && intra_bw=$(field "$measured_2" .intra.all_gather)
  profile "$DIR/link.json" "$link_bw" "$intra_bw"
}
profile "$DIR/nominal.json" "$BW"
echo "link: $RATE nominal ($BW bytes/s on the wire); $REPEATS runs per row; what the collectives got on it,"
echo "measured before each configuration:"

printf '%-24s %-8s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n' configuration prefetch "plan MiB" "meas MiB" \
  "plan ms" "plan ms" "busy ms" "joined ms" "skew ms" "wait ms" "step" "shaped" "exposed"
printf '%-24s %-8s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n' "" "" "" "" "@nominal" "@link" "(shaped)" "(shaped)" \
  "(shaped)" "(shaped)" "(ms)" "(ms)" "(ms)"
details=() rates_seen=()
IFS=';' read -ra CONFIGS <<<"${CLUSTER_LINK_CONFIGS:-1 FULL_SHARD;1 SHARD_GRAD_OP;2 FULL_SHARD;2 HYBRID_SHARD}"
for cfg in "${CONFIGS[@]}"; do
  set -- $cfg
  per=$1 strategy=$2
  rates_seen+=("2 nodes x $per $strategy:")
  while IFS= read -r line; do rates_seen+=("  $line"); done < <(measure_link "$per")
  read -r plan_mib plan_ms plan_kinds < <(planned "$per" "$strategy" "$DIR/nominal.json")
  read -r _ plan_ms_link _ < <(planned "$per" "$strategy" "$DIR/link.json")
  details+=("2 nodes x $per $strategy planned @nominal: $plan_kinds")
  for mode in off on; do
    if [ "$mode" = off ]; then flags=("${OFF[@]}"); else flags=("${ON[@]}"); fi
    shape off
    read -r base _ < <(step "$per" "$strategy" "${flags[@]}")
    shape on
    read -r shaped mib wait busy joined skew kinds < <(step "$per" "$strategy" "${flags[@]}")
    details+=("2 nodes x $per $strategy prefetch $mode, busy/joined: $kinds")
    shape off
    printf '%-24s %-8s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n' "2 nodes x $per $strategy" "$mode" "$plan_mib" \
      "$mib" "$plan_ms" "$plan_ms_link" "$busy" "$joined" "$skew" "$wait" "$base" "$shaped" \
      "$(awk -v a="$base" -v b="$shaped" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) print b - a; else print "?" }')"
  done
done
echo "time per kind of collective (ms; measured: rank 0's busy and joined time of that kind in the fastest shaped step):"
printf '  %s\n' "${details[@]}"
echo "the link as measured before each configuration (the @link profile):"
printf '  %s\n' "${rates_seen[@]}"
