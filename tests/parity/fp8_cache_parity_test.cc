// The FP8 latent KV cache (--kv-cache-dtype fp8: the latent as e4m3 with one scale per token,
// the rope key bf16, worker/backend/fp8_latent_entry.h) against HF transformers' float32
// DeepseekV3ForCausalLM, on the CPU with fp32 weights so that the cache is the only rounding:
// the prompt logits' error and the teacher-forced greedy agreement of the fp8 cache are printed
// next to those of the fp32 and bf16 caches and bounded as parity_checks.h explains
// (ExpectFp8CacheWithinBounds). tests/parity/cuda_parity_test.cc applies the same bounds to the
// CUDA backend.
//
// Measured (median / p90 position error relative to max |HF logit|, greedy agreement):
//   fixture            bf16 cache                  fp8 cache
//   dsv3_qlora_rope    9.9e-4 / 2.0e-3, 95 / 96    1.4e-2 / 2.6e-2, 91 / 96
//   dsv3_yarn_nolora   1.7e-3 / 3.3e-3, 71 / 72    2.8e-2 / 1.8e-1, 68 / 72
//   dsv3_mla_dims      7.1e-4 / 1.3e-3, 72 / 72    1.1e-2 / 2.1e-2, 69 / 72
#include <string>

#include "gtest/gtest.h"
#include "tests/parity/parity_checks.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

class Fp8CacheParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8CacheParityTest, LogitsAndGreedyNextToTheBf16Cache) {
  CpuBackend backend(2, WeightDType::kFloat32);
  const CacheDTypeRun f32 = MeasureCacheDType(GetParam(), &backend, "float32", "cpu");
  const CacheDTypeRun bf16 = MeasureCacheDType(GetParam(), &backend, "bfloat16", "cpu");
  const CacheDTypeRun fp8 = MeasureCacheDType(GetParam(), &backend, "fp8", "cpu");
  ASSERT_GT(bf16.median, 10 * f32.median) << "the bf16 cache made no difference";
  ExpectFp8CacheWithinBounds(bf16, fp8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8CacheParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

}  // namespace
}  // namespace deepinfer
