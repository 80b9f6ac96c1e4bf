#!/bin/bash
# mlasmall_check.sh - session 8, branch s8-mlasmall: MlaDecodeSmallOptions::prefetch_before_wait
# (--mla-decode-small-prefetch) on the GPU machine, from a bundle made by tools/gpu/prepare.sh
# (which copies this script into it):
#
#   GPU_TESTS="//kernels/attention:mla_decode_small_test //worker/backend/cuda:cuda_backend_test
#     //worker/model:decode_graph_gpu_test //tests/parity:cuda_parity_test"
#     GPU_TOOLS="//tools/bench:deepinfer-bench //kernels/attention:mla_decode_small_bench"
#     GPU_DAEMONS="" tools/gpu/prepare.sh --out DIR
#   on the GPU machine: OUT=... bash DIR/mlasmall_check.sh
#
# Steps, each result in its own file under $OUT, in order of importance (a step is skipped
# once MLASMALL_BUDGET_S seconds, default 100, have passed):
#   tests.txt   the tests that run the kernel and the model's decode path (prefetch on: the
#               backend's default in the bundle)
#   kernel.txt  mla_decode_small_bench (1 token, 256-4096 positions, plain vs prefetch),
#               `chain` (the attention core, 8 arms alternating twice) and `shapes` (1 x 1024,
#               every cluster shape, plain vs prefetch)
#   ab27.txt    the 27-layer decode at 1 request, prefetch off / on, alternating twice
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mlasmall-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
budget=${MLASMALL_BUDGET_S:-100}
start=$(date +%s)
left() { (($(date +%s) - start < budget)); }
stamp() { echo "# t=$(($(date +%s) - start)) s"; }

{
  for t in mla_decode_small_test decode_graph_gpu_test cuda_parity_test; do
    echo "== $t"
    timeout 40 "$here/bin/$t" 2>&1 |
      grep -E '^\[  (PASSED|FAILED|  OK|SKIPPED)|^\[mla-decode-small\] .*(1024|4096):|Failure|error|Expected|Which is|actual|mismatch' |
      head -80
    echo "rc ${PIPESTATUS[0]}"
    stamp
  done
  echo "== cuda_backend_test (MLA cases)"
  timeout 30 "$here/bin/cuda_backend_test" --gtest_filter='*Mla*:*OneToken*' 2>&1 |
    grep -E '^\[  (PASSED|FAILED|  OK|SKIPPED)|Failure|error|Expected|mismatch' | head -60
  echo "rc ${PIPESTATUS[0]}"
  stamp
} > "$OUT/tests.txt" 2>&1

if left; then
  {
    timeout 20 "$here/bin/mla_decode_small_bench" 2>&1
    echo "rc $?"
    timeout 20 "$here/bin/mla_decode_small_bench" chain 2>&1
    echo "rc $?"
    timeout 20 "$here/bin/mla_decode_small_bench" shapes 2>&1
    echo "rc $?"
    stamp
  } > "$OUT/kernel.txt"
fi

bench=("$here/bin/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 3 --output-len 11
  --model "$here/configs/moonlight_shaped.json" --decode-num-requests 1 --prefill-batch-tokens 0
  --iters 3)
{
  for round in 1 2; do
    for v in false true; do
      left || break
      echo "== round $round: --mla-decode-small-prefetch=$v"
      timeout 30 "${bench[@]}" --mla-decode-small-prefetch=$v 2>&1 | grep -E '^(decode|prefill):|rror'
      stamp
    done
  done
} > "$OUT/ab27.txt" 2>&1
