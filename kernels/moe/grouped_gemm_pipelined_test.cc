// GroupedGemmBf16Pipelined against exact (double) dot products on fresh random data: both
// epilogues (fp32 y; SiLU-mul to bf16), slots of 0..17 rows (empty ones with null weights) and
// ones spanning several 24-row passes, n and k that are not multiples of the kernel's
// 32-feature (16 gate + 16 up) tiles and 256-wide k chunks, persistent grids of 1, 3 and all
// blocks (one block walking many items: the copy ring runs across items and passes), offsets
// only in device memory, and rows past the last slot checked to stay poisoned.
#include "kernels/moe/grouped_gemm_pipelined.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace {

using kernels::PipelinedGemmEpilogue;
using testing::DeviceArray;

struct Case {
  int32_t n, k;
  std::vector<int32_t> counts;  // rows per slot
  int32_t spare_rows;           // max_rows - real rows
  PipelinedGemmEpilogue epilogue;
  int32_t max_blocks;
  int32_t variant = 0;
};

double Silu(double g) { return g / (1.0 + std::exp(-g)); }

void RunCase(const Case& c) {
  const uint32_t seed = testing::FreshSeed();
  const bool silu = c.epilogue == PipelinedGemmEpilogue::kSiluMulBf16;
  SCOPED_TRACE(::testing::Message()
               << "n " << c.n << " k " << c.k << " slots " << c.counts.size()
               << (silu ? " silu-mul bf16" : " fp32") << " max blocks " << c.max_blocks
               << " variant " << c.variant << " seed " << seed);
  const int32_t slots = static_cast<int32_t>(c.counts.size());
  std::vector<int32_t> offsets(slots + 1, 0);
  for (int32_t s = 0; s < slots; ++s) offsets[s + 1] = offsets[s] + c.counts[s];
  const int32_t rows = offsets[slots], max_rows = rows + c.spare_rows;
  const int32_t out_cols = silu ? c.n / 2 : c.n;

  // x as bf16 values (exactly representable: the kernel's products are then exact).
  auto x = testing::RandomFloats(static_cast<size_t>(max_rows) * c.k, seed);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = kernels::FloatToBf16(x[i]);
    x[i] = kernels::Bf16ToFloat(xb[i]);
  }
  std::vector<int32_t> matrix_of_slot(slots, -1);
  int32_t busy = 0;
  for (int32_t s = 0; s < slots; ++s) {
    if (c.counts[s] > 0) matrix_of_slot[s] = busy++;
  }
  auto wf = testing::RandomFloats(static_cast<size_t>(busy) * c.n * c.k, seed + 1, 0.05f);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = kernels::FloatToBf16(wf[i]);

  DeviceArray<uint16_t> dx(xb), dw(w);
  DeviceArray<int32_t> doff(offsets);
  std::vector<uint64_t> ptrs(slots, 0);  // empty slots: null (never read)
  for (int32_t s = 0; s < slots; ++s) {
    if (matrix_of_slot[s] >= 0) {
      ptrs[s] = reinterpret_cast<uint64_t>(dw.get() + size_t(matrix_of_slot[s]) * c.n * c.k);
    }
  }
  DeviceArray<uint64_t> dptrs(ptrs);
  const size_t outs = static_cast<size_t>(max_rows) * out_cols;
  DeviceArray<float> dy(silu ? 0 : outs);
  DeviceArray<uint16_t> dact(silu ? outs : 0);
  dy.Poison();
  dact.Poison();  // 0xFFFF: NaN as bf16

  kernels::GroupedGemmBf16PipelinedParams p;
  p.num_slots = slots;
  p.max_rows = max_rows;
  p.slot_offsets = doff.get();
  p.n = c.n;
  p.k = c.k;
  p.x = dx.get();
  p.weights = reinterpret_cast<const uint16_t* const*>(dptrs.get());
  p.epilogue = c.epilogue;
  p.y = silu ? nullptr : dy.get();
  p.act = silu ? dact.get() : nullptr;
  p.max_blocks = c.max_blocks;
  p.variant = c.variant;
  DEEPINFER_CUDA_OK(kernels::GroupedGemmBf16Pipelined(p, nullptr));
  std::vector<float> got(outs);
  if (silu) {
    std::vector<uint16_t> got_bf16;
    DEEPINFER_CUDA_OK(dact.Download(&got_bf16));
    for (size_t i = 0; i < outs; ++i) got[i] = kernels::Bf16ToFloat(got_bf16[i]);
  } else {
    DEEPINFER_CUDA_OK(dy.Download(&got));
  }

  // Exact dot product of row r with weight row j of slot s, and sum |x w|.
  auto dot = [&](int32_t s, int32_t r, int32_t j, double* abs_sum) {
    const uint16_t* wr = w.data() + (size_t(matrix_of_slot[s]) * c.n + j) * c.k;
    double exact = 0;
    *abs_sum = 0;
    for (int32_t q = 0; q < c.k; ++q) {
      const double t = double(x[size_t(r) * c.k + q]) * kernels::Bf16ToFloat(wr[q]);
      exact += t;
      *abs_sum += std::abs(t);
    }
    return exact;
  };
  // Products exact, fp32 MMA accumulation over k / 16 steps (2^-23 per step for the units'
  // internal rounding, plus slack); a dropped or doubled k chunk would be ~64 / k of sum |x w|.
  const double rel = (c.k / 8 + 8) * std::ldexp(1.0, -23);
  int bad = 0;
  for (int32_t s = 0; s < slots; ++s) {
    for (int32_t r = offsets[s]; r < offsets[s + 1]; ++r) {
      for (int32_t j = 0; j < out_cols; ++j) {
        double want, tol;
        if (silu) {
          double sg, su;
          const double g = dot(s, r, j, &sg), u = dot(s, r, out_cols + j, &su);
          want = Silu(g) * u;
          // silu' is within [-0.1, 1.1]; then the bf16 rounding of the product (half a unit
          // in the 8th bit).
          const double eg = rel * sg, eu = rel * su;
          tol = 1.1 * eg * (std::abs(u) + eu) + std::abs(Silu(g)) * eu +
                std::ldexp(std::abs(want) + 1.1 * eg * (std::abs(u) + eu), -8) + 1e-30;
        } else {
          double sum;
          want = dot(s, r, j, &sum);
          tol = rel * sum;
        }
        const float v = got[size_t(r) * out_cols + j];
        if (!(std::abs(v - want) <= tol) && bad++ < 5) {
          ADD_FAILURE() << "slot " << s << " row " << r << " col " << j << ": got " << v << " want "
                        << want << " tol " << tol;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  for (size_t i = size_t(rows) * out_cols; i < got.size(); ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "row " << i / out_cols << " past the slots was written";
  }
}

constexpr PipelinedGemmEpilogue kEpilogues[] = {PipelinedGemmEpilogue::kF32,
                                                PipelinedGemmEpilogue::kSiluMulBf16};

TEST(GroupedGemmBf16PipelinedTest, EveryRowTileEmptySlotsAndGridSizes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (int32_t variant = 0; variant <= kernels::kMaxPipelinedGemmVariant; ++variant) {
    for (auto epilogue : kEpilogues) {
      for (int32_t blocks : {1, 3, 0}) {
        // n 272: 8.5 tiles of 32 features (SiLU-mul: 136 gate features, 8.5 tiles of 16); k
        // 264 and 776: a chunk of 256 or 512 and a partial one.
        for (int32_t k : {264, 776}) {
          RunCase({272, k, {0, 1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 0, 17}, 5, epilogue, blocks, variant});
        }
      }
    }
  }
}

TEST(GroupedGemmBf16PipelinedTest, SlotsOverSeveralPasses) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (int32_t variant = 0; variant <= kernels::kMaxPipelinedGemmVariant; ++variant) {
    for (auto epilogue : kEpilogues) {
      for (int32_t blocks : {2, 0}) {
        RunCase({136, 520, {70, 0, 1, 130, 64, 65, 16, 17, 24, 25}, 3, epilogue, blocks, variant});
      }
    }
  }
}

TEST(GroupedGemmBf16PipelinedTest, MoonlightDecodeShapes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  // 64 experts: six busy ones with 1-2 rows (a few decode tokens), then eight with 9-15 rows
  // (as each expert has at 128 tokens, top-6); gate_up (SiLU-mul) and down.
  std::vector<int32_t> few(64, 0), busy(64, 0);
  const int32_t few_rows[] = {1, 2, 1, 1, 2, 1}, busy_rows[] = {12, 9, 15, 12, 11, 14, 12, 10};
  for (int i = 0; i < 6; ++i) few[3 + 11 * i] = few_rows[i];
  for (int i = 0; i < 8; ++i) busy[5 + 8 * i] = busy_rows[i];
  for (const auto& counts : {few, busy}) {
    for (int32_t variant : {1, 2}) {
      RunCase({2 * 1408, 2048, counts, 0, PipelinedGemmEpilogue::kSiluMulBf16, 0, variant});
      RunCase({2048, 1408, counts, 0, PipelinedGemmEpilogue::kF32, 0, variant});
    }
  }
}

TEST(GroupedGemmBf16PipelinedTest, RejectsBadParams) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<uint16_t> x(64), act(64);
  DeviceArray<float> y(64);
  DeviceArray<int32_t> off(std::vector<int32_t>{0, 1});
  DeviceArray<uint64_t> w(1);
  kernels::GroupedGemmBf16PipelinedParams ok;
  ok.num_slots = 1;
  ok.max_rows = 1;
  ok.slot_offsets = off.get();
  ok.n = 8;
  ok.k = 8;
  ok.x = x.get();
  ok.weights = reinterpret_cast<const uint16_t* const*>(w.get());
  ok.y = y.get();
  auto bad = [&](auto edit) {
    kernels::GroupedGemmBf16PipelinedParams p = ok;
    edit(p);
    return kernels::GroupedGemmBf16Pipelined(p, nullptr);
  };
  using P = kernels::GroupedGemmBf16PipelinedParams;
  EXPECT_EQ(bad([](P& p) { p.k = 12; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.n = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.num_slots = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.max_rows = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.max_blocks = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.variant = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.variant = kernels::kMaxPipelinedGemmVariant + 1; }),
            cudaErrorInvalidValue);
  EXPECT_EQ(bad([&](P& p) { p.x = x.get() + 1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.y = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.epilogue = PipelinedGemmEpilogue::kSiluMulBf16; }),
            cudaErrorInvalidValue);  // no act
  EXPECT_EQ(bad([&](P& p) {
              p.epilogue = PipelinedGemmEpilogue::kSiluMulBf16;
              p.act = act.get();
              p.n = 9;
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(bad([](P& p) { p.max_rows = 0; }), cudaSuccess);  // nothing to do
}

}  // namespace
}  // namespace deepinfer
