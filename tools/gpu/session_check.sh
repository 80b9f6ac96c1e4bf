#!/bin/bash
# session_check.sh - every GPU check in one device call, from a bundle tools/gpu/prepare.sh made
# (copied there): the GPU tests (run_all.sh, tests step), the multi-GPU checks when the machine
# has 2 or more GPUs (multi_gpu.sh: its NCCL tests and `deepinfer run`s in `multi`, its
# benchmark at 2 ranks against 1 rank in `bench2`), the benchmark against HF transformers
# (bench_all.sh), a per-op profile of a 4-layer Moonlight-shaped model and the per-kernel times
# of its decode graphs at 1 and 128 requests (kernel_times.sh, Nsight Compute). Each part has its
# own time limit, so one hang costs its part only. The device tool returns at most 8 files: everything goes into
# $OUT/session.tar.gz, plus $OUT/summary.txt (every part's summary) and $OUT/bench_all.md.
#
#   SESSION_PARTS="tests multi bench2 bench profile kernels" (default: all six; multi and bench2
#   run only with 2 or more GPUs); TESTS_S, BENCH_S, KERNELS_S override the tests', the
#   benchmark's and each kernel-times part's limits (240, 260, 90 s)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
parts=${SESSION_PARTS:-tests multi bench2 bench profile kernels}
want() { [[ " $parts " == *" $1 "* ]]; }
work=/tmp/session-check
rm -rf "$work"
mkdir -p "$work"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
echo "commit: $(head -1 "$here/COMMIT" 2>/dev/null); GPUs: $gpus" > "$work/summary.txt"
part() {  # part NAME LIMIT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  OUT="$work/$name" timeout "$limit" "$@" > "$work/$name.out" 2>&1
  echo "== $name: exit $? after $(($(date +%s) - t0)) s" >> "$work/summary.txt"
}
want tests && part tests "${TESTS_S:-240}" env STEPS=tests bash "$here/run_all.sh"
if want multi && ((gpus >= 2)); then
  part multi 240 env MULTI_GPU_PARTS="tests runs" bash "$here/multi_gpu.sh"
fi
if want bench2 && ((gpus >= 2)); then
  part bench2 180 env MULTI_GPU_PARTS=bench2 BENCH2_BUDGET_S=160 bash "$here/multi_gpu.sh"
fi
want bench && part bench "${BENCH_S:-260}" env BENCH_BUDGET_S=$((${BENCH_S:-260} - 20)) bash "$here/bench_all.sh"
if want profile; then
  part profile 120 env LD_LIBRARY_PATH="$here/lib" "$here/bin/deepinfer-bench" --backend cuda \
    --model "$here/configs/moonlight_shaped_4layers.json" --load-format dummy \
    --decode-num-requests 1,128 --context-length 1024 --prefill-batch-tokens 8192 \
    --output-len 8 --warmup 2 --iters 2 --op-timing-steps 3
fi
if want kernels; then
  for n in 1 128; do
    part "kernels_$n" "${KERNELS_S:-90}" bash "$here/kernel_times.sh" "$here/configs/moonlight_shaped_4layers.json" "$n"
  done
fi
for f in "$work"/*/summary.txt "$work"/*/multi_gpu_summary.txt; do
  [[ -f "$f" ]] && { echo "-- $f"; cat "$f"; } >> "$work/summary.txt"
done
cp "$work/summary.txt" "$OUT/summary.txt"
[[ -f "$work/bench/bench_all.md" ]] && cp "$work/bench/bench_all.md" "$OUT/"
tar -C "$work" -czf "$OUT/session.tar.gz" .
cat "$OUT/summary.txt"
