// The model's decode-graph path (DecodeGraphOptions) on a CPU backend that "records" by keeping
// the callable and "replays" by calling it again, with the routed experts on the backend
// (kernels/moe reference functions): runs on CI without a GPU and checks the model's side of
// the design — bucket padding, the padding rows' reserved cache block, EPLB counts of real rows
// only, growing contexts and a batch size that changes between steps, re-recording for a new
// cache — against the same model with graphs off. (A placement switch also drops the
// recordings, but it needs an expert-parallel dispatcher, which never takes this path.) The CUDA
// graph version of these checks is decode_graph_gpu_test.cc.
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/moe_reference.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/decode_graph_test_driver.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using testing::DecodeRun;
using testing::RunDecodeSchedule;

class RecordedCpuOps : public CapturedOps {
 public:
  explicit RecordedCpuOps(std::function<absl::Status()> fn) : fn_(std::move(fn)) {}
  absl::Status Replay() override { return fn_(); }

 private:
  std::function<absl::Status()> fn_;
};

// CpuBackend with Capture (nothing runs while recording; Replay issues the ops again) and
// Backend::RoutedExperts for bf16 experts, so the model can take its decode-graph path.
class RecordingCpuBackend : public CpuBackend {
 public:
  RecordingCpuBackend() : CpuBackend(2, WeightDType::kBFloat16) {}
  bool SupportsCapture() const override { return capture_; }
  using CpuBackend::Capture;
  absl::StatusOr<std::unique_ptr<CapturedOps>> Capture(const std::function<absl::Status()>& record,
                                                       const CaptureOptions& options) override {
    ++captures_;
    capture_tokens_.push_back(options.tokens);
    return std::unique_ptr<CapturedOps>(new RecordedCpuOps(record));
  }
  bool RoutedExperts(const RoutedExpertsArgs& a) override {
    if (a.dtype != WeightDType::kBFloat16 || refuse_experts_) return false;
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
    SiluMul(rows, I, gu.data(), act.data());
    kernels::GroupedGemmBf16Reference(E, p.slot_offsets.data(), static_cast<int32_t>(H),
                                      static_cast<int32_t>(I), act.data(), down, eo.data());
    std::fill(a.out, a.out + a.num_tokens * H, 0.0f);
    kernels::MoeCombineReference(a.num_tokens, a.top_k, H, p.choice_row.data(), a.topk_weights,
                                 eo.data(), a.out);
    return true;
  }
  // A context-dependent attention choice (as CUDA's one-token kernel): with break_ > 0, one-token
  // calls report it, and every call without spans (a recorded step) is checked: its hint must
  // cover the batch's real contexts whenever it is at or below the break.
  int32_t MlaDecodeContextBreak(int32_t num_tokens) const override {
    return num_tokens == 1 ? break_ : 0;
  }
  void MlaAttention(const MlaAttentionArgs& a) override {
    if (a.sequences == nullptr) {
      int32_t longest = 0;  // host memory on the CPU
      for (int32_t t = 0; t < a.num_tokens; ++t) longest = std::max(longest, a.context_len[t]);
      ++hinted_calls_;
      if (a.max_context_hint <= 0 ||
          (a.num_tokens == 1 && break_ > 0 && a.max_context_hint <= break_ &&
           longest > a.max_context_hint)) {
        ++bad_hints_;
      }
      if (a.num_tokens == 1 && break_ > 0) ++(longest <= break_ ? short_calls_ : long_calls_);
    }
    CpuBackend::MlaAttention(a);
  }
  bool capture_ = true;
  bool refuse_experts_ = false;
  int captures_ = 0;
  std::vector<int64_t> capture_tokens_;  // CaptureOptions::tokens of each recording
  int32_t break_ = 0;
  int64_t hinted_calls_ = 0, bad_hints_ = 0, short_calls_ = 0, long_calls_ = 0;
};

std::unique_ptr<CausalLm> Load(Backend* backend, const DecodeGraphOptions& options) {
  static const std::string spec =
      testing::WriteDummyModelSpec(testing::TinyMoeShape{}, "decode_graph_tiny", 5);
  return testing::LoadWithDecodeGraphs(spec, backend, options);
}

using testing::ExpectBitIdentical;
using testing::Total;
const std::vector<int64_t>& kSchedule = testing::DecodeSchedule();

