// Engine against the HF fixture dsv3_qlora_rope: greedy results equal HF's and
// GenerateGreedyOnCpu; batching, chunking and preemption do not change any request's tokens;
// stop tokens, EOS, stop strings, max_tokens, context limit, logprobs and per-request errors;
// the per-request progress heartbeats report.
#include "worker/engine/engine.h"

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/test_tokenizer_json.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/engine_test_fixture.h"
#include "worker/model/cpu_generate.h"
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

class EngineTest : public engine_testing::FixtureModelTest {
 protected:
  // A fresh engine over its own pool.
  std::unique_ptr<Engine> MakeEngine(int32_t num_blocks = 256, int32_t block_size = 16,
                                     EngineOptions options = {},
                                     const tokenizer::Tokenizer* tok = nullptr,
                                     CausalLm* model = nullptr) {
    if (model == nullptr) model = model_;
    auto pool = KvBlockPool::Create(backend_,
                                    KvBlockPoolOptions{model->CacheSpec(), num_blocks, block_size});
    EXPECT_TRUE(pool.ok()) << pool.status();
    // Earlier engines of the test may still be alive and use their pool and queue.
    if (pool_ != nullptr) old_pools_.push_back(std::move(pool_));
    if (queue_ != nullptr) old_queues_.push_back(std::move(queue_));
    pool_ = std::move(*pool);
    queue_ = std::make_unique<RequestQueue>();
    if (options.eos_token_ids.empty()) options.eos_token_ids = {1};  // generation_config.json
    auto e = Engine::Create(model, pool_.get(), queue_.get(), tok, options);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }

  // Submits `items` and steps until the engine is idle.
  std::map<std::string, RequestResult> Run(Engine* engine, std::vector<WorkItem> items) {
    queue_->Push(std::move(items));
    std::map<std::string, RequestResult> results;
    int steps = 0;
    while (engine->HasWork()) {
      auto r = engine->Step();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      for (RequestResult& res : *r) {
        EXPECT_EQ(results.count(res.request_id()), 0u) << "two results for " << res.request_id();
        results[res.request_id()] = std::move(res);
      }
      EXPECT_LT(++steps, 100000) << "engine does not finish";
      if (steps >= 100000) break;
    }
    EXPECT_EQ(engine->load().kv_blocks_used, 0) << "blocks leaked";
    return results;
  }

  // Each item alone on a fresh engine with the default options.
  std::map<std::string, RequestResult> RunAlone(const std::vector<WorkItem>& items) {
    std::map<std::string, RequestResult> out;
    for (const WorkItem& item : items) {
      auto engine = MakeEngine();
      auto r = Run(engine.get(), {item});
      out[item.request_id()] = r[item.request_id()];
    }
    return out;
  }

  std::unique_ptr<RequestQueue> queue_;
  std::unique_ptr<KvBlockPool> pool_;
  std::vector<std::unique_ptr<RequestQueue>> old_queues_;
  std::vector<std::unique_ptr<KvBlockPool>> old_pools_;
};

TEST_F(EngineTest, GreedyEqualsHfAndGenerateGreedyOnCpu) {
  for (size_t i = 0; i < prompts_.size(); ++i) {
    auto engine = MakeEngine();
    const std::string id = absl::StrCat("p", i);
    auto results = Run(engine.get(), {Item(id, prompts_[i].ids, 24)});
    ASSERT_EQ(results.count(id), 1u);
    const RequestResult& r = results[id];
    EXPECT_EQ(r.error_code(), "");
    EXPECT_THAT(Tokens(r), ElementsAreArray(prompts_[i].greedy)) << id;
    auto reference = GenerateGreedyOnCpu(FixtureDir(), prompts_[i].ids, 24, 2);
    ASSERT_TRUE(reference.ok()) << reference.status();
    EXPECT_THAT(Tokens(r), ElementsAreArray(*reference)) << id;
    EXPECT_EQ(r.finish_reason(), "length");
    EXPECT_EQ(r.prompt_tokens(), static_cast<int>(prompts_[i].ids.size()));
    EXPECT_EQ(r.text(), "");  // the fixture has no tokenizer
    EXPECT_EQ(r.logprobs_size(), 0);
  }
}

