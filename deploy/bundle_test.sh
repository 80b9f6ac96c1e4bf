#!/bin/bash
# bundle_test: deploy/bundle.sh in a copy of a checkout whose bin/ holds the five binaries (as
# tools/setup.sh leaves it) and whose bazel-bin is the output of another build that lacks most
# of them (as after a CUDA build of a few targets).
#   default      bundles bin/, not bazel-bin: five binaries, libraries, Slurm scripts; every
#                binary resolves its libraries from the bundle and starts from / with an
#                empty environment, also after the bundle was moved
#   --from DIR   bundles DIR
#   missing      a folder without deepinfer-admin, or no bin/ at all: a clear error, no bundle
#   bundle_test.sh COORDINATOR WORKER CLI ADMIN BENCH DEPLOY_BUNDLE_SH TOOLS_BUNDLE_SH SBATCH \
#     SLURM_SH DEPLOY_README
set -euo pipefail
[[ $# -eq 10 ]] || { echo "usage: $0 COORDINATOR WORKER CLI ADMIN BENCH DEPLOY_BUNDLE_SH TOOLS_BUNDLE_SH SBATCH SLURM_SH README" >&2; exit 2; }
binaries=("$1" "$2" "$3" "$4" "$5")
tmp=$(readlink -f "${TEST_TMPDIR:-$(mktemp -d)}")
export TMPDIR=$tmp
names=(deepinfer-coordinator deepinfer-worker deepinfer deepinfer-admin deepinfer-bench)
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

checkout=$tmp/checkout
mkdir -p "$checkout/deploy/slurm" "$checkout/tools" "$checkout/bin" "$checkout/bazel-bin/worker"
cp "$6" "$checkout/deploy/bundle.sh"
cp "$7" "$checkout/tools/bundle.sh"
cp "$8" "$9" "$checkout/deploy/slurm/"
cp "${10}" "$checkout/deploy/README.md"
for b in "${binaries[@]}"; do cp -L "$b" "$checkout/bin/"; done
chmod u+w,+x "$checkout"/bin/*
# The other build's output: a worker that is not even an ELF, and no deepinfer-admin.
printf '#!/bin/sh\nexit 1\n' > "$checkout/bazel-bin/worker/deepinfer-worker"
chmod +x "$checkout/bazel-bin/worker/deepinfer-worker"

# check_bundle DIR SOURCE_DIR: the bundle's contents, and every binary run from / with an
# empty environment, its libraries found in DIR/lib.
check_bundle() {
  local dir=$1 source=$2 n libs
  [[ $(ls "$dir/bin" | wc -l) -eq 5 ]] || fail "$dir/bin holds $(ls "$dir/bin" | tr '\n' ' '), want 5 binaries"
  [[ $(ls "$dir/lib" | wc -l) -gt 0 ]] || fail "$dir/lib is empty"
  [[ -x $dir/slurm/deepinfer-slurm.sh && -f $dir/slurm/deepinfer.sbatch ]] || fail "$dir/slurm lacks the scripts"
  head -1 "$dir/MANIFEST.txt" | grep -q "from $source\$" || fail "MANIFEST.txt does not name $source: $(head -1 "$dir/MANIFEST.txt")"
  for n in "${names[@]}"; do
    grep -q "^bundle of: $source/$n\$" "$dir/MANIFEST.txt" || fail "$n was not bundled from $source"
    [[ -x $dir/bin/$n ]] || { fail "$dir/bin/$n missing"; continue; }
    libs=$(cd / && env -i /usr/bin/ldd "$dir/bin/$n")
    [[ $libs != *"not found"* ]] || fail "$n: a library is not found: $libs"
    [[ $libs == *"$dir/bin/../lib/"* ]] || fail "$n resolves no library from $dir/lib: $libs"
    (cd / && env -i "$dir/bin/$n" --help > /dev/null 2>&1) || fail "$dir/bin/$n --help failed"
  done
}

# --- default: bin/ of the checkout, not its bazel-bin ---
if bash "$checkout/deploy/bundle.sh" --out "$tmp/default" > "$tmp/default.log" 2>&1; then
  check_bundle "$tmp/default" "$checkout/bin"
  mv "$tmp/default" "$tmp/moved"
  (cd / && env -i "$tmp/moved/bin/deepinfer-worker" --help > /dev/null 2>&1) ||
    fail "the moved bundle's deepinfer-worker does not start"
else
  fail "default bundle failed: $(cat "$tmp/default.log")"
fi

# --- --from another folder ---
mkdir -p "$tmp/elsewhere"
cp "$checkout"/bin/* "$tmp/elsewhere/"
if bash "$checkout/deploy/bundle.sh" --from "$tmp/elsewhere" --out "$tmp/from" > "$tmp/from.log" 2>&1; then
  check_bundle "$tmp/from" "$tmp/elsewhere"
else
  fail "--from bundle failed: $(cat "$tmp/from.log")"
fi

# --- a folder without deepinfer-admin, and a checkout without bin/ ---
rm "$tmp/elsewhere/deepinfer-admin"
if bash "$checkout/deploy/bundle.sh" --from "$tmp/elsewhere" --out "$tmp/partial" > "$tmp/partial.log" 2>&1; then
  fail "bundling a folder without deepinfer-admin succeeded"
fi
grep -q "deepinfer-admin not found in $tmp/elsewhere" "$tmp/partial.log" ||
  fail "no clear error for the missing deepinfer-admin: $(cat "$tmp/partial.log")"
[[ ! -e $tmp/partial ]] || fail "a failed bundle left $tmp/partial behind"
rm -r "$checkout/bin"
if bash "$checkout/deploy/bundle.sh" --out "$tmp/none" > "$tmp/none.log" 2>&1; then
  fail "bundling without bin/ succeeded"
fi
grep -q "tools/setup.sh" "$tmp/none.log" || fail "the error without bin/ does not say how to fill it: $(cat "$tmp/none.log")"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "PASS"