TEST(DecodeGraphTest, BucketsAreCappedAndEndAtTheMax) {
  EXPECT_EQ(DecodeGraphBuckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(DecodeGraphBuckets(100),
            (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100}));
  EXPECT_EQ(DecodeGraphBuckets(256).back(), 256);
  EXPECT_EQ(DecodeGraphBuckets(256).size(), 14u);
  EXPECT_EQ(DecodeGraphBuckets(400), (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128,
                                                           160, 192, 256, 320, 384, 400}));
}

// Graph steps against the same model with graphs off: the same tokens, logprobs and EPLB counts
// (on the CPU every row's arithmetic is independent of the batch size, so padding changes no
// bit), with and without replay.
TEST(DecodeGraphTest, PaddedReplayedStepsEqualEagerSteps) {
  RecordingCpuBackend backend;
  DecodeGraphOptions on, padded_eager, off;
  padded_eager.replay = false;
  off.enabled = false;
  auto graphs = Load(&backend, on);
  auto eager_padded = Load(&backend, padded_eager);
  auto eager = Load(&backend, off);
  ASSERT_TRUE(graphs && eager_padded && eager);

  auto a = RunDecodeSchedule(graphs.get(), &backend, kSchedule, 100);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager_padded.get(), &backend, kSchedule, 100);
  ASSERT_TRUE(b.ok()) << b.status();
  auto c = RunDecodeSchedule(eager.get(), &backend, kSchedule, 100);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectBitIdentical(*a, *b);
  ExpectBitIdentical(*a, *c);

  // Every decode step took the graph path; one recording per bucket used (1 4 8 64 100 2), each
  // telling the backend its bucket's tokens (100 requests run in bucket 128).
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(kSchedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6);
  EXPECT_EQ(backend.capture_tokens_, (std::vector<int64_t>{1, 4, 8, 64, 128, 2}));
  EXPECT_EQ(eager_padded->decode_graph_steps(), static_cast<int64_t>(kSchedule.size()));
  EXPECT_EQ(eager_padded->decode_graphs_recorded(), 0);
  EXPECT_EQ(eager->decode_graph_steps(), 0);
  // EPLB counted the real rows only: every token once per MoE layer and choice.
  int64_t decoded = 0;
  for (int64_t n : kSchedule) decoded += n;
  const ModelConfig& mc = graphs->config();
  EXPECT_EQ(Total(a->counts),
            (a->prefill_tokens + decoded) * mc.num_experts_per_tok * graphs->num_moe_layers());
}

