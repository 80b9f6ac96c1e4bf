#!/bin/bash
# e2e.sh - the end-to-end job benchmark (tools/bench/e2e_job.py) in one call, from a bundle made
# by tools/gpu/prepare.sh (which copies this script, e2e_job.py, make_job.py and hf_generate.py
# into it; the bundle holds deepinfer, deepinfer-coordinator, deepinfer-worker and
# deepinfer-bench). The suite `e2e` of suite.sh runs it:
#
#   device tool: carry [".gpu/pack"], command
#     mkdir -p /tmp/b && tar xJf .gpu/pack/all.tar.xz -C /tmp/b && bash /tmp/b/all/suite.sh e2e
#
# For each workload of E2E_WORKLOADS (make_job.py; default "long-greedy long-sampled
# short-greedy short-sampled", empty: none) it runs E2E_REQUESTS (1024) requests of
# E2E_MAX_TOKENS (256) tokens through `deepinfer run` on E2E_CONFIG
# (configs/moonlight_shaped.json, dummy weights) with E2E_BACKEND (cuda) and prices the job's
# steps with deepinfer-bench; HF transformers' generate runs on the first E2E_HF_REQUESTS (64;
# 0: none) requests of the workloads of E2E_HF_WORKLOADS (default "long-greedy short-greedy":
# 256 HF decode steps of 64 requests at its measured ~0.15 s a step are ~38 s a workload, plus
# its start, too much for four in one device call; "all": every workload). Then, for
# start-up only, a small job (16 requests x 16 tokens) on each config of E2E_STARTUP_CONFIGS
# (default configs/deepseek_v3_4layers.json). E2E_PROMPT_RANGE=MIN,MAX replaces the workloads'
# prompt lengths; E2E_RUN_ARGS / E2E_WORKER_ARGS pass more `deepinfer run` / worker flags
# (E2E_RUN_ARGS=--no-async-scheduling: the same jobs with every step run to the end before the
# next forms; their rows say "(sync)"). Each workload may take E2E_JOB_CAP_S (170) seconds, its
# run 60% of that; everything is capped to E2E_BUDGET_S (default 540) seconds, so that the
# suite and the bundle's unpacking stay within one device call of 600 s (a job the budget no
# longer fits is SKIPPED and counted as failed).
#
# $OUT gets e2e.md (the table, with each job's start-up and tail breakdowns and its ideal with
# the mixed steps priced both from the measured mixed steps and as a fresh prefill),
# e2e_summary.txt and e2e_results.tar.gz (every job's e2e.json, logs, step stats). Exit status:
# failed jobs.
# A CPU check: E2E_BACKEND=cpu E2E_CONFIG=<fixture config.json> E2E_REQUESTS=32
# E2E_MAX_TOKENS=16 E2E_PROMPT_RANGE=64,192 E2E_HF_REQUESTS=0 E2E_STARTUP_CONFIGS= bash e2e.sh
# (bin/ beside it).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/e2e-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
budget=${E2E_BUDGET_S:-540}
backend=${E2E_BACKEND:-cuda}
config=${E2E_CONFIG:-$here/configs/moonlight_shaped.json}
workloads=${E2E_WORKLOADS-long-greedy long-sampled short-greedy short-sampled}
hf_workloads=${E2E_HF_WORKLOADS:-long-greedy short-greedy}
job_cap=${E2E_JOB_CAP_S:-170}
requests=${E2E_REQUESTS:-1024}
max_tokens=${E2E_MAX_TOKENS:-256}
hf_requests=${E2E_HF_REQUESTS:-64}
prompt_range=()
[[ -n "${E2E_PROMPT_RANGE:-}" ]] && prompt_range=(--prompt-range "$E2E_PROMPT_RANGE")
startup_configs=${E2E_STARTUP_CONFIGS-$here/configs/deepseek_v3_4layers.json}
work=/tmp/e2e-work
rm -rf "$work"
mkdir -p "$work"
summary="$OUT/e2e_summary.txt"
md="$OUT/e2e.md"
start=$(date +%s)
failed=0
rows=()
{
  echo "commit: $(head -1 "$here/COMMIT" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "cores: $(nproc)"
} > "$summary"

job() {  # job NAME CAP_S e2e_job.py flags...
  local name=$1 cap=$2
  shift 2
  local left=$((budget - ($(date +%s) - start) - 5))
  local limit=$((cap < left ? cap : left))
  if ((limit < 30)); then
    echo "$name SKIPPED (time budget)" | tee -a "$summary"
    failed=$((failed + 1))
    return
  fi
  local t0=$(date +%s)
  # The run may take 60% of the limit, and so may each of the pricing and HF (which take far
  # less); a start-up job (no pricing, no HF) all of it.
  local part=$((limit * 3 / 5))
  [[ " $* " == *" --no-price "* ]] && part=$((limit - 10))
  python3 "$here/e2e_job.py" --bin-dir "$here/bin" --backend "$backend" --out "$work/$name" \
    --timeout-s "$part" --run-args="${E2E_RUN_ARGS:-}" --worker-args="${E2E_WORKER_ARGS:-}" \
    "$@" > "$work/$name.row" 2> "$work/$name.err"
  local rc=$?
  local verdict=PASS
  [[ $rc -eq 0 ]] || { verdict="FAIL(rc=$rc)"; failed=$((failed + 1)); }
  echo "$name $verdict $(($(date +%s) - t0))s $(tail -1 "$work/$name.row")" | tee -a "$summary"
  [[ -s "$work/$name.row" ]] && rows+=("$name")
  tar -C "$work" -czf "$OUT/e2e_results.tar.gz" .
}

