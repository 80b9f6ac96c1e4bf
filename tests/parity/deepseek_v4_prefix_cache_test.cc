// DeepSeek-V4 with prefix caching: a prompt whose prefix is cached keeps the cached blocks'
// compressed entries and indexer keys, and rebuilds its window rings and compressor rows by a
// bounded replay of the last L * (W - 1) + 2 * ratio positions before the hit's end
// (docs/kv-cache.md, docs/model.md). On the HF-made fixtures dsv4_mix and dsv4_bf16 and on a
// generated config whose HCA entries span two blocks (ratio 32, blocks of 16):
//   * through the model: the rebuilt sequence's logits after the hit are bit for bit those of
//     one prefill of its tokens, and the shared blocks are not written;
//   * through the engine: requests sharing long prefixes, one at a time and admitted while the
//     sequence that cached the prefix still runs, get the tokens and log-probabilities of a run
//     without the prefix cache, bit for bit; each hit reports the prompt tokens it did not
//     compute, and replays exactly L * (W - 1) + 2 * ratio positions.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/parity/parity_checks.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/engine.h"
#include "worker/engine/request_queue.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

constexpr int32_t kBlockSize = 16;

// hidden 64, 3 layers: HCA of ratio 32 (an entry spans 2 blocks), CSA of ratio 4, sliding;
// window 8, hc_mult 2. Replay: 3 * 7 + 2 * 32 = 85 positions; prefix units of 32 positions.
constexpr char kSpanningConfig[] = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
  "head_dim": 32, "partial_rotary_factor": 0.25, "q_lora_rank": 32, "o_groups": 2,
  "o_lora_rank": 16, "sliding_window": 8, "hc_mult": 2, "hc_sinkhorn_iters": 3,
  "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4, "n_routed_experts": 4,
  "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
  "layer_types": ["heavily_compressed_attention", "compressed_sparse_attention",
                  "sliding_attention"],
  "mlp_layer_types": ["hash_moe", "moe", "moe"], "num_nextn_predict_layers": 0,
  "max_position_embeddings": 1024})";

absl::StatusOr<std::unique_ptr<CausalLm>> SpanningModel(Backend* backend) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/v4_spanning_config.json";
  std::ofstream(path) << kSpanningConfig;
  return LoadModel("dummy:" + path + "@11", backend);
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
std::vector<int32_t> Head(const std::vector<int32_t>& v, size_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + n);
}
// n tokens in [0, vocab) that differ from `avoid` (so a tail leaves the prefix where it starts).
std::vector<int32_t> Tail(uint32_t seed, size_t n, int32_t vocab, int32_t avoid) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (int32_t& t : v) t = static_cast<int32_t>(rng() % vocab);
  if (!v.empty() && v[0] == avoid) v[0] = (avoid + 1) % vocab;
  return v;
}

// --- Through the model ------------------------------------------------------------------------

