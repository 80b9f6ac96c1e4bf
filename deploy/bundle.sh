#!/usr/bin/env bash
# bundle.sh - make a relocatable deepinfer folder for cluster nodes that lack our build
# dependencies (grpc, protobuf, absl, glog, ...): the five binaries, the shared libraries
# they need that a node may not have, and the Slurm scripts.
#
#   deploy/bundle.sh [--from DIR] [--out DIR] [--tar] [--with-cxxrt] [--with-nccl]
#
# Result (copy OUT to a shared filesystem, or unpack OUT.tar.gz on every node):
#   OUT/bin/deepinfer-coordinator, deepinfer-worker, deepinfer, deepinfer-admin, deepinfer-bench
#                       RUNPATH=$ORIGIN/../lib: they find lib/ wherever OUT is moved
#   OUT/lib/*.so.*      every library from ldd except glibc, libstdc++/libgcc_s and CUDA/NCCL
#                       (those are expected on the node; see tools/bundle.sh), RUNPATH=$ORIGIN
#   OUT/slurm/          deepinfer.sbatch and deepinfer-slurm.sh (they find OUT/bin themselves)
#   OUT/MANIFEST.txt    what was copied from where, and the glibc/libstdc++ versions needed
#
# Options:
#   --from DIR     the folder holding the five binaries (default: bin/ of this checkout,
#                  which tools/setup.sh fills); a bazel-bin tree works too
#   --out DIR      output folder, replaced if it exists (default: dist/deepinfer)
#   --tar          also write OUT.tar.gz
#   --with-cxxrt   also bundle libstdc++ and libgcc_s (nodes with an older distribution)
#   --with-nccl    also bundle libnccl (nodes without NCCL)
# Needs patchelf (Debian package patchelf). Ends by running every bundled binary from
# another directory with an empty environment, so a bundle that would not start fails here.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "deploy/bundle.sh: $*" >&2; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
from="" out="$root/dist/deepinfer" tar=0 pass=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --from) [[ $# -ge 2 ]] || die "--from needs a directory"; from=$2; shift ;;
    --from=*) from=${1#*=} ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$2; shift ;;
    --out=*) out=${1#*=} ;;
    --tar) tar=1 ;;
    --with-cxxrt|--with-nccl) pass+=("$1") ;;
    *) echo "deploy/bundle.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
command -v patchelf >/dev/null || die "patchelf not found (apt-get install patchelf): without it the binaries would not find lib/"

# name -> path under a bazel-bin tree
declare -A in_bazel=([deepinfer-coordinator]=coordinator/deepinfer-coordinator
  [deepinfer-worker]=worker/deepinfer-worker [deepinfer]=coordinator/cli/deepinfer
  [deepinfer-admin]=tools/admin/deepinfer-admin [deepinfer-bench]=tools/bench/deepinfer-bench)
names=(deepinfer-coordinator deepinfer-worker deepinfer deepinfer-admin deepinfer-bench)
find_binary() {  # find_binary DIR NAME -> path, or nothing
  if [[ -x $1/${in_bazel[$2]} ]]; then echo "$1/${in_bazel[$2]}"; elif [[ -x $1/$2 ]]; then echo "$1/$2"; fi
}
# bin/, not bazel-bin: bazel-bin follows the last `bazel build`, whose flags (a CUDA or opt
# build of a few targets) need not match what tools/setup.sh installed.
if [[ -z $from ]]; then
  from=$root/bin
  [[ -d $from ]] || die "no $from; build first (tools/setup.sh fills it) or pass --from DIR"
fi
[[ -d $from ]] || die "--from $from is not a directory"
from=$(cd "$from" && pwd)
for n in "${names[@]}"; do
  [[ -n $(find_binary "$from" "$n") ]] || die "$n not found in $from (as $from/$n or $from/${in_bazel[$n]}); tools/setup.sh puts all five in bin/"
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/slurm"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo "deepinfer bundle, made $(date -u +%Y-%m-%dT%H:%MZ) from $from"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} >"$out/MANIFEST.txt"
# tools/bundle.sh does one binary; the libraries of all five land in one lib/ (same soname,
# same file, since they come from the same build host).
for n in "${names[@]}"; do
  PATCHELF=$(command -v patchelf) bash "$root/tools/bundle.sh" "${pass[@]}" \
    "$(find_binary "$from" "$n")" "$tmp/$n" >/dev/null
  cp "$tmp/$n/bin/$n" "$out/bin/$n"
  cp -n "$tmp/$n"/lib/* "$out/lib/" 2>/dev/null || true
  { echo; echo "== $n"; cat "$tmp/$n/MANIFEST.txt"; } >>"$out/MANIFEST.txt"
done
chmod 0755 "$out"/bin/*
cp "$root"/deploy/slurm/deepinfer.sbatch "$root"/deploy/slurm/deepinfer-slurm.sh "$out/slurm/"
cp "$root/deploy/README.md" "$out/README.md"

# Prove it is relocatable: from another directory, without LD_LIBRARY_PATH, every binary
# must resolve every library (ldd) and start (--help).
cd /
for n in "${names[@]}"; do
  if env -i PATH=/usr/bin:/bin ldd "$out/bin/$n" | grep -q 'not found'; then
    env -i PATH=/usr/bin:/bin ldd "$out/bin/$n" | grep 'not found' >&2
    die "bundled $n does not find all its libraries"
  fi
  env -i PATH=/usr/bin:/bin "$out/bin/$n" --help >/dev/null 2>&1 || die "bundled $n --help failed"
done
if [[ $tar -eq 1 ]]; then
  tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
fi
echo "bundle: $out ($(du -sh "$out" | cut -f1), $(ls "$out/lib" | wc -l) libraries)"
[[ $tar -eq 0 ]] || echo "tarball: $out.tar.gz ($(du -h "$out.tar.gz" | cut -f1))"
