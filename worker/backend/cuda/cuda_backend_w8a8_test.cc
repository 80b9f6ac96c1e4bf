// CudaBackend's W8A8 ops that quantise an activation once for several cuBLASLt FP8 GEMMs
// (cuda_backend_w8a8.cc), at CudaTuning::fp8_w8a8_min_rows rows and more on compute capability
// 9.0: bit for bit the unfused sequence of ops on the same backend (the quantised operands and
// GEMMs are the same), and within a bound of a host reference: the rows normed by CpuBackend,
// quantised per 128-wide block with the loader's e4m3 encoder, times the dequantised FP8 weights
// in double. Skips without a GPU or on another compute capability.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cuda/cublaslt_fp8_gemm.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

using testing::CallsOf;
using testing::CudaBackendTest;

// A random FP8 matrix [n, k] on the device (scale rows at the loader's stride, stacked at split
// rows, 0: not) and its dequantised values on the host.
struct Fp8Matrix {
  int64_t n = 0, k = 0, split = 0;
  std::vector<double> dequant;
  std::unique_ptr<DeviceBuffer> data, scales;
  WeightView view() const {
    return WeightView(data->data(),
                      Fp8BlockScales{scales->as<float>(), kernels::Fp8ScaleLd(k), split});
  }
};

// Per row and 128-wide block: s = max(amax / 448, FLT_MIN), e4m3(x / s) * s.
std::vector<double> Quantised(const std::vector<float>& a, int64_t m, int64_t k) {
  std::vector<double> x(m * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p0 = 0; p0 < k; p0 += 128) {
      const int64_t p1 = std::min(k, p0 + 128);
      float amax = 0.0f;
      for (int64_t p = p0; p < p1; ++p) amax = std::max(amax, std::fabs(a[i * k + p]));
      const float s = std::max(amax / 448.0f, FLT_MIN);
      for (int64_t p = p0; p < p1; ++p) {
        x[i * k + p] = static_cast<double>(F8E4M3ToFloat(FloatToF8E4M3(a[i * k + p] / s))) * s;
      }
    }
  }
  return x;
}

class CudaW8A8Test : public CudaBackendTest {
 protected:
  void SetUp() override {
    CudaBackendTest::SetUp();
    if (IsSkipped()) return;
    if (!CublasLtFp8Gemm::DeviceSupports(0)) GTEST_SKIP() << "no cuBLASLt W8A8 on this device";
  }

  Fp8Matrix RandomFp8(int64_t n, int64_t k, int64_t split, std::mt19937* gen) {
    Fp8Matrix m;
    m.n = n, m.k = k, m.split = split;
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> exponent(-9.0f, -5.0f);
    std::vector<uint8_t> bytes(n * k);
    for (uint8_t& b : bytes) {
      do {
        b = static_cast<uint8_t>(byte(*gen));
      } while ((b & 0x7F) == 0x7F);  // NaN
    }
    const int64_t ld = kernels::Fp8ScaleLd(k), cols = kernels::Fp8ScaleCols(k);
    std::vector<float> scales(kernels::Fp8ScaleRows(n, split) * ld, 0.0f);
    for (size_t i = 0; i < scales.size(); ++i) {
      if (static_cast<int64_t>(i) % ld < cols) scales[i] = std::exp2(exponent(*gen));
    }
    m.dequant.resize(n * k);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        m.dequant[j * k + p] = static_cast<double>(F8E4M3ToFloat(bytes[j * k + p])) *
                               scales[kernels::Fp8ScaleRow(j, split) * ld + p / 128];
      }
    }
    m.data = gpu_->Allocate(bytes.size());
    gpu_->CopyToDevice(bytes.data(), bytes.size(), m.data->data());
    m.scales = Upload(scales);
    return m;
  }

  // got [m, ldc] (first n columns) against x (the quantised rows, [m, k]) times w, in double:
  // fp32 sums and the FP8 tensor cores' promotions (cuda_backend_fp8_test's W8A8 bound), and one
  // e4m3 step (2^-3 relative) of the largest product for a value quantised from a normed row one
  // ulp off the host's.
  void ExpectProduct(const std::vector<float>& got, int64_t ldc, const std::vector<double>& x,
                     int64_t m, const Fp8Matrix& w) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < w.n; ++j) {
        double want = 0, mag = 0, largest = 0;
        for (int64_t p = 0; p < w.k; ++p) {
          const double prod = x[i * w.k + p] * w.dequant[j * w.k + p];
          want += prod;
          mag += std::abs(prod);
          largest = std::max(largest, std::abs(prod));
        }
        const double tol = (w.k + 64) * std::ldexp(mag + std::abs(want), -24) +
                           std::ldexp(mag, -8) + 4 * std::ldexp(largest, -3) + 1e-30;
        ASSERT_LE(std::abs(got[i * ldc + j] - want), tol)
            << "row " << i << " column " << j << " got " << got[i * ldc + j] << " want " << want;
      }
    }
  }
};

