// CudaBackend's MoE ops against CpuBackend: the routed experts on every path (device path at
// decode sizes, eager and in a CUDA graph; chunked cuBLAS), the fused MoE block at 1-2 tokens and
// the dense MLP through it (eager and replayed), and the router (one launch and the ops).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::CallsOf;
using testing::CudaBackendTest;

// Backend::RoutedExperts against the same math done token by token on the CPU: out[t] = sum
// over k of w[t, k] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, k]. Covers every path:
// up to kMaxFusedMoeTokens bf16 tokens (or any size while recorded into a CUDA graph) the device
// path with the expert GEMMs DecodeMoeAlgoFor picks, beyond that and for fp32 weights the cuBLAS
// GEMMs per expert in chunks. Random routing (K distinct experts per token, ascending, as the
// router emits them), or skewed (expert 3 in every token, the others from 8 experts, the remaining
// experts empty); fresh data each run, output poisoned with NaN first.
class RoutedExpertsTest : public CudaBackendTest {
 protected:
  static constexpr int64_t E = 32, K = 6, H = 128, I = 64;
  using DecodeAlgo = CudaBackend::DecodeMoeAlgo;

  // Random bf16 weights of a MoE block: the E routed experts (gate_up [2I x H], down [H x I],
  // slot e holding expert e) and the shared experts (intermediate SI); the device copies kept in
  // *keep, the host copies rounded to bf16 as the device holds them.
  struct BlockWeights {
    std::vector<const void*> gu_ptr, dn_ptr;
    std::vector<std::vector<float>> gu_ref, dn_ref;
    std::vector<float> sgu, sdn;
    WeightView sgu_gpu, sdn_gpu;
  };
  BlockWeights RandomBlockWeights(int64_t SI, uint32_t seed,
                                  std::vector<std::unique_ptr<DeviceBuffer>>* keep) {
    BlockWeights b;
    b.gu_ptr.resize(E);
    b.dn_ptr.resize(E);
    b.gu_ref.resize(E);
    b.dn_ref.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      b.gu_ref[e] = testing::RandomFloats(2 * I * H, seed + 10 + e, 0.125f);
      b.dn_ref[e] = testing::RandomFloats(H * I, seed + 1000 + e, 0.125f);
      b.gu_ptr[e] = GpuBf16(b.gu_ref[e], keep).data;
      b.dn_ptr[e] = GpuBf16(b.dn_ref[e], keep).data;
      for (float& v : b.gu_ref[e]) v = RoundToBf16(v);
      for (float& v : b.dn_ref[e]) v = RoundToBf16(v);
    }
    b.sgu = testing::RandomFloats(2 * SI * H, seed + 7, 0.125f);
    b.sdn = testing::RandomFloats(H * SI, seed + 8, 0.125f);
    b.sgu_gpu = GpuBf16(b.sgu, keep);
    b.sdn_gpu = GpuBf16(b.sdn, keep);
    for (float& v : b.sgu) v = RoundToBf16(v);
    for (float& v : b.sdn) v = RoundToBf16(v);
    return b;
  }

  // The arguments of one RoutedExperts call on T tokens with device copies of its inputs (kept
  // alive in *inputs): hidden rows x, routing ids / weights w, the experts' weight tables (slot e
  // holds expert e), writing `out`.
  RoutedExpertsArgs DeviceArgs(int64_t T, const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<int32_t>& ids,
                               const std::vector<const void*>& gu_ptr,
                               const std::vector<const void*>& dn_ptr, WeightDType dtype,
                               float* out, std::vector<std::unique_ptr<DeviceBuffer>>* inputs) {
    std::vector<int32_t> slots(E);
    std::iota(slots.begin(), slots.end(), 0);
    auto upload_bytes = [&](const void* p, size_t n) {
      inputs->push_back(gpu_->Allocate(n));
      gpu_->CopyToDevice(p, n, inputs->back()->data());
      return inputs->back()->data();
    };
    inputs->push_back(Upload(x));
    const float* dx = inputs->back()->as<float>();
    inputs->push_back(Upload(w));
    const float* dw = inputs->back()->as<float>();
    RoutedExpertsArgs a;
    a.num_tokens = static_cast<int32_t>(T);
    a.top_k = static_cast<int32_t>(K);
    a.num_experts = static_cast<int32_t>(E);
    a.hidden_size = H;
    a.inter = I;
    a.hidden = dx;
    a.topk_ids =
        static_cast<const int32_t*>(upload_bytes(ids.data(), ids.size() * sizeof(int32_t)));
    a.topk_weights = dw;
    a.slot_of_expert =
        static_cast<const int32_t*>(upload_bytes(slots.data(), slots.size() * sizeof(int32_t)));
    a.gate_up = static_cast<const void* const*>(upload_bytes(gu_ptr.data(), E * sizeof(void*)));
    a.down = static_cast<const void* const*>(upload_bytes(dn_ptr.data(), E * sizeof(void*)));
    a.dtype = dtype;
    a.out = out;
    return a;
  }

  // Run records RoutedExperts into a CUDA graph and replays it (Backend::Capture).
  bool captured_ = false;
  // > 0: DeepSeek-V4's clamped SwiGLU (RoutedExpertsArgs::swiglu_limit), the reference through
  // V4Ops::SwiGluClamped.
  float limit_ = 0.0f;

  void Run(int64_t T, WeightDType dtype, bool skewed = false) {
    const uint32_t seed = testing::FreshSeed();
    const bool bf16 = dtype == WeightDType::kBFloat16;
    const bool cublas_path = !bf16 || (T > CudaBackend::kMaxFusedMoeTokens && !captured_);
    const DecodeAlgo resolved = CudaBackend::DecodeMoeAlgoFor(T);
    // Every path but the fp32-activation grouped kernel rounds the activations to bf16.
    const bool bf16_acts = bf16 && (cublas_path || resolved != DecodeAlgo::kGroupedF32);
    SCOPED_TRACE(::testing::Message()
                 << "tokens " << T << (bf16 ? " bf16" : " fp32") << " weights, "
                 << (cublas_path                           ? "cuBLAS"
                     : resolved == DecodeAlgo::kGroupedF32 ? "grouped fp32-x"
                                                           : "planned cuBLAS")
                 << (skewed ? ", skewed routing" : "") << (captured_ ? ", in a CUDA graph" : "")
                 << (limit_ > 0.0f ? ", clamped SwiGLU" : "") << ", seed " << seed);
    std::mt19937 gen(seed);
    auto x = testing::RandomFloats(T * H, seed);
    auto w = testing::RandomFloats(T * K, seed + 1, 0.5f);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all;
      if (skewed) {
        all = {3};
        for (int32_t e : {0, 1, 2, 4, 5, 6, 7, 30}) all.push_back(e);
        std::shuffle(all.begin() + 1, all.end(), gen);
      } else {
        for (int32_t e = 0; e < E; ++e) all.push_back(e);
        std::shuffle(all.begin(), all.end(), gen);
      }
      std::sort(all.begin(), all.begin() + K);
      ids.insert(ids.end(), all.begin(), all.begin() + K);
    }
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    std::vector<const void*> gu_ptr(E), dn_ptr(E);
    // CPU reference weights: bf16 values widened to fp32 for the device-grouped path (x used at
    // fp32 precision there), bf16 weights on the bf16 CPU backend for the cuBLAS path (which
    // rounds its activations to bf16, as that backend does), fp32 as they are otherwise.
    std::vector<WeightView> ref_gu(E), ref_dn(E);
    Backend& ref = bf16_acts ? static_cast<Backend&>(cpu16_) : cpu_;
    std::vector<std::vector<float>> host_w;
    std::vector<std::vector<double>> down_max(E, std::vector<double>(H, 0.0));
    for (int64_t e = 0; e < E; ++e) {
      auto gu = testing::RandomFloats(2 * I * H, seed + 10 + e, 0.125f);
      auto dn = testing::RandomFloats(H * I, seed + 1000 + e, 0.125f);
      for (int64_t j = 0; j < H; ++j) {
        for (int64_t i = 0; i < I; ++i) {
          down_max[e][j] = std::max(down_max[e][j], 1.01 * std::abs(dn[j * I + i]));
        }
      }
      if (bf16) {
        gu_ptr[e] = GpuBf16(gu, &keep).data;
        dn_ptr[e] = GpuBf16(dn, &keep).data;
      } else {
        keep.push_back(Upload(gu));
        gu_ptr[e] = keep.back()->data();
        keep.push_back(Upload(dn));
        dn_ptr[e] = keep.back()->data();
      }
      if (bf16_acts) {
        ref_gu[e] = CpuBf16(gu, &keep);
        ref_dn[e] = CpuBf16(dn, &keep);
        continue;
      }
      if (bf16) {
        for (float& v : gu) v = RoundToBf16(v);
        for (float& v : dn) v = RoundToBf16(v);
      }
      host_w.push_back(std::move(gu));
      ref_gu[e] = host_w.back().data();
      host_w.push_back(std::move(dn));
      ref_dn[e] = host_w.back().data();
    }
    std::vector<float> want(T * H, 0.0f);
    // flip[t, j]: how much out[t, j] moves if one activation of each of t's experts lands on
    // the other side of a bf16 rounding boundary (the cuBLAS bf16 path rounds activations
    // computed in another summation order than the CPU's, so a few of the ~10^6 activations
    // round the other way): sum_k |w| * 2^-8 * max|act| * max_i |W_down[j, i]|.
    // The cuBLAS path with bf16 weights also rounds both GEMMs' outputs to bf16 (as HF's bf16
    // Linear layers do): so does the reference, and a gate/up value rounded the other way
    // moves its activation by about as much as an activation rounded the other way (counted
    // twice more in flip[]), an expert output rounded the other way moves out by |w| * 2^-8 *
    // |y|.
    // The planned cuBLAS decode path rounds gate_up's outputs to bf16 too (not down's).
    const bool round_outputs = bf16 && cublas_path;
    const bool round_gate_up = round_outputs || (bf16 && resolved == DecodeAlgo::kPlannedCublas);
    std::vector<double> flip(T * H, 0.0);
    std::vector<float> gu(2 * I), act(I), y(H);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[t * K + k];
        ref.Gemm(1, 2 * I, H, x.data() + t * H, H, ref_gu[e], H, gu.data(), 2 * I, false);
        if (round_gate_up) {
          for (float& v : gu) v = RoundToBf16(v);
        }
        if (limit_ > 0.0f) {
          ref.v4_ops()->SwiGluClamped(1, I, gu.data(), limit_, act.data());
        } else {
          ref.SiluMul(1, I, gu.data(), act.data());
        }
        ref.Gemm(1, H, I, act.data(), I, ref_dn[e], I, y.data(), H, false);
        if (round_outputs) {
          for (float& v : y) v = RoundToBf16(v);
        }
        double amax = 0;
        for (float v : act) amax = std::max(amax, std::abs(static_cast<double>(v)));
        const double act_flips = round_gate_up ? 3.0 : 1.0;
        for (int64_t i = 0; i < H; ++i) {
          want[t * H + i] += w[t * K + k] * y[i];
          flip[t * H + i] +=
              std::abs(w[t * K + k]) * std::ldexp(amax, -8) * down_max[e][i] * act_flips;
          if (round_outputs) {
            flip[t * H + i] += std::abs(w[t * K + k]) * std::ldexp(std::abs(y[i]), -8);
          }
        }
      }
    }
    std::vector<std::unique_ptr<DeviceBuffer>> inputs;
    auto dout = Poisoned(T * H);
    RoutedExpertsArgs a =
        DeviceArgs(T, x, w, ids, gu_ptr, dn_ptr, dtype, dout->as<float>(), &inputs);
    a.swiglu_limit = limit_;
    // Half the runs give the host copies of the tables, half let the backend copy them back.
    if (T % 2 == 1) {
      a.gate_up_host = gu_ptr.data();
      a.down_host = dn_ptr.data();
    }
    if (captured_) {
      // Recorded into a CUDA graph, then replayed once (as the decode graphs run it).
      auto ops = Record([&] { return gpu_->RoutedExperts(a); });
      ASSERT_NE(ops, nullptr);
      ASSERT_TRUE(ops->Replay().ok());
    } else {
      ASSERT_TRUE(gpu_->RoutedExperts(a));
    }
    const std::vector<float> got = Download(*dout);
    // Outputs are O(1). device-grouped: fp32 x, bf16 hi+lo split (<= 2^-17 relative) and
    // summation order; cuBLAS bf16: like the bf16 CPU backend up to summation order and the
    // activation roundings it can flip (flip[], at most a few percent of an output; a wrong or
    // missing expert moves an output by O(1)); fp32: summation order only.
    const double tol = !bf16 ? 1e-4 : 1e-3;
    const bool flips = bf16_acts;
    int64_t bad = 0, flipped = 0;
    for (int64_t i = 0; i < T * H; ++i) {
      const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
      const double bound = tol + tol * std::abs(want[i]);
      if (diff > bound) ++flipped;
      if (!(diff <= bound + (flips ? flip[i] : 0.0)) && ++bad <= 5) {
        ADD_FAILURE() << "out[" << i / H << ", " << i % H << "] = " << got[i] << ", want "
                      << want[i] << " (bound " << bound << " + flip " << flip[i] << ")";
      }
    }
    EXPECT_EQ(bad, 0);
    // Rounding flips touch a few tokens, not the output at large.
    // (at least two tokens' worth allowed, for the decode sizes of a few tokens).
    EXPECT_LE(flipped, std::max<int64_t>(T * H / 50, 2 * H))
        << "outputs beyond the plain tolerance";
    EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
  }
};

