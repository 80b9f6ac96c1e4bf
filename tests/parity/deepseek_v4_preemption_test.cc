// DeepSeek-V4 preempted mid-decode through the engine (dsv4_mix, HF-made): the long prompt's
// sequence is preempted after some decode steps and rebuilt by a bounded replay (its compressed
// entries kept in host memory, only the last L * (W - 1) + 2 * ratio positions replayed;
// docs/model.md, "Replay after preemption or worker loss"). Its tokens and log-probabilities are
// those of a run without preemption, its tokens HF's greedy_24, and the replayed positions are
// counted.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/parity/parity_checks.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/engine.h"
#include "worker/engine/request_queue.h"

namespace deepinfer {
namespace {

WorkItem Greedy(const std::string& id, const std::vector<int32_t>& prompt) {
  WorkItem item;
  item.set_request_id(id);
  item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  item.mutable_params()->set_max_tokens(24);
  item.mutable_params()->set_ignore_eos(true);
  item.mutable_params()->set_logprobs(0);  // the chosen token's log-probability
  return item;
}

struct Outcome {
  std::map<std::string, RequestResult> results;
  int64_t preemptions = 0;
  int64_t replayed = 0;
};

// Runs `items` on an engine over a pool of `blocks` blocks of 16 tokens.
Outcome RunEngine(CausalLm* model, Backend* backend, int32_t blocks, std::vector<WorkItem> items) {
  Outcome out;
  auto pool = KvBlockPool::Create(backend, {model->CacheSpec(), blocks, 16});
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return out;
  RequestQueue queue;
  EngineOptions options;
  options.max_batch_tokens = 512;
  options.max_running = 4;
  auto engine = Engine::Create(model, pool->get(), &queue, nullptr, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return out;
  queue.Push(std::move(items));
  for (int steps = 0; (*engine)->HasWork() && steps < 1000; ++steps) {
    auto r = (*engine)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    for (RequestResult& res : *r) out.results[res.request_id()] = std::move(res);
  }
  EXPECT_FALSE((*engine)->HasWork()) << "the engine did not finish";
  EXPECT_EQ((*engine)->load().kv_blocks_used, 0) << "blocks leaked";
  out.preemptions = (*engine)->preemptions();
  out.replayed = (*engine)->replayed_tokens();
  return out;
}

std::vector<int32_t> Tokens(const RequestResult& r) {
  return {r.token_ids().begin(), r.token_ids().end()};
}

std::vector<float> Logprobs(const RequestResult& r) {
  std::vector<float> v;
  for (const TokenLogprob& lp : r.logprobs()) v.push_back(lp.logprob());
  return v;
}

TEST(V4PreemptionTest, LongSequenceResumesByBoundedReplay) {
  CpuBackend backend(2);
  auto m = LoadParityModel("dsv4_mix", &backend);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->fx.prompts.size(), 3u);
  const FixturePrompt& long_p = m->fx.prompts[2];  // 300 tokens: 19 blocks, a 20th at 304
  ASSERT_EQ(long_p.ids.size(), 300u);
  // A 44-token prompt (3 blocks, a 4th at position 48), admitted first.
  const std::vector<int32_t> head(long_p.ids.begin(), long_p.ids.begin() + 44);
  auto items = [&] {
    return std::vector<WorkItem>{Greedy("head", head), Greedy("long", long_p.ids)};
  };

  const Outcome roomy = RunEngine(m->model.get(), &backend, 64, items());
  EXPECT_EQ(roomy.preemptions, 0);
  EXPECT_EQ(roomy.replayed, 0);
  // 22 blocks: both prompts are prefilled in the first step (3 + 19 blocks); in the fifth
  // decode step "head" needs its 4th block and "long" (admitted last, 304 positions computed)
  // is preempted. It waits (19 blocks for its kept entries, 18 free) until "head" finishes.
  const Outcome tight = RunEngine(m->model.get(), &backend, 22, items());
  EXPECT_EQ(tight.preemptions, 1);
  for (const char* id : {"head", "long"}) {
    ASSERT_EQ(tight.results.count(id), 1u) << id;
    ASSERT_EQ(roomy.results.count(id), 1u) << id;
    const RequestResult& a = tight.results.at(id);
    const RequestResult& b = roomy.results.at(id);
    ASSERT_EQ(a.error_code(), "") << a.error_message();
    EXPECT_EQ(Tokens(a), Tokens(b)) << id;
    EXPECT_EQ(Logprobs(a), Logprobs(b)) << id;  // bit for bit
    EXPECT_EQ(Logprobs(a).size(), 24u) << id;
  }
  EXPECT_EQ(Tokens(tight.results.at("long")), long_p.greedy);
  // dsv4_mix: 4 layers, window 16, compress ratios 4 and 16: the rebuild replays
  // 4 * 15 + 2 * 16 = 92 of the 304 positions "long" had computed.
  EXPECT_EQ(m->model->BoundedReplayStart(304), 304 - 92);
  EXPECT_EQ(tight.replayed, 92);
}

}  // namespace
}  // namespace deepinfer
