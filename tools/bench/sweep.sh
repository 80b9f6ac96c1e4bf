#!/bin/bash
# sweep.sh - runs deepinfer-bench over a grid of context lengths and request counts and writes
# every result to one CSV (deepinfer-bench --csv: one row per request count). The model is
# loaded once per context length; all request counts of that context run in that process.
#
#   tools/bench/sweep.sh --model DIR|CONFIG.json --out sweep.csv [--bench BIN]
#       [--contexts "512 1024 4096"] [--requests "1,8,32,64,128"] [-- EXTRA deepinfer-bench FLAGS]
#
# Defaults: --bench is deepinfer-bench next to this script's bundle (bin/), then bin/ of the
# repository, then bazel-bin; --load-format dummy, --backend cuda (override after --), prefill
# 8192 tokens per step. Exit status: the number of failed runs (their rows are missing).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model="" out="" bench="" contexts="1024" requests="1,8,32,64,128"
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "sweep.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$model" || -z "$out" ]]; then
  echo "sweep.sh: --model and --out are required (see --help)" >&2
  exit 2
fi
if [[ -z "$bench" ]]; then
  for b in "$here/bin/deepinfer-bench" "$here/../../bin/deepinfer-bench" \
    "$here/../../bazel-bin/tools/bench/deepinfer-bench"; do
    [[ -x "$b" ]] && { bench=$b; break; }
  done
fi
if [[ ! -x "$bench" ]]; then
  echo "sweep.sh: no deepinfer-bench found; build it (tools/setup.sh) or pass --bench" >&2
  exit 2
fi
failed=0
for ctx in $contexts; do
  echo "=== context $ctx, requests $requests" >&2
  "$bench" --model "$model" --load-format dummy --backend cuda --prefill-batch-tokens 8192 \
    --context-length "$ctx" --decode-num-requests "$requests" "${extra[@]}" --csv "$out" ||
    failed=$((failed + 1))
done
echo "sweep.sh: $(($(wc -l < "$out" 2>/dev/null || echo 1) - 1)) rows in $out, $failed failed runs" >&2
exit "$failed"