// The device path at decode sizes (the CUDA-core kernel up to 2 tokens, the planned cuBLAS
// chunks of 8 rows up to 32 tokens and of 48 above), random and skewed routing.
TEST_F(RoutedExpertsTest, DeviceGroupedPathMatchesPerTokenReference) {
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{40}, int64_t{64},
                    int64_t{CudaBackend::kMaxFusedMoeTokens}}) {
    for (bool skewed : {false, true}) Run(T, WeightDType::kBFloat16, skewed);
  }
}

// The device path recorded into a CUDA graph and replayed, 1-256 tokens (above
// kMaxFusedMoeTokens too: a recording takes the device path at any size); random and skewed
// routing (all tokens on expert 3, a few experts busy).
TEST_F(RoutedExpertsTest, DevicePathInCudaGraphMatchesPerTokenReference) {
  captured_ = true;
  for (int64_t T : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{64}, int64_t{128}, int64_t{256}}) {
    for (bool skewed : {false, true}) Run(T, WeightDType::kBFloat16, skewed);
  }
  captured_ = false;
}

TEST_F(RoutedExpertsTest, CublasPathMatchesPerTokenReference) {
  for (int64_t T : {int64_t{CudaBackend::kMaxFusedMoeTokens} + 1, int64_t{513}, int64_t{4096}}) {
    Run(T, WeightDType::kBFloat16);
  }
  for (int64_t T : {int64_t{1}, int64_t{300}, int64_t{513}, int64_t{4096}}) {
    Run(T, WeightDType::kFloat32);
  }
}

