// Parity of the model on the CUDA backend with HF transformers. fp32 weights: for every fixture
// prompt, logits at every prompt position within 1e-3 of HF's float32 logits (max abs difference
// relative to the max abs HF logit; the CPU engine's bound is 1e-4), and greedy decoding through
// the paged cache on the GPU (prefill, then one token per step) reproduces HF's 24-token
// continuation, for sequences alone and batched. bf16 weights with an fp32 KV cache: the bounds
// of tests/parity/parity_checks.h, as the CPU bf16 test, with the max relative error printed for
// the bf16 parity claim (tools/parity/hf_bf16_error.py prints HF bf16's). The batch-invariant
// mode (CudaTuning::batch_invariant): fp32 weights to the fp32 bounds (logits and greedy alone
// and batched), bf16 weights with the bf16 cache to the bf16 bounds. bf16 weights with the
// bf16 cache (the CUDA default): the same logit bounds, greedy agreement printed only (see
// deepseek_v3_parity_test.cc). bf16 weights with the dense MLP layers through the fused MoE
// kernels at one decode token (NormedDenseMlp): the teacher-forced greedy bound. fp32 weights
// with the FP8 latent cache: the bounds of fp8_cache_parity_test against the bf16 cache. Skips
// without a GPU.
#include <cstdio>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "tests/parity/parity_checks.h"
#include "worker/backend/cuda/cuda_backend.h"

namespace deepinfer {
namespace {

constexpr double kTolerance = 1e-3;

class CudaParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  explicit CudaParityTest(WeightDType dtype = WeightDType::kFloat32,
                          std::string kv_cache_dtype = "auto", bool batch_invariant = false)
      : dtype_(dtype), kv_cache_dtype_(std::move(kv_cache_dtype)) {
    tuning_.batch_invariant = batch_invariant;
  }
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    auto b = CudaBackend::Create(0, dtype_, tuning_);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
    auto m = LoadParityModel(GetParam(), backend_.get(), kv_cache_dtype_);
    ASSERT_TRUE(m.ok()) << m.status();
    m_ = std::move(*m);
  }

  const WeightDType dtype_;
  const std::string kv_cache_dtype_;
  CudaTuning tuning_;
  std::unique_ptr<CudaBackend> backend_;  // declared first: destroyed after the model and cache
  ParityModel m_;
};

TEST_P(CudaParityTest, PromptLogitsMatchHfAtEveryPosition) {
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  for (size_t i = 0; i < m_.fx.prompts.size(); ++i) {
    const size_t len = m_.fx.prompts[i].ids.size();
    std::printf("[cuda-parity] %s prompt_len=%zu rel=%.3e\n", GetParam().c_str(), len,
                e->prompt_max_rel[i]);
    EXPECT_LE(e->prompt_max_rel[i], kTolerance) << "prompt of " << len << " tokens";
  }
  std::printf("[cuda-parity] %s worst rel diff %.3e\n", GetParam().c_str(), e->max_rel);
}

