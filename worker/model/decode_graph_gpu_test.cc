// Decode steps replayed from CUDA graphs (DecodeGraphOptions) on the GPU, bf16 dummy weights of
// a small DeepSeek-V3 shape, batch sizes 1 3 5 64 100 changing between steps (padded to the
// buckets 1 4 8 64 128 and 2), contexts growing step by step:
//  * replayed steps give bit-identical tokens, logprobs and EPLB counts to the same padded
//    steps run eagerly (DecodeGraphOptions::replay = false): what recording may not change;
//  * against plain eager steps (graphs off, no padding) on the same inputs: cuBLAS may pick
//    other GEMM kernels for other row counts, so bits may differ; tokens must agree (>= 99% of
//    them, printed) and logprobs stay within 1e-3 — and EPLB counted exactly the real rows;
//  * a new KV cache records again, with the same results; op timing turns graphs off;
//  * bucket 1 records a graph per side of the one-token attention kernel's context break;
//  * the dense layer through the fused MoE kernels at one token (Backend::NormedDenseMlp);
//  * greedy steps with logit adjustments (logit_bias, min_tokens masks, penalties) replay
//    graphs of their own, bit-identical to the padded eager steps, and follow the general
//    path (DeviceSampler) on the same inputs as closely as plain steps do;
//  * sampled rows (temperature, top_k, top_p, seeds) among greedy ones replay the same graphs,
//    bit-identical to the padded eager steps, and follow the general path as closely as greedy
//    steps do; with adjustments on some rows, the adjusted graphs;
//  * speculative decoding's verification steps (several rows per sequence, hidden states,
//    greedy and sampled rows) replay bit-identical to the padded eager steps.
// Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/model/decode_graph_test_driver.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using testing::DecodeRun;
using testing::RunDecodeSchedule;

testing::TinyMoeShape GpuShape() {
  testing::TinyMoeShape s;
  s.hidden = 1024;
  s.heads = 8;
  s.kv_lora = 512;
  s.nope = 128;
  s.rope = 64;
  s.v = 128;
  s.layers = 4;
  s.experts = 64;
  s.top_k = 6;
  s.moe_inter = 256;
  s.inter = 2048;
  s.vocab = 16384;
  return s;
}

std::unique_ptr<CausalLm> Load(Backend* backend, const DecodeGraphOptions& options) {
  static const std::string spec = testing::WriteDummyModelSpec(GpuShape(), "decode_graph_gpu", 9);
  return testing::LoadWithDecodeGraphs(spec, backend, options);
}

using testing::ExpectBitIdentical;
using testing::Total;
const std::vector<int64_t>& kSchedule = testing::DecodeSchedule();

class DecodeGraphGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!deepinfer::testing::HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }
  // The model three ways on backend_: decode graphs recorded and replayed, the same padded
  // steps run eagerly (replay off), and graphs off (plain eager steps).
  struct ThreeWays {
    std::unique_ptr<CausalLm> graphs, eager_padded, eager;
  };
  ThreeWays LoadThreeWays() {
    DecodeGraphOptions on, padded_eager, off;
    padded_eager.replay = false;
    off.enabled = false;
    return {Load(backend_.get(), on), Load(backend_.get(), padded_eager),
            Load(backend_.get(), off)};
  }
  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(DecodeGraphGpuTest, ReplayEqualsPaddedEagerBitForBitAndPlainEagerClosely) {
  ThreeWays m = LoadThreeWays();
  auto& [graphs, eager_padded, eager] = m;
  ASSERT_TRUE(graphs && eager_padded && eager);

  auto a = RunDecodeSchedule(graphs.get(), backend_.get(), kSchedule, 100);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager_padded.get(), backend_.get(), kSchedule, 100);
  ASSERT_TRUE(b.ok()) << b.status();
  auto c = RunDecodeSchedule(eager.get(), backend_.get(), kSchedule, 100, /*forced=*/&*a);
  ASSERT_TRUE(c.ok()) << c.status();

  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(kSchedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6);  // buckets 1 4 8 64 128 2
  EXPECT_EQ(eager_padded->decode_graphs_recorded(), 0);
  EXPECT_EQ(eager->decode_graph_steps(), 0);
  ExpectBitIdentical(*a, *b);

  // Plain eager on the same inputs.
  const testing::TokenAgreement agree = testing::CompareTokens(*a, *c);
  const int64_t same = agree.same, all = agree.all;
  const double worst = agree.worst_logprob_diff;
  std::printf(
      "[decode-graphs] replay vs plain eager: %lld / %lld tokens equal, max |logprob "
      "diff| %.3g\n",
      static_cast<long long>(same), static_cast<long long>(all), worst);
  EXPECT_GE(same * 100, all * 99);
  EXPECT_LE(worst, 1e-3);
  int64_t decoded = 0;
  for (int64_t n : kSchedule) decoded += n;
  const int64_t want_total = (a->prefill_tokens + decoded) * graphs->config().num_experts_per_tok *
                             graphs->num_moe_layers();
  EXPECT_EQ(Total(a->counts), want_total);
  EXPECT_EQ(Total(c->counts), want_total);
  int64_t differing = 0;
  for (size_t e = 0; e < a->counts.size(); ++e) differing += a->counts[e] != c->counts[e];
  std::printf(
      "[decode-graphs] EPLB counts: %lld of %zu (layer, expert) entries differ from plain "
      "eager\n",
      static_cast<long long>(differing), a->counts.size());
  if (same == all) {
    EXPECT_EQ(a->counts, c->counts);
  }
}

