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
#   lib/libfsdp_mpi.so   the MPI backend's plugin (multi-rank runs)
#   sys/            every library ldd lists that is neither glibc's nor CUDA's
#                   (OpenBLAS, jansson, libedit, libgfortran, libstdc++,
#                   Open MPI's ...)
#   lua/            Debian's Lua 5.1 modules: lua-cjson (fsdp's JSON), lua-yaml (YAML --config files) and
#                   busted with its dependencies (the specs), C modules in
#                   lua/lib, pure Lua in lua/share
#   ompi/           Debian's Open MPI as a relocatable prefix (mpirun and
#                   the components whose libraries are packed; OPAL_PREFIX
#                   points there), for the multi-rank runs: the GPU machine
#                   has no MPI
#   env.sh          `source` it there: LD_LIBRARY_PATH, LUA_PATH/CPATH,
#                   OPAL_PREFIX, PATH, and the CUDA libraries found on
#                   that machine (/usr/local/cuda*, Python's nvidia-*)
#
# The CUDA libraries (cudart, cuBLAS, cuDNN, NCCL) are not packed: they are
# large and the GPU machine has its own. The whole bundle is also written
# as build/gpu_bundle.tar.xz (the directory is over the device tool's
# 64 MiB carry limit, the archive about a third of it): carry that and
# unpack it with `tar -xJf build/gpu_bundle.tar.xz -C build` (or Python's
# tarfile) before sourcing env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=build/bin/fsdp-lua
lib=build/lib/libfsdp.so
plugin=build/lib/libfsdp_cuda.so
mpi_plugin=build/lib/libfsdp_mpi.so
out=build/gpu_bundle
for f in "$bin" "$lib" "$plugin" "$mpi_plugin"; do
  [ -f "$f" ] || { echo "gpu_bundle: $f is missing: run ./build.sh first" >&2; exit 1; }
done
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  echo "gpu_bundle: warning: no nvcc here, so $plugin may be stale" >&2

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/sys" "$out/lua"
cp "$bin" "$out/bin/"
strip --strip-debug -o "$out/lib/libfsdp.so" "$lib"
strip --strip-debug -o "$out/lib/libfsdp_cuda.so" "$plugin"
strip --strip-debug -o "$out/lib/libfsdp_mpi.so" "$mpi_plugin"

# Open MPI, relocatable: Debian's prefix is /usr with its libraries under
# lib/x86_64-linux-gnu/openmpi/lib, so the same relative layout under
# ompi/ is what OPAL_PREFIX=ompi makes it look for. Components that need
# network stacks the GPU machine lacks (UCX, libfabric, PSM, verbs)
# are left out; the shared-memory and TCP transports are enough for ranks
# on one machine.
ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi/lib
ompi=$out/ompi
mkdir -p "$ompi/bin" "$ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" "$ompi/share" "$ompi/pmix/lib/pmix"
cp -L /usr/bin/orterun "$ompi/bin/mpirun"
cp -L /usr/bin/orted "$ompi/bin/orted"
cp -r /usr/share/openmpi "$ompi/share/openmpi"
unwanted='lib(uc[pstm]|fabric|efa|psm|infinipath|ibverbs|rdmacm|nl-|oshmem)'
components=()
for so in "$ompi_lib"/openmpi3/mca_*.so; do
  needs=$(ldd "$so") # not piped into grep -q: its early exit fails the pipe under pipefail
  if ! grep -qE "$unwanted" <<<"$needs"; then
    cp "$so" "$ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/"
    components+=("$so")
  fi
done
# Debian's PMIx keeps a few components and help texts of its own
# (relocated by PMIX_PREFIX).
cp /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so "$ompi/pmix/lib/pmix/"
mkdir -p "$ompi/pmix/share"
cp -r /usr/lib/x86_64-linux-gnu/pmix2/share/pmix "$ompi/pmix/share/pmix"

# Libraries the GPU machine cannot be assumed to have: skip the C library
# family (the machine's own must be used) and CUDA's (found there).
skip='^(libc|libm|libmvec|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64|linux-vdso|libfsdp|libcudart|libcublas|libcublasLt|libcudnn|libnccl)\.so'
ldd "$bin" "$lib" "$plugin" "$mpi_plugin" /usr/bin/orterun /usr/bin/orted "${components[@]}" \
  /usr/lib/x86_64-linux-gnu/lua/5.1/yaml.so |  # (yaml.so: libyaml for YAML --config files)
  awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then cp -L "$path" "$out/sys/$name"; fi
done

# Lua modules: cjson for fsdp itself, busted and what it requires for the
# specs (tests/busted.lua).
mkdir -p "$out/lua/lib" "$out/lua/share"
for d in /usr/lib/x86_64-linux-gnu/lua/5.1 /usr/share/lua/5.1; do
  [ -d "$d" ] || { echo "gpu_bundle: $d is missing (apt-get install lua-cjson lua-busted)" >&2; exit 1; }
done
cp -rL /usr/lib/x86_64-linux-gnu/lua/5.1/. "$out/lua/lib/"
cp -rL /usr/share/lua/5.1/. "$out/lua/share/"
[ -f "$out/lua/lib/cjson.so" ] || { echo "gpu_bundle: lua-cjson's cjson.so not found (apt-get install lua-cjson)" >&2; exit 1; }
[ -f "$out/lua/lib/yaml.so" ] && [ -d "$out/lua/share/lyaml" ] ||
  { echo "gpu_bundle: lua-yaml's yaml.so or lyaml not found (apt-get install lua-yaml)" >&2; exit 1; }

cat > "$out/env.sh" <<'ENV'
# build/gpu_bundle/env.sh: `source` it on the GPU machine (benchmarks/gpu_bundle.sh wrote it).
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$bundle/sys${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LUA_PATH="$bundle/lua/share/?.lua;$bundle/lua/share/?/init.lua;;"
export LUA_CPATH="$bundle/lua/lib/?.so;;"
export OPAL_PREFIX="$bundle/ompi" PMIX_PREFIX="$bundle/ompi/pmix" PMIX_MCA_mca_base_component_path="$bundle/ompi/pmix/lib/pmix"
export PATH="$bundle/bin:$bundle/ompi/bin:$PATH"
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# The CUDA libraries the plugin needs, from wherever that machine keeps them.
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  ldconfig -p 2>/dev/null | grep -q "$so" && continue
  hit=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib \
          $(python3 -c 'import site; print(" ".join(p + "/nvidia" for p in site.getsitepackages()))' 2>/dev/null) \
          -name "$so" 2>/dev/null | head -1)
  [ -n "$hit" ] && case ":$LD_LIBRARY_PATH:" in *":$(dirname "$hit"):"*) ;;
    *) export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$hit")" ;; esac
done
ENV

tar -cJf build/gpu_bundle.tar.xz -C build gpu_bundle
echo "gpu_bundle: $out ($(du -sm "$out" | cut -f1) MiB; build/gpu_bundle.tar.xz $(du -sm build/gpu_bundle.tar.xz | cut -f1) MiB): $(ls "$out/sys" | tr '\n' ' ')"
