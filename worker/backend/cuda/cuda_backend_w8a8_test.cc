// CudaBackend's W8A8 ops that quantise an activation once for several cuBLASLt FP8 GEMMs, or
// in the pass that computes it (cuda_backend_w8a8.cc: AddRmsNormGemms, SwiGluMlpBf16), at
// CudaTuning::fp8_w8a8_min_rows rows and more on compute capability 9.0: bit for bit the unfused
// sequence of ops on the same backend (the quantised operands and GEMMs are the same), and within a
// bound of a host reference: the rows normed by CpuBackend, quantised per 128-wide block with the
// loader's e4m3 encoder, times the dequantised FP8 weights in double. Skips without a GPU or on
// another compute capability.
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
#include "worker/backend/cuda/cuda_fp8_test_matrix.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

using testing::CallsOf;
using testing::CudaBackendTest;
using testing::Fp8Matrix;
using testing::QuantisedActivations;
using testing::RandomFp8Matrix;

class CudaW8A8Test : public CudaBackendTest {
 protected:
  void SetUp() override {
    CudaBackendTest::SetUp();
    if (IsSkipped()) return;
    if (!CublasLtFp8Gemm::DeviceSupports(0)) GTEST_SKIP() << "no cuBLASLt W8A8 on this device";
  }