// Many requests of different lengths and sampling parameters at once give what each gives alone.
std::vector<WorkItem> MixedItems(const std::vector<Prompt>& prompts) {
  std::vector<WorkItem> items;
  const int32_t lengths[] = {24, 9, 17, 3};
  for (size_t i = 0; i < prompts.size(); ++i) {
    items.push_back(Item(absl::StrCat("g", i), prompts[i].ids, lengths[i]));
    items.push_back(Sampled(absl::StrCat("s", i), prompts[i].ids, 20 - 3 * i, 100 + i));
    // The same prompt twice, other seed: same-prompt sequences must not share cache entries.
    items.push_back(Sampled(absl::StrCat("t", i), prompts[i].ids, 12, 200 + i));
  }
  return items;
}

TEST_F(EngineTest, ConcurrentRequestsEqualEachAlone) {
  std::vector<WorkItem> items = MixedItems(prompts_);
  auto alone = RunAlone(items);
  auto engine = MakeEngine();
  auto together = Run(engine.get(), items);
  ASSERT_EQ(together.size(), items.size());
  for (const WorkItem& item : items) {
    const std::string& id = item.request_id();
    EXPECT_THAT(Tokens(together[id]), ElementsAreArray(Tokens(alone[id]))) << id;
    EXPECT_EQ(together[id].finish_reason(), alone[id].finish_reason()) << id;
    EXPECT_EQ(together[id].token_ids_size(),
              std::min<int>(item.params().max_tokens(), together[id].token_ids_size()));
  }
  // Sampling really happened: two seeds on one prompt do not give one sequence everywhere.
  int differ = 0;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const auto s = Tokens(together[absl::StrCat("s", i)]);
    const auto t = Tokens(together[absl::StrCat("t", i)]);
    const size_t n = std::min(s.size(), t.size());
    if (!std::equal(s.begin(), s.begin() + n, t.begin())) ++differ;
  }
  EXPECT_GT(differ, 0);
  // Greedy ones are HF's.
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const auto g = Tokens(together[absl::StrCat("g", i)]);
    EXPECT_THAT(
        g, ElementsAreArray(prompts_[i].greedy.begin(), prompts_[i].greedy.begin() + g.size()));
  }
}

TEST_F(EngineTest, PreemptionWithTinyPoolGivesIdenticalTokens) {
  std::vector<WorkItem> items = MixedItems(prompts_);
  // The 130-token prompt does not fit 30 blocks of 4 with its continuation; leave it out.
  items.erase(std::remove_if(items.begin(), items.end(),
                             [](const WorkItem& w) { return w.request_id().back() == '3'; }),
              items.end());
  auto alone = RunAlone(items);
  auto engine = MakeEngine(/*num_blocks=*/30, /*block_size=*/4);
  auto together = Run(engine.get(), items);
  EXPECT_GT(engine->preemptions(), 0);
  ASSERT_EQ(together.size(), items.size());
  for (const WorkItem& item : items) {
    const std::string& id = item.request_id();
    EXPECT_EQ(together[id].error_code(), "") << together[id].error_message();
    EXPECT_THAT(Tokens(together[id]), ElementsAreArray(Tokens(alone[id]))) << id;
  }
}

TEST_F(EngineTest, ChunkedPrefillEqualsUnchunked) {
  std::vector<WorkItem> items = MixedItems(prompts_);
  auto alone = RunAlone(items);
  EngineOptions options;
  options.max_batch_tokens = 7;  // every prompt but the first is chunked
  auto engine = MakeEngine(256, 16, options);
  auto chunked = Run(engine.get(), items);
  ASSERT_EQ(chunked.size(), items.size());
  for (const WorkItem& item : items) {
    const std::string& id = item.request_id();
    EXPECT_THAT(Tokens(chunked[id]), ElementsAreArray(Tokens(alone[id]))) << id;
  }
  // max_running = 1 serialises them; same tokens again.
  options.max_batch_tokens = 2048;
  options.max_running = 1;
  engine = MakeEngine(256, 16, options);
  auto serial = Run(engine.get(), items);
  for (const WorkItem& item : items) {
    const std::string& id = item.request_id();
    EXPECT_THAT(Tokens(serial[id]), ElementsAreArray(Tokens(alone[id]))) << id;
  }
}

