// CudaBackend's ops on FP8 (e4m3, 128 x 128 block-scaled) matrices against host references on
// the dequantised weights: Gemm on both paths (the small-m kernel up to kFp8SmallMGemmMaxRows
// rows: exact dequantised weights; above: the weight dequantised and rounded to bf16 for cuBLAS),
// GroupedGemm, and RoutedExperts with FP8 experts eager and replayed from a CUDA graph. Every
// GEMM input is rounded to bf16 (as the kernels read it), products are exact, sums in double;
// tolerances are stated per test. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

using testing::CallsOf;
using testing::CudaBackendTest;

// A random FP8 matrix [n, k] (stacked at split rows, 0: not) on the device and its dequantised
// values on the host.
struct Fp8Matrix {
  int64_t n = 0, k = 0, split = 0;
  std::vector<double> dequant;  // [n, k]
  std::unique_ptr<DeviceBuffer> data, scales;
  WeightView view() const {
    return WeightView(data->data(),
                      Fp8BlockScales{scales->as<float>(), kernels::Fp8ScaleCols(k), split});
  }
};

class CudaFp8Test : public CudaBackendTest {
 protected:
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
    const int64_t ld = kernels::Fp8ScaleCols(k);
    std::vector<float> scales(kernels::Fp8ScaleRows(n, split) * ld);
    for (float& s : scales) s = std::exp2(exponent(*gen));
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
};

// y[i, j] = sum_p bf16(a[i, p]) * w[j, p] in double, w the dequantised weight (rounded to bf16
// with round_weight), and sum_p |.| for the bound.
void HostGemm(const std::vector<float>& a, int64_t m, const Fp8Matrix& w, bool round_weight,
              std::vector<double>* y, std::vector<double>* mag) {
  y->assign(m * w.n, 0.0);
  mag->assign(m * w.n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n; ++j) {
      double s = 0, g = 0;
      for (int64_t p = 0; p < w.k; ++p) {
        double wv = w.dequant[j * w.k + p];
        if (round_weight) wv = RoundToBf16(static_cast<float>(wv));
        const double prod = RoundToBf16(a[i * w.k + p]) * wv;
        s += prod;
        g += std::abs(prod);
      }
      (*y)[i * w.n + j] = s;
      (*mag)[i * w.n + j] = g;
    }
  }
}

// Gemm: the products are exact in fp32 on both paths (bf16 x e4m3 in the kernel, bf16 x bf16 in
// cuBLAS); only fp32 summation differs from the double sum, bounded by k * 2^-24 * sum |a w|.
TEST_F(CudaFp8Test, GemmMatchesDequantisedWeightsOnBothPaths) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  struct Case {
    int64_t m, n, k, split;
    bool a_bf16, accumulate;
  };
  const int64_t small = CudaBackend::kFp8SmallMGemmMaxRows;
  for (const Case& c :
       {Case{1, 192, 128, 0, false, false}, Case{3, 80, 200, 0, true, false},
        Case{small, 256, 320, 128, false, true}, Case{small + 1, 96, 128, 0, false, false},
        Case{130, 200, 384, 100, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k);
    const Fp8Matrix w = RandomFp8(c.n, c.k, c.split, &gen);
    std::vector<float> a = testing::RandomFloats(c.m * c.k, seed + c.m);
    std::vector<float> c0 = testing::RandomFloats(c.m * c.n, seed + 1 + c.m);
    auto da = Upload(a);
    auto da16 = gpu_->Allocate(a.size() * 2);
    const std::vector<uint16_t> bits = FloatsToBf16Bits(a);
    gpu_->CopyToDevice(bits.data(), bits.size() * 2, da16->data());
    auto dc = Upload(c0);
    const ActivationView av =
        c.a_bf16 ? ActivationView::Bf16(da16->as<uint16_t>()) : ActivationView(da->as<float>());
    gpu_->SetOpTiming(true);
    gpu_->Gemm(c.m, c.n, c.k, av, c.k, w.view(), c.k, dc->as<float>(), c.n, c.accumulate);
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const bool small_m = c.m <= small;
    EXPECT_EQ(CallsOf(report, small_m ? "Gemm/fp8-small-m" : "Gemm/fp8-dequant-bf16"), 1) << report;
    const std::vector<float> got = Download(*dc);
    std::vector<double> y, mag;
    HostGemm(a, c.m, w, /*round_weight=*/!small_m, &y, &mag);
    for (int64_t e = 0; e < c.m * c.n; ++e) {
      const double want = (c.accumulate ? c0[e] : 0.0) + y[e];
      const double tol = (c.k + 2) * std::ldexp(mag[e] + std::abs(want), -24) + 1e-30;
      ASSERT_LE(std::abs(got[e] - want), tol) << "element " << e << " got " << got[e];
    }
  }
}

