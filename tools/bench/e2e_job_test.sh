#!/bin/bash
# e2e_job_test: make_job.py makes the same file from the same seed (greedy and sampled forms
# sharing prompts); e2e_job.py runs a small job through `deepinfer run` on the CPU and its report
# adds up: every request done, the workers' step statistics count exactly the tokens the job
# computes (each request's prompt plus all but its last generated token), the wall time splits
# into start-up + serving + tail, the tail into its logged phases, the histogram was priced with
# deepinfer-bench (its mixed steps from mixed steps measured at a grid spanning them), and the
# start-up breakdown has the rank's phases. The pricing itself against hand-worked figures.
#   e2e_job_test.sh E2E_JOB_PY MAKE_JOB_PY CONFIG_JSON DEEPINFER COORDINATOR WORKER BENCH
set -euo pipefail
e2e=$1 make=$2 config=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
bin="$tmp/bin"
mkdir -p "$bin"
for b in "${@:4}"; do ln -sf "$PWD/$b" "$bin/"; done

# --- make_job.py ---
python3 "$make" --workload short-sampled --config "$config" --requests 5 --out "$tmp/a.jsonl"
python3 "$make" --workload short-sampled --config "$config" --requests 5 --out "$tmp/b.jsonl"
python3 "$make" --workload short-greedy --config "$config" --requests 5 --out "$tmp/g.jsonl"
cmp -s "$tmp/a.jsonl" "$tmp/b.jsonl" || fail "same seed, different files"
python3 - "$tmp/a.jsonl" "$tmp/g.jsonl" << 'PY'
import json, sys
s = [json.loads(l)["body"] for l in open(sys.argv[1])]
g = [json.loads(l)["body"] for l in open(sys.argv[2])]
assert len(s) == len(g) == 5
assert [b["prompt"] for b in s] == [b["prompt"] for b in g], "greedy and sampled prompts differ"
assert all(16 <= len(b["prompt"]) <= 64 and b["ignore_eos"] and b["max_tokens"] == 256 for b in s)
assert all(b["temperature"] > 0 and "seed" in b for b in s) and all(b["temperature"] == 0 for b in g)
assert len({b["seed"] for b in s}) == 5
PY
if python3 "$make" --workload nope --vocab 10 --out - 2> /dev/null; then fail "unknown workload accepted"; fi

# --- the pricing: decode p50s 1.0 s at 1 row and 2.0 s at 4, prefill 1.0 s per 100 tokens ---
python3 - "$(dirname "$e2e")" << 'PY'
import sys
sys.path.insert(0, sys.argv[1])
from e2e_job import price
bench = {"decode": [{"requests": 4, "p50_s": 2.0}, {"requests": 1, "p50_s": 1.0}],
         "prefill": {"tokens_per_step": 100, "step_s": 1.0}}
# 3 steps of 2 decode rows: 1 + 1/3 s each (between 1 and 4 rows); 1 step of 100 prefill tokens:
# max(decode at 4 rows, 100 x 0.01) = 2 s; 1 step of 300 decode rows: max(2, 3) = 3 s.
p = price([[2, 0, 3, 0.0], [0, 100, 1, 0.0], [300, 0, 1, 0.0]], bench)
assert abs(p["ideal_s"] - 9.0) < 1e-9, p
assert abs(p["ideal_decode_only_steps_s"] - 7.0) < 1e-9, p
assert abs(p["ideal_steps_with_prefill_s"] - 2.0) < 1e-9, p
assert not p["mixed_measured"] and abs(p["ideal_fresh_prefill_s"] - 9.0) < 1e-9, p
PY

# --- mixed steps: the measured grid, and the price bilinear over it (worked by hand) ---
python3 - "$(dirname "$e2e")" << 'PY'
import sys
sys.path.insert(0, sys.argv[1])
from e2e_job import mixed_grid, price
# The grid spans the mixed steps (d > 0 and p > 0), with the grid values strictly inside.
assert mixed_grid([[2, 0, 3, 0.0], [0, 100, 1, 0.0]]) == ([], [])
assert mixed_grid([[4, 200, 2, 0.0], [1, 400, 1, 0.0], [5, 150, 1, 0.0]]) == ([1, 5], [150, 400])
assert mixed_grid([[100, 700, 1, 0.0], [300, 1500, 4, 0.0], [9, 0, 5, 0.0]]) == \
    ([100, 128, 256, 300], [700, 1024, 1500])
bench = {"decode": [{"requests": 4, "p50_s": 2.0}, {"requests": 1, "p50_s": 1.0}],
         "prefill": {"tokens_per_step": 100, "step_s": 1.0},
         "mixed": [{"decode_rows": 2, "prompt_tokens": 100, "p50_s": 3.0},
                   {"decode_rows": 6, "prompt_tokens": 100, "p50_s": 5.0},
                   {"decode_rows": 2, "prompt_tokens": 300, "p50_s": 7.0},
                   {"decode_rows": 6, "prompt_tokens": 300, "p50_s": 11.0}]}
hist = [[2, 0, 3, 0.0],     # decode-only: 3 x (1 + 1/3) = 4
        [0, 100, 1, 0.0],   # prefill-only: max(2, 100 x 0.01) = 2
        [4, 200, 2, 0.0],   # mid-cell: (3 + 5 + 7 + 11) / 4 = 6.5, x 2 = 13; fresh 2 x 2.04
        [1, 400, 1, 0.0],   # clamped to (2, 300): 7; fresh max(2, 4.01) = 4.01
        [5, 150, 1, 0.0]]   # u = 3/4, v = 1/4: .25*.75*3 + .75*.75*5 + .25*.25*7 + .75*.25*11
                            # = 0.5625 + 2.8125 + 0.4375 + 2.0625 = 5.875; fresh max(2, 1.55)
