// CudaBackend::RoutedExperts with MXFP4 experts against a host reference on the dequantised
// weights: each element decoded with the OCP Microscaling spec's E2M1 table (written out here)
// times 2^(scale - 127); out[t] = sum_k w[t, k] down_e(bf16(silu(g) * u)) with gate_up from the
// bf16-rounded rows, sums in double. The device's products are exact (e2m1 times a power of two
// is a bf16 value) and its sums fp32 (the tensor cores may truncate: (k + 64) * 2^-24 *
// (sum |.| + |result|), mxfp4_mma_gemm_test); the SiLU-mul output is rounded to bf16 on the
// device, so an fp32-level difference in g or u can move it by one bf16 step (2^-8 of the
// product) near a rounding boundary: each choice is allowed two such steps of its largest
// product plus its GEMMs' bounds carried through (with V4's clamp, g and u are rounded to bf16
// before it: one step more each). Eager at decode and prefill sizes, and replayed from a CUDA
// graph. Above CudaBackend::kMxfp4MaxDeviceTokens (eager) the experts are widened to bf16 for the
// cuBLAS path, whose bf16 weights are the same values (the widening is exact at these scales);
// there gate_up is written in bf16 (g and u rounded as with the clamp: one step more each), each
// choice's down output is rounded to bf16 before the combine (one step of |y|, twice the
// half-step bound), and cuBLAS may split k or accumulate with truncation (2^-23 per addition, not
// 2^-24): the summation bounds are doubled.
// W4A8 (CudaTuning::mxfp4_w4a8_min_tokens .. max_tokens; the other tests set min 0 to keep
// W4A16): the bf16 token rows quantised to e4m3 per 128-wide block on the device, here on the
// host by the same rule (testing::QuantisedActivations: the same values), and the SiLU-mul output
// quantised the same way, where an fp32-level difference in g or u can move a value by one e4m3
// step (2^-3 of it) and the block's scale follows its largest value (a relative change of up to
// the largest act's deviation, as the FP8 W8A8 test allows); each FP8 MMA's sum over a 32-value
// block is allowed 2^-13 of the block's sum of |products| (the tensor core's FP8 accumulation is
// not specified as fp32; mxfp4_w4a8_gemm_test). With CudaTuning::mxfp4_wgmma_swap the same e4m3
// rows go through kernels::Mxfp4WgmmaSwapGroupedGemm for each GEMM whose k is a multiple of 128
// (the others stay on W4A8): its tensor cores add a 128-wide block's products before the fp32
// promotion, allowed 2^-10 of the block's sum of |products|. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/mxfp4_mma_gemm.h"
#include "kernels/gemm/mxfp4_w4a8_gemm.h"
#include "kernels/gemm/mxfp4_wgmma_decode.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"
#include "worker/backend/cuda/cuda_fp8_test_matrix.h"

namespace deepinfer {
namespace {

using testing::CallsOf;
using testing::CudaBackendTest;
using testing::RandomTopK;

constexpr double kE2m1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

// A random MXFP4 matrix [n, k] on the device (packed bytes, scales [n, k / 32]) and its values.
struct MxMatrix {
  int64_t n = 0, k = 0;
  std::vector<double> dequant;  // [n, k]
  std::unique_ptr<DeviceBuffer> data, scales;
};

class CudaMxfp4RoutedExpertsTest : public CudaBackendTest {
 protected:
  int64_t E = 16, K = 4, H = 256, I = 96;
  // The device path's W4A8 kernel (kernels::Mxfp4W4a8GroupedGemm) at every token count it takes
  // (mxfp4_w4a8_min_tokens 1), else bf16 activations only (min 0).
  bool w4a8 = false;
  // With w4a8: CudaTuning::mxfp4_wgmma_swap (the swap-AB kernel where a GEMM's k allows it).
  bool wgmma_swap = false;

  void SetUp() override {
    CudaBackendTest::SetUp();
    if (IsSkipped()) return;
    CudaTuning tuning;
    tuning.mxfp4_w4a8_min_tokens = w4a8 ? 1 : 0;
    tuning.mxfp4_wgmma_swap = wgmma_swap;
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }

