// CudaBackend::RoutedAndSharedExperts with FP8 routed and shared experts at the swap kernel's
// token counts (kernels::Fp8WgmmaSwapGroupedGemm, W8A8): the shared MLP run as S = shared_inter /
// inter more groups of the routed experts' GEMMs. Against a host reference in double on the
// dequantised weights: out[t] = sum_k w[t, k] MLP_e(x_t) + the shared MLP of x_t, each GEMM's
// activations quantised to e4m3 per 128-wide block as the W8A8 path reads them (on the host,
// with the loader's e4m3 encoder), the token rows rounded to bf16 first. The tolerance is the
// routed swap path's (CudaFp8SwapRoutedExpertsTest in cuda_backend_fp8_test.cc), the shared
// MLP's S parts each counted as a choice of weight 1. S = 1 (DeepSeek-V3's layout: the shared
// matrices are the part) and S = 2 (Moonlight's: parts copied out of the shared matrices), the
// shared scales with a wider row stride than the routed experts'. gate_up in bf16 (the default
// CudaTuning::fp8_swap_gate_up_bf16: g and u rounded to bf16 before the SiLU-mul, 2^-8 of each
// plus its bound added to gate_up's bound, as in the routed test) and in fp32. The op timing
// report shows the path taken. Skips without compute capability 9.0.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_mma_gemm.h"
#include "kernels/gemm/fp8_wgmma_decode.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"
#include "worker/backend/cuda/cuda_fp8_test_matrix.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

using testing::CallsOf;
using testing::CudaBackendTest;
using testing::Fp8Experts;
using testing::Fp8Matrix;
using testing::QuantisedActivations;
using testing::RandomFp8Experts;
using testing::RandomFp8Matrix;
using testing::RandomTopK;

// An MLP of intermediate size inter on the host: gate_up [2 inter, H] (gate rows, then up rows),
// down [H, inter], row-major dequantised values.
struct HostMlp {
  int64_t inter = 0;
  std::vector<double> gate_up, down;
};

// The W8A8 bound of a k-long sum (cuda_backend_fp8_test's Bound for kW8A8): fp32 sums with
// (k + 64) roundings, FP8 tensor-core accumulation 2^-8 of sum |.|.
double Bound(int64_t k, double mag, double want) {
  return (k + 64) * std::ldexp(mag + std::abs(want), -24) + 1e-30 + std::ldexp(mag, -8);
}

// y = W x for one quantised row x, with sum |.| per output.
void HostGemv(const std::vector<double>& x, const double* w, int64_t n, int64_t k,
              std::vector<double>* y, std::vector<double>* mag) {
  y->assign(n, 0.0);
  mag->assign(n, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double s = 0, g = 0;
    for (int64_t p = 0; p < k; ++p) {
      const double prod = x[p] * w[j * k + p];
      s += prod;
      g += std::abs(prod);
    }
    (*y)[j] = s;
    (*mag)[j] = g;
  }
}

class CudaFp8SharedSwapTest : public CudaBackendTest {
 protected:
  static constexpr int64_t E = 16, K = 4, H = 256, I = 128;

  void SetUp() override {
    CudaBackendTest::SetUp();
    if (IsSkipped()) return;
    if (!kernels::Fp8WgmmaSwapDeviceSupports() || !kernels::Fp8MmaGemmAvailable()) {
      GTEST_SKIP() << "no FP8 wgmma on this device";
    }
  }

  Fp8Matrix RandomFp8(int64_t n, int64_t k, int64_t split, int64_t scale_ld, std::mt19937* gen) {
    return RandomFp8Matrix(gpu_.get(), n, k, split, gen, scale_ld);
  }

