// DeepSeek-V4's verification steps and MTP drafts on the CUDA backend (fp32 weights) against
// plain decoding on the same backend, by RunV4Drafting (v4_drafting_run.h; the CPU test,
// v4_speculative_test.cc, compares bit for bit). The GPU's kernels are not batch-invariant (a
// verification's rows may round differently from one-row decode steps), so rows are compared
// within kTolerance of the plain row's largest logit (the bound cuda_v4_parity_test holds chunked
// prefill and decode to) and the module's round-1 streams within the same relative bound. The
// batch-invariant mode (CudaTuning::batch_invariant) is run too, its rows that differ from plain
// decoding's bits printed (V4's indexer, compression and hyper-connection kernels are not checked
// in that mode, so bit equality is not asserted). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/model/deepseek_v4/v4_drafting_run.h"
#include "worker/model/deepseek_v4/v4_mtp_fixture.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

constexpr int64_t kGenerated = 40;
constexpr double kTolerance = 1e-3;

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0, scale = 0;
  for (size_t v = 0; v < got.size(); ++v) {
    err = std::max(err, std::abs(static_cast<double>(got[v]) - want[v]));
    scale = std::max(scale, std::abs(static_cast<double>(want[v])));
  }
  return scale > 0 ? err / scale : err;
}

class V4SpeculativeGpuTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    auto b = CudaBackend::Create(0, WeightDType::kFloat32);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }

  // The worst relative error of the logits rows and of the round-1 streams of a run with drafts
  // against plain decoding, on a model with `spare` spare ring rows.
  std::pair<double, double> Worst(int64_t spare) { return Worst(backend_.get(), spare); }
  std::pair<double, double> Worst(CudaBackend* backend, int64_t spare) {
    auto f = OpenV4MtpFixture(GetParam(), spare);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return {INFINITY, INFINITY};
    std::vector<std::vector<int32_t>> prompts;
    for (const V4MtpFixture::Prompt& p : f->prompts) prompts.push_back(p.ids);
    auto model = BuildModel(f->config, f->source.get(), backend);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {INFINITY, INFINITY};
    std::vector<std::vector<int32_t>> continuation;
    auto plain = RunV4Drafting(model->get(), backend, prompts, kGenerated, false, &continuation);
    EXPECT_TRUE(plain.ok()) << plain.status();
    auto drafted = RunV4Drafting(model->get(), backend, prompts, kGenerated, true, &continuation);
    EXPECT_TRUE(drafted.ok()) << drafted.status();
    if (!plain.ok() || !drafted.ok()) return {INFINITY, INFINITY};
    double logits = 0, streams = 0;
    int draft_tokens_differ = 0, drafts = 0, rows_differ = 0, rows = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      for (const auto& [p, row] : drafted->logits[i]) {
        const std::vector<float>& want = plain->logits[i].at(p);
        logits = std::max(logits, RelativeError(row, want));
        rows_differ += row != want;
        ++rows;
      }
      for (const auto& [p, d] : drafted->drafts[i]) {
        const V4Drafted& w = plain->drafts[i].at(p);
        streams = std::max(streams, RelativeError(d.hidden, w.hidden));
        draft_tokens_differ += d.token != w.token;
        ++drafts;
      }
    }
    std::printf(
        "[v4-speculative-gpu] %s%s spare rows %lld: logits %.3e (%d of %d rows not bit-equal), "
        "streams %.3e, %d of %d round-1 draft tokens differ\n",
        GetParam(), backend == backend_.get() ? "" : " batch-invariant",
        static_cast<long long>(spare), logits, rows_differ, rows, streams, draft_tokens_differ,
        drafts);
    return {logits, streams};
  }

  std::unique_ptr<CudaBackend> backend_;
};

TEST_P(V4SpeculativeGpuTest, RejectedDraftsLeaveNoTrace) {
  const auto [logits, streams] = Worst(/*spare=*/3);
  EXPECT_LE(logits, kTolerance);
  EXPECT_LE(streams, kTolerance);
}

TEST_P(V4SpeculativeGpuTest, WithoutSpareRowsRejectedDraftsLeaveTraces) {
  EXPECT_GT(Worst(/*spare=*/0).first, kTolerance);
}

TEST_P(V4SpeculativeGpuTest, BatchInvariantMode) {
  CudaTuning tuning;
  tuning.batch_invariant = true;
  auto b = CudaBackend::Create(0, WeightDType::kFloat32, tuning);
  ASSERT_TRUE(b.ok()) << b.status();
  const auto [logits, streams] = Worst(b->get(), /*spare=*/3);
  EXPECT_LE(logits, kTolerance);
  EXPECT_LE(streams, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4SpeculativeGpuTest,
                         ::testing::Values("dsv4_bf16", "dsv4_mix"));

}  // namespace
}  // namespace deepinfer
