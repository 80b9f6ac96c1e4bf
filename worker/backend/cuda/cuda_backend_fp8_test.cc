// CudaBackend's ops on FP8 (e4m3, 128 x 128 block-scaled) matrices against host references on
// the dequantised weights: Gemm on each of its paths (W8A8 on cuBLASLt, the tensor-core and
// CUDA-core FP8 kernels: exact dequantised weights; the fallback: the weight dequantised and
// rounded to bf16 for cuBLAS), GroupedGemm, GateUpSiluMulBf16, and RoutedExperts with FP8
// experts eager and replayed from a CUDA graph; the batch-invariant mode's Gemm (the fused decode
// MoE block and dense MLP: cuda_backend_fp8_fused_test.cc). The W8A16
// paths read every activation rounded to bf16, the W8A8 path quantised to e4m3 per 128-wide
// block (computed here on the host with the loader's e4m3 encoder); products are exact and sums
// in double; tolerances are stated per test.
// Skips without a GPU.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
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
#include "worker/backend/cuda/cublaslt_fp8_gemm.h"
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

// How a path reads its operands: activations rounded to bf16 against the exact dequantised
// weight (W8A16: the FP8 kernels), the same against the weight rounded to bf16 (the dequantised
// fallback on cuBLAS), or activations quantised to e4m3 per 128-wide block (W8A8).
enum class Numerics { kW8A16, kBf16Weight, kW8A8 };

class CudaFp8Test : public CudaBackendTest {
 protected:
  Fp8Matrix RandomFp8(int64_t n, int64_t k, int64_t split, std::mt19937* gen) {
    return RandomFp8Matrix(gpu_.get(), n, k, split, gen);
  }
  // Whether this device runs Gemm's W8A8 path (cuBLASLt's block-scaled FP8: compute capability
  // 9.0).
  static bool W8A8Device() { return CublasLtFp8Gemm::DeviceSupports(0); }
};

// y[i, j] = sum_p x(a[i, p]) * w[j, p] in double, x the activation as `numerics` reads it and w
// the dequantised weight (rounded to bf16 for kBf16Weight), and sum_p |.| for the bound.
void HostGemm(const std::vector<float>& a, int64_t m, const Fp8Matrix& w, Numerics numerics,
              std::vector<double>* y, std::vector<double>* mag) {
  std::vector<double> x(m * w.k);
  if (numerics == Numerics::kW8A8) {
    x = QuantisedActivations(a, m, w.k);
  } else {
    for (int64_t e = 0; e < m * w.k; ++e) x[e] = RoundToBf16(a[e]);
  }
  y->assign(m * w.n, 0.0);
  mag->assign(m * w.n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n; ++j) {
      double s = 0, g = 0;
      for (int64_t p = 0; p < w.k; ++p) {
        double wv = w.dequant[j * w.k + p];
        if (numerics == Numerics::kBf16Weight) wv = RoundToBf16(static_cast<float>(wv));
        const double prod = x[i * w.k + p] * wv;
        s += prod;
        g += std::abs(prod);
      }
      (*y)[i * w.n + j] = s;
      (*mag)[i * w.n + j] = g;
    }
  }
}

// The bound per path: the W8A16 paths and cuBLAS sum exact products in fp32 (the tensor cores
// may truncate: up to k / 8 + 26 roundings of 2^-23 along any path, fp8_mma_gemm_test), so
// (k + 64) * 2^-24 * (sum |.| + |result|); W8A8 on FP8 tensor cores accumulates with fewer bits
// between the per-128 promotions (cublaslt_fp8_gemm_test): 2^-8 * sum |.| on top.
double Bound(Numerics numerics, int64_t k, double mag, double want) {
  const double fp32 = (k + 64) * std::ldexp(mag + std::abs(want), -24) + 1e-30;
  return numerics == Numerics::kW8A8 ? fp32 + std::ldexp(mag, -8) : fp32;
}