// `b` shares the first `shared` blocks of `a`'s table (a prefill of `a`): its step keeps their
// entries (kept_end = shared * block size) and replays from BoundedReplayStart. Its logits at
// the positions from the hit's end equal one prefill of `b`, and `a`'s shared blocks are as they
// were.
void CheckRebuildOverSharedBlocks(CausalLm* model, Backend* backend, const std::vector<int32_t>& a,
                                  const std::vector<int32_t>& b, int32_t shared) {
  SCOPED_TRACE(::testing::Message() << "shared blocks " << shared << ", b of " << b.size());
  KvBlockPoolOptions o{model->CacheSpec(), 64, kBlockSize};
  o.max_sequences = 4;
  auto pool = KvBlockPool::Create(backend, o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  const int64_t n = static_cast<int64_t>(b.size()), hit_end = int64_t{shared} * kBlockSize;
  const int64_t start = model->BoundedReplayStart(hit_end);
  ASSERT_GT(start, 0);

  SequenceStep sa;
  sa.tokens = a;
  sa.block_table = *p.Allocate(p.BlocksFor(static_cast<int64_t>(a.size())));
  ASSERT_TRUE(model->Step({sa}, &p).ok());
  const std::vector<int32_t> shared_table(sa.block_table.begin(), sa.block_table.begin() + shared);
  auto before = p.ReadBlocks(shared_table);
  ASSERT_TRUE(before.ok());

  SequenceStep sb;
  sb.tokens.assign(b.begin() + start, b.end());
  sb.position_offset = start;
  sb.block_table = shared_table;
  auto own = p.Allocate(p.BlocksFor(n) - shared);
  ASSERT_TRUE(own.ok());
  sb.block_table.insert(sb.block_table.end(), own->begin(), own->end());
  sb.shared_blocks = shared;
  sb.kept_end = hit_end;
  sb.replay_from = start;
  sb.all_logits = true;
  auto rebuilt = model->Step({sb}, &p);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  auto after = p.ReadBlocks(shared_table);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*before == *after) << "the shared blocks were written";

  SequenceStep whole;
  whole.tokens = b;
  whole.block_table = *p.Allocate(p.BlocksFor(n));
  whole.all_logits = true;
  auto one = model->Step({whole}, &p);
  ASSERT_TRUE(one.ok()) << one.status();
  const int64_t V = model->config().vocab_size;
  const std::vector<float>& r = rebuilt->logits[0];
  const std::vector<float>& w = one->logits[0];
  ASSERT_EQ(static_cast<int64_t>(r.size()), (n - start) * V);
  for (int64_t pos = hit_end; pos < n; ++pos) {
    ASSERT_TRUE(std::equal(r.begin() + (pos - start) * V, r.begin() + (pos - start + 1) * V,
                           w.begin() + pos * V))
        << "position " << pos;
  }

  // A step that would write a compressed entry into the shared blocks is refused: entries kept
  // only up to the block before the hit's end.
  SequenceStep bad = sb;
  bad.kept_end = hit_end - kBlockSize;
  bad.replay_from = model->BoundedReplayStart(bad.kept_end);
  bad.position_offset = bad.replay_from;
  bad.tokens.assign(b.begin() + bad.replay_from, b.end());
  if (bad.replay_from > 0) {
    absl::Status st = model->Step({bad}, &p).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("shared blocks"), std::string::npos) << st;
  }
}

TEST(V4PrefixCacheTest, RebuildOverSharedBlocksEqualsOnePrefill) {
  CpuBackend backend(2);
  for (const char* fixture : {"dsv4_mix", "dsv4_bf16"}) {
    SCOPED_TRACE(fixture);
    auto m = LoadParityModel(fixture, &backend);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::vector<int32_t>& p = m->fx.prompts[2].ids;
    const int32_t V = static_cast<int32_t>(m->model->config().vocab_size);
    CheckRebuildOverSharedBlocks(m->model.get(), &backend, p,
                                 Concat(Head(p, 200), Tail(1, 40, V, p[200])), 12);
    CheckRebuildOverSharedBlocks(m->model.get(), &backend, p, p, 15);
  }
  auto spanning = SpanningModel(&backend);
  ASSERT_TRUE(spanning.ok()) << spanning.status();
  const std::vector<int32_t> x = Tail(7, 300, 512, -1);
  // 8 blocks: 4 HCA entries of 32 positions, none past the hit's end.
  CheckRebuildOverSharedBlocks(spanning->get(), &backend, x,
                               Concat(Head(x, 150), Tail(2, 60, 512, x[150])), 8);
}

// --- Through the engine -----------------------------------------------------------------------

WorkItem Greedy(const std::string& id, const std::vector<int32_t>& prompt) {
  WorkItem item;
  item.set_request_id(id);
  item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  item.mutable_params()->set_max_tokens(8);
  item.mutable_params()->set_ignore_eos(true);
  item.mutable_params()->set_logprobs(2);
  return item;
}

struct Outcome {
  std::map<std::string, RequestResult> results;
  int64_t replayed = 0;
  int64_t computed = 0;
};