TEST_F(DecodeGraphGpuTest, AdjustedGreedyStepsReplayBitForBitAndFollowTheGeneralPath) {
  ThreeWays m = LoadThreeWays();
  auto& [graphs, eager_padded, eager] = m;
  ASSERT_TRUE(graphs && eager_padded && eager);
  const int64_t vocab = graphs->config().vocab_size;
  // Step 5 (100 sequences x 27 entries) needs more room than the 1024 of bucket 128's graph.
  auto adjust = [vocab](int64_t seq, size_t step) {
    std::set<int32_t> tokens = {static_cast<int32_t>((seq * 31 + step * 7) % vocab),
                                static_cast<int32_t>((seq * 13 + 1) % vocab)};
    for (int k = 0; step == 5 && k < 25; ++k) {
      tokens.insert(static_cast<int32_t>((seq * 5 + k * 641) % vocab));
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
  auto a = RunDecodeSchedule(graphs.get(), backend_.get(), kSchedule, 100, nullptr, adjusted);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager_padded.get(), backend_.get(), kSchedule, 100, nullptr, adjusted);
  ASSERT_TRUE(b.ok()) << b.status();
  auto c = RunDecodeSchedule(eager.get(), backend_.get(), kSchedule, 100, /*forced=*/&*a, adjusted);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(kSchedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 7);  // buckets 1 4 8 64 128 2, 128 again larger
  ExpectBitIdentical(*a, *b);
  const testing::TokenAgreement agree = testing::CompareTokens(*a, *c);
  std::printf(
      "[decode-graphs] adjusted: replay vs plain eager: %lld / %lld tokens equal, max |logprob "
      "diff| %.3g\n",
      static_cast<long long>(agree.same), static_cast<long long>(agree.all),
      agree.worst_logprob_diff);
  EXPECT_GE(agree.same * 100, agree.all * 99);
  EXPECT_LE(agree.worst_logprob_diff, 1e-3);
}

// Sampled rows (temperature, top_k, top_p, a seed each; testing::MixedSampling) among greedy
// ones replay the graphs greedy batches record (no more of them), bit-identical to the padded
// eager steps, and follow the general path (DeviceSampler's SampleRows, the same seeded key) on
// the same inputs as closely as greedy steps do; sampling took effect (greedy steps on the same
// inputs pick other tokens). With logit adjustments on some rows: the adjusted graphs, again bit
// for bit against the padded eager steps.
TEST_F(DecodeGraphGpuTest, SampledStepsReplayBitForBitAndFollowTheGeneralPath) {
  ThreeWays m = LoadThreeWays();
  auto& [graphs, eager_padded, eager] = m;
  ASSERT_TRUE(graphs && eager_padded && eager);
  const testing::StepSampling mixed = testing::MixedSampling;
  auto a = RunDecodeSchedule(graphs.get(), backend_.get(), kSchedule, 100, nullptr, mixed);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager_padded.get(), backend_.get(), kSchedule, 100, nullptr, mixed);
  ASSERT_TRUE(b.ok()) << b.status();
  auto c = RunDecodeSchedule(eager.get(), backend_.get(), kSchedule, 100, /*forced=*/&*a, mixed);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(kSchedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6);  // buckets 1 4 8 64 128 2
  EXPECT_EQ(eager->decode_graph_steps(), 0);
  ExpectBitIdentical(*a, *b);
  const testing::TokenAgreement agree = testing::CompareTokens(*a, *c);
  std::printf(
      "[decode-graphs] sampled: replay vs plain eager: %lld / %lld tokens equal, max |logprob "
      "diff| %.3g\n",
      static_cast<long long>(agree.same), static_cast<long long>(agree.all),
      agree.worst_logprob_diff);
  EXPECT_GE(agree.same * 100, agree.all * 99);
  EXPECT_LE(agree.worst_logprob_diff, 1e-3);
  auto greedy = RunDecodeSchedule(eager.get(), backend_.get(), kSchedule, 100, /*forced=*/&*a);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_TRUE(testing::DiffersSomewhere(*a, *greedy));

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
  auto d = RunDecodeSchedule(graphs.get(), backend_.get(), kSchedule, 100, nullptr, mixed_adjusted);
  ASSERT_TRUE(d.ok()) << d.status();
  auto e = RunDecodeSchedule(eager_padded.get(), backend_.get(), kSchedule, 100, nullptr,
                             mixed_adjusted);
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectBitIdentical(*d, *e);
  EXPECT_EQ(graphs->decode_graph_steps(), 2 * static_cast<int64_t>(kSchedule.size()));
  // Adjusted graphs for the same buckets, bucket 1 twice: its first step (sequence 0 greedy)
  // takes the variant without sampled picks, step 9 (sequence 0 sampled) the one with them.
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6 + 7);
}

