#!/bin/bash
# run_all.sh - runs every GPU test (and the benchmark, when bundled) on the GPU machine from the
# folder tools/gpu/prepare.sh made; this script is copied into that folder and run from there:
#
#   bash .gpu/run_all.sh            (device tool: carry [".gpu"], logs come back from $OUT)
#   BENCH_MODE=profile bash ...     (benchmark: a short per-op profile instead of the full model)
#   STEPS="tests hf" bash ...       (only some steps; default all: tests hf bench memcheck
#                                    racecheck model_memcheck; MEMCHECK="a_test b_test" limits
#                                    memcheck to those binaries)
#
# Per step a log (gtest output) in $OUT/logs.tar.gz (the device tool returns at most 8 files, so
# the logs travel as one archive, refreshed after every step in case the call is cut short) and
# a line in $OUT/summary.txt; $OUT/machine.txt describes the GPU. The kernel tests
# also run under compute-sanitizer memcheck (out-of-bounds and misaligned accesses) and the
# attention / reduction kernels under racecheck (shared-memory races). Exit status: the number
# of failed steps (0 = all passed).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/steps.sh"  # the environment, $OUT/machine.txt, step(), $failed
STEPS=${STEPS:-tests hf bench memcheck racecheck model_memcheck}
want() { [[ " $STEPS " == *" $1 "* ]]; }

if want tests; then
  for t in "$here"/bin/*_test; do
    step "$(basename "$t")" 300 "$t" --gtest_color=no
  done
fi
# HF transformers' own bf16 error on the fixtures, for "ours vs HF bf16" (cuda_parity_test
# prints ours).
if want hf && [[ -f "$here/hf_bf16_error.py" ]]; then
  step hf_bf16_error 240 python3 "$here/hf_bf16_error.py" \
    --fixtures "$here/srcdir/deepinfer/tests/fixtures"
fi
if want kbench && [[ -x "$here/bin/mla_attention_bench" ]]; then  # old vs new attention kernel
  step mla_attention_bench 120 "$here/bin/mla_attention_bench"
fi
if want kbench && [[ -x "$here/bin/mla_decode_small_bench" ]]; then  # 1-8 decode tokens
  step mla_decode_small_bench 60 "$here/bin/mla_decode_small_bench"
fi
if want kbench && [[ -x "$here/bin/mla_prefill_bench" ]]; then  # prefill: CUDA cores vs tensor cores
  step mla_prefill_bench 120 "$here/bin/mla_prefill_bench"
fi
if want kbench && [[ -x "$here/bin/mha_prefill_bench" ]]; then  # prefill: absorbed vs non-absorbed
  step mha_prefill_bench 60 "$here/bin/mha_prefill_bench"
fi
if want kbench && [[ -x "$here/bin/grouped_gemm_bench" ]]; then
  step grouped_gemm_bench 120 "$here/bin/grouped_gemm_bench"
  cp "$logs/grouped_gemm_bench.log" "$OUT/grouped_gemm_bench.txt"
fi
if want kbench && [[ -x "$here/bin/moe_decode_bench" ]]; then  # a decode MoE layer in a graph
  step moe_decode_bench 60 "$here/bin/moe_decode_bench"
fi
if want kbench && [[ -x "$here/bin/gemm_shapes_bench" ]]; then  # prefill GEMMs: cuBLAS vs cuBLASLt
  step gemm_shapes_bench 60 "$here/bin/gemm_shapes_bench"
fi
if want kbench && [[ -x "$here/bin/small_m_gemm_bench" ]]; then  # decode GEMMs: own vs cuBLAS
  step small_m_gemm_bench 60 "$here/bin/small_m_gemm_bench"
fi
if want kbench && [[ -x "$here/bin/sampling_bench" ]]; then
  step sampling_bench 120 "$here/bin/sampling_bench"
  cp "$logs/sampling_bench.log" "$OUT/sampling_bench.txt"
fi
if want kbench && [[ -x "$here/bin/moe_prefill_bench" ]]; then
  step moe_prefill_bench 120 "$here/bin/moe_prefill_bench"
fi
if want bench && [[ -x "$here/bin/deepinfer-bench" && -f "$here/bench_cases.sh" ]]; then
  step bench 300 bash "$here/bench_cases.sh" "$here" "${BENCH_MODE:-full}"
fi
if want memcheck; then
  for t in "$here"/bin/*_test; do
    n=$(basename "$t")
    case "$n" in
      cuda_parity_test | backend_factory_test) continue ;;
      # NCCL under compute-sanitizer is very slow and reports NCCL's own internals.
      nccl_communicator_test | ep_expert_dispatcher_gpu_test) continue ;;
    esac
    [[ -z "${MEMCHECK:-}" || " $MEMCHECK " == *" $n "* ]] || continue
    step "memcheck_$n" 240 compute-sanitizer --tool memcheck --error-exitcode 1 "$t" \
      --gtest_color=no
  done
fi
if want racecheck; then
  for n in mla_attention_test rms_norm_test argmax_test permute_test sample_test; do
    [[ -x "$here/bin/$n" ]] || continue
    step "racecheck_$n" 240 compute-sanitizer --tool racecheck --error-exitcode 1 \
      "$here/bin/$n" --gtest_color=no
  done
fi
# The whole model under memcheck: every op with the model's real strides and shapes.
if want model_memcheck && [[ -x "$here/bin/cuda_parity_test" ]]; then
  step memcheck_cuda_parity_test 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$here/bin/cuda_parity_test" --gtest_color=no
fi
echo "failed steps: $failed" | tee -a "$summary"
exit "$failed"
