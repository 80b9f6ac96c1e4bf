#!/bin/bash
# decode_graphs_check.sh - the CUDA-graph decode checks in one device call, from a folder made by
#   GPU_TESTS="//worker/model:decode_graph_gpu_test //kernels/moe:expert_counts_test \
#     //worker/backend/cuda:cuda_backend_test //tests/parity:cuda_parity_test" \
#   GPU_TOOLS="//tools/bench:deepinfer-bench" tools/gpu/prepare.sh --out DIR
#   cp tools/gpu/decode_graphs_check.sh DIR/
# then (device tool) `bash DIR/decode_graphs_check.sh`. Most important first, since the call
# may be cut short: the graph-vs-eager GPU test, the 4-layer Moonlight-shaped profile with and
# without graphs (separate processes: clean memory figures), the 27-layer model with graphs and
# the same decode steps eager in the same process (--compare-eager-decode: one 33 s load), then
# the backend and parity tests. One log per step in $OUT/logs.tar.gz (refreshed after each
# step), one line per step in $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/steps.sh"  # environment, step(), $OUT/machine.txt

bench4=("$B/deepinfer-bench" --backend cuda --model "$C/moonlight_shaped_4layers.json"
  --load-format dummy --decode-num-requests 1,64,128 --context-length 1024
  --prefill-batch-tokens 8192 --output-len 8 --warmup 2 --iters 2 --op-timing-steps 3
  --decode-fill random)
step decode_graph_gpu_test 60 "$B/decode_graph_gpu_test" --gtest_color=no
step expert_counts_test 20 "$B/expert_counts_test" --gtest_color=no
step bench4_graphs 45 "${bench4[@]}"
step bench4_eager 45 "${bench4[@]}" --cuda-graphs=false
step bench27_graphs_and_eager 110 "$B/deepinfer-bench" --backend cuda \
  --model "$C/moonlight_shaped.json" --load-format dummy --decode-num-requests 1,128 \
  --context-length 1024 --prefill-batch-tokens 8192 --output-len 16 --warmup 2 --iters 3 \
  --decode-fill random --compare-eager-decode
step cuda_backend_test 30 "$B/cuda_backend_test" --gtest_color=no
step cuda_parity_test 60 "$B/cuda_parity_test" --gtest_color=no
cat "$OUT/summary.txt"
