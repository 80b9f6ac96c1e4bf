// The mixed-step case on the CPU backend with the small HF fixture: the prompt tokens' chunk
// layout and its blocks against hand-worked numbers, --mixed-steps parsing and its errors, and
// a measurement that runs its steps, advances the decode rows, reports positive times and gives
// back every block its prompts took.
#include "tools/bench/mixed_step.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

TEST(MixedPromptChunksTest, ContinuesHalfAPromptThenFreshOnesAndCutsTheLast) {
  // 1000 tokens over prompts of 512: 256 finishing the continued prompt, one whole prompt of
  // 512, then 232 of the next one.
  const std::vector<PromptChunk> c = MixedPromptChunks(1000, 512);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].offset, 256);
  EXPECT_EQ(c[0].tokens, 256);
  EXPECT_TRUE(c[0].completes);
  EXPECT_EQ(c[1].offset, 0);
  EXPECT_EQ(c[1].tokens, 512);
  EXPECT_TRUE(c[1].completes);
  EXPECT_EQ(c[2].offset, 0);
  EXPECT_EQ(c[2].tokens, 232);
  EXPECT_FALSE(c[2].completes);
  // Fewer tokens than the continued prompt's rest: one cut chunk at its offset.
  const std::vector<PromptChunk> one = MixedPromptChunks(100, 512);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].offset, 256);
  EXPECT_EQ(one[0].tokens, 100);
  EXPECT_FALSE(one[0].completes);
  // Prompts of one token: nothing to continue, every token its own prompt.
  const std::vector<PromptChunk> ones = MixedPromptChunks(3, 1);
  ASSERT_EQ(ones.size(), 3u);
  for (const PromptChunk& k : ones) {
    EXPECT_EQ(k.offset, 0);
    EXPECT_EQ(k.tokens, 1);
    EXPECT_TRUE(k.completes);
  }
  // Blocks of 16 positions: 512 / 16 = 32 for each of the first two, ceil(232 / 16) = 15.
  EXPECT_EQ(MixedPromptBlocks(1000, 512, 16), 32 + 32 + 15);
}

TEST(ParseMixedStepsTest, ReadsPairsAndNamesTheBadPart) {
  auto ok = ParseMixedSteps("64:512,256:2048");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].decode_rows, 64);
  EXPECT_EQ((*ok)[0].prompt_tokens, 512);
  EXPECT_EQ((*ok)[1].decode_rows, 256);
  EXPECT_EQ((*ok)[1].prompt_tokens, 2048);
  auto none = ParseMixedSteps("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  for (const char* bad :
       {"64", "64:512,128", "a:512", "64:", "0:512", "64:0", "-1:5", "64:512:1", "64:512,"}) {
    auto r = ParseMixedSteps(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--mixed-steps takes D:P"), std::string::npos)
        << r.status();
  }
  auto r = ParseMixedSteps("64:512,128");
  EXPECT_NE(r.status().message().find("'128' is not D:P"), std::string::npos) << r.status();
}

class MixedStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = std::make_unique<CpuBackend>(2);
    auto m = LoadModel(FixtureDir(), backend_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto pool = KvBlockPool::Create(backend_.get(),
                                    KvBlockPoolOptions{model_->CacheSpec(), 64, /*block_size=*/16});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }

  // `n` sequences with `context` prompt tokens cached (one prefill step), each with the greedy
  // token it sampled as its one token: ready to decode.
  std::vector<SequenceStep> DecodeRows(int64_t n, int64_t context) {
    std::vector<SequenceStep> seqs(n);
    for (SequenceStep& s : seqs) {
      s.tokens.resize(context);
      for (int32_t& t : s.tokens) t = tok_(gen_);
      auto b = pool_->Allocate(4);
      EXPECT_TRUE(b.ok()) << b.status();
      if (b.ok()) s.block_table = *b;
      s.sampling = SamplingParams{};
      s.return_logits = false;
    }
    auto out = model_->Step(seqs, pool_.get());
    EXPECT_TRUE(out.ok()) << out.status();
    for (size_t i = 0; out.ok() && i < seqs.size(); ++i) {
      seqs[i].position_offset = context;
      seqs[i].tokens = {out->sampled[i].token};
    }
    return seqs;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<KvBlockPool> pool_;
  std::mt19937 gen_{5};
  std::uniform_int_distribution<int32_t> tok_{2, 999};
};

TEST_F(MixedStepTest, RunsItsStepsAndReportsPositiveTimes) {
  std::vector<SequenceStep> decode = DecodeRows(3, 20);
  ASSERT_EQ(decode.size(), 3u);
  const int32_t free_before = pool_->num_free_blocks();
  MixedStepOptions o;
  o.prompt_length = 24;
  o.timed_steps = 2;
  o.prompt_sampling.temperature = 0.8f;
  int before_calls = 0;
  // 40 prompt tokens over prompts of 24: 12 finishing the continued one, 24, then 4 (cut).
  auto t = MeasureMixedStep(
      model_.get(), pool_.get(), MixedStepShape{3, 40}, o, [&] { return tok_(gen_); },
      [&] {
        ++before_calls;
        return absl::OkStatus();
      },
      &decode);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->prompts, 3);
  EXPECT_EQ(t->sampled_rows, 3 + 2);
  ASSERT_EQ(t->step_seconds.size(), 2u);
  for (double s : t->step_seconds) EXPECT_TRUE(std::isfinite(s) && s > 0) << s;
  // Three steps (one untimed), each after the continued prompt's own untimed first part.
  EXPECT_EQ(before_calls, 6);
  for (const SequenceStep& s : decode) {
    EXPECT_EQ(s.position_offset, 20 + 3);
    ASSERT_EQ(s.tokens.size(), 1u);
    EXPECT_GE(s.tokens[0], 0);
    EXPECT_LT(s.tokens[0], 1000);
  }
  EXPECT_EQ(pool_->num_free_blocks(), free_before);

  MixedStepResult r;
  r.shape = {3, 40};
  r.context = 20;
  r.prompt_length = 24;
  r.prompts = t->prompts;
  r.sampled_rows = t->sampled_rows;
  r.timed_steps = 2;
  r.p50_seconds = 0.5;
  r.p99_seconds = 0.75;
  r.tokens_per_s = 86;
  EXPECT_EQ(FormatMixedStepJson({r}),
            "{\"decode_rows\": 3, \"prompt_tokens\": 40, \"context\": 20, \"prompt_length\": 24, "
            "\"prompts\": 3, \"sampled_rows\": 5, \"timed_steps\": 2, \"p50_s\": 0.500000, "
            "\"p99_s\": 0.750000, \"tokens_per_s\": 86.000}");
  EXPECT_NE(
      FormatMixedStepReport({r}).find("mixed: 3 decode rows at context 20 + 40 prompt tokens"),
      std::string::npos)
      << FormatMixedStepReport({r});
}

TEST_F(MixedStepTest, RefusesAShapeThatIsNotItsDecodeRows) {
  std::vector<SequenceStep> decode = DecodeRows(2, 8);
  MixedStepOptions o;
  o.prompt_length = 16;
  auto t = MeasureMixedStep(
      model_.get(), pool_.get(), MixedStepShape{3, 16}, o, [] { return 5; },
      [] { return absl::OkStatus(); }, &decode);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
