#!/bin/bash
# suite.sh - the GPU machine's checks, by named suite, from a bundle made by tools/gpu/prepare.sh
# (which copies this script, steps.sh and the suites' scripts into it):
#
#   bash DIR/suite.sh SUITE...        (device tool: carry the bundle, logs come back from $OUT)
#
# Suites, run in this order whatever the order given (each step under its own time limit;
# SUITE_BUDGET_S, if set, caps all of them):
#   tests           nccl_window_probe when bundled (which NCCL calls of the device exchange
#                   work here), then every *_test binary of the bundle (TESTS="a_test b_test"
#                   picks some, GTEST_FILTER passes a filter to each)
#   hf              HF transformers' bf16 error on the parity fixtures (hf_bf16_error.py) and its
#                   FP8 error on the FP8 fixture (hf_fp8_error.py)
#   kernel-bench    every kernel and backend micro-benchmark of the bundle (*_bench)
#   bench           ours against HF transformers on the same configs (bench_all.sh)
#   profile         the per-op profile of the 4-layer Moonlight-shaped model (deepinfer-bench
#                   --op-timing-steps) at 1 and 128 requests
#   kernel-times    the per-kernel times of its decode graphs at 1 and 128 requests, Nsight
#                   Compute (kernel_times.sh; KT_FLAGS passes more bench flags)
#   kernel-times-v4 the same for the DeepSeek-V4-Flash 4-layer shapes at 1 request (its decode
#                   context filled by model prefill steps)
#   memcheck        the test binaries under compute-sanitizer memcheck (MEMCHECK="a_test ..."
#                   picks some), the whole model (cuda_parity_test) included
#   racecheck       the attention, reduction and expert-exchange kernel tests under racecheck
#   multi-gpu       the NCCL tests and `deepinfer run` over 2 GPUs (multi_gpu.sh; 2+ GPUs)
#   bench2          deepinfer-bench --ranks 2 (device exchange, then NCCL all-to-all) against
#                   --ranks 1 (multi_gpu.sh; 2+ GPUs)
#   e2e             whole jobs through `deepinfer run` (e2e.sh): wall time split into start-up,
#                   serving and tail, the ideal from deepinfer-bench's step times, the device's
#                   idle share, TTFT, tokens/s against HF transformers' generate (E2E_* knobs:
#                   e2e.sh); $OUT gets e2e.md
#   all             tests hf bench memcheck racecheck
#   session         tests multi-gpu bench2 bench profile kernel-times
#
# $OUT gets summary.txt (one line per step: verdict, time, the gtest result lines and the
# benchmark's prefill: / decode: lines), machine.txt, logs.tar.gz (every step's log and the
# suites' own outputs, refreshed after each step) and bench_all.md when the bench suite ran.
# Exit status: the number of failed steps.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ $# -eq 0 ]]; then
  echo "usage: suite.sh SUITE... (tests hf kernel-bench bench profile kernel-times" \
    "kernel-times-v4 memcheck racecheck multi-gpu bench2 e2e all session)" >&2
  exit 2
fi
suites=" "
for s in "$@"; do
  case "$s" in
    all) suites+="tests hf bench memcheck racecheck " ;;
    session) suites+="tests multi-gpu bench2 bench profile kernel-times " ;;
    tests | hf | kernel-bench | bench | profile | kernel-times | memcheck | racecheck) suites+="$s " ;;
    multi-gpu | bench2 | e2e | kernel-times-v4) suites+="$s " ;;
    *)
      echo "suite.sh: unknown suite '$s'" >&2
      exit 2
      ;;
  esac
done
want() { [[ "$suites" == *" $1 "* ]]; }
STEP_BUDGET_S=${SUITE_BUDGET_S:-}  # a plain assignment: a prefix one would end with the `.`
. "$here/steps.sh"                 # the environment, step(), $OUT/machine.txt
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
echo "suites:$suites GPUs: $gpus" >> "$OUT/machine.txt"
# A suite whose script writes its own files: they go next to the step logs (logs.tar.gz).
sub_out() { mkdir -p "$logs/$1" && echo "$logs/$1"; }