TEST_F(CudaFp8Test, GemmMatchesDequantisedWeightsOnEveryPath) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const bool w8a8 = W8A8Device();
  const bool mma = kernels::Fp8MmaGemmAvailable();
  struct Case {
    int64_t m, n, k, split;
    bool a_bf16, accumulate;
  };
  const int64_t w8a8_rows = CudaTuningDefaults::kFp8W8A8MinRows;
  for (const Case& c : {
           Case{1, 192, 128, 0, false, false},    // one row: CUDA cores
           Case{3, 80, 200, 0, true, false},      // k % 16 != 0: CUDA cores
           Case{16, 256, 320, 128, false, true},  // tensor cores
           Case{32, 256, 320, 128, false, true},  // tiled tensor cores, fp32 rows rounded
           Case{33, 96, 128, 0, false, false},    // tiled, one k block
           Case{64, 576, 1024, 200, true, true},  // tiled, k split, bf16 rows, stacked
           Case{40, 64, 200, 0, false, false},    // k % 16 != 0 above 32 rows: dequantised
           Case{w8a8_rows + 2, 200, 384, 100, true, true},  // W8A8, rows through scratch, split
           Case{w8a8_rows, 256, 256, 0, false, false},      // W8A8 straight into c
       }) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k);
    const Fp8Matrix w = RandomFp8(c.n, c.k, c.split, &gen);
    std::vector<float> a = testing::RandomFloats(c.m * c.k, seed + c.m);
    std::vector<float> c0 = testing::RandomFloats(c.m * c.n, seed + 1 + c.m);
    if (c.a_bf16) {
      for (float& v : a) v = RoundToBf16(v);  // what the bf16 operand holds
    }
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
    const bool k16 = c.k % 16 == 0;
    std::string phase;
    Numerics numerics = Numerics::kW8A16;
    if (w8a8 && k16 && c.m >= w8a8_rows) {
      phase = "Gemm/fp8-w8a8";
      numerics = Numerics::kW8A8;
    } else if (mma && k16 && c.m >= CudaTuningDefaults::kFp8TiledMinRows && c.m < w8a8_rows) {
      phase = "Gemm/fp8-tiled";
    } else if (mma && k16 && c.m > CudaBackend::kFp8CudaCoreMaxRows) {
      phase = "Gemm/fp8-mma";
    } else if (c.m <= CudaBackend::kFp8SmallMGemmMaxRows) {
      phase = "Gemm/fp8-small-m";
    } else {
      phase = "Gemm/fp8-dequant-bf16";
      numerics = Numerics::kBf16Weight;
    }
    EXPECT_EQ(CallsOf(report, phase), 1) << report;
    const std::vector<float> got = Download(*dc);
    std::vector<double> y, mag;
    HostGemm(a, c.m, w, numerics, &y, &mag);
    for (int64_t e = 0; e < c.m * c.n; ++e) {
      const double want = (c.accumulate ? c0[e] : 0.0) + y[e];
      ASSERT_LE(std::abs(got[e] - want), Bound(numerics, c.k, mag[e], want))
          << phase << " element " << e << " got " << got[e];
    }
  }
}

// The batch-invariant mode (CudaTuning::batch_invariant): Gemm on FP8 weights takes the
// tensor-core kernel with a fixed k split at every row count (W8A16, the bound above; W8A8 never),
// or with k not a multiple of 16 the weight dequantised to bf16 for the batch-invariant bf16
// GEMM; each row comes out bit for bit the same in calls of 1 to 130 rows.
class CudaFp8BatchInvariantTest : public CudaFp8Test {
 protected:
  void SetUp() override {
    CudaFp8Test::SetUp();
    if (IsSkipped()) return;
    CudaTuning tuning;
    tuning.batch_invariant = true;
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }
};

