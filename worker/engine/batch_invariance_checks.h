// The checks of the batch-invariance tests (batch_invariance_gpu_test.cc on the CUDA backend's
// batch-invariant mode, batch_invariance_test.cc on the CPU backend), on the models a test's
// SetUpTestSuite makes (BatchInvarianceTest::plain_ and drafting_, the same weights, the second
// with an MTP draft head):
//  * CheckAloneAndAmong255: a greedy request with top logprobs and a seeded sampled one, alone
//    and among 255 other random requests (prompts of 1 to max_prompt tokens, greedy and sampled,
//    of 1 to max_new new tokens: prefill is chunked and mixed with decode rows, the batch
//    shrinks as they finish) at two positions in the batch: the same tokens and bit-identical
//    logprobs and top logprobs, from the first token (prefill) to the last decode step;
//  * CheckMtpGreedy: MTP speculative decoding (3 tokens, the model's own draft head; and an
//    oracle that drafts the plain continuation except at every 5th position, so verify rows past
//    the first are accepted and rejected) gives plain decoding's greedy tokens bit for bit:
//    verify rows round as one-token decode rows.
#ifndef DEEPINFER_WORKER_ENGINE_BATCH_INVARIANCE_CHECKS_H_
#define DEEPINFER_WORKER_ENGINE_BATCH_INVARIANCE_CHECKS_H_

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/engine/oracle_drafts.h"
#include "worker/model/causal_lm.h"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace testing {

using ::testing::ElementsAreArray;

using ::deepinfer::OracleDrafts;  // worker/engine/oracle_drafts.h

inline WorkItem Item(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens,
                     int32_t logprobs = -1) {
  WorkItem item;
  item.set_request_id(id);
  item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  item.mutable_params()->set_max_tokens(max_tokens);
  item.mutable_params()->set_logprobs(logprobs);
  item.mutable_params()->set_seed(1234);
  return item;
}

inline WorkItem Sampled(const std::string& id, const std::vector<int32_t>& prompt,
                        int32_t max_tokens, uint64_t seed) {
  WorkItem item = Item(id, prompt, max_tokens, /*logprobs=*/4);
  item.mutable_params()->set_temperature(0.9f);
  item.mutable_params()->set_top_p(0.95f);
  item.mutable_params()->set_top_k(40);
  item.mutable_params()->set_seed(seed);
  return item;
}

inline std::vector<int32_t> RandomPrompt(std::mt19937* rng, int32_t length, int32_t vocab) {
  std::uniform_int_distribution<int32_t> token(2, vocab - 1);
  std::vector<int32_t> out(length);
  for (int32_t& t : out) t = token(*rng);
  return out;
}

