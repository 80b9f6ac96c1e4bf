// Tests for KvCacheSpec: byte sums over groups, validation, dtype override.
#include "worker/kv_cache/kv_cache_spec.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(KvCacheSpecTest, PagedLatentBytes) {
  const KvCacheSpec s = PagedLatentSpec(3, 32, 16, WeightDType::kFloat32);
  ASSERT_TRUE(s.Validate().ok()) << s.Validate();
  EXPECT_EQ(s.num_layers(), 3);
  EXPECT_EQ(s.groups[0].EntryBytes(), (32 + 16) * 4);
  EXPECT_EQ(s.BytesPerToken(), 3 * (32 + 16) * 4);
  EXPECT_EQ(s.BytesPerBlock(16), 16 * 3 * (32 + 16) * 4);
  EXPECT_EQ(s.WithDType(WeightDType::kBFloat16).BytesPerToken(), 3 * (32 + 16) * 2);
  // A latent entry depends only on the tokens up to its position: blocks can be shared.
  EXPECT_EQ(KvCacheKindPrefixReuse(KvCacheKind::kPagedLatent), PrefixReuse::kShareBlocks);
  EXPECT_TRUE(s.SharesPrefixBlocks());
}

TEST(KvCacheSpecTest, GroupsSum) {
  KvCacheSpec s = PagedLatentSpec(2, 8, 4, WeightDType::kFloat32);
  KvCacheGroupSpec g = s.groups[0];
  g.layers = {2};
  g.latent_dim = 16;
  g.dtype = WeightDType::kBFloat16;
  s.groups.push_back(g);
  ASSERT_TRUE(s.Validate().ok()) << s.Validate();
  EXPECT_EQ(s.BytesPerToken(), 2 * 12 * 4 + 20 * 2);
  EXPECT_NE(s.ToString().find("paged_latent x1 layers (16+4, bfloat16)"), std::string::npos)
      << s.ToString();
}

TEST(KvCacheSpecTest, ValidateNamesTheProblem) {
  EXPECT_EQ(KvCacheSpec{}.Validate().code(), absl::StatusCode::kInvalidArgument);
  KvCacheSpec twice = PagedLatentSpec(2, 8, 4, WeightDType::kFloat32);
  twice.groups.push_back(twice.groups[0]);
  EXPECT_NE(twice.Validate().message().find("layer 0"), std::string::npos) << twice.Validate();
  KvCacheSpec gap = PagedLatentSpec(1, 8, 4, WeightDType::kFloat32);
  gap.groups[0].layers = {0, 2};
  EXPECT_NE(gap.Validate().message().find("3 layers"), std::string::npos) << gap.Validate();
  KvCacheSpec bad = PagedLatentSpec(1, 0, 4, WeightDType::kFloat32);
  EXPECT_NE(bad.Validate().message().find("latent 0"), std::string::npos) << bad.Validate();
}

}  // namespace
}  // namespace deepinfer