TEST_F(EngineTest, StopTokenAndEos) {
  const Prompt& p = prompts_[1];
  // Stop at the first occurrence of the 7th greedy token; it is not returned.
  const int32_t stop = p.greedy[6];
  const size_t first = std::find(p.greedy.begin(), p.greedy.end(), stop) - p.greedy.begin();
  WorkItem item = Item("stop", p.ids, 24);
  item.mutable_params()->add_stop_token_ids(stop);
  auto engine = MakeEngine();
  auto r = Run(engine.get(), {item})["stop"];
  EXPECT_THAT(Tokens(r), ElementsAreArray(p.greedy.begin(), p.greedy.begin() + first));
  EXPECT_EQ(r.finish_reason(), "stop");

  // The same token as EOS, then with ignore_eos.
  EngineOptions options;
  options.eos_token_ids = {stop};
  engine = MakeEngine(256, 16, options);
  r = Run(engine.get(), {Item("eos", p.ids, 24)})["eos"];
  EXPECT_THAT(Tokens(r), ElementsAreArray(p.greedy.begin(), p.greedy.begin() + first));
  EXPECT_EQ(r.finish_reason(), "stop");
  WorkItem ignore = Item("ignore", p.ids, 24);
  ignore.mutable_params()->set_ignore_eos(true);
  engine = MakeEngine(256, 16, options);
  r = Run(engine.get(), {ignore})["ignore"];
  EXPECT_THAT(Tokens(r), ElementsAreArray(p.greedy));
  EXPECT_EQ(r.finish_reason(), "length");
}

TEST_F(EngineTest, MaxTokensAndContextLimit) {
  const Prompt& p = prompts_[0];
  auto engine = MakeEngine();
  auto r = Run(engine.get(), {Item("five", p.ids, 5)})["five"];
  EXPECT_THAT(Tokens(r), ElementsAreArray(p.greedy.begin(), p.greedy.begin() + 5));
  EXPECT_EQ(r.finish_reason(), "length");
  // max_tokens 0: up to the context limit.
  EngineOptions options;
  options.context_limit = static_cast<int64_t>(p.ids.size()) + 11;
  engine = MakeEngine(256, 16, options);
  r = Run(engine.get(), {Item("ctx", p.ids, 0)})["ctx"];
  EXPECT_THAT(Tokens(r), ElementsAreArray(p.greedy.begin(), p.greedy.begin() + 11));
  EXPECT_EQ(r.finish_reason(), "length");
  // The model's max_position_embeddings (512) when nothing else limits it.
  engine = MakeEngine();
  EXPECT_EQ(engine->context_limit(), 512);
  // ... capped by what the pool holds.
  engine = MakeEngine(10, 16);
  EXPECT_EQ(engine->context_limit(), 160);
}

TEST_F(EngineTest, LogprobsShape) {
  const Prompt& p = prompts_[2];
  WorkItem three = Item("three", p.ids, 8);
  three.mutable_params()->set_logprobs(3);
  WorkItem zero = Item("zero", p.ids, 8);
  zero.mutable_params()->set_logprobs(0);
  WorkItem sampled = Sampled("sampled", p.ids, 8, 9);
  sampled.mutable_params()->set_logprobs(2);
  auto engine = MakeEngine();
  auto results = Run(engine.get(), {three, zero, sampled, Item("none", p.ids, 8)});
  const RequestResult& r = results["three"];
  ASSERT_EQ(r.logprobs_size(), 8);
  for (int i = 0; i < 8; ++i) {
    const TokenLogprob& lp = r.logprobs(i);
    EXPECT_EQ(lp.token_id(), r.token_ids(i));
    ASSERT_EQ(lp.top_token_ids_size(), 3);
    ASSERT_EQ(lp.top_logprobs_size(), 3);
    EXPECT_EQ(lp.top_token_ids(0), lp.token_id());  // greedy picks the most likely
    EXPECT_FLOAT_EQ(lp.top_logprobs(0), lp.logprob());
    EXPECT_LE(lp.logprob(), 0.0f);
    EXPECT_GE(lp.top_logprobs(0), lp.top_logprobs(1));
    EXPECT_GE(lp.top_logprobs(1), lp.top_logprobs(2));
  }
  ASSERT_EQ(results["zero"].logprobs_size(), 8);
  EXPECT_EQ(results["zero"].logprobs(0).top_token_ids_size(), 0);
  EXPECT_FLOAT_EQ(results["zero"].logprobs(0).logprob(), r.logprobs(0).logprob());
  const RequestResult& s = results["sampled"];
  ASSERT_EQ(s.logprobs_size(), s.token_ids_size());
  for (int i = 0; i < s.logprobs_size(); ++i) {
    EXPECT_EQ(s.logprobs(i).token_id(), s.token_ids(i));
    EXPECT_EQ(s.logprobs(i).top_token_ids_size(), 2);
  }
  EXPECT_EQ(results["none"].logprobs_size(), 0);
}