// GroupedGemm with host offsets: each group on Gemm's FP8 path, the same bound per row.
TEST_F(CudaFp8Test, GroupedGemmMultipliesEachGroupByItsWeight) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t n = 64, k = 144;
  const std::vector<int64_t> offsets = {0, 2, 2, 7, 8};
  std::vector<Fp8Matrix> w;
  std::vector<WeightView> views;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    w.push_back(RandomFp8(n, k, 0, &gen));
    views.push_back(w.back().view());
  }
  const int64_t rows = offsets.back();
  std::vector<float> a = testing::RandomFloats(rows * k, seed);
  auto da = Upload(a);
  auto dc = Poisoned(rows * n);
  gpu_->GroupedGemm(offsets, views, n, k, da->as<float>(), dc->as<float>());
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  const std::vector<float> got = Download(*dc);
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t r0 = offsets[g], m = offsets[g + 1] - offsets[g];
    std::vector<float> ga(a.begin() + r0 * k, a.begin() + (r0 + m) * k);
    std::vector<double> y, mag;
    HostGemm(ga, m, w[g], false, &y, &mag);
    for (int64_t e = 0; e < m * n; ++e) {
      ASSERT_LE(std::abs(got[r0 * n + e] - y[e]), (k + 2) * std::ldexp(mag[e], -24) + 1e-30)
          << "group " << g << " element " << e;
    }
  }
}

// RoutedExperts with FP8 experts: out[t] = sum_k w[t, k] down_e(bf16(silu(g) * u)), gate_up from
// bf16(x). The SiLU-mul output is fp32 on the device and rounded to bf16 as the down GEMM reads
// it; an fp32-level difference in g or u can move that rounding by one bf16 step (2^-8 relative)
// for an element near a rounding boundary, so each choice is allowed two such steps of its
// largest product plus k * 2^-24 of sum |.|.
class CudaFp8RoutedExpertsTest : public CudaFp8Test {
 protected:
  static constexpr int64_t E = 16, K = 4, H = 256, I = 96;

  void Run(int64_t T, bool graph) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << " tokens " << T << (graph ? " replayed" : " eager"));
    std::mt19937 gen(seed);
    std::vector<Fp8Matrix> gu, dn;
    std::vector<const void*> gu_ptr, dn_ptr, gu_scale, dn_scale;
    for (int64_t e = 0; e < E; ++e) {
      gu.push_back(RandomFp8(2 * I, H, I, &gen));
      dn.push_back(RandomFp8(H, I, 0, &gen));
      gu_ptr.push_back(gu.back().data->data());
      dn_ptr.push_back(dn.back().data->data());
      gu_scale.push_back(gu.back().scales->data());
      dn_scale.push_back(dn.back().scales->data());
    }
    auto table = [&](const std::vector<const void*>& v) {
      auto b = gpu_->Allocate(v.size() * sizeof(void*));
      gpu_->CopyToDevice(v.data(), v.size() * sizeof(void*), b->data());
      return b;
    };
    auto t_gu = table(gu_ptr), t_dn = table(dn_ptr), t_gus = table(gu_scale),
         t_dns = table(dn_scale);
    std::vector<float> x = testing::RandomFloats(T * H, seed);
    std::vector<int32_t> ids(T * K);
    std::vector<float> wts(T * K);
    std::uniform_real_distribution<float> uw(0.1f, 1.0f);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all(E);
      for (int32_t e = 0; e < E; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), gen);
      std::sort(all.begin(), all.begin() + K);
      for (int64_t k = 0; k < K; ++k) {
        ids[t * K + k] = all[k];
        wts[t * K + k] = uw(gen);
      }
    }
    std::vector<int32_t> slots(E);
    for (int32_t e = 0; e < E; ++e) slots[e] = e;
    auto dx = Upload(x), dw = Upload(wts);
    auto dids = gpu_->Allocate(ids.size() * 4), dslots = gpu_->Allocate(E * 4);
    gpu_->CopyToDevice(ids.data(), ids.size() * 4, dids->data());
    gpu_->CopyToDevice(slots.data(), E * 4, dslots->data());
    auto out = Poisoned(T * H);
    RoutedExpertsArgs a;
    a.num_tokens = static_cast<int32_t>(T);
    a.top_k = K;
    a.num_experts = E;
    a.hidden_size = H;
    a.inter = I;
    a.hidden = dx->as<float>();
    a.topk_ids = dids->as<int32_t>();
    a.topk_weights = dw->as<float>();
    a.slot_of_expert = dslots->as<int32_t>();
    a.gate_up = static_cast<const void* const*>(t_gu->data());
    a.down = static_cast<const void* const*>(t_dn->data());
    a.gate_up_scales = static_cast<const float* const*>(t_gus->data());
    a.down_scales = static_cast<const float* const*>(t_dns->data());
    a.gate_up_host = gu_ptr.data();
    a.down_host = dn_ptr.data();
    a.dtype = WeightDType::kFp8E4M3;
    a.out = out->as<float>();
    gpu_->SetOpTiming(!graph);
    if (graph) {
      auto rec = gpu_->Capture([&]() -> absl::Status {
        return gpu_->RoutedExperts(a) ? absl::OkStatus()
                                      : absl::InternalError("RoutedExperts not taken");
      });
      ASSERT_TRUE(rec.ok()) << rec.status();
      ASSERT_TRUE((*rec)->Replay().ok());
    } else {
      ASSERT_TRUE(gpu_->RoutedExperts(a));
    }
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    if (!graph) {
      const bool per_expert = T > CudaBackend::kMaxFusedMoeTokens;
      EXPECT_EQ(CallsOf(report, per_expert ? "RoutedExpertsFp8PerExpert" : "RoutedExpertsFp8"), 1)
          << report;
    }
    const std::vector<float> got = Download(*out);
    // The per-expert path rounds the dequantised weight to bf16 for experts above
    // kFp8SmallMGemmMaxRows rows (Gemm's tensor-core path); the reference does the same.
    std::vector<int64_t> rows_of(E, 0);
    for (int32_t e : ids) ++rows_of[e];
    auto bf16_weights = [&](int32_t e) {
      return !graph && T > CudaBackend::kMaxFusedMoeTokens &&
             rows_of[e] > CudaBackend::kFp8SmallMGemmMaxRows;
    };

    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> want(H, 0.0), tol(H, 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[t * K + k];
        std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
        std::vector<double> g, gmag;
        HostGemm(xt, 1, gu[e], bf16_weights(e), &g, &gmag);
        std::vector<float> act(I);
        for (int64_t i = 0; i < I; ++i) {
          const double gate = g[i], up = g[I + i];
          act[i] = static_cast<float>(gate / (1.0 + std::exp(-gate)) * up);
        }
        std::vector<double> y, ymag;
        HostGemm(act, 1, dn[e], bf16_weights(e), &y, &ymag);
        for (int64_t h = 0; h < H; ++h) {
          double largest = 0;
          for (int64_t i = 0; i < I; ++i) {
            const double wv = dn[e].dequant[h * I + i];
            largest = std::max(largest, std::abs(RoundToBf16(act[i]) * wv));
          }
          want[h] += wts[t * K + k] * y[h];
          tol[h] += wts[t * K + k] *
                    (2 * std::ldexp(largest, -8) + (I + H + 8) * std::ldexp(ymag[h], -24));
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_LE(std::abs(got[t * H + h] - want[h]), tol[h] + 1e-6)
            << "token " << t << " column " << h << " got " << got[t * H + h] << " want " << want[h];
      }
    }
  }
};

