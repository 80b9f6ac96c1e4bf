#!/bin/bash
# moeblk2_check.sh - the kPipelined MoE block kernels (branch s7-moeblk2) in one device call
# (<= 120 s), from a folder made by
#   GPU_TESTS="//kernels/moe:moe_decode_fused_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//worker/backend/cuda:moe_block_decode_bench //tools/bench:deepinfer-bench" \
#   GPU_DAEMONS="" tools/gpu/prepare.sh --out DIR --pack PACK.tar.xz
# then (device tool) `mkdir -p /tmp/b && tar xJf PACK -C /tmp/b && bash /tmp/b/DIR/moeblk2_check.sh`.
# Steps: the kernel test (every kernel pair against the CPU backend, kPipelined == kPersistent
# bit for bit), the backend's fused-block test (eager, replay), the model's decode-graph and
# parity tests (with the default kernels), moe_block_decode_bench (old ops vs kPersistent vs
# kPipelined and their grids), the 27-layer Moonlight-shaped bench at 1 request with
# kPersistent and kPipelined (twice each, alternating), and Nsight Compute kernel times of the
# 4-layer config with each pair. One line per step in $OUT/summary.txt, logs in
# $OUT/logs.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${BUDGET_S:-112} . "$here/steps.sh"

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --model "$C/moonlight_shaped.json"
  --decode-num-requests 1 --prefill-batch-tokens 0 --output-len 11 --warmup 3 --iters 3)
step moe_decode_fused_test 20 "$B/moe_decode_fused_test" --gtest_color=no
step fused_block_backend_test 20 "$B/cuda_backend_test" --gtest_color=no \
  --gtest_filter='RoutedExpertsTest.RoutedAndShared*'
step decode_graph_gpu_test 15 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 15 "$B/cuda_parity_test" --gtest_color=no
step moe_block_decode_bench 35 "$B/moe_block_decode_bench"
cp "$logs/moe_block_decode_bench.log" "$OUT/moe_block_decode_bench.txt" 2>/dev/null
for k in pipelined persistent pipelined persistent; do
  step "bench27_$k" 20 "${bench27[@]}" --decode-moe-fused-kernels "$k"
done
for k in pipelined persistent; do
  KT_FLAGS="--decode-moe-fused-kernels $k" step "kt4_$k" 25 \
    bash "$here/kernel_times.sh" "$C/moonlight_shaped_4layers.json" 1 "kt4_$k"
done
cat "$OUT/summary.txt"