TEST_F(EngineTest, PerRequestErrorsFailOnlyThatRequest) {
  EngineOptions options;
  options.context_limit = 20;
  auto engine = MakeEngine(256, 16, options);
  WorkItem stop_string = Item("stopstr", prompts_[0].ids, 4);
  stop_string.mutable_params()->add_stop("x");
  WorkItem bad_token = Item("badtok", {1, 2, 5000}, 4);
  WorkItem bad_bias = Item("badbias", prompts_[0].ids, 4);
  (*bad_bias.mutable_params()->mutable_logit_bias())[5000] = 1.0f;
  WorkItem bad_penalty = Item("badpenalty", prompts_[0].ids, 4);
  bad_penalty.mutable_params()->set_repetition_penalty(-1.0f);
  auto results =
      Run(engine.get(), {Item("long", prompts_[2].ids, 4), stop_string, bad_token, bad_bias,
                         bad_penalty, Item("ok", prompts_[0].ids, 4), Item("empty", {}, 4)});
  EXPECT_EQ(results["badbias"].error_code(), "INVALID_ARGUMENT");
  EXPECT_THAT(results["badbias"].error_message(),
              ::testing::HasSubstr("logit_bias: token id 5000"));
  EXPECT_EQ(results["badpenalty"].error_code(), "INVALID_ARGUMENT");
  EXPECT_THAT(results["badpenalty"].error_message(), ::testing::HasSubstr("repetition_penalty"));
  EXPECT_EQ(results["long"].error_code(), "INVALID_ARGUMENT");
  EXPECT_THAT(results["long"].error_message(), ::testing::HasSubstr("context"));
  EXPECT_EQ(results["stopstr"].error_code(), "INVALID_ARGUMENT");
  EXPECT_THAT(results["stopstr"].error_message(), ::testing::HasSubstr("tokenizer"));
  EXPECT_EQ(results["badtok"].error_code(), "INVALID_ARGUMENT");
  EXPECT_EQ(results["empty"].error_code(), "INVALID_ARGUMENT");
  EXPECT_EQ(results["ok"].error_code(), "");
  EXPECT_THAT(Tokens(results["ok"]),
              ElementsAreArray(prompts_[0].greedy.begin(), prompts_[0].greedy.begin() + 4));
}

TEST_F(EngineTest, CancelDropsRequest) {
  auto engine = MakeEngine();
  queue_->Push({Item("a", prompts_[0].ids, 24), Item("b", prompts_[1].ids, 24)});
  auto first = engine->Step();
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->empty());
  EXPECT_EQ(engine->load().running, 2);
  queue_->Cancel({"a", "unknown"});
  auto rest = Run(engine.get(), {});
  EXPECT_EQ(rest.count("a"), 0u);
  EXPECT_THAT(Tokens(rest["b"]), ElementsAreArray(prompts_[1].greedy));
}

// What heartbeats report: tokens so far per held request, moving with every step, and
// nothing once the requests finished. With async scheduling a Step() handles the tokens of the
// step launched before it, so the counts lag one step until Flush().
TEST_F(EngineTest, ProgressCountsTokensOfRunningRequests) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async scheduling" : "synchronous");
    EngineOptions options;
    options.async_scheduling = async;
    auto engine = MakeEngine(256, 16, options);
    EXPECT_EQ(engine->async_scheduling(), async);
    EXPECT_TRUE(engine->progress().empty());
    queue_->Push({Item("a", prompts_[0].ids, 24), Item("b", prompts_[1].ids, 24)});
    auto progress = [&] {
      std::map<std::string, int64_t> out;
      for (const RequestProgress& p : engine->progress()) {
        out[p.request_id()] = p.generated_tokens();
      }
      return out;
    };
    const std::map<std::string, int64_t> none,
        one = {{"a", 1}, {"b", 1}}, two = {{"a", 2}, {"b", 2}}, three = {{"a", 3}, {"b", 3}};
    ASSERT_TRUE(engine->Step().ok());  // prefill, then each samples its first token
    EXPECT_EQ(progress(), async ? none : one);
    ASSERT_TRUE(engine->Step().ok());
    ASSERT_TRUE(engine->Step().ok());
    EXPECT_EQ(progress(), async ? two : three);
    auto flushed = engine->Flush();
    ASSERT_TRUE(flushed.ok()) << flushed.status();
    EXPECT_TRUE(flushed->empty());
    EXPECT_EQ(progress(), three);
    auto rest = Run(engine.get(), {});
    EXPECT_EQ(rest.size(), 2u);
    EXPECT_TRUE(engine->progress().empty());
  }
}