// Verification steps (1 + 3 rows per verified sequence, plain decodes among them, hidden states
// wanted, one row with a logit adjustment) take the graph path, each row a bucket row of its own,
// with the general path's picks, logprobs and hidden states bit for bit; a batch of more rows
// than the largest bucket runs the general path.
TEST(DecodeGraphTest, VerificationRowsReplayAndEqualEagerSteps) {
  RecordingCpuBackend backend;
  DecodeGraphOptions off;
  off.enabled = false;
  auto graphs = Load(&backend, DecodeGraphOptions{});
  auto eager = Load(&backend, off);
  ASSERT_TRUE(graphs && eager);
  // 40 sequences: 14 plain decodes + 26 x 4 verification rows = 118 rows, bucket 128.
  auto a = testing::RunVerifySteps(graphs.get(), &backend, 40, 3, 4);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = testing::RunVerifySteps(eager.get(), &backend, 40, 3, 4);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectBitIdentical(*a, *b);
  EXPECT_EQ(graphs->decode_graph_steps(), 4);
  EXPECT_EQ(eager->decode_graph_steps(), 0);
  EXPECT_EQ(backend.capture_tokens_.back(), 128);
  // The adjusted row picked its biased token; a verified sequence's hidden rows are its 4 rows.
  const int64_t hidden = graphs->config().hidden_size;
  for (size_t s = 0; s < a->tokens.size(); ++s) {
    EXPECT_EQ(a->tokens[s][1][2], static_cast<int32_t>((s * 11 + 5) % graphs->config().vocab_size));
    EXPECT_EQ(a->hidden[s][1].size(), static_cast<size_t>(4 * hidden));
    EXPECT_EQ(a->hidden[s][0].size(), static_cast<size_t>(hidden));
  }

  // Sampled rows (testing::MixedSampling, each verified row with its own position's key) take
  // the same path with the general path's picks and logprobs.
  auto e = testing::RunVerifySteps(graphs.get(), &backend, 40, 3, 4, testing::MixedSampling);
  ASSERT_TRUE(e.ok()) << e.status();
  auto f = testing::RunVerifySteps(eager.get(), &backend, 40, 3, 4, testing::MixedSampling);
  ASSERT_TRUE(f.ok()) << f.status();
  ExpectBitIdentical(*e, *f);
  EXPECT_EQ(graphs->decode_graph_steps(), 8);
  EXPECT_NE(e->tokens, a->tokens);

  // 100 sequences: 34 + 66 x 4 = 298 rows, more than bucket 256: the general path.
  DecodeGraphOptions small;
  small.max_batch = 256;
  auto over = Load(&backend, small);
  ASSERT_TRUE(over);
  auto c = testing::RunVerifySteps(over.get(), &backend, 100, 3, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  auto d = testing::RunVerifySteps(eager.get(), &backend, 100, 3, 2);
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectBitIdentical(*c, *d);
  EXPECT_EQ(over->decode_graph_steps(), 0);
}

// Greedy steps with logit adjustments (logit_bias, min_tokens masks, penalties) take graphs of
// their own, with the results of the general path (DeviceSampler) bit for bit; a step with more
// entries than a graph has room for records a larger one.
TEST(DecodeGraphTest, AdjustedGreedyStepsReplayAndEqualEagerSteps) {
  RecordingCpuBackend backend;
  DecodeGraphOptions off;
  off.enabled = false;
  auto graphs = Load(&backend, DecodeGraphOptions{});
  auto eager = Load(&backend, off);
  ASSERT_TRUE(graphs && eager);
  const int64_t vocab = graphs->config().vocab_size;
  // Step 5 (100 sequences x 27 entries) needs more room than the 1024 of bucket 128's graph.
  auto adjust = [vocab](int64_t seq, size_t step) {
    std::set<int32_t> tokens = {static_cast<int32_t>((seq * 31 + step * 7) % vocab),
                                static_cast<int32_t>((seq * 13 + 1) % vocab)};
    for (int k = 0; step == 5 && k < 25; ++k) {
      tokens.insert(static_cast<int32_t>((seq * 5 + k * 41) % vocab));
    }
    std::vector<LogitAdjustment> out;
    for (int32_t t : tokens) {
      LogitAdjustment a;
      a.token = t;
      a.bias = t % 3 == 0 ? 4.0f : (t % 3 == 1 ? -std::numeric_limits<float>::infinity() : 0.5f);
      a.repetition = t % 2 == 0 ? 1.5f : 1.0f;
      a.subtract = t % 5 == 0 ? 0.75f : 0.0f;
      out.push_back(a);
    }
    return out;
  };
  auto adjusted = [&adjust](int64_t seq, size_t step, SamplingParams* p) {
    p->adjustments = adjust(seq, step);
  };
  auto a = RunDecodeSchedule(graphs.get(), &backend, kSchedule, 100, nullptr, adjusted);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager.get(), &backend, kSchedule, 100, nullptr, adjusted);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectBitIdentical(*a, *b);
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(kSchedule.size()));
  // Buckets 1 4 8 64 128 2, and 128 again with room for 4096 entries.
  EXPECT_EQ(graphs->decode_graphs_recorded(), 7);
  // The adjustments changed the tokens.
  auto plain = RunDecodeSchedule(eager.get(), &backend, kSchedule, 100);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NE(plain->tokens, a->tokens);
}