TEST_P(CudaParityTest, GreedyContinuationsMatchHfAloneAndBatched) {
  for (bool batched : {false, true}) {
    auto got = GreedyContinuations(m_, batched);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t s = 0; s < got->size(); ++s) {
      EXPECT_EQ((*got)[s], m_.fx.prompts[s].greedy)
          << (batched ? "batched, " : "alone, ") << "prompt " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

// Each prompt's worst relative logit error, one line each.
void PrintPromptErrors(const ParityModel& m, const FixtureLogitsError& e, const char* label,
                       const std::string& fixture) {
  for (size_t i = 0; i < m.fx.prompts.size(); ++i) {
    std::printf("[bf16-parity] %s %s prompt_len=%zu rel=%.3e\n", label, fixture.c_str(),
                m.fx.prompts[i].ids.size(), e.prompt_max_rel[i]);
  }
}

class CudaBf16ParityTest : public CudaParityTest {
 protected:
  explicit CudaBf16ParityTest(const std::string& kv_cache_dtype = "float32")
      : CudaParityTest(WeightDType::kBFloat16, kv_cache_dtype) {}
  const char* Label() const { return kv_cache_dtype_ == "float32" ? "cuda" : "cuda bf16-cache"; }
};

TEST_P(CudaBf16ParityTest, PromptLogitsWithinBf16ToleranceOfHfFloat32) {
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  PrintPromptErrors(m_, *e, Label(), GetParam());
  ExpectBf16LogitsWithinTolerance(*e, Label(), GetParam());
}

TEST_P(CudaBf16ParityTest, TeacherForcedGreedyMostlyMatchesHf) {
  auto r = AllPromptsTeacherForced(m_);
  ASSERT_TRUE(r.ok()) << r.status();
  PrintGreedyAgreement(*r, Label(), GetParam());
  EXPECT_GE(r->matches, kBf16GreedyAgreement * r->positions);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaBf16ParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

// bf16 weights with the bf16 latent cache (the default for bf16 weights).
class CudaBf16CacheParityTest : public CudaBf16ParityTest {
 protected:
  CudaBf16CacheParityTest() : CudaBf16ParityTest("auto") {}
};

TEST_P(CudaBf16CacheParityTest, CacheIsBf16) {
  EXPECT_EQ(m_.pool->spec().groups[0].dtype, WeightDType::kBFloat16);
}

// As the CPU test: the logit bound asserted, greedy agreement printed
// (docs/cuda/bf16-and-kv-cache.md).
TEST_P(CudaBf16CacheParityTest, PromptLogitsWithinBf16ToleranceOfHfFloat32) {
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  PrintPromptErrors(m_, *e, Label(), GetParam());
  ExpectBf16LogitsWithinTolerance(*e, Label(), GetParam());
  auto r = AllPromptsTeacherForced(m_);
  ASSERT_TRUE(r.ok()) << r.status();
  PrintGreedyAgreement(*r, Label(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaBf16CacheParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

// bf16 weights (fp32 cache) with the dense MLP layers at one decode token as the fused MoE
// block's kernels (CudaBackend::NormedDenseMlp; fp32 activations where the ops round to bf16):
// the teacher-forced greedy bound of CudaBf16ParityTest, and the op was taken.
class CudaBf16DenseMlpFusedParityTest : public CudaBf16ParityTest {};

TEST_P(CudaBf16DenseMlpFusedParityTest, TeacherForcedGreedyMostlyMatchesHf) {
  backend_->SetOpTiming(true);
  auto r = AllPromptsTeacherForced(m_);
  backend_->SetOpTiming(false);
  ASSERT_TRUE(r.ok()) << r.status();
  PrintGreedyAgreement(*r, "cuda dense-mlp-fused", GetParam());
  EXPECT_GE(r->matches, kBf16GreedyAgreement * r->positions);
  EXPECT_NE(backend_->TakeOpTimingReport().find("NormedDenseMlp"), std::string::npos)
      << "the fused dense MLP was not taken";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaBf16DenseMlpFusedParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

// The batch-invariant mode with fp32 weights: the fp32 bounds of CudaParityTest.
class CudaBatchInvariantParityTest : public CudaParityTest {
 protected:
  CudaBatchInvariantParityTest() : CudaParityTest(WeightDType::kFloat32, "auto", true) {}
};

TEST_P(CudaBatchInvariantParityTest, PromptLogitsMatchHfAtEveryPosition) {
  ASSERT_TRUE(backend_->tuning().batch_invariant);
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  std::printf("[cuda-parity] batch-invariant %s worst rel diff %.3e\n", GetParam().c_str(),
              e->max_rel);
  for (size_t i = 0; i < m_.fx.prompts.size(); ++i) {
    EXPECT_LE(e->prompt_max_rel[i], kTolerance)
        << "prompt of " << m_.fx.prompts[i].ids.size() << " tokens";
  }
}

TEST_P(CudaBatchInvariantParityTest, GreedyContinuationsMatchHfAloneAndBatched) {
  for (bool batched : {false, true}) {
    auto got = GreedyContinuations(m_, batched);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t s = 0; s < got->size(); ++s) {
      EXPECT_EQ((*got)[s], m_.fx.prompts[s].greedy)
          << (batched ? "batched, " : "alone, ") << "prompt " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaBatchInvariantParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

// The batch-invariant mode with bf16 weights and the bf16 cache: as CudaBf16CacheParityTest, the
// logit bound asserted and greedy agreement printed (with the bf16 cache, teacher-forced greedy on
// dsv3_qlora_rope was 89 of 96 in the default mode and 86 of 96 in this one on the H200, below
// the fp32-cache bound of 0.9; the logit errors of the two modes were equal to 3 digits).
class CudaBatchInvariantBf16ParityTest : public CudaParityTest {
 protected:
  CudaBatchInvariantBf16ParityTest() : CudaParityTest(WeightDType::kBFloat16, "auto", true) {}
};

TEST_P(CudaBatchInvariantBf16ParityTest, LogitsWithinBf16ToleranceOfHfFloat32) {
  ASSERT_TRUE(backend_->tuning().batch_invariant);
  auto e = AllPromptsLogitsError(m_);
  ASSERT_TRUE(e.ok()) << e.status();
  PrintPromptErrors(m_, *e, "cuda batch-invariant", GetParam());
  ExpectBf16LogitsWithinTolerance(*e, "cuda batch-invariant", GetParam());
  auto r = AllPromptsTeacherForced(m_);
  ASSERT_TRUE(r.ok()) << r.status();
  PrintGreedyAgreement(*r, "cuda batch-invariant", GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaBatchInvariantBf16ParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

// fp32 weights with the FP8 latent cache against the bf16 cache, as the CPU's
// fp8_cache_parity_test (the bounds of ExpectFp8CacheWithinBounds): the quantising cache write
// and attention over FP8 entries (the decode kernels reading them: the one-token kernel for one
// decode token of latent 512 + rope 64, dsv3_mla_dims, the tensor-core decode kernels otherwise;
// the other kernels through their bf16 copy) through the whole model, prefill and decode.
class CudaFp8CacheParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFp8CacheParityTest, LogitsAndGreedyNextToTheBf16Cache) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  auto b = CudaBackend::Create(0, WeightDType::kFloat32);
  ASSERT_TRUE(b.ok()) << b.status();
  const CacheDTypeRun bf16 = MeasureCacheDType(GetParam(), b->get(), "bfloat16", "cuda");
  const CacheDTypeRun fp8 = MeasureCacheDType(GetParam(), b->get(), "fp8", "cuda");
  ExpectFp8CacheWithinBounds(bf16, fp8);
  EXPECT_TRUE((*b)->status().ok()) << (*b)->status();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFp8CacheParityTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora", "dsv3_mla_dims"));

}  // namespace
}  // namespace deepinfer
