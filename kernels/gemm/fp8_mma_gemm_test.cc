// Fp8MmaGemm and Fp8MmaGroupedGemm against a host reference on the dequantised weights
// (kernels/testing/fp8_test_util.h: the loader's e4m3 decoding times the block scale, activations
// rounded to bf16, the sum in double). The products are exact on the tensor cores (bf16 x bf16
// widened from e4m3); only the summation rounds: a k16 MMA adds its products to the accumulator
// with at most two fp32 roundings, which may truncate (up to 2^-23 each), each 128-wide block's sum
// is scaled and accumulated (two roundings) and up to eight k-slices are added (eight). Along any
// path that is at most k / 8 + 26 roundings of 2^-23 relative to the magnitudes summed, so
// |got - want| <= (k / 4 + 64) * 2^-24 * sum_p |a_p w_p| holds for a correct kernel, while a
// wrong scale, block, element or row is off by about |want| ~ sum |a w| / sqrt(k), far more.
// Skips itself without a GPU.
#include "kernels/gemm/fp8_mma_gemm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace kernels {
namespace {

using fp8_testing::Bf16Rounded;
using fp8_testing::ExpectDenseMatches;
using fp8_testing::ExpectGroupedMatches;
using fp8_testing::GroupedOperands;
using fp8_testing::HostFp8;
using fp8_testing::MakeGroupedOperands;
using fp8_testing::MakeWeight;
using testing::DeviceArray;
using testing::SameBits;

double Unit(int64_t k) { return std::ldexp(1.0, -24) * (k / 4.0 + 64.0); }

// Every tile-loop variant (MmaTileOptions), the default first: [0, 4) narrow, narrow+shared,
// wide, wide+shared; [4, 8) the same with two_blocks_per_sm.
std::vector<MmaTileOptions> AllTiles() {
  std::vector<MmaTileOptions> v;
  for (const bool two_blocks : {false, true}) {
    for (const bool wide : {false, true}) {
      for (const bool shared : {false, true}) {
        MmaTileOptions o;
        o.wide = wide;
        o.shared_activations = shared;
        o.two_blocks_per_sm = two_blocks;
        v.push_back(o);
      }
    }
  }
  return v;
}

// AllTiles, then the dense kernel's all_rows.
std::vector<MmaTileOptions> AllDenseTiles() {
  std::vector<MmaTileOptions> v = AllTiles();
  v.emplace_back();
  v.back().all_rows = true;
  return v;
}

std::string TileName(const MmaTileOptions& o) {
  if (o.all_rows) return "all_rows";
  return std::string(o.wide ? "wide" : "narrow") + (o.shared_activations ? "+shared" : "") +
         (o.two_blocks_per_sm ? "+2blocks" : "");
}

struct DenseCase {
  int64_t m, n, k, extra_lda, extra_ldw, split;
  bool a_bf16, accumulate;
};

void RunDense(const DenseCase& t, HostFp8 w, uint32_t seed) {
  const int64_t lda = t.k + t.extra_lda, ldc = t.n + 3;
  std::vector<float> a = testing::RandomFloats(t.m * lda, seed + 1);
  std::vector<float> c0 = testing::RandomFloats(t.m * ldc, seed + 2);
  DeviceArray<uint8_t> dw(w.data);
  DeviceArray<float> ds(w.scales);
  DeviceArray<float> da(a);
  DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
  Fp8MmaGemmParams p;
  p.m = t.m;
  p.n = t.n;
  p.k = t.k;
  p.a_bf16 = t.a_bf16;
  p.a = t.a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
  p.lda = lda;
  p.w.data = dw.get();
  p.w.ldw = w.ldw;
  p.w.scales = ds.get();
  p.w.scale_ld = w.scale_ld;
  p.w.split_rows = t.split;
  p.ldc = ldc;
  p.accumulate = t.accumulate;
  // Every tile variant; those without two_blocks_per_sm against the reference; the shared
  // activation fragments and the register cap give their twin's bits (the same k split: the
  // narrow and wide tiles may split k differently).
  const std::vector<MmaTileOptions> tiles = AllTiles();
  std::vector<std::vector<float>> got;
  for (size_t v = 0; v < tiles.size(); ++v) {
    SCOPED_TRACE(TileName(tiles[v]));
    p.tile = tiles[v];
    DeviceArray<float> dct(c0);
    p.c = dct.get();
    ASSERT_TRUE(Fp8MmaGemmSupports(p));
    DEEPINFER_CUDA_OK(Fp8MmaGemm(p, nullptr));
    got.emplace_back();
    DEEPINFER_CUDA_OK(dct.Download(&got.back()));
    if (v < 4) {
      ExpectDenseMatches(got.back(), c0, ldc, Bf16Rounded(a), lda, t.m, w, t.accumulate, Unit(t.k));
    } else {
      EXPECT_TRUE(SameBits(got[v - 4], got[v], got[v].size())) << "the register cap";
    }
  }
  EXPECT_TRUE(SameBits(got[0], got[1], got[0].size())) << "narrow vs narrow+shared";
  EXPECT_TRUE(SameBits(got[2], got[3], got[2].size())) << "wide vs wide+shared";

  // all_rows (its own k split) against the reference, then at each fixed k split it takes the
  // narrow tile's bits (the same MMAs in the same order, the same k-slices).
  MmaTileOptions all_rows;
  all_rows.all_rows = true;
  const int64_t kblocks = (t.k + 127) / 128;
  for (const int32_t k_split : {0, 1, 2, 4, 8}) {
    if (k_split > 1 && 2 * k_split > kblocks) continue;
    SCOPED_TRACE(::testing::Message() << "all_rows, k_split " << k_split);
    p.k_split = k_split;
    std::vector<float> narrow, rows;
    for (const bool all : {false, true}) {
      p.tile = all ? all_rows : MmaTileOptions();
      DeviceArray<float> dct(c0);
      p.c = dct.get();
      ASSERT_TRUE(Fp8MmaGemmSupports(p));
      DEEPINFER_CUDA_OK(Fp8MmaGemm(p, nullptr));
      DEEPINFER_CUDA_OK(dct.Download(all ? &rows : &narrow));
    }
    if (k_split == 0) {
      ExpectDenseMatches(rows, c0, ldc, Bf16Rounded(a), lda, t.m, w, t.accumulate, Unit(t.k));
    } else {
      EXPECT_TRUE(SameBits(narrow, rows, rows.size())) << "narrow vs all_rows";
    }
  }
}

class Fp8MmaGemmTest : public ::testing::TestWithParam<DenseCase> {};

TEST_P(Fp8MmaGemmTest, MatchesDequantisedReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const DenseCase t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " m " << t.m << " n " << t.n << " k " << t.k);
  std::mt19937 gen(seed);
  RunDense(t, MakeWeight(t.n, t.k, t.k + t.extra_ldw, t.split, &gen), seed);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8MmaGemmTest,
    ::testing::Values(
        // Row counts around the 8 / 16 / 32-row passes; n not a multiple of 16; k a multiple of
        // 16 only (the last 128-block partial, the last 64-step empty for some lanes).
        DenseCase{1, 200, 384, 0, 0, 0, false, false}, DenseCase{2, 77, 208, 0, 0, 0, true, true},
        DenseCase{7, 130, 720, 8, 16, 0, false, false}, DenseCase{8, 96, 144, 0, 0, 0, true, false},
        DenseCase{9, 300, 1024, 0, 0, 0, false, true},
        DenseCase{17, 64, 2048, 0, 0, 0, true, false},
        DenseCase{33, 129, 4112, 4, 0, 0, false, false},
        DenseCase{100, 48, 256, 0, 0, 0, false, false},
        // all_rows' passes: two of 128 rows (the second of 2), 96 rows with padded strides.
        DenseCase{130, 160, 512, 0, 0, 80, true, true},
        DenseCase{96, 300, 2048, 8, 16, 0, false, false},
        // [gate; up] stacked at 80 rows (two scale grids; a 16-row tile straddles the split)
        // and at a multiple of 128.
        DenseCase{5, 160, 256, 0, 0, 80, false, false},
        DenseCase{64, 512, 256, 0, 0, 256, true, false},
        // Moonlight decode shapes (hidden 2048: q, kv_a, o_proj, expert down k = 1408) and
        // DeepSeek-V3's (hidden 7168: kv_a; q_b from q_lora 1536).
        DenseCase{1, 3072, 2048, 0, 0, 0, false, false},
        DenseCase{3, 576, 2048, 0, 0, 0, false, false},
        DenseCase{64, 2048, 1408, 0, 0, 0, true, false},
        DenseCase{128, 2048, 2048, 0, 0, 0, false, true},
        DenseCase{4, 576, 7168, 0, 0, 0, false, false},
        DenseCase{16, 1024, 1536, 0, 0, 0, false, false}));

