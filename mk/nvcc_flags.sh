#!/bin/sh
# nvcc_flags.sh: the nvcc options of the CUDA backend, shared by mk/cuda.mk
# (premake4) and premake5.lua. Real code for sm_80 (A100) and sm_90
# (H100/H200), plus compute_90 PTX so newer GPUs can JIT it. core/ops is on
# the include path for the kernel tables (binary.h, elementwise.h, ...).
# Host code without exceptions or thread-safe statics: the library is
# linked as C (no libstdc++), and nvcc's launch stubs for <<<>>> otherwise
# need __gxx_personality_v0 and __cxa_guard_*; nothing here throws.
root=$(cd "$(dirname "$0")/.." && pwd)
echo "-std=c++17 -O2 -g -lineinfo -Xcompiler -fPIC,-fvisibility=hidden,-Wall" \
     "-I$root/core/include -I$root/core/base -I$root/core/ops -I$root/core/comm" \
     "-gencode arch=compute_80,code=sm_80" \
     "-gencode arch=compute_90,code=sm_90" \
     "-gencode arch=compute_90,code=compute_90" \
     "-Xcompiler -fno-exceptions,-fno-threadsafe-statics"
