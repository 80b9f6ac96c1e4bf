// Tests for DeepseekV3Model's step API on the HF-made fixture checkpoint: batching, chunked
// prefill, mixed prefill/decode, expert subsets, dummy weights and loader errors. Parity with HF
// itself is tests/parity.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"
#include "worker/model/cpu_generate.h"
#include "worker/model/model_loader.h"
#include "worker/model/safetensors_checkpoint.h"
#include "worker/model/safetensors_writer.h"

namespace deepinfer {
namespace {

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

std::string TmpDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string d = std::string(dir ? dir : "/tmp") + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(2 + (i * 37 + salt * 101) % 990);
  return p;
}

SequenceStep MakeStep(std::vector<int32_t> tokens, int64_t offset, std::vector<int32_t> table,
                      bool all_logits, std::optional<SamplingParams> sampling = std::nullopt) {
  SequenceStep s;
  s.tokens = std::move(tokens);
  s.position_offset = offset;
  s.block_table = std::move(table);
  s.all_logits = all_logits;
  s.sampling = sampling;
  return s;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Memory planning sizes the weights from the config before loading; the estimate must be what
// loading allocates, for both matrix dtypes and for an expert subset.
TEST(ModelWeightsTest, DeviceBytesIsWhatLoadAllocates) {
  auto config = ModelConfig::FromFile(FixtureDir() + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  auto ckpt =
      SafetensorsCheckpoint::Open(FixtureDir(), config->fp8_block_rows, config->fp8_block_cols);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  LoadOptions subset;
  subset.hosts_expert = [](int64_t, int64_t e) { return e % 4 == 1; };
  for (WeightDType dt : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    for (const LoadOptions& o : {LoadOptions{}, subset}) {
      CpuBackend be(1, dt);
      auto w = ModelWeights::Load(*config, ckpt->get(), &be, o);
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_EQ((*w)->matrix_dtype, dt);
      EXPECT_EQ(ModelWeights::DeviceBytes(*config, dt, o), (*w)->device_bytes)
          << WeightDTypeName(dt);
    }
  }
  // bf16 halves the matrices: well under the fp32 size, above half of it (fp32 embedding).
  const int64_t f32 = ModelWeights::DeviceBytes(*config, WeightDType::kFloat32, {});
  const int64_t b16 = ModelWeights::DeviceBytes(*config, WeightDType::kBFloat16, {});
  EXPECT_LT(b16, f32 * 3 / 4);
  EXPECT_GT(b16, f32 / 2);
}

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(FixtureDir(), &backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto pool = KvBlockPool::Create(&backend_, KvBlockPoolOptions{model_->CacheSpec(), 64, 4});
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
  }
  std::vector<int32_t> Blocks(int n) { return *pool_->Allocate(n); }

  CpuBackend backend_{2};
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<KvBlockPool> pool_;
};

// Without logits, greedy rows are sampled on the device; the result must be what the host
// Sampler picks from the returned logits (token and logprob), and rows that need the host
// (temperature, top logprobs) still go through the Sampler.
TEST_F(ModelTest, StepWithoutLogitsSamplesLikeTheHostSampler) {
  SamplingParams greedy;
  SamplingParams greedy_top;
  greedy_top.num_logprobs = 3;
  SamplingParams hot;
  hot.temperature = 0.8f;
  hot.seed = 7;
  const std::vector<SamplingParams> params = {greedy, greedy_top, hot, greedy};
  std::vector<SequenceStep> with, without;
  for (size_t i = 0; i < params.size(); ++i) {
    with.push_back(MakeStep(Prompt(6 + 3 * i, i), 0, Blocks(4), i == 3, params[i]));
  }
  // Same prompts in fresh blocks for the second run.
  for (size_t i = 0; i < params.size(); ++i) {
    without.push_back(MakeStep(Prompt(6 + 3 * i, i), 0, Blocks(4), i == 3, params[i]));
    without.back().return_logits = false;
  }
  // An intermediate prefill chunk: no sampling, no logits wanted.
  without.push_back(MakeStep(Prompt(5, 9), 0, Blocks(2), false));
  without.back().return_logits = false;
  auto a = model_->Step(with, pool_.get());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = model_->Step(without, pool_.get());
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->sampled.size(), without.size());
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(b->logits[i].empty());
    const int64_t V = model_->config().vocab_size;
    const std::vector<float>& l = a->logits[i];
    auto want = Sampler::Sample(l.data() + l.size() - V, static_cast<int32_t>(V), params[i],
                                static_cast<int64_t>(with[i].tokens.size()));
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(b->sampled[i].token, want->token);
    EXPECT_EQ(a->sampled[i].token, want->token);
    EXPECT_NEAR(b->sampled[i].logprob, want->logprob, 1e-5f);
    EXPECT_LT(b->sampled[i].logprob, 0.0f);
    EXPECT_EQ(b->sampled[i].top_logprobs.size(), want->top_logprobs.size());
  }
  EXPECT_TRUE(b->logits.back().empty());
  EXPECT_EQ(b->sampled.back().token, -1);
}