p = price(hist, bench)
assert p["mixed_measured"], p
want = {"ideal_s": 4 + 2 + 13 + 7 + 5.875, "ideal_fresh_prefill_s": 4 + 2 + 4.08 + 4.01 + 2,
        "ideal_decode_only_steps_s": 4, "ideal_steps_with_prefill_s": 2 + 13 + 7 + 5.875,
        "ideal_steps_with_prefill_fresh_prefill_s": 2 + 4.08 + 4.01 + 2,
        "ideal_mixed_steps_s": 13 + 7 + 5.875, "ideal_mixed_steps_fresh_prefill_s": 10.09}
for k, v in want.items():
    assert abs(p[k] - v) < 1e-9, (k, p[k], v)
assert p["mixed_p50_s"] == {"2:100": 3.0, "2:300": 7.0, "6:100": 5.0, "6:300": 11.0}, p
# One D: linear along P. A grid with a pair missing is not used: mixed steps as fresh prefill.
one_d = dict(bench, mixed=bench["mixed"][::2])
assert abs(price([[4, 200, 2, 0.0]], one_d)["ideal_s"] - 2 * 5.0) < 1e-9
holed = dict(bench, mixed=bench["mixed"][:3])
p = price(hist, holed)
assert not p["mixed_measured"] and abs(p["ideal_s"] - p["ideal_fresh_prefill_s"]) < 1e-9, p
PY

# --- e2e_job.py on the CPU ---
# A token budget of 128 cuts the prompts into chunks: steps mix decode rows and prompt tokens.
python3 "$e2e" --bin-dir "$bin" --config "$config" --backend cpu --workload long-greedy \
  --requests 12 --max-tokens 6 --prompt-range 20,90 --max-batch-tokens 128 --out "$tmp/run" \
  --timeout-s 240 \
  > "$tmp/row.txt" 2> "$tmp/err.txt" || fail "e2e_job.py failed: $(cat "$tmp/err.txt" "$tmp/row.txt"; tail -20 "$tmp/run/run.log")"
grep -q '(12/12 done)' "$tmp/row.txt" || fail "row: $(cat "$tmp/row.txt")"
python3 - "$tmp/run" "$(dirname "$e2e")" << 'PY'
import json, os, sys
sys.path.insert(0, sys.argv[2])
from e2e_job import mixed_grid
d = sys.argv[1]
r = json.load(open(os.path.join(d, "e2e.json")))
job = [json.loads(l)["body"] for l in open(os.path.join(d, "job.jsonl"))]
stats = json.load(open(os.path.join(d, "step_stats", "rank-0.json")))
want = sum(len(b["prompt"]) + b["max_tokens"] - 1 for b in job)
got = stats["decode_tokens"] + stats["prefill_tokens"]
assert got == want, f"step stats count {got} computed tokens, the job computes {want}"
# Async scheduling (the default) never computes past max_tokens: nothing dropped.
assert stats["async_scheduling"] is True and stats["dropped_tokens"] == 0, stats
assert r["async_scheduling"] is True and "(sync)" not in r["label"], r
assert r["weights_gb"] >= 0 and r["weights_load_s"] >= 0, r  # the start-up weights line
assert r["warm_up_steps"] == 2 and r["warm_up_tokens"] > 0 and r["warm_up_s"] >= 0, r
hist = stats["histogram"]
assert sum(h[2] for h in hist) == stats["steps"], "histogram steps"
assert sum(h[0] * h[2] for h in hist) == stats["decode_tokens"], "histogram decode rows"
assert sum(h[1] * h[2] for h in hist) == stats["prefill_tokens"], "histogram prefill tokens"
assert stats["first_tokens"] == 12 and stats["finished"] == 12, stats
assert stats["generated_tokens"] == r["output_tokens"] == 12 * 6, (stats, r["output_tokens"])
assert r["done"] == 12 and r["failed"] == 0
split = r["startup_s"] + r["serving_s"] + r["tail_s"]
assert abs(split - r["wall_s"]) < 1e-6, (split, r["wall_s"])
assert r["startup_s"] > 0 and r["serving_s"] > 0 and r["tail_s"] > 0, r
assert 0 <= r["idle_share"] < 1
assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]
assert r["bench_rc"] == 0 and r["ideal_s"] > 0, r
# The mixed steps were measured at every pair of the grid spanning them, and priced from it.
ds, ps = mixed_grid(hist)
assert ds and ps, hist
assert r["mixed_measured"] and sorted(r["mixed_p50_s"]) == sorted(f"{d}:{p}" for d in ds for p in ps), r
assert r["ideal_mixed_steps_s"] > 0 and r["ideal_mixed_steps_fresh_prefill_s"] > 0, r
for phase in ("process start", "group", "backend", "weights", "memory plan and KV cache",
              "graph capture", "warm-up", "first request"):
    assert phase in r["startup_breakdown_s"], (phase, r["startup_breakdown_s"])
# The tail splits at the moments the processes log, in order, adding up to the tail.
tail = r["tail_breakdown_s"]
assert list(tail) == ["results reported (last token -> job complete)",
                      "job end seen by deepinfer run", "results written", "workers stopped",
                      "coordinator stopped", "deepinfer run exit"], tail
assert abs(sum(tail.values()) - r["tail_s"]) < 1e-6, (tail, r["tail_s"])
assert all(v >= -0.002 for v in tail.values()), tail  # logged to the millisecond
for part in ("leave the coordinator", "stop the server", "stop the ranks", "flush the KV store",
             "process exit"):
    assert part in r["worker_shutdown_s"], (part, r["worker_shutdown_s"])
# No --kv-cache-dir: nothing is copied off the ranks' pools at shutdown.
assert "shutdown_spilled_blocks" not in r, r
PY
echo PASS
