#!/bin/bash
# attn1_check.sh - session 8, branch s8-attn1: the one-token attention block's switches on the
# GPU machine, from a bundle made by tools/gpu/prepare.sh (which copies this script into it):
#
#   GPU_TESTS="//kernels/rope:rope_test //kernels/attention:mla_decode_small_test
#     //worker/backend/cuda:cuda_backend_test //worker/model:decode_graph_gpu_test
#     //tests/parity:cuda_parity_test" GPU_TOOLS="//tools/bench:deepinfer-bench
#     //kernels/attention:mla_decode_small_bench" GPU_DAEMONS="" tools/gpu/prepare.sh --out DIR
#   on the GPU machine: OUT=... bash DIR/attn1_check.sh
#
# Steps, each result in its own file under $OUT, in order of importance (a step is skipped
# once ATTN1_BUDGET_S seconds, default 100, have passed):
#   tests.txt   the tests that run the changed kernels and the model's decode path
#   chain.txt   mla_decode_small_bench chain: the attention core, 4 arms alternating twice
#   ab27.txt    the 27-layer decode at 1 request, both switches off / on, alternating twice
#   single.txt  each switch alone (27 layers, one run each)
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/attn1-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
budget=${ATTN1_BUDGET_S:-100}
start=$(date +%s)
left() { (($(date +%s) - start < budget)); }
stamp() { echo "# t=$(($(date +%s) - start)) s"; }

{
  for t in rope_test mla_decode_small_test decode_graph_gpu_test cuda_parity_test; do
    echo "== $t"
    timeout 60 "$here/bin/$t" 2>&1 | grep -E '^\[  (PASSED|FAILED|  OK|SKIPPED)|Failure|error|Expected|Which is|actual|mismatch' | head -60
    echo "rc ${PIPESTATUS[0]}"
  done
  echo "== cuda_backend_test (MLA, rope, W_uk cases)"
  timeout 60 "$here/bin/cuda_backend_test" \
    --gtest_filter='*NormRope*:*Mla*:*OneToken*:*BatchedGemm*' 2>&1 |
    grep -E '^\[  (PASSED|FAILED|  OK|SKIPPED)|Failure|error|Expected|mismatch' | head -60
  echo "rc ${PIPESTATUS[0]}"
  stamp
} > "$OUT/tests.txt" 2>&1

if left; then
  { timeout 30 "$here/bin/mla_decode_small_bench" chain 2>&1; echo "rc $?"; stamp; } > "$OUT/chain.txt"
fi

bench=("$here/bin/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 3 --output-len 11
  --model "$here/configs/moonlight_shaped.json" --decode-num-requests 1 --prefill-batch-tokens 0
  --iters 3)
arm() {  # $1: label, then the switch flags
  local label=$1
  shift
  echo "== $label: $*"
  timeout 40 "${bench[@]}" "$@" 2>&1 | grep -E '^(decode|prefill):|rror'
  stamp
}
off=(--norm-rope-cache-absorb-fused=false --mla-decode-small-early-dependents=false)
on=(--norm-rope-cache-absorb-fused=true --mla-decode-small-early-dependents=true)
for round in 1 2; do
  left || break
  arm "off (round $round)" "${off[@]}" >> "$OUT/ab27.txt"
  left || break
  arm "on (round $round)" "${on[@]}" >> "$OUT/ab27.txt"
done
if left; then
  arm "fused only" --norm-rope-cache-absorb-fused=true --mla-decode-small-early-dependents=false \
    >> "$OUT/single.txt"
fi
if left; then
  arm "early only" --norm-rope-cache-absorb-fused=false --mla-decode-small-early-dependents=true \
    >> "$OUT/single.txt"
fi
exit 0
