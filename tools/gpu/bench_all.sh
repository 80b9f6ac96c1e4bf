#!/bin/bash
# bench_all.sh - one GPU-machine call: our benchmark cases and the HF transformers baseline on
# the same configs, combined into one table with ratios. Copied into the bundle by
# tools/gpu/prepare.sh (--bench-only is enough) and run from there:
#
#   tools/gpu/prepare.sh --out .gpu/bench --bench-only
#   device tool: carry [".gpu/bench"], command `bash .gpu/bench/bench_all.sh`
#
# Cases (context 1024 everywhere, dummy weights):
#   moonlight (configs/moonlight_shaped.json: hidden 2048, 27 layers, 64 experts top-6):
#     ours and HF: prefill 32 x 1024 tokens per step, decode at 1, 64 and 128 requests
#   v3_4layers (configs/deepseek_v3_4layers.json: DeepSeek-V3's shapes, its first 4 layers,
#     3 dense + 1 MoE with 256 experts top-8): ours only, prefill 8 x 1024, decode at 1, 64, 128
#   v4_4layers (configs/deepseek_v4_flash_4layers.json: DeepSeek-V4-Flash's shapes, its first 4
#     layers): ours and HF: prefill 8 x 1024, decode at 1, 64 and 128 requests (HF at 1 and 64:
#     its V4 port runs out of memory at 128); ours fills the decode context by prefill steps
#     (V4's cache keeps per-sequence state, which random fill cannot write)
# Our dtype is BENCH_DTYPE (default bfloat16); HF runs bf16. BENCH_FP8=1 adds our runs with
# --dtype fp8 (projections and MLPs FP8 block-scaled, the rest bf16) on both configs: rows
# moonlight_fp8 and v3_4layers_fp8 beside the BENCH_DTYPE rows, in the same call; and row
# moonlight_fp8kv: BENCH_DTYPE weights with --kv-cache-dtype fp8 (the latent cache in e4m3 with
# a scale per token), whose cache bytes and tokens per GiB (against the BENCH_DTYPE row's) go
# to summary.txt. BENCH_MXFP4=1 adds --dtype mxfp4 runs (as fp8, with the routed experts
# quantised to MXFP4 at load): rows moonlight_mxfp4 and v3_4layers_mxfp4. With either switch,
# raise BENCH_BUDGET_S (each adds about 220 s).
# Before each decode run, ours and HF idle the GPU for BENCH_DECODE_PAUSE_MS (default 1000) ms:
# right after a large prefill the board's power controller holds the SM clock down for ~0.4 s,
# which costs a latency-bound 1-request decode ~5% (docs/performance.md, "Decode right after a
# large prefill"); 0 measures the decode straight after the prefill.
# Everything is capped to finish inside BENCH_BUDGET_S (default 400) seconds: each step gets a
# timeout from what is left, so a slow step costs its own row, not the table.
#
# $OUT gets: bench_all.md (the table), bench_all.csv, summary.txt (one line per step) and
# results.tar.gz (every JSON and log). Exit status: the number of failed steps.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
budget=${BENCH_BUDGET_S:-400}
dtype=${BENCH_DTYPE:-bfloat16}
pause_ms=${BENCH_DECODE_PAUSE_MS:-1000}
work=/tmp/bench-all
rm -rf "$work"
mkdir -p "$work"
summary="$OUT/summary.txt"
start=$(date +%s)
failed=0
{
  echo "commit: $(head -1 "$here/COMMIT" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
} > "$summary" 2>&1

step() {  # step NAME CAP_S COMMAND... : stdout -> $work/NAME.json, stderr -> $work/NAME.log
  local name=$1 cap=$2
  shift 2
  local left=$((budget - ($(date +%s) - start) - 5))
  local limit=$((cap < left ? cap : left))
  if ((limit < 10)); then
    echo "$name SKIPPED (time budget)" | tee -a "$summary"
    failed=$((failed + 1))
    return
  fi
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$work/$name.json" 2> "$work/$name.log"
  local rc=$?
  local verdict=PASS
  [[ $rc -eq 0 ]] || { verdict="FAIL(rc=$rc, limit ${limit}s)"; failed=$((failed + 1)); }
  echo "$name $verdict $(($(date +%s) - t0))s" | tee -a "$summary"
  tar -C "$work" -czf "$OUT/results.tar.gz" .
}

bench=("$here/bin/deepinfer-bench" --backend cuda --dtype "$dtype" --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 3 --output-len 11 --json
  --pause-before-decode-ms "$pause_ms")
# OURS_FLAGS: more deepinfer-bench flags for our runs (word-split), e.g. "--gemm-autotune".
read -r -a ours_flags <<< "${OURS_FLAGS:-}"
bench+=("${ours_flags[@]}")
step ours_moonlight 120 "${bench[@]}" --model "$here/configs/moonlight_shaped.json" \
  --decode-num-requests 1,64,128 --prefill-batch-tokens 32768 --iters 3
