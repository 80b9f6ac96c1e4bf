// The FP8 latent KV cache (--kv-cache-dtype fp8: the latent as e4m3 with one scale per token,
// the rope key bf16, worker/backend/fp8_latent_entry.h) against HF transformers' float32
// DeepseekV3ForCausalLM, on the CPU with fp32 weights so that the cache is the only rounding:
// the prompt logits' error and the teacher-forced greedy agreement of the fp8 cache are printed
// next to those of the fp32 and bf16 caches and bounded as explained at the constants below.
//
// Measured (median / p90 position error relative to max |HF logit|, greedy agreement):
//   fixture            bf16 cache                  fp8 cache
//   dsv3_qlora_rope    9.9e-4 / 2.0e-3, 95 / 96    1.4e-2 / 2.6e-2, 91 / 96
//   dsv3_yarn_nolora   1.7e-3 / 3.3e-3, 71 / 72    2.8e-2 / 1.8e-1, 68 / 72
//   dsv3_mla_dims      7.1e-4 / 1.3e-3, 72 / 72    1.1e-2 / 2.1e-2, 69 / 72
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/parity/parity_checks.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

// e4m3 keeps 4 significant bits against bf16's 8: its rounding of a latent value is up to
// 2^-4 relative against 2^-8, 16 times as much (the per-token scale maps the token's amax onto
// 448, so every latent value is in e4m3's normal range but the smallest, whose absolute error
// is smaller still). The typical (median) position's error should grow by about that ratio over
// the bf16 cache's, measured 14 - 16x: it must stay within twice the ratio, and above a quarter
// of it (the quantisation shows: not the bf16 or fp32 cache in disguise).
constexpr double kRoundingRatio = 16.0;
// The bf16 bound of parity_checks.h scaled by the same ratio, at the same share of positions
// (the rest are near-tied expert choices that flip, as with bf16).
constexpr double kFp8Tolerance = kRoundingRatio * kBf16Tolerance;

struct CacheRun {
  FixtureLogitsError logits;
  TeacherForcedResult greedy;
  double median = 0;
};

CacheRun Measure(const std::string& fixture, const std::string& cache_dtype) {
  CpuBackend backend(2, WeightDType::kFloat32);
  CacheRun run;
  auto m = LoadParityModel(fixture, &backend, cache_dtype);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return run;
  auto e = AllPromptsLogitsError(*m);
  EXPECT_TRUE(e.ok()) << e.status();
  if (e.ok()) run.logits = *e;
  auto r = AllPromptsTeacherForced(*m);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) run.greedy = *r;
  std::vector<double> sorted = run.logits.position_rel;
  std::sort(sorted.begin(), sorted.end());
  const double p90 = sorted.empty() ? 0 : sorted[sorted.size() * 9 / 10];
  run.median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  std::printf(
      "[fp8-cache-parity] %s cache=%s logits median=%.3e p90=%.3e max=%.3e rms=%.3e, "
      "greedy agreement %lld / %lld\n",
      fixture.c_str(), cache_dtype.c_str(), run.median, p90, run.logits.max_rel, run.logits.rms,
      static_cast<long long>(run.greedy.matches), static_cast<long long>(run.greedy.positions));
  return run;
}

class Fp8CacheParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8CacheParityTest, LogitsAndGreedyNextToTheBf16Cache) {
  const CacheRun f32 = Measure(GetParam(), "float32");
  const CacheRun bf16 = Measure(GetParam(), "bfloat16");
  const CacheRun fp8 = Measure(GetParam(), "fp8");
  ASSERT_FALSE(fp8.logits.position_rel.empty());
  ASSERT_GT(bf16.median, 10 * f32.median) << "the bf16 cache made no difference";
  EXPECT_LE(fp8.median, 2 * kRoundingRatio * bf16.median);
  EXPECT_GE(fp8.median, kRoundingRatio / 4 * bf16.median);
  EXPECT_GE(fp8.logits.WithinCount(kFp8Tolerance),
            kBf16PositionsWithin * fp8.logits.position_rel.size());
  // HF's greedy tokens come from an fp32 model: where two logits are closer than the cache's
  // rounding our argmax may pick the other one, as with bf16 weights.
  EXPECT_GE(fp8.greedy.matches, kBf16GreedyAgreement * fp8.greedy.positions);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8CacheParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

}  // namespace
}  // namespace deepinfer
