#!/bin/bash
# prefix_cache_bench_test: tools/bench/prefix_cache_bench.sh end to end on the CPU with the
# fixture model. A job of 2 system prompts (40 tokens) x 3 questions (4 tokens) run one request
# at a time: the first request of each system prompt computes it, the other two find its 2
# full blocks (32 tokens; the third block holds the question). The re-run on the warm
# --kv-cache-dir finds every prompt's 2 full blocks on disk. The report's numbers must be
# those, and the job's lines must be what make-job was asked for.
#   prefix_cache_bench_test.sh DEEPINFER BENCH_SH MODEL_DIR
set -euo pipefail
deepinfer=$1 bench=$2 model=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bench" --deepinfer "$deepinfer" --model "$model" --out "$tmp/out" \
  --run-args "--timeout-s 300 --worker-args=--max-running=1" -- --systems 2 --questions 3 \
  --system-tokens 40 --question-tokens 4 --max-tokens 2 --vocab 1000 --seed 5 \
  > "$tmp/report.md" 2> "$tmp/bench.log" || fail "prefix_cache_bench.sh: $(cat "$tmp/bench.log")"
grep -q '| hit rate |' "$tmp/report.md" || fail "no report: $(cat "$tmp/report.md")"

python3 - "$tmp/out" "$(dirname "$bench")/prefix_cache_bench.py" << 'PY'
import json, subprocess, sys
out, script = sys.argv[1], sys.argv[2]
job = [json.loads(l) for l in open(f"{out}/job.jsonl")]
assert len(job) == 6, len(job)
prompts = {j["custom_id"]: j["body"]["prompt"] for j in job}
for cid, p in prompts.items():
    assert len(p) == 44, (cid, len(p))
    assert all(2 <= t < 1000 for t in p), cid
systems = {cid.split("-")[0] for cid in prompts}
assert systems == {"s0", "s1"}, systems
for s in systems:
    mine = [p for cid, p in prompts.items() if cid.startswith(s + "-")]
    assert all(p[:40] == mine[0][:40] for p in mine), "a system prompt differs within " + s
    assert len({p[40] for p in mine}) == 3, "questions must differ from their first token"
assert prompts["s0-q0"][:40] != prompts["s1-q0"][:40]
# The report, from the output files (wall times are not checked).
r = json.loads(subprocess.check_output([sys.executable, script, "report", "--on",
    f"{out}/on.jsonl", "--on-seconds", "2", "--off", f"{out}/off.jsonl", "--off-seconds", "4",
    "--run", f"warm={out}/warm.jsonl:1", "--json"]))
on, off = r["on"], r["off"]
assert on["requests"] == off["requests"] == 6, r
assert on["errors"] == off["errors"] == 0, r
assert on["prompt_tokens"] == off["prompt_tokens"] == 6 * 44, r
assert off["cached_tokens"] == 0, r
assert on["cached_tokens"] == 4 * 32, r
assert on["prefill_tokens_computed"] == 6 * 44 - 4 * 32, r
assert abs(on["hit_rate"] - 128 / 264) < 1e-9, r
assert on["completion_tokens"] == 12, r
assert r["requests_with_other_tokens"] == 0, r
assert abs(r["speedup"] - 2.0) < 1e-9, r
warm = r["runs"]["warm"]
assert warm["cached_tokens"] == 6 * 32, r
assert warm["requests_with_other_tokens"] == 0, r
assert warm["balance"] is None, r
PY
grep -q 'warm disk' "$tmp/report.md" || fail "no warm disk column: $(cat "$tmp/report.md")"
echo PASS
