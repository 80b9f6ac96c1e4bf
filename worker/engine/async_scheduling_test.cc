// Async scheduling changes no output: every request gives the same result (tokens, text, finish
// reason, logprobs, errors) with the engine's steps run on their own thread, the next step formed
// while one runs, as with every step run to the end before the next one forms. On the
// dsv3_qlora_rope fixture (its greedy continuations are HF's, checked here too) with greedy and
// seeded sampling, logprobs, logit_bias and min_tokens (whose entries are built before the pending
// token is known), penalties (held back until it is), stop tokens that end requests mid-batch
// (their next rows computed ahead and dropped), max_tokens, n > 1 on one prompt, chunked
// prefill and preemption in a tiny pool; stop strings on a dummy model over the test tokenizer;
// cancellation and DropAll while a step is in flight, and idle steps.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/test_tokenizer_json.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_fixture.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAreArray;

using engine_testing::FixtureDir;
using engine_testing::Item;
using engine_testing::Prompt;
using engine_testing::ReadFile;
using engine_testing::Sampled;
using engine_testing::Tokens;

struct Outcome {
  std::map<std::string, RequestResult> results;
  bool async = false;
  int64_t preemptions = 0;
  int64_t computed_tokens = 0;
};

// How much of a prompt the prefix cache served depends on which steps ran when: not an output.
void ExpectSameResults(const Outcome& off, const Outcome& on) {
  EXPECT_FALSE(off.async);
  EXPECT_TRUE(on.async);
  ASSERT_EQ(on.results.size(), off.results.size());
  for (const auto& [id, expected] : off.results) {
    auto it = on.results.find(id);
    ASSERT_NE(it, on.results.end()) << id;
    const RequestResult& a = expected;
    const RequestResult& b = it->second;
    EXPECT_THAT(Tokens(b), ElementsAreArray(Tokens(a))) << id;
    EXPECT_EQ(b.text(), a.text()) << id;
    EXPECT_EQ(b.finish_reason(), a.finish_reason()) << id;
    EXPECT_EQ(b.error_code(), a.error_code()) << id;
    EXPECT_EQ(b.error_message(), a.error_message()) << id;
    EXPECT_EQ(b.prompt_tokens(), a.prompt_tokens()) << id;
    ASSERT_EQ(b.logprobs_size(), a.logprobs_size()) << id;
    for (int i = 0; i < a.logprobs_size(); ++i) {
      EXPECT_EQ(b.logprobs(i).ShortDebugString(), a.logprobs(i).ShortDebugString())
          << id << " " << i;
    }
  }
}

class AsyncSchedulingTest : public engine_testing::FixtureModelTest {
 protected:
  // Runs `items` on a fresh engine (its own pool and queue) until it is idle.
  Outcome Run(const std::vector<WorkItem>& items, bool async, EngineOptions options = {},
              int32_t num_blocks = 256, int32_t block_size = 16,
              const tokenizer::Tokenizer* tok = nullptr, CausalLm* model = nullptr) {
    if (model == nullptr) model = model_;
    auto pool = KvBlockPool::Create(backend_,
                                    KvBlockPoolOptions{model->CacheSpec(), num_blocks, block_size});
    EXPECT_TRUE(pool.ok()) << pool.status();
    RequestQueue queue;
    if (options.eos_token_ids.empty()) options.eos_token_ids = {1};  // generation_config.json
    options.async_scheduling = async;
    auto engine = Engine::Create(model, pool->get(), &queue, tok, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    Outcome out;
    out.async = (*engine)->async_scheduling();
    queue.Push(items);
    for (int steps = 0; (*engine)->HasWork(); ++steps) {
      auto r = (*engine)->Step();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || steps > 100000) break;
      for (RequestResult& res : *r) {
        EXPECT_EQ(out.results.count(res.request_id()), 0u)
            << "two results for " << res.request_id();
        out.results[res.request_id()] = std::move(res);
      }
    }
    EXPECT_EQ((*engine)->load().kv_blocks_used, 0) << "blocks leaked";
    out.preemptions = (*engine)->preemptions();
    out.computed_tokens = (*engine)->computed_tokens();
    return out;
  }
};