  MxMatrix RandomMx(int64_t n, int64_t k, std::mt19937* gen) {
    MxMatrix m;
    m.n = n, m.k = k;
    std::uniform_int_distribution<int> byte(0, 255), scale(118, 124);
    std::vector<uint8_t> bytes(n * k / 2), scales(n * k / 32);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(*gen));
    for (uint8_t& s : scales) s = static_cast<uint8_t>(scale(*gen));
    m.dequant.resize(n * k);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        const uint8_t b = bytes[j * (k / 2) + p / 2];
        m.dequant[j * k + p] = kE2m1[p % 2 == 0 ? b & 0xF : b >> 4] *
                               std::ldexp(1.0, scales[j * (k / 32) + p / 32] - 127);
      }
    }
    m.data = gpu_->Allocate(bytes.size());
    gpu_->CopyToDevice(bytes.data(), bytes.size(), m.data->data());
    m.scales = gpu_->Allocate(scales.size());
    gpu_->CopyToDevice(scales.data(), scales.size(), m.scales->data());
    return m;
  }

  // y = w x for one row x (each element as given), and sum |.|.
  static void HostGemv(const std::vector<double>& x, const MxMatrix& w, std::vector<double>* y,
                       std::vector<double>* mag) {
    y->assign(w.n, 0.0);
    mag->assign(w.n, 0.0);
    for (int64_t j = 0; j < w.n; ++j) {
      for (int64_t p = 0; p < w.k; ++p) {
        const double prod = x[p] * w.dequant[j * w.k + p];
        (*y)[j] += prod;
        (*mag)[j] += std::abs(prod);
      }
    }
  }
  // swap: the GEMM ran on the swap-AB kernel.
  double Bound(int64_t k, double mag, double want, bool swap) const {
    const double fp8_sums = swap ? std::ldexp(mag, -10) : w4a8 ? std::ldexp(mag, -13) : 0.0;
    return (k + 64) * std::ldexp(mag + std::abs(want), -24) + fp8_sums + 1e-30;
  }
  // The values the W4A8 path multiplies: bf16 rows quantised per 128-wide block.
  std::vector<double> Quantised(const std::vector<double>& row) const {
    if (!w4a8) return row;
    const std::vector<float> f(row.begin(), row.end());
    return testing::QuantisedActivations(f, 1, static_cast<int64_t>(f.size()));
  }

  // limit > 0: DeepSeek-V4's clamped SwiGLU, on gate_up rounded to bf16.
  // dequant_groups: the widening's calls expected on the cuBLAS path.
  void Run(int64_t T, bool graph, float limit = 0.0f, int64_t dequant_groups = 1) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << " tokens " << T << (graph ? " replayed" : " eager"));
    std::mt19937 gen(seed);
    const bool cublas = !graph && T > CudaBackend::kMxfp4MaxDeviceTokens;
    const bool w4a8_taken = w4a8 && !cublas && T <= CudaTuning().mxfp4_w4a8_max_tokens;
    // The swap kernel per GEMM: its k a multiple of 128 (the scale strides H / 32 and I / 32 are
    // multiples of 4 at such k).
    const bool swap = w4a8_taken && wgmma_swap && kernels::Mxfp4WgmmaSwapDeviceSupports();
    const bool gu_swap = swap && H % 128 == 0, dn_swap = swap && I % 128 == 0;
    // bf16's rounding step (g and u, down's output), and the down operand's: bf16's, or e4m3's on
    // the W4A8 path.
    const double step = std::ldexp(1.0, -8);
    const double act_step = w4a8_taken ? std::ldexp(1.0, -3) : step;
    const double sums = cublas ? 2.0 : 1.0;  // the summation bounds' factor (see the top)
    std::vector<MxMatrix> gu, dn;
    std::vector<const void*> gu_ptr, dn_ptr, gu_scale, dn_scale;
    for (int64_t e = 0; e < E; ++e) {
      gu.push_back(RandomMx(2 * I, H, &gen));
      dn.push_back(RandomMx(H, I, &gen));
      gu_ptr.push_back(gu.back().data->data());
      dn_ptr.push_back(dn.back().data->data());
      gu_scale.push_back(gu.back().scales->data());
      dn_scale.push_back(dn.back().scales->data());
    }
    auto t_gu = UploadPointers(gu_ptr), t_dn = UploadPointers(dn_ptr),
         t_gus = UploadPointers(gu_scale), t_dns = UploadPointers(dn_scale);
    std::vector<float> x = testing::RandomFloats(T * H, seed);
    std::vector<int32_t> ids(T * K);
    std::vector<float> wts(T * K);
    RandomTopK(T, K, E, &gen, &ids, &wts);
    std::vector<int32_t> slots(E);
    for (int32_t e = 0; e < E; ++e) slots[e] = e;
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
    a.gate_up_mx_scales = static_cast<const uint8_t* const*>(t_gus->data());
    a.down_mx_scales = static_cast<const uint8_t* const*>(t_dns->data());
    a.gate_up_scale_ld = H / 32;
    a.down_scale_ld = I / 32;
    a.gate_up_host = gu_ptr.data();
    a.down_host = dn_ptr.data();
    a.dtype = WeightDType::kMxfp4E2M1;
    a.swiglu_limit = limit;
    a.out = out->as<float>();
    gpu_->SetOpTiming(!graph);
    if (graph && swap) {
      // The swap kernel's descriptors and check are made outside a capture: one eager call first.
      ASSERT_TRUE(gpu_->RoutedExperts(a));
    }
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
    if (cublas) {
      EXPECT_EQ(CallsOf(report, "RoutedExpertsCublas"), 1) << report;
      EXPECT_EQ(CallsOf(report, "RoutedExpertsCublas/mxfp4_dequant"), dequant_groups) << report;
    } else if (!graph) {
      EXPECT_EQ(CallsOf(report, "RoutedExpertsMxfp4"), 1) << report;
      EXPECT_EQ(CallsOf(report, "RoutedExpertsMxfp4W4a8/gate_up"), w4a8_taken && !gu_swap ? 1 : -1)
          << report;
      EXPECT_EQ(CallsOf(report, "RoutedExpertsMxfp4W4a8/down"), w4a8_taken && !dn_swap ? 1 : -1)
          << report;
      const int swaps = int{gu_swap} + int{dn_swap};
      EXPECT_EQ(CallsOf(report, "RoutedExpertsMxfp4W4a8/wgmma-swap"), swaps > 0 ? swaps : -1)
          << report;
    }
    const std::vector<float> got = Download(*out);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> want(H, 0.0), tol(H, 0.0);
      std::vector<double> xt(H);
      for (int64_t h = 0; h < H; ++h) xt[h] = RoundToBf16(x[t * H + h]);
      if (w4a8_taken) xt = Quantised(xt);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[t * K + k];
        std::vector<double> g, gmag;
        HostGemv(xt, gu[e], &g, &gmag);
        std::vector<double> act(I), dact(I);
        double act_max = 0, dact_max = 0;
        for (int64_t i = 0; i < I; ++i) {
          double gate = g[i], up = g[I + i];
          double dg = sums * Bound(H, gmag[i], gate, gu_swap),
                 du = sums * Bound(H, gmag[I + i], up, gu_swap);
          if (limit > 0 || cublas) {
            // The device rounds g and u to bf16 (before clamping): each may land one bf16 ulp (at
            // most 2^-7 of it) from the host's rounding.
            dg += 2 * step * std::abs(gate);
            du += 2 * step * std::abs(up);
            gate = RoundToBf16(static_cast<float>(gate));
            up = RoundToBf16(static_cast<float>(up));
          }
          if (limit > 0) {
            gate = std::min<double>(gate, limit);
            up = std::clamp<double>(up, -limit, limit);
          }
          const double sg = gate / (1.0 + std::exp(-gate));
          act[i] = RoundToBf16(static_cast<float>(sg * up));
          dact[i] = 1.1 * dg * (std::abs(up) + du) + std::abs(sg) * du;
          act_max = std::max(act_max, std::abs(act[i]));
          dact_max = std::max(dact_max, dact[i]);
        }
        if (w4a8_taken) act = Quantised(act);
        std::vector<double> y, ymag;
        HostGemv(act, dn[e], &y, &ymag);
        // W4A8: a block's scale follows its largest act (one block: I <= 128).
        const double rescale = w4a8_taken && act_max > 0 ? dact_max / act_max : 0.0;
        for (int64_t h = 0; h < H; ++h) {
          double largest = 0, carried = 0;
          for (int64_t i = 0; i < I; ++i) {
            const double wv = std::abs(dn[e].dequant[h * I + i]);
            largest = std::max(largest, std::abs(act[i]) * wv);
            carried += wv * dact[i];
          }
          want[h] += wts[t * K + k] * y[h];
          tol[h] += wts[t * K + k] * (2 * act_step * largest + carried + rescale * ymag[h] +
                                      sums * Bound(I, ymag[h], y[h], dn_swap) +
                                      (cublas ? step * std::abs(y[h]) : 0.0));
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_LE(std::abs(got[t * H + h] - want[h]), tol[h] + 1e-6)
            << "token " << t << " column " << h << " got " << got[t * H + h] << " want " << want[h];
      }
    }
  }
};