// Sampled rows (temperature, top_k, top_p, a seed each; testing::MixedSampling) among greedy
// ones take the same graphs as greedy batches (no more recordings), with the picks and logprobs
// of the general path (DeviceSampler, whose CPU ops are Sampler itself) bit for bit: mixed
// batches, all-greedy and all-sampled ones, padding, seeds shared by several requests. With
// logit adjustments on some rows they take the adjusted graphs, again bit for bit; rows that
// want top logprobs run the general path.
TEST(DecodeGraphTest, SampledStepsReplayAndEqualEagerSteps) {
  RecordingCpuBackend backend;
  DecodeGraphOptions off;
  off.enabled = false;
  auto graphs = Load(&backend, DecodeGraphOptions{});
  auto eager = Load(&backend, off);
  ASSERT_TRUE(graphs && eager);
  const testing::StepSampling mixed = testing::MixedSampling;
  auto a = RunDecodeSchedule(graphs.get(), &backend, kSchedule, 100, nullptr, mixed);
  ASSERT_TRUE(a.ok()) << a.status();
  auto c = RunDecodeSchedule(eager.get(), &backend, kSchedule, 100, nullptr, mixed);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectBitIdentical(*a, *c);
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(kSchedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6);  // buckets 1 4 8 64 128 2, as greedy steps
  EXPECT_EQ(eager->decode_graph_steps(), 0);
  // Sampling took effect: greedy steps on the same inputs pick other tokens somewhere.
  auto greedy = RunDecodeSchedule(eager.get(), &backend, kSchedule, 100, /*forced=*/&*a);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_TRUE(testing::DiffersSomewhere(*a, *greedy));

  // Logit adjustments on every third sequence: the adjusted graphs.
  const int64_t vocab = graphs->config().vocab_size;
  auto mixed_adjusted = [vocab](int64_t seq, size_t step, SamplingParams* p) {
    testing::MixedSampling(seq, step, p);
    if (seq % 3 != 0) return;
    LogitAdjustment boost, ban;  // tokens ascending
    boost.token = static_cast<int32_t>((seq * 31 + step * 7) % (vocab - 1));
    boost.bias = 3.0f;
    boost.repetition = 1.3f;
    ban.token = boost.token + 1;
    ban.bias = -std::numeric_limits<float>::infinity();
    p->adjustments = {boost, ban};
  };
  auto d = RunDecodeSchedule(graphs.get(), &backend, kSchedule, 100, nullptr, mixed_adjusted);
  ASSERT_TRUE(d.ok()) << d.status();
  auto e = RunDecodeSchedule(eager.get(), &backend, kSchedule, 100, nullptr, mixed_adjusted);
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectBitIdentical(*d, *e);
  EXPECT_EQ(graphs->decode_graph_steps(), 2 * static_cast<int64_t>(kSchedule.size()));
  // Adjusted graphs for the same buckets, bucket 1 twice: its first step (sequence 0 greedy)
  // takes the variant without sampled picks, step 9 (sequence 0 sampled) the one with them.
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6 + 7);

  // Top logprobs on one sampled row: the general path, same results as with graphs off.
  auto top = [](int64_t seq, size_t step, SamplingParams* p) {
    testing::MixedSampling(seq, step, p);
    if (seq == 1) p->num_logprobs = 2;
  };
  const std::vector<int64_t> schedule = {3, 3};
  auto f = RunDecodeSchedule(graphs.get(), &backend, schedule, 3, nullptr, top);
  ASSERT_TRUE(f.ok()) << f.status();
  auto g = RunDecodeSchedule(eager.get(), &backend, schedule, 3, nullptr, top);
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectBitIdentical(*f, *g);
  EXPECT_EQ(graphs->decode_graph_steps(), 2 * static_cast<int64_t>(kSchedule.size()));
}

// A new cache (its addresses are in the recordings) records the buckets again; the results
// are those of the first cache.
TEST(DecodeGraphTest, NewCacheRecordsAgain) {
  RecordingCpuBackend backend;
  auto model = Load(&backend, DecodeGraphOptions{});
  ASSERT_TRUE(model);
  const std::vector<int64_t> schedule = {3, 3, 7};
  auto first = RunDecodeSchedule(model.get(), &backend, schedule, 8);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(model->decode_graphs_recorded(), 2);  // buckets 4 and 8
  auto second = RunDecodeSchedule(model.get(), &backend, schedule, 8);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(model->decode_graphs_recorded(), 4);
  ExpectBitIdentical(*first, *second);
}