// Runs `first` alone for `lead_steps` steps (until done when < 0), then `rest`, on an engine
// over 96 blocks of 16 positions running at most `max_running` sequences.
Outcome RunEngine(CausalLm* model, Backend* backend, bool prefix_cache, int32_t max_running,
                  int64_t max_batch_tokens, std::vector<WorkItem> first, int lead_steps,
                  std::vector<WorkItem> rest) {
  Outcome out;
  KvBlockPoolOptions o{model->CacheSpec(), 96, kBlockSize};
  o.max_sequences = 4;
  auto pool = KvBlockPool::Create(backend, o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return out;
  RequestQueue queue;
  EngineOptions options;
  options.max_batch_tokens = max_batch_tokens;
  options.max_running = max_running;
  options.prefix_cache.enabled = prefix_cache;
  options.prefix_cache.key = "v4";
  auto engine = Engine::Create(model, pool->get(), &queue, nullptr, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return out;
  auto step = [&] {
    auto r = (*engine)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return false;
    for (RequestResult& res : *r) out.results[res.request_id()] = std::move(res);
    return true;
  };
  queue.Push(std::move(first));
  for (int s = 0; (lead_steps < 0 ? (*engine)->HasWork() : s < lead_steps) && s < 500; ++s) {
    if (!step()) return out;
  }
  for (WorkItem& item : rest) {
    // One at a time when max_running is 1: each finds the blocks of those before it cached.
    queue.Push({std::move(item)});
    for (int s = 0; max_running == 1 && (*engine)->HasWork() && s < 500; ++s) {
      if (!step()) return out;
    }
  }
  for (int s = 0; (*engine)->HasWork() && s < 1000; ++s) {
    if (!step()) return out;
  }
  EXPECT_FALSE((*engine)->HasWork()) << "the engine did not finish";
  EXPECT_EQ((*engine)->load().kv_blocks_used, 0) << "blocks leaked";
  EXPECT_EQ((*engine)->preemptions(), 0);
  out.replayed = (*engine)->replayed_tokens();
  out.computed = (*engine)->computed_tokens();
  return out;
}

std::vector<int32_t> Tokens(const RequestResult& r) {
  return {r.token_ids().begin(), r.token_ids().end()};
}
std::vector<float> Logprobs(const RequestResult& r) {
  std::vector<float> v;
  for (const TokenLogprob& lp : r.logprobs()) {
    v.push_back(lp.logprob());
    v.insert(v.end(), lp.top_logprobs().begin(), lp.top_logprobs().end());
    EXPECT_EQ(lp.top_token_ids_size(), 2);
  }
  return v;
}

// `on` and `off` give every request the same tokens and log-probabilities, bit for bit, and
// request `id` reports `cached` prompt tokens (expected: id -> cached).
void ExpectSameOutputs(const Outcome& on, const Outcome& off,
                       const std::map<std::string, int64_t>& cached) {
  ASSERT_EQ(on.results.size(), off.results.size());
  for (const auto& [id, want] : cached) {
    SCOPED_TRACE(id);
    ASSERT_EQ(on.results.count(id), 1u);
    ASSERT_EQ(off.results.count(id), 1u);
    const RequestResult& a = on.results.at(id);
    const RequestResult& b = off.results.at(id);
    ASSERT_EQ(a.error_code(), "") << a.error_message();
    EXPECT_EQ(Tokens(a), Tokens(b));
    EXPECT_EQ(Logprobs(a), Logprobs(b));  // bit for bit
    EXPECT_EQ(Tokens(a).size(), 8u);
    EXPECT_EQ(a.cached_prompt_tokens(), want);
    EXPECT_EQ(b.cached_prompt_tokens(), 0);
  }
}

TEST(V4PrefixCacheTest, HitsOnTheFixturesEqualRunsWithoutTheCache) {
  CpuBackend backend(2);
  struct Case {
    const char* fixture;
    int64_t replay;  // L * (W - 1) + 2 * ratio
    size_t shared1, shared2;
  };
  // dsv4_mix: 4 layers, window 16, ratios 4 and 16: 4 * 15 + 2 * 16 = 92. dsv4_bf16: 5 layers,
  // window 8, ratios 4 and 8: 5 * 7 + 2 * 8 = 51. Both page every entry within a block.
  for (const Case& c : {Case{"dsv4_mix", 92, 200, 256}, Case{"dsv4_bf16", 51, 100, 200}}) {
    SCOPED_TRACE(c.fixture);
    auto m = LoadParityModel(c.fixture, &backend);
    ASSERT_TRUE(m.ok()) << m.status();
    CausalLm* model = m->model.get();
    EXPECT_EQ(model->BoundedReplayStart(1000), 1000 - c.replay);
    const std::vector<int32_t>& p = m->fx.prompts[2].ids;
    const int32_t V = static_cast<int32_t>(model->config().vocab_size);
    auto items = [&] {
      return std::vector<WorkItem>{
          Greedy("r1", Concat(Head(p, c.shared1), Tail(3, 40, V, p[c.shared1]))),
          Greedy("r2", Concat(Head(p, c.shared2), Tail(4, 20, V, p[c.shared2])))};
    };
    // The hits: the shared prefix's full blocks, less the replay.
    const int64_t hit1 = c.shared1 / kBlockSize * kBlockSize,
                  hit2 = c.shared2 / kBlockSize * kBlockSize;
    const std::map<std::string, int64_t> cached = {
        {"r0", 0}, {"r1", hit1 - c.replay}, {"r2", hit2 - c.replay}};
    // One request at a time, the whole prompt in one step.
    for (int64_t budget : {int64_t{512}, int64_t{48}}) {
      SCOPED_TRACE(::testing::Message() << "max_batch_tokens " << budget);
      const Outcome on =
          RunEngine(model, &backend, true, 1, budget, {Greedy("r0", p)}, -1, items());
      const Outcome off =
          RunEngine(model, &backend, false, 1, budget, {Greedy("r0", p)}, -1, items());
      ExpectSameOutputs(on, off, cached);
      EXPECT_EQ(on.replayed, 2 * c.replay);
      EXPECT_EQ(off.replayed, 0);
      EXPECT_EQ(off.computed - on.computed, cached.at("r1") + cached.at("r2"));
    }
    // r1 and r2 admitted together while r0 (which cached the prefix) still decodes: three
    // sequences on the same blocks.
    const Outcome on = RunEngine(model, &backend, true, 3, 512, {Greedy("r0", p)}, 2, items());
    const Outcome off = RunEngine(model, &backend, false, 3, 512, {Greedy("r0", p)}, 2, items());
    ExpectSameOutputs(on, off, cached);
    EXPECT_EQ(on.replayed, 2 * c.replay);
  }
}

// HCA entries of 32 positions span two blocks: blocks are cached and hit two at a time, each
// tagged with the hash of its unit's last block, so a request takes a unit's first block only
// from a sequence whose tokens equal its own through the unit's end (that block holds a slice
// of an entry computed from them).
TEST(V4PrefixCacheTest, EntriesSpanningBlocksEqualRunsWithoutTheCache) {
  CpuBackend backend(2);
  auto model = SpanningModel(&backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t replay = 3 * 7 + 2 * 32;
  EXPECT_EQ((*model)->BoundedReplayStart(1000), 1000 - replay);
  const std::vector<int32_t> x = Tail(7, 300, 512, -1);
  const std::vector<int32_t> t = Tail(8, 50, 512, x[150]);
  auto items = [&] {
    return std::vector<WorkItem>{
        // Leaves x at 150, in block 9: units 0..3 (128 positions) hit; x's block 8 holds the
        // HCA entry of positions 128..159 computed from x's tokens.
        Greedy("a", Concat(Head(x, 150), Tail(9, 50, 512, x[150]))),
        Greedy("c", Concat(Head(x, 150), t)),
        // c's tokens through position 179: blocks 8 and 9 have c's hashes, but the cached
        // block 8 (x's) is tagged with x's block 9: the hit stops at 128 again.
        Greedy("b", Concat(Concat(Head(x, 150), Head(t, 30)), Tail(10, 20, 512, t[30]))),
        // x's first 256 tokens: 8 units.
        Greedy("d", Concat(Head(x, 256), Tail(11, 10, 512, x[256])))};
  };
  const std::map<std::string, int64_t> cached = {
      {"x", 0}, {"a", 128 - replay}, {"c", 128 - replay}, {"b", 128 - replay}, {"d", 256 - replay}};
  const Outcome on = RunEngine(model->get(), &backend, true, 1, 512, {Greedy("x", x)}, -1, items());
  const Outcome off =
      RunEngine(model->get(), &backend, false, 1, 512, {Greedy("x", x)}, -1, items());
  ExpectSameOutputs(on, off, cached);
  EXPECT_EQ(on.replayed, 4 * replay);
}

}  // namespace
}  // namespace deepinfer
