// DeepseekV4Model's decode-graph path on a CPU backend that "records" by keeping the callable and
// "replays" by calling it again, with the routed experts on the backend (kernels/moe reference
// functions, V4's clamped SwiGLU): runs on CI without a GPU and checks the model's side — the
// padded plan (every row a candidate window, padding rows writing nothing, the plan uploaded
// into the bucket's fixed buffer), growing contexts across window and compressor boundaries,
// HCA entries spread over blocks, a batch size that changes between steps, EPLB counts of real
// rows only — against the same model with graphs off (the exact plan of the general path): the
// same tokens and logprobs bit for bit, for greedy and sampled rows.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/moe_reference.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

class RecordedCpuOps : public CapturedOps {
 public:
  explicit RecordedCpuOps(std::function<absl::Status()> fn) : fn_(std::move(fn)) {}
  absl::Status Replay() override { return fn_(); }

 private:
  std::function<absl::Status()> fn_;
};

// CpuBackend with Capture (nothing runs while recording; Replay issues the ops again) and
// Backend::RoutedExperts for bf16 experts with V4's clamp, so the model takes its graph path.
class RecordingCpuBackend : public CpuBackend {
 public:
  RecordingCpuBackend() : CpuBackend(2, WeightDType::kBFloat16) {}
  bool SupportsCapture() const override { return true; }
  using CpuBackend::Capture;
  absl::StatusOr<std::unique_ptr<CapturedOps>> Capture(const std::function<absl::Status()>& record,
                                                       const CaptureOptions& options) override {
    ++captures_;
    return std::unique_ptr<CapturedOps>(new RecordedCpuOps(record));
  }
  bool RoutedExperts(const RoutedExpertsArgs& a) override {
    if (a.dtype != WeightDType::kBFloat16 || refuse_experts_) return false;
    ++routed_calls_;
    const int32_t E = a.num_experts;
    kernels::MoePermutation p = kernels::MoePermuteReference(
        a.num_tokens, a.top_k, E, E, a.topk_ids, a.slot_of_expert, a.hidden_size, a.hidden);
    std::vector<const uint16_t*> gate_up(E), down(E);
    for (int32_t e = 0; e < E; ++e) {
      gate_up[e] = static_cast<const uint16_t*>(a.gate_up[e]);
      down[e] = static_cast<const uint16_t*>(a.down[e]);
    }
    const int64_t rows = p.slot_offsets.back(), H = a.hidden_size, I = a.inter;
    std::vector<float> gu(std::max<int64_t>(1, rows * 2 * I)), act(std::max<int64_t>(1, rows * I)),
        eo(std::max<int64_t>(1, rows * H));
    kernels::GroupedGemmBf16Reference(E, p.slot_offsets.data(), static_cast<int32_t>(2 * I),
                                      static_cast<int32_t>(H), p.permuted_hidden.data(), gate_up,
                                      gu.data());
    v4_ops()->SwiGluClamped(rows, I, gu.data(), a.swiglu_limit, act.data());
    kernels::GroupedGemmBf16Reference(E, p.slot_offsets.data(), static_cast<int32_t>(H),
                                      static_cast<int32_t>(I), act.data(), down, eo.data());
    std::fill(a.out, a.out + a.num_tokens * H, 0.0f);
    kernels::MoeCombineReference(a.num_tokens, a.top_k, H, p.choice_row.data(), a.topk_weights,
                                 eo.data(), a.out);
    return true;
  }
  bool refuse_experts_ = false;
  int captures_ = 0;
  int64_t routed_calls_ = 0;
};

struct DecodeRun {
  std::vector<std::vector<int32_t>> tokens;  // per decode step, per sequence of the step
  std::vector<std::vector<float>> logprobs;
  std::vector<int64_t> counts;  // TakeExpertCounts after the run (prefill included)
  int64_t prefill_tokens = 0;
};

std::string Config(const std::string& fixture) {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/" + fixture + "/config.json";
}