// One batch with every kind of request; some end mid-batch on a stop token, so the async run
// computes rows it then drops.
std::vector<WorkItem> MixedItems(const std::vector<Prompt>& prompts) {
  std::vector<WorkItem> items;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& p = prompts[i].ids;
    items.push_back(Item(absl::StrCat("greedy", i), p, 24));
    WorkItem lp = Item(absl::StrCat("greedy_logprobs", i), p, 11 + i);
    lp.mutable_params()->set_logprobs(3);
    items.push_back(lp);
    WorkItem s = Sampled(absl::StrCat("sampled", i), p, 20 - 3 * i, 100 + i);
    s.mutable_params()->set_logprobs(2);
    items.push_back(s);
    WorkItem k = Sampled(absl::StrCat("top_k", i), p, 9, 300 + i);
    k.mutable_params()->set_top_k(5);
    items.push_back(k);
    // n = 3 on one prompt: three seeds, one request each (as the coordinator splits them).
    for (int c = 0; c < 3; ++c)
      items.push_back(Sampled(absl::StrCat("n", i, "_", c), p, 12, 7 + c));
    // logit_bias and min_tokens: entries built for a token not sampled yet.
    WorkItem bias = Sampled(absl::StrCat("bias", i), p, 14, 500 + i);
    (*bias.mutable_params()->mutable_logit_bias())[prompts[i].greedy[3]] = 4.0f;
    bias.mutable_params()->set_min_tokens(6);
    bias.mutable_params()->add_stop_token_ids(prompts[i].greedy[1]);
    items.push_back(bias);
    // Penalties need the pending token itself: held back until it is known.
    WorkItem pen = Sampled(absl::StrCat("penalties", i), p, 13, 600 + i);
    pen.mutable_params()->set_presence_penalty(0.7f);
    pen.mutable_params()->set_frequency_penalty(0.3f);
    pen.mutable_params()->set_repetition_penalty(1.2f);
    items.push_back(pen);
    // A stop token the greedy continuation reaches at its 8th token: ends mid-batch.
    WorkItem stop = Item(absl::StrCat("stop_token", i), p, 24);
    stop.mutable_params()->add_stop_token_ids(prompts[i].greedy[7]);
    items.push_back(stop);
    items.push_back(Item(absl::StrCat("one_token", i), p, 1));
  }
  return items;
}

TEST_F(AsyncSchedulingTest, MixedRequestsEqualSynchronous) {
  const std::vector<WorkItem> items = MixedItems(prompts_);
  const Outcome off = Run(items, false);
  const Outcome on = Run(items, true);
  ExpectSameResults(off, on);
  // Rows computed ahead for requests that had already ended (the stop-token ones) were dropped.
  EXPECT_GT(on.computed_tokens, off.computed_tokens);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const RequestResult& g = on.results.at(absl::StrCat("greedy", i));
    EXPECT_THAT(Tokens(g), ElementsAreArray(prompts_[i].greedy)) << i;
    const RequestResult& stop = on.results.at(absl::StrCat("stop_token", i));
    const auto first =
        std::find(prompts_[i].greedy.begin(), prompts_[i].greedy.end(), prompts_[i].greedy[7]);
    EXPECT_EQ(stop.finish_reason(), "stop");
    EXPECT_THAT(Tokens(stop), ElementsAreArray(prompts_[i].greedy.begin(), first)) << i;
    EXPECT_EQ(on.results.at(absl::StrCat("greedy_logprobs", i)).logprobs_size(), 11 + i);
    EXPECT_EQ(on.results.at(absl::StrCat("one_token", i)).token_ids_size(), 1);
  }
}

