#!/usr/bin/env bash
# tests/gpu/run.sh: the checks that need a real GPU, as one script for the
# lent GPU machine (issue 22). That machine has the NVIDIA driver, the CUDA
# libraries and PyTorch but none of Debian's packages, so the build travels
# as benchmarks/gpu_bundle.sh's archive: here, after ./build.sh,
#
#   benchmarks/gpu_bundle.sh             # writes build/gpu_bundle.tar.xz
#   (device tool) carry build/gpu_bundle.tar.xz, run: tests/gpu/run.sh
#
# Stages, in order (arguments pick some; default all), each bounded so the
# whole run ends by itself inside GPU_DEADLINE seconds (default 540): a
# stage that no longer fits is skipped and says so. The 2-rank recipe runs
# (slow: host copies) start first and run beside the specs.
#   info     the device, driver, CUDA, cuDNN, NCCL and glibc versions; what
#            the bundle lacks there
#   specs    the GPU specs (every op against the CPU, the large-kernel,
#            training, events, pinned memory, offload, zero-size, LoRA,
#            profiler, windowed/packed attention and MoE specs), one process each, in parallel; beside them the
#            collectives on cuda tensors under mpirun (2 and 4 ranks sharing
#            the GPU: NCCL refuses them, so host copies; and FSDP_NCCL=0)
#   recipes  recipes/llama2_7b.lua on a ~1B Llama (Llama-3.2-1B with a
#            32000-token vocabulary, 1,038,682,112 parameters) on cuda, bf16
#            (the GPU default) and f32, 1 rank and 2 ranks sharing the GPU,
#            against the CPU's losses (tests/gpu/llama_1b_cpu.jsonl)
#   bench    benchmarks/gpu_compare.sh: Llama-3.2-1B, bf16, seq 2048, no
#            checkpointing, the largest batch of each, fsdp-lua against
#            PyTorch eager
#   profile  the training step's kernels by GPU time (Nsight Compute, one
#            duration metric per kernel) for the top kernels
# Logs go to $OUT (the device tool's folder; at most 8 files come back) or
# build/gpu_run: one file per stage and summary.txt, which is also printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-build/gpu_run}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
start=$(date +%s)
deadline=$((start + ${GPU_DEADLINE:-540}))
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - $(date +%s))); }

# --- the bundle --------------------------------------------------------------------
if [ ! -x build/gpu_bundle/bin/fsdp-lua ]; then
  [ -f build/gpu_bundle.tar.xz ] || { say "no build/gpu_bundle.tar.xz: run benchmarks/gpu_bundle.sh here first"; exit 1; }
  python3 -c 'import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    build/gpu_bundle.tar.xz build || { say "cannot unpack build/gpu_bundle.tar.xz"; exit 1; }
fi
source build/gpu_bundle/env.sh
EXE=$root/build/gpu_bundle/bin/fsdp-lua
export FSDP_LUA=$EXE FSDP_PROGRESS=0 FSDP_COLLECTIVE_TIMEOUT=${FSDP_COLLECTIVE_TIMEOUT:-60}

STAGES=${*:-info specs recipes bench profile}
want() { [[ " $STAGES " == *" $1 "* ]]; }
# fits STAGE SECONDS: true when SECONDS still fit before the deadline.
fits() {
  if [ "$(left)" -lt "$2" ]; then say "$1: skipped: $(left) s left of GPU_DEADLINE, it needs $2"; return 1; fi
}
# counts LOG: "N ok, N failed, N skipped" of a TAP log.
counts() {
  local p f s
  p=$(grep -cE '^ok( [0-9]+)? ' "$1"); s=$(grep -ciE '^ok( [0-9]+)? .*# *skip' "$1")
  f=$(grep -cE '^not ok( [0-9]+)? ' "$1")
  echo "$((p - s)) passed, $f failed, $s skipped"
}

# --- info --------------------------------------------------------------------------
if want info; then
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    nvidia-smi | head -4 | tail -2
    nvcc --version 2>/dev/null | tail -2
    python3 - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "nccl", ".".join(map(str, torch.cuda.nccl.version())), torch.cuda.get_device_name(0))