TEST_F(CudaFp8BatchInvariantTest, GemmRowsAreTheSameAtEveryBatchSize) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t m = 130;
  struct Case {
    int64_t n, k, split;
  };
  for (const Case& c : {Case{256, 2048, 0}, Case{200, 384, 100}, Case{64, 200, 0}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " k " << c.k);
    const Fp8Matrix w = RandomFp8(c.n, c.k, c.split, &gen);
    const std::vector<float> a = testing::RandomFloats(m * c.k, seed + c.k);
    auto da = Upload(a);
    auto full = Poisoned(m * c.n);
    gpu_->SetOpTiming(true);
    gpu_->Gemm(m, c.n, c.k, da->as<float>(), c.k, w.view(), c.k, full->as<float>(), c.n, false);
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const bool mma = kernels::Fp8MmaGemmAvailable() && c.k % 16 == 0;
    EXPECT_EQ(CallsOf(report, mma ? "Gemm/fp8-mma" : "Gemm/fp8-dequant-bf16"), 1) << report;
    const Numerics numerics = mma ? Numerics::kW8A16 : Numerics::kBf16Weight;
    const std::vector<float> got = Download(*full);
    std::vector<double> y, mag;
    HostGemm(a, m, w, numerics, &y, &mag);
    for (int64_t e = 0; e < m * c.n; ++e) {
      ASSERT_LE(std::abs(got[e] - y[e]), Bound(numerics, c.k, mag[e], y[e]))
          << "element " << e << " got " << got[e];
    }
    for (const auto& [first, rows] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {129, 1}, {5, 2}, {40, 33}}) {
      auto part = Poisoned(rows * c.n);
      gpu_->Gemm(rows, c.n, c.k, da->as<float>() + first * c.k, c.k, w.view(), c.k,
                 part->as<float>(), c.n, false);
      const std::vector<float> p = Download(*part);
      EXPECT_EQ(std::memcmp(p.data(), got.data() + first * c.n, p.size() * sizeof(float)), 0)
          << rows << " rows from row " << first << " differ from the same rows among " << m;
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// GroupedGemm with host offsets: each group on Gemm's FP8 paths, the same bound per row.
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
    HostGemm(ga, m, w[g], Numerics::kW8A16, &y, &mag);
    for (int64_t e = 0; e < m * n; ++e) {
      ASSERT_LE(std::abs(got[r0 * n + e] - y[e]), Bound(Numerics::kW8A16, k, mag[e], y[e]))
          << "group " << g << " element " << e;
    }
  }
}

// GateUpSiluMulBf16 with an FP8 [gate; up] at a prefill size: the W8A8 GEMM with a bf16 output
// on compute capability 9.0 (else the weight dequantised to bf16), then SiLU-mul rounded to bf16.
// A gate or up value off by its bound can move the bf16 rounding of the output by one step
// (2^-8 relative) for an element near a rounding boundary; allowed: that step plus the bound
// carried through silu(g) * u.
TEST_F(CudaFp8Test, GateUpSiluMulOnFp8Weights) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t rows = CudaBackend::kBf16GateUpMinRows + 2, inter = 96, k = 256;
  const Fp8Matrix w = RandomFp8(2 * inter, k, inter, &gen);
  std::vector<float> a = testing::RandomFloats(rows * k, seed);
  auto da = Upload(a);
  auto out = gpu_->Allocate(rows * inter * sizeof(uint16_t));
  ASSERT_TRUE(gpu_->GateUpSiluMulBf16(rows, inter, k, ActivationView(da->as<float>()), k, w.view(),
                                      k, /*swiglu_limit=*/0.0f, out->as<uint16_t>()));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  std::vector<uint16_t> bits(rows * inter);
  gpu_->CopyToHost(out->data(), bits.size() * 2, bits.data());
  const bool w8a8 = W8A8Device() && rows >= CudaTuningDefaults::kFp8W8A8MinRows;
  const Numerics numerics = w8a8 ? Numerics::kW8A8 : Numerics::kBf16Weight;
  std::vector<double> y, mag;
  HostGemm(a, rows, w, numerics, &y, &mag);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const double g = y[r * 2 * inter + i], u = y[r * 2 * inter + inter + i];
      const double dg = Bound(numerics, k, mag[r * 2 * inter + i], g) + std::ldexp(std::abs(g), -8);
      const double du = Bound(numerics, k, mag[r * 2 * inter + inter + i], u) +
                        std::ldexp(std::abs(u), -8);  // gate_up rounded to bf16
      const double sg = 1.0 / (1.0 + std::exp(-g));
      const double want = g * sg * u;
      // |d(silu(g))/dg| <= 1.1 for every g.
      const double tol =
          1.1 * dg * (std::abs(u) + du) + std::abs(g * sg) * du + std::ldexp(std::abs(want), -8);
      ASSERT_LE(std::abs(Bf16BitsToFloat(bits[r * inter + i]) - want), tol + 1e-30)
          << "row " << r << " column " << i;
    }
  }
}

