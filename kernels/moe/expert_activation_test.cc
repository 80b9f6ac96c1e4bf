// SiluMulBf16 against (1) SiluMulF32ToBf16 on the same values widened to fp32: bit for bit (the
// same fp32 formula), and (2) the CPU backend's SiluMul rounded on the host: within one bf16
// step (device and host expf may differ by an ulp, which can cross a rounding boundary). Both
// the 8-wide and the scalar path (odd widths, unaligned pointers); outputs poisoned first.
// SiluMulBf16's device row bound and SiluMulBf16ListedRows against the unbounded kernel.
#include "kernels/moe/expert_activation.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation/elementwise.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

// `shift` elements of offset on both device pointers (1: misaligned, the scalar path).
void Check(int64_t rows, int64_t inter, int64_t shift) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "rows " << rows << " inter " << inter << " shift " << shift << " seed " << seed);
  const auto values = testing::RandomFloats(rows * 2 * inter, seed, 4.0f);
  std::vector<uint16_t> x16(shift, 0);
  std::vector<float> x;  // the bf16 values, widened
  for (float v : values) {
    x16.push_back(kernels::FloatToBf16(v));
    x.push_back(kernels::Bf16ToFloat(x16.back()));
  }
  DeviceArray<uint16_t> dx(x16), dout(shift + rows * inter), dwant(rows * inter);
  DeviceArray<float> dx32(x);
  dout.Poison();
  DEEPINFER_CUDA_OK(
      kernels::SiluMulBf16(rows, inter, dx.get() + shift, dout.get() + shift, nullptr));
  DEEPINFER_CUDA_OK(kernels::SiluMulF32ToBf16(rows, inter, dx32.get(), dwant.get(), nullptr));
  std::vector<uint16_t> got, want;
  DEEPINFER_CUDA_OK(dout.Download(&got));
  DEEPINFER_CUDA_OK(dwant.Download(&want));
  for (int64_t i = 0; i < shift; ++i) EXPECT_EQ(got[i], 0xFFFF) << "written before the output";
  got.erase(got.begin(), got.begin() + shift);
  EXPECT_EQ(got, want);
  CpuBackend cpu(2);
  std::vector<float> host(rows * inter);
  cpu.SiluMul(rows, inter, x.data(), host.data());
  int far = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int h = kernels::FloatToBf16(host[i]);
    if (std::abs(static_cast<int>(got[i]) - h) > 1 && ++far <= 5) {
      ADD_FAILURE() << "element " << i << ": got bf16 bits " << got[i] << ", host " << h;
    }
  }
  EXPECT_EQ(far, 0);
}

TEST(ExpertActivationTest, SiluMulBf16MatchesFp32Kernel) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(1, 1408, 0);    // 8-wide
  Check(130, 1408, 0);  // 8-wide, many rows
  Check(77, 24, 0);     // 8-wide, narrow rows
  Check(130, 3, 0);     // scalar: odd width
  Check(33, 1408, 1);   // scalar: unaligned pointers
}

// A prefill size (an odd row count near 8192 tokens) against the CPU backend through Check.
TEST(ExpertActivationTest, PrefillSizeMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(8191, 1408, 0);
}

// A row bound read on the device: rows below it as without the bound, the rest untouched.
TEST(ExpertActivationTest, DeviceRowBoundLimitsTheRowsComputed) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (int64_t inter : {int64_t{1408}, int64_t{3}}) {  // the 8-wide and the scalar path
    const int64_t rows = 130;
    const auto values = testing::RandomFloats(rows * 2 * inter, testing::FreshSeed(), 4.0f);
    std::vector<uint16_t> x16;
    for (float v : values) x16.push_back(kernels::FloatToBf16(v));
    DeviceArray<uint16_t> dx(x16), dall(rows * inter);
    DEEPINFER_CUDA_OK(kernels::SiluMulBf16(rows, inter, dx.get(), dall.get(), nullptr));
    std::vector<uint16_t> all;
    DEEPINFER_CUDA_OK(dall.Download(&all));
    for (int32_t bound : {77, 0, -5, 1000}) {
      SCOPED_TRACE(::testing::Message() << "inter " << inter << " bound " << bound);
      DeviceArray<int32_t> dbound(std::vector<int32_t>{bound});
      DeviceArray<uint16_t> dout(rows * inter);
      dout.Poison();
      DEEPINFER_CUDA_OK(
          kernels::SiluMulBf16(rows, inter, dx.get(), dout.get(), nullptr, dbound.get()));
      std::vector<uint16_t> got;
      DEEPINFER_CUDA_OK(dout.Download(&got));
      const int64_t in_use = std::max<int64_t>(0, std::min<int64_t>(rows, bound));
      for (int64_t i = 0; i < rows * inter; ++i) {
        if (i < in_use * inter) {
          ASSERT_EQ(got[i], all[i]) << "element " << i;
        } else {
          ASSERT_EQ(got[i], 0xFFFF) << "element " << i << " written beyond the bound";
        }
      }
    }
  }
}