// Weights that are all e4m3 subnormals (and zeros): the bf16 widening keeps them exactly (a
// kernel that flushed subnormal bf16 operands would be off by the whole sum).
TEST(Fp8MmaGemmSubnormalTest, WidensSubnormalWeightsExactly) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  HostFp8 w = MakeWeight(64, 256, 256, 0, &gen);
  std::uniform_int_distribution<int> d(0, 15);
  for (uint8_t& b : w.data) {
    const int v = d(gen);
    b = static_cast<uint8_t>((v & 8) << 4 | (v & 7));  // sign, exponent 0, mantissa 0..7
  }
  RunDense(DenseCase{12, 64, 256, 0, 0, 0, false, false}, w, seed);
}

struct GroupedCase {
  std::vector<int32_t> rows_per_group;
  int64_t n, k, split;
  int32_t hint;
};

class Fp8MmaGroupedGemmTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Fp8MmaGroupedGemmTest, MatchesPerGroupReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const GroupedCase t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " n " << t.n << " k " << t.k);
  std::mt19937 gen(seed);
  const int32_t groups = static_cast<int32_t>(t.rows_per_group.size());
  const GroupedOperands g = MakeGroupedOperands(t.rows_per_group, t.n, t.k, t.split, &gen);
  const std::vector<float> a = testing::RandomFloats(static_cast<size_t>(g.max_rows) * t.k, seed);
  DeviceArray<uint16_t> da(FloatsToBf16Bits(a));
  DeviceArray<float> dc(static_cast<size_t>(g.max_rows) * t.n);
  dc.Poison();
  Fp8MmaGroupedGemmParams p;
  p.num_groups = groups;
  p.max_rows = g.max_rows;
  p.offsets = g.doff->get();
  p.n = t.n;
  p.k = t.k;
  p.a = da.get();
  p.weights = g.dwp->get();
  p.scales = g.dsp->get();
  p.scale_ld = g.w[0].scale_ld;
  p.split_rows = t.split;
  p.c = dc.get();
  p.rows_per_group_hint = t.hint;
  // Every tile variant, those without two_blocks_per_sm against the reference; the shared
  // activation fragments and the register cap give the bits of their twin (the same sums in the
  // same order).
  const size_t used = static_cast<size_t>(g.used) * t.n;
  auto launch = [&](const Fp8MmaGroupedGemmParams& q, std::vector<float>* out) {
    dc.Poison();
    ASSERT_TRUE(Fp8MmaGroupedGemmSupports(q));
    DEEPINFER_CUDA_OK(Fp8MmaGroupedGemm(q, nullptr));
    DEEPINFER_CUDA_OK(dc.Download(out));
  };
  auto run = [&](const Fp8MmaGroupedGemmParams& q, std::vector<float>* out) {
    launch(q, out);
    ExpectGroupedMatches(*out, Bf16Rounded(a), g, t.n, t.k, Unit(t.k));
  };
  const std::vector<MmaTileOptions> tiles = AllTiles();
  std::vector<std::vector<float>> got;
  for (size_t v = 0; v < tiles.size(); ++v) {
    SCOPED_TRACE(TileName(tiles[v]));
    p.tile = tiles[v];
    got.emplace_back();
    if (v < 4) {
      run(p, &got.back());
    } else {
      launch(p, &got.back());
      EXPECT_TRUE(SameBits(got[v - 4], got[v], used)) << "the register cap";
    }
  }
  EXPECT_TRUE(SameBits(got[0], got[1], used)) << "narrow vs narrow+shared";
  EXPECT_TRUE(SameBits(got[2], got[3], used)) << "wide vs wide+shared";

  // The batch-invariant mode's fixed k split: the same bits with every tile variant and row
  // tile (the hint), as each output's MMAs do not depend on them.
  p.k_split = 1;
  std::vector<float> first;
  for (const int32_t hint : {1, 12, 40}) {
    for (const MmaTileOptions& tile : AllTiles()) {
      SCOPED_TRACE(::testing::Message() << "k_split 1, hint " << hint << " " << TileName(tile));
      p.rows_per_group_hint = hint;
      p.tile = tile;
      std::vector<float> out;
      if (first.empty()) {
        run(p, &first);
      } else {
        launch(p, &out);
        EXPECT_TRUE(SameBits(first, out, used));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8MmaGroupedGemmTest,
    ::testing::Values(
        // Decode: fewer rows than groups, empty groups, one block row per busy group.
        GroupedCase{{0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 3}, 256, 384, 128, 1},
        // Groups above one pass (8, 16 and 32 rows a pass), a hint below the largest group.
        GroupedCase{{9, 0, 17, 3, 40}, 96, 256, 48, 8},
        GroupedCase{{33, 5, 0, 16}, 70, 208, 35, 16}, GroupedCase{{70, 1, 2}, 130, 144, 0, 0},
        // Moonlight's experts (hidden 2048, intermediate 1408: gate_up stacked at 1408, down).
        GroupedCase{{1, 0, 2, 1, 0, 0, 12, 0}, 2816, 2048, 1408, 12},
        GroupedCase{{1, 0, 2, 1, 0, 0, 12, 0}, 2048, 1408, 0, 12}));

// The batch-invariant mode: with a fixed k split every row's sums are the same bits at any row
// count (all_rows' passes of 32, 64 and 128 rows among them) and with every tile variant (each
// output's MMAs, their order and the k-slices' sum do not depend on the rows or the tile), and
// match the reference.
TEST(Fp8MmaGemmBatchInvariantTest, RowsIndependentOfRowCountAndTile) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t n = 300, k = 1024, max_m = 130;
  const HostFp8 w = MakeWeight(n, k, k, 0, &gen);
  const std::vector<float> a = testing::RandomFloats(max_m * k, seed + 1);
  DeviceArray<uint8_t> dw(w.data);
  DeviceArray<float> ds(w.scales);
  DeviceArray<float> da(a);
  DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
  DeviceArray<float> dc(max_m * n);
  for (const bool a_bf16 : {false, true}) {
    for (const int32_t k_split : {1, 2, 4}) {
      Fp8MmaGemmParams p;
      p.n = n;
      p.k = k;
      p.a_bf16 = a_bf16;
      p.a = a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
      p.lda = k;
      p.w.data = dw.get();
      p.w.ldw = k;
      p.w.scales = ds.get();
      p.w.scale_ld = w.scale_ld;
      p.c = dc.get();
      p.ldc = n;
      p.k_split = k_split;
      std::vector<float> full;
      for (const MmaTileOptions& tile : AllDenseTiles()) {
        for (const int64_t m : {max_m, int64_t{1}, int64_t{5}, int64_t{8}, int64_t{9}, int64_t{16},
                                int64_t{17}, int64_t{33}, int64_t{64}, int64_t{65}, int64_t{128}}) {
          SCOPED_TRACE(::testing::Message() << "a_bf16 " << a_bf16 << " k_split " << k_split
                                            << " m " << m << " " << TileName(tile));
          p.m = m;
          p.tile = tile;
          dc.Poison();
          ASSERT_TRUE(Fp8MmaGemmSupports(p));
          DEEPINFER_CUDA_OK(Fp8MmaGemm(p, nullptr));
          std::vector<float> got;
          DEEPINFER_CUDA_OK(dc.Download(&got));
          if (full.empty()) {
            full = got;
            ExpectDenseMatches(got, got, n, Bf16Rounded(a), k, max_m, w, false, Unit(k));
          } else {
            EXPECT_TRUE(SameBits(full, got, m * n));
          }
        }
      }
    }
  }
}

// Every byte value as a weight (0x7F / 0xFF, e4m3's NaNs, read as +-480 as the header says):
// row i of the activations is the unit vector e_i, so c[i, j] is the widened weight (j, i) times
// a block scale of 1, exactly, for every k position of the block and every tile variant.
TEST(Fp8MmaGemmWidenTest, WidensEveryByteExactly) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const int64_t n = 256, k = 128, m = 128;
  HostFp8 w;
  w.n = n;
  w.k = k;
  w.ldw = k;
  w.scale_ld = Fp8ScaleLd(k);
  w.data.resize(n * k);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) w.data[j * k + p] = static_cast<uint8_t>((j + p) & 0xFF);
  }
  w.scales.assign(Fp8ScaleRows(n, 0) * w.scale_ld, 1.0f);
  std::vector<float> a(m * k, 0.0f);
  for (int64_t i = 0; i < m; ++i) a[i * k + i] = 1.0f;
  DeviceArray<uint8_t> dw(w.data);
  DeviceArray<float> ds(w.scales);
  DeviceArray<float> da(a);
  DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
  DeviceArray<float> dc(m * n);
  for (const bool a_bf16 : {false, true}) {
    for (const MmaTileOptions& tile : AllDenseTiles()) {
      for (const int64_t rows : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{40}, m}) {
        SCOPED_TRACE(::testing::Message()
                     << "a_bf16 " << a_bf16 << " rows " << rows << " " << TileName(tile));
        Fp8MmaGemmParams p;
        p.m = rows;
        p.n = n;
        p.k = k;
        p.a_bf16 = a_bf16;
        p.a = a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
        p.lda = k;
        p.w.data = dw.get();
        p.w.ldw = k;
        p.w.scales = ds.get();
        p.w.scale_ld = w.scale_ld;
        p.c = dc.get();
        p.ldc = n;
        p.tile = tile;
        dc.Poison();
        ASSERT_TRUE(Fp8MmaGemmSupports(p));
        DEEPINFER_CUDA_OK(Fp8MmaGemm(p, nullptr));
        std::vector<float> got;
        DEEPINFER_CUDA_OK(dc.Download(&got));
        int bad = 0;
        for (int64_t i = 0; i < rows && bad < 5; ++i) {
          for (int64_t j = 0; j < n && bad < 5; ++j) {
            const uint8_t byte = static_cast<uint8_t>((j + i) & 0xFF);
            const float want =
                (byte & 0x7F) == 0x7F ? ((byte & 0x80) ? -480.0f : 480.0f) : F8E4M3ToFloat(byte);
            if (got[i * n + j] != want) {
              ++bad;
              ADD_FAILURE() << "byte 0x" << std::hex << int{byte} << std::dec << " at k " << i
                            << ", row " << j << ": got " << got[i * n + j] << " want " << want;
            }
          }
        }
      }
    }
  }
}

