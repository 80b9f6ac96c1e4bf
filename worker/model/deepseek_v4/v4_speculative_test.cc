// DeepSeek-V4's verification steps and MTP drafts against plain decoding on the CPU backend
// (batch-invariant: a row's values do not depend on what else its step computes), for both V4
// fixtures with a generated MTP module, by RunV4Drafting (v4_drafting_run.h): every prompt in one
// batch, steps of 1 + k rows (k = 1, 2, 3) with one draft forced wrong at a rotating index, the
// module's recursive rounds before each verification.
//
// With spare ring rows for 3 drafts (ModelConfig::speculative_tokens), every verified row whose
// inputs were accepted has the plain run's logits bit for bit, and every round-1 draft of the MTP
// module (token, probability, residual streams) the plain run's: the rejected rows left no trace
// in the window rings, compressor rows, compressed entries or indexer keys. Without spare rows the
// same schedule changes accepted rows (what the test would see if a trace were left).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/deepseek_v4/v4_drafting_run.h"
#include "worker/model/deepseek_v4/v4_mtp_fixture.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

constexpr int64_t kGenerated = 40;  // tokens each sequence generates with drafts

struct Differences {
  int differ = 0, compared = 0;
  double worst = 0;  // max |got - want| / max |want| over the logits rows
};

Differences Compare(const V4DraftingRun& got, const V4DraftingRun& want) {
  Differences d;
  for (size_t i = 0; i < got.logits.size(); ++i) {
    for (const auto& [p, row] : got.logits[i]) {
      const std::vector<float>& w = want.logits[i].at(p);
      ++d.compared;
      if (row.size() != w.size() ||
          std::memcmp(row.data(), w.data(), row.size() * sizeof(float)) != 0) {
        ++d.differ;
      }
      double err = 0, scale = 0;
      for (size_t v = 0; v < row.size() && v < w.size(); ++v) {
        err = std::max(err, std::abs(static_cast<double>(row[v]) - w[v]));
        scale = std::max(scale, std::abs(static_cast<double>(w[v])));
      }
      d.worst = std::max(d.worst, scale > 0 ? err / scale : err);
    }
    for (const auto& [p, x] : got.drafts[i]) {
      const V4Drafted& w = want.drafts[i].at(p);
      ++d.compared;
      if (x.token != w.token || x.probability != w.probability ||
          x.hidden.size() != w.hidden.size() ||
          std::memcmp(x.hidden.data(), w.hidden.data(), x.hidden.size() * sizeof(float)) != 0) {
        ++d.differ;
      }
    }
  }
  return d;
}

class V4SpeculativeTest : public ::testing::TestWithParam<const char*> {
 protected:
  // The fixture's model with a generated MTP module and `spare` spare ring rows.
  std::unique_ptr<CausalLm> Model(int64_t spare) {
    auto f = OpenV4MtpFixture(GetParam(), spare);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return nullptr;
    prompts_.clear();
    greedy_.clear();
    for (const V4MtpFixture::Prompt& p : f->prompts) {
      prompts_.push_back(p.ids);
      greedy_.push_back(p.greedy);
    }
    auto model = BuildModel(f->config, f->source.get(), &backend_);
    EXPECT_TRUE(model.ok()) << model.status();
    sources_.push_back(std::move(f->source));
    return model.ok() ? std::move(*model) : nullptr;
  }

  // The plain run, then the run with drafts; their differences.
  Differences PlainThenDrafted(CausalLm* model) {
    std::vector<std::vector<int32_t>> continuation;
    auto plain = RunV4Drafting(model, &backend_, prompts_, kGenerated, false, &continuation);
    EXPECT_TRUE(plain.ok()) << plain.status();
    if (!plain.ok()) return {};
    for (size_t i = 0; i < prompts_.size(); ++i) {
      // The plain run is the model's greedy continuation: HF's.
      const auto from = continuation[i].begin() + prompts_[i].size();
      EXPECT_EQ(std::vector<int32_t>(from, from + 24), greedy_[i]) << "prompt " << i;
    }
    auto drafted = RunV4Drafting(model, &backend_, prompts_, kGenerated, true, &continuation);
    EXPECT_TRUE(drafted.ok()) << drafted.status();
    if (!drafted.ok()) return {};
    return Compare(*drafted, *plain);
  }

  CpuBackend backend_{2};
  std::vector<std::unique_ptr<WeightSource>> sources_;
  std::vector<std::vector<int32_t>> prompts_, greedy_;
};

TEST_P(V4SpeculativeTest, RejectedDraftsLeaveNoTrace) {
  auto model = Model(/*spare=*/3);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(prompts_.size(), 3u);
  const Differences d = PlainThenDrafted(model.get());
  EXPECT_EQ(d.differ, 0) << "of " << d.compared;
  EXPECT_GT(d.compared, 3 * kGenerated);
}

TEST_P(V4SpeculativeTest, WithoutSpareRowsRejectedDraftsLeaveTraces) {
  auto model = Model(/*spare=*/0);
  ASSERT_NE(model, nullptr);
  const Differences d = PlainThenDrafted(model.get());
  std::printf("[v4-speculative] %s without spare rows: %d of %d differ, worst logits %.3e\n",
              GetParam(), d.differ, d.compared, d.worst);
  EXPECT_GT(d.differ, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4SpeculativeTest, ::testing::Values("dsv4_bf16", "dsv4_mix"));

}  // namespace
}  // namespace deepinfer