for w in $workloads; do
  hf=0
  [[ "$hf_workloads" == all || " $hf_workloads " == *" $w "* ]] && hf=$hf_requests
  job "$w" "$job_cap" --config "$config" --workload "$w" --requests "$requests" \
    --max-tokens "$max_tokens" --hf-requests "$hf" "${prompt_range[@]}"
done
for c in $startup_configs; do
  job "startup_$(basename "$c" .json)" 150 --config "$c" --workload short-greedy --requests 16 \
    --max-tokens 16 --no-price --label "$(basename "$c" .json) start-up"
done

{
  echo "End-to-end jobs ($backend, dummy weights), commit $(head -1 "$here/COMMIT" 2>/dev/null | cut -c1-12)"
  echo
  python3 - "$here" "$work" "${rows[@]}" << 'PY'
import json, os, sys
sys.path.insert(0, sys.argv[1])
work, names = sys.argv[2], sys.argv[3:]
from e2e_job import HEADER, format_row, price
print(HEADER)
print("|" + "---|" * (HEADER.count("|") - 1))
results = {}
for n in names:
    path = os.path.join(work, n, "e2e.json")
    if os.path.exists(path):
        results[n] = json.load(open(path))
        print(format_row(results[n]))
print()
for n, r in results.items():
    parts = ", ".join(f"{k} {v:.2f}" for k, v in r.get("startup_breakdown_s", {}).items())
    load = (f"weights {r['weights_gb']:.2f} GB in {r['weights_load_s']:.2f} s "
            f"({r['weights_gb_per_s']:.2f} GB/s); " if "weights_load_s" in r else "")
    graphs = (f"{r['startup_graphs']} decode graphs recorded at start-up in "
              f"{r['startup_capture_s']:.2f} s; " if "startup_graphs" in r else "")
    warm = (f"warm-up {r['warm_up_steps']} steps, {r['warm_up_tokens']} tokens in "
            f"{r['warm_up_s']:.2f} s; " if "warm_up_steps" in r else "")
    mode = {True: "on", False: "off"}.get(r.get("async_scheduling"), "?")
    tail = ", ".join(f"{k} {v:.2f}" for k, v in r.get("tail_breakdown_s", {}).items())
    if r.get("worker_shutdown_s"):
        tail += " (worker-0: " + ", ".join(
            f"{k} {v:.2f}" for k, v in r["worker_shutdown_s"].items())
        if "shutdown_spilled_blocks" in r:
            tail += (f"; {r['shutdown_spilled_blocks']} cached blocks to the KV store in "
                     f"{r['shutdown_spill_s']:.2f} s")
        tail += ")"
    print(f"* {r['label']}: start-up {r.get('startup_s', 0):.2f} s = {parts}; {load}{graphs}{warm}"
          f"async scheduling {mode}, {r.get('dropped_tokens', 0)} rows dropped; "
          f"tail {r.get('tail_s', 0):.2f} s = {tail}; "
          f"{r.get('steps', 0)} steps, {r.get('capture_steps', 0)} recording a decode graph "
          f"({r.get('graphs_recorded', 0)} graphs, {r.get('graph_record_s', 0):.2f} s recording); "
          f"{r.get('graph_steps', 0)} through the decode graph path; "
          f"host gaps {r.get('gap_s', 0):.2f} s, longest {r.get('max_gap_s', 0) * 1e3:.1f} ms; "
          f"decode-only steps ({r.get('decode_only_steps', 0)}) took "
          f"{r.get('decode_only_steps_s', 0):.2f} s (ideal "
          f"{r.get('ideal_decode_only_steps_s', float('nan')):.2f}), steps with prefill "
          f"{r.get('steps_with_prefill_s', 0):.2f} s (ideal "
          f"{r.get('ideal_steps_with_prefill_s', float('nan')):.2f}: mixed steps "
          f"{r.get('ideal_mixed_steps_s', float('nan')):.2f} from the measured mixed steps"
          f"{'' if r.get('mixed_measured') else ' (none measured: as a fresh prefill)'}, "
          f"{r.get('ideal_mixed_steps_fresh_prefill_s', float('nan')):.2f} priced as a fresh "
          f"prefill of their tokens)")
# A sampled job's steps priced with the greedy job's step times (same prompts, same context):
# what its decode steps would cost with greedy picks.
for n, r in results.items():
    if not r.get("sampled") or "ideal_s" not in r:
        continue
    for g_name, g in results.items():
        if (not g.get("sampled") and g.get("config") == r.get("config")
                and g.get("mean_prompt") == r.get("mean_prompt") and "ideal_s" in g):
            hist = json.load(open(os.path.join(work, n, "step_stats", "rank-0.json")))["histogram"]
            bench = json.load(open(os.path.join(work, g_name, "bench.json")))
            p = price(hist, bench)
            print(f"* {r['label']} priced with {g['label']}'s step times (greedy decode and "
                  f"mixed steps): ideal {p['ideal_s']:.2f} s (with its own sampled step times: "
                  f"{r['ideal_s']:.2f} s)")
            break
PY
} > "$md" 2>> "$summary"
cat "$md"
tar -C "$work" -czf "$OUT/e2e_results.tar.gz" .
echo "total $(($(date +%s) - start))s, failed jobs: $failed" | tee -a "$summary"
exit "$failed"
