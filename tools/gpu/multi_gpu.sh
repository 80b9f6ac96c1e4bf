#!/bin/bash
# multi_gpu.sh - the expert-parallel NCCL checks for a machine with 2 GPUs, run from the folder
# tools/gpu/prepare.sh made (copied there as multi_gpu.sh):
#
#   bash .gpu/multi_gpu.sh            (device tool: kind nvidia-h200-x2, carry [".gpu"])
#
# 1. the NCCL tests: nccl_communicator_test, nccl_window_test, ep_expert_dispatcher_gpu_test
#    (with the device exchange over two GPUs' NVLink windows against TCP) and
#    ep_device_graph_gpu_test (their two-rank cases need 2 GPUs and skip otherwise: a SKIPS
#    verdict below means they did not run);
# 2. `deepinfer run --backend cuda` on the HF fixture's prompts (greedy, 24 tokens):
#      ref      one worker, one GPU (CUDA_VISIBLE_DEVICES=0), async scheduling (the default)
#      sync     the same with --no-async-scheduling
#      a_nccl   one worker --ranks 2 (both GPUs), --communicator nccl
#      a_tcp    the same over --communicator tcp (the host-staged exchange)
#      b_nccl   two workers, one GPU each (--split-gpus: CUDA_VISIBLE_DEVICES=0 and =1), nccl
#    and compares every run's tokens with ref's and with HF's greedy_24.
# With one GPU, the 2-GPU runs are reported as SKIPPED and `ref`, `sync` and a one-rank NCCL run
# (nccl1: forming and wiring only, a group of one exchanges nothing) still run.
# 3. bench2: `deepinfer-bench --ranks 2 --time-all-to-all` (expert parallel over both GPUs:
#    the device exchange, --ep-exchange auto; then the same with --ep-exchange collective, NCCL
#    all-to-all, whose all-to-all time per step is measured) on the Moonlight-shaped config with dummy weights, decode at 1, 64 and
#    128 requests per rank, context 1024, then the same with --ranks 1 on GPU 0; both reports go
#    into the summary (decode tokens/s per GPU, step p50/p99, all-to-all time and bytes per
#    step, and each rank's seq0 tokens against the one-rank run's). The decode cache is filled
#    with random values (--decode-fill random, as bench_all.sh does) so that both runs fit in
#    BENCH2_BUDGET_S (default 220 s); the fill depends on each rank's pool size, so the tokens
#    are comparable only with BENCH2_FLAGS using --decode-fill prefill; BENCH2_FLAGS replaces the measurement flags,
#    BENCH2_BACKEND / BENCH2_MODEL / BENCH2_BIN the backend, config and binary (a CPU check:
#    BENCH2_BACKEND=cpu with a fixture config).
# MULTI_GPU_PARTS="tests runs bench2" (default: all three) picks the parts.
# Logs: $OUT/multi_gpu_summary.txt and $OUT/multi_gpu_logs.tar.gz. Exit status: failed steps.
# NCCL_NVLS_ENABLE=0 is forced (NVLink multicast must stay off on these machines).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
parts=${MULTI_GPU_PARTS:-tests runs bench2}
want() { [[ " $parts " == *" $1 "* ]]; }
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
logs=/tmp/multi-gpu-logs
rm -rf "$logs"
mkdir -p "$logs"
summary="$OUT/multi_gpu_summary.txt"
: > "$summary"
failed=0
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
{
  echo "commit: $(head -1 "$here/COMMIT" 2>/dev/null)"
  echo "GPUs: $gpus"
  nvidia-smi topo -m 2>&1 | head -8
} | tee -a "$summary"

record() {  # record NAME VERDICT DETAIL
  printf '%-34s %-14s %s\n' "$1" "$2" "$3" | tee -a "$summary"
  [[ "$2" == PASS* || "$2" == SKIPPED ]] || failed=$((failed + 1))
  tar -C "$logs" -czf "$OUT/multi_gpu_logs.tar.gz" .
}

# ---- 1. tests ----------------------------------------------------------------------------
want tests && for n in nccl_communicator_test nccl_window_test ep_expert_dispatcher_gpu_test \
  ep_device_graph_gpu_test; do
  if [[ ! -x "$here/bin/$n" ]]; then
    record "$n" "FAIL(missing)" "not in the bundle"
    continue
  fi
  timeout 300 "$here/bin/$n" --gtest_color=no > "$logs/$n.log" 2>&1
  rc=$?
  verdict=PASS
  [[ $rc -eq 0 ]] || verdict="FAIL(rc=$rc)"
  grep -q '\[  SKIPPED \]' "$logs/$n.log" && verdict="$verdict+SKIPS"
  record "$n" "$verdict" "$(grep -E '^\[  (PASSED|FAILED) ' "$logs/$n.log" | tr '\n' ' ')"
