#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS]: build the libFuzzer harnesses (clang,
# AddressSanitizer + UndefinedBehaviorSanitizer), make the seed corpora
# from the project's own writers (tests/fuzz/seeds.lua), and fuzz each
# reader for SECONDS (default 12: the short run of the test suite; see
# tests/fuzz/README.md for the long one). Speaks TAP, one line per target
# with its executions, coverage and crashes; skips when clang or its
# libFuzzer runtime is missing.
#
#   target       harness                          seeds
#   safetensors  fuzz_safetensors (C reader)      every dtype, checkpoint rank files
#   tokens       fuzz_lua, fsdp.data.tokens       token shards
#   index        fuzz_lua, checkpointing.directory   a checkpoint's index.json
#   corpus       fuzz_lua, fsdp.data.corpus       JSONL plain/gzip/zstd, text
#   tokenizer    fuzz_lua, fsdp.data.bpe          the shipped test tokenizer.json files
#   position     fuzz_lua, load_state of a corpus  saved data positions (JSON)
#                stream and a token dataset
#   config       fuzz_lua, models.hf + fsdp.lora  the goldens' config.json and adapter_config.json
#
# The corpora grow in build/fuzz/corpus/ across runs; inputs that crash are
# written to build/fuzz/artifacts/ (reproduce: build/fuzz/fuzz_... FILE).
set -uo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-12}
out=build/fuzz

if ! command -v clang >/dev/null || ! echo 'int LLVMFuzzerTestOneInput(const char*d,long n){return 0;}' |
     clang -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then
  echo "1..1"
  echo "ok 1 # skip clang with libFuzzer not found (Debian: apt-get install clang; ./build.sh installs it)"
  exit 0
fi

echo "1..8"
if make -f tests/fuzz/Makefile -j"${JOBS:-$(nproc)}" >"$out.build.log" 2>&1; then
  echo "ok 1 - build the harnesses"
else
  echo "not ok 1 - build the harnesses (log: $out.build.log)"
  tail -20 "$out.build.log" | sed 's/^/# /'
  exit 1
fi

rm -rf "$out/seeds" "$out/work"
mkdir -p "$out/artifacts" "$out/work"
trap 'rm -rf "$out/work"' EXIT
if ! FUZZ_WORKDIR="$PWD/$out/work" build/bin/fsdp-lua tests/fuzz/seeds.lua "$out/seeds" >/dev/null; then
  echo "not ok 2 - seed corpora (tests/fuzz/seeds.lua failed)"
  exit 1
fi

n=1
status=0
fuzz() { # fuzz NAME BINARY SEEDS [ENV...]
  local name=$1 bin=$2 seeds=$3
  shift 3
  n=$((n + 1))
  mkdir -p "$out/corpus/$name"
  local log="$out/$name.log" rc
  env "$@" FUZZ_WORKDIR="$PWD/$out/work" "$bin" -max_total_time="$secs" -print_final_stats=1 \
    -timeout=20 -rss_limit_mb=2048 -dict=tests/fuzz/safetensors.dict \
    -artifact_prefix="$out/artifacts/$name-" \
    "$out/corpus/$name" "$seeds" >"$log" 2>&1
  rc=$?
  local runs cov ft
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  if [ "$rc" -eq 0 ]; then
    echo "ok $n - fuzz $name: ${runs:-0} executions in ${secs} s, coverage ${cov:-?} C edges, ${ft:-?} features (with Lua lines), 0 crashes"
  else
    echo "not ok $n - fuzz $name: exit status $rc after ${runs:-?} executions (log: $log)"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -10 | sed 's/^/# /'
    status=1
  fi
}

fuzz safetensors "$out/fuzz_safetensors" "$out/seeds/safetensors"
fuzz tokens "$out/fuzz_lua" "$out/seeds/tokens" FUZZ_TARGET=tokens
fuzz index "$out/fuzz_lua" "$out/seeds/index" FUZZ_TARGET=index
fuzz corpus "$out/fuzz_lua" "$out/seeds/corpus" FUZZ_TARGET=corpus
fuzz tokenizer "$out/fuzz_lua" "$out/seeds/tokenizer" FUZZ_TARGET=tokenizer
fuzz position "$out/fuzz_lua" "$out/seeds/position" FUZZ_TARGET=position
fuzz config "$out/fuzz_lua" "$out/seeds/config" FUZZ_TARGET=config
exit $status