// Listed rows (a permutation's choice_row: some rows in any order, -1 entries skipped): those
// rows as the plain kernel computes them, bit for bit; the rest (padding) untouched.
TEST(ExpertActivationTest, ListedRowsComputeOnlyThoseRows) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (int64_t inter : {int64_t{1408}, int64_t{3}}) {  // the 8-wide and the scalar path
    const int64_t rows = 96;
    const uint32_t seed = testing::FreshSeed();
    const auto values = testing::RandomFloats(rows * 2 * inter, seed, 4.0f);
    std::vector<uint16_t> x16;
    for (float v : values) x16.push_back(kernels::FloatToBf16(v));
    DeviceArray<uint16_t> dx(x16), dall(rows * inter);
    DEEPINFER_CUDA_OK(kernels::SiluMulBf16(rows, inter, dx.get(), dall.get(), nullptr));
    std::vector<uint16_t> all;
    DEEPINFER_CUDA_OK(dall.Download(&all));
    // Every third row of the first two thirds, shuffled, and two -1 entries.
    std::vector<int32_t> row_of = {-1};
    for (int32_t r = 0; r < 2 * rows / 3; r += 3) row_of.push_back(r);
    row_of.push_back(-1);
    std::mt19937 gen(seed);
    std::shuffle(row_of.begin(), row_of.end(), gen);
    std::vector<bool> listed(rows, false);
    for (int32_t r : row_of) {
      if (r >= 0) listed[r] = true;
    }
    SCOPED_TRACE(::testing::Message() << "inter " << inter << " seed " << seed);
    DeviceArray<int32_t> drow_of(row_of);
    DeviceArray<uint16_t> dout(rows * inter);
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::SiluMulBf16ListedRows(
        static_cast<int64_t>(row_of.size()), drow_of.get(), inter, dx.get(), dout.get(), nullptr));
    std::vector<uint16_t> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    for (int64_t i = 0; i < rows * inter; ++i) {
      if (listed[i / inter]) {
        ASSERT_EQ(got[i], all[i]) << "element " << i;
      } else {
        ASSERT_EQ(got[i], 0xFFFF) << "element " << i << " of an unlisted row written";
      }
    }
  }
  EXPECT_EQ(kernels::SiluMulBf16ListedRows(0, nullptr, 1408, nullptr, nullptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(kernels::SiluMulBf16ListedRows(4, nullptr, 1408, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::SiluMulBf16ListedRows(-1, nullptr, 8, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// DeepSeek-V4's clamp (limit > 0) against CpuV4Ops::SwiGluClamped on the bf16 values widened,
// rounded on the host: within one bf16 step (expf), on the 8-wide and the scalar path, the plain
// and the listed-rows form (listed rows as the plain kernel computes them, bit for bit). Values
// of stddev 8 cross the clamp of 2 on both sides.
TEST(ExpertActivationTest, ClampedFormMatchesV4SwiGlu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const float limit = 2.0f;
  for (int64_t inter : {int64_t{2048}, int64_t{3}}) {
    const int64_t rows = 40;
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "inter " << inter << " seed " << seed);
    const auto values = testing::RandomFloats(rows * 2 * inter, seed, 8.0f);
    std::vector<uint16_t> x16;
    std::vector<float> x;
    for (float v : values) {
      x16.push_back(kernels::FloatToBf16(v));
      x.push_back(kernels::Bf16ToFloat(x16.back()));
    }
    DeviceArray<uint16_t> dx(x16), dout(rows * inter), dlisted(rows * inter);
    dout.Poison();
    DEEPINFER_CUDA_OK(
        kernels::SiluMulBf16(rows, inter, dx.get(), dout.get(), nullptr, nullptr, limit));
    std::vector<uint16_t> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    CpuBackend cpu(2);
    std::vector<float> host(rows * inter);
    cpu.v4_ops()->SwiGluClamped(rows, inter, x.data(), limit, host.data());
    int far = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const int h = kernels::FloatToBf16(host[i]);
      if (std::abs(static_cast<int>(got[i]) - h) > 1 && ++far <= 5) {
        ADD_FAILURE() << "element " << i << ": got bf16 bits " << got[i] << ", host " << h;
      }
    }
    EXPECT_EQ(far, 0);
    // Rows 0, 2, 4, ... listed (one -1 entry): bit for bit the plain kernel's.
    std::vector<int32_t> row_of = {-1};
    for (int32_t r = 0; r < rows; r += 2) row_of.push_back(r);
    DeviceArray<int32_t> drow_of(row_of);
    dlisted.Poison();
    DEEPINFER_CUDA_OK(kernels::SiluMulBf16ListedRows(static_cast<int64_t>(row_of.size()),
                                                     drow_of.get(), inter, dx.get(), dlisted.get(),
                                                     nullptr, limit));
    std::vector<uint16_t> listed;
    DEEPINFER_CUDA_OK(dlisted.Download(&listed));
    for (int64_t i = 0; i < rows * inter; ++i) {
      ASSERT_EQ(listed[i], (i / inter) % 2 == 0 ? got[i] : uint16_t{0xFFFF}) << "element " << i;
    }
  }
}

TEST(ExpertActivationTest, EmptyAndBadSizes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  EXPECT_EQ(kernels::SiluMulBf16(0, 1408, nullptr, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(kernels::SiluMulBf16(-1, 8, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