  // Adds weight * MLP(x) of one choice to want and its bound to tol (the routed swap test's
  // terms: gate_up's bound carried through silu(g) * u, one e4m3 step (2^-3) twice of the
  // largest down product for the quantised act, a block scale following its largest act, and
  // down's own bound). gate_up_bf16: g and u each rounded to bf16 before the SiLU-mul (at most
  // 2^-9 relative, 2^-8 allowed, of the value plus its bound).
  static void AddChoice(const std::vector<float>& x_bf16, const HostMlp& m, double weight,
                        bool gate_up_bf16, std::vector<double>* want, std::vector<double>* tol) {
    const int64_t inter = m.inter;
    const double step = std::ldexp(1.0, -3);
    const double gate_up_step = gate_up_bf16 ? std::ldexp(1.0, -8) : 0.0;
    std::vector<double> g, gmag;
    HostGemv(QuantisedActivations(x_bf16, 1, H), m.gate_up.data(), 2 * inter, H, &g, &gmag);
    std::vector<float> act(inter);
    std::vector<double> dact(inter);
    double act_max = 0, dact_max = 0;
    for (int64_t i = 0; i < inter; ++i) {
      const double gate = g[i], up = g[inter + i];
      const double sg = gate / (1.0 + std::exp(-gate));
      const double bg = Bound(H, gmag[i], gate), bu = Bound(H, gmag[inter + i], up);
      const double dg = bg + gate_up_step * (std::abs(gate) + bg);
      const double du = bu + gate_up_step * (std::abs(up) + bu);
      act[i] = static_cast<float>(sg * up);
      dact[i] = 1.1 * dg * (std::abs(up) + du) + std::abs(sg) * du;
      act_max = std::max(act_max, std::abs(static_cast<double>(act[i])));
      dact_max = std::max(dact_max, dact[i]);
    }
    std::vector<double> y, ymag;
    HostGemv(QuantisedActivations(act, 1, inter), m.down.data(), H, inter, &y, &ymag);
    for (int64_t h = 0; h < H; ++h) {
      double largest = 0, carried = 0;
      for (int64_t i = 0; i < inter; ++i) {
        const double wv = std::abs(m.down[h * inter + i]);
        largest = std::max(largest, std::abs(static_cast<double>(act[i])) * wv);
        carried += wv * dact[i];
      }
      const double rescaled = act_max > 0 ? dact_max / act_max * ymag[h] : 0.0;
      (*want)[h] += weight * y[h];
      (*tol)[h] += weight * (2 * step * largest + carried + rescaled + Bound(inter, ymag[h], y[h]));
    }
  }

