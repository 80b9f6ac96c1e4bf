#!/bin/bash
# mha_prefill_check.sh - the device run of the non-absorbed MLA prefill work in one call (copy it
# into a bundle made by tools/gpu/prepare.sh with at least mha_prefill_test, mla_prefill_test,
# cuda_parity_test, mha_prefill_gpu_test, decode_graph_gpu_test, mha_prefill_bench and
# deepinfer-bench): the tests, the two forms' micro-benchmark, the 4-layer Moonlight-shaped op
# profile with --prefill-attention absorbed and auto, the decode-graph test, memcheck of the
# kernel on two small cases, and the 27-layer 32 x 1024 prefill if time is left. Logs go to
# $OUT/logs.tar.gz (refreshed after each step), one line per step to $OUT/summary.txt.
#
#   bash DIR/mha_prefill_check.sh        (BUDGET_S: seconds for all steps, default 105)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export TEST_TMPDIR=${TEST_TMPDIR:-$(mktemp -d /tmp/mha-check.XXXXXX)}
STEP_BUDGET_S=${BUDGET_S:-105} . "$here/steps.sh"  # environment, step(), $OUT/machine.txt
step mha_prefill_test 30 "$B/mha_prefill_test" --gtest_color=no
step mla_prefill_test 30 "$B/mla_prefill_test" --gtest_color=no
step cuda_parity_test 25 "$B/cuda_parity_test" --gtest_color=no
step mha_prefill_gpu_test 25 "$B/mha_prefill_gpu_test" --gtest_color=no
step mha_prefill_bench 25 "$B/mha_prefill_bench"
bench=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random)
l4=(--model "$C/moonlight_shaped_4layers.json" --output-len 8 --warmup 2 --iters 3
  --decode-num-requests 1 --prefill-batch-tokens 8192 --op-timing-steps 2)
step bench4_absorbed 25 "${bench[@]}" "${l4[@]}" --prefill-attention absorbed
step bench4_auto 25 "${bench[@]}" "${l4[@]}" --prefill-attention auto
step decode_graph_gpu_test 30 "$B/decode_graph_gpu_test" --gtest_color=no
step memcheck_mha 20 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$B/mha_prefill_test" --gtest_color=no --gtest_filter='*chunked*:*heads20*:*Limits*'
step bench27_auto 45 "${bench[@]}" --model "$C/moonlight_shaped.json" --output-len 4 --warmup 1 \
  --iters 3 --decode-num-requests 1 --prefill-batch-tokens 32768 --prefill-attention auto
for f in "$logs"/bench*.log "$logs"/mha_prefill_bench.log; do
  [[ -f "$f" ]] && { echo "== $(basename "$f")"; grep -E "prefill|decode|Mla|Mha|BatchedGemm|total|x " "$f"; } >> "$summary"
done
exit "$failed"