TEST_F(EngineTest, DropAllFreesEverything) {
  auto engine = MakeEngine();
  queue_->Push({Item("a", prompts_[0].ids, 24), Item("b", prompts_[1].ids, 24)});
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_GT(engine->load().kv_blocks_used, 0);
  EXPECT_EQ(engine->DropAll(), 2);
  EXPECT_EQ(engine->load().kv_blocks_used, 0);
  EXPECT_FALSE(engine->HasWork());
}

// Stop strings need text: a dummy model over the test tokenizer's vocabulary (ids 0..264 all
// decode: 256 byte-level characters and 9 merges).
TEST_F(EngineTest, StopStringsCutTextAndEndRequest) {
  nlohmann::json config =
      nlohmann::json::parse(ReadFile(FixtureDir() + "/config.json"), nullptr, false);
  ASSERT_TRUE(config.is_object());
  config["vocab_size"] = 265;
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/config.json";
  std::ofstream(path) << config.dump();
  CpuBackend backend(2);
  auto model = LoadModel("dummy:" + path + "@11", &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TestTokenizerJson().dump(), nullptr);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 44, 32, 119};
  EngineOptions options;
  options.eos_token_ids = {264};
  auto engine = MakeEngine(64, 16, options, tok->get(), model->get());
  WorkItem full_item = Sampled("full", prompt, 40, 5);
  full_item.mutable_params()->set_ignore_eos(true);
  auto full = Run(engine.get(), {full_item})["full"];
  ASSERT_EQ(full.token_ids_size(), 40);
  std::vector<uint32_t> ids(full.token_ids().begin(), full.token_ids().end());
  auto text = (*tok)->Decode(ids, /*skip_special_tokens=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(full.text(), *text);
  ASSERT_GE(text->size(), 12u);
  // A stop string from the middle of the text: the result ends before its first occurrence.
  const std::string stop = text->substr(text->size() / 2, 3);
  const size_t at = text->find(stop);
  WorkItem cut = full_item;
  cut.set_request_id("cut");
  cut.mutable_params()->add_stop("never there \x01");
  cut.mutable_params()->add_stop(stop);
  auto r = Run(engine.get(), {cut})["cut"];
  EXPECT_EQ(r.finish_reason(), "stop");
  EXPECT_EQ(r.text(), text->substr(0, at));
  EXPECT_LT(r.token_ids_size(), 40);
  EXPECT_THAT(Tokens(r), ElementsAreArray(full.token_ids().begin(),
                                          full.token_ids().begin() + r.token_ids_size()));
  // With min_tokens = max_tokens, stop strings are looked for only in the last token's text:
  // the occurrence in the middle stays in the text, and the tokens are those of the full run
  // (no EOS or stop token to mask).
  WorkItem held = cut;
  held.set_request_id("held");
  held.mutable_params()->set_min_tokens(40);
  auto h = Run(engine.get(), {held})["held"];
  EXPECT_THAT(Tokens(h), ElementsAreArray(full.token_ids().begin(), full.token_ids().end()));
  EXPECT_EQ(h.text().substr(0, at + stop.size()), text->substr(0, at + stop.size()));
}

// A model whose vocabulary is larger than its tokenizer's, as DeepSeek-V3's (129,280 embedding
// rows, 128,815 tokens): ids past the tokenizer are generated, returned with their logprobs and
// add no text, and the request succeeds, greedy or sampled, with stop strings being checked.
// Prompts may hold such ids too; the model's own vocabulary still bounds them.
TEST_F(EngineTest, GeneratedIdsPastTheTokenizerAddNoText) {
  nlohmann::json config =
      nlohmann::json::parse(ReadFile(FixtureDir() + "/config.json"), nullptr, false);
  ASSERT_TRUE(config.is_object());
  config["vocab_size"] = 2048;
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/big_vocab_config.json";
  std::ofstream(path) << config.dump();
  CpuBackend backend(2);
  auto model = LoadModel("dummy:" + path + "@11", &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TestTokenizerJson().dump(), nullptr);
  ASSERT_TRUE(tok.ok()) << tok.status();
  constexpr int32_t kTokenizerIds = 269;  // the test tokenizer knows ids 0..268
  ASSERT_NE((*tok)->IdToToken(kTokenizerIds - 1), nullptr);
  ASSERT_EQ((*tok)->IdToToken(kTokenizerIds), nullptr);
  auto engine = MakeEngine(64, 16, {}, tok->get(), model->get());
  const std::vector<int32_t> prompt = {72, 101, 1500, 108, 2047, 111};
  std::vector<WorkItem> items = {Item("greedy", prompt, 24), Sampled("sampled", prompt, 24, 5),
                                 Item("outside", {72, 2048}, 4)};
  for (int i = 0; i < 2; ++i) {
    items[i].mutable_params()->set_ignore_eos(true);
    items[i].mutable_params()->set_logprobs(3);
    items[i].mutable_params()->add_stop("never there \x01");
  }
  auto results = Run(engine.get(), items);
  for (const char* id : {"greedy", "sampled"}) {
    SCOPED_TRACE(id);
    const RequestResult& r = results[id];
    EXPECT_EQ(r.error_code(), "") << r.error_message();
    ASSERT_EQ(r.token_ids_size(), 24);
    ASSERT_EQ(r.logprobs_size(), 24);
    std::vector<uint32_t> known;
    int past = 0;
    for (int i = 0; i < r.token_ids_size(); ++i) {
      EXPECT_EQ(r.logprobs(i).token_id(), r.token_ids(i));
      EXPECT_EQ(r.logprobs(i).top_token_ids_size(), 3);
      if (r.token_ids(i) >= kTokenizerIds) {
        ++past;
      } else {
        known.push_back(static_cast<uint32_t>(r.token_ids(i)));
      }
    }
    // With 2048 rows over 269 tokens most ids are past the tokenizer; the test needs both kinds.
    ASSERT_GT(past, 0);
    ASSERT_GT(static_cast<int>(known.size()), 0);
    auto text = (*tok)->Decode(known, /*skip_special_tokens=*/true);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(r.text(), *text);
  }
  EXPECT_EQ(results["outside"].error_code(), "INVALID_ARGUMENT");
  EXPECT_THAT(results["outside"].error_message(),
              ::testing::HasSubstr("prompt token id 2048 outside the vocabulary of 2048"));
}