TEST_F(AsyncSchedulingTest, ChunkedPrefillAndFewSlotsEqualSynchronous) {
  std::vector<WorkItem> items = MixedItems(prompts_);
  EngineOptions options;
  options.max_batch_tokens = 7;  // every prompt but the first is chunked
  options.max_running = 3;
  ExpectSameResults(Run(items, false, options), Run(items, true, options));
}

TEST_F(AsyncSchedulingTest, PreemptionInATinyPoolEqualsSynchronous) {
  std::vector<WorkItem> items;
  // The 130-token prompt does not fit 30 blocks of 4 with its continuation; it is left out.
  for (size_t i = 0; i + 1 < prompts_.size(); ++i) {
    items.push_back(Item(absl::StrCat("g", i), prompts_[i].ids, 24));
    items.push_back(Sampled(absl::StrCat("s", i), prompts_[i].ids, 20, 40 + i));
    WorkItem stop = Item(absl::StrCat("stop", i), prompts_[i].ids, 24);
    stop.mutable_params()->add_stop_token_ids(prompts_[i].greedy[9]);
    items.push_back(stop);
  }
  const Outcome off = Run(items, false, {}, /*num_blocks=*/30, /*block_size=*/4);
  const Outcome on = Run(items, true, {}, 30, 4);
  EXPECT_GT(on.preemptions, 0);
  ExpectSameResults(off, on);
  for (size_t i = 0; i + 1 < prompts_.size(); ++i) {
    EXPECT_THAT(Tokens(on.results.at(absl::StrCat("g", i))), ElementsAreArray(prompts_[i].greedy));
  }
}

// Stop strings need text: a dummy model over the test tokenizer's vocabulary (ids 0..264 all
// decode: 256 byte-level characters and 9 merges).
TEST_F(AsyncSchedulingTest, StopStringsEqualSynchronous) {
  nlohmann::json config =
      nlohmann::json::parse(ReadFile(FixtureDir() + "/config.json"), nullptr, false);
  ASSERT_TRUE(config.is_object());
  config["vocab_size"] = 265;
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/config.json";
  std::ofstream(path) << config.dump();
  auto model = LoadModel("dummy:" + path + "@11", backend_);
  ASSERT_TRUE(model.ok()) << model.status();
  auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TestTokenizerJson().dump(), nullptr);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 44, 32, 119};
  EngineOptions options;
  options.eos_token_ids = {264};
  // The texts without stop strings give the stop strings: a piece from the middle of each.
  std::vector<WorkItem> full;
  for (int seed = 0; seed < 6; ++seed) {
    WorkItem item = Sampled(absl::StrCat("full", seed), prompt, 40, seed);
    item.mutable_params()->set_ignore_eos(true);
    item.mutable_params()->set_logprobs(seed % 2 == 0 ? 1 : -1);
    full.push_back(item);
  }
  const Outcome texts = Run(full, false, options, 256, 16, tok->get(), model->get());
  std::vector<WorkItem> items = full;
  int cut = 0;
  for (int seed = 0; seed < 6; ++seed) {
    const std::string& text = texts.results.at(absl::StrCat("full", seed)).text();
    ASSERT_GE(text.size(), 12u);
    WorkItem item = full[seed];
    item.set_request_id(absl::StrCat("cut", seed));
    item.mutable_params()->add_stop("never there \x01");
    item.mutable_params()->add_stop(text.substr(text.size() / 2, 3));
    if (seed == 3) item.mutable_params()->set_min_tokens(30);
    items.push_back(item);
    ++cut;
  }
  const Outcome off = Run(items, false, options, 256, 16, tok->get(), model->get());
  const Outcome on = Run(items, true, options, 256, 16, tok->get(), model->get());
  ExpectSameResults(off, on);
  int stopped = 0;
  for (int seed = 0; seed < cut; ++seed) {
    const RequestResult& r = on.results.at(absl::StrCat("cut", seed));
    if (r.finish_reason() == "stop" && r.token_ids_size() < 40) ++stopped;
  }
  EXPECT_GT(stopped, 0);
}