// Every sampled sequence that wants no logits goes through DeviceSampler (on the CPU backend:
// Sampler's arithmetic in the backend's ops): the same SampledToken, bit for bit, as the host
// path (return_logits) gives for a mix of greedy, seeded temperature / top-k / top-p and top
// logprobs, including more top logprobs than the device serves (copied to the host) and a
// sequence with all its logits rows; a bad parameter is Sampler's INVALID_ARGUMENT.
TEST_F(ModelTest, DeviceAndHostSamplingAgree) {
  std::vector<SamplingParams> params(9);
  params[1].num_logprobs = 4;
  params[2].temperature = 0.8f;
  params[2].seed = 7;
  params[3].temperature = 1.3f;
  params[3].top_k = 5;
  params[3].seed = 8;
  params[3].num_logprobs = 2;
  params[4].temperature = 1.0f;
  params[4].top_p = 0.6f;
  params[4].seed = 9;
  params[5].temperature = 2.0f;
  params[5].top_k = 50;
  params[5].top_p = 0.9f;
  params[5].seed = 10;
  params[5].num_logprobs = kMaxTopLogprobs;
  params[6].num_logprobs = kMaxTopLogprobs + 5;  // beyond the device: host rows
  params[7].temperature = 0.5f;
  params[7].seed = 11;  // all_logits below
  params[8].temperature = 0.9f;
  params[8].top_k = 1;
  params[8].seed = 12;
  std::vector<SequenceStep> host, device;
  for (size_t i = 0; i < params.size(); ++i) {
    host.push_back(MakeStep(Prompt(3 + i, i), 0, Blocks(3), i == 7, params[i]));
    device.push_back(MakeStep(Prompt(3 + i, i), 0, Blocks(3), i == 7, params[i]));
    device.back().return_logits = false;
  }
  for (int step = 0; step < 2; ++step) {  // the prompts, then one decode step each
    SCOPED_TRACE(step);
    auto a = model_->Step(host, pool_.get());
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = model_->Step(device, pool_.get());
    ASSERT_TRUE(b.ok()) << b.status();
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_FALSE(a->logits[i].empty());
      EXPECT_TRUE(b->logits[i].empty());
      EXPECT_EQ(b->sampled[i].token, a->sampled[i].token);
      EXPECT_EQ(b->sampled[i].logprob, a->sampled[i].logprob);
      EXPECT_EQ(b->sampled[i].top_logprobs, a->sampled[i].top_logprobs);
      EXPECT_EQ(b->sampled[i].top_logprobs.size(), static_cast<size_t>(params[i].num_logprobs));
      for (auto* s : {&host[i], &device[i]}) {
        s->position_offset += static_cast<int64_t>(s->tokens.size());
        s->tokens = {a->sampled[i].token};
      }
    }
  }
  SamplingParams bad;
  bad.temperature = 1.0f;
  bad.top_p = 1.5f;
  SequenceStep s = MakeStep(Prompt(4, 1), 0, Blocks(1), false, bad);
  s.return_logits = false;
  EXPECT_EQ(model_->Step({s}, pool_.get()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelTest, BatchedDecodeOfDifferentLengthsEqualsEachAlone) {
  const std::vector<int> lens = {5, 13, 22};
  const int steps = 4;
  // Alone: each sequence prefilled and decoded by itself.
  std::vector<std::vector<std::vector<float>>> alone(lens.size());
  std::vector<std::vector<int32_t>> decode_tokens(lens.size());
  for (size_t s = 0; s < lens.size(); ++s) {
    SequenceStep st = MakeStep(Prompt(lens[s], s), 0, Blocks(8), false);
    for (int i = 0; i <= steps; ++i) {
      auto r = model_->Step({st}, pool_.get());
      ASSERT_TRUE(r.ok()) << r.status();
      alone[s].push_back(r->logits[0]);
      const auto& l = r->logits[0];
      const int32_t next = std::max_element(l.begin(), l.end()) - l.begin();
      decode_tokens[s].push_back(next);
      st.position_offset += st.tokens.size();
      st.tokens = {next};
    }
  }
  // Together: one batched prefill, then batched decode steps with the same tokens.
  std::vector<SequenceStep> batch;
  for (size_t s = 0; s < lens.size(); ++s)
    batch.push_back(MakeStep(Prompt(lens[s], s), 0, Blocks(8), false));
  for (int i = 0; i <= steps; ++i) {
    auto r = model_->Step(batch, pool_.get());
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t s = 0; s < lens.size(); ++s) {
      EXPECT_LE(MaxDiff(r->logits[s], alone[s][i]), 1e-5f) << "seq " << s << " step " << i;
      batch[s].position_offset += batch[s].tokens.size();
      batch[s].tokens = {decode_tokens[s][i]};
    }
  }
}

