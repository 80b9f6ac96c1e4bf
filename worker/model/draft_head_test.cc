// DeepSeek-V3's draft head (the MTP module, CausalLm::Draft) on generated weights of the
// dsv3_qlora_rope fixture's config: the module's tensors are loaded under their checkpoint names
// and counted by DeviceBytes and the cache spec; Step's hidden rows are what the final norm and
// the LM head turn into its logits (checked on the host against the source's tensors); Draft
// gives each sequence the same result alone and in a batch, and refuses malformed input.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/model_config.h"
#include "worker/model/model_loader.h"
#include "worker/model/model_weights.h"

namespace deepinfer {
namespace {

ModelConfig FixtureConfig(int64_t draft_layers) {
  const char* src = std::getenv("TEST_SRCDIR");
  const std::string path =
      std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope/config.json";
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = ModelConfig::FromJson(ss.str(), path);
  EXPECT_TRUE(c.ok()) << c.status();
  c->num_draft_layers = draft_layers;
  return *c;
}

class DraftHeadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = FixtureConfig(1);
    auto m = BuildModel(config_, &source_, &backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto pool = KvBlockPool::Create(&backend_, KvBlockPoolOptions{model_->CacheSpec(), 32, 16});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }

  // The model's hidden rows of `tokens` (a fresh sequence on `block`).
  std::vector<float> Hidden(const std::vector<int32_t>& tokens, int32_t block) {
    SequenceStep s;
    s.tokens = tokens;
    s.block_table = {block};
    s.return_hidden = true;
    auto out = model_->Step({s}, pool_.get());
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->hidden[0] : std::vector<float>();
  }

