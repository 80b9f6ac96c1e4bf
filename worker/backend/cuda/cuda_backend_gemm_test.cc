// CudaBackend's GEMMs and elementwise ops against CpuBackend: the cuBLAS layout with strides and
// accumulation (fp32 and bf16 weights, fp32 and bf16 activations), batched and grouped GEMMs,
// the small-m kernel and the staged GEMV at decode sizes, the cuBLASLt tuner at prefill sizes,
// the GEMMs with a bf16 output, the bf16 gate_up with its SiLU-mul, and the norm folded into the
// staged GEMV.
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
#include "kernels/gemm/staged_gemv.h"
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

// fp32 weights: fp32 sums of up to 1024 products of N(0,1) values (|c| ~ 32) in another order.
// bf16 weights: bf16 x bf16 products are exact in fp32 on both sides (the CPU widens the rounded
// operands, cuBLAS multiplies them on tensor cores), so only the fp32 summation order differs;
// the bound is a little looser than fp32's because the tensor cores' accumulation order is
// coarser.
TEST_F(CudaBackendTest, GemmMatchesCpuWithStridesAndAccumulate) {
  ASSERT_EQ(gpu_->weight_dtype(), WeightDType::kBFloat16);
  struct Case {
    int64_t m, n, k, lda, ldw, ldc;
  };
  for (const bool bf16 : {false, true}) {
    std::vector<Case> cases = {Case{1, 129, 96, 96, 96, 129}, Case{37, 29, 45, 50, 47, 31},
                               Case{130, 512, 1024, 1030, 1024, 520}, Case{5, 3, 0, 1, 1, 3}};
    // fp32, one row, k 2048 / 2816: the staged GEMV (kernels/gemm/staged_gemv.h) by default.
    if (!bf16) {
      cases.push_back(Case{1, 576, 2048, 2048, 2048, 576});
      cases.push_back(Case{1, 1000, 2816, 2824, 2816, 1003});
    }
    // bf16, one row, k 8192 (DeepSeek-V4's o_b): the staged GEMV (StagedGemvPreferredAtOneRow).
    if (bf16) cases.push_back(Case{1, 700, 8192, 8200, 8192, 703});
    for (Case c : cases) {
      for (bool accumulate : {false, true}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << (bf16 ? "bf16" : "fp32") << " m " << c.m << " n " << c.n << " k " << c.k
                     << " accumulate " << accumulate << " seed " << seed);
        auto a = testing::RandomFloats(c.m * c.lda, seed);
        auto w = testing::RandomFloats(c.n * c.ldw, seed + 1);
        auto out = testing::RandomFloats(c.m * c.ldc, seed + 2);
        std::vector<std::unique_ptr<DeviceBuffer>> keep;
        std::vector<float> want = out;
        (bf16 ? cpu16_ : cpu_)
            .Gemm(c.m, c.n, c.k, a.data(), c.lda, bf16 ? CpuBf16(w, &keep) : WeightView(w.data()),
                  c.ldw, want.data(), c.ldc, accumulate);
        auto da = Upload(a), dw = Upload(w), dc = Upload(out);
        gpu_->Gemm(c.m, c.n, c.k, da->as<float>(), c.lda,
                   bf16 ? GpuBf16(w, &keep) : WeightView(dw->as<float>()), c.ldw, dc->as<float>(),
                   c.ldc, accumulate);
        const auto r = AllClose(Download(*dc), want, bf16 ? 1e-3 : 2e-4, bf16 ? 1e-4 : 1e-5);
        EXPECT_TRUE(r);
        if (bf16) {
          std::cout << "[bf16-gemm] m " << c.m << " n " << c.n << " k " << c.k << ": "
                    << r.message() << "\n";
        }
      }
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// One row against a vocabulary of DeepSeek-V4's LM head shape (k 4096, n from 65536; here 65539,
// so the last warps' rows are short): the staged GEMV (StagedGemvPreferredAtOneRow), bf16
// weights, accumulating onto distinct values so that every output's place is checked.
TEST_F(CudaBackendTest, OneRowLmHeadMatchesCpu) {
  const int64_t n = 65539, k = 4096, distinct = 257;
  ASSERT_TRUE(kernels::StagedGemvPreferredAtOneRow(n, k));
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<float> a = testing::RandomFloats(k, seed);
  // `distinct` random weight rows repeated (n random rows would take seconds to draw).
  const std::vector<float> rows = testing::RandomFloats(distinct * k, seed + 1);
  std::vector<float> w(n * k);
  for (int64_t j = 0; j < n; ++j) {
    std::copy_n(rows.begin() + (j % distinct) * k, k, w.begin() + j * k);
  }
  const std::vector<float> out = testing::RandomFloats(n, seed + 2);
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  std::vector<float> want = out;
  cpu16_.Gemm(1, n, k, a.data(), k, CpuBf16(w, &keep), k, want.data(), n, true);
  auto da = Upload(a), dc = Upload(out);
  gpu_->Gemm(1, n, k, da->as<float>(), k, GpuBf16(w, &keep), k, dc->as<float>(), n, true);
  EXPECT_TRUE(AllClose(Download(*dc), want, 1e-3, 1e-4));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The absorbed-MLA layouts: W_uk (a = the nope slice of each head of q, w = per-head [kvl, nope]
// blocks) and W_uv (a = per-head latent slices, w = the value rows of kv_b, strided).
class BatchedGemmTest : public CudaBackendTest, public ::testing::WithParamInterface<int64_t> {};

// T = 9 tokens (cuBLAS), and T = 1 and 3 (decode: the small-m kernel).
INSTANTIATE_TEST_SUITE_P(Tokens, BatchedGemmTest, ::testing::Values(9, 1, 3));

TEST_P(BatchedGemmTest, MatchesCpuFp32AndBf16) {
  const int64_t T = GetParam(), nh = 16, nope = 128, rope = 64, vd = 128, kvl = 512,
                qk = nope + rope;
  struct Case {
    const char* name;
    int64_t m, n, k, lda, stride_a, ldw, stride_w, ldc, stride_c, a_size, w_size, c_size;
  };
  for (Case c : {Case{"w_uk", T, kvl, nope, nh * qk, qk, nope, kvl * nope, nh * kvl, kvl,
                      T * nh * qk, nh * kvl * nope, T * nh * kvl},
                 Case{"w_uv", T, vd, kvl, nh * kvl, kvl, kvl, (nope + vd) * kvl, nh * vd, vd,
                      T * nh * kvl, nh * (nope + vd) * kvl, T * nh * vd}}) {
    for (WeightDType dt : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << c.name << " " << WeightDTypeName(dt) << " seed " << seed);
      auto a = testing::RandomFloats(c.a_size, seed);
      auto w = testing::RandomFloats(c.w_size, seed + 1);
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      auto dw = Upload(w), da = Upload(a);
      const WeightView cw = dt == WeightDType::kFloat32 ? WeightView(w.data()) : CpuBf16(w, &keep);
      const WeightView gw =
          dt == WeightDType::kFloat32 ? WeightView(dw->as<float>()) : GpuBf16(w, &keep);
      std::vector<float> want(c.c_size);
      (dt == WeightDType::kFloat32 ? cpu_ : cpu16_)
          .BatchedGemm(nh, c.m, c.n, c.k, a.data(), c.lda, c.stride_a, cw, c.ldw, c.stride_w,
                       want.data(), c.ldc, c.stride_c);
      auto dc = Poisoned(c.c_size);
      gpu_->BatchedGemm(nh, c.m, c.n, c.k, da->as<float>(), c.lda, c.stride_a, gw, c.ldw,
                        c.stride_w, dc->as<float>(), c.ldc, c.stride_c);
      const auto r = AllClose(Download(*dc), want, dt == WeightDType::kFloat32 ? 2e-4 : 1e-3,
                              dt == WeightDType::kFloat32 ? 1e-5 : 1e-4);
      EXPECT_TRUE(r);
      std::cout << "[batched-gemm] " << c.name << " " << WeightDTypeName(dt) << ": " << r.message()
                << "\n";
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// A bf16 activation operand (what AddRmsNorm / SiluMulBf16 write) gives bit for bit what the
// fp32 operand it was rounded from gives, on cuBLAS (m > 4) and on the small-m kernel (m <= 4);
// both within the bf16 bound of the CPU.
TEST_F(CudaBackendTest, Bf16ActivationOperandGivesTheSameBitsAsRoundingInGemm) {
  const int64_t n = 576, k = 2048;
  for (int64_t m : {1, 3, 4, 9, 130}) {
    for (bool accumulate : {false, true}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m " << m << " accumulate " << accumulate << " seed " << seed);
      auto a = testing::RandomFloats(m * k, seed);
      auto w = testing::RandomFloats(n * k, seed + 1);
      auto out = testing::RandomFloats(m * n, seed + 2);
      std::vector<uint16_t> a16(a.size());
      for (size_t i = 0; i < a.size(); ++i) a16[i] = FloatToBf16Bits(a[i]);
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<float> want = out;
      cpu16_.Gemm(m, n, k, ActivationView::Bf16(a16.data()), k, CpuBf16(w, &keep), k, want.data(),
                  n, accumulate);
      const WeightView gw = GpuBf16(w, &keep);
      auto da = Upload(a), dc32 = Upload(out), dc16 = Upload(out);
      auto da16 = gpu_->Allocate(a16.size() * sizeof(uint16_t));
      gpu_->CopyToDevice(a16.data(), a16.size() * sizeof(uint16_t), da16->data());
      gpu_->Gemm(m, n, k, da->as<float>(), k, gw, k, dc32->as<float>(), n, accumulate);
      gpu_->Gemm(m, n, k, ActivationView::Bf16(da16->as<uint16_t>()), k, gw, k, dc16->as<float>(),
                 n, accumulate);
      const std::vector<float> got32 = Download(*dc32), got16 = Download(*dc16);
      EXPECT_TRUE(AllClose(got16, got32, 0, 0));
      EXPECT_TRUE(AllClose(got16, want, 2e-3, 1e-4));
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// BatchedGemm with a bf16 operand (DeepSeek-V4's grouped o_a over the attention's bf16 output:
// group g reads columns g * k .. of rows of groups * k) gives bit for bit what its fp32
// operand gives, on the small-m kernel (m <= 4), the staged GEMV's batch (one row, 8 groups of
// 512 x 2048: kernels::StagedGemvPreferredBatchedAtOneRow) and on cuBLAS; both within the bf16
// bound of the CPU's BatchedGemm over the bf16 operand. With fp32 weights it is an error.
TEST_F(CudaBackendTest, BatchedGemmBf16OperandGivesTheSameBitsAsRounding) {
  struct Case {
    int64_t groups, n, k, m;
  };
  for (const Case& c : {Case{4, 128, 256, 1}, Case{4, 128, 256, 3}, Case{4, 128, 256, 9},
                        Case{4, 128, 256, 600}, Case{8, 512, 2048, 1}, Case{8, 512, 2048, 3}}) {
    const int64_t groups = c.groups, n = c.n, k = c.k, m = c.m, lda = groups * k;
    ASSERT_EQ(kernels::StagedGemvPreferredBatchedAtOneRow(groups, n, k), k == 2048);
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "groups " << groups << " n " << n << " k " << k << " m "
                                      << m << " seed " << seed);
    auto a = testing::RandomFloats(m * lda, seed);
    auto w = testing::RandomFloats(groups * n * k, seed + 1);
    const std::vector<uint16_t> a16 = FloatsToBf16Bits(a);
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    std::vector<float> want(m * groups * n);
    cpu16_.BatchedGemm(groups, m, n, k, ActivationView::Bf16(a16.data()), lda, k, CpuBf16(w, &keep),
                       k, n * k, want.data(), groups * n, n);
    const WeightView gw = GpuBf16(w, &keep);
    auto da = Upload(a), dc32 = Poisoned(want.size()), dc16 = Poisoned(want.size());
    auto da16 = gpu_->Allocate(a16.size() * sizeof(uint16_t));
    gpu_->CopyToDevice(a16.data(), a16.size() * sizeof(uint16_t), da16->data());
    gpu_->BatchedGemm(groups, m, n, k, da->as<float>(), lda, k, gw, k, n * k, dc32->as<float>(),
                      groups * n, n);
    gpu_->BatchedGemm(groups, m, n, k, ActivationView::Bf16(da16->as<uint16_t>()), lda, k, gw, k,
                      n * k, dc16->as<float>(), groups * n, n);
    const std::vector<float> got32 = Download(*dc32), got16 = Download(*dc16);
    EXPECT_TRUE(AllClose(got16, got32, 0, 0));
    EXPECT_TRUE(AllClose(got16, want, 2e-3, 1e-4));
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
  auto a = gpu_->Allocate(64 * sizeof(uint16_t));
  auto w = Upload(std::vector<float>(64 * 8, 1.0f));
  auto c = gpu_->Allocate(8 * sizeof(float));
  gpu_->BatchedGemm(1, 1, 8, 64, ActivationView::Bf16(a->as<uint16_t>()), 64, 0, w->as<float>(), 64,
                    0, c->as<float>(), 8, 0);
  EXPECT_EQ(gpu_->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gpu_->status().message().find("bf16 weights"), std::string::npos) << gpu_->status();
}

TEST_F(CudaBackendTest, Bf16ActivationWithFp32WeightsIsAnError) {
  auto a = gpu_->Allocate(64 * sizeof(uint16_t));
  auto w = Upload(std::vector<float>(64 * 8, 1.0f));
  auto c = gpu_->Allocate(8 * sizeof(float));
  gpu_->Gemm(1, 8, 64, ActivationView::Bf16(a->as<uint16_t>()), 64, w->as<float>(), 64,
             c->as<float>(), 8, false);
  EXPECT_EQ(gpu_->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gpu_->status().message().find("bf16 weights"), std::string::npos) << gpu_->status();
}

// CudaTuning::gemm_autotune (the default): bf16 Gemm from kGemmAutotuneMinRows rows through
// cuBLASLt's timed choice, against the CPU (fp32 and bf16 activations, accumulate), the same bits
// on a second call; fewer rows (decode) stay on cublasGemmEx.
TEST_F(CudaBackendTest, GemmAutotuneMatchesCpuAndLeavesDecodeSizesAlone) {
  const int64_t n = 576, k = 2048;
  ASSERT_TRUE(gpu_->tuning().gemm_autotune);
  for (int64_t m : {int64_t{64}, CudaBackend::kGemmAutotuneMinRows + 76}) {
    for (bool accumulate : {false, true}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m " << m << " accumulate " << accumulate << " seed " << seed);
      auto a = testing::RandomFloats(m * k, seed);
      auto w = testing::RandomFloats(n * k, seed + 1);
      auto out = testing::RandomFloats(m * n, seed + 2);
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<float> want = out;
      cpu16_.Gemm(m, n, k, a.data(), k, CpuBf16(w, &keep), k, want.data(), n, accumulate);
      const WeightView gw = GpuBf16(w, &keep);
      const size_t shapes_before = gpu_->gemm_autotuned_shapes();
      auto da = Upload(a), dc = Upload(out);
      gpu_->Gemm(m, n, k, da->as<float>(), k, gw, k, dc->as<float>(), n, accumulate);
      const std::vector<float> got = Download(*dc);
      EXPECT_TRUE(AllClose(got, want, 2e-3, 1e-4));
      EXPECT_EQ(gpu_->gemm_autotuned_shapes(),
                shapes_before + (m >= CudaBackend::kGemmAutotuneMinRows ? 1 : 0));
      if (!accumulate) {
        gpu_->Gemm(m, n, k, da->as<float>(), k, gw, k, dc->as<float>(), n, accumulate);
        EXPECT_TRUE(AllClose(Download(*dc), got, 0, 0));
      }
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// GateUpSiluMulBf16 at prefill sizes (fp32 and bf16 activations) against the CPU: its Gemm
// rounded to bf16, then SiluMulBf16 of those values (no swiglu_limit), or the CPU's
// V4Ops::SwiGluClamped of them rounded to bf16 (a limit: DeepSeek-V4's shared expert). cuBLAS
// sums in another order than the CPU, so a gate or up value may round to the neighbouring bf16
// (rarely): at most a few bf16 ulps apart, few elements. The gate / up values (about N(0, 2.3))
// cross the limit 2 on both sides. Through cuBLASLt's timed choice with bf16 activations (the
// default backend) and cublasGemmEx with fp32 ones (a backend with gemm_autotune off). It
// declines below kBf16GateUpMinRows rows and with fp32 weights, writing nothing.
TEST_F(CudaBackendTest, GateUpSiluMulBf16MatchesCpuGemmRoundedThenSiluMul) {
  const int64_t k = 2048, inter = 1408;
  constexpr float kLimit = 2.0f;
  CudaTuning plain_tuning;
  plain_tuning.gemm_autotune = false;
  auto plain = CudaBackend::Create(0, WeightDType::kBFloat16, plain_tuning);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (int64_t rows : {CudaBackend::kBf16GateUpMinRows, CudaBackend::kGemmAutotuneMinRows}) {
    for (bool a_bf16 : {false, true}) {
      CudaBackend* be = a_bf16 ? gpu_.get() : plain->get();
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "rows " << rows << " a_bf16 " << a_bf16 << " seed " << seed);
      auto a = testing::RandomFloats(rows * k, seed);
      auto w = testing::RandomFloats(2 * inter * k, seed + 1, 0.05f);
      std::vector<uint16_t> a16(a.size());
      for (size_t i = 0; i < a.size(); ++i) a16[i] = FloatToBf16Bits(a[i]);
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<float> gu(rows * 2 * inter);
      cpu16_.Gemm(rows, 2 * inter, k, ActivationView::Bf16(a16.data()), k, CpuBf16(w, &keep), k,
                  gu.data(), 2 * inter, false);
      for (float& v : gu) v = Bf16BitsToFloat(FloatToBf16Bits(v));
      // Gates above the limit, ups above it and below -limit: the clamp is exercised.
      int64_t gates_over = 0, ups_over = 0, ups_under = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < inter; ++i) {
          gates_over += gu[r * 2 * inter + i] > kLimit;
          ups_over += gu[r * 2 * inter + inter + i] > kLimit;
          ups_under += gu[r * 2 * inter + inter + i] < -kLimit;
        }
      }
      EXPECT_GT(std::min({gates_over, ups_over, ups_under}), rows * inter / 20);

      const WeightView gw = GpuBf16(w, &keep);
      auto da = Upload(a);
      auto da16 = gpu_->Allocate(a16.size() * sizeof(uint16_t));
      gpu_->CopyToDevice(a16.data(), a16.size() * sizeof(uint16_t), da16->data());
      const ActivationView av =
          a_bf16 ? ActivationView::Bf16(da16->as<uint16_t>()) : ActivationView(da->as<float>());
      for (const float limit : {0.0f, kLimit}) {
        SCOPED_TRACE(::testing::Message() << "swiglu_limit " << limit);
        std::vector<uint16_t> want(rows * inter), got(rows * inter);
        if (limit > 0.0f) {
          std::vector<float> act(rows * inter);
          cpu_.v4_ops()->SwiGluClamped(rows, inter, gu.data(), limit, act.data());
          for (size_t i = 0; i < act.size(); ++i) want[i] = FloatToBf16Bits(act[i]);
        } else {
          cpu_.SiluMulBf16(rows, inter, gu.data(), want.data());
        }
        auto dout = gpu_->Allocate(got.size() * sizeof(uint16_t));
        gpu_->Synchronize();  // be's stream does not wait for gpu_'s uploads
        ASSERT_TRUE(
            be->GateUpSiluMulBf16(rows, inter, k, av, k, gw, k, limit, dout->as<uint16_t>()));
        be->Synchronize();
        ASSERT_TRUE(be->status().ok()) << be->status();
        gpu_->CopyToHost(dout->data(), got.size() * sizeof(uint16_t), got.data());
        int64_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const float g = Bf16BitsToFloat(got[i]), x = Bf16BitsToFloat(want[i]);
          ASSERT_LE(std::abs(g - x), std::abs(x) / 32 + 1e-3f) << "element " << i;
          differ += got[i] != want[i];
        }
        EXPECT_LE(differ, static_cast<int64_t>(got.size()) / 20);
        std::cout << "[gate-up-silu-bf16] rows " << rows << " a_bf16 " << a_bf16 << " autotune "
                  << (be->gemm_autotuned_shapes() > 0) << " swiglu_limit " << limit << ": "
                  << differ << " of " << got.size() << " differ from the CPU\n";
      }
    }
  }
  // Declines, leaving out untouched.
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  const int64_t rows = CudaBackend::kBf16GateUpMinRows;
  auto w = testing::RandomFloats(2 * inter * k, 7, 0.05f);
  auto da = Upload(testing::RandomFloats(rows * k, 8));
  auto dout = gpu_->Allocate(rows * inter * sizeof(uint16_t));
  EXPECT_FALSE(gpu_->GateUpSiluMulBf16(rows - 1, inter, k, da->as<float>(), k, GpuBf16(w, &keep), k,
                                       /*swiglu_limit=*/0.0f, dout->as<uint16_t>()));
  auto dw32 = Upload(w);
  EXPECT_FALSE(gpu_->GateUpSiluMulBf16(rows, inter, k, da->as<float>(), k, dw32->as<float>(), k,
                                       /*swiglu_limit=*/0.0f, dout->as<uint16_t>()));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// GemmToBf16 at prefill sizes (fp32 and bf16 activations, a padded output row stride) against
// the CPU's Gemm rounded to bf16: cuBLAS sums in another order, so an element may round to the
// neighbouring bf16 (rarely). Through cuBLASLt's timed choice (the default backend) and
// cublasGemmEx (gemm_autotune off). The padding between rows is not written. It declines below
// kBf16GateUpMinRows rows and with fp32 weights, writing nothing.
TEST_F(CudaBackendTest, GemmToBf16MatchesCpuGemmRounded) {
  const int64_t k = 1024, n = 1536, ldc = n + 8;
  const uint16_t kUntouched = 0x7FC1;
  CudaTuning plain_tuning;
  plain_tuning.gemm_autotune = false;
  auto plain = CudaBackend::Create(0, WeightDType::kBFloat16, plain_tuning);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (int64_t rows : {CudaBackend::kBf16GateUpMinRows, CudaBackend::kGemmAutotuneMinRows}) {
    for (bool a_bf16 : {false, true}) {
      for (bool autotune : {false, true}) {
        CudaBackend* be = autotune ? gpu_.get() : plain->get();
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " a_bf16 " << a_bf16 << " autotune "
                                          << autotune << " seed " << seed);
        auto a = testing::RandomFloats(rows * k, seed);
        auto w = testing::RandomFloats(n * k, seed + 1, 0.05f);
        std::vector<uint16_t> a16(a.size());
        for (size_t i = 0; i < a.size(); ++i) a16[i] = FloatToBf16Bits(a[i]);
        std::vector<std::unique_ptr<DeviceBuffer>> keep;
        std::vector<float> want(rows * n);
        cpu16_.Gemm(rows, n, k, ActivationView::Bf16(a16.data()), k, CpuBf16(w, &keep), k,
                    want.data(), n, false);
        const WeightView gw = GpuBf16(w, &keep);
        auto da = Upload(a);
        auto da16 = gpu_->Allocate(a16.size() * sizeof(uint16_t));
        gpu_->CopyToDevice(a16.data(), a16.size() * sizeof(uint16_t), da16->data());
        const ActivationView av =
            a_bf16 ? ActivationView::Bf16(da16->as<uint16_t>()) : ActivationView(da->as<float>());
        std::vector<uint16_t> got(rows * ldc, kUntouched);
        auto dc = gpu_->Allocate(got.size() * sizeof(uint16_t));
        gpu_->CopyToDevice(got.data(), got.size() * sizeof(uint16_t), dc->data());
        gpu_->Synchronize();  // be's stream does not wait for gpu_'s uploads
        ASSERT_TRUE(be->GemmToBf16(rows, n, k, av, k, gw, k, dc->as<uint16_t>(), ldc));
        be->Synchronize();
        ASSERT_TRUE(be->status().ok()) << be->status();
        gpu_->CopyToHost(dc->data(), got.size() * sizeof(uint16_t), got.data());
        int64_t differ = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < ldc; ++j) {
            const uint16_t g = got[r * ldc + j];
            if (j >= n) {
              ASSERT_EQ(g, kUntouched) << "padding written at row " << r << " column " << j;
              continue;
            }
            const float x = want[r * n + j];
            ASSERT_LE(std::abs(Bf16BitsToFloat(g) - x), std::abs(x) / 128 + 1e-3f)
                << "row " << r << " column " << j;
            differ += g != FloatToBf16Bits(x);
          }
        }
        EXPECT_LE(differ, rows * n / 20);
        std::cout << "[gemm-to-bf16] rows " << rows << " a_bf16 " << a_bf16 << " autotune "
                  << autotune << ": " << differ << " of " << rows * n
                  << " differ from the CPU's rounded\n";
      }
    }
  }
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  const int64_t rows = CudaBackend::kBf16GateUpMinRows;
  auto w = testing::RandomFloats(n * k, 7, 0.05f);
  auto da = Upload(testing::RandomFloats(rows * k, 8));
  auto dc = gpu_->Allocate(rows * n * sizeof(uint16_t));
  EXPECT_FALSE(gpu_->GemmToBf16(rows - 1, n, k, da->as<float>(), k, GpuBf16(w, &keep), k,
                                dc->as<uint16_t>(), n));
  auto dw32 = Upload(w);
  EXPECT_FALSE(gpu_->GemmToBf16(rows, n, k, da->as<float>(), k, dw32->as<float>(), k,
                                dc->as<uint16_t>(), n));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// BatchedGemmToBf16 in DeepSeek-V4's grouped o_a layout (4 groups of heads: a's group g at
// column g * k of its row, c's at column g * n) at prefill rows, fp32 and bf16 activations,
// against the CPU's BatchedGemm rounded to bf16 (as GemmToBf16's test); it declines below
// kBf16GateUpMinRows rows and with fp32 weights.
TEST_F(CudaBackendTest, BatchedGemmToBf16MatchesCpuRounded) {
  const int64_t groups = 4, k = 512, n = 256, rows = CudaBackend::kBf16GateUpMinRows;
  for (bool a_bf16 : {false, true}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "a_bf16 " << a_bf16 << " seed " << seed);
    auto a = testing::RandomFloats(rows * groups * k, seed);
    auto w = testing::RandomFloats(groups * n * k, seed + 1, 0.05f);
    std::vector<uint16_t> a16(a.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = FloatToBf16Bits(a[i]);
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    std::vector<float> want(rows * groups * n);
    cpu16_.BatchedGemm(groups, rows, n, k, ActivationView::Bf16(a16.data()), groups * k, k,
                       CpuBf16(w, &keep), k, n * k, want.data(), groups * n, n);
    auto da = Upload(a);
    auto da16 = gpu_->Allocate(a16.size() * sizeof(uint16_t));
    gpu_->CopyToDevice(a16.data(), a16.size() * sizeof(uint16_t), da16->data());
    const ActivationView av =
        a_bf16 ? ActivationView::Bf16(da16->as<uint16_t>()) : ActivationView(da->as<float>());
    auto dc = gpu_->Allocate(want.size() * sizeof(uint16_t));
    ASSERT_TRUE(gpu_->BatchedGemmToBf16(groups, rows, n, k, av, groups * k, k, GpuBf16(w, &keep), k,
                                        n * k, dc->as<uint16_t>(), groups * n, n));
    std::vector<uint16_t> got(want.size());
    gpu_->CopyToHost(dc->data(), got.size() * sizeof(uint16_t), got.data());
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float x = want[i];
      ASSERT_LE(std::abs(Bf16BitsToFloat(got[i]) - x), std::abs(x) / 128 + 1e-3f) << i;
      differ += got[i] != FloatToBf16Bits(x);
    }
    EXPECT_LE(differ, static_cast<int64_t>(got.size()) / 20);
    std::cout << "[batched-gemm-to-bf16] a_bf16 " << a_bf16 << ": " << differ << " of "
              << got.size() << " differ from the CPU's rounded\n";
  }
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  auto w = testing::RandomFloats(groups * n * k, 7, 0.05f);
  auto da = Upload(testing::RandomFloats(rows * groups * k, 8));
  auto dc = gpu_->Allocate(rows * groups * n * sizeof(uint16_t));
  EXPECT_FALSE(gpu_->BatchedGemmToBf16(groups, rows - 1, n, k, da->as<float>(), groups * k, k,
                                       GpuBf16(w, &keep), k, n * k, dc->as<uint16_t>(), groups * n,
                                       n));
  auto dw32 = Upload(w);
  EXPECT_FALSE(gpu_->BatchedGemmToBf16(groups, rows, n, k, da->as<float>(), groups * k, k,
                                       dw32->as<float>(), k, n * k, dc->as<uint16_t>(), groups * n,
                                       n));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The backend ops behind the model's fused step, against the CPU reference.
TEST_F(CudaBackendTest, AddRmsNormAndSiluMulBf16MatchCpu) {
  const int64_t rows = 5, dim = 2048, inter = 1408;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  auto x = testing::RandomFloats(rows * dim, seed, 3.0f);
  auto y = testing::RandomFloats(rows * dim, seed + 1);
  auto wn = testing::RandomFloats(dim, seed + 2);
  std::vector<float> cx = x, cout(rows * dim);
  std::vector<uint16_t> c16(rows * dim);
  cpu_.AddRmsNorm(rows, dim, cx.data(), y.data(), wn.data(), 1e-6f, cout.data(), c16.data());
  auto dx = Upload(x), dy = Upload(y), dwn = Upload(wn), dout = Poisoned(rows * dim);
  auto d16 = gpu_->Allocate(rows * dim * sizeof(uint16_t));
  gpu_->AddRmsNorm(rows, dim, dx->as<float>(), dy->as<float>(), dwn->as<float>(), 1e-6f,
                   dout->as<float>(), d16->as<uint16_t>());
  EXPECT_TRUE(AllClose(Download(*dx), cx, 0, 0));
  const std::vector<float> got = Download(*dout);
  EXPECT_TRUE(AllClose(got, cout, 1e-5, 1e-5));
  std::vector<uint16_t> g16(rows * dim);
  gpu_->CopyToHost(d16->data(), g16.size() * sizeof(uint16_t), g16.data());
  for (int64_t i = 0; i < rows * dim; ++i) {
    ASSERT_EQ(g16[i], FloatToBf16Bits(got[i])) << "element " << i;  // its own fp32 output, rounded
  }

  auto g = testing::RandomFloats(rows * 2 * inter, seed + 3, 4.0f);
  std::vector<uint16_t> want(rows * inter), act(rows * inter);
  cpu_.SiluMulBf16(rows, inter, g.data(), want.data());
  auto dg = Upload(g);
  auto dact = gpu_->Allocate(act.size() * sizeof(uint16_t));
  gpu_->SiluMulBf16(rows, inter, dg->as<float>(), dact->as<uint16_t>());
  gpu_->CopyToHost(dact->data(), act.size() * sizeof(uint16_t), act.data());
  int64_t differ = 0;
  for (size_t i = 0; i < act.size(); ++i) {
    // expf may differ from glibc's in the last fp32 bit, which can move the bf16 rounding by
    // one bf16 ulp (rarely); never more.
    const float a = Bf16BitsToFloat(act[i]), b = Bf16BitsToFloat(want[i]);
    ASSERT_LE(std::abs(a - b), std::abs(b) / 128 + 1e-30f) << "element " << i;
    differ += act[i] != want[i];
  }
  EXPECT_LE(differ, static_cast<int64_t>(act.size()) / 1000);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// AddRmsNormGemms (attention's q and kv_a projections; DeepSeek-V4's seven projections of one
// norm) against the CPU backend's default (the ops one by one), as CudaBackend runs it (the
// staged GEMV with the norm fused at one row, four GEMMs per launch and x += y in the first;
// AddRmsNorm + one staged launch at two rows; the ops above) and as Backend's ops on this
// backend; x += y bit for bit, the GEMMs within the bf16 bound (a last-ulp difference of the norm
// may move a bf16 operand by one ulp).
TEST_F(CudaBackendTest, AddRmsNormGemmsMatchesCpu) {
  const int64_t dim = 2048;
  for (const std::vector<int64_t>& widths :
       {std::vector<int64_t>{3072, 576}, std::vector<int64_t>{1024, 512, 256, 256, 64, 40, 8}}) {
    for (const bool fused : {true, false}) {
      for (int64_t rows : {1, 2, 3, 4, 6}) {
        for (bool with_y : {true, false}) {
          const uint32_t seed = testing::FreshSeed();
          SCOPED_TRACE(::testing::Message()
                       << (fused ? "CudaBackend" : "Backend's ops") << " rows " << rows
                       << " with_y " << with_y << " gemms " << widths.size() << " seed " << seed);
          auto x = testing::RandomFloats(rows * dim, seed, 3.0f);
          auto y = testing::RandomFloats(rows * dim, seed + 1);
          auto wn = testing::RandomFloats(dim, seed + 2);
          std::vector<std::unique_ptr<DeviceBuffer>> keep;
          std::vector<float> cx = x;
          std::vector<uint16_t> c16(rows * dim);
          std::vector<std::vector<float>> want(widths.size());
          std::vector<std::unique_ptr<DeviceBuffer>> got;
          std::vector<NormedGemm> cpu_gemms, gpu_gemms;
          for (size_t t = 0; t < widths.size(); ++t) {
            const int64_t n = widths[t];
            auto w = testing::RandomFloats(n * dim, seed + 3 + static_cast<uint32_t>(t));
            want[t].resize(rows * n);
            cpu_gemms.push_back({n, CpuBf16(w, &keep), dim, want[t].data(), n});
            got.push_back(Poisoned(rows * n));
            gpu_gemms.push_back({n, GpuBf16(w, &keep), dim, got.back()->as<float>(), n});
          }
          cpu16_.AddRmsNormGemms(rows, dim, cx.data(), with_y ? y.data() : nullptr, wn.data(),
                                 1e-6f, nullptr, c16.data(), cpu_gemms);
          auto dx = Upload(x), dy = Upload(y), dwn = Upload(wn);
          // Poisoned (bf16 NaN): the normed rows are scratch, which a fused path may leave
          // unwritten (Backend::AddRmsNormGemms).
          auto d16 = gpu_->Allocate(rows * dim * sizeof(uint16_t));
          ASSERT_EQ(cudaMemset(d16->data(), 0xFF, rows * dim * sizeof(uint16_t)), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const float* gy = with_y ? dy->as<float>() : nullptr;
          if (fused) {
            gpu_->AddRmsNormGemms(rows, dim, dx->as<float>(), gy, dwn->as<float>(), 1e-6f, nullptr,
                                  d16->as<uint16_t>(), gpu_gemms);
          } else {
            gpu_->Backend::AddRmsNormGemms(rows, dim, dx->as<float>(), gy, dwn->as<float>(), 1e-6f,
                                           nullptr, d16->as<uint16_t>(), gpu_gemms);
          }
          EXPECT_TRUE(AllClose(Download(*dx), cx, 0, 0));
          std::vector<uint16_t> g16(rows * dim);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(g16.data(), d16->data(), g16.size() * sizeof(uint16_t),
                               cudaMemcpyDeviceToHost),
                    cudaSuccess);
          if (std::all_of(g16.begin(), g16.end(), [](uint16_t v) { return v == 0xFFFF; })) {
            // Fused, the normed rows unwritten: the GEMMs against the CPU's op.
            for (size_t t = 0; t < widths.size(); ++t) {
              EXPECT_TRUE(AllClose(Download(*got[t]), want[t], 5e-2, 1e-3)) << "gemm " << t;
            }
            continue;
          }
          // The normed rows in bf16: the CPU's within one bf16 step (the inverse rms is summed in
          // another order, so a value next to a rounding boundary may round the other way).
          int64_t differ = 0;
          for (size_t i = 0; i < g16.size(); ++i) {
            if (g16[i] == c16[i]) continue;
            ++differ;
            const float g = Bf16BitsToFloat(g16[i]), c = Bf16BitsToFloat(c16[i]);
            const float step = std::ldexp(1.0f, std::ilogb(std::max(std::abs(c), 1e-30f)) - 7);
            ASSERT_LE(std::abs(g - c), step) << "normed element " << i << ": " << g << " vs " << c;
          }
          EXPECT_LE(differ, static_cast<int64_t>(g16.size()) / 100) << "normed elements off";
          if (differ > 0) {
            std::cout << "[add-rms-norm-gemms] seed " << seed << " rows " << rows << ": " << differ
                      << " normed bf16 values one step from the CPU's\n";
          }
          // The GEMMs against the CPU's on the GPU's normed rows (a one-step difference there,
          // times weights of up to ~4, would move an output by up to ~0.1 on its own).
          for (size_t t = 0; t < widths.size(); ++t) {
            std::vector<float> on_gpu_rows(want[t].size());
            cpu16_.Gemm(rows, widths[t], dim, ActivationView::Bf16(g16.data()), dim, cpu_gemms[t].w,
                        dim, on_gpu_rows.data(), widths[t], false);
            EXPECT_TRUE(AllClose(Download(*got[t]), on_gpu_rows, 5e-2, 1e-3)) << "gemm " << t;
          }
        }
      }
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// One- and two-row bf16 GEMMs at the decode shapes (the staged GEMV or the small-m kernel by
// shape), against the CPU backend.
TEST_F(CudaBackendTest, OneAndTwoRowGemmsMatchCpu) {
  struct Case {
    int64_t n, k, ldw, ldc;
    bool accumulate;
  };
  for (const int64_t m : {1, 2}) {
    for (const Case& c :
         {Case{2048, 2048, 2048, 2048, true}, Case{3072, 2048, 2056, 3080, false},
          Case{2048, 1408, 1408, 2048, true}, Case{2048, 2816, 2816, 2052, false}}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m " << m << " n " << c.n << " k " << c.k << " seed " << seed);
      auto a = testing::RandomFloats(m * c.k, seed);
      auto w = testing::RandomFloats(c.n * c.ldw, seed + 1);
      auto out = testing::RandomFloats(m * c.ldc, seed + 2);
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<float> want = out;
      cpu16_.Gemm(m, c.n, c.k, a.data(), c.k, CpuBf16(w, &keep), c.ldw, want.data(), c.ldc,
                  c.accumulate);
      auto da = Upload(a), dc = Upload(out);
      gpu_->Gemm(m, c.n, c.k, da->as<float>(), c.k, GpuBf16(w, &keep), c.ldw, dc->as<float>(),
                 c.ldc, c.accumulate);
      const std::vector<float> got = Download(*dc);
      EXPECT_TRUE(AllClose(got, want, 1e-3, 1e-4));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = c.n; j < c.ldc; ++j) {
          ASSERT_EQ(got[i * c.ldc + j], out[i * c.ldc + j]) << "padding written";
        }
      }
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// Group g's rows times its own weights, with fp32 and with bf16 weights (against the CPU's
// GroupedGemm of the same rounded values).
TEST_F(CudaBackendTest, GroupedGemmUsesEachGroupsWeights) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n = 96, k = 64;
  const std::vector<int64_t> offsets = {0, 3, 3, 11, 12};
  const int64_t rows = offsets.back();
  auto a = testing::RandomFloats(rows * k, seed);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 weights" : "fp32 weights");
    std::vector<std::vector<float>> w;
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    std::vector<WeightView> wc, wg;
    for (size_t g = 0; g + 1 < offsets.size(); ++g) {
      w.push_back(testing::RandomFloats(n * k, seed + 1 + g));
      if (bf16) {
        wc.push_back(CpuBf16(w.back(), &keep));
        wg.push_back(GpuBf16(w.back(), &keep));
      } else {
        keep.push_back(Upload(w.back()));
        wc.push_back(w.back().data());
        wg.push_back(keep.back()->as<float>());
      }
    }
    std::vector<float> want(rows * n);
    (bf16 ? cpu16_ : cpu_).GroupedGemm(offsets, wc, n, k, a.data(), want.data());
    auto da = Upload(a);
    auto dc = Poisoned(rows * n);
    gpu_->GroupedGemm(offsets, wg, n, k, da->as<float>(), dc->as<float>());
    EXPECT_TRUE(AllClose(Download(*dc), want, bf16 ? 1e-3 : 1e-4, bf16 ? 1e-4 : 1e-5));
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

}  // namespace
}  // namespace deepinfer
