#!/usr/bin/env bash
# build.sh: one entry for setting up, building, running and testing fsdp-lua
# on a Debian machine (root or sudo). Safe to run again: packages are
# installed only when missing and the build is incremental.
#
#   ./build.sh          install dependencies and build
#   ./build.sh run      ... then run the main job: a reduced Llama 2 trained
#                       on CPU by recipes/llama2_7b.lua (extra arguments are
#                       passed to the recipe)
#   ./build.sh test     ... then run every test suite (tests/run.sh)
#
# Environment: JOBS (parallel make jobs, default: number of cores),
# FSDP_NO_CUDA=1 (build without the CUDA backend even if nvcc is found),
# FSDP_WITH_MKL=1 (also install Intel MKL, Debian's libmkl-rt, enabling
# the non-free archive area for it: f32 gradient products run on it,
# core/cpu/cpu_mkl.c; without it they stay on OpenBLAS).
# `test` also builds the cudasim configuration (the CUDA backend with its
# kernels run on the CPU, tests/cudasim) where the CUDA toolkit is present.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(build-essential pkg-config premake4 luajit libluajit-5.1-dev
          libedit-dev libopenblas-dev libopenblas0-openmp openmpi-bin libopenmpi-dev lua-busted
          lua-cjson libjansson-dev libcmocka-dev tmux
          lua-yaml # YAML --config files (lua/fsdp/config_file.lua)
          lua-filesystem gnuplot-nox
          libxxhash-dev # XXH3 checksums of checkpoint files
          libisal-dev # CRC-32C of TensorBoard event records (core/io/crc32c.c)
          libyajl-dev # streaming JSON: safetensors headers of any size
          zlib1g-dev libzstd-dev # corpus readers: .gz and .zst shards (core/data)
          libpcre2-dev libutf8proc-dev libsentencepiece-dev # tokenizers (core/text)
          libdnnl-dev # oneDNN: bf16 products on the CPU (core/cpu/cpu_onednn.c opens it)
          clang libomp-dev # clang, libomp-dev: the fuzzers (tests/fuzz)
          slurm-wlm munge) # the cluster in a box (tests/cluster)

log() { printf '[build.sh] %s\n' "$*" >&2; }

install_deps() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  log "installing: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

# FSDP_WITH_MKL=1: libmkl-rt from Debian's non-free area (MKL's licence is
# not free software, so only on request). The area is added in a file of
# its own when apt does not know the package yet.
install_mkl() {
  [ "${FSDP_WITH_MKL:-0}" = 1 ] || return 0
  dpkg-query -W -f='${Status}' libmkl-rt 2>/dev/null | grep -q 'ok installed' && return 0
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  if ! apt-cache policy libmkl-rt 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    local suite
    suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$suite" ] || { log "FSDP_WITH_MKL: cannot tell the Debian release; install libmkl-rt yourself"; return 1; }
    log "FSDP_WITH_MKL: adding Debian's non-free area for $suite (/etc/apt/sources.list.d/fsdp-lua-non-free.sources)"
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$suite" | "${sudo[@]}" tee /etc/apt/sources.list.d/fsdp-lua-non-free.sources >/dev/null
    "${sudo[@]}" apt-get update -qq
  fi
  log "installing: libmkl-rt (FSDP_WITH_MKL=1)"
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends libmkl-rt >/dev/null
}

generate() {
  local opts=()
  [ "${FSDP_NO_CUDA:-0}" = 1 ] && opts+=(--no-cuda)
  if command -v premake5 >/dev/null; then
    # premake5 5.0.0-beta5 renamed its makefile action gmake2 to gmake (the
    # old gmake became gmakelegacy); earlier 5.0 releases know only gmake2.
    local action=gmake
    premake5 --version | grep -Eq '5\.0\.0-(alpha[0-9]*|beta[1-4])([^0-9]|$)' && action=gmake2
    premake5 --file=premake5.lua "${opts[@]}" "$action" >/dev/null
  else
    premake4 --file=premake5.lua "${opts[@]}" gmake >/dev/null
  fi
}

build() { # build CONFIG...
  generate
  local cfg
  for cfg in "$@"; do
    log "building ($cfg)"
    make -C build -j"${JOBS:-$(nproc)}" config="$cfg" --no-print-directory >/dev/null
  done
}

case "${1:-build}" in
  build)
    install_deps
    install_mkl
    build release
    ;;
  run)
    install_deps
    install_mkl
    build release
    shift
    # Llama 2's architecture at a size two cores train in seconds (9.6 s on
    # the project's shared 2-core Zen 5 on 2026-12-06; README.md's quick
    # start has the measurement): the loss falls from ln(512) = 6.2 toward
    # the synthetic data's entropy.
    exec build/bin/fsdp-lua recipes/llama2_7b.lua --num_layers=4 --hidden_width=128 \
      --num_heads=4 --vocab_size=512 --seq_len=128 --batch_size=8 --max_steps=120 \
      --lr=3e-3 --min_lr=3e-4 --warmup_steps=10 --log_every=10 "$@"
    ;;
  test)
    install_deps
    install_mkl
    configs=(release asan)
    if [ "${FSDP_NO_CUDA:-0}" != 1 ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
      configs+=(cudasim)
    fi
    build "${configs[@]}"
    shift
    exec tests/run.sh "$@"
    ;;
  *)
    echo "usage: ./build.sh [build|run|test]" >&2
    exit 2
    ;;
esac