TEST_F(ModelTest, ChunkedPrefillAndMixedBatchMatchFullPrefill) {
  const auto prompt = Prompt(30, 7);
  SequenceStep full = MakeStep(prompt, 0, Blocks(8), true);
  auto ref = model_->Step({full}, pool_.get());
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->logits[0].size(), 30u * 1000);
  // Same prompt in two chunks (11 + 19 tokens); the second chunk shares a step with another
  // sequence's decode-sized step.
  auto table = Blocks(8);
  SequenceStep first =
      MakeStep(std::vector<int32_t>(prompt.begin(), prompt.begin() + 11), 0, table, true);
  auto r1 = model_->Step({first}, pool_.get());
  ASSERT_TRUE(r1.ok());
  SequenceStep second =
      MakeStep(std::vector<int32_t>(prompt.begin() + 11, prompt.end()), 11, table, true);
  SequenceStep other = MakeStep(Prompt(3, 1), 0, Blocks(1), false);
  auto r2 = model_->Step({other, second}, pool_.get());
  ASSERT_TRUE(r2.ok()) << r2.status();
  std::vector<float> joined = r1->logits[0];
  joined.insert(joined.end(), r2->logits[1].begin(), r2->logits[1].end());
  EXPECT_LE(MaxDiff(joined, ref->logits[0]), 1e-5f);
}