TEST_F(CudaMxfp4RoutedExpertsTest, DecodeSizes) {
  if (!kernels::Mxfp4MmaGemmAvailable()) GTEST_SKIP() << "no sm_80+ kernel for this device";
  Run(1, false);
  Run(3, false);
}

// More rows than experts on the device path; just above it, the widened experts on cuBLAS.
TEST_F(CudaMxfp4RoutedExpertsTest, LargerBatches) {
  if (!kernels::Mxfp4MmaGemmAvailable()) GTEST_SKIP() << "no sm_80+ kernel for this device";
  Run(70, false);
  Run(CudaBackend::kMxfp4MaxDeviceTokens + 30, false);
}

// A prefill size (128 rows per expert on average) on the cuBLAS path, the widening bounded to 5
// experts at a time: groups of 5, 5, 5 and 1 experts, each group's rows a slice of the buffers;
// then with V4's clamp.
TEST_F(CudaMxfp4RoutedExpertsTest, PrefillWidenedInGroups) {
  CudaTuning tuning;
  tuning.mxfp4_dequant_scratch_bytes = 5 * Mxfp4DequantExpertBytes(H, I) + 4096;
  auto b = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
  ASSERT_TRUE(b.ok()) << b.status();
  gpu_ = std::move(*b);
  Run(2048, false, 0.0f, /*dequant_groups=*/4);
  Run(600, false, 0.7f, /*dequant_groups=*/4);
}

