// AddF32 and SiluMulF32 against CpuBackend (outputs poisoned first, odd sizes, aliasing);
// RoundF32ToBf16 against the host rounding of worker/backend/bf16.h.
#include "kernels/activation/elementwise.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

TEST(ElementwiseKernelTest, AddMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t n : {1, 1000, 1 << 20 | 77}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "n " << n << " seed " << seed);
    auto a = testing::RandomFloats(n, seed), b = testing::RandomFloats(n, seed + 1);
    std::vector<float> want(n);
    cpu.Add(n, a.data(), b.data(), want.data());
    DeviceArray<float> da(a), db(b), dout(n);
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::AddF32(n, da.get(), db.get(), dout.get(), nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_TRUE(AllClose(got, want, 0, 0));  // one fp32 add: bit-exact
    // In place, as the residual stream uses it (out aliases a).
    DEEPINFER_CUDA_OK(kernels::AddF32(n, da.get(), db.get(), da.get(), nullptr));
    DEEPINFER_CUDA_OK(da.Download(&got));
    EXPECT_TRUE(AllClose(got, want, 0, 0));
  }
}

TEST(ElementwiseKernelTest, SiluMulMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t inter : {3, 96, 2048}) {
    for (int64_t rows : {1, 9, 130}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "inter " << inter << " rows " << rows << " seed " << seed);
      auto x = testing::RandomFloats(rows * 2 * inter, seed, 4.0f);
      std::vector<float> want(rows * inter);
      cpu.SiluMul(rows, inter, x.data(), want.data());
      DeviceArray<float> dx(x), dout(rows * inter);
      dout.Poison();
      DEEPINFER_CUDA_OK(kernels::SiluMulF32(rows, inter, dx.get(), dout.get(), nullptr));
      std::vector<float> got;
      DEEPINFER_CUDA_OK(dout.Download(&got));
      // expf differs from glibc's by up to 2 ulp.
      EXPECT_TRUE(AllClose(got, want, 1e-6, 2e-6));
    }
  }
}

// The fused SiLU-mul + bf16 rounding: bit for bit what SiluMulF32 then RoundF32ToBf16 give
// (each checked against the host above and below), and within one bf16 step of the CPU
// backend's SiluMul rounded on the host (expf may differ by 2 fp32 ulp, which can move a value
// across a bf16 rounding boundary).
TEST(ElementwiseKernelTest, SiluMulToBf16MatchesSiluMulThenRounding) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t inter : {3, 1408}) {
    for (int64_t rows : {1, 130}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "inter " << inter << " rows " << rows << " seed " << seed);
      auto x = testing::RandomFloats(rows * 2 * inter, seed, 4.0f);
      std::vector<float> cpu_out(rows * inter);
      cpu.SiluMul(rows, inter, x.data(), cpu_out.data());
      DeviceArray<float> dx(x), dact(rows * inter);
      DeviceArray<uint16_t> dout(rows * inter), dwant(rows * inter);
      dout.Poison();
      DEEPINFER_CUDA_OK(kernels::SiluMulF32ToBf16(rows, inter, dx.get(), dout.get(), nullptr));
      DEEPINFER_CUDA_OK(kernels::SiluMulF32(rows, inter, dx.get(), dact.get(), nullptr));
      DEEPINFER_CUDA_OK(kernels::RoundF32ToBf16(rows * inter, dact.get(), dwant.get(), nullptr));
      std::vector<uint16_t> got, want;
      DEEPINFER_CUDA_OK(dout.Download(&got));
      DEEPINFER_CUDA_OK(dwant.Download(&want));
      EXPECT_EQ(got, want);
      int far = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const int host = FloatToBf16Bits(cpu_out[i]);
        if (std::abs(static_cast<int>(got[i]) - host) > 1 && ++far <= 5) {
          ADD_FAILURE() << "element " << i << ": got bf16 bits " << got[i] << ", host " << host;
        }
      }
      EXPECT_EQ(far, 0);
    }
  }
}

