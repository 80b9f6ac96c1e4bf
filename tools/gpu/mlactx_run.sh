#!/bin/bash
# Session 6 "mlactx" device run (one call, <= 110 s): GPU tests in parallel, then
# mla_decode_small_bench (1 x 512..4096 in graphs), then deepinfer-bench at 1 request with the
# one-launch kernel on / off (4 and 27 layers, context 1024 and 4096). Steps are skipped once the
# call's time runs short. Results in $OUT (1_tests.txt, 2_kernel_bench.txt, 3_model.txt).
B=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$B/lib TEST_SRCDIR=$B/srcdir
O=${OUT:-/tmp/mlactx_out}
mkdir -p "$O" /tmp/mlactx_logs
cd "$B"
SECONDS=0
left() { [[ $((SECONDS + $1)) -le ${BUDGET:-104} ]]; }
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
  cat COMMIT
} > "$O/0_gpu.txt" 2>&1

# Tests, all at once (the timing steps come after them).
declare -A tests=(
  [mla_decode_small_test]=""
  [mla_attention_test]=""
  [cuda_backend_test]="--gtest_filter=*Mla*:*OneToken*"
  [decode_graph_gpu_test]=""
  [cuda_parity_test]=""
)
for t in "${!tests[@]}"; do
  timeout 40 bin/$t ${tests[$t]} > /tmp/mlactx_logs/$t.log 2>&1 &
done
wait
for t in "${!tests[@]}"; do
  echo "=== $t ${tests[$t]} (rc of the run: see last lines)"
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|^\[  SKIPPED|decode-graphs|max' /tmp/mlactx_logs/$t.log | tail -40
  grep -E 'Failure|FAILED' -A6 /tmp/mlactx_logs/$t.log | head -60
done > "$O/1_tests.txt" 2>&1
echo "tests done at ${SECONDS}s" >> "$O/1_tests.txt"

left 12 && timeout 15 bin/mla_decode_small_bench > "$O/2_kernel_bench.txt" 2>&1

bench() {  # model ctx extra-flags...
  local model=$1 ctx=$2
  shift 2
  echo "=== $model ctx $ctx $* (at ${SECONDS}s)"
  timeout 25 bin/deepinfer-bench --backend cuda --dtype bfloat16 --load-format dummy --seed 1 \
    --context-length "$ctx" --decode-fill random --warmup 2 --output-len 8 --iters 3 \
    --model "configs/$model.json" --decode-num-requests 1 --prefill-batch-tokens 1024 "$@" 2>&1 |
    grep -vE '^I[0-9]{4}|^W[0-9]{4}.*(decode graph|pool)' | tail -25
}
{
  left 20 && bench moonlight_shaped 1024
  left 20 && bench moonlight_shaped 1024 --mla-decode-small=false
  left 10 && bench moonlight_shaped_4layers 1024
  left 10 && bench moonlight_shaped_4layers 1024 --mla-decode-small=false
  left 10 && bench moonlight_shaped_4layers 4096 --mla-decode-small-max-context 8192
  left 10 && bench moonlight_shaped_4layers 4096 --mla-decode-small=false
  left 20 && bench moonlight_shaped 4096 --mla-decode-small-max-context 8192
  left 20 && bench moonlight_shaped 4096 --mla-decode-small=false
  echo "end at ${SECONDS}s"
} > "$O/3_model.txt" 2>&1
