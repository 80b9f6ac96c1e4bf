// GroupedGemmBf16 against GroupedGemmBf16Reference on fresh random data: slots of many sizes
// (empty ones with null weights, 1..7 rows to hit every row-tile remainder, and a large one),
// n not a multiple of the block's rows, offsets only in device memory, max_rows above the real
// row count (blocks without work), and rows past the last slot checked to stay poisoned.
#include "kernels/moe/grouped_gemm.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

struct Case {
  int32_t n, k;
  std::vector<int32_t> counts;  // rows per slot
  int32_t spare_rows;           // max_rows - real rows
  int32_t hint;                 // rows_per_slot_hint
  kernels::GroupedGemmAlgo algo;
};

const char* Name(kernels::GroupedGemmAlgo a) {
  switch (a) {
    case kernels::GroupedGemmAlgo::kAuto:
      return "auto";
    case kernels::GroupedGemmAlgo::kCudaCore:
      return "cuda-core";
    case kernels::GroupedGemmAlgo::kTensorCore:
      return "tensor-core";
  }
  return "?";
}

constexpr kernels::GroupedGemmAlgo kAlgos[] = {kernels::GroupedGemmAlgo::kCudaCore,
                                               kernels::GroupedGemmAlgo::kTensorCore,
                                               kernels::GroupedGemmAlgo::kAuto};

void RunCase(const Case& c) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "n " << c.n << " k " << c.k << " slots " << c.counts.size() << " hint " << c.hint
               << " algo " << Name(c.algo) << " seed " << seed);
  const int32_t slots = static_cast<int32_t>(c.counts.size());
  std::vector<int32_t> offsets(slots + 1, 0);
  for (int32_t s = 0; s < slots; ++s) offsets[s + 1] = offsets[s] + c.counts[s];
  const int32_t rows = offsets[slots], max_rows = rows + c.spare_rows;

  auto x = testing::RandomFloats(static_cast<size_t>(max_rows) * c.k, seed);
  // Weights only for busy slots (an empty slot's pointer is null: the kernel must not read it).
  std::vector<int32_t> matrix_of_slot(slots, -1);
  int32_t busy = 0;
  for (int32_t s = 0; s < slots; ++s) {
    if (c.counts[s] > 0) matrix_of_slot[s] = busy++;
  }
  auto wf = testing::RandomFloats(static_cast<size_t>(busy) * c.n * c.k, seed + 1, 0.05f);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = kernels::FloatToBf16(wf[i]);

  std::vector<const uint16_t*> host_w(slots, nullptr);
  for (int32_t s = 0; s < slots; ++s) {
    if (matrix_of_slot[s] >= 0) host_w[s] = w.data() + size_t(matrix_of_slot[s]) * c.n * c.k;
  }
  std::vector<float> want(static_cast<size_t>(max_rows) * c.n, 0.0f);
  kernels::GroupedGemmBf16Reference(slots, offsets.data(), c.n, c.k, x.data(), host_w, want.data());

  DeviceArray<float> dx(x), dy(want.size());
  DeviceArray<uint16_t> dw(w);
  DeviceArray<int32_t> doff(offsets);
  std::vector<uint64_t> ptrs(slots, 0);
  for (int32_t s = 0; s < slots; ++s) {
    if (matrix_of_slot[s] >= 0) {
      ptrs[s] = reinterpret_cast<uint64_t>(dw.get() + size_t(matrix_of_slot[s]) * c.n * c.k);
    }
  }
  DeviceArray<uint64_t> dptrs(ptrs);
  dy.Poison();
  kernels::GroupedGemmBf16Params p;
  p.num_slots = slots;
  p.max_rows = max_rows;
  p.slot_offsets = doff.get();
  p.n = c.n;
  p.k = c.k;
  p.x = dx.get();
  p.weights = reinterpret_cast<const uint16_t* const*>(dptrs.get());
  p.y = dy.get();
  p.rows_per_slot_hint = c.hint;
  p.algo = c.algo;
  DEEPINFER_CUDA_OK(kernels::GroupedGemmBf16(p, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dy.Download(&got));

  // Per element against the exact (double) dot product. CUDA cores sum k/32 terms per lane in
  // fp32, then 5 butterfly steps: error <= about (k/32 + 6) * 2^-24 * sum|x w|. Tensor cores:
  // x split into bf16 hi + lo (<= 2^-17 relative) and fp32 MMA accumulation over k/16 steps
  // (allow 2^-23 per step for the units' internal rounding). A dropped or doubled term would be
  // ~sum|x w| / k, at least 10x above either bound for every k here.
  // The fp32 reference must match too, within its own sequential bound k * 2^-24 * sum|x w|.
  const bool tc =
      c.algo == kernels::GroupedGemmAlgo::kTensorCore ||
      (c.algo == kernels::GroupedGemmAlgo::kAuto && (c.hint > 0 ? c.hint : max_rows) > 2);
  const double rel = tc ? std::ldexp(1.0, -17) + (c.k / 8 + 8) * std::ldexp(1.0, -23)
                        : (c.k / 32 + 6) * std::ldexp(1.0, -24);
  int bad = 0;
  for (int32_t s = 0; s < slots; ++s) {
    for (int32_t r = offsets[s]; r < offsets[s + 1]; ++r) {
      for (int32_t j = 0; j < c.n; ++j) {
        double exact = 0, abs_sum = 0;
        const uint16_t* wr = host_w[s] + size_t(j) * c.k;
        for (int32_t q = 0; q < c.k; ++q) {
          const double t = double(x[size_t(r) * c.k + q]) * kernels::Bf16ToFloat(wr[q]);
          exact += t;
          abs_sum += std::abs(t);
        }
        const double tol = rel * abs_sum;
        const float g = got[size_t(r) * c.n + j], e = want[size_t(r) * c.n + j];
        if (!(std::abs(g - exact) <= tol) && bad++ < 5) {
          ADD_FAILURE() << "slot " << s << " row " << r << " col " << j << ": got " << g
                        << " exact " << exact << " tol " << tol;
        }
        EXPECT_LE(std::abs(e - exact), c.k * std::ldexp(1.0, -24) * abs_sum) << "reference";
      }
    }
  }
  EXPECT_EQ(bad, 0);
  // Rows past the last slot must stay untouched (poison = NaN).
  for (size_t i = size_t(rows) * c.n; i < got.size(); ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "row " << i / c.n << " past the slots was written";
  }
}