// DeepSeek-V4's clamped SwiGLU (swiglu_limit 0.7: the gate and up sums here are ~1.4 in
// magnitude, so many are clamped) on every path: the CUDA-core kernel, the planned chunks
// (eager and recorded), the chunked cuBLAS GEMMs with bf16 and fp32 weights.
TEST_F(RoutedExpertsTest, ClampedSwiGluOnEveryPathMatchesPerTokenReference) {
  limit_ = 0.7f;
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{40}, int64_t{128}}) {
    Run(T, WeightDType::kBFloat16);
  }
  captured_ = true;
  Run(64, WeightDType::kBFloat16);
  captured_ = false;
  Run(CudaBackend::kMaxFusedMoeTokens + 1, WeightDType::kBFloat16);
  Run(300, WeightDType::kFloat32);
  limit_ = 0.0f;
}

// Arguments RoutedExperts has no path for are left to the caller's dispatcher.
TEST_F(RoutedExpertsTest, UnsupportedShapesAreDeclined) {
  RoutedExpertsArgs a;
  a.num_tokens = 4;
  a.top_k = 2;
  a.num_experts = kernels::kMaxMoeSlots + 1;  // more slots than one permutation addresses
  a.hidden_size = 64;
  a.inter = 32;
  a.dtype = WeightDType::kBFloat16;
  EXPECT_FALSE(gpu_->RoutedExperts(a));
  a.num_experts = 8;
  a.hidden_size = 60;  // the grouped GEMM loads 8 values at a time
  EXPECT_FALSE(gpu_->RoutedExperts(a));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// Backend::RoutedAndSharedExperts (the fused MoE block at 1-2 tokens) against the CPU backend
// doing the block op by op on the same bf16 weights widened to fp32 (the fused path keeps fp32
// activations): per token the routed MLPs weighted and summed in k order, then the shared MLP
// (intermediate 2 * inter, computed whole) added. Eager and recorded into a CUDA graph (the
// replay must equal the eager run bit for bit); 2 tokens with 2 experts in common; output
// poisoned first. Also the cases it declines, doing nothing.
TEST_F(RoutedExpertsTest, RoutedAndSharedExpertsMatchCpuOps) {
  constexpr int64_t SI = 2 * I;
  for (int64_t T : {int64_t{1}, int64_t{2}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "tokens " << T << " seed " << seed);
    std::mt19937 gen(seed);
    const auto x = testing::RandomFloats(T * H, seed);
    auto w = testing::RandomFloats(T * K, seed + 1, 0.5f);
    std::vector<int32_t> all(E), ids;
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), gen);
    for (int64_t t = 0; t < T; ++t) {
      // Token t takes all[t * (K - 2)], ...: token 1 shares 2 experts with token 0.
      std::vector<int32_t> mine(all.begin() + t * (K - 2), all.begin() + t * (K - 2) + K);
      std::sort(mine.begin(), mine.end());
      ids.insert(ids.end(), mine.begin(), mine.end());
    }
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    BlockWeights bw = RandomBlockWeights(SI, seed, &keep);
    const auto& [gu_ptr, dn_ptr, gu_ref, dn_ref, sgu, sdn, sgu_gpu, sdn_gpu] = bw;

    std::vector<float> want(T * H, 0.0f), gu(2 * SI), act(SI), y(H);
    for (int64_t t = 0; t < T; ++t) {
      float* o = want.data() + t * H;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[t * K + k];
        cpu_.Gemm(1, 2 * I, H, x.data() + t * H, H, gu_ref[e].data(), H, gu.data(), 2 * I, false);
        cpu_.SiluMul(1, I, gu.data(), act.data());
        cpu_.Gemm(1, H, I, act.data(), I, dn_ref[e].data(), I, y.data(), H, false);
        for (int64_t i = 0; i < H; ++i) o[i] += w[t * K + k] * y[i];
      }
      cpu_.Gemm(1, 2 * SI, H, x.data() + t * H, H, sgu.data(), H, gu.data(), 2 * SI, false);
      cpu_.SiluMul(1, SI, gu.data(), act.data());
      cpu_.Gemm(1, H, SI, act.data(), SI, sdn.data(), SI, y.data(), H, false);
      cpu_.Add(H, o, y.data(), o);
    }

    std::vector<std::unique_ptr<DeviceBuffer>> inputs;
    auto dout = Poisoned(T * H);
    RoutedExpertsArgs a = DeviceArgs(T, x, w, ids, gu_ptr, dn_ptr, WeightDType::kBFloat16,
                                     dout->as<float>(), &inputs);
    a.shared_inter = SI;
    a.shared_gate_up = sgu_gpu.data;
    a.shared_down = sdn_gpu.data;
    ASSERT_TRUE(gpu_->RoutedAndSharedExperts(a));
    const std::vector<float> eager = Download(*dout);
    double scale = 0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));
    // fp32 sums in another order: far below 1e-4 of the largest output; a missing part, a wrong
    // expert or weight moves outputs by O(scale).
    EXPECT_TRUE(testing::AllClose(eager, want, 1e-4 * scale, 1e-4));

    // The block into a poisoned output, eagerly or recorded into a CUDA graph and replayed.
    auto eager_run = [&] {
      auto out = Poisoned(T * H);
      a.out = out->as<float>();
      EXPECT_TRUE(gpu_->RoutedAndSharedExperts(a));
      return Download(*out);
    };
    auto replayed_run = [&] {
      auto out = Poisoned(T * H);
      a.out = out->as<float>();
      auto ops = Record([&] { return gpu_->RoutedAndSharedExperts(a); });
      if (ops != nullptr) {
        EXPECT_TRUE(ops->Replay().ok());
      }
      return Download(*out);
    };
    EXPECT_EQ(replayed_run(), eager) << "replay differs from the eager run";
    EXPECT_EQ(eager_run(), eager) << "a second eager run differs";

    // Declined (nothing written): a shared size that is no multiple of inter, no shared experts,
    // fp32 weights, 3 tokens.
    auto dout3 = Poisoned(T * H);
    a.out = dout3->as<float>();
    RoutedExpertsArgs b = a;
    b.shared_inter = I + 8;
    EXPECT_FALSE(gpu_->RoutedAndSharedExperts(b));
    b = a;
    b.shared_inter = 0;
    EXPECT_FALSE(gpu_->RoutedAndSharedExperts(b));
    b = a;
    b.dtype = WeightDType::kFloat32;
    EXPECT_FALSE(gpu_->RoutedAndSharedExperts(b));
    b = a;
    b.num_tokens = 3;
    EXPECT_FALSE(gpu_->RoutedAndSharedExperts(b));
    for (float v : Download(*dout3)) ASSERT_TRUE(std::isnan(v)) << "a declined call wrote out";
    EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
  }
}