EOF
    ldd --version | head -1
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "not found by the bundle:"; ldd "$EXE" build/gpu_bundle/lib/*.so | grep 'not found' | sort -u
    "$EXE" -e 'local f = require "fsdp"; print("fsdp-lua", f.version, f.build_info)
      print("cuda:", f.cuda.status(), "cuDNN loaded:", f.cuda.library_version("cudnn"))'
    command -v mpirun
  } >"$out/info.log" 2>&1
  say "info: $(head -2 "$out/info.log" | tail -1)"
  grep -E '^(torch|fsdp-lua|cuda:|ldd)' "$out/info.log" | tee -a "$summary"
  ldconfig -p | grep -E 'libcudnn.so.9 |libcublasLt.so.13 ' | tee -a "$summary"
fi

# --- recipes (defined here: the 2-rank runs go beside the specs) -----------
# The CPU reference, tests/gpu/llama_1b_cpu.jsonl, is this config's metrics
# file from one CPU process (f32, batch 4; about 4 minutes on 2 cores):
#   build/bin/fsdp-lua "${RECIPE[@]}" --device=cpu --batch_size=4 \
#     --metrics_file=tests/gpu/llama_1b_cpu.jsonl
# Two ranks of batch 2 see the same global batch of 4. Two ranks share the
# one GPU, so NCCL refuses them and collectives go through host copies
# (MPI): slow for 1B parameters (about 15 s a step), so they run 3 steps
# (--max_steps=3: the first three losses depend only on the warmup's lr,
# which does not depend on --max_steps, so they are the CPU's first three).
RECIPE=(recipes/llama2_7b.lua --model=Llama-3.2-1B --vocab_size=32000 --seq_len=128 --max_steps=6
        --warmup_steps=2 --log_every=1 --validation_freq=0)
losses() { grep '"type":"train"' "$1" | sed 's/.*"loss":\([-0-9.e+]*\).*/\1/' | tr '\n' ' '; }
# compare NAME TOL JSONL STEPS: the run's losses against the CPU's first STEPS.
compare() {
  local got want
  got=$(losses "$3" 2>/dev/null); want=$(losses tests/gpu/llama_1b_cpu.jsonl | cut -d' ' -f1-"$4")
  awk -v g="$got" -v w="$want" -v tol="$2" -v name="$1" 'BEGIN {
    n = split(g, a, " "); m = split(w, b, " "); worst = 0
    if (n != m || n == 0) { printf "recipes: %s: FAILED: %d losses [%s], the CPU %d\n", name, n, g, m; exit }
    for (i = 1; i <= n; i++) { e = (a[i] - b[i]) / b[i]; if (e < 0) e = -e; if (e > worst) worst = e }
    printf "recipes: %s: %s, losses [%s] vs the CPU [%s], max relative error %.2e (tolerance %g)\n",
      name, worst <= tol ? "ok" : "FAILED", g, w, worst, tol }'
}
# recipe_run NP PREC CAP: one run, its log in $out/recipe_NP_PREC.log, its
# verdict printed.
recipe_run() {
  local np=$1 prec=$2 cap=$3 log=$out/recipe_$1_$2.log jsonl=$out/recipe_$1_$2.jsonl t0 st
  local steps=$(( np == 1 ? 6 : 3 ))
  local args=("${RECIPE[@]}" --max_steps=$steps --device=cuda --batch_size=$((4 / np))
              --metrics_file="$jsonl")
  [ "$prec" = f32 ] && args+=(--mixed_precision=)
  rm -f "$jsonl"
  echo "### $np rank(s), $prec: ${args[*]}" >"$log"
  t0=$(date +%s)
  if [ "$np" = 1 ]; then
    timeout -k 5 "$cap" "$EXE" "${args[@]}" >>"$log" 2>&1
  else
    timeout -k 5 "$cap" mpirun -np "$np" "$EXE" "${args[@]}" >>"$log" 2>&1
  fi
  st=$?
  echo "### status $st, $(( $(date +%s) - t0 )) s" >>"$log"
  compare "$np rank(s), $prec, status $st, $(( $(date +%s) - t0 )) s" \
    "$([ "$prec" = f32 ] && echo 1e-4 || echo 2e-2)" "$jsonl" "$steps"
}
# recipes_done: the runs' logs and metrics into two files ($OUT returns 8).
recipes_done() {
  cat "$out"/recipe_*.log >>"$out/recipes.log" 2>/dev/null
  cat "$out"/recipe_*.jsonl >>"$out/recipes.jsonl" 2>/dev/null
  rm -f "$out"/recipe_*.log "$out"/recipe_*.jsonl
}
two_rank_pids=()
if want recipes && fits "recipes: 2 ranks" 90; then
  cap=$(( $(left) < 300 ? $(left) / 2 : 150 ))
  for prec in bf16 f32; do
    recipe_run 2 $prec "$cap" >"$out/verdict_2_$prec.txt" &
    two_rank_pids+=($!)
  done
fi

