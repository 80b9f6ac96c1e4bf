#!/bin/bash
# fused_ops_check.sh - one device call for the fused decode ops (docs/cuda.md, "Fused decode
# ops"): the GPU tests they touch, small_m_gemm_bench, then deepinfer-bench on the 4-layer and
# 27-layer Moonlight shapes with fused ops and, in the same process, without
# (--compare-unfused-decode), and a per-op profile of one 4-layer decode step both ways.
# Copied into a bundle made by tools/gpu/prepare.sh (GPU_TESTS / GPU_TOOLS naming these
# binaries); results land in $OUT (summary.txt, logs.tar.gz), refreshed after every step.
#   device tool: carry [".gpu/fuse"], command `bash .gpu/fuse/fused_ops_check.sh`
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${BUDGET_S:-140} . "$here/steps.sh"  # environment, step(), $OUT/machine.txt
bin=$here/bin
for t in small_m_gemm_test rms_norm_test rope_test cuda_backend_test; do
  step "$t" 40 "$bin/$t" --gtest_color=no
done
step small_m_gemm_bench 25 "$bin/small_m_gemm_bench"
common=(--backend cuda --dtype bfloat16 --load-format dummy --seed 1 --context-length 1024
        --decode-fill random --output-len 8 --warmup 2 --iters 3)
step bench4 40 "$bin/deepinfer-bench" "${common[@]}" --model "$here/configs/moonlight_shaped_4layers.json" \
  --decode-num-requests 1,64,128 --prefill-batch-tokens 8192 --compare-unfused-decode \
  --op-timing-steps 2
step bench4_unfused_ops 25 "$bin/deepinfer-bench" "${common[@]}" \
  --model "$here/configs/moonlight_shaped_4layers.json" --decode-num-requests 1,128 \
  --prefill-batch-tokens 8192 --fused-ops=false --op-timing-steps 2
step cuda_parity_test 30 "$bin/cuda_parity_test" --gtest_color=no
step decode_graph_gpu_test 30 "$bin/decode_graph_gpu_test" --gtest_color=no
step bench27 90 "$bin/deepinfer-bench" "${common[@]}" --model "$here/configs/moonlight_shaped.json" \
  --decode-num-requests 1,64,128 --prefill-batch-tokens 8192 --compare-unfused-decode
step ep_expert_dispatcher_gpu_test 20 "$bin/ep_expert_dispatcher_gpu_test" --gtest_color=no
echo "total $(($(date +%s) - steps_start)) s" >> "$summary"