done
want tests && grep -h "logit rows compared" "$logs"/ep_expert_dispatcher_gpu_test.log 2>/dev/null \
  | sort | uniq -c | tee -a "$summary"

# ---- 2. deepinfer run --------------------------------------------------------------------
if want runs; then
model="$here/srcdir/deepinfer/tests/fixtures/dsv3_qlora_rope"
python3 - "$model/expected.json" > "$logs/in.jsonl" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
for i, p in enumerate(e["prompts"]):
    print(json.dumps({"custom_id": f"hf-{i}", "method": "POST", "url": "/v1/completions",
                      "body": {"prompt": p["ids"], "max_tokens": 24, "temperature": 0,
                               "ignore_eos": True, "return_token_ids": True}}))
PY

run() {  # run NAME [env assignments...] -- deepinfer-run flags...
  local name=$1
  shift
  local envs=()
  while [[ $# -gt 0 && "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  local start_ms=$(($(date +%s%N) / 1000000))
  env "${envs[@]}" timeout 300 "$here/bin/deepinfer" run --model "$model" --backend cuda \
    --bin-dir "$here/bin" --input "$logs/in.jsonl" --output "$logs/$name.out.jsonl" \
    --state-dir "$logs/$name.state" --timeout-s 280 "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local ms=$(($(date +%s%N) / 1000000 - start_ms))
  echo "exit $rc in $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s" >> "$logs/$name.log"
  return $rc
}

compare() {  # compare NAME: tokens vs ref and vs HF; prints "same_as_ref/n same_as_hf/n"
  python3 - "$model/expected.json" "$logs/ref.out.jsonl" "$logs/$1.out.jsonl" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
def tokens(path):
    out = {}
    try:
        for line in open(path):
            j = json.loads(line)
            r = j.get("response")
            out[j["custom_id"]] = r["body"]["choices"][0]["token_ids"] if r else None
    except OSError:
        pass
    return out
ref, got = tokens(sys.argv[2]), tokens(sys.argv[3])
n = len(e["prompts"])
same_ref = sum(1 for i in range(n) if got.get(f"hf-{i}") is not None and got.get(f"hf-{i}") == ref.get(f"hf-{i}"))
same_hf = sum(1 for i, p in enumerate(e["prompts"]) if got.get(f"hf-{i}") == p["greedy_24"])
print(f"{same_ref}/{n} {same_hf}/{n}")
PY
}

check_run() {  # check_run NAME RC [EXPECTED_PLANE]
  local name=$1 rc=$2 plane=${3:-}
  local cmp
  cmp=$(compare "$name")
  local same_ref=${cmp%% *} same_hf=${cmp##* }
  local verdict=PASS
  [[ $rc -eq 0 ]] || verdict="FAIL(rc=$rc)"
  [[ "${same_ref%/*}" == "${same_ref#*/}" ]] || verdict="FAIL(tokens)"
  local planes=""
  if [[ -n "$plane" ]]; then
    planes=$(grep -ho "expert exchange over [a-z]*" "$logs/$name.state"/logs/worker-*.log 2>/dev/null \
      | sort | uniq -c | tr -s ' ' | tr '\n' ';')
    grep -q "expert exchange over $plane" "$logs/$name.state"/logs/worker-*.log 2>/dev/null \
      || verdict="FAIL(no $plane)"
  fi
  record "run_$name" "$verdict" "same as ref: $same_ref, same as HF greedy_24: $same_hf, \
$(tail -1 "$logs/$name.log") $planes"
}

run ref CUDA_VISIBLE_DEVICES=0 -- --workers 1 --ranks-per-worker 1
rc=$?
check_run ref $rc
run sync CUDA_VISIBLE_DEVICES=0 -- --workers 1 --ranks-per-worker 1 --no-async-scheduling
rc=$?
grep -q "async scheduling off" "$logs/sync.state"/logs/worker-*.log 2>/dev/null || rc=3
check_run sync $rc
run nccl1 CUDA_VISIBLE_DEVICES=0 -- --workers 1 --ranks-per-worker 1 \
  --worker-args "--communicator=nccl"
check_run nccl1 $? nccl
if [[ $gpus -ge 2 ]]; then
  run a_nccl CUDA_VISIBLE_DEVICES=0,1 -- --workers 1 --ranks-per-worker 2 \
    --worker-args "--communicator=nccl"
  check_run a_nccl $? nccl
  run a_tcp CUDA_VISIBLE_DEVICES=0,1 -- --workers 1 --ranks-per-worker 2 \
    --worker-args "--communicator=tcp"
  check_run a_tcp $? tcp
  run b_nccl CUDA_VISIBLE_DEVICES=0,1 -- --workers 2 --ranks-per-worker 1 --split-gpus \
    --worker-args "--communicator=nccl"
  check_run b_nccl $? nccl
  run b_auto CUDA_VISIBLE_DEVICES=0,1 -- --workers 2 --ranks-per-worker 1 --split-gpus
  check_run b_auto $? nccl
else
  for n in a_nccl a_tcp b_nccl b_auto; do record "run_$n" SKIPPED "needs 2 GPUs, have $gpus"; done
fi
fi  # runs

# ---- 3. bench2: the benchmark at 2 ranks against 1 -------------------------------------------
bench2() {  # bench2 NAME RANKS VISIBLE_DEVICES LIMIT_S [EXTRA FLAG...]
  local name=$1 ranks=$2 visible=$3 limit=$4
  shift 4
  local flags
  read -r -a flags <<< "${BENCH2_FLAGS:---decode-num-requests 1,64,128 --context-length 1024 \
--output-len 16 --warmup 2 --iters 3 --decode-fill random}"
  local extra=()
  ((ranks > 1)) && extra=(--time-all-to-all "$@")
  local start=$(date +%s)
  env CUDA_VISIBLE_DEVICES="$visible" timeout "$limit" "$bench_bin" --backend "$bench_backend" \
    --model "$bench_model" --load-format dummy --ranks "$ranks" "${extra[@]}" "${flags[@]}" \
    > "$logs/$name.txt" 2> "$logs/$name.err"
  local rc=$?
  local verdict=PASS
  [[ $rc -eq 0 ]] || verdict="FAIL(rc=$rc)"
  ((rc == 124)) && verdict="FAIL(timeout ${limit}s)"
  record "$name" "$verdict" "--ranks $ranks, $(($(date +%s) - start)) s: $logs/$name.txt"
  {
    echo "---- $name: deepinfer-bench --backend $bench_backend --model $(basename "$bench_model") \
--load-format dummy --ranks $ranks ${extra[*]} ${flags[*]}"
    cat "$logs/$name.txt"
    [[ $rc -eq 0 ]] || tail -5 "$logs/$name.err"
  } | tee -a "$summary"
}
if want bench2; then
  bench_bin=${BENCH2_BIN:-$here/bin/deepinfer-bench}
  bench_backend=${BENCH2_BACKEND:-cuda}
  bench_model=${BENCH2_MODEL:-$here/configs/moonlight_shaped.json}
  budget=${BENCH2_BUDGET_S:-220}
  t0=$(date +%s)
  if [[ $bench_backend != cuda || $gpus -ge 2 ]]; then
    # Most of the budget: loading is shared by two GPUs, the exchange is extra work. The device
    # exchange (auto), then NCCL all-to-all on the same flags, for the table below.
    bench2 bench2_ranks2 2 0,1 $((budget * 3 / 10)) --ep-exchange auto
    bench2 bench2_ranks2_collective 2 0,1 $((budget * 3 / 10)) --ep-exchange collective
    grep -h "^expert exchange:" "$logs"/bench2_ranks2*.txt 2>/dev/null | tee -a "$summary"
  else
    record bench2_ranks2 SKIPPED "needs 2 GPUs, have $gpus"
  fi
  left=$((budget - ($(date +%s) - t0)))
  ((left < 30)) && left=30
  bench2 bench2_ranks1 1 0 "$left"
  # Every rank's sequence 0 must decode the one-rank run's greedy tokens (same dummy weights,
  # same prompt); bf16 GEMMs of other batch shapes may round differently on the GPU, so a
  # difference is reported, not failed.
  if [[ -s "$logs/bench2_ranks2.txt" && -s "$logs/bench2_ranks1.txt" ]]; then
    python3 - "$logs/bench2_ranks1.txt" "$logs/bench2_ranks2.txt" << 'PY' | tee -a "$summary"
import re, sys
def seq0(path):
    out = {}
    for line in open(path):
        m = re.match(r"seq0_decode_tokens \(batch (\d+)(?:, rank (\d+))?\): (.*)", line)
        if m:
            out[(int(m.group(1)), int(m.group(2) or 0))] = m.group(3).split()
    return out
one, two = seq0(sys.argv[1]), seq0(sys.argv[2])
for (batch, rank), tokens in sorted(two.items()):
    ref = one.get((batch, 0))
    same = sum(a == b for a, b in zip(tokens, ref or []))
    print(f"bench2 seq0 tokens, batch {batch} rank {rank}: {same}/{len(tokens)} equal to --ranks 1")
PY
  fi
fi
echo "failed steps: $failed" | tee -a "$summary"
tar -C "$logs" -czf "$OUT/multi_gpu_logs.tar.gz" .
exit "$failed"