if want tests; then
  # Which NCCL calls of the device expert exchange work here (before the tests that need them).
  # A report, not a test: its exit status 1 (the exchange cannot run here; the tests that need it
  # skip, naming why) passes; a crash does not.
  if [[ -x "$B/nccl_window_probe" ]]; then
    step nccl_window_probe 120 bash -c '"$@"; rc=$?; echo "probe exit status $rc"; ((rc <= 1))' \
      _ env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV "$B/nccl_window_probe"
  fi
  for t in "$B"/*_test; do
    n=$(basename "$t")
    [[ -z "${TESTS:-}" || " $TESTS " == *" $n "* ]] || continue
    step "$n" 300 "$t" --gtest_color=no ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"}
  done
fi
if want hf && [[ -f "$here/hf_bf16_error.py" ]]; then
  step hf_bf16_error 240 python3 "$here/hf_bf16_error.py" \
    --fixtures "$here/srcdir/deepinfer/tests/fixtures"
  step hf_fp8_error 120 python3 "$here/hf_fp8_error.py" \
    --fixtures "$here/srcdir/deepinfer/tests/fixtures"
fi
if want kernel-bench; then
  for b in "$B"/*_bench; do
    step "$(basename "$b")" 180 "$b"
  done
fi
if want bench; then
  step bench 440 env OUT="$(sub_out bench)" BENCH_BUDGET_S=420 bash "$here/bench_all.sh"
  cp "$logs/bench/bench_all.md" "$OUT/" 2>/dev/null
fi
if want profile; then
  step profile 120 "$B/deepinfer-bench" --backend cuda --model "$C/moonlight_shaped_4layers.json" \
    --load-format dummy --decode-num-requests 1,128 --context-length 1024 \
    --prefill-batch-tokens 8192 --output-len 8 --warmup 2 --iters 2 --op-timing-steps 3
fi
if want kernel-times; then
  for n in 1 128; do
    step "kernel_times_$n" 90 env OUT="$(sub_out kernel_times)" bash "$here/kernel_times.sh" \
      "$C/moonlight_shaped_4layers.json" "$n"
  done
fi
if want kernel-times-v4; then
  step kernel_times_v4_1 300 env OUT="$(sub_out kernel_times)" \
    KT_FLAGS="--decode-fill prefill ${KT_FLAGS:-}" bash "$here/kernel_times.sh" \
    "$C/deepseek_v4_flash_4layers.json" 1 kernels_v4_1
fi
if want memcheck; then
  for t in "$B"/*_test; do
    n=$(basename "$t")
    case "$n" in
      backend_factory_test) continue ;;
      # NCCL under compute-sanitizer is very slow and reports NCCL's own internals.
      nccl_communicator_test | nccl_window_test | nccl_window_refused_test) continue ;;
      ep_expert_dispatcher_gpu_test | ep_device_graph_gpu_test) continue ;;
    esac
    [[ -z "${MEMCHECK:-}" || " $MEMCHECK " == *" $n "* ]] || continue
    step "memcheck_$n" 240 compute-sanitizer --tool memcheck --error-exitcode 1 "$t" \
      --gtest_color=no
  done
fi
if want racecheck; then
  for n in mla_attention_test rms_norm_test argmax_test permute_test sample_test \
    hyper_connection_test v4_router_test ep_exchange_test; do
    [[ -x "$B/$n" ]] || continue
    step "racecheck_$n" 240 compute-sanitizer --tool racecheck --error-exitcode 1 "$B/$n" \
      --gtest_color=no
  done
fi
if want multi-gpu; then
  if ((gpus >= 2)); then
    step multi_gpu 360 env OUT="$(sub_out multi_gpu)" MULTI_GPU_PARTS="tests runs" \
      bash "$here/multi_gpu.sh"
  else
    echo "multi_gpu SKIPPED ($gpus GPU)" | tee -a "$summary"
  fi
fi
if want bench2; then
  if ((gpus >= 2)); then
    step bench2 240 env OUT="$(sub_out bench2)" MULTI_GPU_PARTS=bench2 BENCH2_BUDGET_S=220 \
      bash "$here/multi_gpu.sh"
  else
    echo "bench2 SKIPPED ($gpus GPU)" | tee -a "$summary"
  fi
fi
if want e2e; then
  step e2e 570 env OUT="$(sub_out e2e)" E2E_BUDGET_S="${E2E_BUDGET_S:-540}" bash "$here/e2e.sh"
  cp "$logs/e2e/e2e.md" "$OUT/" 2>/dev/null
fi
tar -C "$logs" -czf "$OUT/logs.tar.gz" .
echo "failed steps: $failed" | tee -a "$summary"
exit "$failed"