// The non-absorbed prefill form (keys expanded through kv_b) is the same function as the absorbed
// one: logits of two prompts in one step, and of a prompt whose second chunk attends to a cached
// prefix, agree within fp32 summation-order differences. They are not bit-identical, which shows
// the other form did run.
TEST_F(ModelTest, NonAbsorbedPrefillGivesTheAbsorbedLogits) {
  auto run = [&](PrefillAttention form) {
    model_->SetPrefillAttention(form);
    std::vector<std::vector<float>> logits;
    auto r = model_->Step(
        {MakeStep(Prompt(30, 7), 0, Blocks(8), true), MakeStep(Prompt(17, 3), 0, Blocks(5), true)},
        pool_.get());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return logits;
    logits = r->logits;
    const auto prompt = Prompt(26, 5);
    auto table = Blocks(8);
    auto c1 = model_->Step(
        {MakeStep(std::vector<int32_t>(prompt.begin(), prompt.begin() + 9), 0, table, true)},
        pool_.get());
    auto c2 = model_->Step(
        {MakeStep(std::vector<int32_t>(prompt.begin() + 9, prompt.end()), 9, table, true)},
        pool_.get());
    EXPECT_TRUE(c1.ok() && c2.ok());
    if (c1.ok() && c2.ok()) {
      logits.push_back(c1->logits[0]);
      logits.push_back(c2->logits[0]);
    }
    return logits;
  };
  const auto absorbed = run(PrefillAttention::kAbsorbed);
  const auto mha = run(PrefillAttention::kMha);
  ASSERT_EQ(absorbed.size(), 4u);
  ASSERT_EQ(mha.size(), 4u);
  bool identical = true;
  for (size_t i = 0; i < absorbed.size(); ++i) {
    float scale = 0;
    for (float v : absorbed[i]) scale = std::max(scale, std::abs(v));
    EXPECT_LE(MaxDiff(mha[i], absorbed[i]), 1e-4f * std::max(scale, 1.0f)) << "output " << i;
    identical = identical && mha[i] == absorbed[i];
  }
  EXPECT_FALSE(identical);
}

TEST(PrefillAttentionTest, ParsesTheThreeFormsAndNamesABadOne) {
  for (PrefillAttention f :
       {PrefillAttention::kAuto, PrefillAttention::kAbsorbed, PrefillAttention::kMha}) {
    auto parsed = ParsePrefillAttention(PrefillAttentionName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  auto bad = ParsePrefillAttention("flash");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("flash"), std::string::npos);
}

TEST_F(ModelTest, SeededSamplingIsIndependentOfBatchComposition) {
  SamplingParams sp;
  sp.temperature = 1.5f;
  sp.top_p = 0.95f;
  sp.seed = 1234;
  sp.num_logprobs = 3;
  auto run = [&](bool with_others) {
    SequenceStep s = MakeStep(Prompt(9, 4), 0, Blocks(8), false, sp);
    std::vector<int32_t> got;
    std::vector<SequenceStep> others;
    for (int i = 0; i < 2; ++i) {
      SamplingParams o = sp;
      o.seed = 99 + i;
      others.push_back(MakeStep(Prompt(4 + 7 * i, 9 + i), 0, Blocks(8), false, o));
    }
    for (int step = 0; step < 8; ++step) {
      std::vector<SequenceStep> batch;
      if (with_others) batch = others;
      batch.push_back(s);
      auto r = model_->Step(batch, pool_.get());
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return got;
      const SampledToken& t = r->sampled.back();
      EXPECT_EQ(t.top_logprobs.size(), 3u);
      EXPECT_LE(t.logprob, t.top_logprobs[0].second);
      got.push_back(t.token);
      s.position_offset += s.tokens.size();
      s.tokens = {t.token};
      for (size_t i = 0; i < others.size(); ++i) {
        others[i].position_offset += others[i].tokens.size();
        others[i].tokens = {r->sampled[i].token};
      }
    }
    return got;
  };
  const auto alone = run(false);
  EXPECT_EQ(alone, run(true));
  EXPECT_EQ(alone.size(), 8u);
}

TEST_F(ModelTest, CountsTokensPerExpertOfEveryMoeLayerUntilTaken) {
  const ModelConfig& c = model_->config();
  ASSERT_GT(model_->num_moe_layers(), 0);
  EXPECT_EQ(model_->TakeExpertCounts(),
            std::vector<int64_t>(model_->num_moe_layers() * c.n_routed_experts, 0));
  // 7 + 4 tokens over two steps: every MoE layer routes each token to top_k experts.
  SequenceStep st = MakeStep(Prompt(7, 1), 0, Blocks(4), false);
  ASSERT_TRUE(model_->Step({st}, pool_.get()).ok());
  st.position_offset = 7;
  st.tokens = {5, 6, 7, 8};
  ASSERT_TRUE(model_->Step({st}, pool_.get()).ok());
  const std::vector<int64_t> counts = model_->TakeExpertCounts();
  ASSERT_EQ(counts.size(), static_cast<size_t>(model_->num_moe_layers() * c.n_routed_experts));
  for (int64_t l = 0; l < model_->num_moe_layers(); ++l) {
    int64_t sum = 0, used = 0;
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      sum += counts[l * c.n_routed_experts + e];
      used += counts[l * c.n_routed_experts + e] > 0;
    }
    EXPECT_EQ(sum, 11 * c.num_experts_per_tok) << "MoE layer " << l;
    EXPECT_GT(used, c.num_experts_per_tok) << "MoE layer " << l;  // not one constant choice
  }
  // Taking resets.
  EXPECT_EQ(model_->TakeExpertCounts(),
            std::vector<int64_t>(model_->num_moe_layers() * c.n_routed_experts, 0));
}

