#!/usr/bin/env bash
# tests/chaos/chaos.sh: kill a training job with SIGKILL at random moments,
# restart it with the same command, again and again, and check that the
# restarts never change training by a single bit.
#
#   tests/chaos/chaos.sh            the short version (CI: tests/mpi/run.sh)
#   tests/chaos/chaos.sh long       >= 24 kills over 4 chains (docs/checkpoints.md)
#   FSDP_CHAOS_SEED=N tests/chaos/chaos.sh [long]   replay the random choices of a run
#
# The job is recipes/llama2_7b.lua at a tiny size under mpirun, with AdamW
# beta2 0.999 (a stale step counter then changes the update visibly), a
# checkpoint every FREQ steps and --keep_checkpoints=2. A *chain* runs it
# until it finishes, on a *plan* of world sizes: "2 4 2" means 2 ranks up to
# a checkpoint step S1, 4 ranks up to S2, then 2 ranks (random S1 < S2,
# multiples of FREQ); the global batch stays 4 (--batch_size=4/ranks). An
# attempt resumes from the newest complete checkpoint with the plan's world
# size for the steps after it, and is ended by one random kill:
#   step   rank 0 kills itself right after step T and its save (FSDP_TEST_KILL_AT_STEP)
#   save   rank 0 kills itself inside the save of step S, after every file
#          and the index, before COMPLETE (FSDP_TEST_KILL_IN_SAVE)
#   job    SIGKILL to mpirun and every rank at once, a random 0-60 ms after
#          step T was logged (lands in compute, in saves, in pruning)
#   rank   SIGKILL to one random rank, the same way; mpirun ends the rest
#   early  SIGKILL to the whole job a random 0-1.5 s after launch (often
#          before the first save or during the resume: a fresh restart)
# T and S are drawn after the next checkpoint (T >= resume + FREQ + 1), so
# every kill but `early` leaves a new checkpoint whatever the machine's
# load: each restart resumes a run that itself resumed, and wall-clock
# kills are triggered by progress, never by a guessed duration. A plan's
# switch from one world size to the next is a kill at the switch step
# (FSDP_TEST_KILL_AT_STEP) after its save; it is not counted as random.
#
# Checked, after every attempt and at the end of each chain
# (tests/chaos/check.lua):
#   - the restart resumed from the newest complete checkpoint (or started
#     fresh when there was none);
#   - every complete checkpoint on disk: no stale optimizer counter (every
#     parameter's AdamW step equals the checkpoint's step), and equal to the
#     reference's checkpoint of that step in every tensor of every rank file
#     (byte for byte) and in the index (optimizer counters and
#     hyper-parameters, scheduler, data positions, RNG);
#   - every train and validation record that any attempt logged has exactly
#     the reference's loss, lr and grad norm, and every step was logged.
# The reference of a plan runs it without random kills: one uninterrupted
# run for "2" and "4"; for a plan that changes the world size, the same
# world sizes over the same steps, stopped only at the switch steps. (Runs
# on 2 and on 4 ranks cannot agree bit for bit with each other: the ranks
# sum their gradients in another order.)
#
# Prints "ok - ..." / "not ok - ..." lines (tests/mpi/run.sh numbers them),
# a "# " comment per attempt and a summary. FSDP_CHAOS_KEEP=1 keeps the
# work directory. The seed replays every choice (plans, kill modes, steps,
# delays, victims); where a wall-clock kill lands also depends on timing.
set -uo pipefail
cd "$(dirname "$0")/../.."

MODE=${1:-short}
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
# Open MPI on these machines, as tests/mpi/run.sh (standalone runs too).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export FSDP_COLLECTIVE_TIMEOUT=${FSDP_COLLECTIVE_TIMEOUT:-20}

FREQ=2 GLOBAL_BATCH=4 KEEP=2
STALL=60 # seconds an attempt may go without output before it counts as hung
case $MODE in
  # KILLS random kills per chain that each leave a new checkpoint, plus up
  # to EARLY early ones. An attempt advances at most 3 FREQ steps, so
  # MAX >= (KILLS - 1 + EARLY + switches) * 3 FREQ + FREQ + 2 leaves room
  # for them all (see the attempt loop)
  short) MAX=34 KILLS=3 EARLY=1 PLANS=("2 4 2") ;;
  long) MAX=58 KILLS=6 EARLY=2 PLANS=("2" "4" "2 4 2" "4 2 4") ;;
  *) echo "usage: $0 [short|long]" >&2; exit 2 ;;
esac
SEED=${FSDP_CHAOS_SEED:-$(( $(date +%s%N) / 1000 % 1000000 ))}
RANDOM=$SEED
echo "# chaos ($MODE): seed $SEED; replay with FSDP_CHAOS_SEED=$SEED $0 $MODE"