// The one-token attention kernel depends on the context (CudaTuning::
// mla_decode_small_max_context, 8 here): bucket 1's steps cross it (sequence 0's contexts 2, 3,
// ... 15), so both of its graphs are recorded and replayed, each equal bit for bit to the same
// steps run eagerly on the padded path; against plain eager steps (the kernel chosen from the
// real context) tokens agree (all but at most one) and logprobs stay within 1e-3.
// Verification steps (speculative decoding: 1 + 3 rows per verified sequence among plain
// decodes, hidden states wanted, a row with a logit bias; 118 rows in bucket 128) replay with
// the picks, logprobs and hidden states of the same padded steps run eagerly, bit for bit, with
// greedy rows and with sampled ones.
TEST_F(DecodeGraphGpuTest, VerificationRowsReplayBitForBit) {
  ThreeWays m = LoadThreeWays();
  ASSERT_TRUE(m.graphs && m.eager_padded);
  auto a = testing::RunVerifySteps(m.graphs.get(), backend_.get(), 40, 3, 4);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = testing::RunVerifySteps(m.eager_padded.get(), backend_.get(), 40, 3, 4);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(m.graphs->decode_graph_steps(), 4);
  EXPECT_EQ(m.eager_padded->decode_graph_steps(), 4);
  EXPECT_GT(m.graphs->decode_graphs_recorded(), 0);
  testing::ExpectBitIdentical(*a, *b);
  const int64_t vocab = m.graphs->config().vocab_size;
  for (size_t s = 0; s < a->tokens.size(); ++s) {
    EXPECT_EQ(a->tokens[s][1][2], static_cast<int32_t>((s * 11 + 5) % vocab)) << "step " << s;
  }
  // Sampled rows (testing::MixedSampling), each row keyed by its own position.
  auto c =
      testing::RunVerifySteps(m.graphs.get(), backend_.get(), 40, 3, 4, testing::MixedSampling);
  ASSERT_TRUE(c.ok()) << c.status();
  auto d = testing::RunVerifySteps(m.eager_padded.get(), backend_.get(), 40, 3, 4,
                                   testing::MixedSampling);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(m.graphs->decode_graph_steps(), 8);
  testing::ExpectBitIdentical(*c, *d);
  EXPECT_NE(c->tokens, a->tokens);
}

TEST_F(DecodeGraphGpuTest, OneTokenGraphsOnBothSidesOfTheContextBreak) {
  CudaTuning tuning;
  tuning.mla_decode_small_max_context = 8;
  auto created = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
  ASSERT_TRUE(created.ok()) << created.status();
  backend_ = std::move(*created);
  ThreeWays m = LoadThreeWays();
  auto& [graphs, eager_padded, eager] = m;
  ASSERT_TRUE(graphs && eager_padded && eager);
  const std::vector<int64_t> schedule = {1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1};
  auto a = RunDecodeSchedule(graphs.get(), backend_.get(), schedule, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager_padded.get(), backend_.get(), schedule, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 3);  // bucket 1 on each side, bucket 2
  ExpectBitIdentical(*a, *b);

  // c chose the attention kernel as a did (each kernel is checked against CpuBackend in
  // cuda_backend_attention_test and mla_decode_small_test).
  auto c = RunDecodeSchedule(eager.get(), backend_.get(), schedule, 2, /*forced=*/&*a);
  ASSERT_TRUE(c.ok()) << c.status();
  const testing::TokenAgreement agree = testing::CompareTokens(*a, *c);
  std::printf(
      "[decode-graphs] context break 8, replay vs plain eager: %lld / %lld tokens equal, max "
      "|logprob diff| %.3g\n",
      static_cast<long long>(agree.same), static_cast<long long>(agree.all),
      agree.worst_logprob_diff);
  EXPECT_GE(agree.same + 1, agree.all);  // a near-tie may flip one greedy pick
  EXPECT_LE(agree.worst_logprob_diff, 1e-3);
}

