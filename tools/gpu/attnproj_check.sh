#!/bin/bash
# attnproj_check.sh - the staged GEMV's shared-memory weight layout (kernels/gemm/staged_gemv.h,
# StagedGemvWeights) in one short device call, from a folder made by
#   GPU_TESTS="//kernels/gemm:staged_gemv_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//kernels/gemm:small_m_gemm_bench //tools/bench:deepinfer-bench" GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out DIR --pack FILE.tar.xz
# then (device tool) `bash DIR/attnproj_check.sh`. The tests of the changed kernel and paths
# (the backend's default layout, kSharedMemory), the layouts micro-benchmark (small-m, registers,
# shared in one binary), the 27-layer Moonlight-shaped decode at 1 request with each layout, and
# the per-kernel times of the 4-layer decode graph with the shared layout (kernel_times.sh). Every step is cut at the call's deadline (ATTNPROJ_BUDGET_S, default
# 110 s from the start). Logs in $OUT/logs.tar.gz, one line per step in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${ATTNPROJ_BUDGET_S:-110} . "$here/steps.sh"  # environment, step(), machine.txt

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 3 --output-len 11
  --model "$C/moonlight_shaped.json" --decode-num-requests 1 --prefill-batch-tokens 0 --iters 1)
step staged_gemv_test 15 "$B/staged_gemv_test" --gtest_color=no
step cuda_backend_test 15 "$B/cuda_backend_test" --gtest_color=no \
  --gtest_filter='*AddRmsNormGemms*:*OneRowGemm*:*Bf16Gemm*:*Bf16Activation*'
step decode_graph_gpu_test 15 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 15 "$B/cuda_parity_test" --gtest_color=no
step layouts_bench 25 "$B/small_m_gemm_bench" layouts
step bench27_registers 25 "${bench27[@]}" --staged-gemv-weights=registers
step bench27_shared 25 "${bench27[@]}" --staged-gemv-weights=shared
# Per-kernel times inside the 4-layer decode graph at 1 request (Nsight Compute), shared layout.
export KT_FLAGS="--staged-gemv-weights=shared" OUT
step kernel_times_shared 25 \
  bash "$here/kernel_times.sh" "$C/moonlight_shaped_4layers.json" 1 kernels4_1_shared
cat "$OUT/summary.txt"
