#!/bin/bash
# router_check.sh - the fused decode router's device run (session 6, helper "router"), from a
# bundle tools/gpu/prepare.sh made with
#   GPU_TESTS="//kernels/moe:noaux_tc_router_test //kernels/moe:noaux_tc_router_fused_test
#     //kernels/moe:expert_counts_test //worker/backend/cuda:cuda_backend_test
#     //tests/parity:cuda_parity_test //worker/model:decode_graph_gpu_test"
#   GPU_TOOLS="//kernels/moe:noaux_tc_router_bench //tools/bench:deepinfer-bench" GPU_DAEMONS=""
# (prepare.sh copies tools/gpu/*_check.sh into the bundle). Writes, each step under its own
# time limit: $OUT/tests.txt, $OUT/router_bench.txt (noaux_tc_router_bench: old ops vs fused,
# every tile), $OUT/bench4.txt (4-layer deepinfer-bench, --fused-router on then off),
# $OUT/kernels_1.txt and $OUT/kernels_128.txt (kernel_times.sh, fused router on).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export TEST_WORKSPACE=deepinfer

for t in noaux_tc_router_fused_test noaux_tc_router_test expert_counts_test cuda_backend_test \
  cuda_parity_test decode_graph_gpu_test; do
  t0=$(date +%s%N)
  timeout 40 "$here/bin/$t" > "$OUT/$t.log" 2>&1
  rc=$?
  printf '%-32s rc %d %6d ms  %s\n' "$t" "$rc" $((($(date +%s%N) - t0) / 1000000)) \
    "$(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$t.log" | tr '\n' ' ')" >> "$OUT/tests.txt"
  if [[ $rc -ne 0 ]]; then
    { echo "---- $t"; grep -B2 -A12 -E 'Failure|FAILED|error' "$OUT/$t.log" | head -80; } \
      >> "$OUT/tests.txt"
  fi
  rm -f "$OUT/$t.log"
done

timeout 30 "$here/bin/noaux_tc_router_bench" > "$OUT/router_bench.txt" 2>&1
echo "# exit $?" >> "$OUT/router_bench.txt"

bench=("$here/bin/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 2 --output-len 8 --iters 3
  --model "$here/configs/moonlight_shaped_4layers.json" --decode-num-requests 1,128
  --prefill-batch-tokens 1024)
for fused in true false; do
  echo "## --fused-router=$fused" >> "$OUT/bench4.txt"
  timeout 25 "${bench[@]}" --fused-router="$fused" 2>&1 | grep -E '^(prefill|decode)' \
    >> "$OUT/bench4.txt"
done

for n in 1 128; do
  OUT="$OUT" timeout 25 bash "$here/kernel_times.sh" "$here/configs/moonlight_shaped_4layers.json" "$n"
done