  CpuBackend backend_{2};
  DummyWeightSource source_{21};
  ModelConfig config_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<KvBlockPool> pool_;
};

TEST_F(DraftHeadTest, LoadsTheMtpModuleAndCountsIt) {
  const int64_t L = config_.num_hidden_layers;
  EXPECT_EQ(model_->num_draft_layers(), 1);
  EXPECT_EQ(model_->CacheSpec().num_layers(), L + 1);
  auto w = ModelWeights::Load(config_, &source_, &backend_, {});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(static_cast<int64_t>((*w)->layers.size()), L + 1);
  ASSERT_EQ((*w)->mtp.size(), 1u);
  EXPECT_EQ((*w)->device_bytes, ModelWeights::DeviceBytes(config_, WeightDType::kFloat32, {}));
  EXPECT_GT((*w)->device_bytes,
            ModelWeights::DeviceBytes(FixtureConfig(0), WeightDType::kFloat32, {}));
  // The routed experts of the module are all loaded even where the rank hosts few.
  LoadOptions some;
  some.hosts_expert = [](int64_t, int64_t e) { return e < 2; };
  auto partial = ModelWeights::Load(config_, &source_, &backend_, some);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ(static_cast<int64_t>((*partial)->layers[L].experts.size()), config_.n_routed_experts);
  EXPECT_EQ((*partial)->device_bytes,
            ModelWeights::DeviceBytes(config_, WeightDType::kFloat32, some));

  ModelConfig too_many = FixtureConfig(2);  // the fixture has one MTP layer
  EXPECT_EQ(ModelWeights::Load(too_many, &source_, &backend_, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The hidden rows, normed with model.norm and multiplied by lm_head.weight on the host, are the
// logits Step returns.
TEST_F(DraftHeadTest, HiddenRowsAreWhatTheHeadTurnsIntoLogits) {
  const std::vector<int32_t> tokens = {3, 14, 15, 92, 65};
  SequenceStep s;
  s.tokens = tokens;
  s.block_table = {0};
  s.return_hidden = true;
  s.all_logits = true;
  auto out = model_->Step({s}, pool_.get());
  ASSERT_TRUE(out.ok()) << out.status();
  const int64_t H = config_.hidden_size, V = config_.vocab_size, T = tokens.size();
  ASSERT_EQ(static_cast<int64_t>(out->hidden[0].size()), T * H);
  std::vector<float> norm(H), head(V * H);
  ASSERT_TRUE(source_.ReadFloat32("model.norm.weight", {H}, norm.data()).ok());
  ASSERT_TRUE(source_.ReadFloat32("lm_head.weight", {V, H}, head.data()).ok());
  for (int64_t t = 0; t < T; ++t) {
    const float* h = out->hidden[0].data() + t * H;
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += double{h[i]} * h[i];
    const double inv = 1.0 / std::sqrt(ss / H + config_.rms_norm_eps);
    for (int64_t v = 0; v < V; ++v) {
      double logit = 0;
      for (int64_t i = 0; i < H; ++i) logit += h[i] * inv * norm[i] * head[v * H + i];
      ASSERT_NEAR(out->logits[0][t * V + v], logit, 1e-3 * (1 + std::abs(logit)))
          << "row " << t << " token " << v;
    }
  }
}

TEST_F(DraftHeadTest, BatchedDraftsEqualEachAlone) {
  const std::vector<int32_t> a = {3, 14, 15, 92, 65}, b = {2, 71, 82};
  const std::vector<float> ha = Hidden(a, 0), hb = Hidden(b, 1);
  auto step = [&](const std::vector<int32_t>& toks, const std::vector<float>& h, int32_t block) {
    DraftStep d;
    d.tokens.assign(toks.begin() + 1, toks.end());
    d.tokens.push_back(7);  // the token after the last position
    d.hidden = h;
    d.block_table = {block};
    return d;
  };
  auto alone_a = model_->Draft({step(a, ha, 0)}, pool_.get());
  auto alone_b = model_->Draft({step(b, hb, 1)}, pool_.get());
  auto both = model_->Draft({step(a, ha, 0), step(b, hb, 1)}, pool_.get());
  ASSERT_TRUE(alone_a.ok() && alone_b.ok() && both.ok()) << both.status();
  ASSERT_EQ(both->token.size(), 2u);
  EXPECT_EQ(both->token[0], alone_a->token[0]);
  EXPECT_EQ(both->token[1], alone_b->token[0]);
  EXPECT_EQ(both->probability[0], alone_a->probability[0]);
  EXPECT_EQ(both->probability[1], alone_b->probability[0]);
  EXPECT_EQ(both->hidden[0], alone_a->hidden[0]);
  EXPECT_EQ(both->hidden[1], alone_b->hidden[0]);
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(both->token[i], 0);
    EXPECT_LT(both->token[i], config_.vocab_size);
    EXPECT_GT(both->probability[i], 0.0f);
    EXPECT_LE(both->probability[i], 1.0f);
    EXPECT_EQ(static_cast<int64_t>(both->hidden[i].size()), config_.hidden_size);
  }
  // A recursive round: one row at the next position from the head's own hidden state.
  DraftStep next;
  next.tokens = {both->token[0]};
  next.hidden = both->hidden[0];
  next.position_offset = static_cast<int64_t>(a.size());
  next.block_table = {0};
  auto again = model_->Draft({next}, pool_.get());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->token.size(), 1u);
}

TEST_F(DraftHeadTest, RefusesMalformedDrafts) {
  DraftStep d;
  d.tokens = {5, 6};
  d.hidden.assign(2 * config_.hidden_size, 0.5f);
  d.block_table = {0};
  DraftStep bad_module = d;
  bad_module.module = 1;
  EXPECT_EQ(model_->Draft({bad_module}, pool_.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  DraftStep bad_hidden = d;
  bad_hidden.hidden.pop_back();
  EXPECT_EQ(model_->Draft({bad_hidden}, pool_.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  DraftStep bad_token = d;
  bad_token.tokens[1] = static_cast<int32_t>(config_.vocab_size);
  EXPECT_EQ(model_->Draft({bad_token}, pool_.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto empty = model_->Draft({}, pool_.get());
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->token.empty());

  // A model built without its draft head has none, and its cache has no room for one.
  auto plain = BuildModel(FixtureConfig(0), &source_, &backend_);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->num_draft_layers(), 0);
  EXPECT_EQ((*plain)->Draft({d}, pool_.get()).status().code(), absl::StatusCode::kUnimplemented);
  SequenceStep one;
  one.tokens = {5};
  one.block_table = {0};
  EXPECT_EQ((*plain)->Step({one}, pool_.get()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
