// Fp8WgmmaGemm and Fp8WgmmaGroupedGemm against the W8A8 product in double on the host: random
// e4m3 activations with random per-row 1 x 128 block scales (in Fp8QuantizeRows' layouts) and
// random e4m3 weights with 128 x 128 block scales. The bound is 2^-9 of the sum of the terms'
// magnitudes (the tensor cores add one k block's 128 products with fewer bits than fp32; the
// promotion to fp32 is per block), plus half a bf16 ulp of the result for bf16 output. A wrong
// swizzle, descriptor, fragment or scale index is off by about the sum itself (~ 1.25 / sqrt(k)
// of the magnitudes for these random signs: 2^-6 at k = 7168, more at the smaller k). Skips
// itself without a compute capability 9.0 device.
#include "kernels/gemm/fp8_wgmma_gemm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace kernels {
namespace {

using fp8_testing::HostFp8;
using fp8_testing::MakeWeight;
using fp8_testing::RandomFp8;
using fp8_testing::RandomScales;
using testing::DeviceArray;

constexpr double kUnit = 1.0 / 512;

#define SKIP_WITHOUT_WGMMA()                                                           \
  do {                                                                                 \
    DEEPINFER_SKIP_WITHOUT_GPU();                                                      \
    if (!Fp8WgmmaDeviceSupports()) GTEST_SKIP() << "no compute capability 9.0 device"; \
  } while (0)

// Positive activation scales (as Fp8QuantizeRows makes them).
std::vector<float> ActivationScales(size_t n, std::mt19937* gen) {
  std::vector<float> s = RandomScales(n, gen);
  for (float& v : s) v = std::abs(v) * 64.0f;
  return s;
}

// out[i, j] (row stride ldc, the output read back as floats) against want / mag ([m, n]).
void ExpectOutput(const std::vector<float>& got, int64_t ldc, const std::vector<double>& want,
                  const std::vector<double>& mag, int64_t m, int64_t n, bool bf16) {
  std::vector<float> g(m * n);
  std::vector<double> tol(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      g[i * n + j] = got[i * ldc + j];
      tol[i * n + j] = kUnit * mag[i * n + j] +
                       (bf16 ? std::ldexp(std::abs(want[i * n + j]), -8)
                             : std::ldexp(std::abs(want[i * n + j]), -23)) +
                       1e-30;
    }
  }
  EXPECT_TRUE(fp8_testing::WithinBound(g, want, tol));
}

