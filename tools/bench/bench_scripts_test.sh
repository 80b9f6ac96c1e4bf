#!/bin/bash
# bench_scripts_test: sweep.sh writes one CSV row per (context, request count), and
# combine_results.py puts ours and an HF result side by side with ratios computed from the
# inputs; deepinfer-bench refuses the Ascend backend (a design only) with one line. Runs
# deepinfer-bench on the CPU with the small parity fixture's config; --speculative-tokens is
# parsed and its figures reach the JSON, bad values are refused; --mixed-steps likewise.
#   bench_scripts_test.sh DEEPINFER_BENCH SWEEP_SH COMBINE_PY CONFIG_JSON
set -euo pipefail
bench=$1 sweep=$2 combine=$3 config=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
small=(--backend cpu --prefill-batch-tokens 16 --output-len 3 --warmup 1)

# --- sweep.sh: 2 contexts x 2 request counts = 4 rows under one header ---
"$sweep" --bench "$bench" --model "$config" --out "$tmp/sweep.csv" --contexts "8 16" \
  --requests 1,2 -- "${small[@]}" 2> "$tmp/sweep.log" || fail "sweep.sh failed: $(cat "$tmp/sweep.log")"
[[ $(wc -l < "$tmp/sweep.csv") -eq 5 ]] || fail "want header + 4 rows: $(cat "$tmp/sweep.csv")"
[[ $(grep -c '^model,backend,dtype,requests,context' "$tmp/sweep.csv") -eq 1 ]] || fail "one header"
# requests,context columns (4th, 5th) cover the grid
got=$(tail -n +2 "$tmp/sweep.csv" | cut -d, -f4,5 | sort | tr '\n' ' ')
[[ "$got" == "1,16 1,8 2,16 2,8 " ]] || fail "grid rows: $got"
if "$sweep" --model "$config" 2> /dev/null; then fail "sweep.sh without --out must fail"; fi

# --- combine_results.py: ratios from the inputs, missing inputs reported ---
"$bench" --model "$config" --load-format dummy "${small[@]}" --decode-num-requests 1,2 \
  --context-length 8 --json > "$tmp/ours.json"
cat > "$tmp/hf.json" << 'JSON'
{"dtype": "bfloat16", "context": 8, "prefill": {"tokens_per_step": 16, "step_s": 2.0,
 "tokens_per_s": 8.0}, "decode": [{"requests": 2, "p50_s": 0.5, "tokens_per_s": 4.0}]}
JSON
python3 "$combine" --ours "m=$tmp/ours.json" --hf "m=$tmp/hf.json" \
  --ours "gone=$tmp/missing.json" --csv "$tmp/c.csv" --md "$tmp/c.md" > /dev/null
grep -q 'gone / ours: no result' "$tmp/c.md" || fail "missing input not reported: $(cat "$tmp/c.md")"
python3 - "$tmp/ours.json" "$tmp/c.csv" << 'PY'
import csv, json, sys
ours = json.load(open(sys.argv[1]))
rows = {(r["model"], r["phase"], r["requests"]): r for r in csv.DictReader(open(sys.argv[2]))}
assert set(rows) == {("m", "prefill", ""), ("m", "decode", "1"), ("m", "decode", "2")}, rows
d2 = [d for d in ours["decode"] if d["requests"] == 2][0]
r = rows[("m", "decode", "2")]
assert abs(float(r["ours_over_hf"]) - d2["tokens_per_s"] / 4.0) <= 1e-4 * d2["tokens_per_s"], r
# ours ran on the CPU: no peaks, so no roofline on either side.
assert ours["peak_bytes_per_s"] is None and d2["roofline_fraction"] is None, ours
assert r["ours_roofline"] == "" and r["hf_roofline"] == "", r
assert rows[("m", "decode", "1")]["hf_tok_s"] == "", "no HF figure at 1 request"
p = rows[("m", "prefill", "")]
assert abs(float(p["ours_over_hf"]) - ours["prefill"]["tokens_per_s"] / 8.0) <= \
    1e-4 * ours["prefill"]["tokens_per_s"], p
PY
# --- deepinfer-bench --backend ascend: one line, exit code 2 ---
code=0
"$bench" --model "$config" --load-format dummy --backend ascend > /dev/null 2> "$tmp/ascend.err" ||
  code=$?
[[ $code -eq 2 ]] || fail "--backend ascend: exit code $code, want 2"
[[ $(wc -l < "$tmp/ascend.err") -eq 1 ]] || fail "--backend ascend: want one line: $(cat "$tmp/ascend.err")"
grep -q "^deepinfer-bench: backend 'ascend' is not built into this binary: .*see ascend/README.md$" \
  "$tmp/ascend.err" || fail "--backend ascend: $(cat "$tmp/ascend.err")"

