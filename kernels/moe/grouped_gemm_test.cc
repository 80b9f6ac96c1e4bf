// GroupedGemmBf16 (fp32 activations) and the device-planned chunked cuBLAS GEMMs (bf16
// activations; PlanExpertGemmBatches + PlannedExpertGemmsBf16) against
// GroupedGemmBf16Reference and an exact dot product on fresh random data: slots of many sizes
// (empty ones with null weights, 1..7 rows to hit every row-tile remainder, and a large one),
// n not a multiple of the block's rows, offsets only in device memory, max_rows above the real
// row count (blocks without work), and rows past the last slot checked to stay poisoned; the
// tensor-core paths' large tiles bit for bit against their small ones (x split into hi + lo, and
// x rounded to bf16: kTensorCoreBf16X, checked against the reference on the rounded x), and
// kTensorCoreBf16X with bf16 x against it with fp32 x bit for bit.
#include "kernels/moe/grouped_gemm.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/expert_gemm_plan.h"
#include "kernels/moe/expert_gemm_planned.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

// Which implementation a case runs: GroupedGemmBf16 with `algo`, or the device-planned cuBLAS
// chunks of `chunk` rows (padded layout).
enum class Impl { kGrouped, kPlanned };

struct Case {
  int32_t n, k;
  std::vector<int32_t> counts;  // rows per slot
  int32_t spare_rows;           // max_rows - real rows
  int32_t hint;                 // rows_per_slot_hint
  kernels::GroupedGemmAlgo algo;
  Impl impl = Impl::kGrouped;
  int32_t chunk = 1;        // kPlanned: rows per chunk
  bool out_bf16 = false;    // kPlanned: bf16 outputs
  int32_t extra_batch = 0;  // kPlanned: entries beyond ExpertGemmBatchBound (more dummies)
};

const char* Name(kernels::GroupedGemmAlgo a) {
  switch (a) {
    case kernels::GroupedGemmAlgo::kAuto:
      return "auto";
    case kernels::GroupedGemmAlgo::kCudaCore:
      return "cuda-core";
    case kernels::GroupedGemmAlgo::kTensorCore:
      return "tensor-core";
    case kernels::GroupedGemmAlgo::kTensorCoreBf16X:
      return "tensor-core bf16 x";
  }
  return "?";
}

constexpr kernels::GroupedGemmAlgo kAlgos[] = {
    kernels::GroupedGemmAlgo::kCudaCore, kernels::GroupedGemmAlgo::kTensorCore,
    kernels::GroupedGemmAlgo::kTensorCoreBf16X, kernels::GroupedGemmAlgo::kAuto};

