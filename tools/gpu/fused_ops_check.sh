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
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
logs=/tmp/fuse-logs
rm -rf "$logs"
mkdir -p "$logs"
summary="$OUT/summary.txt"
: > "$summary"
start=$(date +%s)
budget=${BUDGET_S:-140}
step() {  # step NAME MAX_S COMMAND...: skipped when the budget is spent
  local name=$1 limit=$2
  shift 2
  if [[ ! -x $1 ]]; then echo "$name SKIPPED (not bundled)" >> "$summary"; return; fi
  local left=$((budget - ($(date +%s) - start)))
  if ((left < 5)); then echo "$name SKIPPED (budget)" >> "$summary"; return; fi
  ((limit > left)) && limit=$left
  local t0=$(date +%s%N)
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  printf '%-34s rc=%-3d %6d ms  %s\n' "$name" "$rc" "$ms" \
    "$(grep -E '^\[  (PASSED|FAILED) |^decode:|^prefill:' "$logs/$name.log" | tr '\n' ' ' | cut -c1-900)" \
    >> "$summary"
  tar -C "$logs" -czf "$OUT/logs.tar.gz" .
}
{
  echo "commit: $(head -1 "$here/COMMIT" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
} > "$OUT/machine.txt" 2>&1
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
echo "total $(($(date +%s) - start)) s" >> "$summary"
