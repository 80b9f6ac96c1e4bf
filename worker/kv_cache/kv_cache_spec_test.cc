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
  EXPECT_EQ(s.WithDType(WeightDType::kBFloat16)->BytesPerToken(), 3 * (32 + 16) * 2);
  // A latent entry depends only on the tokens up to its position: blocks can be shared.
  EXPECT_EQ(KvCacheKindPrefixReuse(KvCacheKind::kPagedLatent), PrefixReuse::kShareBlocks);
  EXPECT_TRUE(s.SharesPrefixBlocks());
  EXPECT_EQ(s.EntrySpan(), 1);
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

// DeepSeek-V4-Flash's cache (hidden 4096, 43 layers, head_dim 512, window 128, HF's default
// schedule: layers 0-2 HCA, then CSA / HCA alternating = 20 CSA + 23 HCA layers, CSA ratio 4,
// HCA ratio 128, index_head_dim 128), sizes worked out by hand:
//   paged per token: CSA (512 + 128) * 4 B / 4 = 640 B, HCA 512 * 4 B / 128 = 16 B
//     -> 20 * 640 + 23 * 16 = 13,168 B per token
//   per sequence: window ring 128 * 512 * 4 B = 256 KiB in every layer; HCA compressor rows
//     128 * (512 + 512) * 4 B = 512 KiB; CSA compressor rows 8 * (1024 + 1024) * 4 B = 64 KiB
//     and indexer rows 8 * (256 + 256) * 4 B = 16 KiB
//     -> 43 * 256 + 23 * 512 + 20 * (64 + 16) = 24,384 KiB per sequence
TEST(KvCacheSpecTest, DeepSeekV4FlashSizes) {
  KvCacheGroupSpec csa, hca;
  csa.kind = KvCacheKind::kCompressedSparse;
  hca.kind = KvCacheKind::kCompressed;
  for (KvCacheGroupSpec* g : {&csa, &hca}) {
    g->head_dim = 512;
    g->window = 128;
  }
  csa.ratio = 4;
  csa.index_dim = 128;
  hca.ratio = 128;
  hca.layers = {0, 1, 2};
  for (int32_t l = 3; l < 43; ++l) (l % 2 ? csa : hca).layers.push_back(l);
  ASSERT_EQ(csa.layers.size(), 20u);
  ASSERT_EQ(hca.layers.size(), 23u);
  KvCacheSpec s{{csa, hca}};
  ASSERT_TRUE(s.Validate().ok()) << s.Validate();
  ASSERT_TRUE(s.ValidateBlockSize(16).ok());
  EXPECT_EQ(s.BytesPerToken(), 13168);
  EXPECT_EQ(s.BytesPerBlock(16), 16 * 13168);
  EXPECT_EQ(s.StateBytesPerSequence(), 24384 * 1024);
  // Spare rows for 3 drafts per step: 3 more rows of every ring, paged entries unchanged:
  // 43 window rings x 3 x 512 floats, 23 HCA x 3 x 1024, 20 CSA x 3 x (2048 + 512), 4 bytes each.
  KvCacheSpec spare = s;
  for (KvCacheGroupSpec& g : spare.groups) g.spare_rows = 3;
  ASSERT_TRUE(spare.Validate().ok());
  EXPECT_EQ(spare.BytesPerToken(), 13168);
  EXPECT_EQ(spare.StateBytesPerSequence(), (24384 + 1134) * 1024);
  spare.groups[0].spare_rows = -1;
  EXPECT_FALSE(spare.Validate().ok());
  // bf16 --kv-cache-dtype leaves the V4 kinds in float32.
  EXPECT_EQ(s.WithDType(WeightDType::kBFloat16)->BytesPerToken(), 13168);
  // fp8 has no layout for them: refused, naming the kind.
  const absl::StatusOr<KvCacheSpec> fp8 = s.WithDType(WeightDType::kFp8E4M3);
  ASSERT_FALSE(fp8.ok());
  EXPECT_EQ(fp8.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(fp8.status().message().find("compressed_sparse"), std::string::npos) << fp8.status();
  // Prefix reuse: blocks hold the paged entries, the rings and compressor rows are rebuilt by a
  // bounded replay; an HCA entry covers 128 positions, 8 blocks of 16.
  EXPECT_EQ(KvCacheKindPrefixReuse(KvCacheKind::kCompressed), PrefixReuse::kBoundedReplay);
  EXPECT_FALSE(s.SharesPrefixBlocks());
  EXPECT_EQ(s.EntrySpan(), 128);
  // A block size that does not page an HCA entry evenly (512 floats per 128 positions).
  hca.ratio = 3;
  const KvCacheSpec uneven{{csa, hca}};
  EXPECT_FALSE(uneven.ValidateBlockSize(16).ok());
}

TEST(KvCacheSpecTest, Fp8LatentCountsTheEntryBytes) {
  // DeepSeek-V3: 61 layers of latent 512 + rope 64. FP8: 512 e4m3 + 64 bf16 + a 4-byte scale,
  // padded to 656 bytes, against 1152 in bf16.
  const KvCacheSpec bf16 = PagedLatentSpec(61, 512, 64, WeightDType::kBFloat16);
  const absl::StatusOr<KvCacheSpec> fp8 = bf16.WithDType(WeightDType::kFp8E4M3);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(bf16.BytesPerToken(), 61 * 1152);
  EXPECT_EQ(fp8->BytesPerToken(), 61 * 656);
  EXPECT_EQ(fp8->BytesPerBlock(64), 61 * 656 * 64);
  EXPECT_EQ(fp8->ToString(), "paged_latent x61 layers (512+64, float8_e4m3)");
}

TEST(KvCacheSpecTest, SlidingWindowHasStateOnly) {
  KvCacheGroupSpec g;
  g.kind = KvCacheKind::kSlidingWindow;
  g.layers = {0};
  g.head_dim = 32;
  g.window = 8;
  KvCacheSpec s{{g}};
  ASSERT_TRUE(s.Validate().ok()) << s.Validate();
  EXPECT_EQ(s.BytesPerToken(), 0);
  EXPECT_EQ(s.StateBytesPerSequence(), 8 * 32 * 4);
  EXPECT_EQ(s.EntrySpan(), 1);  // no paged entries
  g.window = 0;
  const KvCacheSpec no_window{{g}};
  EXPECT_NE(no_window.Validate().message().find("window 0"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
