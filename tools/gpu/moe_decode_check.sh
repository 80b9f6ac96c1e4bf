#!/bin/bash
# moe_decode_check.sh - the decode expert-GEMM checks in one device call (<= 120 s), from a
# folder made by
#   GPU_TESTS="//kernels/moe:grouped_gemm_test //worker/backend/cuda:cuda_backend_test \
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//worker/backend/cuda:moe_decode_bench //kernels/moe:grouped_gemm_bench \
#     //tools/bench:deepinfer-bench" GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out DIR --pack PACK.tar.xz   (after cp tools/gpu/moe_decode_check.sh
#     into DIR; or copy it in before packing)
# then (device tool) `mkdir -p /tmp/b && tar xJf PACK -C /tmp/b && bash /tmp/b/DIR/moe_decode_check.sh`.
# Most important first, since the call may be cut short: the kernel tests against exact
# products, the backend's RoutedExperts tests (every decode algorithm and planned chunk size),
# the CUDA-graph decode test, the parity test, moe_decode_bench (a whole layer in a CUDA graph,
# old vs new), grouped_gemm_bench (every way, both shapes), then the 27-layer Moonlight-shaped bench with the backend's choice. Each step's limit is cut
# to what is left of BUDGET_S (default 112 s). One log per step in $OUT/logs.tar.gz (refreshed
# after each step), one line per step in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${BUDGET_S:-112} . "$here/steps.sh"  # environment, step(), $OUT/machine.txt

bench27=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --model "$C/moonlight_shaped.json"
  --decode-num-requests 1,64,128 --prefill-batch-tokens 8192 --warmup 3 --output-len 11 --iters 1)
# The planned-chunk kernel tests first (the whole grouped_gemm_test took > 25 s in the run of
# commit 99cea35: its fp32-activation cases' CPU references are slow).
step planned_gemm_test 25 "$B/grouped_gemm_test" --gtest_color=no \
  --gtest_filter='PlannedExpertGemms*:GroupedGemmBf16StreamTest.MatchesExactProducts'

step routed_experts_test 25 "$B/cuda_backend_test" --gtest_color=no --gtest_filter='RoutedExpertsTest.*'
step decode_graph_gpu_test 20 "$B/decode_graph_gpu_test" --gtest_color=no
step cuda_parity_test 20 "$B/cuda_parity_test" --gtest_color=no
step moe_decode_bench 30 "$B/moe_decode_bench"
step grouped_gemm_bench 30 "$B/grouped_gemm_bench"
# The 27-layer bench needs more than the 45 s left in that run: give it its own call.
step bench27_auto 60 "${bench27[@]}"
cat "$OUT/summary.txt"
