// WarmUpSteps against the HF fixture dsv3_qlora_rope on the CPU backend: it runs its steps and
// gives back every block it took, and a job's tokens after it are those without it (greedy ones
// HF's), the blocks it wrote being reused by the job's sequences.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_fixture.h"
#include "worker/engine/rank_builder.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAreArray;

using engine_testing::Item;
using engine_testing::Sampled;
using engine_testing::Tokens;

class WarmUpTest : public engine_testing::FixtureModelTest {
 protected:
  std::unique_ptr<KvBlockPool> MakePool(int32_t num_blocks) {
    auto pool = KvBlockPool::Create(backend_, KvBlockPoolOptions{model_->CacheSpec(), num_blocks,
                                                                 /*block_size=*/16});
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? std::move(*pool) : nullptr;
  }

  // The job (every prompt greedy and sampled, all at once) on an engine over `pool`, stepped
  // until idle: each request's tokens.
  std::map<std::string, std::vector<int32_t>> RunJob(KvBlockPool* pool) {
    RequestQueue queue;
    EngineOptions options;
    options.eos_token_ids = {1};  // generation_config.json
    auto engine = Engine::Create(model_, pool, &queue, nullptr, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    std::vector<WorkItem> items;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      items.push_back(Item(absl::StrCat("greedy", i), prompts_[i].ids, 24));
      items.push_back(Sampled(absl::StrCat("sampled", i), prompts_[i].ids, 24, 7 + i));
    }
    queue.Push(std::move(items));
    std::map<std::string, std::vector<int32_t>> tokens;
    for (int steps = 0; (*engine)->HasWork() && steps < 10000; ++steps) {
      auto r = (*engine)->Step();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      for (RequestResult& res : *r) {
        EXPECT_EQ(res.error_code(), "") << res.request_id();
        tokens[res.request_id()] = Tokens(res);
      }
    }
    EXPECT_FALSE((*engine)->HasWork()) << "engine does not finish";
    return tokens;
  }
};

TEST_F(WarmUpTest, GivesBackItsBlocksAndLeavesTheJobsTokensAsTheyWere) {
  ASSERT_FALSE(prompts_.empty());
  auto cold = MakePool(256);
  ASSERT_NE(cold, nullptr);
  const std::map<std::string, std::vector<int32_t>> expected = RunJob(cold.get());
  ASSERT_EQ(expected.size(), 2 * prompts_.size());

  auto warm = MakePool(256);
  ASSERT_NE(warm, nullptr);
  const int32_t free_before = warm->num_free_blocks();
  auto result = WarmUpSteps(model_, warm.get(), /*max_batch_tokens=*/2048);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 2);
  // The fixture's 512 positions bound the prompt (511, then its next token and a chunk of 511).
  EXPECT_EQ(result->tokens, 511 + 1 + 511);
  EXPECT_EQ(warm->num_free_blocks(), free_before);
  const std::map<std::string, std::vector<int32_t>> got = RunJob(warm.get());
  EXPECT_EQ(got, expected);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const std::string id = absl::StrCat("greedy", i);
    ASSERT_EQ(got.count(id), 1u);
    EXPECT_THAT(got.at(id), ElementsAreArray(prompts_[i].greedy)) << id;
  }
}

TEST_F(WarmUpTest, RunsNothingWithoutRoomAndTakesNothing) {
  auto pool = MakePool(1);
  ASSERT_NE(pool, nullptr);
  auto taken = pool->Allocate(1);
  ASSERT_TRUE(taken.ok());
  auto result = WarmUpSteps(model_, pool.get(), 2048);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 0);
  EXPECT_EQ(pool->num_free_blocks(), 0);
}

TEST_F(WarmUpTest, SmallCacheBoundsThePrompt) {
  auto pool = MakePool(4);  // 64 positions
  ASSERT_NE(pool, nullptr);
  auto result = WarmUpSteps(model_, pool.get(), 2048);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 1);  // no block left for a second sequence
  EXPECT_EQ(result->tokens, 63);
  EXPECT_EQ(pool->num_free_blocks(), 4);
}

}  // namespace
}  // namespace deepinfer