// Prefix caching. Requests that share a long system prompt (the fixture's 130-token prompt)
// with the other fixture prompts as questions, greedy and sampled, all with top logprobs.
std::vector<WorkItem> SharedPrefixItems(const std::vector<Prompt>& prompts) {
  const std::vector<int32_t>& system = prompts[3].ids;
  std::vector<WorkItem> items;
  for (size_t q = 0; q < 3; ++q) {
    std::vector<int32_t> prompt = system;
    prompt.insert(prompt.end(), prompts[q].ids.begin(), prompts[q].ids.end());
    items.push_back(Item(absl::StrCat("g", q), prompt, 12));
    items.push_back(Sampled(absl::StrCat("s", q), prompt, 10, 300 + q));
  }
  // The system prompt alone, twice (fully cached the second time but for its last block), and
  // a prefix of it that ends inside a block.
  items.push_back(Item("sys", system, 8));
  items.push_back(Sampled("sys-again", system, 8, 7));
  items.push_back(Item("part", std::vector<int32_t>(system.begin(), system.begin() + 37), 8));
  for (WorkItem& item : items) item.mutable_params()->set_logprobs(3);
  return items;
}

// Tokens, logprobs and top logprobs equal bit for bit.
void ExpectSameOutput(const RequestResult& got, const RequestResult& want, const std::string& id) {
  EXPECT_EQ(got.error_code(), "") << id << ": " << got.error_message();
  EXPECT_THAT(Tokens(got), ElementsAreArray(Tokens(want))) << id;
  EXPECT_EQ(got.finish_reason(), want.finish_reason()) << id;
  ASSERT_EQ(got.logprobs_size(), want.logprobs_size()) << id;
  for (int i = 0; i < got.logprobs_size(); ++i) {
    const TokenLogprob &g = got.logprobs(i), &w = want.logprobs(i);
    EXPECT_EQ(g.logprob(), w.logprob()) << id << " token " << i;
    EXPECT_THAT(g.top_token_ids(), ElementsAreArray(w.top_token_ids())) << id << " token " << i;
    EXPECT_THAT(g.top_logprobs(), ElementsAreArray(w.top_logprobs())) << id << " token " << i;
  }
}

