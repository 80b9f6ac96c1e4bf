// CublasLtGemmTuner against a host reference (bf16 products summed in double): fp32 and bf16
// outputs, accumulate, a strided A; the same bits on every call of a shape; one timing per
// bucket of m.
#include "worker/backend/cuda/cublaslt_gemm_tuner.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

TEST(CublasLtGemmTunerTest, MatchesHostReferenceAndKeepsItsChoice) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<uint8_t> workspace(size_t{32} << 20);
  auto tuner = CublasLtGemmTuner::Create(workspace.get(), size_t{32} << 20);
  ASSERT_TRUE(tuner.ok()) << tuner.status();
  const int64_t n = 192, k = 320, lda = k + 8;
  for (int64_t m : {int64_t{300}, int64_t{301}}) {  // one bucket
    for (bool c_bf16 : {false, true}) {
      for (bool accumulate : {false, true}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "m " << m << " c_bf16 " << c_bf16 << " accumulate "
                                          << accumulate << " seed " << seed);
        const std::vector<uint16_t> a = FloatsToBf16Bits(testing::RandomFloats(m * lda, seed));
        const std::vector<uint16_t> w = FloatsToBf16Bits(testing::RandomFloats(n * k, seed + 1));
        const std::vector<float> c0 = testing::RandomFloats(m * n, seed + 2);
        std::vector<float> want(m * n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double sum = 0.0;
            for (int64_t p = 0; p < k; ++p) {
              sum += static_cast<double>(Bf16BitsToFloat(a[i * lda + p])) *
                     Bf16BitsToFloat(w[j * k + p]);
            }
            const double c_in =
                c_bf16 ? Bf16BitsToFloat(FloatToBf16Bits(c0[i * n + j])) : c0[i * n + j];
            want[i * n + j] = static_cast<float>(sum + (accumulate ? c_in : 0.0));
          }
        }
        DeviceArray<uint16_t> da(a), dw(w), dc16(FloatsToBf16Bits(c0)), timing(m * n * 2);
        DeviceArray<float> dc32(c0);
        LtGemm g;
        g.m = m, g.n = n, g.k = k, g.a = da.get(), g.lda = lda, g.w = dw.get(), g.ldw = k;
        g.c = c_bf16 ? static_cast<void*>(dc16.get()) : static_cast<void*>(dc32.get());
        g.ldc = n, g.c_bf16 = c_bf16, g.accumulate = accumulate;
        // Timing writes c itself without accumulate (no buffer needed), timing_c with it.
        EXPECT_EQ((*tuner)->NeedsTiming(g), accumulate && m == 300);
        auto ran = (*tuner)->Run(g, nullptr, accumulate ? timing.get() : nullptr);
        ASSERT_TRUE(ran.ok()) << ran.status();
        ASSERT_TRUE(*ran) << "no cuBLASLt algorithm for a plain bf16 GEMM";
        EXPECT_FALSE((*tuner)->NeedsTiming(g));
        std::vector<float> got;
        if (c_bf16) {
          std::vector<uint16_t> got16;
          ASSERT_EQ(dc16.Download(&got16), cudaSuccess);
          for (uint16_t v : got16) got.push_back(Bf16BitsToFloat(v));
          EXPECT_TRUE(AllClose(got, want, 1e-2, 1.0 / 128));
        } else {
          ASSERT_EQ(dc32.Download(&got), cudaSuccess);
          EXPECT_TRUE(AllClose(got, want, 1e-4, 1e-4));
        }
        // Again from the same inputs (without accumulate: c's new value is no input): the
        // shape's algorithm, the same bits.
        if (!accumulate) {
          ran = (*tuner)->Run(g, nullptr, nullptr);
          ASSERT_TRUE(ran.ok() && *ran) << ran.status();
          std::vector<float> again;
          if (c_bf16) {
            std::vector<uint16_t> again16;
            ASSERT_EQ(dc16.Download(&again16), cudaSuccess);
            for (uint16_t v : again16) again.push_back(Bf16BitsToFloat(v));
          } else {
            ASSERT_EQ(dc32.Download(&again), cudaSuccess);
          }
          EXPECT_TRUE(AllClose(again, got, 0, 0));
        }
      }
    }
  }
  // m 301 took m 300's choices: 4 timed buckets, 8 shapes.
  EXPECT_EQ((*tuner)->timed_buckets(), 4u);
  EXPECT_EQ((*tuner)->shapes(), 8u);
}

TEST(CublasLtGemmTunerTest, NewAccumulatingShapeWithoutTimingBufferIsAnError) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<uint8_t> workspace(size_t{1} << 20);
  auto tuner = CublasLtGemmTuner::Create(workspace.get(), size_t{1} << 20);
  ASSERT_TRUE(tuner.ok()) << tuner.status();
  DeviceArray<uint16_t> a(64 * 64), w(64 * 64);
  DeviceArray<float> c(64 * 64);
  LtGemm g;
  g.m = 64, g.n = 64, g.k = 64, g.a = a.get(), g.lda = 64, g.w = w.get(), g.ldw = 64;
  g.c = c.get(), g.ldc = 64, g.accumulate = true;  // c is an input: timing needs its own buffer
  auto ran = (*tuner)->Run(g, nullptr, nullptr);
  EXPECT_EQ(ran.status().code(), absl::StatusCode::kInvalidArgument) << ran.status();
}

}  // namespace
}  // namespace deepinfer