// RouteTokens with the post-attention norm in its args: the CUDA backend runs AddRmsNorm, then
// the one-launch router on its output. Against the CPU backend (Backend::RouteTokens:
// AddRmsNorm, Gemm, NoauxTcRoute): x exactly, the normed rows (fp32 and bf16) close, the same
// choices except within float noise of a tie.
TEST_F(CudaBackendTest, RouteTokensWithNormMatchesCpu) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int32_t E = 64, K = 6, H = 2048;
  struct Out {
    std::vector<float> x, normed, w;
    std::vector<uint16_t> normed_bf16;
    std::vector<int32_t> ids;
  };
  for (int32_t T : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << T);
    const std::vector<float> x = testing::RandomFloats(T * H, seed + T, 1.0f);
    const std::vector<float> y = testing::RandomFloats(T * H, seed + 7, 0.5f);
    std::vector<float> norm_w = testing::RandomFloats(H, seed + 8, 0.2f);
    for (float& v : norm_w) v += 1.0f;
    const std::vector<float> weight = testing::RandomFloats(E * H, seed + 1, 0.05f);
    const std::vector<float> bias = testing::RandomFloats(E, seed + 2, 0.05f);
    auto run = [&](Backend* be, Out* o) {
      auto up = [&](const void* host, size_t bytes) {
        auto buf = be->Allocate(bytes);
        be->CopyToDevice(host, bytes, buf->data());
        return buf;
      };
      auto dx = up(x.data(), x.size() * sizeof(float));
      auto dy = up(y.data(), y.size() * sizeof(float));
      auto dnw = up(norm_w.data(), H * sizeof(float));
      auto dw = up(weight.data(), weight.size() * sizeof(float));
      auto db = up(bias.data(), bias.size() * sizeof(float));
      const std::vector<float> poison(T * H, std::numeric_limits<float>::quiet_NaN());
      auto dh = up(poison.data(), T * H * sizeof(float));
      auto dh16 = up(poison.data(), T * H * sizeof(uint16_t));
      auto dids = up(poison.data(), T * K * sizeof(int32_t));
      auto dtw = up(poison.data(), T * K * sizeof(float));
      RouteTokensArgs a;
      a.hidden_size = H;
      a.router_weight = dw->as<float>();
      a.norm.x = dx->as<float>();
      a.norm.y = dy->as<float>();
      a.norm.weight = dnw->as<float>();
      a.norm.eps = 1e-6f;
      a.norm.out = dh->as<float>();
      a.norm.out_bf16 = dh16->as<uint16_t>();
      a.route.num_tokens = T;
      a.route.num_experts = E;
      a.route.correction_bias = db->as<float>();
      a.route.top_k = K;
      a.route.scaling_factor = 2.446f;
      a.route.topk_ids = dids->as<int32_t>();
      a.route.topk_weights = dtw->as<float>();
      be->RouteTokens(a);
      o->x.resize(T * H);
      o->normed.resize(T * H);
      o->normed_bf16.resize(T * H);
      o->ids.resize(T * K);
      o->w.resize(T * K);
      be->CopyToHost(dx->data(), T * H * sizeof(float), o->x.data());
      be->CopyToHost(dh->data(), T * H * sizeof(float), o->normed.data());
      be->CopyToHost(dh16->data(), T * H * sizeof(uint16_t), o->normed_bf16.data());
      be->CopyToHost(dids->data(), T * K * sizeof(int32_t), o->ids.data());
      be->CopyToHost(dtw->data(), T * K * sizeof(float), o->w.data());
    };
    Out cpu, got;
    run(&cpu_, &cpu);
    gpu_->SetOpTiming(true);
    run(gpu_.get(), &got);
    gpu_->SetOpTiming(false);
    const std::string report = gpu_->TakeOpTimingReport();
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    EXPECT_EQ(CallsOf(report, "RouteTokens"), 1) << report;
    EXPECT_EQ(CallsOf(report, "AddRmsNorm"), 1) << report;
    EXPECT_TRUE(AllClose(got.x, cpu.x, 0.0, 0.0));
    EXPECT_TRUE(AllClose(got.normed, cpu.normed, 1e-5, 1e-5));
    int bf16_off = 0;  // bf16 roundings of values a rounding step apart
    for (int64_t i = 0; i < T * H; ++i) {
      bf16_off += std::abs(got.normed_bf16[i] - cpu.normed_bf16[i]) > 1;
    }
    EXPECT_EQ(bf16_off, 0);
    int differing = 0;
    for (int32_t t = 0; t < T; ++t) {
      const std::vector<int32_t> g(got.ids.begin() + t * K, got.ids.begin() + (t + 1) * K);
      const std::vector<int32_t> w(cpu.ids.begin() + t * K, cpu.ids.begin() + (t + 1) * K);
      differing += g != w;
    }
    EXPECT_LE(differing, 1) << "more than float-noise ties";
  }
}

