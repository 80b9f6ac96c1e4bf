// DeepseekV4Model through the registry with `dummy:` weights of the fixtures' configs: it steps,
// and bad input (a sequence continued without its state, a token outside the vocabulary, a
// cache made for another model, more sequences than state slots, routed experts kept MXFP4 on a
// backend that cannot run them) is refused with clear errors.
#include <cmath>
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

std::string Config(const std::string& fixture) {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/" + fixture + "/config.json";
}

class V4ModelTest : public ::testing::Test {
 protected:
  V4ModelTest() : backend_(2) {}
  void SetUp() override {
    auto model = LoadModel("dummy:" + Config("dsv4_bf16") + "@7", &backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    KvBlockPoolOptions o{model_->CacheSpec(), 32, 16};
    o.max_sequences = 2;
    auto pool = KvBlockPool::Create(&backend_, o);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }
  SequenceStep Seq(std::vector<int32_t> tokens, int64_t offset, int32_t blocks) {
    SequenceStep s;
    s.tokens = std::move(tokens);
    s.position_offset = offset;
    auto b = pool_->Allocate(blocks);
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) s.block_table = *b;
    return s;
  }

  CpuBackend backend_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<KvBlockPool> pool_;
};

TEST_F(V4ModelTest, DummyWeightsStep) {
  EXPECT_EQ(model_->config().architecture, "DeepseekV4ForCausalLM");
  EXPECT_EQ(model_->num_moe_layers(), 5);
  SequenceStep s = Seq({3, 14, 15, 92, 65, 35, 89, 79, 32, 38}, 0, 1);
  auto out = model_->Step({s}, pool_.get());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->logits[0].size(), 1000u);
  for (float x : out->logits[0]) ASSERT_TRUE(std::isfinite(x));
  s.position_offset = 10;
  s.tokens = {7};
  out = model_->Step({s}, pool_.get());
  ASSERT_TRUE(out.ok()) << out.status();
  // An empty batch (an expert-parallel rank without sequences) still steps.
  EXPECT_TRUE(model_->Step({}, pool_.get()).ok());
  // Routed experts were counted per layer.
  int64_t counted = 0;
  for (int64_t c : model_->TakeExpertCounts()) counted += c;
  EXPECT_EQ(counted, 11 * 3 * 5);
}

TEST_F(V4ModelTest, BadInputIsRefused) {
  // Continuing at position 5 a sequence the cache holds no state for.
  SequenceStep cont = Seq({1}, 5, 1);
  auto st = model_->Step({cont}, pool_.get()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("position 5"));
  SequenceStep bad = Seq({1, 1000}, 0, 1);
  st = model_->Step({bad}, pool_.get()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("token id 1000"));
  ASSERT_TRUE(pool_->Free(cont.block_table).ok());  // releases the slot the refusal bound
  ASSERT_TRUE(pool_->Free(bad.block_table).ok());
  // A third sequence at once: two state slots.
  SequenceStep a = Seq({1, 2}, 0, 1), b = Seq({3}, 0, 1), c = Seq({4}, 0, 1);
  ASSERT_TRUE(model_->Step({a, b}, pool_.get()).ok());
  EXPECT_EQ(model_->Step({c}, pool_.get()).status().code(), absl::StatusCode::kResourceExhausted);
  // A cache made for another model (DeepSeek-V3's latent cache).
  auto v3 =
      KvBlockPool::Create(&backend_, {PagedLatentSpec(5, 32, 8, WeightDType::kFloat32), 8, 16});
  ASSERT_TRUE(v3.ok());
  st = model_->Step({Seq({1}, 0, 1)}, v3->get()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("is not the model's"));
}

TEST(V4ModelLoadTest, MixConfigLoadsDummyWeights) {
  CpuBackend backend(2);
  auto model = LoadModel("dummy:" + Config("dsv4_mix"), &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->CacheSpec().groups.size(), 3u);  // sliding, HCA, CSA
}

// Routed experts kept MXFP4 run only through Backend::RoutedExperts, which the CPU backend does
// not take for them: the step is refused with an error naming MXFP4, not run on the bytes.
TEST(V4ModelMxfp4Test, CpuBackendRefusesMxfp4ExpertsByName) {
  CpuBackend backend(2);
  LoadOptions load;
  load.mxfp4_experts = true;
  auto model = LoadModel("dummy:" + Config("dsv4_bf16") + "@7", &backend, load);
  ASSERT_TRUE(model.ok()) << model.status();
  KvBlockPoolOptions o{(*model)->CacheSpec(), 32, 16};
  o.max_sequences = 1;
  auto pool = KvBlockPool::Create(&backend, o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  SequenceStep s;
  s.tokens = {3, 14, 15};
  auto b = (*pool)->Allocate(1);
  ASSERT_TRUE(b.ok()) << b.status();
  s.block_table = *b;
  auto out = (*model)->Step({s}, pool->get());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status().message(), HasSubstr("MXFP4"));
}

}  // namespace
}  // namespace deepinfer
