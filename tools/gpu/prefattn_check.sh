#!/bin/bash
# prefattn_check.sh - the device run of the 128-row prefill flash kernels (session 7) in one call
# (copy it into a bundle made by tools/gpu/prepare.sh with at least mha_prefill_test,
# mha_prefill_bench, cuda_parity_test, mha_prefill_gpu_test, decode_graph_gpu_test and
# deepinfer-bench): the kernel's test, mha_prefill_bench (every flash kernel, the gather +
# expansion share), the model tests, then the Moonlight-shaped 32 x 1024 prefill on 4 layers,
# then 27, with the 128-row kernel and block order mha_prefill_bench found fastest at 32 x 1024
# against --mha-flash-kernel rows64, as time allows. Logs go to
# $OUT/logs.tar.gz (refreshed after each step), one line per step to $OUT/summary.txt.
#
#   bash DIR/prefattn_check.sh        (BUDGET_S: seconds for all steps, default 110)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export TEST_TMPDIR=${TEST_TMPDIR:-$(mktemp -d /tmp/prefattn-check.XXXXXX)}
STEP_BUDGET_S=${BUDGET_S:-110} . "$here/steps.sh"  # environment, step(), $OUT/machine.txt
step mha_prefill_test 30 "$B/mha_prefill_test" --gtest_color=no
step mha_prefill_bench 30 "$B/mha_prefill_bench"
step cuda_parity_test 20 "$B/cuda_parity_test" --gtest_color=no
step mha_prefill_gpu_test 15 "$B/mha_prefill_gpu_test" --gtest_color=no
step decode_graph_gpu_test 15 "$B/decode_graph_gpu_test" --gtest_color=no
# The fastest 128-row kernel and block order at 32 x 1024 ("32 x 1024   flash KERNEL:PAIR_GROUP
# mha MS ms ..."), else rows128 in the default (tile-major) order.
best=$(awk '$1 == "32" && $3 == "1024" && $4 == "flash" && $5 ~ /^rows128/ { print $7, $5 }' \
  "$logs/mha_prefill_bench.log" 2>/dev/null | sort -g | head -1 | cut -d' ' -f2)
best=${best:-rows128:0}
kernel=${best%%:*}
pair_group=${best#*:}
echo "best 128-row kernel at 32 x 1024: $kernel, pair group $pair_group" >> "$summary"
bench=("$B/deepinfer-bench" --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --output-len 2 --decode-num-requests 1
  --prefill-batch-tokens 32768)
new=(--mha-flash-kernel="$kernel" --mha-flash-pair-group="$pair_group")
l4=(--model "$C/moonlight_shaped_4layers.json" --warmup 1 --iters 5)
step bench4_rows64 20 "${bench[@]}" "${l4[@]}" --mha-flash-kernel rows64
step bench4_new 20 "${bench[@]}" "${l4[@]}" "${new[@]}"
l27=(--model "$C/moonlight_shaped.json" --warmup 1 --iters 3)
step bench27_new 45 "${bench[@]}" "${l27[@]}" "${new[@]}"
step bench27_rows64 45 "${bench[@]}" "${l27[@]}" --mha-flash-kernel rows64
for f in "$logs"/bench*.log "$logs"/mha_prefill_bench.log; do
  [[ -f "$f" ]] && { echo "== $(basename "$f")"; grep -E "prefill|flash|gather|x " "$f"; } >> "$summary"
done
tar -C "$logs" -czf "$OUT/logs.tar.gz" .
exit "$failed"
