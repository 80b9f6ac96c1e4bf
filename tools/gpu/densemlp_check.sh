#!/bin/bash
# densemlp_check.sh - the dense MLP layer at one decode token through the fused MoE block's
# kernels (branch s7-densemlp: Backend::NormedDenseMlp, CudaBackend::SetDecodeDenseMlpFused,
# deepinfer-bench --decode-dense-mlp-fused) in one device call (<= 115 s), from a folder made by
#   GPU_TESTS="//kernels/moe:moe_decode_fused_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//tools/bench:deepinfer-bench" GPU_DAEMONS="" \
#   tools/gpu/prepare.sh --out DIR --pack PACK.tar.xz
# then (device tool) `mkdir -p /tmp/b && tar xJf PACK -C /tmp/b && bash /tmp/b/DIR/densemlp_check.sh`.
# Steps: the kernel test (top_k 0 cases, every kernel pair, against the CPU backend), the
# backend's op test (eager, replay, declines) with the fused MoE block's, the 27-layer
# Moonlight-shaped bench at 1 request with the switch off / on / off / on, then the model's
# decode-graph test (replay == padded eager with the switch on, close to the ops) and the parity
# tests (a bf16 case with the switch on). One line per step in $OUT/summary.txt, logs in
# $OUT/logs.tar.gz.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${BUDGET_S:-115} . "$here/steps.sh"

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --model "$C/moonlight_shaped.json"
  --decode-num-requests 1 --prefill-batch-tokens 0 --output-len 11 --warmup 3 --iters 3)
step moe_decode_fused_test 20 "$B/moe_decode_fused_test" --gtest_color=no
step dense_mlp_backend_test 12 "$B/cuda_backend_test" --gtest_color=no \
  --gtest_filter='CudaBackendTest.NormedDenseMlp*:RoutedExpertsTest.RoutedAndShared*'
for on in false true false true; do
  step "bench27_dense_mlp_fused_$on" 15 "${bench27[@]}" --decode-dense-mlp-fused="$on"
done
step decode_graph_gpu_test 15 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 15 "$B/cuda_parity_test" --gtest_color=no
cat "$OUT/summary.txt"