# --- specs and collectives ---------------------------------------------------------
if want specs && fits specs 60; then
  cap=$(( $(left) < 160 ? $(left) - 10 : 150 ))
  tmp=$(mktemp -d)
  specs=(backend_ops_spec cuda_elem_spec cuda_linear_spec cuda_fused_spec cuda_training_spec
         event_spec cuda_host_spec cuda_offload_spec empty_ops_spec lora_spec cuda_plugin_spec
         bench_gpu_spec profiler_spec attention_window_spec attention_packed_spec moe_spec bytes_moved_spec
         linear_cross_entropy_spec cuda_launches_spec add_rms_norm_spec)
  pids=()
  for s in "${specs[@]}"; do
    # FSDP_CUDNN_DEBUG=1, FSDP_CUBLAS_DEBUG=1: a line for each configuration
    # cuDNN's attention or cuBLASLt's epilogue declined, with the reason.
    FSDP_CUDNN_DEBUG=1 FSDP_CUBLAS_DEBUG=1 OMP_NUM_THREADS=2 timeout -k 5 "$cap" "$EXE" \
      tests/busted.lua -o TAP "tests/lua/$s.lua" >"$tmp/$s.log" 2>&1 &
    pids+=($!)
  done
  # Collectives on cuda tensors beside them: every rank on cuda:0.
  (
    for np in 2 4; do
      echo "### mpirun -np $np tests/mpi/cuda_collectives.lua (the library NCCL or host copies, as decided)"
      timeout -k 5 $((cap / 5)) mpirun -np $np "$EXE" tests/mpi/cuda_collectives.lua 2>&1
      echo "### status $?"
      echo "### FSDP_NCCL=0 mpirun -np $np tests/mpi/cuda_collectives.lua"
      FSDP_NCCL=0 timeout -k 5 $((cap / 5)) mpirun -np $np "$EXE" tests/mpi/cuda_collectives.lua 2>&1
      echo "### status $?"
    done
  ) >"$out/mpi.log" 2>&1 &
  mpi_pid=$!
  for i in "${!specs[@]}"; do
    wait "${pids[$i]}"; st=$?
    s=${specs[$i]}
    { echo "### tests/lua/$s.lua (status $st)"; cat "$tmp/$s.log"; } >>"$out/specs.log"
    say "specs: $s: $(counts "$tmp/$s.log")$([ $st -ne 0 ] && echo ", status $st")"
  done
  wait "$mpi_pid"
  say "specs: all: $(counts "$out/specs.log")"
  # The attention specs again with the newest cuDNN on the machine first
  # (PyTorch's wheel), where the system's is older: the other side of the
  # version rule (tests/lua: fsdp.testing.cudnn_takes_backward).
  newest=$(find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
             -path '*cudnn*' -name 'libcudnn.so.9' 2>/dev/null | head -1)
  if [ -n "$newest" ] && fits "specs: newest cuDNN" 40; then
    LD_LIBRARY_PATH="$(dirname "$newest"):$LD_LIBRARY_PATH" FSDP_CUDNN_DEBUG=1 timeout -k 5 60 "$EXE" \
      tests/busted.lua -o TAP tests/lua/cuda_fused_spec.lua tests/lua/backend_ops_spec.lua \
      >"$out/specs_newest_cudnn.tmp" 2>&1
    v=$(LD_LIBRARY_PATH="$(dirname "$newest"):$LD_LIBRARY_PATH" "$EXE" -e \
          'print(require("fsdp").cuda.library_version("cudnn"))')
    say "specs with $newest (cuDNN $v): $(counts "$out/specs_newest_cudnn.tmp")"
    grep -h '^not ok' "$out/specs_newest_cudnn.tmp" | head -10 | tee -a "$summary"
    { echo "### with $newest"; cat "$out/specs_newest_cudnn.tmp"; } >>"$out/specs.log"
    rm -f "$out/specs_newest_cudnn.tmp"
  fi
  say "mpi: $(counts "$out/mpi.log"); statuses: $(grep '^### status' "$out/mpi.log" | cut -d' ' -f3 | tr '\n' ' ')"
  grep -h 'not used for cuda tensors\|^not ok\|^# \[rank 0\]' "$out/mpi.log" | cut -c1-300 | sort | uniq -c |
    head -16 | tee -a "$summary"
  grep -h '^not ok' "$out/specs.log" | head -40 | tee -a "$summary"
  rm -rf "$tmp"
fi

# --- recipes: the 1-rank runs, then the 2-rank ones started above ---------------
if want recipes; then
  for prec in bf16 f32; do
    fits "recipes: 1 rank $prec" 40 && recipe_run 1 $prec 75 | tee -a "$summary"
  done
  for pid in "${two_rank_pids[@]}"; do wait "$pid"; done
  cat "$out"/verdict_2_*.txt 2>/dev/null | tee -a "$summary"
  rm -f "$out"/verdict_2_*.txt
  recipes_done
fi