// RouteTokens against the CPU backend's (Backend's Gemm + NoauxTcRoute + AccumulateExpertCounts)
// as CudaBackend runs it (the one-launch kernel up to kFusedRouterMaxTokens; 200 and 300 take the
// ops), and as Backend's ops on this backend: the same choices except within float noise of a
// tie (the logits' summation orders differ), close weights, and the counts of exactly the choices
// made (count_limit leaves out the last token).
TEST_F(CudaBackendTest, RouteTokensMatchesCpuFusedAndUnfused) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int32_t E = 64, K = 6, H = 512;
  for (bool fused : {true, false}) {
    for (int32_t T : {1, 7, 128, 200, 300}) {
      SCOPED_TRACE(::testing::Message() << "fused " << fused << " tokens " << T);
      const std::vector<float> hidden = testing::RandomFloats(T * H, seed + T, 1.0f);
      const std::vector<float> weight = testing::RandomFloats(E * H, seed + 1, 0.05f);
      const std::vector<float> bias = testing::RandomFloats(E, seed + 2, 0.05f);
      const int32_t limit = (T - 1) * K;
      // be's own RouteTokens, or (base_ops) Backend's ops on it.
      auto run = [&](Backend* be, bool base_ops, std::vector<int32_t>* ids, std::vector<float>* w,
                     std::vector<int64_t>* counts) {
        auto up = [&](const void* host, size_t bytes) {
          auto buf = be->Allocate(bytes);
          be->CopyToDevice(host, bytes, buf->data());
          return buf;
        };
        auto dh = up(hidden.data(), hidden.size() * sizeof(float));
        auto dw = up(weight.data(), weight.size() * sizeof(float));
        auto db = up(bias.data(), bias.size() * sizeof(float));
        auto dlimit = up(&limit, sizeof(limit));
        std::vector<int64_t> initial(E, 5);
        auto dcounts = up(initial.data(), E * sizeof(int64_t));
        const std::vector<int32_t> poison_ids(T * K, -7);
        const std::vector<float> poison_w(T * K, std::numeric_limits<float>::quiet_NaN());
        auto dids = up(poison_ids.data(), T * K * sizeof(int32_t));
        auto dtw = up(poison_w.data(), T * K * sizeof(float));
        RouteTokensArgs a;
        a.hidden_size = H;
        a.hidden = dh->as<float>();
        a.router_weight = dw->as<float>();
        a.route.num_tokens = T;
        a.route.num_experts = E;
        a.route.correction_bias = db->as<float>();
        a.route.top_k = K;
        a.route.scaling_factor = 2.446f;
        a.route.topk_ids = dids->as<int32_t>();
        a.route.topk_weights = dtw->as<float>();
        a.expert_counts = dcounts->as<int64_t>();
        a.count_limit = dlimit->as<int32_t>();
        if (base_ops) {
          be->Backend::RouteTokens(a);
        } else {
          be->RouteTokens(a);
        }
        ids->resize(T * K);
        w->resize(T * K);
        counts->resize(E);
        be->CopyToHost(dids->data(), T * K * sizeof(int32_t), ids->data());
        be->CopyToHost(dtw->data(), T * K * sizeof(float), w->data());
        be->CopyToHost(dcounts->data(), E * sizeof(int64_t), counts->data());
      };
      std::vector<int32_t> want_ids, got_ids;
      std::vector<float> want_w, got_w;
      std::vector<int64_t> want_counts, got_counts;
      run(&cpu_, /*base_ops=*/false, &want_ids, &want_w, &want_counts);
      gpu_->SetOpTiming(true);
      run(gpu_.get(), /*base_ops=*/!fused, &got_ids, &got_w, &got_counts);
      gpu_->SetOpTiming(false);
      const std::string report = gpu_->TakeOpTimingReport();
      const bool one_launch = fused && T <= CudaBackend::kFusedRouterMaxTokens;
      EXPECT_EQ(CallsOf(report, "RouteTokens"), one_launch ? 1 : -1) << report;
      EXPECT_EQ(CallsOf(report, "NoauxTcRoute"), one_launch ? -1 : 1) << report;
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      int differing = 0;
      std::vector<int64_t> from_ids(E, 5);
      for (int32_t t = 0; t < T; ++t) {
        for (int32_t k = 0; k < K; ++k) {
          const int32_t id = got_ids[t * K + k];
          ASSERT_GE(id, 0);
          ASSERT_LT(id, E);
          if (t * K + k < limit) ++from_ids[id];
        }
        const std::vector<int32_t> g(got_ids.begin() + t * K, got_ids.begin() + (t + 1) * K);
        const std::vector<int32_t> w(want_ids.begin() + t * K, want_ids.begin() + (t + 1) * K);
        if (g != w) {
          ++differing;
          continue;
        }
        const std::vector<float> gw(got_w.begin() + t * K, got_w.begin() + (t + 1) * K);
        const std::vector<float> ww(want_w.begin() + t * K, want_w.begin() + (t + 1) * K);
        EXPECT_TRUE(AllClose(gw, ww, 1e-6, 1e-5)) << "token " << t;
      }
      EXPECT_LE(differing, std::max(1, T / 50)) << "more than float-noise ties";
      EXPECT_EQ(got_counts, from_ids);
    }
  }
}