// No host synchronisation: the op records into a CUDA graph and replays.
TEST_F(CudaMxfp4RoutedExpertsTest, ReplayedFromACudaGraph) {
  if (!kernels::Mxfp4MmaGemmAvailable()) GTEST_SKIP() << "no sm_80+ kernel for this device";
  Run(1, true);
  Run(9, true);
}

// DeepSeek-V4's clamped SwiGLU (a limit that clamps a good share of these g and u).
TEST_F(CudaMxfp4RoutedExpertsTest, ClampedSwiGlu) {
  if (!kernels::Mxfp4MmaGemmAvailable()) GTEST_SKIP() << "no sm_80+ kernel for this device";
  Run(3, false, 0.7f);
  Run(9, true, 0.7f);
}

// W4A8 (kernels::Mxfp4W4a8GroupedGemm on e4m3 rows) at every device-path size: decode, more rows
// than experts, the largest size it takes by default, replayed from a CUDA graph, V4's clamp.
class CudaMxfp4W4a8RoutedExpertsTest : public CudaMxfp4RoutedExpertsTest {
 protected:
  void SetUp() override {
    w4a8 = true;
    CudaMxfp4RoutedExpertsTest::SetUp();
    if (IsSkipped()) return;
    if (!kernels::Mxfp4W4a8GemmAvailable()) GTEST_SKIP() << "no sm_89+ kernel for this device";
  }
};

TEST_F(CudaMxfp4W4a8RoutedExpertsTest, DecodeSizes) {
  Run(1, false);
  Run(3, false);
  Run(70, false);
  Run(CudaTuning().mxfp4_w4a8_max_tokens, false);
}

TEST_F(CudaMxfp4W4a8RoutedExpertsTest, ReplayedFromACudaGraph) {
  Run(1, true);
  Run(9, true);
}

TEST_F(CudaMxfp4W4a8RoutedExpertsTest, ClampedSwiGlu) {
  Run(3, false, 0.7f);
  Run(9, true, 0.7f);
}

// The W4A8 path with CudaTuning::mxfp4_wgmma_swap (I 128: both GEMMs on the swap-AB kernel) at
// decode sizes up to the largest the W4A8 path takes, replayed from a CUDA graph, V4's clamp; I 96
// (down's k not a multiple of 128): gate_up on the swap kernel, down on W4A8.
class CudaMxfp4WgmmaSwapRoutedExpertsTest : public CudaMxfp4RoutedExpertsTest {
 protected:
  void SetUp() override {
    w4a8 = true;
    wgmma_swap = true;
    I = 128;
    CudaMxfp4RoutedExpertsTest::SetUp();
    if (IsSkipped()) return;
    if (!kernels::Mxfp4WgmmaSwapDeviceSupports()) {
      GTEST_SKIP() << "no compute capability 9.0 device";
    }
  }
};

TEST_F(CudaMxfp4WgmmaSwapRoutedExpertsTest, DecodeSizes) {
  Run(3, false);
  Run(9, false);
  Run(70, false);
  Run(CudaTuning().mxfp4_w4a8_max_tokens, false);
}

TEST_F(CudaMxfp4WgmmaSwapRoutedExpertsTest, ReplayedFromACudaGraph) { Run(9, true); }

TEST_F(CudaMxfp4WgmmaSwapRoutedExpertsTest, ClampedSwiGlu) {
  Run(3, false, 0.7f);
  Run(9, true, 0.7f);
}

TEST_F(CudaMxfp4WgmmaSwapRoutedExpertsTest, DownNotAMultipleOf128StaysOnW4a8) {
  I = 96;
  Run(9, false);
}

// Sizes the kernel does not take are declined, nothing launched.
TEST_F(CudaMxfp4RoutedExpertsTest, DeclinesHiddenNotAMultipleOf32) {
  RoutedExpertsArgs a;
  a.num_tokens = 1;
  a.top_k = 1;
  a.num_experts = 1;
  a.hidden_size = 48;
  a.inter = 64;
  a.dtype = WeightDType::kMxfp4E2M1;
  EXPECT_FALSE(gpu_->RoutedExperts(a));
  EXPECT_TRUE(gpu_->status().ok());
}

}  // namespace
}  // namespace deepinfer
