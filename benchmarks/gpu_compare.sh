#!/usr/bin/env bash
# benchmarks/gpu_compare.sh: issue 7's benchmark pair on one GPU: the same
# Llama trained by fsdp-lua (benchmarks/llama_gpu.lua) and by PyTorch eager
# (benchmarks/llama_torch.py), with the same flags.
#
#   benchmarks/gpu_compare.sh [flags for both scripts]   # e.g. --model=TinyLlama-1.1B --steps=20
#
# 1. each script finds its own largest batch (--find_batch) and measures it;
# 2. both run again, each in a fresh process, at the smaller of the two
#    batches, so peak memory is compared for the same batch;
# 3. a table: tokens/s, MFU and peak GiB of each, against issue 7's targets
#    (fsdp-lua tokens/s >= PyTorch's, MFU >= 45%, peak within 10% of
#    PyTorch's). Missed targets are reported, not failed: the exit status is
#    0 when both scripts produced their RESULT lines, 1 otherwise.
#
# Logs and RESULT lines go to $OUT (the device tool's folder) or
# build/gpu_compare/. The fsdp-lua binary is build/gpu_bundle/bin/fsdp-lua
# when benchmarks/gpu_bundle.sh made one (with its libraries), else
# build/bin/fsdp-lua; CUDA libraries it cannot find are searched for under
# /usr/local/cuda* and Python's nvidia-* packages. Set FSDP_BIN or PYTHON to
# override. GPU_COMPARE_TIMEOUT bounds each of the four runs (seconds,
# default 600).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-build/gpu_compare}
mkdir -p "$out"
PYTHON=${PYTHON:-python3}

# --- the fsdp-lua executable and its libraries ---------------------------------------
if [ -z "${FSDP_BIN:-}" ]; then
  if [ -x build/gpu_bundle/bin/fsdp-lua ]; then
    FSDP_BIN=build/gpu_bundle/bin/fsdp-lua
    source build/gpu_bundle/env.sh # its libraries, Lua modules and the CUDA libraries found here
  else
    FSDP_BIN=build/bin/fsdp-lua
  fi
fi
# The CUDA libraries are the plugin's (libfsdp_cuda.so), not the core's:
# look for what either lacks.
missing() { ldd "$FSDP_BIN" "$(dirname "$FSDP_BIN")/../lib/libfsdp.so" \
              "$(dirname "$FSDP_BIN")/../lib/libfsdp_cuda.so" 2>/dev/null |
              awk '/not found/ {print $1}' | grep -v '^libfsdp' | sort -u; }