// RoutedExperts with FP8 experts: out[t] = sum_k w[t, k] down_e(act(silu(g) * u)), gate_up from
// x(x), with x / act each path's reading of its activations (bf16; e4m3 blocks on the W8A8
// path). The SiLU-mul output is computed in fp32 on the device and read as bf16 (or quantised);
// an fp32-level difference in g or u can move that rounding by one step for an element near a
// rounding boundary: 2^-8 of its product on the bf16 paths, 2^-3 on the W8A8 path (e4m3, and the
// block's scale can follow its largest element), so each choice is allowed two such steps of its
// largest product plus its GEMMs' bounds. Where gate_up is written in bf16 (the per-expert W8A8
// path; the swap path with CudaTuning::fp8_swap_gate_up_bf16) g and u are each rounded to bf16
// before the SiLU-mul, a relative error of at most 2^-9 (half a bf16 ulp; 2^-8 allowed) of g
// plus its bound and u plus its bound, carried through silu(g) * u as gate_up's own bound is
// (|silu'| <= 1.1) and into the down GEMM through `carried` and the block scales' `rescaled`.
class CudaFp8RoutedExpertsTest : public CudaFp8Test {
 protected:
  static constexpr int64_t E = 16, K = 4, H = 256;
  int64_t I = 96;
  // The device path on kernels::Fp8WgmmaSwapGroupedGemm (W8A8; CudaTuning::fp8_swap_min_tokens).
  bool swap = false;
  // The backend's CudaTuning::fp8_swap_gate_up_bf16 (the swap path's gate_up rows in bf16).
  bool swap_gate_up_bf16 = false;

