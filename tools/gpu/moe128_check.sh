#!/bin/bash
# moe128_check.sh - the pipelined grouped expert GEMM at 3+ decode tokens (branch s8-moe128) in
# one device call (<= 110 s), from a folder made by
#   GPU_TESTS="//kernels/moe:grouped_gemm_pipelined_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//worker/backend/cuda:moe_decode_bench //tools/bench:deepinfer-bench" \
#   GPU_DAEMONS="" tools/gpu/prepare.sh --out DIR --pack PACK.tar.xz
# then (device tool) `mkdir -p /tmp/b && tar xJf PACK -C /tmp/b && bash /tmp/b/DIR/moe128_check.sh`.
# Steps: the kernel test (both epilogues against exact dot products); moe_decode_bench (one MoE
# layer in a CUDA graph: "epilogue" = the planned cuBLAS path, the default, vs "pipelined" and
# "pipelined2", the kernel's two shapes; Moonlight and V3, 64 / 128 / 256 tokens); the 27-layer
# Moonlight-shaped bench (1,) 64 and 128 requests with --decode-moe-pipelined false, then true
# with shape 1, then with shape 2 (each arm its own process); the model's decode-graph and
# parity tests; the backend's routed-expert tests (every decode algorithm incl. kPipelined,
# eager and recorded, against the per-token CPU reference); the three bench arms again.
# MOE128_PARTS=quick: only the kernel test, moe_decode_bench and the backend cases (~20 s).
# One line per step in $OUT/summary.txt, logs in $OUT/logs.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${BUDGET_S:-108} . "$here/steps.sh"

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --model "$C/moonlight_shaped.json"
  --prefill-batch-tokens 0 --output-len 11 --warmup 3 --iters 3)
bench() {  # bench PIPELINED SIZES [VARIANT]
  step "bench27_pipelined_${1}${3:+_v$3}_$2" 22 "${bench27[@]}" --decode-num-requests "$2" \
    --decode-moe-pipelined="$1" --decode-moe-pipelined-variant "${3:-0}"
}
# Ordered so that a call cut short loses the repeated bench pair first.
step grouped_gemm_pipelined_test 20 "$B/grouped_gemm_pipelined_test" --gtest_color=no
step moe_decode_bench_moonlight 10 "$B/moe_decode_bench" moonlight epilogue,pipelined,pipelined2
step moe_decode_bench_v3 10 "$B/moe_decode_bench" v3 epilogue,pipelined,pipelined2
cat "$logs"/moe_decode_bench_*.log > "$OUT/moe_decode_bench.txt" 2>/dev/null
if [[ "${MOE128_PARTS:-all}" == quick ]]; then
  step routed_experts_backend_test 25 "$B/cuda_backend_test" --gtest_color=no \
    --gtest_filter='RoutedExpertsTest.EveryDecodeAlgo*:RoutedExpertsTest.Pipelined*'
  cat "$OUT/summary.txt"
  exit 0
fi
bench false 1,64,128
bench true 1,64,128 1
bench true 64,128 2
step decode_graph_gpu_test 12 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 10 "$B/cuda_parity_test" --gtest_color=no
step routed_experts_backend_test 25 "$B/cuda_backend_test" --gtest_color=no \
  --gtest_filter='RoutedExpertsTest.EveryDecodeAlgo*:RoutedExpertsTest.Pipelined*:RoutedExpertsTest.DeviceGrouped*:RoutedExpertsTest.PlannedChunk*'
bench false 64,128
bench true 64,128 1
bench true 64,128 2
cat "$OUT/summary.txt"
