// Speculative decoding on the CUDA backend, against the same engine without drafts on the same
// backend: the dsv3_qlora_rope fixture's model with a generated MTP module drafts, and every
// verified row's token is picked on the device (SequenceStep::row_sampling). Greedy requests and
// seeded sampled ones (with logprobs, penalties, a logit bias and min_tokens) give the tokens,
// finish reasons and log-probabilities of plain decoding, in two modes:
//  * fp32 weights, the default kernels (the fixture's fp32 routed experts have no device path,
//    so steps run eagerly);
//  * bf16 weights in the batch-invariant mode (a verify row rounds as a decode row), where
//    greedy steps, verify steps among them, replay decode graphs.
// Skips without a GPU.
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "nlohmann/json.hpp"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/engine/engine.h"
#include "worker/engine/generated_mtp_source.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAreArray;

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

std::vector<std::vector<int32_t>> LoadPrompts() {
  std::ifstream in(FixtureDir() + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<std::vector<int32_t>> out;
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("prompts")) return out;
  for (const auto& p : j["prompts"]) out.push_back(p["ids"].get<std::vector<int32_t>>());
  return out;
}

WorkItem Item(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens,
              int32_t logprobs) {
  WorkItem item;
  item.set_request_id(id);
  item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  item.mutable_params()->set_max_tokens(max_tokens);
  item.mutable_params()->set_logprobs(logprobs);
  item.mutable_params()->set_seed(1234);
  return item;
}

WorkItem Sampled(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens,
                 uint64_t seed) {
  WorkItem item = Item(id, prompt, max_tokens, /*logprobs=*/2);
  item.mutable_params()->set_temperature(0.9f);
  item.mutable_params()->set_top_p(0.95f);
  item.mutable_params()->set_seed(seed);
  return item;
}

std::vector<int32_t> Tokens(const RequestResult& r) {
  return std::vector<int32_t>(r.token_ids().begin(), r.token_ids().end());
}

// Tokens, finish reasons and top tokens equal; logprobs within 1e-3 (a verify row and a decode
// row may take different kernels for the same values).
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
      EXPECT_NEAR(g.logprobs(t).logprob(), w.logprobs(t).logprob(), 1e-3) << id << " token " << t;
      ASSERT_EQ(g.logprobs(t).top_token_ids_size(), w.logprobs(t).top_token_ids_size());
      for (int k = 0; k < g.logprobs(t).top_token_ids_size(); ++k) {
        EXPECT_EQ(g.logprobs(t).top_token_ids(k), w.logprobs(t).top_token_ids(k)) << id;
      }
    }
  }
}

struct Mode {
  WeightDType dtype;
  bool batch_invariant;
};

class SpeculativeEngineGpuTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    if (!testing::HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
    prompts_ = LoadPrompts();
    ASSERT_EQ(prompts_.size(), 4u);
    CudaTuning tuning;
    tuning.batch_invariant = GetParam().batch_invariant;
    auto backend = CudaBackend::Create(0, GetParam().dtype, tuning);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    auto plain = LoadModel(FixtureDir(), backend_.get());
    ASSERT_TRUE(plain.ok()) << plain.status();
    plain_ = std::move(*plain);
    ModelConfig config;
    auto source = OpenWeightSource(FixtureDir(), &config);
    ASSERT_TRUE(source.ok()) << source.status();
    ASSERT_EQ(config.num_nextn_predict_layers, 1);
    config.num_draft_layers = 1;
    source_ = std::make_unique<CheckpointWithGeneratedMtp>(std::move(*source));
    auto drafting = BuildModel(config, source_.get(), backend_.get());
    ASSERT_TRUE(drafting.ok()) << drafting.status();
    drafting_ = std::move(*drafting);
  }

  std::map<std::string, RequestResult> Run(CausalLm* model, EngineOptions options,
                                           std::vector<WorkItem> items,
                                           int64_t* drafts_verified = nullptr) {
    auto pool =
        KvBlockPool::Create(backend_.get(), KvBlockPoolOptions{model->CacheSpec(), 256, 16});
    EXPECT_TRUE(pool.ok()) << pool.status();
    std::map<std::string, RequestResult> results;
    if (!pool.ok()) return results;
    RequestQueue queue;
    options.eos_token_ids = {1};
    auto engine = Engine::Create(model, pool->get(), &queue, nullptr, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return results;
    queue.Push(std::move(items));
    for (int steps = 0; (*engine)->HasWork() && steps < 100000; ++steps) {
      auto r = (*engine)->Step();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      for (RequestResult& res : *r) results[res.request_id()] = std::move(res);
    }
    EXPECT_FALSE((*engine)->HasWork()) << "engine does not finish";
    if (drafts_verified != nullptr) *drafts_verified = (*engine)->drafts_verified();
    return results;
  }

  static EngineOptions Speculative(int32_t k) {
    EngineOptions o;
    o.speculative_tokens = k;
    return o;
  }

  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<WeightSource> source_;
  std::unique_ptr<CausalLm> plain_, drafting_;
  std::vector<std::vector<int32_t>> prompts_;
};