# The same figures as a cuda run would give them (peaks set): the HF roofline is ours' bytes
# rescaled to 2 bytes per value (HF's bf16), against ours' peaks, over HF's 0.5 s.
python3 - "$tmp/ours.json" "$tmp/ours_cuda.json" << 'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
ours.update(backend="cuda", peak_bytes_per_s=4.0e12, peak_flops_per_s=800e12)
json.dump(ours, open(sys.argv[2], "w"))
PY
python3 "$combine" --ours "m=$tmp/ours_cuda.json" --hf "m=$tmp/hf.json" --csv "$tmp/g.csv" \
  --md "$tmp/g.md" > /dev/null
python3 - "$tmp/ours_cuda.json" "$tmp/g.csv" << 'PY'
import csv, json, sys
ours = json.load(open(sys.argv[1]))
rows = {(r["model"], r["phase"], r["requests"]): r for r in csv.DictReader(open(sys.argv[2]))}
d2 = [d for d in ours["decode"] if d["requests"] == 2][0]
r = rows[("m", "decode", "2")]
t = max(d2["bytes_per_step"] * 2 / ours["bytes_per_value"] / 4.0e12,
        d2["flops_per_step"] / 800e12)
assert abs(float(r["hf_roofline"]) - t / 0.5) <= 1e-4 * t / 0.5, (r, t)
PY

# --- --speculative-tokens: parsed, measured per request count, in the JSON; bad values refused ---
"$bench" --model "$config" --load-format dummy "${small[@]}" --decode-num-requests 1,2 \
  --context-length 8 --speculative-tokens 3 --json > "$tmp/spec.json" 2> "$tmp/spec.log" ||
  fail "--speculative-tokens 3: $(cat "$tmp/spec.log")"
python3 - "$tmp/spec.json" << 'PY'
import json, sys
spec = json.load(open(sys.argv[1]))["speculative"]
assert [(s["requests"], s["drafts"]) for s in spec] == [(1, 3), (2, 3)], spec
for s in spec:
    assert s["verify_p50_s"] > 0 and s["draft_p50_s"] > 0 and s["decode_p50_s"] > 0, s
    assert [a["alpha"] for a in s["speedup"]] == [0.5, 0.6, 0.7, 0.8, 0.9], s
PY
for bad in -1 x; do
  if "$bench" --model "$config" --load-format dummy "${small[@]}" --speculative-tokens "$bad" \
    > /dev/null 2> "$tmp/spec_bad.err"; then
    fail "--speculative-tokens $bad must fail"
  fi
  grep -q "speculative-tokens" "$tmp/spec_bad.err" || fail "--speculative-tokens $bad: $(cat "$tmp/spec_bad.err")"
done

# --- --mixed-steps: each shape measured, in the JSON and the text report; bad lists refused ---
"$bench" --model "$config" --load-format dummy "${small[@]}" --decode-num-requests 2 \
  --context-length 8 --mixed-steps 2:12,3:30 --mixed-prompt-length 16 --iters 2 --json \
  > "$tmp/mixed.json" 2> "$tmp/mixed.log" || fail "--mixed-steps: $(cat "$tmp/mixed.log")"
python3 - "$tmp/mixed.json" << 'PY'
import json, sys
mixed = json.load(open(sys.argv[1]))["mixed"]
# 12 tokens over prompts of 16: 8 finishing the continued one, then 4 of a fresh one (cut);
# 30: 8, 16, then 6.
assert [(m["decode_rows"], m["prompt_tokens"], m["prompts"], m["sampled_rows"]) for m in mixed] \
    == [(2, 12, 2, 3), (3, 30, 3, 5)], mixed
for m in mixed:
    assert m["context"] == 8 and m["prompt_length"] == 16 and m["timed_steps"] == 2, m
    assert 0 < m["p50_s"] <= m["p99_s"] and m["tokens_per_s"] > 0, m
PY
"$bench" --model "$config" --load-format dummy "${small[@]}" --decode-num-requests 2 \
  --context-length 8 --mixed-steps 2:12 > "$tmp/mixed.txt" || fail "--mixed-steps (text)"
grep -q "^mixed: 2 decode rows at context 8 + 12 prompt tokens" "$tmp/mixed.txt" ||
  fail "no mixed line: $(cat "$tmp/mixed.txt")"
code=0
"$bench" --model "$config" --load-format dummy "${small[@]}" --mixed-steps 64:512,128 \
  > /dev/null 2> "$tmp/mixed_bad.err" || code=$?
[[ $code -eq 2 ]] || fail "--mixed-steps 64:512,128: exit code $code, want 2"
[[ "$(cat "$tmp/mixed_bad.err")" == "deepinfer-bench: --mixed-steps takes D:P[,D:P...]"*"'128' is not D:P" ]] ||
  fail "--mixed-steps 64:512,128: $(cat "$tmp/mixed_bad.err")"
echo PASS
