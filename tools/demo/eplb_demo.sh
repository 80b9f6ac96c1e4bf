#!/bin/bash
# eplb_demo.sh - live EPLB on CPU workers: a coordinator and two workers of two ranks each
# (expert parallelism over 4 ranks) serve a skewed job (prompts of one repeated token, so that
# a few experts get most tokens); prints `deepinfer-admin expert-load` before and after a live
# `deepinfer-admin rebalance`, then checks that the job completed without errors.
#
#   tools/demo/eplb_demo.sh [MODEL_DIR] [WORK_DIR]
#     MODEL_DIR default tests/fixtures/dsv3_yarn_nolora (16 experts, 2 MoE layers, 4 groups)
#
# Needs the binaries built: bazel build //coordinator:deepinfer-coordinator
#   //worker:deepinfer-worker //tools/admin:deepinfer-admin //coordinator/cli:deepinfer
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
model=${1:-$repo/tests/fixtures/dsv3_yarn_nolora}
work=${2:-$(mktemp -d)}
bin=$repo/bazel-bin
admin=$bin/tools/admin/deepinfer-admin
mkdir -p "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

"$bin/coordinator/deepinfer-coordinator" --listen=127.0.0.1:0 --port-file="$work/port" \
  --model="$model" --state-dir="$work/state" --min-workers=2 --num-redundant-experts=4 \
  --heartbeat-interval-ms=200 --eplb-window-steps=200 2> "$work/coordinator.log" &
pids+=($!)
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.1; done
addr=127.0.0.1:$(cat "$work/port")
for i in 0 1; do
  "$bin/worker/deepinfer-worker" --coordinator="$addr" --model="$model" --worker-id="w$i" \
    --ranks=2 --threads=1 --max-running=8 2> "$work/worker$i.log" &
  pids+=($!)
done

# 480 greedy requests, each prompt one token repeated 8-40 times (few distinct tokens).
python3 - "$work/job.jsonl" <<'PY'
import json, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(480):
        tok = random.choice([17, 17, 17, 401, 401, 905])
        body = {"prompt": [tok] * random.randint(8, 40), "max_tokens": 48, "temperature": 0,
                "ignore_eos": True}
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": body}) + "\n")
PY
job=$("$bin/coordinator/cli/deepinfer" submit --coordinator="$addr" --input="$work/job.jsonl" | tail -1)
echo "job $job submitted"
for _ in $(seq 600); do
  "$admin" expert-load --coordinator="$addr" > "$work/before.txt" 2> /dev/null && \
    grep -q "last 200 steps" "$work/before.txt" && break
  sleep 0.2
done
echo "== deepinfer-admin expert-load (before)"
"$admin" expert-load --coordinator="$addr" --save="$work/loads-before.json" \
  --plot="$work/before.png"
echo "== deepinfer-admin rebalance --policy global"
"$admin" rebalance --coordinator="$addr" --policy=global
for _ in $(seq 300); do
  "$admin" expert-load --coordinator="$addr" | grep -q "layout: placement epoch 1" && break
  sleep 0.2
done
sleep 8  # more than a window's worth of steps under the new placement
echo "== deepinfer-admin expert-load (after)"
"$admin" expert-load --coordinator="$addr" --save="$work/loads-after.json" --plot="$work/after.png"
"$bin/coordinator/cli/deepinfer" wait --coordinator="$addr" "$job" > /dev/null
"$bin/coordinator/cli/deepinfer" results --coordinator="$addr" "$job" --output="$work/out.jsonl"
echo "== $(wc -l < "$work/out.jsonl") result lines, $(grep -c '"error": *null' "$work/out.jsonl" || true) without error; files in $work"
grep -h "switched to expert placement" "$work"/worker*.log | sed 's/^.*\] //'