TEST_F(ModelTest, RejectsBadSteps) {
  SequenceStep small = MakeStep(Prompt(9, 0), 0, Blocks(2), false);  // 2 blocks of 4 < 9 positions
  auto r = model_->Step({small}, pool_.get());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  SequenceStep bad_token = MakeStep({5000}, 0, Blocks(1), false);
  EXPECT_FALSE(model_->Step({bad_token}, pool_.get()).ok());
  SequenceStep empty = MakeStep({}, 0, Blocks(1), false);
  EXPECT_FALSE(model_->Step({empty}, pool_.get()).ok());
}

// Counts Dispatch / Combine calls around another dispatcher.
class CountingDispatcher : public ExpertDispatcher {
 public:
  CountingDispatcher(std::unique_ptr<ExpertDispatcher> inner, int* dispatches, int* combines)
      : inner_(std::move(inner)), dispatches_(dispatches), combines_(combines) {}
  const std::vector<int64_t>& local_experts(int64_t moe_layer) const override {
    return inner_->local_experts(moe_layer);
  }
  absl::Status Dispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k, const float* hidden,
                        const int32_t* topk_ids, const float* topk_weights,
                        DispatchedTokens* out) override {
    ++*dispatches_;
    return inner_->Dispatch(moe_layer, num_tokens, top_k, hidden, topk_ids, topk_weights, out);
  }
  absl::Status Combine(const DispatchedTokens& d, const float* expert_out, float* out) override {
    ++*combines_;
    return inner_->Combine(d, expert_out, out);
  }

 private:
  std::unique_ptr<ExpertDispatcher> inner_;
  int* dispatches_;
  int* combines_;
};

// An expert-parallel rank without tokens must still take part in every MoE layer's exchange.
// The cache takes the backend's dtype: bf16 weights give a bf16 cache. Decoding from it must
// read back exactly what the prefill wrote and attended to (prefill attention reads the cache
// too), so prefill + one decode step equals one longer prefill; fp32 weights keep fp32 entries.
TEST(ModelCacheTest, Bf16BackendKeepsABf16CacheThatDecodeReadsBackAsPrefillDid) {
  {
    CpuBackend be(1);
    auto m = LoadModel(FixtureDir(), &be);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->CacheSpec().groups[0].dtype, WeightDType::kFloat32);
  }
  CpuBackend be(2, WeightDType::kBFloat16);
  auto m = LoadModel(FixtureDir(), &be);
  ASSERT_TRUE(m.ok()) << m.status();
  const KvBlockPoolOptions o{(*m)->CacheSpec(), 16, 4};
  EXPECT_EQ(o.spec.groups[0].dtype, WeightDType::kBFloat16);
  auto pool = KvBlockPool::Create(&be, o);
  ASSERT_TRUE(pool.ok());
  const auto prompt = Prompt(14, 3);
  auto full = (*m)->Step({MakeStep(prompt, 0, *(*pool)->Allocate(4), true)}, pool->get());
  ASSERT_TRUE(full.ok()) << full.status();
  const auto table = *(*pool)->Allocate(4);
  auto head = (*m)->Step(
      {MakeStep(std::vector<int32_t>(prompt.begin(), prompt.end() - 1), 0, table, false)},
      pool->get());
  ASSERT_TRUE(head.ok()) << head.status();
  auto last = (*m)->Step({MakeStep({prompt.back()}, 13, table, false)}, pool->get());
  ASSERT_TRUE(last.ok()) << last.status();
  const std::vector<float> want(full->logits[0].end() - 1000, full->logits[0].end());
  EXPECT_LE(MaxDiff(last->logits[0], want), 1e-5f);
}