// The output buffer [rows, ldc] read back as floats (bf16 widened).
std::vector<float> ReadOutput(const void* d, int64_t rows, int64_t ldc, bool bf16) {
  std::vector<float> out(rows * ldc);
  if (bf16) {
    std::vector<uint16_t> h(rows * ldc);
    EXPECT_EQ(cudaMemcpy(h.data(), d, h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < h.size(); ++i) out[i] = Bf16BitsToFloat(h[i]);
  } else {
    EXPECT_EQ(cudaMemcpy(out.data(), d, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return out;
}

struct DenseCase {
  int64_t m, n, k;
  int64_t ldc_pad;
  bool bf16;
  bool accumulate;
  int64_t split;
};

class Fp8WgmmaDenseTest : public ::testing::TestWithParam<DenseCase> {};

TEST_P(Fp8WgmmaDenseTest, MatchesW8A8ProductOnTheHost) {
  SKIP_WITHOUT_WGMMA();
  const DenseCase c = GetParam();
  const int64_t m = c.m, n = c.n, k = c.k, ldc = n + c.ldc_pad, lda = k + 16;
  const int64_t blocks = Fp8ScaleCols(k), m_pad = m + 3;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const std::vector<uint8_t> a = RandomFp8(m * lda, &gen);
  const std::vector<float> sa = ActivationScales(blocks * m_pad, &gen);
  const HostFp8 w = MakeWeight(n, k, k + 32, c.split, &gen);

  std::vector<double> x(m * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      x[i * k + p] =
          static_cast<double>(F8E4M3ToFloat(a[i * lda + p])) * sa[(p / kFp8BlockSize) * m_pad + i];
    }
  }
  std::vector<double> want, mag;
  fp8_testing::DequantisedProduct(x, k, m, w, &want, &mag);

  DeviceArray<uint8_t> da(a), dw(w.data);
  DeviceArray<float> dsa(sa), dsw(w.scales);
  const size_t out_bytes = m * ldc * (c.bf16 ? 2 : 4);
  DeviceArray<uint8_t> dc(out_bytes);
  std::vector<float> c0;
  if (c.accumulate) {
    c0 = fp8_testing::RandomScales(m * ldc, &gen);
    DEEPINFER_CUDA_OK(cudaMemcpy(dc.get(), c0.data(), out_bytes, cudaMemcpyHostToDevice));
    for (int64_t e = 0; e < m * n; ++e) want[e] += c0[(e / n) * ldc + e % n];
  } else {
    DEEPINFER_CUDA_OK(cudaMemset(dc.get(), 0xFF, out_bytes));  // NaN in both types
  }

  Fp8WgmmaGemmParams p;
  p.m = m, p.n = n, p.k = k, p.a = da.get(), p.lda = lda;
  p.a_scales = dsa.get(), p.a_scale_ld = m_pad;
  p.w.data = dw.get(), p.w.ldw = w.ldw, p.w.scales = dsw.get(), p.w.scale_ld = w.scale_ld;
  p.w.split_rows = c.split;
  p.c = dc.get(), p.ldc = ldc, p.c_bf16 = c.bf16, p.accumulate = c.accumulate;
  ASSERT_TRUE(Fp8WgmmaGemmSupports(p));
  DEEPINFER_CUDA_OK(Fp8WgmmaGemm(p, nullptr));
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = ReadOutput(dc.get(), m, ldc, c.bf16);
  ExpectOutput(got, ldc, want, mag, m, n, c.bf16);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n; j < ldc; ++j) {
      if (c.accumulate) {
        ASSERT_EQ(got[i * ldc + j], c0[i * ldc + j]) << "padding column " << j << " row " << i;
      } else {
        ASSERT_TRUE(std::isnan(got[i * ldc + j])) << "padding column " << j << " row " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8WgmmaDenseTest,
    ::testing::Values(
        // Moonlight: gate_up (stacked at 1408), down, a dense projection.
        DenseCase{1, 2816, 2048, 0, false, false, 1408},
        DenseCase{100, 2048, 1408, 8, true, false, 0},
        DenseCase{128, 2816, 2048, 0, true, false, 1408},
        DenseCase{300, 2048, 2048, 6, false, true, 0},
        DenseCase{4096, 256, 1408, 2, false, false, 0},
        DenseCase{4096, 384, 2048, 0, true, false, 0},
        // DeepSeek-V3: q_a + kv_a (2112: a partial last tile), q_b, gate_up, down.
        DenseCase{100, 2112, 7168, 0, false, false, 0},
        DenseCase{129, 24576, 1536, 4, true, false, 0},
        DenseCase{300, 4096, 7168, 0, false, false, 2048},
        DenseCase{77, 7168, 2048, 10, true, false, 0}));

TEST(Fp8WgmmaGemmTest, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_WGMMA();
  Fp8WgmmaGemmParams p;
  p.m = 4, p.n = 256, p.k = 256, p.lda = 256, p.a_scale_ld = 4, p.ldc = 256;
  DeviceArray<uint8_t> buf(1 << 20);
  p.a = buf.get(), p.a_scales = reinterpret_cast<const float*>(buf.get());
  p.w.data = buf.get(), p.w.ldw = 256, p.w.scales = p.a_scales, p.w.scale_ld = 4;
  p.c = buf.get();
  EXPECT_TRUE(Fp8WgmmaGemmSupports(p));
  Fp8WgmmaGemmParams q = p;
  q.k = 192, q.lda = 192, q.w.ldw = 192;  // not a multiple of 128
  EXPECT_FALSE(Fp8WgmmaGemmSupports(q));
  EXPECT_EQ(Fp8WgmmaGemm(q, nullptr), cudaErrorInvalidValue);
  q = p;
  q.w.split_rows = 64;  // a 128-row tile with two scale rows
  EXPECT_FALSE(Fp8WgmmaGemmSupports(q));
  q = p;
  q.c_bf16 = true, q.accumulate = true;
  EXPECT_FALSE(Fp8WgmmaGemmSupports(q));
  q = p;
  q.a = buf.get() + 8;  // TMA needs 16-byte aligned rows
  EXPECT_FALSE(Fp8WgmmaGemmSupports(q));
}

struct GroupedCase {
  std::vector<int32_t> rows;
  int64_t n, k, split;
  bool bf16;
};

class Fp8WgmmaGroupedTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Fp8WgmmaGroupedTest, EachGroupMatchesItsProductOnTheHost) {
  SKIP_WITHOUT_WGMMA();
  const GroupedCase c = GetParam();
  const int64_t n = c.n, k = c.k, ldc = n, blocks = Fp8ScaleCols(k);
  const int32_t G = static_cast<int32_t>(c.rows.size());
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  std::vector<int32_t> offsets(G + 1, 0);
  for (int32_t g = 0; g < G; ++g) offsets[g + 1] = offsets[g] + c.rows[g];
  const int64_t used = offsets[G], max_rows = used + 5;
  const std::vector<uint8_t> a = RandomFp8(max_rows * k, &gen);
  const std::vector<float> sa = ActivationScales(std::max<int64_t>(1, used * blocks), &gen);
  std::vector<HostFp8> w;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dw;
  std::vector<std::unique_ptr<DeviceArray<float>>> ds;
  std::vector<Fp8BlockWeight> weights(G);
  for (int32_t g = 0; g < G; ++g) {
    w.push_back(MakeWeight(n, k, k, c.split, &gen));
    dw.push_back(std::make_unique<DeviceArray<uint8_t>>(w.back().data));
    ds.push_back(std::make_unique<DeviceArray<float>>(w.back().scales));
    weights[g].data = dw.back()->get(), weights[g].ldw = k;
    weights[g].scales = ds.back()->get(), weights[g].scale_ld = w.back().scale_ld;
    weights[g].split_rows = c.split;
  }
  DeviceArray<uint8_t> da(a);
  DeviceArray<float> dsa(sa);
  const size_t elem = c.bf16 ? 2 : 4;
  DeviceArray<uint8_t> dc(max_rows * ldc * elem);
  DEEPINFER_CUDA_OK(cudaMemset(dc.get(), 0xFF, max_rows * ldc * elem));
  DeviceArray<uint8_t> workspace(Fp8WgmmaGroupedWorkspaceBytes(G, offsets.data()));

  Fp8WgmmaGroupedGemmParams p;
  p.num_groups = G, p.host_offsets = offsets.data(), p.n = n, p.k = k;
  p.a = da.get(), p.lda = k, p.a_scales = dsa.get(), p.weights = weights.data();
  p.c = dc.get(), p.ldc = ldc, p.c_bf16 = c.bf16, p.workspace = workspace.get();
  ASSERT_TRUE(Fp8WgmmaGroupedGemmSupports(p));
  DEEPINFER_CUDA_OK(Fp8WgmmaGroupedGemm(p, nullptr));
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = ReadOutput(dc.get(), max_rows, ldc, c.bf16);

  for (int32_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], rows = c.rows[g];
    if (rows == 0) continue;
    SCOPED_TRACE(::testing::Message() << "group " << g << " rows " << rows);
    std::vector<double> x(rows * k);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t p2 = 0; p2 < k; ++p2) {
        const int64_t kb = p2 / kFp8BlockSize;
        x[i * k + p2] = static_cast<double>(F8E4M3ToFloat(a[(r0 + i) * k + p2])) *
                        sa[r0 * blocks + kb * rows + i];
      }
    }
    std::vector<double> want, mag;
    fp8_testing::DequantisedProduct(x, k, rows, w[g], &want, &mag);
    const std::vector<float> gg(got.begin() + r0 * ldc, got.begin() + (r0 + rows) * ldc);
    ExpectOutput(gg, ldc, want, mag, rows, n, c.bf16);
  }
  for (int64_t e = used * ldc; e < max_rows * ldc; ++e) {
    ASSERT_TRUE(std::isnan(got[e])) << "row past the groups written at " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Groups, Fp8WgmmaGroupedTest,
    ::testing::Values(GroupedCase{{0, 1, 127, 128, 129, 3000}, 384, 1408, 0, false},
                      GroupedCase{{129, 0, 3000, 1, 128, 127, 0}, 768, 512, 384, true},
                      GroupedCase{{5, 300}, 2816, 2048, 1408, false}));

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