# --- bench -------------------------------------------------------------------------
if want bench && fits bench 90; then
  GPU_COMPARE_TIMEOUT=$(( ($(left) - 10) / 4 )) OUT=$out/bench benchmarks/gpu_compare.sh \
    --steps=${BENCH_STEPS:-8} --warmup=3 --max_batch=${BENCH_MAX_BATCH:-32} >"$out/bench.log" 2>&1
  st=$?
  for f in "$out"/bench/*.log; do { echo "### $f"; cat "$f"; } >>"$out/bench.log"; done
  rm -rf "$out/bench"
  say "bench: status $st"
  sed -n '/^Llama\|^run \|^fsdp-lua,\|^PyTorch,\|targets\|^  \|^memory-bound\|^kernel launches/p' \
    "$out/bench.log" | head -25 |
    tee -a "$summary"
fi

# --- profile -----------------------------------------------------------------------
# Every kernel of two training steps (one warmup, one measured) at batch
# PROFILE_BATCH, timed by Nsight Compute; the summary per kernel name
# orders them by total time.
if want profile && fits profile 45; then
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu" ]; then
    say "profile: no ncu on this machine"
  else
    timeout -k 5 $(( $(left) - 5 )) "$ncu" --metrics gpu__time_duration.sum --clock-control none \
      --cache-control none --print-summary per-kernel --csv \
      "$EXE" benchmarks/llama_gpu.lua --batch=${PROFILE_BATCH:-8} --steps=1 --warmup=1 >"$out/profile.log" 2>&1
    st=$?
    # The bytes the same step's memory-bound ops move, counted on meta
    # ([Note: bytes moved]): beside the kernels' times, how near each op
    # family runs to the memory bandwidth.
    "$EXE" benchmarks/step_bytes.lua --batch=${PROFILE_BATCH:-8} >"$out/step_bytes.tmp" 2>&1
    say "profile: status $st; the top kernels by total GPU time (ms, calls, name):"
    python3 - "$out/profile.log" "$out/step_bytes.tmp" <<'EOF' | tee -a "$summary"
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("  no kernel summary (see profile.log)"); sys.exit()
head, body = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
tot = {}
for r in body:
    if r[col["Metric Name"]] != "gpu__time_duration.sum": continue
    name = r[col["Kernel Name"]][:110]
    unit = r[col["Metric Unit"]]
    scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
             "second": 1e3, "s": 1e3}[unit]
    avg = float(r[col["Average"]].replace(",", "")) * scale
    n = int(r[col["Invocations"]]) if "Invocations" in col else 1
    t, c = tot.get(name, (0.0, 0))
    tot[name] = (t + avg * n, c + n)
all_ms = sum(t for t, _ in tot.values())
launches = sum(c for _, c in tot.values())
# (two steps: one warmup, one measured; per step is half)
print(f"  all kernels: {all_ms:.1f} ms in {launches} launches over 2 steps ({all_ms / 2:.1f} ms, {launches // 2} launches per step)")
for name, (t, c) in sorted(tot.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"  {t:9.2f} {100 * t / all_ms:5.1f}% {c:6d}  {name}")
# Op families: kernel names (first match wins) -> the ops step_bytes.lua
# counts (one step; the profile holds two, so kernel times are halved).
import re
families = [("add", r"binary"), ("adamw", r"update|adamw"), ("silu_mul backward", r"silu_mul_bw"),
            ("silu_mul", r"silu_mul"), ("cross_entropy backward", r"cross_entropy_backward"),
            ("cross_entropy", r"cross_entropy|loss_total"),
            ("rms_norm backward", r"rms_norm_dx|column_|add_rms_norm_bw"), ("rms_norm", r"rms_norm"),
            ("rotary", r"rotary"), ("copy", r"copy|move|cast")]
counted = {}
for line in open(sys.argv[2]):
    m = re.match(r"(\S.*?)\s+(\d+)\s+([\d.]+)\s+[\d.]+%", line)
    if m:
        op = "rotary" if m.group(1).startswith("apply_rotary") else m.group(1)
        counted[op] = counted.get(op, 0.0) + float(m.group(3))
ms = {}
for name, (t, c) in tot.items():
    fam = next((f for f, rx in families if re.search(rx, name)), None)
    if fam: ms[fam] = ms.get(fam, 0.0) + t / 2
if counted:
    print("  memory-bound ops per step: kernel ms, GB counted (benchmarks/step_bytes.lua), GB/s, % of 3.35 TB/s")
    tms = tgb = 0.0
    for fam, _ in families:
        if fam not in ms or fam not in counted: continue
        gb = counted[fam]; tms += ms[fam]; tgb += gb
        bw = gb / ms[fam] * 1e3
        print(f"  {fam:24s} {ms[fam]:8.2f} ms {gb:8.2f} GB {bw:8.0f} GB/s {100 * bw / 3350:5.1f}%")
    if tms > 0:
        bw = tgb / tms * 1e3
        print(f"  {'these ops':24s} {tms:8.2f} ms {tgb:8.2f} GB {bw:8.0f} GB/s {100 * bw / 3350:5.1f}%")
EOF
    rm -f "$out/step_bytes.tmp"
  fi
fi
say "tests/gpu/run.sh: done in $(( $(date +%s) - start )) s"
