#!/bin/bash
# moe_decode_check.sh - the decode expert-GEMM checks in one device call, from a folder made by
#   GPU_TESTS="//kernels/moe:grouped_gemm_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//kernels/moe:grouped_gemm_bench //tools/bench:deepinfer-bench" GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out DIR && cp tools/gpu/moe_decode_check.sh DIR/
# then (device tool) `bash DIR/moe_decode_check.sh`. Most important first, since the call may be
# cut short: the kernel tests against exact products, the backend's RoutedExperts tests (every
# decode algorithm), grouped_gemm_bench (every way, both shapes), the CUDA-graph decode test,
# the 4-layer Moonlight-shaped bench with the backend's choice, the parity test, then the same
# bench with the old fp32-activation kernel and with the planned cuBLAS path forced. One log per
# step in $OUT/logs.tar.gz (refreshed after each step), one line per step in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
logs=/tmp/moedec-logs
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
  timeout "$limit" stdbuf -oL -eL "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local ms=$(($(date +%s%N) / 1000000 - start_ms))
  printf '%-28s rc=%-4s %5d.%03ds %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) \
    "$(grep -E '^\[  (PASSED|FAILED) ' "$logs/$name.log" | tr '\n' ' ')" >> "$OUT/summary.txt"
  tar -C "$logs" -czf "$OUT/logs.tar.gz" .
}

bench4=("$B/deepinfer-bench" --backend cuda --dtype bfloat16
  --model "$C/moonlight_shaped_4layers.json" --load-format dummy --decode-num-requests 1,64,128
  --context-length 1024 --prefill-batch-tokens 8192 --output-len 8 --warmup 2 --iters 3
  --decode-fill random)
step grouped_gemm_test 30 "$B/grouped_gemm_test" --gtest_color=no
step routed_experts_test 30 "$B/cuda_backend_test" --gtest_color=no --gtest_filter='RoutedExperts*'
step grouped_gemm_bench 45 "$B/grouped_gemm_bench"
step decode_graph_gpu_test 40 "$B/decode_graph_gpu_test" --gtest_color=no
step bench4_auto 40 "${bench4[@]}"
step cuda_parity_test 40 "$B/cuda_parity_test" --gtest_color=no
step bench4_grouped_f32 40 "${bench4[@]}" --decode-moe-algo grouped-f32
step bench4_planned 40 "${bench4[@]}" --decode-moe-algo planned
step cuda_backend_test 40 "$B/cuda_backend_test" --gtest_color=no --gtest_filter='-RoutedExperts*'
cat "$OUT/summary.txt"
