#!/usr/bin/env bash
# benchmarks/cpu_compare.sh: fsdp-lua against PyTorch on this machine's CPU
# (issue 21): GPT-2 124M (batch 4 x 64) and the small Llama (batch 4 x 256),
# a full training step each (forward, loss, backward, AdamW), in f32 and in
# bf16 mixed precision (f32 weights and AdamW, bf16 compute: fsdp-lua's
# mixed_precision='bf16' against PyTorch's CPU autocast).
#
#   benchmarks/cpu_compare.sh [ROUNDS] [PRECISIONS]   default 3 "f32 bf16"
#
# Each round runs, one after the other, fsdp-lua (benchmarks/train_step.lua),
# PyTorch eager and PyTorch with torch.compile (benchmarks/torch_cpu.py), so
# whatever else loads the machine falls on all three alike; the table has
# the medians over rounds of each round's median step, and fsdp-lua's
# speed-up over the faster PyTorch: the ratio of those medians, and each
# round's own ratio with their median. Both sides get the same threads
# (OMP_NUM_THREADS, default the cores) and PyTorch its fastest CPU forms
# (scaled_dot_product_attention, fused AdamW).
#
# The f32 rows end with the ceiling: benchmarks/fma_peak.c (compiled here
# with the system's cc) measures the machine's f32 multiply-add peak
# before and after the rounds, and each f32 model's FLOPs at that peak are
# the step no implementation can beat; the table says what fraction of it
# a step 1.3x the faster PyTorch would need. The bf16 rows do the same
# with the AVX512-BF16 dot-product peak where the CPU has that and no AMX
# tiles (AMX's peak, far above it, is not measured).
#
# FSDP_CPU_ISA (avx2, avx512, ...; [Note: CPU ISA levels] in
# core/base/cpu_isa.c) caps both sides alike: fsdp-lua by itself, PyTorch
# through ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA and
# MKL_ENABLE_INSTRUCTIONS, and the peak is measured with that level's
# vectors; the table's header names the level and the CPU.
#
# PyTorch comes from PyPI into a virtual environment of its own
# ($FSDP_TORCH_VENV, default /var/tmp/fsdp-torch-venv; made on first use,
# a large download): it is never a dependency of the build or the tests.
# Logs and RESULT lines: $OUT or build/cpu_compare.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
PRECISIONS=${2:-f32 bf16}
VENV=${FSDP_TORCH_VENV:-/var/tmp/fsdp-torch-venv}
out=${OUT:-build/cpu_compare}
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}

[ -x "$EXE" ] || { echo "cpu_compare: $EXE is missing: run ./build.sh first" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  echo "cpu_compare: installing PyTorch from PyPI into $VENV (once)" >&2
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch numpy ||
    { echo "cpu_compare: could not install torch into $VENV (python3-venv, network to PyPI?)" >&2; exit 1; }
fi
PY=$VENV/bin/python

: >"$out/results.jsonl"
# run NAME COMMAND...: its log in $out/NAME.log, its RESULT lines appended
# with the round ($r) they belong to.
run() {
  local name=$1; shift
  echo "cpu_compare: $name: $*" >&2
  "$@" >"$out/$name.log" 2>&1 || { echo "cpu_compare: $name failed; the end of its log:" >&2
                                    tail -5 "$out/$name.log" >&2; return 1; }
  sed -n "s/^RESULT {/{\"round\": $r, /p" "$out/$name.log" >>"$out/results.jsonl"
}
# fma_peak: the machine's f32 multiply-add rate, appended to fma_peak.jsonl.
# The level in force (FSDP_CPU_ISA, or the CPU's own) for both sides.
level=$("$EXE" -e "io.write(require('fsdp').cpu_isa().level)") || exit 1
isa_text=$("$EXE" -e "io.write(require('fsdp').cpu_isa().text)")
case $level in
  avx2) export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  avx512) export ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE MKL_ENABLE_INSTRUCTIONS=AVX512 ;;
  avx512_bf16) export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 ;;
esac
echo "cpu_compare: CPU level $isa_text" >&2
# torch.compile's kernels are cached per level: on 2026-12-06 the compiled
# f32 step aborted with "malloc_consolidate(): invalid chunk size" in both
# rounds while reading the shared default cache (/tmp/torchinductor_$USER,
# written by runs at other levels), and ran with a fresh one.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$VENV/inductor-cache/$level}

: >"$out/fma_peak.jsonl"
fma=$out/fma_peak
case $level in
  avx2|baseline) vflag=-mfma ;;
  avx512) vflag=-mavx512f ;;
  avx512_bf16) vflag="-mavx512f -mavx512bf16" ;;
  *) vflag=-mavx512f ;; # amx: its tiles' peak, far above, is not measured
esac
cc -O2 -fopenmp $vflag benchmarks/fma_peak.c -o "$fma" 2>"$out/fma_peak.build.log" ||
  { echo "cpu_compare: could not build benchmarks/fma_peak.c (no ceiling line): see $out/fma_peak.build.log" >&2; fma=; }
fma_peak() { [ -n "$fma" ] && "$fma" | sed -n 's/^RESULT //p' >>"$out/fma_peak.jsonl"; }