std::unique_ptr<CausalLm> Load(Backend* backend, const std::string& fixture,
                               const DecodeGraphOptions& options) {
  auto model = LoadModel("dummy:" + Config(fixture) + "@11", backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  (*model)->SetDecodeGraphOptions(options);
  return std::move(*model);
}

// Prefills num_seqs prompts (lengths 1..61, 16 sequences a step) in a fresh cache of
// `block_size` blocks, then one decode step (sampled on the device, no logits) per schedule
// entry n over sequences 0..n-1: greedy, unless `sampling` sets sequence i's parameters for
// step s (sampling(i, s, &p)).
absl::StatusOr<DecodeRun> RunDecodeSchedule(
    CausalLm* model, Backend* backend, const std::vector<int64_t>& schedule, int64_t num_seqs,
    int32_t block_size, const std::function<absl::Status(KvBlockPool*)>& on_pool = nullptr,
    const std::function<void(int64_t, size_t, SamplingParams*)>& sampling = nullptr) {
  const int64_t vocab = model->config().vocab_size;
  std::vector<SequenceStep> seqs(num_seqs);
  int64_t blocks = 1;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t len = 1 + (i * 37) % 61;
    for (int64_t j = 0; j < len; ++j) {
      seqs[i].tokens.push_back(static_cast<int32_t>((i * 131 + j * 7 + 3) % vocab));
    }
    blocks += (len + static_cast<int64_t>(schedule.size()) + block_size) / block_size;
  }
  KvBlockPoolOptions o{model->CacheSpec(), static_cast<int32_t>(blocks), block_size};
  o.max_sequences = static_cast<int32_t>(num_seqs);
  auto pool = KvBlockPool::Create(backend, o);
  if (!pool.ok()) return pool.status();
  if (on_pool) {
    if (absl::Status st = on_pool(pool->get()); !st.ok()) return st;
  }
  DecodeRun run;
  for (SequenceStep& s : seqs) {
    auto b = (*pool)->Allocate((*pool)->BlocksFor(static_cast<int64_t>(s.tokens.size()) +
                                                  static_cast<int64_t>(schedule.size())));
    if (!b.ok()) return b.status();
    s.block_table = std::move(*b);
    s.sampling = SamplingParams{};
    s.return_logits = false;
    run.prefill_tokens += static_cast<int64_t>(s.tokens.size());
  }
  for (int64_t i = 0; i < num_seqs; i += 16) {
    std::vector<SequenceStep> chunk(seqs.begin() + i,
                                    seqs.begin() + std::min<int64_t>(num_seqs, i + 16));
    auto out = model->Step(chunk, pool->get());
    if (!out.ok()) return out.status();
    for (size_t j = 0; j < chunk.size(); ++j) {
      SequenceStep& s = seqs[i + j];
      s.position_offset = static_cast<int64_t>(s.tokens.size());
      s.tokens = {out->sampled[j].token};
    }
  }
  for (size_t step = 0; step < schedule.size(); ++step) {
    const int64_t n = schedule[step];
    std::vector<SequenceStep> batch(seqs.begin(), seqs.begin() + n);
    if (sampling) {
      for (int64_t i = 0; i < n; ++i) sampling(i, step, &*batch[i].sampling);
    }
    auto out = model->Step(batch, pool->get());
    if (!out.ok()) return out.status();
    run.tokens.emplace_back();
    run.logprobs.emplace_back();
    for (int64_t i = 0; i < n; ++i) {
      run.tokens.back().push_back(out->sampled[i].token);
      run.logprobs.back().push_back(out->sampled[i].logprob);
      seqs[i].position_offset += 1;
      seqs[i].tokens = {out->sampled[i].token};
    }
  }
  run.counts = model->TakeExpertCounts();
  return run;
}

void ExpectBitIdentical(const DecodeRun& a, const DecodeRun& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (size_t s = 0; s < a.tokens.size(); ++s) {
    ASSERT_EQ(a.tokens[s], b.tokens[s]) << "step " << s;
    ASSERT_EQ(std::memcmp(a.logprobs[s].data(), b.logprobs[s].data(),
                          a.logprobs[s].size() * sizeof(float)),
              0)
        << "step " << s;
  }
  EXPECT_EQ(a.counts, b.counts);
}