// Backend::NormedDenseMlp (a dense MLP layer's norm + MLP at one decode token through the fused
// MoE block's kernels with no routed experts) against the CPU backend's AddRmsNorm, Gemm,
// SiluMul, Gemm on the same bf16 weights widened to fp32 (the fused path keeps fp32
// activations), out aliasing y as in the model; eager and recorded into a CUDA graph (the replay,
// from the same x and y, must equal the eager run bit for bit). Also the cases it declines,
// doing nothing.
TEST_F(CudaBackendTest, NormedDenseMlpMatchesCpuOps) {
  // Moonlight's dense shape scaled down (intermediate 5.5 x hidden), a hidden past one unrolled
  // gate_up pass.
  const int64_t H = 512, I = 2816;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const auto x = testing::RandomFloats(H, seed, 2.0f);
  const auto y = testing::RandomFloats(H, seed + 1);
  const auto wn = testing::RandomFloats(H, seed + 2);
  auto gu = testing::RandomFloats(2 * I * H, seed + 3, 0.125f);
  auto dn = testing::RandomFloats(H * I, seed + 4, 0.125f);
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  const WeightView gu_gpu = GpuBf16(gu, &keep), dn_gpu = GpuBf16(dn, &keep);
  for (float& v : gu) v = RoundToBf16(v);
  for (float& v : dn) v = RoundToBf16(v);

  std::vector<float> want_x = x, normed(H), g(2 * I), act(I), want(H);
  cpu_.AddRmsNorm(1, H, want_x.data(), y.data(), wn.data(), 1e-6f, normed.data(), nullptr);
  cpu_.Gemm(1, 2 * I, H, normed.data(), H, gu.data(), H, g.data(), 2 * I, false);
  cpu_.SiluMul(1, I, g.data(), act.data());
  cpu_.Gemm(1, H, I, act.data(), I, dn.data(), I, want.data(), H, false);
  double scale = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));

  auto dx = Upload(x), dy = Upload(y), dwn = Upload(wn), dnormed = Poisoned(H);
  DenseMlpArgs a;
  a.rows = 1;
  a.hidden_size = H;
  a.inter = I;
  a.x = dx->as<float>();
  a.y = dy->as<float>();
  a.norm_weight = dwn->as<float>();
  a.eps = 1e-6f;
  a.normed = dnormed->as<float>();
  a.gate_up = gu_gpu;
  a.down = dn_gpu;
  a.out = dy->as<float>();  // the model's: the layer's output replaces the attention output
  auto reset = [&] {
    gpu_->CopyToDevice(x.data(), H * sizeof(float), dx->data());
    gpu_->CopyToDevice(y.data(), H * sizeof(float), dy->data());
  };

  reset();
  ASSERT_TRUE(gpu_->NormedDenseMlp(a));
  const std::vector<float> eager = Download(*dy), eager_x = Download(*dx);
  EXPECT_TRUE(AllClose(eager_x, want_x, 0, 0)) << "x += y";
  EXPECT_TRUE(AllClose(Download(*dnormed), normed, 1e-5, 1e-5));
  // fp32 sums in another order over a normed row that may differ in its last bits: far below
  // 1e-4 of the largest output; a missing or doubled part, a wrong row moves outputs by
  // O(scale).
  EXPECT_TRUE(AllClose(eager, want, 1e-4 * scale, 1e-4));

  auto ops = Record([&] { return gpu_->NormedDenseMlp(a); });
  ASSERT_NE(ops, nullptr);
  reset();
  gpu_->CopyToDevice(std::vector<float>(H, std::numeric_limits<float>::quiet_NaN()).data(),
                     H * sizeof(float), dnormed->data());
  ASSERT_TRUE(ops->Replay().ok());
  EXPECT_EQ(Download(*dy), eager) << "replay differs from the eager run";
  EXPECT_EQ(Download(*dx), eager_x);

  // Declined (nothing written): 2 rows, fp32 weights, an intermediate or hidden size that is no
  // multiple of 8, a misaligned normed row.
  reset();
  DenseMlpArgs b = a;
  b.rows = 2;
  EXPECT_FALSE(gpu_->NormedDenseMlp(b));
  b = a;
  b.gate_up.dtype = WeightDType::kFloat32;
  EXPECT_FALSE(gpu_->NormedDenseMlp(b));
  b = a;
  b.down.dtype = WeightDType::kFloat32;
  EXPECT_FALSE(gpu_->NormedDenseMlp(b));
  b = a;
  b.inter = I - 4;
  EXPECT_FALSE(gpu_->NormedDenseMlp(b));
  b = a;
  b.hidden_size = H - 4;
  EXPECT_FALSE(gpu_->NormedDenseMlp(b));
  b = a;
  b.normed = a.normed + 1;
  EXPECT_FALSE(gpu_->NormedDenseMlp(b));
  EXPECT_EQ(Download(*dx), x);
  EXPECT_EQ(Download(*dy), y);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

}  // namespace
}  // namespace deepinfer
