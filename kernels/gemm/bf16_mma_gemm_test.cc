// Bf16MmaGroupedGemm against a host reference: the activations rounded to bf16 (as
// the kernel takes them), the bf16 weights, the sum in double. The products are exact on the tensor
// cores; only the summation rounds: a k16 MMA adds its products to the accumulator with at most two
// fp32 roundings (up to 2^-23 each), each 128-wide block's sum is added to the accumulator (one
// more) and up to eight k-slices are added (eight). So |got - want| <= (k / 4 + 64) * 2^-24 * sum_p
// |a_p w_p| for a correct kernel, while a wrong element, half, block or row is off by about |want|
// ~ sum |a w| / sqrt(k), far more. Then the batch-invariant use: at a fixed k split a row's outputs
// are the same bits alone and among many rows at any place in its group, with any tile variant and
// row tile. Skips itself without a GPU.
#include "kernels/gemm/bf16_mma_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace kernels {
namespace {

using testing::DeviceArray;
using testing::SameBits;

double Unit(int64_t k) { return std::ldexp(1.0, -24) * (k / 4.0 + 64.0); }

// Every tile variant (all_rows aside): [0, 4) narrow, narrow+shared, wide, wide+shared; [4, 8)
// the same with two_blocks_per_sm.
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

// AllTiles, then all_rows, then the narrow tiles of AllTiles with rows_by_group ([9, 13): narrow,
// narrow+shared, then the same with two_blocks_per_sm).
std::vector<MmaTileOptions> AllGroupedTiles() {
  std::vector<MmaTileOptions> v = AllTiles();
  v.emplace_back();
  v.back().all_rows = true;
  for (const MmaTileOptions& o : AllTiles()) {
    if (o.wide) continue;
    v.push_back(o);
    v.back().rows_by_group = true;
  }
  return v;
}

// AllTiles' index of the tile that rows_by_group tile o changes.
size_t ByRowsTwin(const MmaTileOptions& o) {
  return (o.two_blocks_per_sm ? 4 : 0) + (o.shared_activations ? 1 : 0);
}

std::string TileName(const MmaTileOptions& o) {
  if (o.all_rows) return "all_rows";
  return std::string(o.wide ? "wide" : "narrow") + (o.shared_activations ? "+shared" : "") +
         (o.two_blocks_per_sm ? "+2blocks" : "") + (o.rows_by_group ? "+rows_by_group" : "");
}

// Host weights of `groups` experts [n, k] (bf16 bits) and their device copies and pointer array.
struct Experts {
  std::vector<std::vector<uint16_t>> host;
  std::vector<std::unique_ptr<DeviceArray<uint16_t>>> device;
  std::unique_ptr<DeviceArray<const uint16_t*>> pointers;
};

Experts MakeExperts(int32_t groups, int64_t n, int64_t k, uint32_t seed) {
  Experts e;
  std::vector<const uint16_t*> ptrs;
  for (int32_t g = 0; g < groups; ++g) {
    e.host.push_back(FloatsToBf16Bits(testing::RandomFloats(n * k, seed + 17 * g, 0.05f)));
    e.device.push_back(std::make_unique<DeviceArray<uint16_t>>(e.host.back()));
    ptrs.push_back(e.device.back()->get());
  }
  e.pointers = std::make_unique<DeviceArray<const uint16_t*>>(ptrs);
  return e;
}

// Checks the used rows of c against the host reference (a's bf16 bits, the experts' weights).
void ExpectMatchesReference(const std::vector<float>& c, const std::vector<uint16_t>& a,
                            const std::vector<int32_t>& offsets, const Experts& w, int64_t n,
                            int64_t k) {
  double worst = 0;
  const int32_t groups = static_cast<int32_t>(offsets.size()) - 1;
  for (int32_t g = 0; g < groups; ++g) {
    for (int32_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, mag = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double prod = static_cast<double>(Bf16BitsToFloat(a[r * k + q])) *
                              Bf16BitsToFloat(w.host[g][j * k + q]);
          want += prod;
          mag += std::abs(prod);
        }
        const double d = std::abs(static_cast<double>(c[r * n + j]) - want);
        const double bound = Unit(k) * mag + 1e-30;
        ASSERT_LE(d, bound) << "group " << g << " row " << r << " feature " << j << ": got "
                            << c[r * n + j] << " want " << want;
        worst = std::max(worst, d / bound);
      }
    }
  }
  std::cout << "[bf16-mma] largest error " << worst << " of its bound\n";
}