TEST_F(AsyncSchedulingTest, CancelWhileAStepIsInFlight) {
  auto pool = KvBlockPool::Create(backend_, KvBlockPoolOptions{model_->CacheSpec(), 256, 16});
  ASSERT_TRUE(pool.ok());
  RequestQueue queue;
  EngineOptions options;
  options.eos_token_ids = {1};
  auto engine = Engine::Create(model_, pool->get(), &queue, nullptr, options);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->async_scheduling());
  queue.Push({Item("a", prompts_[0].ids, 24), Item("b", prompts_[1].ids, 24),
              Item("c", prompts_[2].ids, 24)});
  auto first = (*engine)->Step();  // launches the prefill; it is still being processed
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->empty());
  queue.Cancel({"a"});
  std::map<std::string, RequestResult> results;
  for (int steps = 0; (*engine)->HasWork() && steps < 1000; ++steps) {
    if (steps == 5) queue.Cancel({"c"});  // a decode in flight
    auto r = (*engine)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    for (RequestResult& res : *r) results[res.request_id()] = std::move(res);
  }
  EXPECT_EQ(results.count("a"), 0u);
  EXPECT_EQ(results.count("c"), 0u);
  EXPECT_THAT(Tokens(results["b"]), ElementsAreArray(prompts_[1].greedy));
  EXPECT_EQ((*engine)->load().kv_blocks_used, 0);
}

TEST_F(AsyncSchedulingTest, DropAllWithAStepInFlightFreesEverything) {
  auto pool = KvBlockPool::Create(backend_, KvBlockPoolOptions{model_->CacheSpec(), 256, 16});
  ASSERT_TRUE(pool.ok());
  RequestQueue queue;
  auto engine = Engine::Create(model_, pool->get(), &queue, nullptr, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  queue.Push({Item("a", prompts_[0].ids, 24), Item("b", prompts_[1].ids, 24)});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*engine)->Step().ok());
  EXPECT_TRUE((*engine)->HasWork());
  EXPECT_EQ((*engine)->DropAll(), 2);
  EXPECT_EQ((*engine)->load().kv_blocks_used, 0);
  EXPECT_FALSE((*engine)->HasWork());
}

// An expert-parallel rank steps with an empty batch while peers work: such steps are no work of
// their own, and Flush() processes the last one.
TEST_F(AsyncSchedulingTest, IdleStepsAndFlush) {
  auto pool = KvBlockPool::Create(backend_, KvBlockPoolOptions{model_->CacheSpec(), 256, 16});
  ASSERT_TRUE(pool.ok());
  RequestQueue queue;
  EngineOptions options;
  options.eos_token_ids = {1};
  options.step_when_idle = true;
  auto engine = Engine::Create(model_, pool->get(), &queue, nullptr, options);
  ASSERT_TRUE(engine.ok());
  for (int i = 0; i < 3; ++i) {
    auto idle = (*engine)->Step();
    ASSERT_TRUE(idle.ok()) << idle.status();
    EXPECT_TRUE(idle->empty());
    EXPECT_FALSE((*engine)->HasWork());
  }
  queue.Push({Item("after", prompts_[0].ids, 24)});
  std::map<std::string, RequestResult> results;
  for (int steps = 0; (*engine)->HasWork() && steps < 1000; ++steps) {
    auto r = (*engine)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    for (RequestResult& res : *r) results[res.request_id()] = std::move(res);
  }
  EXPECT_THAT(Tokens(results["after"]), ElementsAreArray(prompts_[0].greedy));
  auto flushed = (*engine)->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed.status();
  EXPECT_TRUE(flushed->empty());
  EXPECT_GE((*engine)->stats().steps(), 3 + 24);
}

}  // namespace
}  // namespace deepinfer