TEST_F(DecodeGraphGpuTest, NewCacheRecordsAgainWithTheSameResults) {
  auto model = Load(backend_.get(), DecodeGraphOptions{});
  ASSERT_TRUE(model);
  const std::vector<int64_t> schedule = {3, 3, 7, 7};
  auto first = RunDecodeSchedule(model.get(), backend_.get(), schedule, 8);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(model->decode_graphs_recorded(), 2);  // buckets 4 and 8
  auto second = RunDecodeSchedule(model.get(), backend_.get(), schedule, 8);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(model->decode_graphs_recorded(), 4);
  ExpectBitIdentical(*first, *second);
  auto reserved = backend_->GraphReservedBytes(/*high_water_mark=*/true);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  std::printf("[decode-graphs] graph memory reserved (high water mark): %.1f MiB\n",
              *reserved / 1048576.0);
}

TEST_F(DecodeGraphGpuTest, OpTimingRunsEagerly) {
  auto model = Load(backend_.get(), DecodeGraphOptions{});
  ASSERT_TRUE(model);
  backend_->SetOpTiming(true);
  auto run = RunDecodeSchedule(model.get(), backend_.get(), {2, 2}, 2);
  backend_->SetOpTiming(false);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(model->decode_graph_steps(), 0);
  EXPECT_FALSE(backend_->TakeOpTimingReport().empty());
}

// A failed recording (an op that needs the host inside Capture) is reported by Capture and
// leaves the backend usable.
TEST_F(DecodeGraphGpuTest, FailedRecordingLeavesTheBackendUsable) {
  auto buf = backend_->Allocate(64);
  auto ops = backend_->Capture([&] {
    int32_t host[16];
    backend_->CopyToHost(buf->data(), sizeof(host), host);  // synchronises: not recordable
    return absl::OkStatus();
  });
  EXPECT_FALSE(ops.ok());
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kFailedPrecondition) << ops.status();
  EXPECT_TRUE(backend_->status().ok()) << backend_->status();
  std::vector<int32_t> host(16, -1);
  backend_->CopyToHost(buf->data(), 64, host.data());
  EXPECT_TRUE(backend_->status().ok()) << backend_->status();
  EXPECT_EQ(host, std::vector<int32_t>(16, 0));
  // And a good recording replays: a copy recorded once, run twice with new source values.
  auto src = backend_->Allocate(64);
  auto copy = backend_->Capture([&] {
    backend_->CopyDeviceToDevice(src->data(), 64, buf->data());
    return absl::OkStatus();
  });
  ASSERT_TRUE(copy.ok()) << copy.status();
  for (int32_t v : {7, 9}) {
    std::vector<int32_t> values(16, v);
    backend_->CopyToDevice(values.data(), 64, src->data());
    ASSERT_TRUE((*copy)->Replay().ok());
    backend_->CopyToHost(buf->data(), 64, host.data());
    EXPECT_EQ(host, values);
  }
  EXPECT_TRUE(backend_->status().ok()) << backend_->status();
}

// The dense first layer at one decode token as the fused MoE block's kernels
// (Backend::NormedDenseMlp; fp32 activations where the ops round to bf16; the ops themselves are
// compared with it in cuda_backend_moe_test). Bucket 1's replayed steps equal the same padded
// steps run eagerly bit for bit; plain eager steps agree as in the test above. Op timing shows
// the op was taken.
TEST_F(DecodeGraphGpuTest, DenseMlpFusedReplayEqualsPaddedEagerAndPlainEager) {
  ThreeWays m = LoadThreeWays();
  auto& [graphs, eager_padded, eager] = m;
  ASSERT_TRUE(graphs && eager_padded && eager);
  const std::vector<int64_t> schedule = {1, 1, 3, 1, 1, 5, 1, 1};
  auto a = RunDecodeSchedule(graphs.get(), backend_.get(), schedule, 6);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunDecodeSchedule(eager_padded.get(), backend_.get(), schedule, 6);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  ExpectBitIdentical(*a, *b);

  auto c = RunDecodeSchedule(eager.get(), backend_.get(), schedule, 6, /*forced=*/&*a);
  ASSERT_TRUE(c.ok()) << c.status();
  const testing::TokenAgreement agree = testing::CompareTokens(*a, *c);
  std::printf(
      "[decode-graphs] dense MLP fused, replay vs plain eager: %lld / %lld tokens equal, max "
      "|logprob diff| %.3g\n",
      static_cast<long long>(agree.same), static_cast<long long>(agree.all),
      agree.worst_logprob_diff);
  EXPECT_GE(agree.same * 100, agree.all * 99);
  EXPECT_LE(agree.worst_logprob_diff, 1e-3);

  // Taken at one token.
  backend_->SetOpTiming(true);
  auto run = RunDecodeSchedule(eager.get(), backend_.get(), {1, 1}, 1);
  backend_->SetOpTiming(false);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(backend_->TakeOpTimingReport().find("NormedDenseMlp"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