// The MLA prefill form of the auto choice depends on how many new tokens a sequence brings in a
// step, which prefix hits change (as chunking does); the two forms round differently.
// Bit-for-bit comparisons pin the absorbed form.
class PrefixCacheEngineTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    model_->SetPrefillAttention(PrefillAttention::kAbsorbed);
  }
  void TearDown() override { model_->SetPrefillAttention(PrefillAttention::kAuto); }

  // `items` on a fresh engine with prefix caching on or off.
  std::map<std::string, RequestResult> RunCaching(bool on, const std::vector<WorkItem>& items,
                                                  EngineOptions options = {},
                                                  int32_t num_blocks = 256,
                                                  int32_t block_size = 16) {
    options.prefix_cache.enabled = on;
    engine_ = MakeEngine(num_blocks, block_size, options);
    return Run(engine_.get(), items);
  }

  std::unique_ptr<Engine> engine_;
};

TEST_F(PrefixCacheEngineTest, OnEqualsOffTokensAndLogprobs) {
  const std::vector<WorkItem> items = SharedPrefixItems(prompts_);
  auto off = RunCaching(false, items);
  EXPECT_EQ(engine_->prefix_cache().stats().hit_blocks, 0);
  EXPECT_EQ(engine_->prefix_cache().num_cached_blocks(), 0);
  for (const auto& [id, r] : off) EXPECT_EQ(r.cached_prompt_tokens(), 0) << id;
  // Every request at once: in the first step nothing is cached yet. max_running = 2 admits
  // later requests while earlier ones run; max_batch_tokens = 40 chunks the prefills, so a
  // request also hits blocks that a running one filled in an earlier chunk.
  EngineOptions staggered;
  staggered.max_running = 2;
  EngineOptions chunked;
  chunked.max_batch_tokens = 40;
  for (const EngineOptions& options : {EngineOptions{}, staggered, chunked}) {
    SCOPED_TRACE(absl::StrCat("max_running ", options.max_running, " max_batch_tokens ",
                              options.max_batch_tokens));
    auto on = RunCaching(true, items, options);
    ASSERT_EQ(on.size(), items.size());
    for (const WorkItem& item : items) {
      ExpectSameOutput(on[item.request_id()], off[item.request_id()], item.request_id());
    }
    if (options.max_running == 2 || options.max_batch_tokens == 40) {
      EXPECT_GT(engine_->prefix_cache().stats().hit_blocks, 0);
    }
  }
}

// One request at a time: each finds what the ones before it left, and reports it.
TEST_F(PrefixCacheEngineTest, CachedTokensOfSequentialRequests) {
  const std::vector<WorkItem> items = SharedPrefixItems(prompts_);
  EngineOptions serial;
  serial.max_running = 1;
  // Admission order is arrival order: g0 s0 g1 s1 g2 s2 sys sys-again part.
  auto on = RunCaching(true, items, serial);
  const int64_t before = engine_->computed_tokens();
  auto off = RunCaching(false, items, serial);
  // The system prompt is 130 tokens: 8 full blocks of 16 (128 tokens); a hit never covers a
  // prompt's last token.
  const std::map<std::string, int> want = {
      {"g0", 0},           // nothing cached yet
      {"s0", 128},         // g0's prompt (135 tokens) again: its 8 full blocks
      {"g1", 128},         // 147 tokens; block 8 mixes the system prompt's end with q1
      {"s1", 144},         // g1's prompt again: 9 full blocks
      {"g2", 128},         // 194 tokens
      {"s2", 192},         // g2's prompt again: 12 full blocks (193 tokens may be cached)
      {"sys", 128},        // 130 tokens, 129 may be cached: 8 blocks
      {"sys-again", 128},  // the same
      {"part", 32},        // 37 tokens: 2 full blocks
  };
  for (const auto& [id, tokens] : want) {
    EXPECT_EQ(on[id].cached_prompt_tokens(), tokens) << id;
    EXPECT_EQ(off[id].cached_prompt_tokens(), 0) << id;
    ExpectSameOutput(on[id], off[id], id);
  }
  int64_t cached = 0;
  for (const auto& [id, r] : on) cached += r.cached_prompt_tokens();
  // The model computed exactly the cached tokens fewer.
  EXPECT_EQ(engine_->computed_tokens() - before, cached);
}