  void Run(int64_t T, bool graph) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << " tokens " << T << (graph ? " replayed" : " eager"));
    std::mt19937 gen(seed);
    std::vector<int32_t> slots(E);
    for (int32_t e = 0; e < E; ++e) slots[e] = e;
    const Fp8Experts experts = RandomFp8Experts(gpu_.get(), I, H, slots, &gen);
    const std::vector<Fp8Matrix>& gu = experts.gate_up;
    const std::vector<Fp8Matrix>& dn = experts.down;
    auto t_gu = UploadPointers(experts.gate_up_ptr), t_dn = UploadPointers(experts.down_ptr),
         t_gus = UploadPointers(experts.gate_up_scales),
         t_dns = UploadPointers(experts.down_scales);
    std::vector<float> x = testing::RandomFloats(T * H, seed);
    std::vector<int32_t> ids(T * K);
    std::vector<float> wts(T * K);
    RandomTopK(T, K, E, &gen, &ids, &wts);
    auto dx = Upload(x), dw = Upload(wts);
    auto dids = UploadInts(ids), dslots = UploadInts(slots);
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
    a.gate_up_scale_ld = kernels::Fp8ScaleLd(H);
    a.down_scale_ld = kernels::Fp8ScaleLd(I);
    a.gate_up_host = experts.gate_up_ptr.data();
    a.down_host = experts.down_ptr.data();
    a.dtype = WeightDType::kFp8E4M3;
    a.out = out->as<float>();
    if (graph && swap) {
      // The eager call that builds the weight descriptors (the model's warm-up), checked to take
      // the swap kernel; then the output poisoned again for the replay.
      gpu_->SetOpTiming(true);
      ASSERT_TRUE(gpu_->RoutedExperts(a));
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      const std::string warm = gpu_->TakeOpTimingReport();
      gpu_->SetOpTiming(false);
      EXPECT_EQ(CallsOf(warm, "RoutedExpertsFp8Mma/wgmma-swap"), 1) << warm;
      ASSERT_EQ(cudaMemset(out->data(), 0xFF, T * H * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
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
    const bool per_expert = !graph && T > CudaBackend::kMaxFusedMoeTokens;
    if (!graph) {
      const char* op = per_expert                       ? "RoutedExpertsFp8PerExpert"
                       : kernels::Fp8MmaGemmAvailable() ? "RoutedExpertsFp8Mma"
                                                        : "RoutedExpertsFp8";
      EXPECT_EQ(CallsOf(report, op), 1) << report;
      if (swap) {
        EXPECT_EQ(CallsOf(report, "RoutedExpertsFp8Mma/wgmma-swap"), 1) << report;
      }
    }
    // The per-expert path is W8A8 for every expert on compute capability 9.0 (one cuBLASLt GEMM
    // per expert), else each expert's rows (padded to 4) on the tensor-core kernel.
    const bool w8a8 = per_expert && W8A8Device();
    if (w8a8) {
      for (const char* phase :
           {"RoutedExpertsFp8PerExpert/quantize_permute", "RoutedExpertsFp8PerExpert/w8a8-gate_up",
            "RoutedExpertsFp8PerExpert/silu_mul_quantize", "RoutedExpertsFp8PerExpert/w8a8-down",
            "RoutedExpertsFp8PerExpert/combine"}) {
        EXPECT_EQ(CallsOf(report, phase), 1) << phase << "\n" << report;
      }
    }
    const std::vector<float> got = Download(*out);
    auto numerics_of = [&](int32_t) { return w8a8 || swap ? Numerics::kW8A8 : Numerics::kW8A16; };
    // The W8A8 path keeps the bf16 experts' intermediate precision: gate_up, the SiLU-mul product
    // and down's output each rounded to bf16 (half an ulp: 2^-9 relative; 2^-8 allowed).
    const double bf16_step = w8a8 ? std::ldexp(1.0, -8) : 0.0;
    // gate_up rounded to bf16 (g and u): the per-expert W8A8 path and the swap path's bf16 rows.
    const double gate_up_step = w8a8 || (swap && swap_gate_up_bf16) ? std::ldexp(1.0, -8) : 0.0;

    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> want(H, 0.0), tol(H, 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[t * K + k];
        const Numerics numerics = numerics_of(e);
        const double step = numerics == Numerics::kW8A8 ? std::ldexp(1.0, -3) : std::ldexp(1.0, -8);
        std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
        // The swap path quantises the permuted rows, which are bf16.
        if (swap) {
          for (float& v : xt) v = RoundToBf16(v);
        }
        std::vector<double> g, gmag;
        HostGemm(xt, 1, gu[e], numerics, &g, &gmag);
        // act and how far the device's may be from it: gate_up's bound carried through
        // silu(g) * u (|silu'| <= 1.1).
        std::vector<float> act(I);
        std::vector<double> dact(I);
        double act_max = 0, dact_max = 0;
        for (int64_t i = 0; i < I; ++i) {
          const double gate = g[i], up = g[I + i];
          const double sg = gate / (1.0 + std::exp(-gate));
          const double bg = Bound(numerics, H, gmag[i], gate),
                       bu = Bound(numerics, H, gmag[I + i], up);
          const double dg = bg + gate_up_step * (std::abs(gate) + bg);
          const double du = bu + gate_up_step * (std::abs(up) + bu);
          act[i] = static_cast<float>(sg * up);
          const double dact_product = 1.1 * dg * (std::abs(up) + du) + std::abs(sg) * du;
          dact[i] = dact_product + bf16_step * (std::abs(sg * up) + dact_product);
          act_max = std::max(act_max, std::abs(static_cast<double>(act[i])));
          dact_max = std::max(dact_max, dact[i]);
        }
        std::vector<double> y, ymag;
        HostGemm(act, 1, dn[e], numerics, &y, &ymag);
        for (int64_t h = 0; h < H; ++h) {
          double largest = 0, carried = 0;
          for (int64_t i = 0; i < I; ++i) {
            const double wv = std::abs(dn[e].dequant[h * I + i]);
            largest = std::max(largest, std::abs(static_cast<double>(act[i])) * wv);
            carried += wv * dact[i];
          }
          // On the W8A8 path a block's scale follows its largest act: a relative change of up to
          // dact_max / act_max in every quantised value.
          const double rescaled =
              numerics == Numerics::kW8A8 && act_max > 0 ? dact_max / act_max * ymag[h] : 0.0;
          want[h] += wts[t * K + k] * y[h];
          tol[h] += wts[t * K + k] *
                    (2 * step * largest + carried + rescaled + Bound(numerics, I, ymag[h], y[h]) +
                     bf16_step * (std::abs(y[h]) + 2 * step * largest + carried + rescaled +
                                  Bound(numerics, I, ymag[h], y[h])));
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

// More rows than experts: one block row per expert, several passes of rows each.
TEST_F(CudaFp8RoutedExpertsTest, LargerBatchOnTheDevicePath) { Run(70, false); }

// Above kMaxFusedMoeTokens: per-expert GEMMs (W8A8 on compute capability 9.0, else the
// tensor-core kernel), each expert's rows padded to 4.
TEST_F(CudaFp8RoutedExpertsTest, PrefillPerExpert) {
  Run(CudaBackend::kMaxFusedMoeTokens + 30, false);
}

// CudaTuning::fp8_swap_min_tokens 1: the device path's expert GEMMs on
// kernels::Fp8WgmmaSwapGroupedGemm (inter 128: its k a multiple of 128), W8A8 numerics, eager and
// replayed from a CUDA graph (its weight descriptors built by an eager call first); gate_up in
// bf16 (the default) and in fp32 (CudaTuning::fp8_swap_gate_up_bf16 false), each against the
// host reference with its own bound.
class CudaFp8SwapRoutedExpertsTest : public CudaFp8RoutedExpertsTest {
 protected:
  void SetUp() override {
    CudaFp8RoutedExpertsTest::SetUp();
    if (IsSkipped()) return;
    if (!kernels::Fp8WgmmaSwapDeviceSupports()) GTEST_SKIP() << "no FP8 wgmma on this device";
    ASSERT_TRUE(CudaTuning().fp8_swap_gate_up_bf16);  // the default
    UseSwapBackend(/*gate_up_bf16=*/true);
    I = 128;
    swap = true;
  }

  void UseSwapBackend(bool gate_up_bf16) {
    CudaTuning tuning;
    tuning.fp8_swap_min_tokens = 1;
    tuning.fp8_swap_gate_up_bf16 = gate_up_bf16;
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
    swap_gate_up_bf16 = gate_up_bf16;
  }
};

TEST_F(CudaFp8SwapRoutedExpertsTest, DecodeSizes) {
  Run(1, false);
  Run(9, false);
  Run(70, false);
}

TEST_F(CudaFp8SwapRoutedExpertsTest, ReplayedFromACudaGraph) {
  Run(3, true);
  Run(70, true);
}

TEST_F(CudaFp8SwapRoutedExpertsTest, DecodeSizesWithFp32GateUp) {
  UseSwapBackend(/*gate_up_bf16=*/false);
  Run(1, false);
  Run(9, false);
  Run(70, false);
}

TEST_F(CudaFp8SwapRoutedExpertsTest, ReplayedFromACudaGraphWithFp32GateUp) {
  UseSwapBackend(/*gate_up_bf16=*/false);
  Run(3, true);
  Run(70, true);
}

// No host synchronisation: the op records into a CUDA graph and replays.
TEST_F(CudaFp8RoutedExpertsTest, ReplayedFromACudaGraph) {
  Run(1, true);
  Run(9, true);
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

// The clamped SwiGLU is taken with bf16 weights only: FP8 weights with a limit are refused
// (InvalidArgument in status()).
TEST_F(CudaFp8Test, GateUpSiluMulRefusesFp8WithASwiGluLimit) {
  std::mt19937 gen(1);
  const int64_t rows = CudaBackend::kBf16GateUpMinRows, inter = 64, k = 128;
  const Fp8Matrix w = RandomFp8(2 * inter, k, inter, &gen);
  auto a = Upload(std::vector<float>(rows * k, 1.0f));
  auto out = gpu_->Allocate(rows * inter * sizeof(uint16_t));
  EXPECT_FALSE(gpu_->GateUpSiluMulBf16(rows, inter, k, ActivationView(a->as<float>()), k, w.view(),
                                       k, /*swiglu_limit=*/10.0f, out->as<uint16_t>()));
  EXPECT_EQ(gpu_->status().code(), absl::StatusCode::kInvalidArgument);
}

// The op timing report lists phases inside ops on "(phase)" lines; CallsOf reads both kinds
// (GemmMatchesDequantisedWeightsOnEveryPath counts the FP8 GEMM's phases). No GPU needed.
TEST(CallsOfTest, ReadsOpAndPhaseLines) {
  const std::string report =
      "  Gemm                      1 calls      0.050 ms 100.0%\n"
      "    (phase) Gemm/fp8-small-m                    3 calls      0.040 ms\n"
      "  total                                  0.050 ms\n";
  EXPECT_EQ(CallsOf(report, "Gemm"), 1);
  EXPECT_EQ(CallsOf(report, "Gemm/fp8-small-m"), 3);
  EXPECT_EQ(CallsOf(report, "Gemm/fp8-dequant-bf16"), -1);
}

TEST(CudaTuningTest, RefusesAW8A8ThresholdBelowOneRow) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CudaTuning t;
  t.fp8_w8a8_min_rows = 0;
  EXPECT_EQ(CudaBackend::Create(0, WeightDType::kBFloat16, t).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