// Fused ops (AddRmsNorm, bf16 GEMM operands, the shared experts accumulating into the routed
// sum) must give exactly the values of the unfused op sequence on the CPU reference: every
// rounding and every fp32 addition is the same, only fewer passes. Prefill and decode, fp32 and
// bf16 weights (the fixture has q_lora, so the q_a norm's bf16 operand is covered too).
TEST(ModelFusedOpsTest, FusedOpsGiveBitIdenticalLogits) {
  for (WeightDType dt : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    SCOPED_TRACE(WeightDTypeName(dt));
    CpuBackend be(2, dt);
    auto m = LoadModel(FixtureDir(), &be);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE((*m)->fused_ops());  // the default
    std::vector<std::vector<float>> logits[2];
    for (bool fused : {true, false}) {
      (*m)->SetFusedOps(fused);
      auto pool = KvBlockPool::Create(&be, KvBlockPoolOptions{(*m)->CacheSpec(), 16, 4});
      ASSERT_TRUE(pool.ok());
      const auto a = *(*pool)->Allocate(4), b = *(*pool)->Allocate(4);
      auto prefill = (*m)->Step(
          {MakeStep(Prompt(9, 1), 0, a, true), MakeStep(Prompt(5, 2), 0, b, false)}, pool->get());
      ASSERT_TRUE(prefill.ok()) << prefill.status();
      auto decode =
          (*m)->Step({MakeStep({7}, 9, a, false), MakeStep({11}, 5, b, false)}, pool->get());
      ASSERT_TRUE(decode.ok()) << decode.status();
      for (auto* out : {&*prefill, &*decode}) {
        for (auto& row : out->logits) logits[fused].push_back(row);
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t i = 0; i < logits[0].size(); ++i) {
      ASSERT_FALSE(logits[0][i].empty());
      EXPECT_EQ(logits[0][i], logits[1][i]) << "logits " << i;
    }
  }
}

TEST(ModelLoadTest, EmptyBatchStillDispatchesAndCombinesInEveryMoeLayer) {
  CpuBackend be(1);
  int dispatches = 0, combines = 0;
  ExpertDispatcherFactory make =
      [&](const ModelConfig& c, const ModelWeights& w,
          Backend* b) -> absl::StatusOr<std::unique_ptr<ExpertDispatcher>> {
    auto inner = MakeLocalExpertDispatcher(c, w, b);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<ExpertDispatcher>(
        std::make_unique<CountingDispatcher>(std::move(*inner), &dispatches, &combines));
  };
  auto m = LoadModel(FixtureDir(), &be, LoadOptions{}, make);
  ASSERT_TRUE(m.ok()) << m.status();
  auto pool = KvBlockPool::Create(&be, KvBlockPoolOptions{(*m)->CacheSpec(), 8, 16});
  ASSERT_TRUE(pool.ok());
  auto busy = (*m)->Step({MakeStep(Prompt(5, 1), 0, *(*pool)->Allocate(1), false)}, pool->get());
  ASSERT_TRUE(busy.ok()) << busy.status();
  const int moe_layers = dispatches;
  EXPECT_EQ(moe_layers, 2);  // the fixture: 3 layers, the first dense
  EXPECT_EQ(combines, moe_layers);
  auto idle = (*m)->Step({}, pool->get());
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_TRUE(idle->logits.empty());
  EXPECT_TRUE(idle->sampled.empty());
  EXPECT_EQ(dispatches, 2 * moe_layers);
  EXPECT_EQ(combines, 2 * moe_layers);
}

TEST(ModelLoadTest, HostsOnlyRequestedExperts) {
  CpuBackend be(1);
  auto config = ModelConfig::FromFile(FixtureDir() + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = SafetensorsCheckpoint::Open(FixtureDir());
  ASSERT_TRUE(ckpt.ok());
  LoadOptions opts;
  opts.hosts_expert = [](int64_t layer, int64_t e) { return e % 4 == 1; };
  auto w = ModelWeights::Load(*config, ckpt->get(), &be, opts);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->layers[0].experts.size(), 0u);  // dense layer
  ASSERT_EQ((*w)->layers[1].experts.size(), 2u);
  EXPECT_TRUE((*w)->layers[1].experts.count(1));
  EXPECT_TRUE((*w)->layers[1].experts.count(5));
  // With a subset, tokens routed elsewhere fail loudly instead of being dropped.
  auto m = LoadModel(FixtureDir(), &be, opts);
  ASSERT_TRUE(m.ok()) << m.status();
  auto pool = KvBlockPool::Create(&be, KvBlockPoolOptions{(*m)->CacheSpec(), 8, 16});
  SequenceStep s = MakeStep(Prompt(20, 3), 0, *(*pool)->Allocate(2), false);
  EXPECT_EQ((*m)->Step({s}, pool->get()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ModelLoadTest, ErrorsNameTheTensorAndFile) {
  const std::string dir = TmpDir("broken_ckpt");
  std::ifstream src(FixtureDir() + "/config.json", std::ios::binary);
  std::ofstream(dir + "/config.json", std::ios::binary) << src.rdbuf();
  SafetensorsWriter w;
  w.AddFloat32("model.embed_tokens.weight", {1000, 96}, std::vector<float>(96000, 0.0f));
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  CpuBackend be(1);
  auto m = LoadModel(dir, &be);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model.norm.weight"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find(dir), std::string::npos) << m.status();

  SafetensorsWriter w2;
  w2.AddFloat32("model.embed_tokens.weight", {1000, 64}, std::vector<float>(64000, 0.0f));
  ASSERT_TRUE(w2.Write(dir + "/model.safetensors").ok());
  // Every other tensor is missing too; the misshaped first tensor's error is the one reported,
  // on several loading threads as on one.
  LoadOptions parallel;
  parallel.load_threads = 4;
  m = LoadModel(dir, &be, parallel);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model.embed_tokens.weight"), std::string::npos);
  EXPECT_NE(m.status().message().find("[1000,64]"), std::string::npos) << m.status();

  std::ofstream(dir + "/config.json") << R"({"architectures": ["MixtralForCausalLM"]})";
  m = LoadModel(dir, &be);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(dir + "/config.json"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("MixtralForCausalLM"), std::string::npos);
}

TEST(CpuGenerateTest, DummyWeightsAreSeededAndDeterministic) {
  const std::string cfg = FixtureDir() + "/config.json";
  auto a = GenerateGreedyOnCpu("dummy:" + cfg + "@1", Prompt(9, 0), 6, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 6u);
  auto b = GenerateGreedyOnCpu("dummy:" + cfg + "@1", Prompt(9, 0), 6, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);  // independent of the thread count
  auto c = GenerateGreedyOnCpu("dummy:" + cfg + "@2", Prompt(9, 0), 6, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*a, *c);
  EXPECT_FALSE(GenerateGreedyOnCpu("dummy:/nonexistent/config.json", Prompt(3, 0), 2).ok());
}

}  // namespace
}  // namespace deepinfer