// Greedy requests without top logprobs: where the routed experts run on the device (bf16), every
// decode step, verify steps included, takes the decode graphs (the hidden states the draft head
// needs come out of the graph too).
TEST_P(SpeculativeEngineGpuTest, GreedyWithDraftsIsPlainGreedyThroughDecodeGraphs) {
  std::vector<WorkItem> items;
  const int32_t lengths[] = {24, 9, 17, 24};
  for (size_t i = 0; i < prompts_.size(); ++i) {
    items.push_back(Item(absl::StrCat("g", i), prompts_[i], lengths[i], /*logprobs=*/0));
  }
  const auto want = Run(plain_.get(), EngineOptions(), items);
  for (int32_t k : {1, 3}) {
    const int64_t graph_steps = drafting_->decode_graph_steps();
    int64_t verified = 0;
    const auto got = Run(drafting_.get(), Speculative(k), items, &verified);
    ExpectSameResults(got, want);
    EXPECT_GT(verified, 0) << "k=" << k;
    if (GetParam().dtype == WeightDType::kBFloat16) {
      EXPECT_GT(drafting_->decode_graph_steps(), graph_steps) << "k=" << k;
    }
  }
}

// Greedy with top logprobs, seeded sampling, penalties, a bias and min_tokens: verified rows are
// picked on the device by the general path (DeviceSampler) as plain decoding picks them.
TEST_P(SpeculativeEngineGpuTest, SampledAndAdjustedRequestsKeepTokensAndLogprobs) {
  std::vector<WorkItem> items;
  const int32_t lengths[] = {24, 9, 17, 5};
  for (size_t i = 0; i < prompts_.size(); ++i) {
    items.push_back(Item(absl::StrCat("g", i), prompts_[i], lengths[i], /*logprobs=*/3));
    items.push_back(Sampled(absl::StrCat("s", i), prompts_[i], 20 - 3 * i, 100 + i));
  }
  WorkItem penalised = Item("penalised", prompts_[0], 16, 1);
  penalised.mutable_params()->set_frequency_penalty(0.8f);
  penalised.mutable_params()->set_repetition_penalty(1.3f);
  items.push_back(penalised);
  WorkItem biased = Sampled("biased", prompts_[2], 16, 9);
  (*biased.mutable_params()->mutable_logit_bias())[prompts_[2][0]] = 4.0f;
  biased.mutable_params()->set_presence_penalty(0.5f);
  biased.mutable_params()->set_min_tokens(5);
  items.push_back(biased);
  const auto want = Run(plain_.get(), EngineOptions(), items);
  for (int32_t k : {1, 3}) {
    int64_t verified = 0;
    const auto got = Run(drafting_.get(), Speculative(k), items, &verified);
    ExpectSameResults(got, want);
    EXPECT_GT(verified, 0) << "k=" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SpeculativeEngineGpuTest,
                         ::testing::Values(Mode{WeightDType::kFloat32, false},
                                           Mode{WeightDType::kBFloat16, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param.batch_invariant ? std::string("Bf16BatchInvariant")
                                                             : std::string("Fp32");
                         });

}  // namespace
}  // namespace deepinfer