TEST_F(CudaFp8RoutedExpertsTest, DecodeSizes) {
  Run(1, false);
  Run(3, false);
}

// More rows than experts: one block row per expert, several chunks of 8 rows each.
TEST_F(CudaFp8RoutedExpertsTest, LargerBatchOnTheDevicePath) { Run(70, false); }

// Above kMaxFusedMoeTokens: per-expert GEMMs (the small-m kernel or the dequantised weight on
// cuBLAS, by each expert's rows).
TEST_F(CudaFp8RoutedExpertsTest, PrefillPerExpert) {
  Run(CudaBackend::kMaxFusedMoeTokens + 30, false);
}

// No host synchronisation: the op records into a CUDA graph and replays.
TEST_F(CudaFp8RoutedExpertsTest, ReplayedFromACudaGraph) {
  Run(1, true);
  Run(9, true);
}

// The op timing report lists phases inside ops on "(phase)" lines; CallsOf reads both kinds
// (GemmMatchesDequantisedWeightsOnBothPaths counts the FP8 GEMM's phases). No GPU needed.
TEST(CallsOfTest, ReadsOpAndPhaseLines) {
  const std::string report =
      "  Gemm                      1 calls      0.050 ms 100.0%\n"
      "    (phase) Gemm/fp8-small-m                    3 calls      0.040 ms\n"
      "  total                                  0.050 ms\n";
  EXPECT_EQ(CallsOf(report, "Gemm"), 1);
  EXPECT_EQ(CallsOf(report, "Gemm/fp8-small-m"), 3);
  EXPECT_EQ(CallsOf(report, "Gemm/fp8-dequant-bf16"), -1);
}

TEST_F(CudaFp8Test, BatchedGemmRefusesFp8) {
  std::mt19937 gen(1);
  const Fp8Matrix w = RandomFp8(128, 128, 0, &gen);
  auto a = Upload(std::vector<float>(128, 1.0f));
  auto c = gpu_->Allocate(128 * sizeof(float));
  gpu_->BatchedGemm(1, 1, 128, 128, a->as<float>(), 128, 0, w.view(), 128, 0, c->as<float>(), 128,
                    0);
  EXPECT_EQ(gpu_->status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
