// Fp8QuantizeRows against the scheme computed on the host: the scale in float (amax / 448, at
// least FLT_MIN), each value divided by it in float and encoded by the loader's e4m3 encoder
// (worker/model/dtype_conversion.h: nearest even, saturating at 448). Both sides round the same
// IEEE operations, so bytes and scales must match exactly. AddRowsF32 against plain copies.
// Skips itself without a GPU.
#include "kernels/gemm/fp8_quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace kernels {
namespace {

using testing::DeviceArray;

struct Case {
  int64_t m, k, extra_lda, m_pad;
  bool a_bf16;
};

class Fp8QuantizeRowsTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8QuantizeRowsTest, MatchesTheHostScheme) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << t.m << " k " << t.k);
  const int64_t lda = t.k + t.extra_lda, ldq = t.k + 16, blocks = Fp8ScaleCols(t.k);
  std::vector<float> a = testing::RandomFloats(t.m * lda, seed, 3.0f);
  // Rows with a wide range (large and tiny blocks), an all-zero block, and tiny values that
  // quantise to e4m3 subnormals.
  for (int64_t p = 0; p < t.k && t.m > 1; ++p)
    a[1 * lda + p] *= std::ldexp(1.0f, (p / 128) % 40 - 20);
  if (t.m > 2) {
    for (int64_t p = 0; p < std::min<int64_t>(t.k, 128); ++p) a[2 * lda + p] = 0.0f;
  }
  if (t.a_bf16) {
    for (float& x : a) x = RoundToBf16(x);
  }
  DeviceArray<float> da(a);
  DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
  DeviceArray<uint8_t> dq(t.m_pad * ldq);
  DeviceArray<float> ds(blocks * t.m_pad);
  dq.Poison();
  ds.Poison();
  Fp8QuantizeParams p;
  p.m = t.m;
  p.k = t.k;
  p.a_bf16 = t.a_bf16;
  p.a = t.a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
  p.lda = lda;
  p.q = dq.get();
  p.ldq = ldq;
  p.scales = ds.get();
  p.m_pad = t.m_pad;
  DEEPINFER_CUDA_OK(Fp8QuantizeRows(p, nullptr));
  std::vector<uint8_t> q;
  std::vector<float> s;
  DEEPINFER_CUDA_OK(dq.Download(&q));
  DEEPINFER_CUDA_OK(ds.Download(&s));
  for (int64_t i = 0; i < t.m_pad; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t p0 = b * 128, p1 = std::min(t.k, p0 + 128);
      float want_s = 1.0f;
      if (i < t.m) {
        float amax = 0.0f;
        for (int64_t c = p0; c < p1; ++c) amax = std::max(amax, std::fabs(a[i * lda + c]));
        want_s = std::max(amax / 448.0f, FLT_MIN);
      }
      ASSERT_EQ(s[b * t.m_pad + i], want_s) << "scale of row " << i << " block " << b;
      for (int64_t c = p0; c < p1; ++c) {
        const uint8_t want = i < t.m ? FloatToF8E4M3(a[i * lda + c] / want_s) : uint8_t{0};
        ASSERT_EQ(q[i * ldq + c], want)
            << "row " << i << " column " << c << " x " << (i < t.m ? a[i * lda + c] : 0.0f);
      }
    }
    for (int64_t c = t.k; c < ldq; ++c) {
      ASSERT_EQ(q[i * ldq + c], 0xFF) << "padding column " << c << " of row " << i << " written";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8QuantizeRowsTest,
                         ::testing::Values(Case{1, 128, 0, 4, false}, Case{3, 2048, 0, 4, false},
                                           Case{5, 208, 8, 8, true}, Case{64, 1408, 0, 64, true},
                                           Case{7, 7168, 4, 12, false}, Case{0, 256, 0, 4, false}));

// Grouped rows: each group's scales packed for its own rows at offsets[g] * blocks; rows past
// the last group untouched.
TEST(Fp8QuantizeRowsGroupsTest, PacksEachGroupsScales) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t m = 24, k = 384, blocks = Fp8ScaleCols(k);
  const std::vector<int32_t> offsets = {0, 4, 4, 12, 20};
  const int32_t groups = static_cast<int32_t>(offsets.size()) - 1;
  const std::vector<float> a = testing::RandomFloats(m * k, seed);
  DeviceArray<float> da(a);
  DeviceArray<int32_t> doff(offsets);
  DeviceArray<uint8_t> dq(m * k);
  DeviceArray<float> ds(blocks * m);
  dq.Poison();
  ds.Poison();
  Fp8QuantizeParams p;
  p.m = m;
  p.k = k;
  p.a = da.get();
  p.lda = k;
  p.q = dq.get();
  p.ldq = k;
  p.scales = ds.get();
  p.m_pad = m;
  p.group_offsets = doff.get();
  p.num_groups = groups;
  DEEPINFER_CUDA_OK(Fp8QuantizeRows(p, nullptr));
  std::vector<uint8_t> q;
  std::vector<float> s;
  DEEPINFER_CUDA_OK(dq.Download(&q));
  DEEPINFER_CUDA_OK(ds.Download(&s));
  for (int32_t g = 0; g < groups; ++g) {
    const int64_t base = offsets[g], count = offsets[g + 1] - offsets[g];
    for (int64_t i = base; i < base + count; ++i) {
      for (int64_t b = 0; b < blocks; ++b) {
        float amax = 0.0f;
        for (int64_t c = b * 128; c < (b + 1) * 128; ++c)
          amax = std::max(amax, std::fabs(a[i * k + c]));
        const float want_s = std::max(amax / 448.0f, FLT_MIN);
        ASSERT_EQ(s[base * blocks + b * count + (i - base)], want_s)
            << "group " << g << " row " << i;
        for (int64_t c = b * 128; c < (b + 1) * 128; ++c) {
          ASSERT_EQ(q[i * k + c], FloatToF8E4M3(a[i * k + c] / want_s)) << "row " << i;
        }
      }
    }
  }
  for (int64_t i = offsets.back(); i < m; ++i) {
    for (int64_t c = 0; c < k; ++c) ASSERT_EQ(q[i * k + c], 0xFF) << "row " << i << " written";
  }
  for (int64_t e = offsets.back() * blocks; e < blocks * m; ++e) {
    ASSERT_TRUE(std::isnan(s[e])) << "scale " << e << " written";
  }
}

TEST(Fp8QuantizeRowsArgsTest, RejectsBadLayouts) {
  Fp8QuantizeParams p;  // all zero
  EXPECT_EQ(Fp8QuantizeRows(p, nullptr), cudaErrorInvalidValue);
}

TEST(AddRowsF32Test, CopiesOrAddsEachRow) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const int64_t m = 5, n = 7, ldd = 12, ldc = 9;
  const std::vector<float> d = testing::RandomFloats(m * ldd, 1),
                           c0 = testing::RandomFloats(m * ldc, 2);
  for (bool accumulate : {false, true}) {
    DeviceArray<float> dd(d), dc(c0);
    DEEPINFER_CUDA_OK(AddRowsF32(m, n, dd.get(), ldd, dc.get(), ldc, accumulate, nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dc.Download(&got));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float want = j >= n
                               ? c0[i * ldc + j]
                               : (accumulate ? c0[i * ldc + j] + d[i * ldd + j] : d[i * ldd + j]);
        ASSERT_EQ(got[i * ldc + j], want) << i << ", " << j;
      }
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
