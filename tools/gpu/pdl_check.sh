#!/bin/bash
# pdl_check.sh - one short device call for programmatic dependent launch (docs/cuda.md,
# "Programmatic dependent launch"), from a folder made by
#   GPU_TESTS="//kernels/common:launch_test //kernels/activation:elementwise_test \
#     //kernels/embedding:rows_test //kernels/gemm:small_m_gemm_test \
#     //kernels/moe:expert_activation_test //kernels/moe:expert_counts_test \
#     //kernels/moe:noaux_tc_router_test //kernels/moe:permute_test //kernels/norm:rms_norm_test \
#     //kernels/rope:rope_test //kernels/sampling:argmax_test //kernels/sampling:sample_test \
#     //worker/backend/cuda:cuda_backend_test //tests/parity:cuda_parity_test \
#     //worker/model:decode_graph_gpu_test" \
#   GPU_TOOLS="//worker/backend/cuda:graph_alloc_bench //tools/bench:deepinfer-bench" \
#   GPU_DAEMONS="" tools/gpu/prepare.sh --out DIR --pack PACK.tar.xz
# then (device tool) untar and `bash DIR/pdl_check.sh`. Every test at once (they share the GPU;
# none is timed), then graph_alloc_bench (empty / rounding / norm+GEMV chains in a graph, PDL
# off and on, allocations in the chain or beside it), then the 27-layer Moonlight-shaped bench
# with PDL on and, in the same process on the same sequences, off (--compare-pdl-off-decode),
# then the 4-layer one at 1 request with the allocations beside the chain and in it. Budget
# PDL_BUDGET_S (default 105 s).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${PDL_BUDGET_S:-105} . "$here/steps.sh"  # environment, step(), $OUT/machine.txt
tests=(launch_test elementwise_test rows_test small_m_gemm_test expert_activation_test
  expert_counts_test noaux_tc_router_test permute_test rms_norm_test rope_test argmax_test
  sample_test cuda_backend_test cuda_parity_test decode_graph_gpu_test)
# Runs every test binary in the background, then prints each one's output and its exit status;
# fails if any failed.
all_tests() {
  local dir rc=0
  dir=$(mktemp -d)
  for t in "${tests[@]}"; do
    ("$B/$t" --gtest_color=no > "$dir/$t.log" 2>&1; echo $? > "$dir/$t.rc") &
  done
  wait
  for t in "${tests[@]}"; do
    echo "=== $t: rc $(cat "$dir/$t.rc")"
    cat "$dir/$t.log"
    [[ "$(cat "$dir/$t.rc")" == 0 ]] || rc=1
  done
  return $rc
}
export -f all_tests
export B
export tests_list="${tests[*]}"
step all_tests 50 bash -c 'tests=($tests_list); all_tests'
step graph_alloc_bench 12 "$B/graph_alloc_bench"
step bench27_pdl_on_off 100 "$B/deepinfer-bench" --backend cuda --dtype bfloat16 \
  --load-format dummy --seed 1 --context-length 1024 --decode-fill random \
  --model "$C/moonlight_shaped.json" --output-len 11 --warmup 3 --iters 1 \
  --decode-num-requests 1,128 --prefill-batch-tokens 1024 --compare-pdl-off-decode
# What capturing the small allocations beside the kernel chain adds (4 layers, 1 request).
for aside in true false; do
  step "bench4_aside_$aside" 15 "$B/deepinfer-bench" --backend cuda --dtype bfloat16 \
    --load-format dummy --seed 1 --context-length 1024 --decode-fill random \
    --model "$C/moonlight_shaped_4layers.json" --output-len 11 --warmup 3 --iters 1 \
    --decode-num-requests 1 --prefill-batch-tokens 0 --graph-allocations-aside=$aside
done
echo "total $(($(date +%s) - steps_start)) s" >> "$summary"
grep -E "^=== " "$logs/all_tests.log" >> "$summary" 2>/dev/null
cat "$summary"
