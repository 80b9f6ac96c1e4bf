#!/bin/bash
# attnproj_check.sh - the staged GEMV at two rows (CudaBackend::SetStagedGemvMaxRows) in one short
# device call, from a folder made by
#   GPU_TESTS="//kernels/gemm:staged_gemv_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//kernels/gemm:small_m_gemm_bench //tools/bench:deepinfer-bench" GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out DIR --pack FILE.tar.xz
# then (device tool) `bash DIR/attnproj_check.sh`. The tests of the changed paths, the staged
# micro-benchmark (small-m and staged in one binary at 1, 2 and 4 rows, in a chain and after a
# GEMV), then the 27-layer Moonlight-shaped decode at 2 and 1 requests with the staged GEMV up to
# one row (as before) and up to two rows. Every step is cut at the call's deadline
# (ATTNPROJ_BUDGET_S, default 110 s from the start). Logs in $OUT/logs.tar.gz, one line per step
# in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${ATTNPROJ_BUDGET_S:-110} . "$here/steps.sh"  # environment, step(), machine.txt

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 3 --output-len 11
  --model "$C/moonlight_shaped.json" --prefill-batch-tokens 0 --iters 1)
step staged_gemv_test 15 "$B/staged_gemv_test" --gtest_color=no
step cuda_backend_test 15 "$B/cuda_backend_test" --gtest_color=no \
  --gtest_filter='*AddRmsNormGemms*:*TwoRowGemm*:*Bf16Gemm*:*Bf16Activation*'
step decode_graph_gpu_test 15 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 15 "$B/cuda_parity_test" --gtest_color=no
step staged_bench 25 "$B/small_m_gemm_bench" staged
step bench27_2_max1 20 "${bench27[@]}" --decode-num-requests 2 --staged-gemv-max-rows 1
step bench27_2_max2 20 "${bench27[@]}" --decode-num-requests 2 --staged-gemv-max-rows 2
step bench27_1_max2 20 "${bench27[@]}" --decode-num-requests 1 --staged-gemv-max-rows 2
cat "$OUT/summary.txt"
