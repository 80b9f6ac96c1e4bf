// Speculative decoding of DeepSeek-V4 in the Engine (both V4 fixtures, HF-made, with a generated
// MTP module: HF saves none), against the engine without drafts on the fixture's own model:
// greedy requests give HF's greedy continuations and, greedy or sampled, the tokens and
// log-probabilities of the engine without drafts, bit for bit (the CPU backend is
// batch-invariant), for 1 to 3 drafts per step; with drafts forced right and wrong (accepted
// runs, rejections at every index, across the compress windows and the sliding window), with the
// prefix cache on (a request served from blocks a drafting sequence filled, by a bounded replay),
// and through chunked prefill and preemption (bounded rebuilds).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/engine.h"
#include "worker/engine/oracle_drafts.h"
#include "worker/model/deepseek_v4/v4_mtp_fixture.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAreArray;

constexpr int64_t kMaxDrafts = 3;

WorkItem Greedy(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  WorkItem item;
  item.set_request_id(id);
  item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  item.mutable_params()->set_max_tokens(max_tokens);
  item.mutable_params()->set_ignore_eos(true);
  item.mutable_params()->set_logprobs(2);
  return item;
}

WorkItem Sampled(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens,
                 uint64_t seed) {
  WorkItem item = Greedy(id, prompt, max_tokens);
  item.mutable_params()->set_temperature(0.9f);
  item.mutable_params()->set_top_p(0.95f);
  item.mutable_params()->set_seed(seed);
  return item;
}

std::vector<int32_t> Tokens(const RequestResult& r) {
  return std::vector<int32_t>(r.token_ids().begin(), r.token_ids().end());
}

// Tokens, finish reasons and log-probabilities (chosen and top) equal, bit for bit.
void ExpectSameResults(const std::map<std::string, RequestResult>& got,
                       const std::map<std::string, RequestResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, w] : want) {
    ASSERT_EQ(got.count(id), 1u) << id;
    const RequestResult& g = got.at(id);
    EXPECT_EQ(g.error_code(), "") << id << ": " << g.error_message();
    EXPECT_THAT(Tokens(g), ElementsAreArray(Tokens(w))) << id;
    EXPECT_EQ(g.finish_reason(), w.finish_reason()) << id;
    ASSERT_EQ(g.logprobs_size(), w.logprobs_size()) << id;
    for (int t = 0; t < g.logprobs_size(); ++t) {
      EXPECT_EQ(g.logprobs(t).logprob(), w.logprobs(t).logprob()) << id << " token " << t;
      ASSERT_EQ(g.logprobs(t).top_token_ids_size(), w.logprobs(t).top_token_ids_size());
      for (int k = 0; k < g.logprobs(t).top_token_ids_size(); ++k) {
        EXPECT_EQ(g.logprobs(t).top_token_ids(k), w.logprobs(t).top_token_ids(k)) << id;
        EXPECT_EQ(g.logprobs(t).top_logprobs(k), w.logprobs(t).top_logprobs(k)) << id;
      }
    }
  }
}

class V4SpeculativeEngineTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto f = OpenV4MtpFixture(GetParam(), kMaxDrafts);
    ASSERT_TRUE(f.ok()) << f.status();
    prompts_ = f->prompts;
    ASSERT_EQ(prompts_.size(), 3u);
    source_ = std::move(f->source);
    auto drafting = BuildModel(f->config, source_.get(), &backend_);
    ASSERT_TRUE(drafting.ok()) << drafting.status();
    drafting_ = std::move(*drafting);
    const char* src = std::getenv("TEST_SRCDIR");
    auto plain = LoadModel(absl::StrCat(src ? src : ".", "/deepinfer/tests/fixtures/", GetParam()),
                           &backend_);
    ASSERT_TRUE(plain.ok()) << plain.status();
    plain_ = std::move(*plain);
  }

  std::unique_ptr<Engine> MakeEngine(CausalLm* model, EngineOptions options,
                                     int32_t num_blocks = 96) {
    auto pool =
        KvBlockPool::Create(&backend_, KvBlockPoolOptions{model->CacheSpec(), num_blocks, 16});
    EXPECT_TRUE(pool.ok()) << pool.status();
    pools_.push_back(std::move(*pool));
    queues_.push_back(std::make_unique<RequestQueue>());
    options.eos_token_ids = {1};
    auto e = Engine::Create(model, pools_.back().get(), queues_.back().get(), nullptr, options);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  std::map<std::string, RequestResult> Run(Engine* engine, std::vector<WorkItem> items) {
    queues_.back()->Push(std::move(items));
    std::map<std::string, RequestResult> results;
    for (int steps = 0; engine->HasWork() && steps < 10000; ++steps) {
      auto r = engine->Step();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      for (RequestResult& res : *r) results[res.request_id()] = std::move(res);
    }
    EXPECT_FALSE(engine->HasWork()) << "engine does not finish";
    EXPECT_EQ(engine->load().kv_blocks_used, 0) << "blocks leaked";
    return results;
  }

  // The items on the fixture's model without drafts.
  std::map<std::string, RequestResult> Reference(const std::vector<WorkItem>& items,
                                                 EngineOptions options = {}) {
    auto engine = MakeEngine(plain_.get(), options);
    return Run(engine.get(), items);
  }

  static EngineOptions Speculative(int32_t k) {
    EngineOptions o;
    o.speculative_tokens = k;
    return o;
  }

  std::vector<WorkItem> MixedItems() const {
    std::vector<WorkItem> items;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      items.push_back(Greedy(absl::StrCat("g", i), prompts_[i].ids, 24));
      items.push_back(Sampled(absl::StrCat("s", i), prompts_[i].ids, 20, 40 + i));
    }
    return items;
  }

  CpuBackend backend_{2};
  std::unique_ptr<WeightSource> source_;
  std::unique_ptr<CausalLm> drafting_, plain_;
  std::vector<V4MtpFixture::Prompt> prompts_;
  std::vector<std::unique_ptr<KvBlockPool>> pools_;
  std::vector<std::unique_ptr<RequestQueue>> queues_;
};