// A tiny pool: sequences are preempted in the middle and re-admitted (finding their own blocks
// that stayed cached), idle cached blocks are evicted for new ones; results are those of the
// engine without a cache.
TEST_F(PrefixCacheEngineTest, PreemptionAndEvictionKeepResults) {
  std::vector<WorkItem> items;
  const std::vector<int32_t>& system = prompts_[2].ids;  // 64 tokens
  for (size_t q = 0; q < 2; ++q) {
    std::vector<int32_t> prompt = system;
    prompt.insert(prompt.end(), prompts_[q].ids.begin(), prompts_[q].ids.end());
    items.push_back(Item(absl::StrCat("g", q), prompt, 16));
    items.push_back(Sampled(absl::StrCat("s", q), prompt, 16, 40 + q));
    items.push_back(Item(absl::StrCat("q", q), prompts_[q].ids, 16));
  }
  for (WorkItem& item : items) item.mutable_params()->set_logprobs(2);
  auto off = RunCaching(false, items, {}, /*num_blocks=*/30, /*block_size=*/4);
  auto on = RunCaching(true, items, {}, 30, 4);
  EXPECT_GT(engine_->preemptions(), 0);
  EXPECT_GT(engine_->prefix_cache().stats().hit_blocks, 0);
  EXPECT_GT(engine_->prefix_cache().stats().evictions, 0);
  ASSERT_EQ(on.size(), items.size());
  for (const WorkItem& item : items) {
    ExpectSameOutput(on[item.request_id()], off[item.request_id()], item.request_id());
  }
}

// An expert-parallel rank without requests still steps (an empty batch), and then it works on.
TEST_F(EngineTest, IdleStepRunsAnEmptyBatch) {
  EngineOptions options;
  options.step_when_idle = true;
  auto engine = MakeEngine(256, 16, options);
  auto idle = engine->Step();
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_TRUE(idle->empty());
  auto r = Run(engine.get(), {Item("after", prompts_[0].ids, 24)})["after"];
  EXPECT_THAT(Tokens(r), ElementsAreArray(prompts_[0].greedy));
}

// Prompts admitted while other requests decode share a step with the decode rows. With the
// default prefill attention (kAuto) each sequence takes its own form: the 64- and 130-token
// prompts the non-absorbed one, as in their own prefill steps alone, the decodes the absorbed
// one. So every request's tokens and logprobs equal its own alone bit for bit (the CPU computes
// each row on its own).
TEST_F(EngineTest, PromptsNextToDecodesEqualEachAloneBitForBit) {
  ASSERT_EQ(model_->prefill_attention(), PrefillAttention::kAuto);
  ASSERT_GE(static_cast<int32_t>(prompts_[2].ids.size()), kMhaPrefillMinTokens);
  ASSERT_GE(static_cast<int32_t>(prompts_[3].ids.size()), kMhaPrefillMinTokens);
  std::vector<WorkItem> early = {Item("d0", prompts_[0].ids, 12), Item("d1", prompts_[1].ids, 12)};
  std::vector<WorkItem> late = {Item("p2", prompts_[2].ids, 8), Item("p3", prompts_[3].ids, 8)};
  for (auto* items : {&early, &late}) {
    for (WorkItem& item : *items) item.mutable_params()->set_logprobs(3);
  }
  std::vector<WorkItem> all = early;
  all.insert(all.end(), late.begin(), late.end());
  auto alone = RunAlone(all);

  auto engine = MakeEngine();
  std::map<std::string, RequestResult> together;
  auto step = [&] {
    auto r = engine->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    for (RequestResult& res : *r) together[res.request_id()] = std::move(res);
  };
  queue_->Push(std::move(early));
  // The early prompts' prefill and first decode; the late prompts then join decoding rows.
  step();
  step();
  ASSERT_TRUE(together.empty());
  queue_->Push(std::move(late));
  for (int steps = 0; engine->HasWork() && steps < 1000; ++steps) step();
  EXPECT_FALSE(engine->HasWork());
  ASSERT_EQ(together.size(), all.size());
  for (const WorkItem& item : all) {
    const std::string& id = item.request_id();
    ExpectSameOutput(together[id], alone[id], id);
  }
}

}  // namespace
}  // namespace deepinfer