step hf_moonlight 50 python3 "$here/hf_bench.py" --config "$here/configs/moonlight_shaped.json" \
  --context 1024 --prefill-batch 32 --prefill-iters 3 --decode-requests 1,64,128 --warmup 3 \
  --decode-steps 8 --budget-s 40 --pause-before-decode-ms "$pause_ms"
step ours_v3_4layers 100 "${bench[@]}" --model "$here/configs/deepseek_v3_4layers.json" \
  --decode-num-requests 1,64,128 --prefill-batch-tokens 8192 --iters 3
step ours_v4_4layers 150 "${bench[@]}" --model "$here/configs/deepseek_v4_flash_4layers.json" \
  --decode-fill prefill --decode-num-requests 1,64,128 --prefill-batch-tokens 8192 --iters 3
step hf_v4_4layers 120 python3 "$here/hf_bench.py" \
  --config "$here/configs/deepseek_v4_flash_4layers.json" --context 1024 --prefill-batch 8 \
  --prefill-iters 3 --decode-requests 1,64 --warmup 3 --decode-steps 8 --budget-s 100 \
  --pause-before-decode-ms "$pause_ms"
fp8_rows=()
if [[ ${BENCH_FP8:-0} == 1 ]]; then
  fp8=("${bench[@]}" --dtype fp8)  # the later --dtype wins
  step ours_moonlight_fp8 120 "${fp8[@]}" --model "$here/configs/moonlight_shaped.json" \
    --decode-num-requests 1,64,128 --prefill-batch-tokens 32768 --iters 3
  step ours_v3_4layers_fp8 100 "${fp8[@]}" --model "$here/configs/deepseek_v3_4layers.json" \
    --decode-num-requests 1,64,128 --prefill-batch-tokens 8192 --iters 3
  step ours_moonlight_fp8kv 120 "${bench[@]}" --kv-cache-dtype fp8 \
    --model "$here/configs/moonlight_shaped.json" \
    --decode-num-requests 1,64,128 --prefill-batch-tokens 32768 --iters 3
  fp8_rows=(--ours "moonlight_fp8=$work/ours_moonlight_fp8.json"
    --ours "v3_4layers_fp8=$work/ours_v3_4layers_fp8.json"
    --ours "moonlight_fp8kv=$work/ours_moonlight_fp8kv.json")
  for run in ours_moonlight ours_moonlight_fp8kv; do
    grep -o '"kv_cache_dtype": "[^"]*", "kv_cache_bytes_per_token": [0-9]*, "kv_cache_tokens_per_gib": [0-9]*' \
      "$work/$run.json" 2>/dev/null | sed "s/^/$run kv cache: /" | tee -a "$summary"
  done
fi

mxfp4_rows=()
if [[ ${BENCH_MXFP4:-0} == 1 ]]; then
  mxfp4=("${bench[@]}" --dtype mxfp4)  # the later --dtype wins
  step ours_moonlight_mxfp4 120 "${mxfp4[@]}" --model "$here/configs/moonlight_shaped.json" \
    --decode-num-requests 1,64,128 --prefill-batch-tokens 32768 --iters 3
  step ours_v3_4layers_mxfp4 100 "${mxfp4[@]}" --model "$here/configs/deepseek_v3_4layers.json" \
    --decode-num-requests 1,64,128 --prefill-batch-tokens 8192 --iters 3
  mxfp4_rows=(--ours "moonlight_mxfp4=$work/ours_moonlight_mxfp4.json"
    --ours "v3_4layers_mxfp4=$work/ours_v3_4layers_mxfp4.json")
fi

python3 "$here/combine_results.py" \
  --ours "moonlight=$work/ours_moonlight.json" --hf "moonlight=$work/hf_moonlight.json" \
  --ours "v3_4layers=$work/ours_v3_4layers.json" \
  --ours "v4_4layers=$work/ours_v4_4layers.json" --hf "v4_4layers=$work/hf_v4_4layers.json" \
  "${fp8_rows[@]}" "${mxfp4_rows[@]}" \
  --title "deepinfer-bench ($dtype) vs HF transformers (bf16), context 1024, commit $(head -1 "$here/COMMIT" 2>/dev/null | cut -c1-12)" \
  --csv "$OUT/bench_all.csv" --md "$OUT/bench_all.md" > /dev/null 2> "$work/combine.log" ||
  failed=$((failed + 1))
tar -C "$work" -czf "$OUT/results.tar.gz" .
echo "total $(($(date +%s) - start))s, failed steps: $failed" | tee -a "$summary"
exit "$failed"
