#!/bin/bash
# prefix_cache_bench.sh: one shared-system-prompt job (prefix_cache_bench.py make-job) through
# `deepinfer run` with prefix caching off, then on (with a fresh --kv-cache-dir), then on again
# with that directory warm (a new worker that finds the first run's blocks on disk), then, with
# --ranks N, on N ranks with and without prefix-aware routing; and prefix_cache_bench.py's
# report of all: prefill tokens computed, hit rate, end-to-end throughput (wall time of each
# `deepinfer run`, process start and model load included), tokens per rank (max / mean) for
# the multi-rank runs, and whether tokens and logprobs agree.
#
#   prefix_cache_bench.sh --deepinfer BIN --model MODEL --out DIR [--run-args "FLAGS"]
#       [--ranks N] [-- MAKE_JOB_FLAGS]
#
# MAKE_JOB_FLAGS default to the full job (64 system prompts of 2,048 tokens x 32 questions of
# 64 tokens, 32 output tokens); scale it down for the CPU, e.g.
#   -- --systems 4 --questions 8 --system-tokens 256 --question-tokens 16 --max-tokens 8 \
#      --vocab 1000
# FLAGS go to both `deepinfer run`s (e.g. "--backend cuda --ranks-per-worker 8").
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deepinfer="" model="" out="" run_args="" ranks=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --deepinfer) deepinfer=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --run-args) run_args=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "prefix_cache_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ -z $deepinfer || -z $model || -z $out ]]; then
  echo "usage: prefix_cache_bench.sh --deepinfer BIN --model MODEL --out DIR" \
    "[--run-args FLAGS] [-- MAKE_JOB_FLAGS]" >&2
  exit 2
fi
mkdir -p "$out"
python3 "$here/prefix_cache_bench.py" make-job "$@" > "$out/job.jsonl"
echo "job: $(wc -l < "$out/job.jsonl") requests ($out/job.jsonl)" >&2

declare -A seconds
modes=(off on warm)
[[ $ranks -gt 1 ]] && modes+=(routed unrouted)
rm -rf "$out/kv"
for mode in "${modes[@]}"; do
  flags=()
  case $mode in
    off) flags+=(--no-prefix-caching) ;;
    on | warm) flags+=(--kv-cache-dir "$out/kv") ;;
    routed) flags+=(--ranks-per-worker "$ranks") ;;
    unrouted) flags+=(--ranks-per-worker "$ranks" --prefix-routing=false) ;;
  esac
  start=$(date +%s.%N)
  # shellcheck disable=SC2086  # run_args is a list of flags
  "$deepinfer" run --model "$model" --input "$out/job.jsonl" --output "$out/$mode.jsonl" \
    --state-dir "$out/$mode.state" "${flags[@]}" $run_args 2> "$out/$mode.log" \
    || { echo "deepinfer run ($mode) failed; see $out/$mode.log" >&2; exit 1; }
  end=$(date +%s.%N)
  seconds[$mode]=$(python3 -c "print($end - $start)")
  echo "prefix caching $mode: ${seconds[$mode]} s" >&2
done
extra=(--run "warm disk=$out/warm.jsonl:${seconds[warm]}")
for mode in routed unrouted; do
  [[ -n ${seconds[$mode]:-} ]] &&
    extra+=(--run "$ranks ranks $mode=$out/$mode.jsonl:${seconds[$mode]}:$out/$mode.log")
done
python3 "$here/prefix_cache_bench.py" report --on "$out/on.jsonl" --on-seconds "${seconds[on]}" \
  --off "$out/off.jsonl" --off-seconds "${seconds[off]}" "${extra[@]}" | tee "$out/report.md"