struct GroupedCase {
  std::vector<int32_t> rows_per_group;
  int64_t n, k;
  int32_t hint;
};

class Bf16MmaGroupedGemmTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Bf16MmaGroupedGemmTest, MatchesPerGroupReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const GroupedCase t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " n " << t.n << " k " << t.k);
  const int32_t groups = static_cast<int32_t>(t.rows_per_group.size());
  std::vector<int32_t> offsets(groups + 1, 0);
  for (int32_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + t.rows_per_group[g];
  const int32_t used = offsets[groups];
  const int32_t max_rows = used + 5;  // rows past the last group stay untouched
  const Experts w = MakeExperts(groups, t.n, t.k, seed);
  const std::vector<uint16_t> a =
      FloatsToBf16Bits(testing::RandomFloats(static_cast<size_t>(max_rows) * t.k, seed + 1));
  DeviceArray<uint16_t> da(a);
  DeviceArray<int32_t> doff(offsets);
  DeviceArray<float> dc(static_cast<size_t>(max_rows) * t.n);
  Bf16MmaGroupedGemmParams p;
  p.num_groups = groups;
  p.max_rows = max_rows;
  p.offsets = doff.get();
  p.n = t.n;
  p.k = t.k;
  p.a = da.get();
  p.weights = w.pointers->get();
  p.c = dc.get();
  p.rows_per_group_hint = t.hint;
  const size_t used_elems = static_cast<size_t>(used) * t.n;
  auto launch = [&](const Bf16MmaGroupedGemmParams& q, std::vector<float>* out) {
    dc.Poison();
    ASSERT_TRUE(Bf16MmaGroupedGemmSupports(q));
    DEEPINFER_CUDA_OK(Bf16MmaGroupedGemm(q, nullptr));
    DEEPINFER_CUDA_OK(dc.Download(out));
    for (size_t i = used_elems; i < out->size(); ++i) {
      ASSERT_TRUE(std::isnan((*out)[i])) << "row past the groups written at " << i;
    }
  };
  // Every tile variant with the split picked from the shape, those without two_blocks_per_sm and
  // all_rows against the reference; the shared activation fragments, the register cap and the
  // row tiles by group give the bits of their twin (the narrow and wide tiles and all_rows may
  // split k differently).
  const std::vector<MmaTileOptions> tiles = AllGroupedTiles();
  std::vector<std::vector<float>> got;
  for (size_t v = 0; v < tiles.size(); ++v) {
    SCOPED_TRACE(TileName(tiles[v]));
    p.tile = tiles[v];
    got.emplace_back();
    launch(p, &got.back());
    if (tiles[v].rows_by_group) {
      EXPECT_TRUE(SameBits(got[ByRowsTwin(tiles[v])].data(), got[v].data(), used_elems))
          << "rows by group";
    } else if (v < 4 || tiles[v].all_rows) {
      ExpectMatchesReference(got.back(), a, offsets, w, t.n, t.k);
    } else {
      EXPECT_TRUE(SameBits(got[v - 4].data(), got[v].data(), used_elems)) << "the register cap";
    }
  }
  EXPECT_TRUE(SameBits(got[0].data(), got[1].data(), used_elems)) << "narrow vs narrow+shared";
  EXPECT_TRUE(SameBits(got[2].data(), got[3].data(), used_elems)) << "wide vs wide+shared";

  // Each fixed k split the kernel takes: the same bits with every tile variant and row tile
  // (all_rows' passes of 32, 64 and 128 rows among them, and rows_by_group's one pass of 8, 16,
  // 24 or 32 rows for a group of at most the hint's rows).
  const int64_t kblocks = (t.k + 127) / 128;
  for (const int32_t k_split : {1, 2, 4, 8}) {
    if (k_split > 1 && 2 * k_split > kblocks) continue;
    p.k_split = k_split;
    std::vector<float> first;
    for (const int32_t hint : {1, 12, 24, 40, 100}) {
      for (const MmaTileOptions& tile : tiles) {
        SCOPED_TRACE(::testing::Message()
                     << "k_split " << k_split << ", hint " << hint << " " << TileName(tile));
        p.rows_per_group_hint = hint;
        p.tile = tile;
        std::vector<float> out;
        if (first.empty()) {
          launch(p, &first);
          ExpectMatchesReference(first, a, offsets, w, t.n, t.k);
        } else {
          launch(p, &out);
          EXPECT_TRUE(SameBits(first.data(), out.data(), used_elems));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Bf16MmaGroupedGemmTest,
    ::testing::Values(
        // Decode: fewer rows than groups, empty groups, one block row per busy group.
        GroupedCase{{0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 3}, 256, 384, 1},
        // Groups above one pass (8, 16 and 32 rows a pass), a hint below the largest group; k a
        // multiple of 64 (a last 128-wide block with its second chunk past k) or of 8 only (some
        // of a chunk's 8-value halves past k, the other half in range), n not a multiple of 16.
        GroupedCase{{9, 0, 17, 3, 40}, 96, 320, 8}, GroupedCase{{33, 5, 0, 16}, 70, 200, 16},
        GroupedCase{{70, 1, 2}, 130, 136, 0}, GroupedCase{{4, 4}, 48, 40, 4},
        GroupedCase{{3, 0, 5}, 32, 8, 0}, GroupedCase{{12, 7}, 64, 264, 12},
        // Moonlight's experts (hidden 2048, intermediate 1408): gate_up, down.
        GroupedCase{{1, 0, 2, 1, 0, 0, 12, 0}, 2816, 2048, 12},
        GroupedCase{{1, 0, 2, 1, 0, 0, 12, 0}, 2048, 1408, 12}));

// The batch-invariant mode's use: with a fixed k split, one row computed alone (the only row of
// the launch, the default tile) gives the same bits as the same row among many: at the first, a
// middle and the last place of a group of 2 to 300 rows, with other groups busy, the hint
// following the rows as the backend's does, with the default tile, all_rows and the mode's tile
// (kBf16BatchInvariantTile: one pass of 8, 16, 24 or 32 rows by the group's rows). The row alone
// also matches the reference.
TEST(Bf16MmaGroupedGemmBatchInvariantTest, RowAloneIsTheRowAmongMany) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int32_t groups = 6, target_group = 3, max_group = 300;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{2816, 2048}, {2048, 1408}, {300, 1032}};
  for (const auto& shape : shapes) {
    const int64_t n = shape.first, k = shape.second;
    const Experts w = MakeExperts(groups, n, k, seed + static_cast<uint32_t>(n));
    const int32_t max_rows = groups * max_group;
    // Row 0 of `pool` is the row under test; the others fill the groups.
    const std::vector<uint16_t> pool =
        FloatsToBf16Bits(testing::RandomFloats(static_cast<size_t>(max_rows) * k, seed + 2));
    DeviceArray<uint16_t> da(static_cast<size_t>(max_rows) * k);
    DeviceArray<int32_t> doff(groups + 1);
    DeviceArray<float> dc(static_cast<size_t>(max_rows) * n);
    for (const int32_t k_split : {1, 2}) {
      Bf16MmaGroupedGemmParams p;
      p.num_groups = groups;
      p.offsets = doff.get();
      p.n = n;
      p.k = k;
      p.a = da.get();
      p.weights = w.pointers->get();
      p.c = dc.get();
      p.k_split = k_split;
      // rows[g] rows in group g, the row under test at place `at` of target_group; returns its
      // outputs.
      auto run = [&](const std::vector<int32_t>& rows, int32_t at, const MmaTileOptions& tile,
                     std::vector<float>* out) {
        std::vector<int32_t> offsets(groups + 1, 0);
        for (int32_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + rows[g];
        std::vector<uint16_t> a(static_cast<size_t>(offsets[groups]) * k);
        const int32_t target = offsets[target_group] + at;
        for (int32_t r = 0, next = 1; r < offsets[groups]; ++r) {
          const int32_t src = r == target ? 0 : next++;
          std::copy_n(pool.begin() + static_cast<size_t>(src) * k, k, a.begin() + r * k);
        }
        da.Upload(a);
        doff.Upload(offsets);
        p.max_rows = offsets[groups];
        p.rows_per_group_hint = *std::max_element(rows.begin(), rows.end());
        p.tile = tile;
        dc.Poison();
        ASSERT_TRUE(Bf16MmaGroupedGemmSupports(p));
        DEEPINFER_CUDA_OK(Bf16MmaGroupedGemm(p, nullptr));
        std::vector<float> c;
        DEEPINFER_CUDA_OK(dc.Download(&c));
        out->assign(c.begin() + static_cast<size_t>(target) * n,
                    c.begin() + static_cast<size_t>(target + 1) * n);
      };
      std::vector<int32_t> rows(groups, 0);
      rows[target_group] = 1;
      MmaTileOptions all_rows;
      all_rows.all_rows = true;
      std::vector<float> alone;
      run(rows, 0, kBf16GroupedMmaTile, &alone);
      {
        SCOPED_TRACE(::testing::Message() << "alone, n " << n << " k " << k);
        ExpectMatchesReference(alone, pool, {0, 1}, Experts{{w.host[target_group]}, {}, {}}, n, k);
      }
      std::uniform_int_distribution<int32_t> other(0, max_group);
      for (const int32_t size : {2, 7, 8, 9, 16, 17, 31, 33, 64, 100, 129, 300}) {
        for (const int32_t at : {0, size / 2, size - 1}) {
          for (const MmaTileOptions& tile :
               {kBf16GroupedMmaTile, all_rows, kBf16BatchInvariantTile}) {
            SCOPED_TRACE(::testing::Message()
                         << "n " << n << " k " << k << " k_split " << k_split << " group of "
                         << size << ", place " << at << " " << TileName(tile));
            for (int32_t g = 0; g < groups; ++g) rows[g] = other(gen);
            rows[target_group] = size;
            std::vector<float> among;
            run(rows, at, tile, &among);
            EXPECT_TRUE(SameBits(alone.data(), among.data(), static_cast<size_t>(n)));
          }
        }
      }
    }
  }
}

TEST(Bf16MmaGroupedGemmTest, RejectsWhatItCannotTake) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<uint16_t> w(64 * 64), a(4 * 64);
  DeviceArray<float> c(4 * 64);
  DeviceArray<int32_t> off(std::vector<int32_t>{0, 4});
  std::vector<const uint16_t*> wp = {w.get()};
  DeviceArray<const uint16_t*> dwp(wp);
  Bf16MmaGroupedGemmParams p;
  p.num_groups = 1;
  p.max_rows = 4;
  p.offsets = off.get();
  p.n = 64;
  p.k = 64;
  p.a = a.get();
  p.weights = dwp.get();
  p.c = c.get();
  EXPECT_TRUE(Bf16MmaGroupedGemmSupports(p));
  Bf16MmaGroupedGemmParams q = p;
  q.k = 60;  // not a multiple of 8
  EXPECT_FALSE(Bf16MmaGroupedGemmSupports(q));
  EXPECT_EQ(Bf16MmaGroupedGemm(q, nullptr), cudaErrorInvalidValue);
  q = p;
  q.a = a.get() + 1;  // not 16-byte aligned
  EXPECT_FALSE(Bf16MmaGroupedGemmSupports(q));
  q = p;
  q.k_split = 2;  // more than half the k blocks (one)
  EXPECT_FALSE(Bf16MmaGroupedGemmSupports(q));
  q = p;
  q.tile = kGroupedMmaTile;
  q.tile.rows_by_group = true;  // rows by group is the narrow tile's
  EXPECT_FALSE(Bf16MmaGroupedGemmSupports(q));
  q.tile.wide = false;
  EXPECT_TRUE(Bf16MmaGroupedGemmSupports(q));
  Bf16MmaGroupedGemmParams zero;
  EXPECT_FALSE(Bf16MmaGroupedGemmSupports(zero));
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