// The vectorised SiLU-mul (groups of 4 columns, 16-byte aligned x) against the scalar kernel (the
// same input at an address that is not 16-byte aligned), bit for bit, at prefill sizes (8192
// rows of a shared expert's 2816, an odd row count, the routed experts' 1408) and at shapes that
// take the scalar path either way (inter % 4 != 0), fp32 and bf16 out; and against the CPU
// backend within expf's 2 ulp at one prefill size.
TEST(ElementwiseKernelTest, VectorisedSiluMulMatchesTheScalarKernelAtPrefillSizes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Shape {
    int64_t rows, inter;
  };
  for (const Shape sh : {Shape{8192, 2816}, Shape{8191, 1408}, Shape{1, 4}, Shape{3, 6},
                         Shape{517, 11}, Shape{2, 11264}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "rows " << sh.rows << " inter " << sh.inter << " seed " << seed);
    const int64_t n = sh.rows * sh.inter;
    auto x = testing::RandomFloats(sh.rows * 2 * sh.inter, seed, 6.0f);
    std::vector<float> shifted(x.size() + 1, 0.0f);  // x from element 1: 4 bytes past 16
    std::copy(x.begin(), x.end(), shifted.begin() + 1);
    DeviceArray<float> dx(x), dx_shifted(shifted), f_new(n), f_old(n);
    DeviceArray<uint16_t> b_new(n), b_old(n);
    f_new.Poison();
    b_new.Poison();
    const float* unaligned_x = dx_shifted.get() + 1;
    DEEPINFER_CUDA_OK(kernels::SiluMulF32(sh.rows, sh.inter, unaligned_x, f_old.get(), nullptr));
    DEEPINFER_CUDA_OK(
        kernels::SiluMulF32ToBf16(sh.rows, sh.inter, unaligned_x, b_old.get(), nullptr));
    DEEPINFER_CUDA_OK(kernels::SiluMulF32(sh.rows, sh.inter, dx.get(), f_new.get(), nullptr));
    DEEPINFER_CUDA_OK(kernels::SiluMulF32ToBf16(sh.rows, sh.inter, dx.get(), b_new.get(), nullptr));
    std::vector<float> fo, fn;
    std::vector<uint16_t> bo, bn;
    DEEPINFER_CUDA_OK(f_old.Download(&fo));
    DEEPINFER_CUDA_OK(f_new.Download(&fn));
    DEEPINFER_CUDA_OK(b_old.Download(&bo));
    DEEPINFER_CUDA_OK(b_new.Download(&bn));
    EXPECT_TRUE(AllClose(fn, fo, 0, 0));
    EXPECT_EQ(bn, bo);
    if (sh.rows == 8191) {
      std::vector<float> want(n);
      cpu.SiluMul(sh.rows, sh.inter, x.data(), want.data());
      EXPECT_TRUE(AllClose(fn, want, 1e-6, 2e-6));
    }
  }
}

// Both launches: 100009 values (not a multiple of 8: the scalar kernel) and 100008 (the
// 16-byte kernel).
TEST(ElementwiseKernelTest, RoundToBf16MatchesHostRounding) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const size_t n : {size_t{100009}, size_t{100008}}) {
    SCOPED_TRACE(::testing::Message() << n << " values");
    auto x = testing::RandomFloats(n - 6, seed, 100.0f);
    // Ties (1 + 2^-8 rounds to even 1.0, 1 + 3*2^-8 up), signed zero, large and tiny values.
    const std::vector<float> special = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -0.0f,
                                        3.0e38f,           1.0e-40f,          -65504.0f};
    x.insert(x.end(), special.begin(), special.end());
    DeviceArray<float> dx(x);
    DeviceArray<uint16_t> dout(x.size());
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::RoundF32ToBf16(x.size(), dx.get(), dout.get(), nullptr));
    std::vector<uint16_t> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    int wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (got[i] != FloatToBf16Bits(x[i]) && ++wrong <= 5) {
        ADD_FAILURE() << "x[" << i << "] = " << x[i] << ": got " << got[i] << " want "
                      << FloatToBf16Bits(x[i]);
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

}  // namespace
}  // namespace deepinfer
