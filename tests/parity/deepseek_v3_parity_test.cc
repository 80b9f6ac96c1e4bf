// Parity with HF transformers: for every fixture prompt, the CPU engine's logits at every
// prompt position must match HF's float32 logits within 1e-4 (max abs difference relative to
// the max abs HF logit), and greedy decoding through the paged cache (prefill, then one token
// per step) must reproduce HF's 24-token continuation, for sequences alone and batched.
//
// Bf16ParityTest runs the same model with bf16 matrix weights (and bf16-rounded GEMM
// activations, fp32 accumulation) and an fp32 KV cache against the same HF float32 logits, with
// the bf16 bounds of tests/parity/parity_checks.h (kBf16Tolerance at kBf16PositionsWithin of the
// positions, HF's greedy tokens predicted under teacher forcing at kBf16GreedyAgreement).
// Bf16CacheParityTest: bf16 weights and the bf16 latent cache they bring by default (the CUDA
// default): the same logit bounds; its teacher-forced greedy agreement is printed, not
// asserted at kBf16GreedyAgreement (measured just below it on dsv3_qlora_rope, where HF's own
// bf16 model scores 90 / 96: docs/cuda/bf16-and-kv-cache.md, "bf16 latent KV cache").
#include <cstdio>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tests/parity/parity_checks.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

constexpr double kTolerance = 1e-4;

class ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  explicit ParityTest(WeightDType dtype = WeightDType::kFloat32,
                      std::string kv_cache_dtype = "auto")
      : backend_(2, dtype), kv_cache_dtype_(std::move(kv_cache_dtype)) {}
  void SetUp() override {
    auto m = LoadParityModel(GetParam(), &backend_, kv_cache_dtype_);
    ASSERT_TRUE(m.ok()) << m.status();
    m_ = std::move(*m);
  }

  CpuBackend backend_;
  const std::string kv_cache_dtype_;
  ParityModel m_;
};

TEST_P(ParityTest, PromptLogitsMatchHfAtEveryPosition) {
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  for (size_t i = 0; i < m_.fx.prompts.size(); ++i) {
    const size_t len = m_.fx.prompts[i].ids.size();
    std::printf("[parity] %s prompt_len=%zu rel=%.3e\n", GetParam().c_str(), len,
                e->prompt_max_rel[i]);
    EXPECT_LE(e->prompt_max_rel[i], kTolerance) << "prompt of " << len << " tokens";
  }
  std::printf("[parity] %s worst rel diff %.3e\n", GetParam().c_str(), e->max_rel);
}

TEST_P(ParityTest, GreedyContinuationsMatchHfAloneAndBatched) {
  for (bool batched : {false, true}) {
    auto got = GreedyContinuations(m_, batched);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t s = 0; s < got->size(); ++s) {
      EXPECT_EQ((*got)[s], m_.fx.prompts[s].greedy)
          << (batched ? "batched, " : "alone, ") << "prompt " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

class Bf16ParityTest : public ParityTest {
 protected:
  explicit Bf16ParityTest(const std::string& kv_cache_dtype = "float32")
      : ParityTest(WeightDType::kBFloat16, kv_cache_dtype) {}
  const char* Label() const { return kv_cache_dtype_ == "float32" ? "cpu" : "cpu bf16-cache"; }
};

TEST_P(Bf16ParityTest, PromptLogitsWithinBf16ToleranceOfHfFloat32) {
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  for (double r : e->position_rel) {
    // Not fp32 in disguise: bf16 rounding must show (fp32 is ~1e-6 here).
    EXPECT_GT(r, 1e-5) << "bf16 weights made no difference";
  }
  ExpectBf16LogitsWithinTolerance(*e, Label(), GetParam());
}

TEST_P(Bf16ParityTest, TeacherForcedGreedyMostlyMatchesHf) {
  auto r = AllPromptsTeacherForced(m_);
  ASSERT_TRUE(r.ok()) << r.status();
  PrintGreedyAgreement(*r, Label(), GetParam());
  EXPECT_GE(r->matches, kBf16GreedyAgreement * r->positions);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16ParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

// bf16 weights with the bf16 latent cache (the default for bf16 weights).
class Bf16CacheParityTest : public Bf16ParityTest {
 protected:
  Bf16CacheParityTest() : Bf16ParityTest("auto") {}
};

TEST_P(Bf16CacheParityTest, CacheIsBf16) {
  EXPECT_EQ(m_.pool->spec().groups[0].dtype, WeightDType::kBFloat16);
}

// The logit bound holds as with the fp32 cache. Greedy agreement is printed, not asserted: the
// bf16 cache rounds the keys too, and on these random-weight fixtures (near-tied logits) it
// agrees on fewer positions than kBf16GreedyAgreement (docs/cuda/bf16-and-kv-cache.md, "bf16 latent
// KV cache").
TEST_P(Bf16CacheParityTest, PromptLogitsWithinBf16ToleranceOfHfFloat32) {
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectBf16LogitsWithinTolerance(*e, Label(), GetParam());
  auto r = AllPromptsTeacherForced(m_);
  ASSERT_TRUE(r.ok()) << r.status();
  PrintGreedyAgreement(*r, Label(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16CacheParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

}  // namespace
}  // namespace deepinfer
