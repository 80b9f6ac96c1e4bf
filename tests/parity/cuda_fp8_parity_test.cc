// Parity of the model served in the checkpoint's stored precision on the CUDA backend (the
// worker's --dtype auto): dsv3_yarn_nolora stores its attention projections, dense MLPs and
// shared experts as FP8 e4m3 with 128 x 128 block scales (routed experts, embedding and lm_head
// bf16), and those matrices stay FP8 on the GPU (kernels/gemm/fp8_block_gemm.h). HF's float32
// model dequantises the same FP8 values, so the reference is exact for the weights; the error
// is the bf16 rounding of activations (and of the bf16 matrices), bounded as for the bf16 CUDA
// test (parity_checks.h: kBf16Tolerance, kBf16GreedyAgreement). So the FP8 GEMMs with bf16
// activations are what runs here (CudaTuning::fp8_w8a8_min_rows past the prompts: the W8A8 path
// quantises activations to e4m3, 2^-4 relative, which these bf16 bounds do not cover; it is
// checked GEMM by GEMM in cuda_backend_fp8_test and cublaslt_fp8_gemm_test). Both caches: fp32
// and bf16. Skips without a GPU.
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "tests/parity/parity_checks.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/model/model_weights.h"

namespace deepinfer {
namespace {

class CudaFp8ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    CudaTuning tuning;
    tuning.fp8_w8a8_min_rows = std::numeric_limits<int64_t>::max();
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
    // What --dtype auto sets (rank_builder: the checkpoint's StoresFp8); a matrix the checkpoint
    // stores otherwise gets nothing from ReadFp8 and is loaded as bf16.
    LoadOptions load;
    load.keep_fp8 = [](const std::string&) { return true; };
    auto m = LoadParityModel("dsv3_yarn_nolora", backend_.get(), GetParam(), load);
    ASSERT_TRUE(m.ok()) << m.status();
    m_ = std::move(*m);
  }
  std::string Label() const { return "cuda fp8 " + GetParam() + "-cache"; }

  std::unique_ptr<CudaBackend> backend_;  // declared first: destroyed after the model and cache
  ParityModel m_;
};

TEST_P(CudaFp8ParityTest, PromptLogitsWithinBf16ToleranceOfHfFloat32) {
  backend_->SetOpTiming(true);
  auto e = AllPromptsLogitsError(m_);
  backend_->SetOpTiming(false);
  ASSERT_TRUE(e.ok()) << e.status();
  for (size_t i = 0; i < m_.fx.prompts.size(); ++i) {
    std::printf("[fp8-parity] %s prompt_len=%zu rel=%.3e\n", Label().c_str(),
                m_.fx.prompts[i].ids.size(), e->prompt_max_rel[i]);
  }
  ExpectBf16LogitsWithinTolerance(*e, Label(), "dsv3_yarn_nolora");
  const std::string report = backend_->TakeOpTimingReport();
  std::printf("%s", report.c_str());
  // Prompts of 7, 33 and 130 tokens: the tensor-core FP8 kernel took them.
  EXPECT_NE(report.find("Gemm/fp8-mma"), std::string::npos) << "FP8 tensor-core GEMM not taken";
}

TEST_P(CudaFp8ParityTest, TeacherForcedGreedyMostlyMatchesHf) {
  auto r = AllPromptsTeacherForced(m_);
  ASSERT_TRUE(r.ok()) << r.status();
  PrintGreedyAgreement(*r, Label(), "dsv3_yarn_nolora");
  EXPECT_GE(r->matches, kBf16GreedyAgreement * r->positions);
}

// Greedy decoding through the paged cache (prefill, then one token per step: the decode-size
// FP8 kernels), alone and batched, printed against HF's continuation: bf16 activations may flip
// near-ties (greedy_min_margin in the fixture is ~0.01), as in the bf16-cache CUDA test.
TEST_P(CudaFp8ParityTest, GreedyContinuationsPrinted) {
  for (bool batched : {false, true}) {
    auto got = GreedyContinuations(m_, batched);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t s = 0; s < got->size(); ++s) {
      const auto& want = m_.fx.prompts[s].greedy;
      size_t same = 0;
      while (same < want.size() && same < (*got)[s].size() && (*got)[s][same] == want[same]) {
        ++same;
      }
      std::printf("[fp8-parity] %s %s prompt %zu: first %zu of %zu greedy tokens as HF\n",
                  Label().c_str(), batched ? "batched" : "alone", s, same, want.size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Caches, CudaFp8ParityTest, ::testing::Values("float32", "bfloat16"));

}  // namespace
}  // namespace deepinfer
