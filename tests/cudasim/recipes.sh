#!/usr/bin/env bash
# tests/cudasim/recipes.sh: every training recipe with --device=cuda in the
# cudasim build (its cuda:0 runs the backend's kernels on the CPU, NCCL is
# simulated across processes), on 1 rank and on 2 ranks (mpirun, each rank
# cuda:<local rank> of FSDP_CUDASIM_DEVICES=2), against the same binary
# with --device=cpu: the same losses within the dtype's tolerance (f32,
# --mixed_precision= given empty: 1e-5 relative). Also --device=cuda's GPU
# default (bf16 mixed precision when not given) against the CPU in bf16,
# and the device memory in the metrics JSONL; the refusals that need a
# GPU to be seen (a device index past the last, --plan on a GPU without a
# profile, --memory_limit_mb on the GPU); auto where each rank sees one GPU. TAP lines numbered from
# $1 + 1 on (default 1).
# Also a checkpoint saved and resumed on cuda, and recipes/generate.lua
# from it on cuda. Small configs: cudasim is
# slow (about 40 s in all on an idle machine).
#
#   tests/cudasim/recipes.sh [FIRST_NUMBER]
#   NPS=1 tests/cudasim/recipes.sh      only the 1-rank comparisons
set -uo pipefail
cd "$(dirname "$0")/../.."
EXE=${FSDP_LUA:-build/cudasim/bin/fsdp-lua}
n=${1:-0}
rc=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-cudasim-recipes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 FSDP_PROGRESS=0
export FSDP_COLLECTIVE_TIMEOUT=${FSDP_COLLECTIVE_TIMEOUT:-30}

# bounded COMMAND...: run it, stopped when it printed nothing for 120 s
# (progress decides, not a wall-clock guess: every recipe logs each step).
bounded() {
  local log=$tmp/out.$RANDOM size=-1 now quiet=0
  "$@" >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    now=$(stat -c %s "$log")
    if [ "$now" != "$size" ]; then size=$now quiet=0; else quiet=$((quiet + 1)); fi
    if [ "$quiet" -ge 600 ]; then
      kill -TERM "$pid" 2>/dev/null; sleep 2; kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      cat "$log"; echo "(stopped: silent for 120 s)"
      return 124
    fi
  done
  wait "$pid"
  local status=$?
  cat "$log"
  return $status
}

# run NP ARGS...: the recipe on NP ranks (rank 0's output only); each
# rank's process has DEVICES simulated GPUs (default NP).
run() {
  local np=$1
  shift
  if [ "$np" = 1 ]; then
    bounded "$EXE" "$@"
  else
    bounded env FSDP_CUDASIM_DEVICES="${DEVICES:-$np}" mpirun -np "$np" --tag-output "$EXE" "$@" |
      sed -n 's/^\[1,0\]<std\(out\|err\)>://p'
    return "${PIPESTATUS[0]}"
  fi
}

# The losses a run logged, one per line: from its metrics JSONL (full
# precision), else from its log lines.
losses() { # KIND OUTPUT_FILE [JSONL]
  case $1 in
    jsonl) grep '"type":"train"' "$3" | sed 's/.*"loss":\([-0-9.e+]*\).*/\1/' ;;
    batch) sed -n 's/^\(\[rank 0\] \)\{0,1\}Batch [0-9]* Loss: \([-0-9.]*\),.*/\2/p' "$2" ;;
    mnist) sed -n 's/^\(\[rank 0\] \)\{0,1\}Train Epoch: .*Loss: \([-0-9.]*\).*/\2/p' "$2" ;;
  esac
}

# agree "WANT..." "GOT..." TOL: "ok MAX_RELATIVE_ERROR" when the two lists
# of losses have one length and agree within TOL (relative), else why not.
agree() {
  awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN {
    na = split(a, x, " "); nb = split(b, y, " ")
    if (na == 0 || na != nb) { print "counts " na " vs " nb; exit }
    worst = 0
    for (i = 1; i <= na; i++) {
      d = x[i] - y[i]; if (d < 0) d = -d
      r = d / (x[i] < 0 ? -x[i] : x[i])
      if (r != r) { print "not a number at step " i; exit }
      if (r > worst) worst = r
    }
    if (worst > tol) printf "max relative error %.3g > %g\n", worst, tol
    else printf "ok %.2g\n", worst
  }'
}