status=0
fma_peak
for r in $(seq 1 "$ROUNDS"); do
  for p in $PRECISIONS; do
    run "fsdp-lua.$p.$r" "$EXE" benchmarks/train_step.lua --precision="$p" || status=1
    run "torch-eager.$p.$r" "$PY" benchmarks/torch_cpu.py --mode=eager --precision="$p" || status=1
    run "torch-compile.$p.$r" "$PY" benchmarks/torch_cpu.py --mode=compile --precision="$p" || status=1
  done
done

fma_peak

"$PY" - "$out/results.jsonl" "$ROUNDS" "$out/fma_peak.jsonl" "$isa_text" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"CPU level: {sys.argv[4]}")
impls = ["fsdp-lua", "torch-eager", "torch-compile"]
order = {"f32": 0, "bf16": 1}
cases = sorted({(r.get("precision", "f32"), r["model"]) for r in rows}, key=lambda c: (order.get(c[0], 9), c[1]))
print()
sg = [r["sgemm_gflops"] for r in rows if r.get("sgemm_gflops")]
print(f"{sys.argv[2]} rounds, medians; this machine's sgemm rate (fsdp-lua's measure): "
      f"{statistics.median(sg):.0f} GFLOP/s" if sg else "")
peak_rows = [json.loads(l) for l in open(sys.argv[3]) if l.strip()]
peak = max((p["fma_peak_gflops"] for p in peak_rows), default=None)
bf16_peak = max((p["bf16_dot_peak_gflops"] for p in peak_rows if "bf16_dot_peak_gflops" in p), default=None)
if peak:
    print(f"f32 multiply-add peak (benchmarks/fma_peak.c, best before and after the rounds): {peak:.0f} GFLOP/s"
          + (f"; bf16 dot-product peak (AVX512-BF16): {bf16_peak:.0f} GFLOP/s" if bf16_peak else ""))
print(f"{'model':<28} {'precision':<9} {'implementation':<15} {'params':>12} {'ms/step':>8} {'forward':>8} "
      f"{'backward':>8} {'optim':>6} {'tokens/s':>9} {'GFLOP/s':>8}")
for prec, m in cases:
    ms = {}
    for impl in impls:
        rs = [r for r in rows if r["model"] == m and r["impl"] == impl and r.get("precision", "f32") == prec]
        if not rs:
            continue
        ms[impl] = statistics.median(r["ms"] for r in rs)
        gf = statistics.median(r["gflops"] for r in rs)
        ph = [statistics.median(r[k] for r in rs) for k in ("fwd_ms", "bwd_ms", "opt_ms")]
        print(f"{m:<28} {prec:<9} {impl:<15} {rs[0]['params']:>12,} {ms[impl]:>8.0f} {ph[0]:>8.0f} {ph[1]:>8.0f} "
              f"{ph[2]:>6.0f} {rs[0]['batch'] * rs[0]['seq'] * 1e3 / ms[impl]:>9.0f} {gf:>8.1f}")
    torch_best = min((ms[i] for i in ("torch-eager", "torch-compile") if i in ms), default=None)
    if "fsdp-lua" in ms and torch_best:
        # Each round's ratio too: the rounds interleave the three, so a
        # machine that slows down between rounds moves a round's three alike.
        per_round = []
        for rnd in sorted({r.get("round") for r in rows}):
            got = {i: [r["ms"] for r in rows if r["model"] == m and r["impl"] == i and r.get("round") == rnd
                       and r.get("precision", "f32") == prec] for i in impls}
            if got["fsdp-lua"] and (got["torch-eager"] or got["torch-compile"]):
                per_round.append(min(got["torch-eager"] + got["torch-compile"]) / got["fsdp-lua"][0])
        print(f"{'':<28} {prec:<9} fsdp-lua is {torch_best / ms['fsdp-lua']:.2f}x the faster PyTorch "
              f"(ratio of the medians; rounds: {', '.join(f'{x:.2f}' for x in per_round)}, median "
              f"{statistics.median(per_round):.2f}; target >= 1.3)")
        ours = [r for r in rows if r["model"] == m and r["impl"] == "fsdp-lua" and r.get("precision", "f32") == prec]
        top = {"f32": peak, "bf16": bf16_peak}.get(prec)
        if top and ours:
            # The model's FLOPs (fsdp-lua's count, as its GFLOP/s column) at the peak.
            gflop = statistics.median(r["gflops"] * r["ms"] / 1e3 for r in ours)
            floor = gflop / top * 1e3
            print(f"{'':<28} {prec:<9} ceiling: {gflop:.1f} GFLOP at the peak take {floor:.0f} ms, at most "
                  f"{torch_best / floor:.2f}x the faster PyTorch; fsdp-lua runs at {floor / ms['fsdp-lua']:.0%} "
                  f"of the peak, and 1.3x would need {1.3 * floor / torch_best:.0%}")
        floors = [r["floor_ms"] / r["ms"] for r in ours if r.get("floor_ms")]
        if floors:
            # The issue's GEMM floor: products at the GEMM rate, AdamW at the
            # memory's rate, both measured in that round (train_step.lua).
            # (issue 21's target is for f32; in bf16 the floor leaves out
            # what mixed precision adds: the casts of weights and gradients)
            target = "target >= 85%" if prec == "f32" else "no target: mixed precision's casts are not in it"
            print(f"{'':<28} {prec:<9} GEMM floor: fsdp-lua runs at {statistics.median(floors):.0%} of it "
                  f"(median of the rounds' {', '.join(f'{x:.0%}' for x in floors)}; {target})")
EOF
exit $status
