#!/usr/bin/env bash
# benchmarks/gpu_bundle.sh: pack this machine's build into build/gpu_bundle/
# so it runs on the lent GPU machine, which has the NVIDIA driver, nvcc,
# PyTorch and the CUDA libraries (as Python packages) but none of Debian's
# packages and no network. Run it here after ./build.sh; then hand
# build/gpu_bundle to the device tool as a carried path (under 64 MiB) and
# run benchmarks/gpu_compare.sh there, which finds the bundle by itself.
#
#   bin/fsdp-lua    the executable (finds the project root as build/<x>/bin)
#   lib/libfsdp.so  the core, debug info stripped (its RUNPATH, ../lib, finds it)
#   lib/libfsdp_cuda.so  the CUDA backend's plugin beside it (opened on the
#                   first use of a cuda device)
#   sys/            every library ldd lists that is neither glibc's nor CUDA's
#                   (OpenBLAS, jansson, libedit, libgfortran, libstdc++ ...)
#   lua/cjson.so    Debian's lua-cjson, which fsdp's safetensors code loads
#
# The CUDA libraries (cudart, cuBLAS, cuDNN) are not packed: they are large
# and the GPU machine has its own; gpu_compare.sh looks for them there.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=build/bin/fsdp-lua
lib=build/lib/libfsdp.so
plugin=build/lib/libfsdp_cuda.so
out=build/gpu_bundle
for f in "$bin" "$lib" "$plugin"; do
  [ -f "$f" ] || { echo "gpu_bundle: $f is missing: run ./build.sh first" >&2; exit 1; }
done
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  echo "gpu_bundle: warning: no nvcc here, so $plugin may be stale" >&2

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/sys" "$out/lua"
cp "$bin" "$out/bin/"
strip --strip-debug -o "$out/lib/libfsdp.so" "$lib"
strip --strip-debug -o "$out/lib/libfsdp_cuda.so" "$plugin"

# Libraries the GPU machine cannot be assumed to have: skip the C library
# family (the machine's own must be used) and CUDA's (found there).
skip='^(libc|libm|libmvec|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64|linux-vdso|libfsdp|libcudart|libcublas|libcublasLt|libcudnn|libnccl)\.so'
ldd "$bin" "$lib" "$plugin" | awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then cp -L "$path" "$out/sys/$name"; fi
done
cjson=$(find /usr/lib/x86_64-linux-gnu/lua/5.1 /usr/local/lib/lua/5.1 -name cjson.so 2>/dev/null | head -1 || true)
[ -n "$cjson" ] || { echo "gpu_bundle: lua-cjson's cjson.so not found (apt-get install lua-cjson)" >&2; exit 1; }
cp -L "$cjson" "$out/lua/cjson.so"

echo "gpu_bundle: $out ($(du -sm "$out" | cut -f1) MiB): $(ls "$out/sys" | tr '\n' ' ')"