TEST(GroupedGemmBf16Test, EveryRowTileAndEmptySlots) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (auto algo : kAlgos) {
    for (int32_t hint : {0, 1, 2, 4, 12}) {
      RunCase({40, 264, {0, 1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 0, 17}, 5, hint, algo});
    }
  }
}

TEST(GroupedGemmBf16Test, LargeGroupAndOddN) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (auto algo : kAlgos) RunCase({136, 520, {70, 0, 1, 33}, 0, 0, algo});
}

TEST(GroupedGemmBf16Test, MoonlightDecodeShape) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  // One token, top-6 of 64 experts: gate_up and down.
  std::vector<int32_t> counts(64, 0);
  for (int e : {3, 9, 17, 30, 41, 63}) counts[e] = 1;
  for (auto algo : kAlgos) {
    RunCase({2 * 1408, 2048, counts, 0, 1, algo});
    RunCase({2048, 1408, counts, 0, 1, algo});
  }
}

TEST(GroupedGemmBf16Test, MoonlightBatchShape) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  // 128 tokens x top-6 over 64 experts gives about 12 rows per expert; 8 such experts here
  // (the host reference is the slow part), down projection.
  std::mt19937 gen(testing::FreshSeed());
  std::vector<int32_t> counts(8, 0);
  for (int i = 0; i < 8 * 12; ++i) ++counts[gen() % 8];
  for (auto algo : kAlgos) RunCase({2048, 1408, counts, 0, 128, algo});
}

TEST(GroupedGemmBf16Test, ManySlotsFewRows) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  // More slots than rows: the grid has max_rows slot columns; the work is in the last slots.
  std::vector<int32_t> counts(300, 0);
  counts[40] = 2;
  counts[299] = 3;
  for (auto algo : kAlgos) RunCase({64, 128, counts, 1, 0, algo});
}

TEST(GroupedGemmBf16Test, RejectsBadShapes) {
  kernels::GroupedGemmBf16Params p;
  p.num_slots = 1;
  p.max_rows = 1;
  p.n = 8;
  p.k = 12;  // not a multiple of 8
  EXPECT_EQ(kernels::GroupedGemmBf16(p, nullptr), cudaErrorInvalidValue);
  p.k = 16;
  p.num_slots = 0;
  EXPECT_EQ(kernels::GroupedGemmBf16(p, nullptr), cudaErrorInvalidValue);
  p.num_slots = 1;
  p.max_rows = -1;
  EXPECT_EQ(kernels::GroupedGemmBf16(p, nullptr), cudaErrorInvalidValue);
  p.max_rows = 0;
  EXPECT_EQ(kernels::GroupedGemmBf16(p, nullptr), cudaSuccess);  // nothing to do
}

}  // namespace
}  // namespace deepinfer
