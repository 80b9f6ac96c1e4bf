#!/bin/bash
# kernel_times.sh - per-kernel GPU time of a decode step inside its CUDA graph, on the GPU
# machine, from a bundle made by tools/gpu/prepare.sh (which copies this script, kernel_times.py
# and deepinfer-bench into it):
#
#   OUT=/tmp/out bash kernel_times.sh MODEL_CONFIG REQUESTS [NAME]
#
# runs deepinfer-bench under Nsight Compute (every kernel node of the decode graphs timed on
# its own, caches warm, clocks free) for a few decode steps at REQUESTS concurrent requests and
# context 1024, and writes $OUT/NAME.txt (default kernels_REQUESTS.txt): kernels per step and
# microseconds per kernel name, from kernel_times.py. The bench's own step time (in the same
# file) minus the summed kernel time is what the kernel boundaries cost inside the graph.
set -u
here=$(cd "$(dirname "$0")" && pwd)
model=${1:?model config}
requests=${2:?concurrent requests}
name=${3:-kernels_$requests}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export PATH="$PATH:/usr/local/cuda/bin"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
if [[ -z "$ncu" ]]; then
  echo "kernel_times.sh: ncu not found" > "$OUT/$name.txt"
  exit 1
fi
csv=$(mktemp /tmp/kernel_times.XXXXXX.csv)
bench=("$here/bin/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --model "$model" --decode-num-requests "$requests"
  --prefill-batch-tokens 1024 --warmup 1 --output-len 6 --iters 1)
# KT_FLAGS: more bench flags (e.g. KT_FLAGS="--pdl=false"), word-split.
read -r -a extra <<< "${KT_FLAGS:-}"
bench+=("${extra[@]}")
{
  echo "# ${bench[*]}"
  "${bench[@]}" 2>/dev/null | grep -E '^(prefill|decode):'
  "$ncu" --graph-profiling node --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum --csv --page raw "${bench[@]}" > "$csv" 2>/dev/null
  echo "# ncu exit status $?"
  python3 "$here/kernel_times.py" --steps 3 --order "$csv"
} > "$OUT/$name.txt" 2>&1
rm -f "$csv"
