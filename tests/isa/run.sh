#!/usr/bin/env bash
# tests/isa/run.sh: the `isa` suite of tests/run.sh, as TAP. The CPU
# backend chooses kernels by the instruction-set level in force ([Note: CPU
# ISA levels], core/base/cpu_isa.c), so the other suites prove only this
# machine's own level. Here the specs of the CPU kernels and libraries
# (GEMMs, attention, rows and fused ops, layers, the Hugging Face and
# PyTorch goldens) and the short f32 training comparisons of tests/mpi
# run again at avx2 and avx512 where the machine has more, each level a
# process of its own (FSDP_CPU_ISA): an AVX-512 machine proves the AVX2
# paths, an AMX one the AVX2 and plain AVX-512 ones.
#
#   tests/isa/run.sh              avx2 and avx512, those below this CPU's
#   tests/isa/run.sh avx2         only these levels (any the CPU offers)
set -uo pipefail
cd "$(dirname "$0")/../.."
EXE=${FSDP_LUA:-build/bin/fsdp-lua}
if [ ! -x "$EXE" ]; then
  echo "not ok 1 - $EXE is not built (./build.sh)"
  exit 1
fi

SPECS=(gemm_library attention_bf16 attention_window attention_packed fused add_rms_norm cpu_rows linear elementwise
       binary backend_ops tensor autograd nn_layers llama gpt2 t5 deepvit_golden hf_llama hf_gpt2 hf_t5 hf_generate
       hf_families lora optim accumulate moe linear_cross_entropy)
# avx512_bf16 below amx is left out: its one kernel (bf16 attention on dot
# products) runs beside the tiles in one process (attention_bf16_spec).
LEVELS=(avx2 avx512)

cpu=$("$EXE" -e "io.write(require('fsdp').cpu_isa().cpu)") || { echo "not ok 1 - cannot read the CPU level"; exit 1; }
if [ $# -gt 0 ]; then
  levels=("$@")
else
  levels=()
  for level in "${LEVELS[@]}"; do
    [ "$level" = "$cpu" ] && break
    levels+=("$level")
  done
  [ "$cpu" = baseline ] && levels=()
fi
if [ ${#levels[@]} -eq 0 ]; then
  echo "ok 1 - isa suite # SKIP this CPU's level ($cpu) is the lowest tested: the other suites ran it"
  echo "1..1"
  exit 0
fi

n=0 rc=0
# Each run's TAP lines renumbered into one stream, tagged with the level.
renumber() { # LEVEL
  local line
  while IFS= read -r line; do
    case "$line" in
      "ok "[0-9]*|"not ok "[0-9]*)
        n=$((n + 1))
        sed -E "s/^(not )?ok [0-9]+ (- )?/\1ok $n - [$1] /" <<<"$line" ;;
      "1.."*) ;;
      *) echo "$line" ;;
    esac
  done
}
for level in "${levels[@]}"; do
  echo "# level $level (this CPU: $cpu)"
  paths=()
  for s in "${SPECS[@]}"; do paths+=("tests/lua/${s}_spec.lua"); done
  out=$(FSDP_CPU_ISA=$level "$EXE" tests/busted.lua -o TAP "${paths[@]}" 2>&1) || rc=1
  renumber "$level" <<<"$out"
  out=$(FSDP_CPU_ISA=$level FSDP_LUA=$EXE tests/mpi/run.sh isa 2>&1) || rc=1
  renumber "$level" <<<"$out"
done
echo "1..$n"
exit $rc