inline std::vector<int32_t> Tokens(const RequestResult& r) {
  return std::vector<int32_t>(r.token_ids().begin(), r.token_ids().end());
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Same tokens, and every logprob and top logprob with the same bits.
inline void ExpectSameBits(const RequestResult& got, const RequestResult& want,
                           const std::string& what) {
  EXPECT_EQ(got.error_code(), "") << what << ": " << got.error_message();
  EXPECT_THAT(Tokens(got), ElementsAreArray(Tokens(want))) << what;
  ASSERT_EQ(got.logprobs_size(), want.logprobs_size()) << what;
  ASSERT_GT(want.logprobs_size(), 0) << what;
  for (int t = 0; t < got.logprobs_size(); ++t) {
    const TokenLogprob& g = got.logprobs(t);
    const TokenLogprob& w = want.logprobs(t);
    EXPECT_EQ(g.token_id(), w.token_id()) << what << " token " << t;
    EXPECT_EQ(Bits(g.logprob()), Bits(w.logprob()))
        << what << " token " << t << ": " << g.logprob() << " vs " << w.logprob();
    ASSERT_EQ(g.top_token_ids_size(), w.top_token_ids_size()) << what << " token " << t;
    ASSERT_EQ(g.top_logprobs_size(), w.top_logprobs_size()) << what << " token " << t;
    for (int k = 0; k < g.top_token_ids_size(); ++k) {
      EXPECT_EQ(g.top_token_ids(k), w.top_token_ids(k)) << what << " token " << t << " top " << k;
      EXPECT_EQ(Bits(g.top_logprobs(k)), Bits(w.top_logprobs(k)))
          << what << " token " << t << " top " << k;
    }
  }
}

class BatchInvarianceTest : public ::testing::Test {
 protected:
  // Made by the test file's SetUpTestSuite (null: the suite skips).
  static void TearDownTestSuite() {
    delete drafting_;
    delete plain_;
    delete weights_;
    delete backend_;
    drafting_ = plain_ = nullptr;
    weights_ = nullptr;
    backend_ = nullptr;
  }
  // The models of `config_json` on backend_ with dummy weights (seed 5): plain_ without, drafting_
  // with the MTP draft head.
  static void BuildModels(const std::string& config_json) {
    auto config = ModelConfig::FromJson(config_json, "batch_invariance_config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    weights_ = new DummyWeightSource(5);
    auto plain = BuildModel(*config, weights_, backend_);
    ASSERT_TRUE(plain.ok()) << plain.status();
    plain_ = plain->release();
    config->num_draft_layers = 1;
    auto drafting = BuildModel(*config, weights_, backend_);
    ASSERT_TRUE(drafting.ok()) << drafting.status();
    drafting_ = drafting->release();
  }

  // Runs `items` to the end on a fresh engine and cache; results by request id.
  std::map<std::string, RequestResult> Run(CausalLm* model, const std::vector<WorkItem>& items,
                                           EngineOptions options = {}) {
    absl::StatusOr<KvCacheSpec> spec = model->CacheSpec();
    if (cache_dtype_.has_value()) spec = spec->WithDType(*cache_dtype_);
    EXPECT_TRUE(spec.ok()) << spec.status();
    if (!spec.ok()) return {};
    auto pool = KvBlockPool::Create(backend_, KvBlockPoolOptions{*spec, 4800, 16});
    EXPECT_TRUE(pool.ok()) << pool.status();
    if (!pool.ok()) return {};
    auto queue = std::make_unique<RequestQueue>();
    auto engine = Engine::Create(model, pool->get(), queue.get(), nullptr, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    queue->Push(items);
    std::map<std::string, RequestResult> results;
    for (int steps = 0; (*engine)->HasWork() && steps < 100000; ++steps) {
      auto r = (*engine)->Step();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      for (RequestResult& res : *r) results[res.request_id()] = std::move(res);
    }
    EXPECT_FALSE((*engine)->HasWork()) << "engine does not finish";
    EXPECT_TRUE(backend_->status().ok()) << backend_->status();
    drafts_verified_ = (*engine)->drafts_verified();
    drafts_accepted_ = (*engine)->drafts_accepted();
    old_.push_back({std::move(*pool), std::move(queue), std::move(*engine)});
    return results;
  }

  struct Kept {
    std::unique_ptr<KvBlockPool> pool;
    std::unique_ptr<RequestQueue> queue;
    std::unique_ptr<Engine> engine;
  };
  std::vector<Kept> old_;
  int64_t drafts_verified_ = 0, drafts_accepted_ = 0;
  // The cache entries' type (KvCacheSpec::WithDType, as --kv-cache-dtype); unset: the model's.
  std::optional<WeightDType> cache_dtype_;

  void CheckAloneAndAmong255(int32_t vocab, int32_t max_prompt, int32_t max_new) {
    std::mt19937 rng(11);
    const WorkItem greedy = Item("greedy", RandomPrompt(&rng, 45, vocab), 12, /*logprobs=*/5);
    const WorkItem sampled =
        Sampled("sampled", RandomPrompt(&rng, max_prompt * 3 / 4, vocab), 12, /*seed=*/77);
    const std::map<std::string, RequestResult> alone_greedy = Run(plain_, {greedy});
    const std::map<std::string, RequestResult> alone_sampled = Run(plain_, {sampled});
    ASSERT_EQ(alone_greedy.count("greedy"), 1u);
    ASSERT_EQ(alone_sampled.count("sampled"), 1u);
    EXPECT_EQ(alone_greedy.at("greedy").token_ids_size(), 12);

    // Two batches of 256: the two requests at other positions among other random requests.
    for (const auto& [greedy_at, sampled_at] : {std::pair<int, int>{0, 255}, {137, 64}}) {
      std::vector<WorkItem> batch;
      std::uniform_int_distribution<int32_t> length(1, max_prompt), new_tokens(1, max_new);
      for (int i = 0; i < 256; ++i) {
        if (i == greedy_at) {
          batch.push_back(greedy);
        } else if (i == sampled_at) {
          batch.push_back(sampled);
        } else {
          const std::string id = absl::StrCat("other", i);
          const std::vector<int32_t> prompt = RandomPrompt(&rng, length(rng), vocab);
          batch.push_back(i % 2 == 0 ? Item(id, prompt, new_tokens(rng), i % 4 == 0 ? 3 : -1)
                                     : Sampled(id, prompt, new_tokens(rng), 1000 + i));
        }
      }
      const std::map<std::string, RequestResult> together = Run(plain_, batch);
      ASSERT_EQ(together.size(), 256u);
      const std::string where =
          absl::StrCat(" (greedy at ", greedy_at, ", sampled at ", sampled_at, " of 256)");
      ExpectSameBits(together.at("greedy"), alone_greedy.at("greedy"), "greedy" + where);
      ExpectSameBits(together.at("sampled"), alone_sampled.at("sampled"), "sampled" + where);
    }
  }

  void CheckMtpGreedy(int32_t vocab) {
    std::mt19937 rng(23);
    std::vector<WorkItem> items;
    for (int32_t length : {5, 17, 33, 64, 100, 150}) {
      items.push_back(Item(absl::StrCat("p", length), RandomPrompt(&rng, length, vocab), 24));
    }
    const std::map<std::string, RequestResult> plain = Run(plain_, items);
    ASSERT_EQ(plain.size(), items.size());
    EngineOptions speculative;
    speculative.speculative_tokens = 3;
    const std::map<std::string, RequestResult> drafted = Run(drafting_, items, speculative);
    ASSERT_EQ(drafted.size(), items.size());
    EXPECT_GT(drafts_verified_, 0);
    std::printf("[batch-invariance] MTP drafts: %lld of %lld accepted\n",
                static_cast<long long>(drafts_accepted_), static_cast<long long>(drafts_verified_));
    for (const WorkItem& item : items) {
      const std::string& id = item.request_id();
      EXPECT_THAT(Tokens(drafted.at(id)), ElementsAreArray(Tokens(plain.at(id)))) << id;
    }
    // Drafts that are right except at every 5th position: accepted runs, rejections inside a run,
    // the bonus token after a fully accepted one.
    for (size_t i : {size_t{1}, size_t{4}}) {
      const WorkItem& item = items[i];
      std::vector<int32_t> continuation(item.prompt_token_ids().begin(),
                                        item.prompt_token_ids().end());
      const std::vector<int32_t> out = Tokens(plain.at(item.request_id()));
      continuation.insert(continuation.end(), out.begin(), out.end());
      OracleDrafts oracle(drafting_, continuation, /*wrong_every=*/5);
      const std::map<std::string, RequestResult> got = Run(&oracle, {item}, speculative);
      ASSERT_EQ(got.count(item.request_id()), 1u);
      EXPECT_GT(drafts_accepted_, 0) << item.request_id();
      EXPECT_LT(drafts_accepted_, drafts_verified_) << item.request_id();
      EXPECT_THAT(Tokens(got.at(item.request_id())), ElementsAreArray(out)) << item.request_id();
    }
  }

  inline static Backend* backend_ = nullptr;
  inline static DummyWeightSource* weights_ = nullptr;
  inline static CausalLm* plain_ = nullptr;
  inline static CausalLm* drafting_ = nullptr;
};

}  // namespace testing
}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_BATCH_INVARIANCE_CHECKS_H_
