// SmallMGemmBf16 against CpuBackend::Gemm with bf16 weights (which rounds a to bf16 and sums
// in fp32): both layouts (kRowPerGroup, kSplitK with 1, 2, 4 and 8 warps per row, partial last
// groups), every m, several k (each lane-group width), strided and batched operands,
// accumulate; a bf16 a gives bit for bit what the fp32 a it was rounded from gives; kSplitK
// gives the same bits on every run; refusals.
#include "kernels/gemm/small_m_gemm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/backend.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

struct Case {
  int64_t batch, m, n, k, lda_pad, ldw_pad, ldc_pad;
  bool accumulate;
};

TEST(SmallMGemmTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const std::vector<Case> cases = {
      {1, 1, 576, 2048, 0, 0, 0, false},  {1, 1, 3072, 2048, 0, 0, 0, false},
      {1, 2, 1000, 2816, 8, 8, 3, false}, {1, 3, 257, 4096, 8, 0, 0, true},
      {1, 2, 129, 11264, 0, 8, 0, false}, {16, 1, 512, 128, 64, 0, 0, false},
      {16, 4, 128, 512, 0, 0, 0, false},  {3, 2, 33, 64, 8, 16, 5, true},
      {2, 1, 65, 8, 0, 0, 0, false},      {1, 4, 7, 40, 8, 8, 1, true},
      {1, 1, 37, 1032, 0, 0, 0, false},   {2, 3, 19, 6152, 8, 8, 2, true},
      {1, 1, 2048, 11264, 0, 0, 0, true},
  };
  for (const Case& c : cases) {
    for (const kernels::SmallMGemmAlgo algo :
         {kernels::SmallMGemmAlgo::kRowPerGroup, kernels::SmallMGemmAlgo::kSplitK})
      for (bool a_bf16 : {false, true}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << "batch " << c.batch << " m " << c.m << " n " << c.n << " k " << c.k
                     << " a_bf16 " << a_bf16 << " accumulate " << c.accumulate << " algo "
                     << static_cast<int>(algo) << " seed " << seed);
        const int64_t lda = c.k + c.lda_pad, ldw = c.k + c.ldw_pad, ldc = c.n + c.ldc_pad;
        const int64_t stride_a = c.m * lda, stride_w = c.n * ldw + 8, stride_c = c.m * ldc;
        std::vector<float> a = testing::RandomFloats(c.batch * stride_a, seed, 2.0f);
        if (a_bf16) {
          for (float& v : a) v = RoundToBf16(v);
        }
        const std::vector<uint16_t> w =
            FloatsToBf16Bits(testing::RandomFloats(c.batch * stride_w, seed + 1));
        std::vector<float> want = testing::RandomFloats(c.batch * stride_c, seed + 2);
        const std::vector<float> c0 = want;
        for (int64_t b = 0; b < c.batch; ++b) {
          cpu.Gemm(c.m, c.n, c.k, a.data() + b * stride_a, lda,
                   WeightView(w.data() + b * stride_w, WeightDType::kBFloat16), ldw,
                   want.data() + b * stride_c, ldc, c.accumulate);
        }
        DeviceArray<float> da(a), dc(c0);
        DeviceArray<uint16_t> da16(FloatsToBf16Bits(a)), dw(w);
        kernels::SmallMGemmParams p;
        p.m = c.m, p.n = c.n, p.k = c.k;
        p.a = a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
        p.a_bf16 = a_bf16;
        p.lda = lda;
        p.w = dw.get();
        p.ldw = ldw;
        p.c = dc.get();
        p.ldc = ldc;
        p.accumulate = c.accumulate;
        p.batch = c.batch;
        p.stride_a = stride_a, p.stride_w = stride_w, p.stride_c = stride_c;
        p.algo = algo;
        ASSERT_TRUE(kernels::SmallMGemmSupports(p));
        DEEPINFER_CUDA_OK(kernels::SmallMGemmBf16(p, nullptr));
        std::vector<float> got;
        DEEPINFER_CUDA_OK(dc.Download(&got));
        // Exact products, fp32 sums in another order: a few ulp of sqrt(k)-sized sums.
        EXPECT_TRUE(AllClose(got, want, 2e-5 * std::sqrt(static_cast<double>(c.k)), 1e-5));
        // Elements between rows (ldc padding) are untouched.
        for (int64_t b = 0; b < c.batch; ++b) {
          for (int64_t i = 0; i < c.m; ++i) {
            for (int64_t j = c.n; j < ldc; ++j) {
              const int64_t at = b * stride_c + i * ldc + j;
              ASSERT_EQ(got[at], c0[at]) << "padding element " << at << " written";
            }
          }
        }
        if (a_bf16) {
          // The same values as fp32 rows give the same bits.
          DeviceArray<float> dc2(c0);
          p.a = da.get();
          p.a_bf16 = false;
          p.c = dc2.get();
          DEEPINFER_CUDA_OK(kernels::SmallMGemmBf16(p, nullptr));
          std::vector<float> got2;
          DEEPINFER_CUDA_OK(dc2.Download(&got2));
          EXPECT_TRUE(AllClose(got2, got, 0, 0));
        }
        if (algo == kernels::SmallMGemmAlgo::kSplitK) {
          // Deterministic: a second run from the same c gives the same bits.
          DeviceArray<float> dc3(c0);
          p.c = dc3.get();
          DEEPINFER_CUDA_OK(kernels::SmallMGemmBf16(p, nullptr));
          std::vector<float> got3;
          DEEPINFER_CUDA_OK(dc3.Download(&got3));
          EXPECT_TRUE(AllClose(got3, got, 0, 0));
        }
      }
  }
}

TEST(SmallMGemmTest, RefusesWhatItCannotRun) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<float> a(64 * 1024), c(64 * 1024);
  DeviceArray<uint16_t> w(64 * 1024);
  kernels::SmallMGemmParams p;
  p.m = 1, p.n = 16, p.k = 64, p.a = a.get(), p.lda = 64, p.w = w.get(), p.ldw = 64;
  p.c = c.get(), p.ldc = 16;
  EXPECT_TRUE(kernels::SmallMGemmSupports(p));
  kernels::SmallMGemmParams bad = p;
  bad.m = kernels::kSmallMGemmMaxRows + 1;
  EXPECT_FALSE(kernels::SmallMGemmSupports(bad));
  EXPECT_EQ(kernels::SmallMGemmBf16(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.k = 60;  // not a multiple of 8
  EXPECT_FALSE(kernels::SmallMGemmSupports(bad));
  bad = p;
  bad.w = w.get() + 1;  // not 16-byte aligned
  EXPECT_FALSE(kernels::SmallMGemmSupports(bad));
  bad = p;
  bad.lda = 66;  // rows of a not 16-byte aligned
  EXPECT_FALSE(kernels::SmallMGemmSupports(bad));
  bad = p;
  bad.a_bf16 = true;
  EXPECT_TRUE(kernels::SmallMGemmSupports(bad));
  bad.lda = 68;  // 16-byte aligned as fp32 rows, not as bf16 rows
  EXPECT_FALSE(kernels::SmallMGemmSupports(bad));
  bad = p;
  bad.k = 32 * 1024;  // an fp32 row of 128 KiB: beyond what L1 keeps
  bad.lda = bad.ldw = bad.k;
  EXPECT_FALSE(kernels::SmallMGemmSupports(bad));
}

}  // namespace
}  // namespace deepinfer
