#!/bin/bash
# mla_prefill_check.sh - the device run of the tensor-core MLA prefill work in one call (copy it
# into a bundle made by tools/gpu/prepare.sh with at least mla_prefill_test, cuda_parity_test,
# mla_prefill_bench and deepinfer-bench): the tests, the kernel benchmark, the 4-layer
# Moonlight-shaped op profile with the prefill path on and off (--mla-prefill-min-tokens 0), and
# the 27-layer prefill with it on (and off, if the time left allows). Logs go to
# $OUT/logs.tar.gz (refreshed after each step), one line per step to $OUT/summary.txt.
#
#   bash DIR/mla_prefill_check.sh        (BUDGET_S: skip optional steps past it, default 95;
#                                         PARTS: "tests kbench profile l27 l27before backend",
#                                         the default, or a subset)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/steps.sh"  # environment, step(), $OUT/machine.txt
left() { (($(date +%s) - steps_start < ${BUDGET_S:-95})); }
parts=${PARTS:-tests kbench profile l27 l27before backend}
want() { [[ " $parts " == *" $1 "* ]]; }

if want tests; then
  step mla_prefill_test 40 "$here/bin/mla_prefill_test" --gtest_color=no
  step cuda_parity_test 30 "$here/bin/cuda_parity_test" --gtest_color=no
fi
want kbench && step mla_prefill_bench 30 "$here/bin/mla_prefill_bench"
bench=("$here/bin/deepinfer-bench" --backend cuda --load-format dummy)
prof=(--model "$here/configs/moonlight_shaped_4layers.json" --decode-num-requests 1,128
  --context-length 1024 --prefill-batch-tokens 8192 --output-len 8 --warmup 2 --iters 2
  --op-timing-steps 3)
l27=(--model "$here/configs/moonlight_shaped.json" --decode-num-requests 1
  --prefill-batch-tokens 8192 --context-length 1024 --output-len 4 --warmup 1 --iters 2)
if want profile; then
  step profile4_after 30 "${bench[@]}" "${prof[@]}"
  step profile4_before 30 "${bench[@]}" "${prof[@]}" --mla-prefill-min-tokens 0
fi
want l27 && left && step layers27_after "${L27_LIMIT_S:-60}" "${bench[@]}" "${l27[@]}"
want l27before && left && step layers27_before 60 "${bench[@]}" "${l27[@]}" \
  --mla-prefill-min-tokens 0
want backend && left && step cuda_backend_test 20 "$here/bin/cuda_backend_test" --gtest_color=no
for f in "$logs"/profile4_*.log "$logs"/layers27_*.log; do
  [[ -f "$f" ]] && { echo "== $(basename "$f")"; grep -E "prefill|decode|MlaAttention|total" "$f"; } >> "$summary"
done
grep -h "bf16-parity\|mla-prefill\] tokens 0\.\.1024" "$logs"/*.log >> "$summary" 2>/dev/null
echo "elapsed $(($(date +%s) - steps_start)) s" >> "$summary"