// Batch sizes 1 .. 40 (buckets 1, 2, 4, 8, 24, 48 with padding), revisited, over 36 steps: every
// sequence of the first few crosses several CSA windows (4) and an HCA window (16 or 8).
std::vector<int64_t> Schedule() {
  std::vector<int64_t> s;
  for (int i = 0; i < 6; ++i) {
    for (int64_t n : {1, 3, 5, 40, 17, 2}) s.push_back(n);
  }
  return s;
}

struct Case {
  std::string fixture;
  int32_t block_size;
};

class V4DecodeGraphTest : public ::testing::TestWithParam<Case> {};

TEST_P(V4DecodeGraphTest, PaddedReplayedStepsEqualTheGeneralPath) {
  const Case& c = GetParam();
  RecordingCpuBackend backend;
  DecodeGraphOptions on, padded_eager, off;
  padded_eager.replay = false;
  off.enabled = false;
  auto graphs = Load(&backend, c.fixture, on);
  auto eager_padded = Load(&backend, c.fixture, padded_eager);
  auto eager = Load(&backend, c.fixture, off);
  ASSERT_TRUE(graphs && eager_padded && eager);
  const std::vector<int64_t> schedule = Schedule();
  const int64_t num_seqs = 40;

  auto a = RunDecodeSchedule(graphs.get(), &backend, schedule, num_seqs, c.block_size);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager_padded.get(), &backend, schedule, num_seqs, c.block_size);
  ASSERT_TRUE(b.ok()) << b.status();
  auto d = RunDecodeSchedule(eager.get(), &backend, schedule, num_seqs, c.block_size);
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectBitIdentical(*a, *d);
  ExpectBitIdentical(*b, *d);

  // Every decode step took the graph path, one recording per bucket used (1 4 8 48 24 2); in
  // blocks of 4 the tables outgrow the first table class (16 blocks, 64 positions) after the
  // first round of the schedule, and the buckets of the steps with wider tables get a graph of
  // the next class (64 blocks): 4 of the 6.
  const int recordings = c.block_size == 4 ? 10 : 6;
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), recordings);
  EXPECT_EQ(backend.captures_, recordings);
  EXPECT_EQ(eager_padded->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(eager->decode_graph_steps(), 0);
  // EPLB counted the real rows only: every token once per layer and choice.
  int64_t decoded = 0;
  for (int64_t n : schedule) decoded += n;
  int64_t total = 0;
  for (int64_t x : a->counts) total += x;
  EXPECT_EQ(total, (a->prefill_tokens + decoded) * graphs->config().num_experts_per_tok *
                       graphs->num_moe_layers());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4DecodeGraphTest,
                         ::testing::Values(Case{"dsv4_mix", 16}, Case{"dsv4_mix", 4},
                                           Case{"dsv4_bf16", 16}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.fixture + "_block" +
                                  std::to_string(info.param.block_size);
                         });

// Sampled rows among greedy ones (temperature, top_k, top_p, a seed each; a sequence greedy at
// every third step) replay the greedy steps' graphs with the general path's tokens and logprobs
// bit for bit.
TEST(V4DecodeGraphSampledTest, SampledStepsEqualTheGeneralPath) {
  RecordingCpuBackend backend;
  DecodeGraphOptions off;
  off.enabled = false;
  auto graphs = Load(&backend, "dsv4_mix", DecodeGraphOptions{});
  auto eager = Load(&backend, "dsv4_mix", off);
  ASSERT_TRUE(graphs && eager);
  auto sampling = [](int64_t seq, size_t step, SamplingParams* p) {
    if ((seq + static_cast<int64_t>(step)) % 3 == 0) return;
    p->temperature = seq % 2 == 0 ? 0.8f : 1.2f;
    p->top_p = seq % 2 == 0 ? 0.95f : 1.0f;
    p->top_k = seq % 4 == 1 ? 20 : 0;
    p->seed = static_cast<uint64_t>(seq);
  };
  const std::vector<int64_t> schedule = {1, 3, 5, 40, 17, 2, 1, 40};
  auto a = RunDecodeSchedule(graphs.get(), &backend, schedule, 40, 16, nullptr, sampling);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager.get(), &backend, schedule, 40, 16, nullptr, sampling);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectBitIdentical(*a, *b);
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6);  // buckets 1 4 8 48 24 2
  auto greedy = RunDecodeSchedule(eager.get(), &backend, schedule, 40, 16);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_NE(greedy->tokens, a->tokens);
}