// Start-up recording (CausalLm::CaptureDecodeGraphs): every bucket up to the options' largest is
// recorded before any step (bucket 1 once per context class, every bucket once per table class),
// on padding rows only (they count no EPLB load and touch no sequence's entries); the decode
// steps then replay them without recording more, with the results of graphs recorded on first
// use.
TEST(DecodeGraphTest, RecordedAtStartUpThenReplayed) {
  RecordingCpuBackend backend;
  backend.break_ = 8;
  DecodeGraphOptions options;
  options.max_batch = 16;
  auto lazy = Load(&backend, options);
  auto upfront = Load(&backend, options);
  ASSERT_TRUE(lazy && upfront);
  const std::vector<int64_t> schedule = {1, 1, 3, 5, 9, 16, 2, 16};
  auto want = RunDecodeSchedule(lazy.get(), &backend, schedule, 16);
  ASSERT_TRUE(want.ok()) << want.status();
  int recorded = -1;
  auto got = RunDecodeSchedule(upfront.get(), &backend, schedule, 16, nullptr, nullptr,
                               [&](KvBlockPool* pool) -> absl::Status {
                                 absl::StatusOr<int> r = upfront->CaptureDecodeGraphs(pool);
                                 if (!r.ok()) return r.status();
                                 recorded = *r;
                                 return absl::OkStatus();
                               });
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectBitIdentical(*want, *got);
  // Per table class (16 blocks, 64, ... up to the pool's size: more than one here), buckets 1
  // (twice), 2, 4, 8, 16; the steps record none.
  EXPECT_GT(recorded, 6);
  EXPECT_EQ(recorded % 6, 0);
  EXPECT_EQ(upfront->decode_graphs_recorded(), recorded);
  EXPECT_EQ(upfront->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(backend.bad_hints_, 0);
}

// Where the backend cannot record, or refuses the routed experts on the device, steps take the
// A backend whose one-token attention depends on the context (MlaDecodeContextBreak): bucket 1
// gets a graph per side of the break, each replayed only for batches on its side (the hint
// covers the real contexts), other buckets one graph; results as with graphs off.
TEST(DecodeGraphTest, OneTokenBucketHasAGraphPerContextClass) {
  RecordingCpuBackend backend;
  backend.break_ = 8;
  auto graphs = Load(&backend, DecodeGraphOptions{});
  DecodeGraphOptions off;
  off.enabled = false;
  auto eager = Load(&backend, off);
  ASSERT_TRUE(graphs && eager);
  // Sequence 0 has a 1-token prompt: its contexts 2, 3, ... cross the break at the 8th step;
  // bucket 2 in between, and bucket 1 below the break again never happens (contexts grow).
  const std::vector<int64_t> schedule = {1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1};
  auto a = RunDecodeSchedule(graphs.get(), &backend, schedule, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(backend.bad_hints_, 0);
  EXPECT_GT(backend.short_calls_, 0);
  EXPECT_GT(backend.long_calls_, 0);
  EXPECT_GT(backend.hinted_calls_, 0);
  auto b = RunDecodeSchedule(eager.get(), &backend, schedule, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectBitIdentical(*a, *b);
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 3);  // bucket 1 twice, bucket 2 once
}

// general path with the same results.
TEST(DecodeGraphTest, FallsBackWhenRecordingOrDeviceExpertsAreUnavailable) {
  RecordingCpuBackend backend;
  auto reference = Load(&backend, DecodeGraphOptions{});
  ASSERT_TRUE(reference);
  const std::vector<int64_t> schedule = {5, 5, 2};
  auto want = RunDecodeSchedule(reference.get(), &backend, schedule, 5);
  ASSERT_TRUE(want.ok()) << want.status();

  backend.capture_ = false;
  auto no_capture = Load(&backend, DecodeGraphOptions{});
  auto got = RunDecodeSchedule(no_capture.get(), &backend, schedule, 5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(no_capture->decode_graph_steps(), 0);
  ExpectBitIdentical(*want, *got);

  backend.capture_ = true;
  backend.refuse_experts_ = true;
  auto refused = Load(&backend, DecodeGraphOptions{});
  got = RunDecodeSchedule(refused.get(), &backend, schedule, 5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(refused->decode_graph_steps(), 0);
  EXPECT_EQ(refused->decode_graphs_recorded(), 0);
  // The dispatcher path computes the experts its own way: same tokens, counts exactly equal.
  EXPECT_EQ(got->counts, want->counts);
  EXPECT_EQ(Total(got->counts), Total(want->counts));
}

}  // namespace
}  // namespace deepinfer
