#!/bin/bash
# mla128_check.sh - session 8, branch s8-mla128: the batched MLA decode kernel's variants 8 (bf16
# Q and P) and 9 (8 with the split merge in a thread-block cluster) on the GPU machine, from a
# bundle made by tools/gpu/prepare.sh (which copies this script into it):
#
#   GPU_TESTS="//kernels/attention:mla_attention_test //kernels/attention:mla_prefill_test
#     //worker/backend/cuda:cuda_backend_test //worker/model:decode_graph_gpu_test
#     //tests/parity:cuda_parity_test" GPU_TOOLS="//kernels/attention:mla_attention_bench
#     //tools/bench:deepinfer-bench" GPU_DAEMONS="" tools/gpu/prepare.sh --out DIR
#   on the GPU machine: OUT=... bash DIR/mla128_check.sh
#
# Steps, each result in its own file under $OUT, in order of importance (a step is skipped
# once MLA128_BUDGET_S seconds, default 85, have passed):
#   tests.txt   the tests that run the changed kernel (all at once: they are short), and the
#               model's decode path (graphs, HF parity) on the new default
#   kern.txt    mla_attention_bench at 128 and 64 decode tokens x 1024 (every variant; graph
#               lines "mma vN graph", "mma v9 cl graph" for the cluster merge)
#   ab27.txt    the 27-layer decode at 64 and 128 requests, --mla-decode-variant 7 / 9
#               alternating (A B A B), then 8 once
#   kern2.txt   mla_attention_bench at 256 x 1024 and 128 x 4096, if time is left
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mla128-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
budget=${MLA128_BUDGET_S:-85}
start=$(date +%s)
left() { (($(date +%s) - start < budget)); }
stamp() { echo "# t=$(($(date +%s) - start)) s"; }

logs=$(mktemp -d)
run_test() {  # $1: name, then the binary's arguments
  local name=$1
  shift
  timeout 40 "$here/bin/$name" --gtest_color=no "$@" > "$logs/$name.log" 2>&1
  echo "rc $?" >> "$logs/$name.log"
}
run_test mla_attention_test --gtest_filter='*bf16*:*Limits*' &
run_test cuda_backend_test --gtest_filter='*Mla*:*OneToken*' &
run_test mla_prefill_test --gtest_filter='*PicksThePath*' &
run_test decode_graph_gpu_test &
run_test cuda_parity_test &
wait
{
  for t in mla_attention_test cuda_backend_test mla_prefill_test decode_graph_gpu_test \
    cuda_parity_test; do
    echo "== $t"
    grep -E '^\[  (PASSED|FAILED|  OK|SKIPPED)|Failure|rror|Expected|Which is|actual|mismatch|^rc ' \
      "$logs/$t.log" | head -80
  done
  echo "== mla_attention_test: max diffs (variants 7-9)"
  grep -E 'variant [789] |unrounded' "$logs/mla_attention_test.log" | head -120
  echo "== decode_graph_gpu_test / cuda_parity_test: printed lines"
  grep -E '^\[(decode-graphs|cuda-parity|bf16-parity|bf16)' "$logs/decode_graph_gpu_test.log" "$logs/cuda_parity_test.log" |
    head -60
  stamp
} > "$OUT/tests.txt" 2>&1
tar -C "$logs" -czf "$OUT/testlogs.tar.gz" . 2>/dev/null

if left; then
  {
    for c in "128 x ctx1024 h16" "64 x ctx1024 h16"; do
      timeout 20 "$here/bin/mla_attention_bench" "$c" 2>&1
      echo "rc $?"
    done
    stamp
  } > "$OUT/kern.txt"
fi

bench=("$here/bin/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 3 --output-len 11
  --model "$here/configs/moonlight_shaped.json" --decode-num-requests 64,128
  --prefill-batch-tokens 0 --iters 3)
arm() {  # $1: the variant
  echo "== --mla-decode-variant $1"
  timeout 30 "${bench[@]}" --mla-decode-variant "$1" 2>&1 | grep -E '^(decode|prefill):|rror'
  stamp
}
for round in 1 2; do
  left || break
  arm 7 >> "$OUT/ab27.txt"
  left || break
  arm 9 >> "$OUT/ab27.txt"
done
if left; then arm 8 >> "$OUT/ab27.txt"; fi
if left; then
  {
    for c in "256 x ctx1024 h16" "128 x ctx4096 h16"; do
      timeout 15 "$here/bin/mla_attention_bench" "$c" 2>&1 | grep -E 'graph|mma v[789] |rc '
    done
    stamp
  } > "$OUT/kern2.txt"
fi
exit 0
