// CudaBackend's fused decode ops on FP8 (e4m3, 128 x 128 block-scaled) matrices
// (kernels::MoeDecodeFusedFp8): RoutedAndSharedExperts at 1 and 2 tokens, eager and replayed from a
// CUDA graph, and NormedDenseMlp, against host references on the dequantised weights. Skips
// without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"
#include "worker/backend/cuda/cuda_fp8_test_matrix.h"

namespace deepinfer {
namespace {

using testing::CallsOf;
using testing::CudaBackendTest;
using testing::Fp8Experts;
using testing::Fp8Matrix;
using testing::RandomFp8Experts;
using testing::RandomFp8Matrix;
using testing::RandomTopK;

// The fused decode ops on FP8 matrices (kernels::MoeDecodeFusedFp8: the weights dequantised
// exactly, activations fp32): RoutedAndSharedExperts with FP8 routed and shared experts at 1 and
// 2 tokens, eager and replayed from a CUDA graph, and NormedDenseMlp, against the host in double
// on the dequantised weights. fp32 sums in another order: within 1e-4 of the largest output (a
// missing part, a wrong scale row or column, a wrong routing weight is of its order).
class CudaFp8FusedDecodeTest : public CudaBackendTest {
 protected:
  static constexpr int64_t E = 16, K = 4, H = 256, I = 96, S = 2;

  Fp8Matrix RandomFp8(int64_t n, int64_t k, int64_t split, std::mt19937* gen) {
    return RandomFp8Matrix(gpu_.get(), n, k, split, gen);
  }

  // down(silu(gate x) * up x), gate_up [2 inter, H] (gate rows then up rows), down [H, inter].
  static std::vector<double> HostMlp(const float* x, const Fp8Matrix& gu, const Fp8Matrix& dn,
                                     int64_t inter) {
    std::vector<double> act(inter), y(H, 0.0);
    for (int64_t j = 0; j < inter; ++j) {
      double g = 0, u = 0;
      for (int64_t p = 0; p < H; ++p) {
        g += x[p] * gu.dequant[j * H + p];
        u += x[p] * gu.dequant[(inter + j) * H + p];
      }
      act[j] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t f = 0; f < H; ++f) {
      for (int64_t j = 0; j < inter; ++j) y[f] += act[j] * dn.dequant[f * inter + j];
    }
    return y;
  }

  static void ExpectClose(const std::vector<float>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_LE(std::abs(got[i] - want[i]), 1e-4 * scale + 1e-30)
          << "element " << i << " got " << got[i] << " want " << want[i];
    }
  }

