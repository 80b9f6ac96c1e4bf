#!/bin/bash
# gemv_check.sh - the decode-at-1-request kernel checks in one short device call, from a folder
# made by
#   GPU_TESTS="//kernels/gemm:small_m_gemm_test //kernels/moe:grouped_gemm_test \
#     //worker/backend/cuda:cuda_backend_test //worker/model:decode_graph_gpu_test \
#     //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//kernels/gemm:small_m_gemm_bench //kernels/moe:grouped_gemm_bench \
#     //worker/backend/cuda:graph_alloc_bench //tools/bench:deepinfer-bench" GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out DIR && cp tools/gpu/gemv_check.sh DIR/
# then (device tool) `bash DIR/gemv_check.sh`. The tests of the changed kernels and paths first,
# then the micro-benchmarks (old and new layouts in one binary), then the 27-layer Moonlight-shaped
# decode bench (the backend's default, then at 1 request with the small-m kernel forced to each
# layout). Every step is cut at the call's deadline (GEMV_BUDGET_S, default 110 s from the start;
# on the H200 the 27-layer bench did not finish within 40 s, so give it a call of its own). One log per step in $OUT/logs.tar.gz (refreshed after each step), one
# line per step in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${GEMV_BUDGET_S:-110} . "$here/steps.sh"  # environment, step(), $OUT/machine.txt

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --model "$C/moonlight_shaped.json"
  --prefill-batch-tokens 8192 --warmup 3 --output-len 11 --iters 1)
step small_m_gemm_test 20 "$B/small_m_gemm_test" --gtest_color=no
step grouped_gemm_test 25 "$B/grouped_gemm_test" --gtest_color=no
step cuda_backend_test 25 "$B/cuda_backend_test" --gtest_color=no \
  --gtest_filter='*BatchedGemm*:*Bf16Gemm*:*Bf16Activation*:*GemmMatchesCpu*:*DeviceGroupedPath*'
step decode_graph_gpu_test 25 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 25 "$B/cuda_parity_test" --gtest_color=no
step small_m_gemm_bench 20 "$B/small_m_gemm_bench"
step grouped_gemm_bench 10 "$B/grouped_gemm_bench" --decode
step graph_alloc_bench 5 "$B/graph_alloc_bench"
step bench27 90 "${bench27[@]}" --decode-num-requests 1,64,128
step bench27_1_row 60 "${bench27[@]}" --decode-num-requests 1 --small-m-gemm-algo row
step bench27_1_split 60 "${bench27[@]}" --decode-num-requests 1 --small-m-gemm-algo split-k
cat "$OUT/summary.txt"
