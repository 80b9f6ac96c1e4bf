#!/bin/bash
# bench_cases.sh BUNDLE_DIR [full|profile] - the benchmark runs of the GPU script
# (tools/gpu/run_all.sh runs this from the bundle that tools/gpu/prepare.sh made). Writes the
# reports to stdout and CSV rows to $OUT/bench.csv.
#   full:    the Moonlight-shaped model, all 27 layers (about 105 s, 65 of them loading)
#   profile: a 4-layer Moonlight-shaped model with a per-op time breakdown (about 30 s)
set -uo pipefail
here=$1
mode=${2:-full}
csv="${OUT:-/tmp}/bench.csv"
rc=0
run() {
  echo "=== bench $*"
  "$here/bin/deepinfer-bench" --backend cuda --csv "$csv" "$@" || rc=1
}
# A tiny fixture-sized model first: checks the whole path quickly.
run --model "dummy:$here/configs/dsv3_yarn_nolora.json@1" --decode-num-requests 8 \
  --context-length 64 --prefill-batch-tokens 256 --output-len 12 --warmup 2
if [[ "$mode" == profile ]]; then
  run --model "dummy:$here/configs/moonlight_shaped_4layers.json@1" --decode-num-requests 64 \
    --context-length 1024 --prefill-batch-tokens 8192 --output-len 12 --warmup 3 \
    --iters 2 --op-timing-steps 3
  exit $rc
fi
# Moonlight-16B-A3B-shaped (hidden 2048, 27 layers, 64 experts top-6, 2 shared, kv_lora 512,
# vocab 129280) with dummy weights, fp32 (~63 GB of weights on the GPU).
run --model "dummy:$here/configs/moonlight_shaped.json@1" --decode-num-requests 64 \
  --context-length 1024 --prefill-batch-tokens 8192 --output-len 16 --warmup 3 \
  --iters 3
exit $rc