TEST_P(V4SpeculativeEngineTest, MtpDraftsKeepTokensAndLogprobs) {
  const std::vector<WorkItem> items = MixedItems();
  const auto want = Reference(items);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_THAT(Tokens(want.at(absl::StrCat("g", i))), ElementsAreArray(prompts_[i].greedy)) << i;
  }
  for (int32_t k = 1; k <= kMaxDrafts; ++k) {
    auto engine = MakeEngine(drafting_.get(), Speculative(k));
    ExpectSameResults(Run(engine.get(), items), want);
    EXPECT_GT(engine->drafts_verified(), 0) << k;
  }
}

// Drafts right but at every 3rd or 5th position: accepted runs, rejections at each index of a
// run, the bonus token after a full run; with the prefix cache on, a second request whose prompt
// is the first's prompt and output is served from the blocks the drafting sequence filled.
TEST_P(V4SpeculativeEngineTest, OracleDraftsWithThePrefixCache) {
  EngineOptions cached;
  cached.prefix_cache.enabled = true;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    for (int wrong_every : {3, 5}) {
      SCOPED_TRACE(absl::StrCat("prompt ", i, ", wrong every ", wrong_every));
      const WorkItem first = Greedy("first", prompts_[i].ids, 40);
      const auto first_alone = Reference({first}, cached);
      std::vector<int32_t> longer = prompts_[i].ids;
      const auto out = Tokens(first_alone.at("first"));
      longer.insert(longer.end(), out.begin(), out.end());
      const WorkItem second = Sampled("second", longer, 24, 5);
      const auto second_alone = Reference({second}, cached);

      EngineOptions o = Speculative(kMaxDrafts);
      o.prefix_cache.enabled = true;
      OracleDrafts oracle(drafting_.get(), longer, wrong_every);
      auto engine = MakeEngine(&oracle, o);
      ExpectSameResults(Run(engine.get(), {first}), first_alone);
      EXPECT_GT(engine->drafts_accepted(), 0);
      EXPECT_LT(engine->drafts_accepted(), engine->drafts_verified());
      auto second_result = Run(engine.get(), {second});
      // A hit is taken where a bounded replay saves something (BoundedReplayStart(hit) > 0):
      // behind the long prompt (the shorter ones are within one replay's length).
      if (i == 2) {
        EXPECT_GT(second_result["second"].cached_prompt_tokens(), 0);
      }
      ExpectSameResults(second_result, second_alone);
    }
  }
}

// Small steps (chunked prefill) and a pool too small for every sequence: preempted sequences are
// rebuilt by a bounded replay and go on drafting.
TEST_P(V4SpeculativeEngineTest, ChunkedPrefillAndPreemptionKeepTokens) {
  const std::vector<WorkItem> items = MixedItems();
  const auto want = Reference(items);
  EngineOptions chunked = Speculative(kMaxDrafts);
  chunked.max_batch_tokens = 48;
  auto engine = MakeEngine(drafting_.get(), chunked);
  ExpectSameResults(Run(engine.get(), items), want);
  EXPECT_GT(engine->drafts_verified(), 0);

  EngineOptions tight = Speculative(kMaxDrafts);
  tight.max_batch_tokens = 64;
  auto tiny = MakeEngine(drafting_.get(), tight, /*num_blocks=*/26);
  ExpectSameResults(Run(tiny.get(), items), want);
  EXPECT_GT(tiny->preemptions(), 0);
  EXPECT_GT(tiny->drafts_verified(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4SpeculativeEngineTest,
                         ::testing::Values("dsv4_bf16", "dsv4_mix"));

}  // namespace
}  // namespace deepinfer
