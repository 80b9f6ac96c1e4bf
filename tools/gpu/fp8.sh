#!/bin/bash
# fp8.sh - the FP8 and MXFP4 GEMM and FP8 KV cache checks in one GPU-machine call, from a
# bundle of tools/gpu/prepare.sh (which copies this script into it):
#
#   GPU_TESTS="//kernels/gemm:fp8_block_gemm_test //kernels/gemm:fp8_mma_gemm_test
#     //kernels/gemm:fp8_tiled_gemm_test //kernels/gemm:fp8_quantize_test
#     //worker/backend/cuda:cublaslt_fp8_gemm_test //worker/backend/cuda:cuda_backend_fp8_test
#     //tests/parity:cuda_fp8_parity_test //worker/backend/cuda:cuda_backend_fp8_cache_test
#     //kernels/gemm:mxfp4_mma_gemm_test //kernels/gemm:mxfp4_dequant_test
#     //worker/backend/cuda:cuda_backend_mxfp4_test
#     //kernels/gemm:staged_gemv_fp8_test //kernels/moe:moe_decode_fused_fp8_test" \
#   GPU_TOOLS="//worker/backend/cuda:fp8_gemm_bench" GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out .gpu/fp8
#   device tool: carry [".gpu/fp8"], command `bash .gpu/fp8/fp8.sh`
#
# Prints compactly: each test binary's verdict with its failures (the assertion lines), the
# cuBLASLt test's measured errors, and fp8_gemm_bench's summary tables (FP8 speed-up over bf16
# and the fastest FP8 path per layer shape and row count) with the grouped expert GEMM lines.
# $OUT gets summary.txt, fp8_gemm_bench.txt (the whole table) and logs.tar.gz (every log).
# FP8_BENCH_ARGS passes arguments to the benchmark (--quick: fewer row counts; --variants: only
# the tensor-core kernels' tile-loop variants against bf16, printed whole).
# Exit status: the number of failed steps.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STEP_BUDGET_S=${FP8_BUDGET_S:-540}
. "$here/steps.sh"  # the environment, step(), $OUT/summary.txt and machine.txt

head -3 "$OUT/machine.txt"
for t in fp8_block_gemm_test fp8_quantize_test fp8_mma_gemm_test fp8_tiled_gemm_test \
  cublaslt_fp8_gemm_test cuda_backend_fp8_test cuda_fp8_parity_test cuda_backend_fp8_cache_test \
  mxfp4_mma_gemm_test mxfp4_dequant_test cuda_backend_mxfp4_test staged_gemv_fp8_test \
  moe_decode_fused_fp8_test; do
  step "$t" 240 "$B/$t" --gtest_color=no --gtest_brief=1
  # The first failures with their messages (gtest prints the expression and values after the
  # file:line), and the measured W8A8 errors.
  grep -A4 -m 12 ': Failure' "$logs/$t.log" 2>/dev/null | cut -c1-200
  grep -E '^\[cublaslt-fp8\]|^\[fp8-parity\]|^\[mxfp4-mma\]' "$logs/$t.log" 2>/dev/null |
    cut -c1-160
done
step fp8_gemm_bench 420 "$B/fp8_gemm_bench" ${FP8_BENCH_ARGS:-}
cp "$logs/fp8_gemm_bench.log" "$OUT/fp8_gemm_bench.txt" 2>/dev/null
sed -n '/^FP8 speed-up/,$p' "$logs/fp8_gemm_bench.log" 2>/dev/null |
  sed -E 's/ +\| fp8 core/ | core/; s/ us / /g'
sed -n '/^FP8 tile variants/,$p' "$logs/fp8_gemm_bench.log" 2>/dev/null  # --variants
echo "failed steps: $failed"
exit "$failed"
