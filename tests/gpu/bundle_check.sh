#!/usr/bin/env bash
# tests/gpu/bundle_check.sh: the archive benchmarks/gpu_bundle.sh makes for
# the lent GPU machine runs where none of Debian's packages are. A GPU
# session has minutes of device time; a bundle that fails there wastes
# them, so this checks it here (the cudasim suite runs it): unpacked into
# a scratch tree, with the system's Open MPI, PMIx and Lua modules hidden
# in a private mount namespace (unshare -m), the bundle's fsdp-lua runs a
# busted spec through its own busted, and its mpirun starts 2 ranks that
# all-reduce. TAP lines numbered from $1 + 1; SKIP without root, unshare
# or the CUDA plugin.
set -uo pipefail
cd "$(dirname "$0")/../.."
n=${1:-0}
root=$PWD

skip() { n=$((n + 1)); echo "ok $n - # SKIP the GPU bundle check: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root for a mount namespace"
command -v unshare >/dev/null || skip "no unshare"
[ -f build/lib/libfsdp_cuda.so ] || skip "no CUDA plugin built (no nvcc here)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Fast compression: the check is about what is packed, not its size.
if ! out=$(XZ_OPT=-0 benchmarks/gpu_bundle.sh 2>&1); then
  n=$((n + 1)); echo "not ok $n - benchmarks/gpu_bundle.sh failed"; sed 's/^/#   /' <<<"$out"; exit 1
fi
mkdir -p "$tmp/tree/build"
cp -r lua models recipes tests "$tmp/tree/"
tar -xJf build/gpu_bundle.tar.xz -C "$tmp/tree/build"

# In the namespace: the system's MPI, PMIx and Lua trees replaced by empty
# ones (files first: their real paths lie under the directories).
cat >"$tmp/inside.sh" <<'EOF'
set -u
: >/tmp/.fsdp-empty-file
for f in /usr/lib/x86_64-linux-gnu/libmpi.so.40 /usr/lib/x86_64-linux-gnu/libopen-rte.so.40 \
         /usr/lib/x86_64-linux-gnu/libopen-pal.so.40 /usr/lib/x86_64-linux-gnu/libpmix.so.2 \
         /usr/bin/orterun /usr/bin/orted; do
  [ -e "$f" ] && mount --bind /tmp/.fsdp-empty-file "$(readlink -f "$f")"
done
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi \
         /etc/openmpi /usr/lib/x86_64-linux-gnu/lua /usr/share/lua; do
  [ -d "$d" ] && mount -t tmpfs none "$d"
done
cd "$1" && source build/gpu_bundle/env.sh
echo "mpirun: $(command -v mpirun)"
fsdp-lua tests/busted.lua -o TAP tests/lua/event_spec.lua 2>&1 | tail -n 2
timeout 60 mpirun -np 2 fsdp-lua -e 'local d = require("fsdp").dist
  local x = require("fsdp").ones({3}); d.all_reduce(x)
  print(("rank %d of %d: %g"):format(d.rank(), d.world_size(), x:sum():item()))'
EOF
out=$(unshare -m bash "$tmp/inside.sh" "$tmp/tree" 2>&1)
n=$((n + 1))
if grep -q "^mpirun: $tmp/tree/build/gpu_bundle/ompi/bin/mpirun" <<<"$out" &&
   grep -q '^1\.\.[0-9]' <<<"$out" && ! grep -q '^not ok' <<<"$out" &&
   [ "$(grep -c '^rank [01] of 2: 6$' <<<"$out")" = 2 ]; then
  echo "ok $n - the GPU bundle ($(du -sm build/gpu_bundle.tar.xz | cut -f1) MiB) runs a spec and 2 MPI ranks with the system's MPI and Lua modules hidden"
else
  echo "not ok $n - the GPU bundle with the system's MPI and Lua modules hidden"
  sed 's/^/#   /' <<<"$out" | tail -n 30
  exit 1
fi
