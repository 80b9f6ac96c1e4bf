#!/bin/bash
# decode_graphs_check.sh - the CUDA-graph decode checks in one device call, from a folder made by
#   GPU_TESTS="//worker/model:decode_graph_gpu_test //kernels/moe:expert_counts_test \
#     //worker/backend/cuda:cuda_backend_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//tools/bench:deepinfer-bench" tools/gpu/prepare.sh --out DIR
#   cp tools/gpu/decode_graphs_check.sh DIR/
# then (device tool) `bash DIR/decode_graphs_check.sh`. Most important first, since the call
# may be cut short: the graph-vs-eager GPU test, the 4-layer Moonlight-shaped profile with and
# without graphs (separate processes: clean memory figures), the 27-layer model with graphs and
# the same decode steps eager in the same process (--compare-eager-decode: one 33 s load), then
# the backend and parity tests. One log per step in $OUT/logs.tar.gz (refreshed after each
# step), one line per step in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
logs=/tmp/graphs-logs
rm -rf "$logs"
mkdir -p "$logs"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
B="$here/bin"
C="$here/configs"
: > "$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
head -1 "$here/COMMIT" >> "$OUT/machine.txt" 2>/dev/null

step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local start_ms=$(($(date +%s%N) / 1000000))
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local ms=$(($(date +%s%N) / 1000000 - start_ms))
  printf '%-28s rc=%-4s %5d.%03ds %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) \
    "$(grep -E '^\[  (PASSED|FAILED) ' "$logs/$name.log" | tr '\n' ' ')" >> "$OUT/summary.txt"
  tar -C "$logs" -czf "$OUT/logs.tar.gz" .
}

bench4=("$B/deepinfer-bench" --backend cuda --model "$C/moonlight_shaped_4layers.json"
  --load-format dummy --decode-num-requests 1,64,128 --context-length 1024
  --prefill-batch-tokens 8192 --output-len 8 --warmup 2 --iters 2 --op-timing-steps 3
  --decode-fill random)
step decode_graph_gpu_test 60 "$B/decode_graph_gpu_test" --gtest_color=no
step expert_counts_test 20 "$B/expert_counts_test" --gtest_color=no
step bench4_graphs 45 "${bench4[@]}"
step bench4_eager 45 "${bench4[@]}" --cuda-graphs=false
step bench27_graphs_and_eager 110 "$B/deepinfer-bench" --backend cuda \
  --model "$C/moonlight_shaped.json" --load-format dummy --decode-num-requests 1,128 \
  --context-length 1024 --prefill-batch-tokens 8192 --output-len 16 --warmup 2 --iters 3 \
  --decode-fill random --compare-eager-decode
step cuda_backend_test 30 "$B/cuda_backend_test" --gtest_color=no
step cuda_parity_test 60 "$B/cuda_parity_test" --gtest_color=no
cat "$OUT/summary.txt"