  // RoutedAndSharedExperts at T tokens with a shared MLP of S * inter; replayed from a CUDA graph
  // after an eager call (the model's warm-up, which builds the shared groups) with `graph`;
  // gate_up in bf16 or fp32 (CudaTuning::fp8_swap_gate_up_bf16).
  void Run(int32_t T, int64_t S, bool graph, bool gate_up_bf16 = true) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << " tokens " << T << " shared parts " << S
                 << (graph ? " replayed" : " eager") << (gate_up_bf16 ? "" : " fp32 gate_up"));
    std::mt19937 gen(seed);
    // A backend per case: it keeps a layer's shared groups by the weights' addresses, which a
    // later case's fresh weights may take again.
    CudaTuning tuning;
    tuning.fp8_swap_gate_up_bf16 = gate_up_bf16;
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    const int64_t SI = S * I;
    // Expert e in slot E - 1 - e: the device and host tables are in slot order.
    std::vector<int32_t> slots(E);
    for (int32_t e = 0; e < E; ++e) slots[e] = static_cast<int32_t>(E - 1 - e);
    const Fp8Experts experts = RandomFp8Experts(gpu_.get(), I, H, slots, &gen);
    const std::vector<Fp8Matrix>& gu = experts.gate_up;
    const std::vector<Fp8Matrix>& dn = experts.down;
    // The shared scales' rows 4 wider than the loader's stride: the parts' scales are moved to
    // the routed experts' stride.
    const Fp8Matrix shared_gu = RandomFp8(2 * SI, H, SI, kernels::Fp8ScaleLd(H) + 4, &gen);
    const Fp8Matrix shared_dn = RandomFp8(H, SI, 0, kernels::Fp8ScaleLd(SI) + 4, &gen);
    auto t_gu = UploadPointers(experts.gate_up_ptr), t_dn = UploadPointers(experts.down_ptr),
         t_gus = UploadPointers(experts.gate_up_scales),
         t_dns = UploadPointers(experts.down_scales);
    const std::vector<float> x = testing::RandomFloats(T * H, seed);
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
    a.gate_up_host = experts.gate_up_ptr.data();
    a.down_host = experts.down_ptr.data();
    a.gate_up_scales = static_cast<const float* const*>(t_gus->data());
    a.down_scales = static_cast<const float* const*>(t_dns->data());
    a.gate_up_scale_ld = kernels::Fp8ScaleLd(H);
    a.down_scale_ld = kernels::Fp8ScaleLd(I);
    a.dtype = WeightDType::kFp8E4M3;
    a.shared_inter = SI;
    a.shared_gate_up = shared_gu.data->data();
    a.shared_down = shared_dn.data->data();
    a.shared_gate_up_fp8 = shared_gu.fp8();
    a.shared_down_fp8 = shared_dn.fp8();
    a.out = out->as<float>();

    // The eager call: the shared groups built, the fused path taken (one op, one swap pass, no
    // routed-only op).
    gpu_->SetOpTiming(true);
    ASSERT_TRUE(gpu_->RoutedAndSharedExperts(a));
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    EXPECT_EQ(CallsOf(report, "RoutedAndSharedExpertsFp8Swap"), 1) << report;
    EXPECT_EQ(CallsOf(report, "RoutedAndSharedExpertsFp8Swap/wgmma-swap"), 1) << report;
    EXPECT_EQ(CallsOf(report, "RoutedExpertsFp8Mma"), -1) << report;
    if (graph) {
      ASSERT_EQ(cudaMemset(out->data(), 0xFF, T * H * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::unique_ptr<CapturedOps> ops = Record([&] { return gpu_->RoutedAndSharedExperts(a); });
      ASSERT_NE(ops, nullptr);
      ASSERT_TRUE(ops->Replay().ok());
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    }
    const std::vector<float> got = Download(*out);

    std::vector<HostMlp> routed(E);
    for (int32_t e = 0; e < E; ++e) routed[e] = HostMlp{I, gu[e].dequant, dn[e].dequant};
    // The shared MLP's parts: gate rows p * I .., up rows SI + p * I .., down columns p * I ..
    // (their outputs sum to the shared MLP's).
    std::vector<HostMlp> parts(S);
    for (int64_t p = 0; p < S; ++p) {
      HostMlp& m = parts[p];
      m.inter = I;
      const auto& sg = shared_gu.dequant;
      m.gate_up.assign(sg.begin() + p * I * H, sg.begin() + (p + 1) * I * H);
      m.gate_up.insert(m.gate_up.end(), sg.begin() + (SI + p * I) * H,
                       sg.begin() + (SI + (p + 1) * I) * H);
      m.down.resize(H * I);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < I; ++i) m.down[h * I + i] = shared_dn.dequant[h * SI + p * I + i];
      }
    }
    for (int32_t t = 0; t < T; ++t) {
      std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
      for (float& v : xt) v = RoundToBf16(v);  // the swap path quantises the bf16 token rows
      std::vector<double> want(H, 0.0), tol(H, 0.0);
      for (int64_t k = 0; k < K; ++k) {
        AddChoice(xt, routed[ids[t * K + k]], wts[t * K + k], gate_up_bf16, &want, &tol);
      }
      for (const HostMlp& m : parts) AddChoice(xt, m, 1.0, gate_up_bf16, &want, &tol);
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_LE(std::abs(got[t * H + h] - want[h]), tol[h] + 1e-6)
            << "token " << t << " column " << h << " got " << got[t * H + h] << " want " << want[h];
      }
    }
  }
};

TEST_F(CudaFp8SharedSwapTest, OneSharedPart) {
  Run(8, 1, false);
  Run(128, 1, false);
}

TEST_F(CudaFp8SharedSwapTest, TwoSharedParts) {
  Run(8, 2, false);
  Run(128, 2, false);
}

TEST_F(CudaFp8SharedSwapTest, ReplayedFromACudaGraph) {
  Run(8, 2, true);
  Run(128, 1, true);
}

TEST_F(CudaFp8SharedSwapTest, Fp32GateUp) {
  ASSERT_TRUE(CudaTuning().fp8_swap_gate_up_bf16);  // the other cases run the default
  Run(8, 2, false, /*gate_up_bf16=*/false);
  Run(128, 1, false, /*gate_up_bf16=*/false);
  Run(128, 2, true, /*gate_up_bf16=*/false);
}

}  // namespace
}  // namespace deepinfer