  void Run(int32_t T, bool graph) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << " tokens " << T << (graph ? " replayed" : " eager"));
    std::mt19937 gen(seed);
    // Expert e in slot E - 1 - e.
    std::vector<int32_t> slots(E);
    for (int32_t e = 0; e < E; ++e) slots[e] = static_cast<int32_t>(E - 1 - e);
    const Fp8Experts experts = RandomFp8Experts(gpu_.get(), I, H, slots, &gen);
    const std::vector<Fp8Matrix>& gu = experts.gate_up;
    const std::vector<Fp8Matrix>& dn = experts.down;
    const Fp8Matrix shared_gu = RandomFp8(2 * S * I, H, S * I, &gen);
    const Fp8Matrix shared_dn = RandomFp8(H, S * I, 0, &gen);
    auto t_gu = UploadPointers(experts.gate_up_ptr), t_dn = UploadPointers(experts.down_ptr),
         t_gus = UploadPointers(experts.gate_up_scales),
         t_dns = UploadPointers(experts.down_scales);
    const std::vector<float> x = testing::RandomFloats(T * H, seed);
    // Distinct ascending ids per token.
    std::vector<int32_t> ids(T * K);
    std::vector<float> wts(T * K);
    RandomTopK(T, K, E, &gen, &ids, &wts);
    auto dx = Upload(x), dw = Upload(wts);
    auto dids = UploadInts(ids), dslots = UploadInts(slots);
    auto out = Poisoned(T * H);
    RoutedExpertsArgs a;
    a.num_tokens = T;
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
    a.gate_up_scale_ld = kernels::Fp8ScaleLd(H);
    a.down_scale_ld = kernels::Fp8ScaleLd(I);
    a.dtype = WeightDType::kFp8E4M3;
    a.shared_inter = S * I;
    a.shared_gate_up = shared_gu.data->data();
    a.shared_down = shared_dn.data->data();
    a.shared_gate_up_fp8 = shared_gu.view().fp8;
    a.shared_down_fp8 = shared_dn.view().fp8;
    a.out = out->as<float>();
    gpu_->SetOpTiming(!graph);
    if (graph) {
      auto rec = gpu_->Capture([&]() -> absl::Status {
        return gpu_->RoutedAndSharedExperts(a)
                   ? absl::OkStatus()
                   : absl::InternalError("RoutedAndSharedExperts not taken");
      });
      ASSERT_TRUE(rec.ok()) << rec.status();
      ASSERT_TRUE((*rec)->Replay().ok());
    } else {
      ASSERT_TRUE(gpu_->RoutedAndSharedExperts(a));
    }
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    if (!graph) {
      EXPECT_EQ(CallsOf(report, "RoutedAndSharedExpertsFp8"), 1) << report;
    }
    std::vector<double> want(T * H, 0.0);
    for (int32_t t = 0; t < T; ++t) {
      const float* xt = x.data() + t * H;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[t * K + k];
        const std::vector<double> y = HostMlp(xt, gu[e], dn[e], I);
        for (int64_t h = 0; h < H; ++h) want[t * H + h] += wts[t * K + k] * y[h];
      }
      const std::vector<double> y = HostMlp(xt, shared_gu, shared_dn, S * I);
      for (int64_t h = 0; h < H; ++h) want[t * H + h] += y[h];
    }
    ExpectClose(Download(*out), want);
  }
};

TEST_F(CudaFp8FusedDecodeTest, RoutedAndSharedExpertsAtDecodeSizes) {
  Run(1, false);
  Run(2, false);
}

TEST_F(CudaFp8FusedDecodeTest, RoutedAndSharedExpertsReplayedFromACudaGraph) { Run(1, true); }

TEST_F(CudaFp8FusedDecodeTest, NormedDenseMlpOnFp8Matrices) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t inter = 3 * I;
  const Fp8Matrix gu = RandomFp8(2 * inter, H, inter, &gen);
  const Fp8Matrix dn = RandomFp8(H, inter, 0, &gen);
  const std::vector<float> x = testing::RandomFloats(H, seed),
                           y = testing::RandomFloats(H, seed + 1),
                           w = testing::RandomFloats(H, seed + 2);
  auto dx = Upload(x), dy = Upload(y), dnorm = Upload(w), normed = Poisoned(H), out = Poisoned(H);
  DenseMlpArgs d;
  d.rows = 1;
  d.hidden_size = H;
  d.inter = inter;
  d.x = dx->as<float>();
  d.y = dy->as<float>();
  d.norm_weight = dnorm->as<float>();
  d.eps = 1e-6f;
  d.normed = normed->as<float>();
  d.gate_up = gu.view();
  d.down = dn.view();
  d.out = out->as<float>();
  gpu_->SetOpTiming(true);
  ASSERT_TRUE(gpu_->NormedDenseMlp(d));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  const std::string report = gpu_->TakeOpTimingReport();
  gpu_->SetOpTiming(false);
  EXPECT_EQ(CallsOf(report, "NormedDenseMlpFp8"), 1) << report;
  // The norm on the host (x + y, RMS-normalised, times w), then the MLP of the device's normed
  // row (so the MLP is checked on exactly its input).
  std::vector<double> sum(H), want_normed(H);
  double ms = 0;
  for (int64_t i = 0; i < H; ++i) {
    sum[i] = static_cast<double>(x[i]) + y[i];
    ms += sum[i] * sum[i];
  }
  const double inv = 1.0 / std::sqrt(ms / H + 1e-6);
  for (int64_t i = 0; i < H; ++i) want_normed[i] = sum[i] * inv * w[i];
  const std::vector<float> got_normed = Download(*normed);
  ExpectClose(got_normed, want_normed);
  ExpectClose(Download(*out), HostMlp(got_normed.data(), gu, dn, inter));
}

}  // namespace
}  // namespace deepinfer