// Graphs recorded at start-up (CausalLm::CaptureDecodeGraphs: every bucket over its padding
// rows' plan) are replayed by the steps that follow, with the general path's results.
// In blocks of 4 the contexts outgrow the first table class (64 positions) and the steps replay
// the next class's graphs, recorded at start-up too.
TEST(V4DecodeGraphStartupTest, ContextsPastTheFirstTableClassRecordNothing) {
  RecordingCpuBackend backend;
  DecodeGraphOptions on, off;
  on.max_batch = 48;
  off.enabled = false;
  auto graphs = Load(&backend, "dsv4_mix", on);
  auto eager = Load(&backend, "dsv4_mix", off);
  ASSERT_TRUE(graphs && eager);
  const std::vector<int64_t> schedule = Schedule();
  int recorded = -1;
  auto a = RunDecodeSchedule(graphs.get(), &backend, schedule, 40, 4, [&](KvBlockPool* pool) {
    graphs->PrepareCache(pool);
    absl::StatusOr<int> n = graphs->CaptureDecodeGraphs(pool);
    if (!n.ok()) return n.status();
    recorded = *n;
    return absl::OkStatus();
  });
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager.get(), &backend, schedule, 40, 4);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectBitIdentical(*a, *b);
  EXPECT_GT(recorded, 8);                  // more than one table class
  EXPECT_EQ(backend.captures_, recorded);  // nothing recorded after start-up
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
}

TEST(V4DecodeGraphStartupTest, GraphsRecordedAtStartUpReplayWithTheGeneralPathsResults) {
  RecordingCpuBackend backend;
  DecodeGraphOptions on, off;
  on.max_batch = 48;  // buckets 1 2 4 8 16 24 32 48
  off.enabled = false;
  auto graphs = Load(&backend, "dsv4_mix", on);
  auto eager = Load(&backend, "dsv4_mix", off);
  ASSERT_TRUE(graphs && eager);
  const std::vector<int64_t> schedule = Schedule();
  int recorded = -1;
  auto a = RunDecodeSchedule(graphs.get(), &backend, schedule, 40, 16, [&](KvBlockPool* pool) {
    graphs->PrepareCache(pool);
    absl::StatusOr<int> n = graphs->CaptureDecodeGraphs(pool);
    if (!n.ok()) return n.status();
    recorded = *n;
    return absl::OkStatus();
  });
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager.get(), &backend, schedule, 40, 16);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectBitIdentical(*a, *b);
  // Buckets 1 .. 48 once per table class (16 blocks, then the fixture's 1024 positions: 64).
  EXPECT_EQ(recorded, 16);
  EXPECT_EQ(backend.captures_, 16);  // nothing recorded after start-up
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
}

// Where the backend cannot run the routed experts on the device, the device-only step refuses
// (FAILED_PRECONDITION, before counting anything) and every bucket falls back to the general
// path: the results and EPLB counts are the general path's.
TEST(V4DecodeGraphFallbackTest, NoDeviceExpertsMeansTheGeneralPath) {
  RecordingCpuBackend backend;
  backend.refuse_experts_ = true;
  DecodeGraphOptions on, off;
  off.enabled = false;
  auto graphs = Load(&backend, "dsv4_mix", on);
  auto eager = Load(&backend, "dsv4_mix", off);
  ASSERT_TRUE(graphs && eager);
  const std::vector<int64_t> schedule = {1, 3, 5, 3, 1};
  auto a = RunDecodeSchedule(graphs.get(), &backend, schedule, 8, 16);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager.get(), &backend, schedule, 8, 16);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectBitIdentical(*a, *b);
  EXPECT_EQ(graphs->decode_graph_steps(), 0);
  EXPECT_EQ(backend.captures_, 0);
  EXPECT_EQ(backend.routed_calls_, 0);
}

}  // namespace
}  // namespace deepinfer