  Fp8Matrix RandomFp8(int64_t n, int64_t k, int64_t split, std::mt19937* gen) {
    return RandomFp8Matrix(gpu_.get(), n, k, split, gen);
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
    const std::vector<double> q = QuantisedActivations(cpu_rows, rows, dim);
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

// The W8A8 bound of one quantised row times a weight: fp32 sums and the FP8 tensor cores'
// promotions (cuda_backend_fp8_test's).
double W8A8Bound(int64_t k, double mag, double want) {
  return (k + 64) * std::ldexp(mag + std::abs(want), -24) + std::ldexp(mag, -8) + 1e-30;
}

// SwiGluMlpBf16 on FP8 gate_up and down: bit for bit the ops one by one (ops/mlp_ops.h's SwiGlu
// with bf16 operands: GateUpSiluMulBf16 where the backend takes it, else Gemm + SiluMulBf16,
// then the down Gemm), and against the host in double: gate_up on the quantised rows (rounded
// to bf16 from kBf16GateUpMinRows rows), the product rounded to bf16 and quantised, down; the
// bound carries gate_up's error through silu(g) * u (as cuda_backend_fp8_test's routed experts).
// Rows a multiple of 4 or not, gate_up in fp32 (below kBf16GateUpMinRows) or bf16, inter a
// multiple of 128 or not, h bf16 or fp32, down written or added into out.
TEST_F(CudaW8A8Test, SwiGluMlpQuantisesTheSiluMulForDown) {
  struct Case {
    int64_t rows, hidden, inter;
    bool h_bf16, accumulate;
  };
  for (const Case& t : {Case{128, 256, 384, true, true}, Case{130, 256, 176, true, false},
                        Case{CudaBackend::kBf16GateUpMinRows, 256, 384, true, true},
                        Case{134, 384, 256, false, true}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " rows " << t.rows << " inter "
                                      << t.inter << " h_bf16 " << t.h_bf16);
    std::mt19937 gen(seed);
    const int64_t rows = t.rows, H = t.hidden, I = t.inter;
    const Fp8Matrix gu = RandomFp8(2 * I, H, I, &gen), dn = RandomFp8(H, I, 0, &gen);
    std::vector<float> h = testing::RandomFloats(rows * H, seed, 4.0f);
    if (t.h_bf16) {
      for (float& v : h) v = RoundToBf16(v);
    }
    const std::vector<float> out0 = testing::RandomFloats(rows * H, seed + 1);
    auto dh = Upload(h);
    std::vector<uint16_t> h16 = FloatsToBf16Bits(h);
    auto dh16 = gpu_->Allocate(h16.size() * sizeof(uint16_t));
    gpu_->CopyToDevice(h16.data(), h16.size() * sizeof(uint16_t), dh16->data());
    const ActivationView a =
        t.h_bf16 ? ActivationView::Bf16(dh16->as<uint16_t>()) : ActivationView(dh->as<float>());
    auto out = Upload(out0), unfused = Upload(out0);

    gpu_->SetOpTiming(true);
    ASSERT_TRUE(
        gpu_->SwiGluMlpBf16(rows, H, I, a, gu.view(), dn.view(), out->as<float>(), t.accumulate));
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    EXPECT_EQ(CallsOf(report, "SwiGluMlpBf16/silu_mul_quantize-down"), 1) << report;

    // The ops one by one.
    auto act16 = gpu_->AllocateScratch(rows * I * sizeof(uint16_t));
    if (!gpu_->GateUpSiluMulBf16(rows, I, H, a, H, gu.view(), H, 0.0f, act16->as<uint16_t>())) {
      auto g = gpu_->AllocateScratch(rows * 2 * I * sizeof(float));
      gpu_->Gemm(rows, 2 * I, H, a, H, gu.view(), H, g->as<float>(), 2 * I, false);
      gpu_->SiluMulBf16(rows, I, g->as<float>(), act16->as<uint16_t>());
    }
    gpu_->Gemm(rows, H, I, ActivationView::Bf16(act16->as<uint16_t>()), I, dn.view(), I,
               unfused->as<float>(), H, t.accumulate);
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::vector<float> got = Download(*out), want_ops = Download(*unfused);
    for (size_t e = 0; e < got.size(); ++e) {
      ASSERT_EQ(got[e], want_ops[e]) << "element " << e << " differs from the ops one by one";
    }

    const bool gate_up_bf16 = rows >= CudaBackend::kBf16GateUpMinRows;
    const double bf16_step = std::ldexp(1.0, -8), step = std::ldexp(1.0, -3);
    const std::vector<double> hq = QuantisedActivations(h, rows, H);
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<float> act(I);
      std::vector<double> dact(I);
      double act_max = 0, dact_max = 0;
      for (int64_t c = 0; c < I; ++c) {
        double gate = 0, up = 0, gmag = 0, umag = 0;
        for (int64_t p = 0; p < H; ++p) {
          const double pg = hq[i * H + p] * gu.dequant[c * H + p];
          const double pu = hq[i * H + p] * gu.dequant[(I + c) * H + p];
          gate += pg, up += pu, gmag += std::abs(pg), umag += std::abs(pu);
        }
        const double rb = gate_up_bf16 ? bf16_step : 0.0;
        const double bg = W8A8Bound(H, gmag, gate), bu = W8A8Bound(H, umag, up);
        const double dg = bg + rb * (std::abs(gate) + bg), du = bu + rb * (std::abs(up) + bu);
        const double sg = gate / (1.0 + std::exp(-gate));
        act[c] = RoundToBf16(static_cast<float>(sg * up));
        const double dprod = 1.1 * dg * (std::abs(up) + du) + std::abs(sg) * du;
        dact[c] = dprod + bf16_step * (std::abs(sg * up) + dprod);
        act_max = std::max(act_max, std::abs(static_cast<double>(act[c])));
        dact_max = std::max(dact_max, dact[c]);
      }
      const std::vector<double> aq = QuantisedActivations(act, 1, I);
      for (int64_t j = 0; j < H; ++j) {
        double y = 0, ymag = 0, largest = 0, carried = 0;
        for (int64_t c = 0; c < I; ++c) {
          const double wv = dn.dequant[j * I + c];
          y += aq[c] * wv;
          ymag += std::abs(aq[c] * wv);
          largest = std::max(largest, std::abs(static_cast<double>(act[c]) * wv));
          carried += std::abs(wv) * dact[c];
        }
        // A block's scale follows its largest act: a relative change of up to dact_max /
        // act_max in every quantised value.
        const double rescaled = act_max > 0 ? dact_max / act_max * ymag : 0.0;
        const double want = (t.accumulate ? out0[i * H + j] : 0.0) + y;
        const double tol = 2 * step * largest + carried + rescaled + W8A8Bound(I, ymag, y) +
                           (t.accumulate ? std::ldexp(std::abs(want), -23) : 0.0);
        ASSERT_LE(std::abs(got[i * H + j] - want), tol)
            << "row " << i << " column " << j << " got " << got[i * H + j] << " want " << want;
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
