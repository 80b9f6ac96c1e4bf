#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: installs the build dependencies from
# Debian's apt (needs root or sudo), builds everything with Bazel offline, and
# copies the four binaries to bin/ at the repository root.
#
#   tools/setup.sh            # install packages + build (default: CUDA on if nvcc found)
#   tools/setup.sh --no-apt   # build only
#   BAZEL_FLAGS="-c opt" tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

install_apt=1
for arg in "$@"; do
  case "$arg" in
    --no-apt) install_apt=0 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
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

echo "== building (bazel build ${BAZEL_FLAGS:-} //...)"
# shellcheck disable=SC2086
bazel build ${BAZEL_FLAGS:-} //...

mkdir -p bin
for target in coordinator:deepinfer-coordinator worker:deepinfer-worker \
              coordinator/cli:deepinfer tools/admin:deepinfer-admin; do
  src="bazel-bin/${target%%:*}/${target##*:}"
  install -m 0755 "$src" "bin/${target##*:}"
done
echo "== done: $(ls bin | tr '\n' ' ')in bin/"