ARGS=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=64 --num_heads=4 --vocab_size=128 --seq_len=32
      --max_steps=$MAX --warmup_steps=3 --beta2=0.999 --validation_freq=4 --val_batches=1
      --checkpoint_freq=$FREQ --resume_from_checkpoint)

exec 3>&2 # the script's stderr (see launch)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-chaos.XXXXXX")
JOB=
cleanup() {
  [ -n "$JOB" ] && kill_session "$JOB"
  if [ "${FSDP_CHAOS_KEEP:-0}" = 1 ]; then echo "# work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT # (so that cleanup ends a running job: it is in a session of its own)

failed=0
ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; failed=$((failed + 1)); }
comment() { sed 's/^/#   /' <<<"$1"; }

# R = a random integer in [$1, $2].
rand() { R=$(($1 + RANDOM % ($2 - $1 + 1))); }

# The newest complete checkpoint step in $1 (0: none).
newest_complete() {
  local d s best=0
  for d in "$1"/step-*; do
    [ -f "$d/COMPLETE" ] || continue
    s=$((10#${d##*/step-}))
    [ "$s" -gt "$best" ] && best=$s
  done
  echo "$best"
}

complete_steps() {
  local d
  for d in "$1"/step-*; do [ -f "$d/COMPLETE" ] && echo $((10#${d##*/step-})); done
}

# Incomplete step directories newer than step $2 in $1 (a save cut short).
torn_after() {
  local d s out=
  for d in "$1"/step-*; do
    [ -d "$d" ] && [ ! -f "$d/COMPLETE" ] || continue
    s=$((10#${d##*/step-}))
    [ "$s" -gt "$2" ] && out+="$s "
  done
  echo "$out"
}

# The live processes whose /proc/PID/stat field $1 (after the command
# name: 1 = parent, 3 = session) is $2 (read from /proc: no procps needed).
# Zombies do not count: a container whose init reaps nothing keeps them.
procs_where() {
  local f line fields
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    fields=(${line##*) })
    [ "${fields[0]}" != Z ] && [ "${fields[$1]}" = "$2" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
}
# Processes of session $1 (mpirun runs as the session leader; Open MPI puts
# each rank in a process group of its own, but in mpirun's session).
session_pids() { procs_where 3 "$1"; }
kill_session() {
  local pids
  pids=$(session_pids "$1")
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  return 0
}
rank_pids() { procs_where 1 "$1"; }

# The last step an attempt logged, from its own log $1 (0: none yet). Not
# from the metrics file: a resume rewrites it without the records past the
# resume step (fsdp.metrics), so byte offsets into it do not last. The
# recipe logs every step when its output is not a terminal.
progress() {
  local s
  s=$(grep -o 'Batch [0-9]* Loss' "$1" 2>/dev/null | tail -1 | grep -o '[0-9]*')
  echo "${s:-0}"
}

alive() { kill -0 "$JOB" 2>/dev/null; }

# Plans. A plan is "NP@FROM ...": world size NP for the steps after a resume
# point in [FROM, next FROM). make_plan "2 4 2" draws the switch steps into
# PLAN (not echoed: bash reseeds RANDOM in a subshell, which would break
# the replay of a seed).
make_plan() {
  local sizes=($1) out="" i from prev=0 k
  k=${#sizes[@]}
  for ((i = 0; i < k; i++)); do
    if [ "$i" -eq 0 ]; then
      from=0
    else
      # segment i starts near i/k of the way, on a checkpoint step, at
      # least 2 FREQ after the previous switch and before the end
      rand -1 1
      from=$(((MAX * i / k / FREQ + R) * FREQ))
      [ "$from" -lt "$((prev + 2 * FREQ))" ] && from=$((prev + 2 * FREQ))
      [ "$from" -gt "$((MAX - 2 * FREQ))" ] && from=$((MAX - 2 * FREQ))
    fi
    out+="${sizes[$i]}@$from "
    prev=$from
  done
  PLAN=${out% }
}
# NP and STOP (the next switch step, or MAX) for resume point $2 of plan $1.
plan_at() {
  local seg np from
  NP= STOP=$MAX
  for seg in $1; do
    np=${seg%@*} from=${seg#*@}
    if [ "$from" -le "$2" ]; then NP=$np; else STOP=$from; break; fi
  done
}
plan_name() { tr ' ' '-' <<<"$1"; }

# launch NAME NP LOGFILE ENV...: the recipe in a new session, appending to
# $WORK/NAME.jsonl, checkpoints in $WORK/NAME; JOB = mpirun's pid.
launch() {
  local name=$1 np=$2 log=$3 keep=$KEEP
  shift 3
  [[ $name == ref-* ]] && keep=0
  # bash reports a job it reaps after a SIGKILL ("line N: PID Killed ...")
  # on stderr: while the job runs, stderr goes to a file (wait_job restores it)
  exec 2>>"$WORK/bash-notices"
  setsid env "$@" mpirun -np "$np" "$EXE" "${ARGS[@]}" --batch_size=$((GLOBAL_BATCH / np)) \
    --checkpoint_dir="$WORK/$name" --metrics_file="$WORK/$name.jsonl" --keep_checkpoints=$keep \
    >"$log" 2>&1 3>&- &
  JOB=$!
}

# Wait for the job; RC its status. A job whose log and metrics stop growing
# for STALL seconds is killed and reported as hung; a process of its
# session that outlives mpirun for more than 10 s too.
wait_job() {
  local name=$1 log=$2 sig="" now stamp=0 quiet=0 left
  while alive; do
    now=$(stat -c %s "$log" "$WORK/$name.jsonl" 2>/dev/null | tr '\n' ' ')
    if [ "$now" != "$sig" ]; then sig=$now quiet=0; else quiet=$((quiet + 1)); fi
    if [ "$quiet" -gt $((STALL * 10)) ]; then
      not_ok "$name: no output for $STALL s: the job hung ($(tail -3 "$log" | tr '\n' ' '))"
      kill_session "$JOB"
    fi
    sleep 0.1
  done
  wait "$JOB"
  RC=$?
  exec 2>&3
  for ((left = 100; left > 0; left--)); do
    [ -z "$(session_pids "$JOB")" ] && break
    sleep 0.1
  done
  if [ "$left" -eq 0 ]; then
    not_ok "$name: processes of the job outlived mpirun by 10 s: $(session_pids "$JOB" | tr '\n' ' ')"
    kill_session "$JOB"
  fi
  JOB=
}

# The reference of a plan: its world sizes over its steps, stopped only at
# the switch steps (one uninterrupted run for a plan of one size).
reference() {
  local plan=$1 name="ref-$(plan_name "$1")" seg n=0 np from stop log
  [ -d "$WORK/$name" ] && return 0
  mkdir -p "$WORK/$name"
  local segs=($plan) i
  for ((i = 0; i < ${#segs[@]}; i++)); do
    np=${segs[$i]%@*} from=${segs[$i]#*@}
    stop=$MAX
    [ $((i + 1)) -lt ${#segs[@]} ] && stop=${segs[$((i + 1))]#*@}
    log="$WORK/$name.log.$i"
    if [ "$stop" -lt "$MAX" ]; then launch "$name" "$np" "$log" FSDP_TEST_KILL_AT_STEP="$stop"
    else launch "$name" "$np" "$log"; fi
    wait_job "$name" "$log"
    if [ "$(newest_complete "$WORK/$name")" -ne "$stop" ] || { [ "$stop" -eq "$MAX" ] && [ "$RC" -ne 0 ]; }; then
      not_ok "reference $plan: the run on $np ranks from step $from to $stop (exit $RC)"
      comment "$(tail -20 "$log")"
      return 1
    fi
  done
  ok "reference for plan \"$plan\": $MAX steps$([ ${#segs[@]} -gt 1 ] && echo ", stopped at the switch steps only")"
}

declare -A BY_MODE=([step]=0 [save]=0 [job]=0 [rank]=0 [early]=0)
TOTAL_KILLS=0 TOTAL_SAVE_KILLS=0 TOTAL_RESUMES=0 TOTAL_RECORDS=0 TOTAL_CKPTS=0 MAX_DEPTH=0

# chain SIZES: one chain on a fresh plan of those world sizes.
chain() {
  local plan name ref attempts=0 kills=0 progress_kills=0 early=0 save_kills=0 resumes=0 depth_max=0
  local ckpt_bad=0 done_=0 mode modes=(step save job rank early) r np stop envs trigger delay early_ms
  local log victim killed lo hi halt s t what torn new out t0
  # resume depth: 0 for a fresh start, else 1 + the depth of the attempt
  # that wrote the checkpoint resumed from (per attempt, per checkpoint)
  local -A adepth=() cdepth=()
  make_plan "$1"
  plan=$PLAN
  name="chain-$(plan_name "$plan")"
  ref="ref-$(plan_name "$plan")"
  reference "$plan" || return
  t0=$(date +%s.%N)
  while [ "$done_" -eq 0 ]; do
    attempts=$((attempts + 1))
    if [ "$attempts" -gt $((4 * KILLS + 20)) ]; then
      not_ok "$name: not finished after $attempts attempts"
      return
    fi
    r=$(newest_complete "$WORK/$name")
    plan_at "$plan" "$r"
    np=$NP stop=$STOP
    envs=() trigger=0 delay=0 early_ms=0 what=""
    # While random kills are due, an attempt is stopped at the latest after
    # step hi = r + 3 FREQ (FSDP_TEST_KILL_AT_STEP, also when a wall-clock
    # kill comes late on a loaded machine), and random kills land after
    # step lo = r + FREQ + 1 (past the next save, so the chain advances):
    # every attempt advances at most 3 FREQ steps, and MAX leaves room for
    # all the kills of a chain whatever the draws and the load.
    lo=$((r + FREQ + 1)) hi=$((r + 3 * FREQ)) halt=$stop mode=none
    [ "$hi" -gt "$stop" ] && hi=$stop
    if [ "$progress_kills" -lt "$KILLS" ]; then
      halt=$hi
      rand 0 4
      mode=${modes[$R]}
      [ "$mode" = early ] && [ "$early" -ge "$EARLY" ] && mode=job
    fi
    [ "$halt" -lt "$MAX" ] || [ "$mode" != none ] && envs=(FSDP_TEST_KILL_AT_STEP="$halt")
    case $mode in
      step)
        if [ "$lo" -le "$hi" ]; then rand "$lo" "$hi"; envs=(FSDP_TEST_KILL_AT_STEP="$R"); what="kill -9 after step $R"
        else mode=none; fi ;;
      save)
        s=$(((r / FREQ + 2) * FREQ))
        if [ "$s" -le "$hi" ]; then
          rand $((s / FREQ)) $((hi / FREQ))
          envs+=(FSDP_TEST_KILL_IN_SAVE=$((R * FREQ))); what="kill -9 inside the save of step $((R * FREQ))"
        else mode=none; fi ;;
      job | rank)
        # (before hi, where the attempt is stopped anyway)
        if [ "$lo" -le $((hi - 1)) ]; then
          rand "$lo" $((hi - 1)); trigger=$R
          rand 0 60; delay=$R
        else mode=none; fi ;;
      early) rand 1 1500; early_ms=$R ;;
    esac
    log="$WORK/$name.log.$attempts"
    launch "$name" "$np" "$log" "${envs[@]}"
    killed=0
    if [ "$trigger" -gt 0 ]; then
      while alive && [ "$(progress "$log")" -lt "$trigger" ]; do sleep 0.01; done
      sleep "$(printf '0.%03d' "$delay")"
      if alive; then
        if [ "$mode" = rank ]; then
          victim=($(rank_pids "$JOB"))
          if [ ${#victim[@]} -gt 0 ]; then
            rand 0 $((${#victim[@]} - 1))
            kill -KILL "${victim[$R]}" 2>/dev/null && killed=1
            what="kill -9 of one rank (pid ${victim[$R]}) $delay ms after step $trigger"
          fi
        else
          kill_session "$JOB"; killed=1
          what="kill -9 of the whole job $delay ms after step $trigger"
        fi
      fi
    elif [ "$early_ms" -gt 0 ]; then
      # at the drawn moment, or as soon as the first step is logged
      t=$(($(date +%s%N) / 1000000))
      while alive && [ "$(progress "$log")" -eq 0 ] &&
            [ $(($(date +%s%N) / 1000000 - t)) -lt "$early_ms" ]; do
        sleep 0.01
      done
      if alive; then
        kill_session "$JOB"; killed=1
        what="kill -9 of the whole job $(($(date +%s%N) / 1000000 - t)) ms after launch"
      fi
    fi
    wait_job "$name" "$log"
    case $mode in
      step) grep -q "test hook: kill -9 (FSDP_TEST_KILL_AT_STEP=${envs[0]#*=})" "$log" && killed=1 ;;
      save) grep -q "test hook: kill -9 (FSDP_TEST_KILL_IN_SAVE=" "$log" && killed=1 ;;
    esac
    # a wall-clock kill that came after the stop at hi: that stop is the
    # kill (it is a random one unless hi is the plan's switch step)
    if [ "$killed" -eq 0 ] && [ "$mode" != none ] && [ "$halt" -lt "$stop" ] &&
       grep -q "test hook: kill -9 (FSDP_TEST_KILL_AT_STEP=$halt)" "$log"; then
      killed=1 mode=step what="kill -9 after step $halt"
    fi
    [ "$killed" -eq 0 ] && what=""
    torn=$(torn_after "$WORK/$name" "$r")
    if [ "$killed" -eq 1 ]; then
      kills=$((kills + 1)) BY_MODE[$mode]=$((BY_MODE[$mode] + 1))
      if [ "$mode" = early ]; then early=$((early + 1)); else progress_kills=$((progress_kills + 1)); fi
      [ -n "$torn" ] && save_kills=$((save_kills + 1))
    fi
    # the restart resumed where it had to
    if [ "$r" -gt 0 ]; then
      if grep -q "checkpoint: resumed from $WORK/$name/$(printf 'step-%06d' "$r") (step $r," "$log"; then
        resumes=$((resumes + 1))
        adepth[$attempts]=$((${cdepth[$r]:-0} + 1))
      elif [ -n "$(progress "$log" | grep -v '^0$')" ]; then
        not_ok "$name attempt $attempts did not resume from step $r"
        comment "$(grep -E 'checkpoint' "$log" | head -10)"
      fi
    fi
    # every complete checkpoint newer than r is this attempt's (the kept ones)
    new=""
    for s in $(complete_steps "$WORK/$name"); do
      if [ "$s" -gt "$r" ]; then cdepth[$s]=${adepth[$attempts]:-0}; new+="$s "; fi
    done
    [ "${adepth[$attempts]:-0}" -gt "$depth_max" ] && depth_max=${adepth[$attempts]:-0}
    echo "# $name attempt $attempts: $np ranks from step $r (resume depth ${adepth[$attempts]:-0}): ${what:-no random kill}; exit $RC; its checkpoints kept: ${new:-none}${torn:+; torn saves: $torn}"
    # an attempt that was not killed ends at the plan's switch or finishes
    if [ "$killed" -eq 0 ] && [ "$RC" -ne 0 ] &&
       ! grep -q "test hook: kill -9 (FSDP_TEST_KILL_AT_STEP=$halt)" "$log"; then
      not_ok "$name attempt $attempts ($np ranks from step $r) failed with exit $RC"
      comment "$(tail -20 "$log")"
      return
    fi
    if [ "$ckpt_bad" -eq 0 ]; then
      if ! out=$("$EXE" tests/chaos/check.lua checkpoints "$WORK/$name" "$WORK/$ref" 2>&1); then
        not_ok "$name: checkpoints on disk after attempt $attempts ($what)"
        comment "$out"
        ckpt_bad=1
      else
        TOTAL_CKPTS=$((TOTAL_CKPTS + $(awk '{print $2}' <<<"$out")))
      fi
    fi
    if [ "$RC" -eq 0 ]; then done_=1; fi
  done
  if out=$("$EXE" tests/chaos/check.lua metrics "$WORK/$name.jsonl" "$WORK/$ref.jsonl" "$MAX" 2>&1); then
    ok "$name: every loss, lr and grad norm of $(awk '{print $2}' <<<"$out") records from $attempts attempts equals the reference's exactly"
    TOTAL_RECORDS=$((TOTAL_RECORDS + $(awk '{print $2}' <<<"$out")))
  else
    not_ok "$name: logged numbers differ from the reference's"
    comment "$out"
  fi
  [ "$ckpt_bad" -eq 0 ] && ok "$name: every checkpoint on disk after each of $attempts attempts: no stale optimizer counter, equal to the reference's"
  if [ "$depth_max" -ge 3 ]; then
    ok "$name: $kills random kills ($save_kills during saves, $early early), $resumes resumes, up to $depth_max resumes deep, in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s"
  else
    not_ok "$name: only $depth_max resumes deep ($kills kills, $resumes resumes)"
  fi
  TOTAL_KILLS=$((TOTAL_KILLS + kills)) TOTAL_SAVE_KILLS=$((TOTAL_SAVE_KILLS + save_kills))
  TOTAL_RESUMES=$((TOTAL_RESUMES + resumes))
  [ "$depth_max" -gt "$MAX_DEPTH" ] && MAX_DEPTH=$depth_max
}

START=$(date +%s.%N)
for sizes in "${PLANS[@]}"; do chain "$sizes"; done
echo "# chaos summary ($MODE, seed $SEED): ${#PLANS[@]} chains, $TOTAL_KILLS random kills (step ${BY_MODE[step]}, save ${BY_MODE[save]}, job ${BY_MODE[job]}, rank ${BY_MODE[rank]}, early ${BY_MODE[early]}; $TOTAL_SAVE_KILLS left a save cut short), $TOTAL_RESUMES resumes (up to $MAX_DEPTH deep), $TOTAL_RECORDS records and $TOTAL_CKPTS checkpoint checks equal to the references, $failed failures, $(awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s"
[ "$failed" -eq 0 ]
