#!/bin/bash
# moe_prefill_check.sh - the device run of the prefill MoE work (bf16 expert GEMM outputs,
# SiluMulBf16, bf16 combine, vectorised padded gather, kGrouped) in one call. Copy it into a
# bundle made by tools/gpu/prepare.sh with at least expert_activation_test, permute_test,
# cuda_backend_test, cuda_parity_test, moe_prefill_bench and deepinfer-bench:
#
#   GPU_TESTS="//kernels/moe:expert_activation_test //kernels/moe:permute_test \
#     //worker/backend/cuda:cuda_backend_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//kernels/moe:moe_prefill_bench //tools/bench:deepinfer-bench" GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out DIR && cp tools/gpu/moe_prefill_check.sh DIR/
#   device tool: carry [DIR], command `bash DIR/moe_prefill_check.sh`
#
# Steps: the tests (correctness first), moe_prefill_bench (old and new forms in one binary),
# the 4-layer Moonlight-shaped prefill (8192 tokens) throughput, then its op profile. Logs in
# $OUT/logs.tar.gz (refreshed after each step), one line per step in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/steps.sh"  # environment, step(), $OUT/machine.txt
step expert_activation_test 15 "$here/bin/expert_activation_test" --gtest_color=no
step permute_test 20 "$here/bin/permute_test" --gtest_color=no
step routed_experts 30 "$here/bin/cuda_backend_test" --gtest_color=no \
  --gtest_filter='RoutedExperts*'
step cuda_parity_test 30 "$here/bin/cuda_parity_test" --gtest_color=no
step moe_prefill_bench 40 "$here/bin/moe_prefill_bench"
bench=("$here/bin/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy
  --model "$here/configs/moonlight_shaped_4layers.json" --decode-num-requests 1
  --context-length 1024 --prefill-batch-tokens 8192)
step l4_prefill 30 "${bench[@]}" --output-len 4 --warmup 1 --iters 3
step l4_profile 30 "${bench[@]}" --output-len 4 --warmup 1 --iters 1 --op-timing-steps 2
step cuda_backend_test 40 "$here/bin/cuda_backend_test" --gtest_color=no