if [ -n "$(missing)" ]; then
  roots=(/usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
  while IFS= read -r d; do roots+=("$d/nvidia"); done < <("$PYTHON" -c \
    'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
  for so in $(missing); do
    hit=$(find "${roots[@]}" -name "$so" 2>/dev/null | head -1 || true)
    [ -n "$hit" ] && export LD_LIBRARY_PATH="$(dirname "$hit")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  [ -n "$(missing)" ] && echo "gpu_compare: $FSDP_BIN still lacks: $(missing | tr '\n' ' ')" >&2
fi
echo "gpu_compare: fsdp-lua = $FSDP_BIN; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null

# run NAME COMMAND...: log to $out/NAME.log, echo the RESULT line's json (or nothing).
run() {
  local name=$1; shift
  echo "gpu_compare: $name: $*" >&2
  timeout -k 5 "${GPU_COMPARE_TIMEOUT:-600}" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local line
  line=$(grep '^RESULT ' "$out/$name.log" | tail -1)
  if [ -z "$line" ]; then
    echo "gpu_compare: $name failed (status $rc); the end of $out/$name.log:" >&2
    tail -15 "$out/$name.log" >&2
    return 1
  fi
  echo "${line#RESULT }"
}
field() { "$PYTHON" -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

lua_find=$(run lua_find_batch "$FSDP_BIN" benchmarks/llama_gpu.lua --find_batch "$@")
torch_find=$(run torch_find_batch "$PYTHON" benchmarks/llama_torch.py --find_batch "$@")
if [ -z "$lua_find" ] || [ -z "$torch_find" ]; then
  echo "gpu_compare: no comparison: a --find_batch run failed (logs in $out)" >&2
  exit 1
fi
bl=$(field "$lua_find" batch); bt=$(field "$torch_find" batch)
b=$(( bl < bt ? bl : bt ))
echo "gpu_compare: largest batch: fsdp-lua $bl, PyTorch $bt; comparing at batch $b"
lua_same=$(run lua_batch$b "$FSDP_BIN" benchmarks/llama_gpu.lua "$@" --batch="$b")
torch_same=$(run torch_batch$b "$PYTHON" benchmarks/llama_torch.py "$@" --batch="$b")
if [ -z "$lua_same" ] || [ -z "$torch_same" ]; then
  echo "gpu_compare: no comparison: a run at batch $b failed (logs in $out)" >&2
  exit 1
fi

printf '%s\n' "$lua_find" "$torch_find" "$lua_same" "$torch_same" > "$out/results.jsonl"
"$PYTHON" - "$out/results.jsonl" <<'EOF'
import json, sys
lf, tf, ls, ts = [json.loads(l) for l in open(sys.argv[1])]
gib = 2.0 ** 30
print()
print(f"{lf['model']}, seq {lf['seq']}, {lf['dtype']}, {lf['steps']} measured steps after {lf['warmup']}; "
      f"parameters: fsdp-lua {lf['params']:,}, PyTorch {tf['params']:,}"
      + ("" if lf['params'] == tf['params'] else "  <-- DIFFERENT MODELS"))
print(f"{'run':<28} {'batch':>5} {'ms/step':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9} {'reserved':>9}")
for name, r in (("fsdp-lua, its largest batch", lf), ("PyTorch, its largest batch", tf),
                ("fsdp-lua, same batch", ls), ("PyTorch, same batch", ts)):
    print(f"{name:<28} {r['batch']:>5} {r['step_ms']:>9.1f} {r['tokens_per_s']:>10.0f} {r['tflops']:>8.1f} "
          f"{100 * r['mfu']:>5.1f}% {r['peak_bytes'] / gib:>9.2f} {r['reserved_bytes'] / gib:>9.2f}")
speed = ls['tokens_per_s'] / ts['tokens_per_s']
mem = ls['peak_bytes'] / ts['peak_bytes'] if ts['peak_bytes'] else float('nan')
best = lf['tokens_per_s'] / tf['tokens_per_s']
def verdict(ok): return "met" if ok else "MISSED"
print()
print(f"targets (issue 7), at the same batch {ls['batch']}:")
print(f"  tokens/s fsdp-lua / PyTorch = {speed:.3f}   (target >= 1.0)  {verdict(speed >= 1.0)}")
print(f"  MFU fsdp-lua = {100 * ls['mfu']:.1f}%   (target >= 45%)  {verdict(ls['mfu'] >= 0.45)}")
print(f"  peak memory fsdp-lua / PyTorch = {mem:.3f}   (target <= 1.10)  {verdict(mem <= 1.10)}")
print(f"  (each at its own largest batch: tokens/s ratio {best:.3f}, batches {lf['batch']} / {tf['batch']})")
p = ls.get('attention_paths')
if p:
    print(f"  fsdp-lua attention: cuDNN {p['cudnn_forward']} fwd / {p['cudnn_backward']} bwd, "
          f"kernels {p['kernel_forward']} fwd / {p['kernel_backward']} bwd"
          + ("  <-- cuDNN declined: rerun with FSDP_CUDNN_DEBUG=1" if p['kernel_forward'] else ""))
EOF
echo "gpu_compare: logs and results.jsonl in $out"
exit 0