// AddRmsNormGemms on FP8 targets at W8A8 rows: the norm's pass quantises the normed rows once
// for every target (rows the fused norm takes: dim <= 7168), or AddRmsNorm then one
// quantisation (7296). One or two targets (the fused q + kv_a matrix, or q and kv_a), a bf16 or
// fp32 normed operand, rows a multiple of 4 or not (the GEMMs' results through scratch).
TEST_F(CudaW8A8Test, AddRmsNormGemmsQuantisesOnceForEveryTarget) {
  struct Case {
    int64_t rows, dim;
    std::vector<int64_t> ns;
    bool bf16;
  };
  for (const Case& t : {Case{128, 2048, {1536, 576}, true}, Case{130, 2048, {2112}, true},
                        Case{128, 1024, {256, 64}, false}, Case{132, 7296, {128}, true}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " rows " << t.rows << " dim " << t.dim
                                      << " targets " << t.ns.size() << " bf16 " << t.bf16);
    std::mt19937 gen(seed);
    const int64_t rows = t.rows, dim = t.dim;
    std::vector<Fp8Matrix> w;
    for (int64_t n : t.ns) w.push_back(RandomFp8(n, dim, 0, &gen));
    const std::vector<float> x = testing::RandomFloats(rows * dim, seed, 3.0f),
                             y = testing::RandomFloats(rows * dim, seed + 1, 2.0f),
                             nw = testing::RandomFloats(dim, seed + 2);
    const float eps = 1e-6f;
    auto dx = Upload(x), dy = Upload(y), dnw = Upload(nw), ux = Upload(x);
    auto normed = gpu_->AllocateScratch(rows * dim * sizeof(float));
    auto normed16 = gpu_->AllocateScratch(rows * dim * sizeof(uint16_t));
    auto unormed = gpu_->AllocateScratch(rows * dim * sizeof(float));
    auto unormed16 = gpu_->AllocateScratch(rows * dim * sizeof(uint16_t));
    std::vector<std::unique_ptr<DeviceBuffer>> outs, unfused;
    std::vector<NormedGemm> gemms;
    for (const Fp8Matrix& m : w) {
      outs.push_back(Poisoned(rows * m.n));
      unfused.push_back(Poisoned(rows * m.n));
      gemms.push_back({m.n, m.view(), dim, outs.back()->as<float>(), m.n});
    }
    gpu_->SetOpTiming(true);
    gpu_->AddRmsNormGemms(rows, dim, dx->as<float>(), dy->as<float>(), dnw->as<float>(), eps,
                          t.bf16 ? nullptr : normed->as<float>(),
                          t.bf16 ? normed16->as<uint16_t>() : nullptr, gemms);
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    EXPECT_EQ(CallsOf(report, "AddRmsNormGemms/fp8-w8a8"), 1) << report;
    EXPECT_EQ(CallsOf(report, "Gemm/fp8-w8a8"), -1) << report;

    // The unfused sequence: AddRmsNorm, then a Gemm per target (each quantising the rows).
    gpu_->AddRmsNorm(rows, dim, ux->as<float>(), dy->as<float>(), dnw->as<float>(), eps,
                     t.bf16 ? nullptr : unormed->as<float>(),
                     t.bf16 ? unormed16->as<uint16_t>() : nullptr);
    const ActivationView a = t.bf16 ? ActivationView::Bf16(unormed16->as<uint16_t>())
                                    : ActivationView(unormed->as<float>());
    for (size_t g = 0; g < w.size(); ++g) {
      gpu_->Gemm(rows, w[g].n, dim, a, dim, w[g].view(), dim, unfused[g]->as<float>(), w[g].n,
                 false);
    }
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    EXPECT_EQ(Download(*dx), Download(*ux)) << "x += y";

    std::vector<float> cpu_x = x, cpu_normed(rows * dim);
    std::vector<uint16_t> cpu_bf16(rows * dim);
    cpu_.AddRmsNorm(rows, dim, cpu_x.data(), y.data(), nw.data(), eps, cpu_normed.data(),
                    cpu_bf16.data());
    std::vector<float> cpu_rows = cpu_normed;
    if (t.bf16) {
      for (int64_t e = 0; e < rows * dim; ++e) cpu_rows[e] = Bf16BitsToFloat(cpu_bf16[e]);
    }
    const std::vector<double> q = Quantised(cpu_rows, rows, dim);
    for (size_t g = 0; g < w.size(); ++g) {
      SCOPED_TRACE(::testing::Message() << "target " << g);
      const std::vector<float> got = Download(*outs[g]);
      const std::vector<float> want = Download(*unfused[g]);
      for (size_t e = 0; e < got.size(); ++e) {
        ASSERT_EQ(got[e], want[e]) << "element " << e << " differs from the unfused ops'";
      }
      ExpectProduct(got, w[g].n, q, rows, w[g]);
    }
  }
}

}  // namespace
}  // namespace deepinfer
