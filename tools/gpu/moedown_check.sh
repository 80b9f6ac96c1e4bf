#!/bin/bash
# moedown_check.sh - the kStationary MoE block kernels (branch s7-moedown) in one device call
# (<= 100 s), from a folder made by
#   GPU_TESTS="//kernels/moe:moe_decode_fused_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//worker/backend/cuda:moe_block_decode_bench //tools/bench:deepinfer-bench" \
#   GPU_DAEMONS="" tools/gpu/prepare.sh --out DIR --pack PACK.tar.xz
# then (device tool) `mkdir -p /tmp/b && tar xJf PACK -C /tmp/b && bash /tmp/b/DIR/moedown_check.sh`.
# Steps: the kernel test (every kernel pair against the CPU backend), the backend's fused-block
# test (eager, replay), the model's decode-graph and parity tests (default kernels: kStationary
# at Moonlight's width), moe_block_decode_bench (old ops vs kPersistent, kPipelined and
# kStationary, Moonlight and V3, 1 and 2 tokens), the 27-layer Moonlight-shaped bench at 1
# request with kPipelined and kStationary (twice each, alternating), and Nsight Compute kernel
# times of the 4-layer config with kStationary. One line per step in $OUT/summary.txt, logs in
# $OUT/logs.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${BUDGET_S:-98} . "$here/steps.sh"

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --model "$C/moonlight_shaped.json"
  --decode-num-requests 1 --prefill-batch-tokens 0 --output-len 11 --warmup 3 --iters 3)
step moe_decode_fused_test 15 "$B/moe_decode_fused_test" --gtest_color=no
step fused_block_backend_test 12 "$B/cuda_backend_test" --gtest_color=no \
  --gtest_filter='RoutedExpertsTest.RoutedAndShared*'
step decode_graph_gpu_test 12 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 12 "$B/cuda_parity_test" --gtest_color=no
step moe_block_decode_bench 25 "$B/moe_block_decode_bench"
cp "$logs/moe_block_decode_bench.log" "$OUT/moe_block_decode_bench.txt" 2>/dev/null
for k in pipelined stationary pipelined stationary; do
  step "bench27_$k" 15 "${bench27[@]}" --decode-moe-fused-kernels "$k"
done
KT_FLAGS="--decode-moe-fused-kernels stationary" step kt4_stationary 20 \
  bash "$here/kernel_times.sh" "$C/moonlight_shaped_4layers.json" 1 kt4_stationary
cat "$OUT/summary.txt"