void RunCase(const Case& c) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "n " << c.n << " k " << c.k << " slots " << c.counts.size() << " hint " << c.hint
               << " impl " << (c.impl == Impl::kPlanned ? "planned cuBLAS" : Name(c.algo))
               << " chunk " << c.chunk << (c.out_bf16 ? " bf16 out" : "") << " extra batch "
               << c.extra_batch << " seed " << seed);
  const int32_t slots = static_cast<int32_t>(c.counts.size());
  // kPlanned: each slot starts at a multiple of the chunk (padding rows after its rows).
  const int32_t align = c.impl == Impl::kPlanned ? c.chunk : 1;
  std::vector<int32_t> offsets(slots + 1, 0);
  for (int32_t s = 0; s < slots; ++s) {
    offsets[s + 1] = offsets[s] + (c.counts[s] + align - 1) / align * align;
  }
  const int32_t rows = offsets[slots], max_rows = rows + c.spare_rows;

  auto x = testing::RandomFloats(static_cast<size_t>(max_rows) * c.k, seed);
  // bf16 activations: x holds bf16 values exactly, so the exact product below is what the
  // kernel computes up to its summation. kTensorCoreBf16X gets fp32 x and rounds it itself; the
  // host reference takes the rounded values (the rounding is the kernel's contract).
  const bool bf16_x =
      c.impl != Impl::kGrouped || c.algo == kernels::GroupedGemmAlgo::kTensorCoreBf16X;
  const bool kernel_rounds_x = c.impl == Impl::kGrouped && bf16_x;
  std::vector<uint16_t> xb(x.size());
  const std::vector<float> x_sent = x;  // what the kernel reads (fp32 for kTensorCoreBf16X)
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = kernels::FloatToBf16(x[i]);
    if (bf16_x) x[i] = kernels::Bf16ToFloat(xb[i]);
  }
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

  DeviceArray<float> dx(kernel_rounds_x ? x_sent : x), dy(want.size());
  DeviceArray<uint16_t> dyb(c.out_bf16 ? want.size() : 0);  // the bf16 outputs
  DeviceArray<uint16_t> dw(w);
  DeviceArray<int32_t> doff(offsets);
  std::vector<uint64_t> ptrs(slots, 0);
  for (int32_t s = 0; s < slots; ++s) {
    if (matrix_of_slot[s] >= 0) {
      ptrs[s] = reinterpret_cast<uint64_t>(dw.get() + size_t(matrix_of_slot[s]) * c.n * c.k);
    }
  }
  DeviceArray<uint64_t> dptrs(ptrs);
  DeviceArray<uint16_t> dxb(xb);
  DeviceArray<int32_t> dcounts(c.counts);
  dy.Poison();
  dyb.Poison();  // 0xFFFF: NaN as bf16
  if (c.impl == Impl::kGrouped) {
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
  } else {
    // The batch bound of the REAL rows (what the backend sizes it with), so a bound that is
    // too small drops chunks and fails the comparison.
    kernels::ExpertGemmPlanParams p;
    p.num_slots = slots;
    p.slot_counts = dcounts.get();
    p.slot_offsets = doff.get();
    p.chunk_rows = c.chunk;
    int32_t real_rows = 0;
    for (int32_t v : c.counts) real_rows += v;
    p.batch = kernels::ExpertGemmBatchBound(real_rows, slots, c.chunk) + c.extra_batch;
    p.num_gemms = 1;
    DeviceArray<uint16_t> dummy_x(static_cast<size_t>(c.chunk) * c.k);
    DeviceArray<float> dummy_y(static_cast<size_t>(c.chunk) * c.n);  // fits bf16 too
    DEEPINFER_CUDA_OK(cudaMemset(dummy_x.get(), 0, size_t{2} * c.chunk * c.k));
    DeviceArray<uint64_t> pointers(3 * static_cast<size_t>(p.batch));
    p.gemm[0].weights = reinterpret_cast<const void* const*>(dptrs.get());
    p.gemm[0].x = dxb.get();
    p.gemm[0].x_row_bytes = int64_t{c.k} * 2;
    p.gemm[0].y = c.out_bf16 ? static_cast<void*>(dyb.get()) : static_cast<void*>(dy.get());
    p.gemm[0].y_row_bytes = int64_t{c.n} * (c.out_bf16 ? 2 : 4);
    p.gemm[0].dummy_x = dummy_x.get();
    p.gemm[0].dummy_y = dummy_y.get();
    p.gemm[0].pointers = reinterpret_cast<void**>(pointers.get());
    DEEPINFER_CUDA_OK(kernels::PlanExpertGemmBatches(p, nullptr));
    cublasHandle_t cublas;
    ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(kernels::PlannedExpertGemmsBf16(cublas, reinterpret_cast<void**>(pointers.get()),
                                              p.batch, c.n, c.k, c.chunk, c.out_bf16),
              CUBLAS_STATUS_SUCCESS);
    DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
    cublasDestroy(cublas);
  }
  std::vector<float> got;
  if (c.out_bf16) {
    std::vector<uint16_t> got_bf16;
    DEEPINFER_CUDA_OK(dyb.Download(&got_bf16));
    got.resize(got_bf16.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = kernels::Bf16ToFloat(got_bf16[i]);
  } else {
    DEEPINFER_CUDA_OK(dy.Download(&got));
  }

  // Per element against the exact (double) dot product. CUDA cores sum k/32 terms per lane in
  // fp32, then 5 butterfly steps: error <= about (k/32 + 6) * 2^-24 * sum|x w|. Tensor cores:
  // x split into bf16 hi + lo (<= 2^-17 relative) and fp32 MMA accumulation over k/16 steps
  // (allow 2^-23 per step for the units' internal rounding). A dropped or doubled term would be
  // ~sum|x w| / k, at least 10x above either bound for every k here.
  // The fp32 reference must match too, within its own sequential bound k * 2^-24 * sum|x w|.
  // bf16 activations (planned): products exact, fp32 accumulation as the tensor-core path
  // without the split term.
  const bool tc =
      c.algo == kernels::GroupedGemmAlgo::kTensorCore ||
      (c.algo == kernels::GroupedGemmAlgo::kAuto && (c.hint > 0 ? c.hint : max_rows) > 2);
  const double rel = bf16_x ? (c.k / 8 + 8) * std::ldexp(1.0, -23)
                     : tc   ? std::ldexp(1.0, -17) + (c.k / 8 + 8) * std::ldexp(1.0, -23)
                            : (c.k / 32 + 6) * std::ldexp(1.0, -24);
  int bad = 0;
  for (int32_t s = 0; s < slots; ++s) {
    for (int32_t r = offsets[s]; r < offsets[s] + c.counts[s]; ++r) {
      for (int32_t j = 0; j < c.n; ++j) {
        double exact = 0, abs_sum = 0;
        const uint16_t* wr = host_w[s] + size_t(j) * c.k;
        for (int32_t q = 0; q < c.k; ++q) {
          const double t = double(x[size_t(r) * c.k + q]) * kernels::Bf16ToFloat(wr[q]);
          exact += t;
          abs_sum += std::abs(t);
        }
        // bf16 outputs: plus the rounding to nearest, half a unit in the 8th bit.
        const double tol =
            rel * abs_sum + (c.out_bf16 ? std::ldexp(std::abs(exact) + rel * abs_sum, -8) : 0.0);
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

// From 8192 rows the tensor-core path takes 128-row tiles staged in shared memory: against the
// exact products (n not a multiple of the 64-feature tile, k ending in a partial 32-wide step,
// slots of 1 to 7000 rows, empty ones), and bit for bit against the small tiles, each slot's rows
// run again alone (under 8192 rows).
void ExpectTiledRowsAreTheSmallTiles(kernels::GroupedGemmAlgo algo) {
  const std::vector<int32_t> counts = {0, 300, 1, 129, 7000, 0, 1000};
  const int32_t n = 136, k = 264;
  RunCase({n, k, counts, 3, 0, algo});
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << Name(algo) << " seed " << seed);
  const int32_t slots = static_cast<int32_t>(counts.size());
  std::vector<int32_t> offsets(slots + 1, 0);
  for (int32_t s = 0; s < slots; ++s) offsets[s + 1] = offsets[s] + counts[s];
  const int32_t rows = offsets[slots];
  ASSERT_GE(rows, 8192);
  const auto x = testing::RandomFloats(static_cast<size_t>(rows) * k, seed);
  const auto wf = testing::RandomFloats(static_cast<size_t>(slots) * n * k, seed + 1, 0.05f);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = kernels::FloatToBf16(wf[i]);
  DeviceArray<float> dx(x), dy(static_cast<size_t>(rows) * n);
  DeviceArray<uint16_t> dw(w);
  std::vector<uint64_t> ptrs(slots);
  for (int32_t s = 0; s < slots; ++s) {
    ptrs[s] = reinterpret_cast<uint64_t>(dw.get() + size_t(s) * n * k);
  }
  DeviceArray<uint64_t> dptrs(ptrs);
  DeviceArray<int32_t> doff(offsets);
  kernels::GroupedGemmBf16Params p;
  p.num_slots = slots;
  p.max_rows = rows;
  p.slot_offsets = doff.get();
  p.n = n;
  p.k = k;
  p.x = dx.get();
  p.weights = reinterpret_cast<const uint16_t* const*>(dptrs.get());
  p.y = dy.get();
  p.algo = algo;
  DEEPINFER_CUDA_OK(kernels::GroupedGemmBf16(p, nullptr));
  std::vector<float> all;
  DEEPINFER_CUDA_OK(dy.Download(&all));
  for (int32_t s = 0; s < slots; ++s) {
    if (counts[s] == 0) continue;
    DeviceArray<int32_t> one_off(std::vector<int32_t>{0, counts[s]});
    DeviceArray<float> one_y(static_cast<size_t>(counts[s]) * n);
    kernels::GroupedGemmBf16Params q = p;
    q.num_slots = 1;
    q.max_rows = counts[s];
    q.slot_offsets = one_off.get();
    q.x = dx.get() + size_t(offsets[s]) * k;
    q.weights = reinterpret_cast<const uint16_t* const*>(dptrs.get() + s);
    q.y = one_y.get();
    DEEPINFER_CUDA_OK(kernels::GroupedGemmBf16(q, nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(one_y.Download(&got));
    EXPECT_EQ(
        std::memcmp(got.data(), all.data() + size_t(offsets[s]) * n, got.size() * sizeof(float)), 0)
        << "slot " << s << " (" << counts[s] << " rows) differs alone";
  }
}

TEST(GroupedGemmBf16Test, TiledRowsAreTheSmallTilesBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ExpectTiledRowsAreTheSmallTiles(kernels::GroupedGemmAlgo::kTensorCore);
  ExpectTiledRowsAreTheSmallTiles(kernels::GroupedGemmAlgo::kTensorCoreBf16X);
}

// The planned cuBLAS chunks (bf16 activations) on the same cases.
std::vector<Case> BaseCases() {
  std::vector<int32_t> decode(64, 0);
  for (int e : {3, 9, 17, 30, 41, 63}) decode[e] = 1;
  std::vector<int32_t> many(300, 0);
  many[40] = 2;
  many[299] = 3;
  std::vector<Case> cases;
  for (int32_t hint : {0, 1, 12, 20}) {
    cases.push_back({40, 264, {0, 1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 0, 17}, 5, hint, {}});
  }
  cases.push_back({136, 520, {70, 0, 1, 33}, 0, 0, {}});
  cases.push_back({136, 520, {70, 0, 1, 33}, 0, 16, {}});  // hint below the busiest slot
  cases.push_back({2 * 1408, 2048, decode, 0, 1, {}});
  cases.push_back({2048, 1408, decode, 0, 1, {}});
  cases.push_back({64, 128, many, 1, 0, {}});
  cases.push_back({72, 8, {5, 0, 9}, 0, 9, {}});  // k of a single 16-byte chunk
  return cases;
}

TEST(PlannedExpertGemmsTest, MoonlightBatchShapeWithOneHotExpert) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  // 128 tokens x top-6 over 8 of 64 experts' worth of rows, one expert taking every token.
  std::mt19937 gen(testing::FreshSeed());
  std::vector<int32_t> counts(8, 0);
  counts[5] = 128;
  for (int i = 0; i < 8 * 12; ++i) ++counts[gen() % 8];
  RunCase({2048, 1408, counts, 0, 128, {}, Impl::kPlanned, 16});
}

TEST(PlannedExpertGemmsTest, MatchesExactProducts) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (int32_t chunk : {8, 16, 32, 48, 64}) {
    for (Case c : BaseCases()) {
      c.impl = Impl::kPlanned;
      c.chunk = chunk;
      RunCase(c);
    }
  }
}

// bf16 outputs (the backend's gate_up), and batches with many more dummies than real chunks
// (dummies between, before and after the real chunks).
TEST(PlannedExpertGemmsTest, Bf16OutputsAndExtraDummies) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (int32_t chunk : {16, 64}) {
    for (Case c : BaseCases()) {
      c.impl = Impl::kPlanned;
      c.chunk = chunk;
      c.out_bf16 = true;
      c.extra_batch = 37;
      RunCase(c);
    }
  }
}

TEST(PlannedExpertGemmsTest, BatchBoundCoversWorstCase) {
  // Every busy slot one row past a chunk boundary: the bound is reached exactly.
  EXPECT_EQ(kernels::ExpertGemmBatchBound(6, 64, 16), 6);
  EXPECT_EQ(kernels::ExpertGemmBatchBound(17 * 4, 4, 16), 8);  // 4 slots of 17 rows: 2 chunks each
  EXPECT_EQ(kernels::ExpertGemmBatchBound(0, 64, 16), 1);
  EXPECT_EQ(kernels::ExpertGemmBatchBound(768, 64, 16), (768 + 64 * 15) / 16);
}

TEST(PlannedExpertGemmsTest, RejectsBadArguments) {
  kernels::ExpertGemmPlanParams p;
  p.num_slots = 0;
  EXPECT_EQ(kernels::PlanExpertGemmBatches(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::PlannedExpertGemmsBf16(nullptr, nullptr, 1, 8, 8, 8, false),
            CUBLAS_STATUS_INVALID_VALUE);
}

// kTensorCoreBf16X with x given in bf16 (x_bf16, as the batch-invariant mode gathers it) against
// the same algo rounding an fp32 x itself: bit for bit the same outputs, at Moonlight's decode
// shapes (about 12 rows an expert: 16-row passes) and odd ones (every row tile, n not a multiple
// of the block, k of one 16-byte chunk).
TEST(GroupedGemmBf16Test, Bf16XInputIsTheRoundedFp32XBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  std::mt19937 gen(testing::FreshSeed());
  std::vector<int32_t> moonlight(64, 0);
  for (int i = 0; i < 128 * 6; ++i) ++moonlight[gen() % 64];
  struct Shape {
    int32_t n, k;
    std::vector<int32_t> counts;
    int32_t hint;
  };
  for (const Shape& c : {Shape{2 * 1408, 2048, moonlight, 128}, Shape{2048, 1408, moonlight, 128},
                         Shape{40, 264, {0, 1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 0, 17, 40}, 0},
                         Shape{72, 8, {5, 0, 9}, 9}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " k " << c.k << " seed " << seed);
    const int32_t slots = static_cast<int32_t>(c.counts.size());
    std::vector<int32_t> offsets(slots + 1, 0);
    for (int32_t s = 0; s < slots; ++s) offsets[s + 1] = offsets[s] + c.counts[s];
    const int32_t rows = offsets[slots];
    const auto x = testing::RandomFloats(static_cast<size_t>(rows) * c.k, seed);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = kernels::FloatToBf16(x[i]);
    const auto wf = testing::RandomFloats(static_cast<size_t>(slots) * c.n * c.k, seed + 1, 0.05f);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) w[i] = kernels::FloatToBf16(wf[i]);
    DeviceArray<float> dx(x), dy(static_cast<size_t>(rows) * c.n), dyb(dy.size());
    DeviceArray<uint16_t> dxb(xb), dw(w);
    std::vector<uint64_t> ptrs(slots);
    for (int32_t s = 0; s < slots; ++s) {
      ptrs[s] = reinterpret_cast<uint64_t>(dw.get() + size_t(s) * c.n * c.k);
    }
    DeviceArray<uint64_t> dptrs(ptrs);
    DeviceArray<int32_t> doff(offsets);
    dy.Poison();
    dyb.Poison();
    kernels::GroupedGemmBf16Params p;
    p.num_slots = slots;
    p.max_rows = rows;
    p.slot_offsets = doff.get();
    p.n = c.n;
    p.k = c.k;
    p.x = dx.get();
    p.weights = reinterpret_cast<const uint16_t* const*>(dptrs.get());
    p.y = dy.get();
    p.rows_per_slot_hint = c.hint;
    p.algo = kernels::GroupedGemmAlgo::kTensorCoreBf16X;
    DEEPINFER_CUDA_OK(kernels::GroupedGemmBf16(p, nullptr));
    kernels::GroupedGemmBf16Params q = p;
    q.x = nullptr;
    q.x_bf16 = dxb.get();
    q.y = dyb.get();
    DEEPINFER_CUDA_OK(kernels::GroupedGemmBf16(q, nullptr));
    std::vector<float> from_f32, from_bf16;
    DEEPINFER_CUDA_OK(dy.Download(&from_f32));
    DEEPINFER_CUDA_OK(dyb.Download(&from_bf16));
    for (float v : from_f32) ASSERT_FALSE(std::isnan(v)) << "an output was not written";
    EXPECT_EQ(std::memcmp(from_f32.data(), from_bf16.data(), from_f32.size() * sizeof(float)), 0);
  }
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
  // bf16 x: only with kTensorCoreBf16X, and not together with x.
  alignas(16) static const uint16_t kX[8] = {};
  alignas(16) static const float kXf[8] = {};
  p.max_rows = 1;
  p.x_bf16 = kX;
  p.algo = kernels::GroupedGemmAlgo::kTensorCore;
  EXPECT_EQ(kernels::GroupedGemmBf16(p, nullptr), cudaErrorInvalidValue);
  p.algo = kernels::GroupedGemmAlgo::kTensorCoreBf16X;
  p.x = kXf;
  EXPECT_EQ(kernels::GroupedGemmBf16(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