# compare NAME NP TOL KIND ARGS...: ARGS with --device=cpu and with
# --device=cuda; one TAP line.
compare() {
  local name=$1 np=$2 tol=$3 kind=$4
  shift 4
  local cpu_out=$tmp/cpu.txt cuda_out=$tmp/cuda.txt
  rm -f "$tmp"/*.jsonl
  local extra_cpu=() extra_cuda=()
  if [ "$kind" = jsonl ]; then extra_cpu=(--metrics_file="$tmp/cpu.jsonl"); extra_cuda=(--metrics_file="$tmp/cuda.jsonl"); fi
  run "$np" "$@" --device=cpu "${extra_cpu[@]}" >"$cpu_out" 2>&1
  local s1=$?
  run "$np" "$@" --device=cuda "${extra_cuda[@]}" >"$cuda_out" 2>&1
  local s2=$?
  local want got
  want=$(losses "$kind" "$cpu_out" "$tmp/cpu.jsonl" 2>/dev/null | tr '\n' ' ')
  got=$(losses "$kind" "$cuda_out" "$tmp/cuda.jsonl" 2>/dev/null | tr '\n' ' ')
  local verdict
  local verdict
  verdict=$(agree "$want" "$got" "$tol")
  n=$((n + 1))
  local on=$([ "$np" = 1 ] && echo "1 rank" || echo "$np ranks")
  if [ $s1 -eq 0 ] && [ $s2 -eq 0 ] && [ "${verdict%% *}" = ok ] && grep -q 'cuda:[01]' "$cuda_out"; then
    echo "ok $n - $name on $on: --device=cuda losses [${got% }] = --device=cpu's within $tol (max relative error ${verdict#ok })"
  else
    echo "not ok $n - $name on $on: --device=cuda [${got% }] vs --device=cpu [${want% }] (status $s1/$s2; ${verdict:-no losses})"
    tail -n 15 "$cuda_out" | sed 's/^/#   cuda: /'
    tail -n 5 "$cpu_out" | sed 's/^/#   cpu: /'
    rc=1
  fi
}

LLAMA=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=64 --num_heads=4 --num_kv_heads=2 --vocab_size=128
       --seq_len=16 --batch_size=2 --max_steps=4 --warmup_steps=1 --lr=1e-2 --validation_freq=2 --val_batches=1
       --skip_fit_check)
DEEPVIT=(recipes/deepvit_8b.lua --model=tiny --depth=2 --dim=32 --heads=2 --mlp_dim=64 --image_size=16
         --patch_size=8 --num_classes=4 --batch_size=2 --max_steps=4 --dropout=0 --validation_freq=2 --val_batches=1
         --skip_fit_check)
T5=(recipes/t5_3b.lua --model=tiny --num_layers=1 --d_model=32 --d_ff=64 --d_kv=8 --num_heads=4 --vocab_size=16
    --batch_size=2 --max_len=4 --max_steps=3 --warmup_steps=1 --log_every=1 --eval_examples=2 --skip_fit_check)
MNIST=(recipes/mnist.lua --epochs=1 --train_size=8 --test_size=2 --batch_size=4 --test_batch_size=2 --log_interval=1)
# GPT-2 trains through the Llama recipe; T5 fine-tunes on the example pairs (models/t5_pairs.lua).
GPT2=(recipes/llama2_7b.lua --model=gpt2-tiny --seq_len=16 --batch_size=2 --max_steps=4 --warmup_steps=1 --lr=1e-2
      --validation_freq=2 --val_batches=1 --skip_fit_check)
T5_PAIRS=(recipes/t5_3b.lua --model=tiny --num_layers=1 --d_model=32 --d_ff=64 --d_kv=8 --num_heads=4
          --data=examples/summaries/train.jsonl --val_data=examples/summaries/val.jsonl --source_len=32 --target_len=16
          --batch_size=2 --max_steps=3 --warmup_steps=1 --log_every=1 --eval_examples=2 --validation_freq=3
          --val_batches=1 --skip_fit_check)

for np in ${NPS:-1 2}; do
  compare "recipes/llama2_7b.lua (f32)" $np 1e-5 jsonl "${LLAMA[@]}" --mixed_precision=
  compare "recipes/deepvit_8b.lua (f32)" $np 1e-5 jsonl "${DEEPVIT[@]}" --mixed_precision=
  # T5 logs 4 decimals: equal to the last digit printed.
  compare "recipes/t5_3b.lua (f32, losses as logged: 4 decimals)" $np 1e-4 batch "${T5[@]}" --mixed_precision=
  # Data parallel: each rank a slice of every batch (dropout's masks too).
  compare "recipes/mnist.lua (f32, losses as logged: 6 decimals)" $np 1e-5 mnist "${MNIST[@]}"
  compare "recipes/llama2_7b.lua --model=gpt2-tiny (f32)" $np 1e-5 jsonl "${GPT2[@]}" --mixed_precision=
  compare "recipes/t5_3b.lua --data=pairs.jsonl (f32, 4 decimals as logged)" $np 1e-4 batch "${T5_PAIRS[@]}" \
    --mixed_precision=
done

# --device=auto with 2 ranks on a node where each process sees one GPU
# (a launcher binding one GPU per rank; in cudasim every process has its
# own simulated cuda:0): both train on cuda:0, the CPU's losses.
n=$((n + 1))
rm -f "$tmp"/*.jsonl
run 2 "${LLAMA[@]}" --mixed_precision= --device=cpu --metrics_file="$tmp/cpu.jsonl" >/dev/null 2>&1
out=$(DEVICES=1 run 2 "${LLAMA[@]}" --mixed_precision= --metrics_file="$tmp/auto.jsonl" 2>&1)
status=$?
want=$(losses jsonl /dev/null "$tmp/cpu.jsonl" | tr '\n' ' ')
got=$(losses jsonl /dev/null "$tmp/auto.jsonl" | tr '\n' ' ')
verdict=$(agree "$want" "$got" 1e-5)
if [ $status -eq 0 ] && [ "${verdict%% *}" = ok ] &&
   grep -q 'device: cuda:0 (2 ranks on this node see 1 GPU each: cuda:<local rank mod 1>' <<<"$out"; then
  echo "ok $n - --device=auto with 2 ranks seeing one GPU each: both on cuda:0, the CPU's losses within 1e-5 (${verdict#ok })"
else
  echo "not ok $n - --device=auto with 2 ranks seeing one GPU each (status $status): [$got] vs CPU [$want] ($verdict)"
  tail -n 10 <<<"$out" | sed 's/^/#   /'
  rc=1
fi

# The GPU default: --mixed_precision not given is bf16 on cuda, and the
# step log and the JSONL report the caching allocator's bytes.
n=$((n + 1))
out=$(run 1 "${LLAMA[@]}" --device=cuda --metrics_file="$tmp/bf16.jsonl" 2>&1)
status=$?
bf16=$(losses jsonl /dev/null "$tmp/bf16.jsonl" | tr '\n' ' ')
cpu=$(run 1 "${LLAMA[@]}" --device=cpu --mixed_precision=bf16 --metrics_file="$tmp/bf16cpu.jsonl" >/dev/null 2>&1;
      losses jsonl /dev/null "$tmp/bf16cpu.jsonl" | tr '\n' ' ')
close=$(agree "$cpu" "$bf16" 2e-2)
if [ $status -eq 0 ] && grep -q 'compute bf16, reduce bf16' <<<"$out" && grep -q 'mixed_precision = bf16' <<<"$out" &&
   grep -q 'cuda:0 memory: allocated [0-9.]* MiB, reserved [0-9.]* MiB, peak' <<<"$out" &&
   grep -q '"memory_reserved_bytes":[1-9]' "$tmp/bf16.jsonl" && [ "${close%% *}" = ok ]; then
  echo "ok $n - recipes/llama2_7b.lua --device=cuda defaults to bf16 mixed precision (losses [${bf16% }] = the CPU's in bf16 [${cpu% }] within 2e-2) and logs the device's allocated/reserved/peak bytes"
else
  echo "not ok $n - recipes/llama2_7b.lua --device=cuda GPU defaults (status $status, losses [$bf16] vs CPU bf16 [$cpu])"
  tail -n 15 <<<"$out" | sed 's/^/#   /'
  rc=1
fi

# A checkpoint saved on cuda at step 2 and resumed on cuda: the
# uninterrupted CPU run's losses (2 ranks, FULL_SHARD).
n=$((n + 1))
rm -rf "$tmp/ckpt" "$tmp"/*.jsonl
run 2 "${LLAMA[@]}" --mixed_precision= --device=cpu --metrics_file="$tmp/whole.jsonl" >/dev/null 2>&1
run 2 "${LLAMA[@]}" --mixed_precision= --device=cuda --checkpoint_dir="$tmp/ckpt" --checkpoint_freq=2 --max_steps=2 \
  --metrics_file="$tmp/parts.jsonl" >"$tmp/first.txt" 2>&1
s1=$?
run 2 "${LLAMA[@]}" --mixed_precision= --device=cuda --checkpoint_dir="$tmp/ckpt" --checkpoint_freq=2 \
  --resume_from_checkpoint --metrics_file="$tmp/parts.jsonl" >"$tmp/second.txt" 2>&1
s2=$?
want=$(losses jsonl /dev/null "$tmp/whole.jsonl" | tr '\n' ' ')
got=$(losses jsonl /dev/null "$tmp/parts.jsonl" | tr '\n' ' ')
same=$(agree "$want" "$got" 1e-5)
if [ $s1 -eq 0 ] && [ $s2 -eq 0 ] && [ "${same%% *}" = ok ] && [ "$(wc -w <<<"$got")" = 4 ] && grep -q 'checkpoint: resumed from' "$tmp/second.txt"; then
  echo "ok $n - recipes/llama2_7b.lua on 2 ranks: a checkpoint saved on cuda at step 2 and resumed on cuda gives the uninterrupted CPU run's losses [${got% }]"
else
  echo "not ok $n - recipes/llama2_7b.lua checkpoint on cuda and resume (status $s1/$s2): [$got] vs CPU [$want]"
  tail -n 10 "$tmp/second.txt" | sed 's/^/#   /'
  rc=1
fi

# recipes/generate.lua from that checkpoint: the same greedy ids on cuda
# as on the CPU.
n=$((n + 1))
GEN=(recipes/generate.lua --init_from="$tmp/ckpt" --prompt_ids='1,2,3;4,5' --max_new_tokens=6 --print_ids)
on_cpu=$(run 1 "${GEN[@]}" --device=cpu 2>&1 | grep '^ids')
on_cuda=$(run 1 "${GEN[@]}" --device=cuda 2>&1 | grep '^ids')
if [ -n "$on_cpu" ] && [ "$on_cpu" = "$on_cuda" ]; then
  echo "ok $n - recipes/generate.lua --device=cuda from the checkpoint: the CPU's greedy ids ($(echo $on_cuda))"
else
  echo "not ok $n - recipes/generate.lua --device=cuda [$(echo $on_cuda)] vs cpu [$(echo $on_cpu)]"
  rc=1
fi

# refused COMMENT EXPECTED NP ARGS...: exit status 2 before anything is
# built, rank 0 printing the one line.
refused() {
  local what=$1 want=$2 np=$3
  shift 3
  local out status
  out=$(run "$np" "$@" 2>&1)
  status=$?
  n=$((n + 1))
  if [ $status -ne 0 ] && grep -qF -- "$want" <<<"$out" &&
     ! grep -qE '^(\[rank [0-9]+\] )?Batch' <<<"$out"; then
    echo "ok $n - $what is refused: $want"
  else
    echo "not ok $n - $what is not refused with '$want' (status $status)"
    tail -n 8 <<<"$out" | sed 's/^/#   /'
    rc=1
  fi
}
refused "--device=cuda:1 on a machine with one GPU" "fsdp-lua: --device (cuda:1) is not on this machine, which has 1 CUDA device (cuda:0)" \
  1 "${LLAMA[@]}" --device=cuda:1 --validate_options
SMALL=(recipes/llama2_7b.lua --num_layers=2 --hidden_width=64 --num_heads=4 --vocab_size=128 --seq_len=16
       --batch_size=2 --max_steps=2 --warmup_steps=1 --device=cuda --memory_limit_mb=1)
refused "--memory_limit_mb=1 on cuda (the fit check)" "> 1.0 MiB available (--memory_limit_mb=1)" 1 "${SMALL[@]}"
refused "--memory_limit_mb=1 on cuda past the fit check" "out of memory on cuda:0" 1 "${SMALL[@]}" --skip_fit_check
refused "--plan on a GPU without a profile" "--plan_device is needed with --plan on this GPU" \
  1 "${LLAMA[@]}" --device=cuda --plan

exit $rc