TEST(Fp8MmaGemmTest, RejectsWhatItCannotTake) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<uint8_t> w(64 * 64);
  DeviceArray<float> s(4), a(4 * 64), c(4 * 64);
  Fp8MmaGemmParams p;
  p.m = 4;
  p.n = 64;
  p.k = 64;
  p.a = a.get();
  p.lda = 64;
  p.w.data = w.get();
  p.w.ldw = 64;
  p.w.scales = s.get();
  p.w.scale_ld = 1;
  p.c = c.get();
  p.ldc = 64;
  EXPECT_TRUE(Fp8MmaGemmSupports(p));
  Fp8MmaGemmParams q = p;
  q.k = q.lda = q.w.ldw = 56;  // k not a multiple of 16
  EXPECT_FALSE(Fp8MmaGemmSupports(q));
  EXPECT_EQ(Fp8MmaGemm(q, nullptr), cudaErrorInvalidValue);
  q = p;
  q.lda = 65;  // rows of a not 16-byte aligned
  EXPECT_FALSE(Fp8MmaGemmSupports(q));
  q = p;
  q.w.ldw = 72;  // weight rows not 16-byte aligned
  EXPECT_FALSE(Fp8MmaGemmSupports(q));
  q = p;
  q.w.scale_ld = 0;
  EXPECT_FALSE(Fp8MmaGemmSupports(q));
  Fp8MmaGroupedGemmParams g;  // all zero
  EXPECT_FALSE(Fp8MmaGroupedGemmSupports(g));
  EXPECT_EQ(Fp8MmaGroupedGemm(g, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
