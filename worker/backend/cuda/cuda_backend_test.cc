// CudaBackend against CpuBackend for what only the backend does (cuBLAS GEMM layout with
// strides and accumulation, grouped GEMM with empty groups, zeroed allocations, copies) and for
// its error reporting. The per-kernel ops are covered in kernels/*/ tests.
#include "worker/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/mla_attention.h"
#include "kernels/common/pdl.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;

// The call count in an op timing report's line for `op` ("  <op> <calls> calls <ms> ms ..."),
// or -1 if there is no such line.
int64_t CallsOf(const std::string& report, const std::string& op) {
  std::istringstream lines(report);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    int64_t calls = -1;
    if (words >> name >> calls && name == op) return calls;
  }
  return -1;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }
  // Device copy of a host vector.
  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& v) {
    auto buf = gpu_->Allocate(v.size() * sizeof(float));
    gpu_->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
    return buf;
  }
  std::vector<float> Download(const DeviceBuffer& buf) {
    std::vector<float> v(buf.size_bytes() / sizeof(float));
    gpu_->CopyToHost(buf.data(), buf.size_bytes(), v.data());
    return v;
  }
  // A buffer filled with NaN, so elements an op fails to write are caught.
  std::unique_ptr<DeviceBuffer> Poisoned(size_t n) {
    return Upload(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
  }

  // The device side of a decode-attention case whose CpuBackend side `cpu` attends over the
  // `cached` entries of kv (latent then rope, entry_dim() floats each) written at `slots` into
  // a cache of `cache_elems` values (cpu.cache's layout): the same inputs uploaded, the cache
  // written by this backend, and `args` = cpu repointed at them (out_latent left to the caller).
  struct DeviceMla {
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    MlaAttentionArgs args;
  };
  DeviceMla UploadMla(const MlaAttentionArgs& cpu, int64_t cached, const std::vector<float>& kv,
                      const std::vector<int32_t>& slots, const std::vector<int32_t>& tables,
                      const std::vector<int32_t>& token_seq,
                      const std::vector<int32_t>& context_len, const std::vector<float>& q_latent,
                      const std::vector<float>& q_rope, size_t cache_elems) {
    DeviceMla d;
    auto keep = [&](std::unique_ptr<DeviceBuffer> b) {
      d.buffers.push_back(std::move(b));
      return d.buffers.back().get();
    };
    auto ints = [&](const std::vector<int32_t>& v) {
      auto buf = gpu_->Allocate(v.size() * sizeof(int32_t));
      gpu_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
      return keep(std::move(buf))->as<int32_t>();
    };
    const float* dkv = keep(Upload(kv))->as<float>();
    const int32_t* dslots = ints(slots);
    PagedLatentCacheView view = cpu.cache;
    view.cache = keep(gpu_->Allocate(cache_elems * WeightDTypeSize(view.dtype)))->data();
    const int32_t entry = view.entry_dim();
    gpu_->WriteLatentCache(cached, dkv, entry, dkv + view.latent_dim, entry, dslots, view);
    d.args = cpu;
    d.args.q_latent = keep(Upload(q_latent))->as<float>();
    d.args.q_rope = keep(Upload(q_rope))->as<float>();
    d.args.cache = view;
    d.args.block_tables = ints(tables);
    d.args.token_seq = ints(token_seq);
    d.args.context_len = ints(context_len);
    return d;
  }

  // Both as bf16 weights: the same rounded values on each side (WeightView of UploadWeight).
  WeightView CpuBf16(const std::vector<float>& w,
                     std::vector<std::unique_ptr<DeviceBuffer>>* keep) {
    keep->push_back(cpu16_.UploadWeight(w.data(), w.size()));
    return WeightView(keep->back()->data(), WeightDType::kBFloat16);
  }
  WeightView GpuBf16(const std::vector<float>& w,
                     std::vector<std::unique_ptr<DeviceBuffer>>* keep) {
    keep->push_back(gpu_->UploadWeight(w.data(), w.size()));
    return WeightView(keep->back()->data(), WeightDType::kBFloat16);
  }

  CpuBackend cpu_{2};
  CpuBackend cpu16_{2, WeightDType::kBFloat16};
  std::unique_ptr<CudaBackend> gpu_;
};

TEST_F(CudaBackendTest, AllocateIsZeroedAndCopiesRoundTrip) {
  auto buf = gpu_->Allocate(1001 * sizeof(float));
  EXPECT_EQ(buf->size_bytes(), 1001 * sizeof(float));
  EXPECT_EQ(Download(*buf), std::vector<float>(1001, 0.0f));
  auto v = testing::RandomFloats(1001, testing::FreshSeed());
  auto src = Upload(v);
  gpu_->CopyDeviceToDevice(src->data(), v.size() * sizeof(float), buf->data());
  EXPECT_EQ(Download(*buf), v);
  EXPECT_NE(gpu_->Allocate(0)->data(), nullptr);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// Small scratch allocations go beside the kernel chain in recordings of at most
// SetGraphAllocationsAsideMaxTokens tokens (default 1), in every recording with
// SetGraphAllocationsAside(true), never outside a recording or above 64 KiB; the replay
// computes what the eager ops do either way.
TEST_F(CudaBackendTest, SmallAllocationsAsideByTheRecordedTokens) {
  if (!kernels::ProgrammaticDependentLaunchEnabled()) GTEST_SKIP() << "PDL is off";
  const std::vector<float> v = testing::RandomFloats(1000, testing::FreshSeed());
  auto src = Upload(v);
  auto dst = gpu_->Allocate(v.size() * sizeof(float));
  // One recording: a small and a large scratch buffer between two copies; returns how many
  // allocations went aside, after checking the replay's result.
  auto record = [&](int64_t tokens) -> int64_t {
    const int64_t before = gpu_->AsideAllocations();
    auto ops = gpu_->Capture(
        [&] {
          auto small = gpu_->AllocateScratch(v.size() * sizeof(float));
          auto large = gpu_->AllocateScratch(CudaBackend::kMaxAsideAllocationBytes + 256);
          gpu_->CopyDeviceToDevice(src->data(), v.size() * sizeof(float), small->data());
          gpu_->CopyDeviceToDevice(small->data(), v.size() * sizeof(float), dst->data());
          return absl::OkStatus();
        },
        CaptureOptions{tokens});
    EXPECT_TRUE(ops.ok()) << ops.status();
    if (!ops.ok()) return -1;
    gpu_->CopyToDevice(std::vector<float>(v.size(), -1.0f).data(), v.size() * sizeof(float),
                       dst->data());
    EXPECT_TRUE((*ops)->Replay().ok());
    EXPECT_EQ(Download(*dst), v) << "tokens " << tokens;
    return gpu_->AsideAllocations() - before;
  };
  EXPECT_EQ(record(1), 1);  // the default: one token
  EXPECT_EQ(record(2), 0);
  EXPECT_EQ(record(0), 0);  // tokens not known
  gpu_->SetGraphAllocationsAsideMaxTokens(4);
  EXPECT_EQ(record(4), 1);
  EXPECT_EQ(record(5), 0);
  gpu_->SetGraphAllocationsAsideMaxTokens(0);
  EXPECT_EQ(record(1), 0);
  gpu_->SetGraphAllocationsAside(true);
  EXPECT_EQ(record(0), 1);
  EXPECT_EQ(record(64), 1);
  const int64_t before = gpu_->AsideAllocations();
  auto eager = gpu_->AllocateScratch(64);  // outside a recording: in stream order
  EXPECT_EQ(gpu_->AsideAllocations(), before);
  gpu_->SetGraphAllocationsAside(false);
  gpu_->SetGraphAllocationsAsideMaxTokens(1);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The dummy load format's weights made by the kernel: the same bits as the host computes
// (Backend::FillDummy, the base implementation), fp32 and bf16, random and constant recipes, a
// size that is no multiple of the grid and larger than one grid pass; the bytes after the
// filled range stay untouched.
TEST_F(CudaBackendTest, FillDummyKernelEqualsHostFill) {
  DummyFill random;
  random.key = 0x9e3779b97f4a7c15ull;
  random.amplitude = 0.0625f;
  DummyFill constant;
  constant.constant = true;
  constant.value = 1.0f;
  const int64_t n = (int64_t{1} << 24) + 12345;  // > 65536 blocks x 256 threads
  for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    for (const DummyFill& fill : {random, constant}) {
      SCOPED_TRACE(::testing::Message()
                   << WeightDTypeName(dtype) << (fill.constant ? " constant" : " random"));
      const size_t bytes = static_cast<size_t>(n) * WeightDTypeSize(dtype);
      auto want = gpu_->Allocate(bytes + 64);
      auto got = gpu_->Allocate(bytes + 64);
      gpu_->Backend::FillDummy(fill, n, dtype, want->data());
      gpu_->FillDummy(fill, n, dtype, got->data());
      std::vector<uint8_t> w(bytes + 64), g(bytes + 64);
      gpu_->CopyToHost(want->data(), w.size(), w.data());
      gpu_->CopyToHost(got->data(), g.size(), g.data());
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      EXPECT_TRUE(w == g);
      EXPECT_EQ(std::count(g.end() - 64, g.end(), 0), 64);  // Allocate zeroes; nothing past n
    }
  }
}

TEST_F(CudaBackendTest, GemmMatchesCpuWithStridesAndAccumulate) {
  struct Case {
    int64_t m, n, k, lda, ldw, ldc;
  };
  // One row, k 2048 / 2816: the staged GEMV (kernels/gemm/staged_gemv.h) by default.
  for (Case c : {Case{1, 129, 96, 96, 96, 129}, Case{37, 29, 45, 50, 47, 31},
                 Case{130, 512, 1024, 1030, 1024, 520}, Case{5, 3, 0, 1, 1, 3},
                 Case{1, 576, 2048, 2048, 2048, 576}, Case{1, 1000, 2816, 2824, 2816, 1003}}) {
    for (bool accumulate : {false, true}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k
                                        << " accumulate " << accumulate << " seed " << seed);
      auto a = testing::RandomFloats(c.m * c.lda, seed);
      auto w = testing::RandomFloats(c.n * c.ldw, seed + 1);
      auto out = testing::RandomFloats(c.m * c.ldc, seed + 2);
      std::vector<float> want = out;
      cpu_.Gemm(c.m, c.n, c.k, a.data(), c.lda, w.data(), c.ldw, want.data(), c.ldc, accumulate);
      auto da = Upload(a), dw = Upload(w), dc = Upload(out);
      gpu_->Gemm(c.m, c.n, c.k, da->as<float>(), c.lda, dw->as<float>(), c.ldw, dc->as<float>(),
                 c.ldc, accumulate);
      // fp32 sums of up to 1024 products of N(0,1) values (|c| ~ 32) in another order.
      EXPECT_TRUE(AllClose(Download(*dc), want, 2e-4, 1e-5));
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// bf16 x bf16 products are exact in fp32 on both sides (the CPU widens the rounded operands,
// cuBLAS multiplies them on tensor cores), so only the fp32 summation order differs; the bound
// is a little looser than fp32's because the tensor cores' accumulation order is coarser.
TEST_F(CudaBackendTest, Bf16GemmMatchesCpuBf16WithStridesAndAccumulate) {
  ASSERT_EQ(gpu_->weight_dtype(), WeightDType::kBFloat16);
  struct Case {
    int64_t m, n, k, lda, ldw, ldc;
  };
  for (Case c : {Case{1, 129, 96, 96, 96, 129}, Case{37, 29, 45, 50, 47, 31},
                 Case{130, 512, 1024, 1030, 1024, 520}, Case{5, 3, 0, 1, 1, 3}}) {
    for (bool accumulate : {false, true}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k
                                        << " accumulate " << accumulate << " seed " << seed);
      auto a = testing::RandomFloats(c.m * c.lda, seed);
      auto w = testing::RandomFloats(c.n * c.ldw, seed + 1);
      auto out = testing::RandomFloats(c.m * c.ldc, seed + 2);
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<float> want = out;
      cpu16_.Gemm(c.m, c.n, c.k, a.data(), c.lda, CpuBf16(w, &keep), c.ldw, want.data(), c.ldc,
                  accumulate);
      auto da = Upload(a), dc = Upload(out);
      gpu_->Gemm(c.m, c.n, c.k, da->as<float>(), c.lda, GpuBf16(w, &keep), c.ldw, dc->as<float>(),
                 c.ldc, accumulate);
      const auto r = AllClose(Download(*dc), want, 1e-3, 1e-4);
      EXPECT_TRUE(r);
      std::cout << "[bf16-gemm] m " << c.m << " n " << c.n << " k " << c.k << ": " << r.message()
                << "\n";
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The absorbed-MLA layouts: W_uk (a = the nope slice of each head of q, w = per-head [kvl, nope]
// blocks) and W_uv (a = per-head latent slices, w = the value rows of kv_b, strided).
class BatchedGemmTest : public CudaBackendTest,
                        public ::testing::WithParamInterface<std::tuple<int64_t, bool>> {};

// T = 9 tokens (cuBLAS), and T = 1 (decode) with the small-m kernel on and off.
INSTANTIATE_TEST_SUITE_P(TokensAndSmallM, BatchedGemmTest,
                         ::testing::Values(std::make_tuple(int64_t{9}, true),
                                           std::make_tuple(int64_t{1}, true),
                                           std::make_tuple(int64_t{1}, false),
                                           std::make_tuple(int64_t{3}, true)));

TEST_P(BatchedGemmTest, MatchesCpuFp32AndBf16) {
  gpu_->SetSmallMGemm(std::get<1>(GetParam()));
  // Both small-m layouts (the shapes' k is below the split-k threshold of kAuto).
  for (const kernels::SmallMGemmAlgo small_m_algo :
       {kernels::SmallMGemmAlgo::kRowPerGroup, kernels::SmallMGemmAlgo::kSplitK}) {
    gpu_->SetSmallMGemmAlgo(small_m_algo);
    SCOPED_TRACE(::testing::Message() << "small-m algo " << static_cast<int>(small_m_algo));
    const int64_t T = std::get<0>(GetParam()), nh = 16, nope = 128, rope = 64, vd = 128, kvl = 512,
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
        const WeightView cw =
            dt == WeightDType::kFloat32 ? WeightView(w.data()) : CpuBf16(w, &keep);
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
        std::cout << "[batched-gemm] " << c.name << " " << WeightDTypeName(dt) << ": "
                  << r.message() << "\n";
      }
    }
  }
  gpu_->SetSmallMGemmAlgo(kernels::SmallMGemmAlgo::kAuto);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// A bf16 activation operand (what AddRmsNorm / SiluMulBf16 write) gives bit for bit what the
// fp32 operand it was rounded from gives, on cuBLAS (m > 4, or small-m off) and on the small-m
// kernel; both within the bf16 bound of the CPU.
TEST_F(CudaBackendTest, Bf16ActivationOperandGivesTheSameBitsAsRoundingInGemm) {
  const int64_t n = 576, k = 2048;
  for (int64_t m : {1, 3, 4, 9, 130}) {
    for (bool small_m : {true, false}) {
      for (bool accumulate : {false, true}) {
        gpu_->SetSmallMGemm(small_m);
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "m " << m << " small_m " << small_m << " accumulate "
                                          << accumulate << " seed " << seed);
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
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
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

// SetGemmAutotune: bf16 Gemm from kGemmAutotuneMinRows rows through cuBLASLt's timed choice,
// against the CPU (fp32 and bf16 activations, accumulate), the same bits on a second call;
// fewer rows (decode) stay on cublasGemmEx.
TEST_F(CudaBackendTest, GemmAutotuneMatchesCpuAndLeavesDecodeSizesAlone) {
  const int64_t n = 576, k = 2048;
  gpu_->SetGemmAutotune(true);
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
  gpu_->SetGemmAutotune(false);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// GateUpSiluMulBf16 at prefill sizes (fp32 and bf16 activations) against the CPU: its Gemm
// rounded to bf16, then SiluMulBf16 of those values. cuBLAS sums in another order than the CPU,
// so a gate or up value may round to the neighbouring bf16 (rarely): at most a few bf16 ulps
// apart, few elements. It declines below kBf16GateUpMinRows rows, with fp32 weights and when
// switched off, writing nothing.
TEST_F(CudaBackendTest, GateUpSiluMulBf16MatchesCpuGemmRoundedThenSiluMul) {
  const int64_t k = 2048, inter = 1408;
  for (int64_t rows : {CudaBackend::kBf16GateUpMinRows, CudaBackend::kGemmAutotuneMinRows}) {
    for (bool a_bf16 : {false, true}) {
      gpu_->SetGemmAutotune(rows >= CudaBackend::kGemmAutotuneMinRows && a_bf16);
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
      std::vector<uint16_t> want(rows * inter), got(rows * inter);
      cpu_.SiluMulBf16(rows, inter, gu.data(), want.data());

      const WeightView gw = GpuBf16(w, &keep);
      auto da = Upload(a);
      auto da16 = gpu_->Allocate(a16.size() * sizeof(uint16_t));
      gpu_->CopyToDevice(a16.data(), a16.size() * sizeof(uint16_t), da16->data());
      const ActivationView av =
          a_bf16 ? ActivationView::Bf16(da16->as<uint16_t>()) : ActivationView(da->as<float>());
      auto dout = gpu_->Allocate(got.size() * sizeof(uint16_t));
      ASSERT_TRUE(gpu_->GateUpSiluMulBf16(rows, inter, k, av, k, gw, k, dout->as<uint16_t>()));
      gpu_->CopyToHost(dout->data(), got.size() * sizeof(uint16_t), got.data());
      int64_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const float g = Bf16BitsToFloat(got[i]), x = Bf16BitsToFloat(want[i]);
        ASSERT_LE(std::abs(g - x), std::abs(x) / 32 + 1e-3f) << "element " << i;
        differ += got[i] != want[i];
      }
      EXPECT_LE(differ, static_cast<int64_t>(got.size()) / 20);
      std::cout << "[gate-up-silu-bf16] rows " << rows << " a_bf16 " << a_bf16 << " autotune "
                << (gpu_->gemm_autotuned_shapes() > 0) << ": " << differ << " of " << got.size()
                << " differ from the CPU\n";
      gpu_->SetGemmAutotune(false);
    }
  }
  // Declines, leaving out untouched.
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  const int64_t rows = CudaBackend::kBf16GateUpMinRows;
  auto w = testing::RandomFloats(2 * inter * k, 7, 0.05f);
  auto da = Upload(testing::RandomFloats(rows * k, 8));
  auto dout = gpu_->Allocate(rows * inter * sizeof(uint16_t));
  EXPECT_FALSE(gpu_->GateUpSiluMulBf16(rows - 1, inter, k, da->as<float>(), k, GpuBf16(w, &keep), k,
                                       dout->as<uint16_t>()));
  auto dw32 = Upload(w);
  EXPECT_FALSE(gpu_->GateUpSiluMulBf16(rows, inter, k, da->as<float>(), k, dw32->as<float>(), k,
                                       dout->as<uint16_t>()));
  gpu_->SetBf16GateUp(false);
  EXPECT_FALSE(gpu_->GateUpSiluMulBf16(rows, inter, k, da->as<float>(), k, GpuBf16(w, &keep), k,
                                       dout->as<uint16_t>()));
  gpu_->SetBf16GateUp(true);
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

// AddRmsNormGemms (attention's q and kv_a projections) against the CPU backend's default (the
// ops one by one): fused at one row (StagedGemv kNorm / kAll), AddRmsNorm + one staged launch at
// two rows (with SetStagedGemvMaxRows(2)), the default otherwise and with kOff; x += y bit for bit,
// the GEMMs within the bf16 bound (a last-ulp difference of the norm may move a bf16 operand by one
// ulp).
TEST_F(CudaBackendTest, AddRmsNormGemmsMatchesCpu) {
  const int64_t dim = 2048, nq = 3072, nkv = 576;
  for (const auto& [use, max_rows] : {std::pair{CudaBackend::StagedGemv::kAll, int64_t{2}},
                                      std::pair{CudaBackend::StagedGemv::kAll, int64_t{1}},
                                      std::pair{CudaBackend::StagedGemv::kNorm, int64_t{2}},
                                      std::pair{CudaBackend::StagedGemv::kOff, int64_t{2}}}) {
    gpu_->SetStagedGemv(use);
    gpu_->SetStagedGemvMaxRows(max_rows);
    for (int64_t rows : {1, 2, 3, 4, 6}) {
      for (bool with_y : {true, false}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << "staged " << static_cast<int>(use) << " max rows " << max_rows << " rows "
                     << rows << " with_y " << with_y << " seed " << seed);
        auto x = testing::RandomFloats(rows * dim, seed, 3.0f);
        auto y = testing::RandomFloats(rows * dim, seed + 1);
        auto wn = testing::RandomFloats(dim, seed + 2);
        auto wq = testing::RandomFloats(nq * dim, seed + 3);
        auto wkv = testing::RandomFloats(nkv * dim, seed + 4);
        std::vector<std::unique_ptr<DeviceBuffer>> keep;
        std::vector<float> cx = x, cq(rows * nq), ckv(rows * nkv);
        std::vector<uint16_t> c16(rows * dim);
        cpu16_.AddRmsNormGemms(rows, dim, cx.data(), with_y ? y.data() : nullptr, wn.data(), 1e-6f,
                               nullptr, c16.data(),
                               {{nq, CpuBf16(wq, &keep), dim, cq.data(), nq},
                                {nkv, CpuBf16(wkv, &keep), dim, ckv.data(), nkv}});
        auto dx = Upload(x), dy = Upload(y), dwn = Upload(wn);
        auto dq = Poisoned(rows * nq), dkv = Poisoned(rows * nkv);
        auto d16 = gpu_->Allocate(rows * dim * sizeof(uint16_t));
        gpu_->AddRmsNormGemms(rows, dim, dx->as<float>(), with_y ? dy->as<float>() : nullptr,
                              dwn->as<float>(), 1e-6f, nullptr, d16->as<uint16_t>(),
                              {{nq, GpuBf16(wq, &keep), dim, dq->as<float>(), nq},
                               {nkv, GpuBf16(wkv, &keep), dim, dkv->as<float>(), nkv}});
        EXPECT_TRUE(AllClose(Download(*dx), cx, 0, 0));
        EXPECT_TRUE(AllClose(Download(*dq), cq, 5e-2, 1e-3));
        EXPECT_TRUE(AllClose(Download(*dkv), ckv, 5e-2, 1e-3));
      }
    }
  }
  gpu_->SetStagedGemv(CudaBackend::StagedGemv::kAll);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// One- and two-row bf16 GEMMs at the decode shapes, with the staged GEMV taking one row only and
// up to two rows (then o_proj and the down projections at two rows take it too), against the CPU
// backend.
TEST_F(CudaBackendTest, OneAndTwoRowGemmsMatchCpu) {
  struct Case {
    int64_t n, k, ldw, ldc;
    bool accumulate;
  };
  for (const int64_t max_rows : {1, 2}) {
    gpu_->SetStagedGemvMaxRows(max_rows);
    for (const int64_t m : {1, 2}) {
      for (const Case& c :
           {Case{2048, 2048, 2048, 2048, true}, Case{3072, 2048, 2056, 3080, false},
            Case{2048, 1408, 1408, 2048, true}, Case{2048, 2816, 2816, 2052, false}}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "max rows " << max_rows << " m " << m << " n " << c.n
                                          << " k " << c.k << " seed " << seed);
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
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

TEST_F(CudaBackendTest, Bf16GroupedGemmUsesEachGroupsWeights) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n = 96, k = 64;
  const std::vector<int64_t> offsets = {0, 3, 3, 11, 12};
  const int64_t rows = offsets.back();
  auto a = testing::RandomFloats(rows * k, seed);
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  std::vector<WeightView> wc, wg;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    auto w = testing::RandomFloats(n * k, seed + 1 + g);
    wc.push_back(CpuBf16(w, &keep));
    wg.push_back(GpuBf16(w, &keep));
  }
  std::vector<float> want(rows * n);
  cpu16_.GroupedGemm(offsets, wc, n, k, a.data(), want.data());
  auto da = Upload(a);
  auto dc = Poisoned(rows * n);
  gpu_->GroupedGemm(offsets, wg, n, k, da->as<float>(), dc->as<float>());
  EXPECT_TRUE(AllClose(Download(*dc), want, 1e-3, 1e-4));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// Backend::RoutedExperts against the same math done token by token on the CPU: out[t] = sum
// over k of w[t, k] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, k]. Covers every path:
// up to kMaxFusedMoeTokens bf16 tokens (or any size with a forced decode algorithm) the device
// path with each DecodeMoeAlgo, beyond that and for fp32 weights the cuBLAS GEMMs per expert
// (both algorithms). Random routing (K distinct experts per token, ascending, as the router
// emits them), or skewed (expert 3 in every token, the others from 8 experts, the remaining
// experts empty); fresh data each run, output poisoned with NaN first.
class RoutedExpertsTest : public CudaBackendTest {
 protected:
  static constexpr int64_t E = 32, K = 6, H = 128, I = 64;
  using DecodeAlgo = CudaBackend::DecodeMoeAlgo;

  static const char* DecodeAlgoName(DecodeAlgo a) {
    switch (a) {
      case DecodeAlgo::kAuto:
        return "auto";
      case DecodeAlgo::kGroupedF32:
        return "grouped fp32-x";
      case DecodeAlgo::kStream:
        return "stream bf16-x";
      case DecodeAlgo::kPlannedCublas:
        return "planned cuBLAS";
    }
    return "?";
  }

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

  void Run(int64_t T, WeightDType dtype, kernels::ExpertGemmCublasAlgo algo,
           DecodeAlgo decode_algo = DecodeAlgo::kAuto, bool skewed = false) {
    const uint32_t seed = testing::FreshSeed();
    const bool bf16 = dtype == WeightDType::kBFloat16;
    gpu_->SetDecodeMoeAlgo(decode_algo);
    const bool cublas_path =
        !bf16 || (T > CudaBackend::kMaxFusedMoeTokens && decode_algo == DecodeAlgo::kAuto);
    const DecodeAlgo resolved = gpu_->DecodeMoeAlgoFor(T);
    // Every path but the fp32-activation grouped kernel rounds the activations to bf16.
    const bool bf16_acts = bf16 && (cublas_path || resolved != DecodeAlgo::kGroupedF32);
    SCOPED_TRACE(::testing::Message()
                 << "tokens " << T << (bf16 ? " bf16" : " fp32") << " weights, "
                 << (cublas_path
                         ? (algo == kernels::ExpertGemmCublasAlgo::kChunked   ? "cuBLAS chunked"
                            : algo == kernels::ExpertGemmCublasAlgo::kGrouped ? "cuBLAS grouped"
                                                                              : "cuBLAS per expert")
                         : DecodeAlgoName(resolved))
                 << (skewed ? ", skewed routing" : "") << (captured_ ? ", in a CUDA graph" : "")
                 << ", seed " << seed);
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
        ref.SiluMul(1, I, gu.data(), act.data());
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
    // Half the runs give the host copies of the tables, half let the backend copy them back.
    if (T % 2 == 1) {
      a.gate_up_host = gu_ptr.data();
      a.down_host = dn_ptr.data();
    }
    gpu_->SetExpertGemmAlgo(algo);
    if (captured_) {
      // Recorded into a CUDA graph, then replayed once (as the decode graphs run it).
      bool taken = false;
      auto ops = gpu_->Capture([&] {
        taken = gpu_->RoutedExperts(a);
        return absl::OkStatus();
      });
      ASSERT_TRUE(ops.ok()) << ops.status();
      ASSERT_TRUE(taken);
      ASSERT_TRUE((*ops)->Replay().ok());
    } else {
      ASSERT_TRUE(gpu_->RoutedExperts(a));
    }
    const std::vector<float> got = Download(*dout);
    if (cublas_path && gpu_->expert_gemm_algo() != algo) {
      std::cout << "note: cuBLAS refused the batched / grouped GEMM, ran per expert\n";
    }
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
    gpu_->SetDecodeMoeAlgo(DecodeAlgo::kAuto);
  }
};

TEST_F(RoutedExpertsTest, DeviceGroupedPathMatchesPerTokenReference) {
  for (int64_t T :
       {int64_t{1}, int64_t{3}, int64_t{40}, int64_t{CudaBackend::kMaxFusedMoeTokens}}) {
    Run(T, WeightDType::kBFloat16, kernels::ExpertGemmCublasAlgo::kChunked);
  }
}

// Each decode algorithm forced, at decode sizes up to 256 tokens, random and skewed routing.
TEST_F(RoutedExpertsTest, EveryDecodeAlgoMatchesPerTokenReference) {
  for (DecodeAlgo algo :
       {DecodeAlgo::kGroupedF32, DecodeAlgo::kStream, DecodeAlgo::kPlannedCublas}) {
    for (int64_t T : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{128}, int64_t{256}}) {
      for (bool skewed : {false, true}) {
        Run(T, WeightDType::kBFloat16, kernels::ExpertGemmCublasAlgo::kChunked, algo, skewed);
      }
    }
  }
}

// The planned path recorded into a CUDA graph: each GEMM behind a switch over batch sizes
// (the planner picks the bucket on the device; above kMaxFixedBatchGraphMoeTokens tokens), and
// without it (the one fixed batch); random and skewed routing (all tokens on expert 3, a few
// experts busy: the smallest buckets), 3-256 tokens.
TEST_F(RoutedExpertsTest, PlannedPathInCudaGraphMatchesPerTokenReference) {
  captured_ = true;
  for (bool buckets : {true, false}) {
    gpu_->SetDecodeMoeGraphBuckets(buckets);
    SCOPED_TRACE(buckets ? "batch switch" : "fixed batch");
    for (int64_t T : {int64_t{3}, int64_t{7}, int64_t{64}, int64_t{128}, int64_t{256}}) {
      for (bool skewed : {false, true}) {
        Run(T, WeightDType::kBFloat16, kernels::ExpertGemmCublasAlgo::kChunked,
            DecodeAlgo::kPlannedCublas, skewed);
      }
    }
  }
  gpu_->SetDecodeMoeGraphBuckets(false);  // the default
  captured_ = false;
}

// The previous epilogue (SiLU-mul over every row in use, memset + accumulating combine) kept
// for benchmarks: still right. The new one is what every other test runs.
TEST_F(RoutedExpertsTest, DenseEpilogueStillMatchesPerTokenReference) {
  gpu_->SetDecodeMoeSparseEpilogue(false);
  for (DecodeAlgo algo : {DecodeAlgo::kStream, DecodeAlgo::kPlannedCublas}) {
    for (int64_t T : {int64_t{7}, int64_t{128}}) {
      for (bool skewed : {false, true}) {
        Run(T, WeightDType::kBFloat16, kernels::ExpertGemmCublasAlgo::kChunked, algo, skewed);
      }
    }
  }
  gpu_->SetDecodeMoeSparseEpilogue(true);
}

// The planned cuBLAS path at every chunk size it may take (and odd ones), including chunks
// larger than any expert's rows and chunks that split the busiest expert several times.
TEST_F(RoutedExpertsTest, PlannedChunkSizesMatchPerTokenReference) {
  for (int32_t chunk : {8, 16, 24, 32, 48, 64, 128}) {
    ASSERT_TRUE(gpu_->SetPlannedChunkRows(chunk).ok());
    for (int64_t T : {int64_t{3}, int64_t{64}, int64_t{192}}) {
      SCOPED_TRACE(::testing::Message() << "chunk rows " << chunk);
      EXPECT_EQ(gpu_->PlannedChunkRows(T), chunk);
      for (bool skewed : {false, true}) {
        Run(T, WeightDType::kBFloat16, kernels::ExpertGemmCublasAlgo::kChunked,
            DecodeAlgo::kPlannedCublas, skewed);
      }
    }
  }
  ASSERT_TRUE(gpu_->SetPlannedChunkRows(0).ok());
  EXPECT_EQ(gpu_->PlannedChunkRows(16), 8);
  EXPECT_EQ(gpu_->PlannedChunkRows(64), 48);
  EXPECT_EQ(gpu_->PlannedChunkRows(128), 48);
  EXPECT_EQ(gpu_->DecodeMoeAlgoFor(2), DecodeAlgo::kGroupedF32);
  EXPECT_EQ(gpu_->DecodeMoeAlgoFor(64), DecodeAlgo::kPlannedCublas);
  EXPECT_FALSE(gpu_->SetPlannedChunkRows(-1).ok());
  EXPECT_FALSE(gpu_->SetPlannedChunkRows(CudaBackend::kMaxPlannedChunkRows + 1).ok());
}

TEST_F(RoutedExpertsTest, CublasPathMatchesPerTokenReference) {
  for (auto algo :
       {kernels::ExpertGemmCublasAlgo::kChunked, kernels::ExpertGemmCublasAlgo::kGrouped,
        kernels::ExpertGemmCublasAlgo::kPerExpert}) {
    for (int64_t T : {int64_t{CudaBackend::kMaxFusedMoeTokens} + 1, int64_t{513}, int64_t{4096}}) {
      Run(T, WeightDType::kBFloat16, algo);
    }
    for (int64_t T : {int64_t{1}, int64_t{300}, int64_t{513}, int64_t{4096}}) {
      Run(T, WeightDType::kFloat32, algo);
    }
  }
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
    // The kernels by default: kStationary at every width; a set pair is kept at every width.
    EXPECT_EQ(gpu_->DecodeMoeFusedKernelsFor(H), kernels::MoeDecodeFusedKernels::kStationary);
    EXPECT_EQ(gpu_->DecodeMoeFusedKernelsFor(CudaBackend::kMaxAutoFusedMoeHidden + 8),
              kernels::MoeDecodeFusedKernels::kStationary);
    gpu_->SetDecodeMoeFusedKernels(kernels::MoeDecodeFusedKernels::kPipelined);
    EXPECT_EQ(gpu_->DecodeMoeFusedKernelsFor(CudaBackend::kMaxAutoFusedMoeHidden + 8),
              kernels::MoeDecodeFusedKernels::kPipelined);
    // kAuto: one token at any width, two up to kMaxAutoFusedMoeHidden. kOn takes both.
    const int64_t wide = CudaBackend::kMaxAutoFusedMoeHidden + 8;
    gpu_->SetDecodeMoeFusedKernels(kernels::MoeDecodeFusedKernels::kPersistent);
    EXPECT_TRUE(gpu_->DecodeMoeFusedFor(T, H));
    EXPECT_TRUE(gpu_->DecodeMoeFusedFor(1, wide));
    EXPECT_FALSE(gpu_->DecodeMoeFusedFor(2, wide));
    EXPECT_FALSE(gpu_->DecodeMoeFusedFor(3, H));
    gpu_->SetDecodeMoeFused(CudaBackend::DecodeMoeFused::kOn);
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
      bool taken = false;
      auto ops = gpu_->Capture([&] {
        taken = gpu_->RoutedAndSharedExperts(a);
        return absl::OkStatus();
      });
      EXPECT_TRUE(ops.ok()) << ops.status();
      EXPECT_TRUE(taken);
      if (ops.ok()) {
        EXPECT_TRUE((*ops)->Replay().ok());
      }
      return Download(*out);
    };
    EXPECT_EQ(replayed_run(), eager) << "replay differs from the eager run";

    // kPipelined: kPersistent's sums in the same order (bit-identical), eager and replayed.
    gpu_->SetDecodeMoeFusedKernels(kernels::MoeDecodeFusedKernels::kPipelined);
    EXPECT_TRUE(gpu_->DecodeMoeFusedFor(1, wide));
    EXPECT_EQ(eager_run(), eager) << "kPipelined differs from kPersistent";
    EXPECT_EQ(replayed_run(), eager) << "kPipelined's replay differs";

    // kStationary: another summation order at one token (kPipelined's at two), within the
    // reference's tolerance; its replay equals its eager run.
    gpu_->SetDecodeMoeFusedKernels(kernels::MoeDecodeFusedKernels::kStationary);
    EXPECT_TRUE(gpu_->DecodeMoeFusedFor(1, wide));
    const std::vector<float> stat_eager = eager_run();
    EXPECT_TRUE(testing::AllClose(stat_eager, want, 1e-4 * scale, 1e-4));
    if (T == 2) {
      EXPECT_EQ(stat_eager, eager) << "kStationary at 2 tokens is kPipelined";
    }
    EXPECT_EQ(replayed_run(), stat_eager) << "kStationary's replay differs";
    gpu_->SetDecodeMoeFusedKernelsAuto();

    // Declined (nothing written): switched off, a forced non-kGroupedF32 algorithm, a shared
    // size that is no multiple of inter, no shared experts, fp32 weights, 3 tokens.
    auto dout3 = Poisoned(T * H);
    a.out = dout3->as<float>();
    gpu_->SetDecodeMoeFused(CudaBackend::DecodeMoeFused::kOff);
    EXPECT_FALSE(gpu_->RoutedAndSharedExperts(a));
    gpu_->SetDecodeMoeFused(CudaBackend::DecodeMoeFused::kOn);
    gpu_->SetDecodeMoeAlgo(DecodeAlgo::kPlannedCublas);
    EXPECT_FALSE(gpu_->RoutedAndSharedExperts(a));
    gpu_->SetDecodeMoeAlgo(DecodeAlgo::kAuto);
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
    gpu_->SetDecodeMoeFused(CudaBackend::DecodeMoeFused::kAuto);
  }
}

// RouteTokens (the post-attention norm into the hidden rows, then the router) followed by
// RoutedAndSharedExperts, as DeepseekV3Model::Moe issues them, with
// SetDecodeMoeResidentWorkspaces on (the router's logits and the block's act in the backend's
// own buffers) and off (scratch): no bit changes (kStationary and kPipelined, 1 and 2 tokens,
// eager, replayed from one CUDA graph of both ops, and at one token after the norm-folding
// router), nor in NormedDenseMlp; against the CPU backend on the routing and normed rows the
// GPU produced.
TEST_F(RoutedExpertsTest, ResidentWorkspacesChangeNoBit) {
  constexpr int64_t SI = 2 * I;
  for (int64_t T : {int64_t{1}, int64_t{2}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "tokens " << T << " seed " << seed);
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    BlockWeights bw = RandomBlockWeights(SI, seed, &keep);
    const auto& [gu_ptr, dn_ptr, gu_ref, dn_ref, sgu, sdn, sgu_gpu, sdn_gpu] = bw;
    std::vector<float> norm_w = testing::RandomFloats(H, seed + 3, 0.2f);
    for (float& v : norm_w) v += 1.0f;
    auto residual = Upload(testing::RandomFloats(T * H, seed + 4, 1.0f));
    auto dnorm_w = Upload(norm_w);
    auto router = Upload(testing::RandomFloats(E * H, seed + 5, 0.1f));
    auto bias = Upload(std::vector<float>(E, 0.0f));
    auto rows = Poisoned(T * H);

    std::vector<std::unique_ptr<DeviceBuffer>> inputs;
    auto dout = Poisoned(T * H);
    // DeviceArgs uploads zero rows and routing; hidden, topk_ids and topk_weights are then
    // pointed at the router's outputs.
    RoutedExpertsArgs a = DeviceArgs(T, std::vector<float>(T * H), std::vector<float>(T * K),
                                     std::vector<int32_t>(T * K), gu_ptr, dn_ptr,
                                     WeightDType::kBFloat16, dout->as<float>(), &inputs);
    auto ids = Poisoned(T * K), weights = Poisoned(T * K);
    a.hidden = rows->as<float>();
    a.topk_ids = ids->as<int32_t>();
    a.topk_weights = weights->as<float>();
    a.shared_inter = SI;
    a.shared_gate_up = sgu_gpu.data;
    a.shared_down = sdn_gpu.data;
    RouteTokensArgs r;
    r.hidden_size = H;
    r.hidden = rows->as<float>();
    r.norm.x = residual->as<float>();
    r.norm.weight = dnorm_w->as<float>();
    r.norm.eps = 1e-6f;
    r.norm.out = rows->as<float>();
    r.router_weight = router->as<float>();
    r.route.num_tokens = static_cast<int32_t>(T);
    r.route.num_experts = static_cast<int32_t>(E);
    r.route.correction_bias = bias->as<float>();
    r.route.top_k = static_cast<int32_t>(K);
    r.route.scaling_factor = 2.446f;
    r.route.topk_ids = ids->as<int32_t>();
    r.route.topk_weights = weights->as<float>();
    // Both ops into a fresh output.
    auto run = [&](bool resident, bool router_norm, bool capture) {
      gpu_->SetDecodeMoeResidentWorkspaces(resident);
      gpu_->SetRouterNorm(router_norm);
      auto out = Poisoned(T * H);
      a.out = out->as<float>();
      bool taken = false;
      auto ops_fn = [&] {
        gpu_->RouteTokens(r);
        taken = gpu_->RoutedAndSharedExperts(a);
        return absl::OkStatus();
      };
      if (capture) {
        auto ops = gpu_->Capture(ops_fn);
        EXPECT_TRUE(ops.ok()) << ops.status();
        if (ops.ok()) {
          EXPECT_TRUE((*ops)->Replay().ok());
        }
      } else {
        (void)ops_fn();
      }
      EXPECT_TRUE(taken);
      gpu_->SetDecodeMoeResidentWorkspaces(false);
      gpu_->SetRouterNorm(false);
      return Download(*out);
    };
    for (auto kernels :
         {kernels::MoeDecodeFusedKernels::kStationary, kernels::MoeDecodeFusedKernels::kPipelined}) {
      SCOPED_TRACE(::testing::Message() << "kernels " << static_cast<int>(kernels));
      gpu_->SetDecodeMoeFusedKernels(kernels);
      const std::vector<float> scratch = run(false, false, false);
      EXPECT_EQ(run(true, false, false), scratch) << "eager, resident";
      EXPECT_EQ(run(true, false, true), scratch) << "replayed, resident";
      EXPECT_EQ(run(false, false, true), scratch) << "replayed, scratch";
      if (T == 1) {
        EXPECT_EQ(run(true, true, false), scratch) << "norm-folding router, resident";
      }

      // The CPU backend on the GPU's normed rows and routing (its own output checked elsewhere).
      const std::vector<float> x = Download(*rows), w = Download(*weights);
      std::vector<int32_t> id(T * K);
      gpu_->CopyToHost(ids->data(), id.size() * sizeof(int32_t), id.data());
      std::vector<float> want(T * H, 0.0f), gu(2 * SI), act(SI), y(H);
      for (int64_t t = 0; t < T; ++t) {
        float* o = want.data() + t * H;
        for (int64_t k = 0; k < K; ++k) {
          const int32_t e = id[t * K + k];
          ASSERT_TRUE(e >= 0 && e < E) << "expert id " << e;
          cpu_.Gemm(1, 2 * I, H, x.data() + t * H, H, gu_ref[e].data(), H, gu.data(), 2 * I,
                    false);
          cpu_.SiluMul(1, I, gu.data(), act.data());
          cpu_.Gemm(1, H, I, act.data(), I, dn_ref[e].data(), I, y.data(), H, false);
          for (int64_t i = 0; i < H; ++i) o[i] += w[t * K + k] * y[i];
        }
        cpu_.Gemm(1, 2 * SI, H, x.data() + t * H, H, sgu.data(), H, gu.data(), 2 * SI, false);
        cpu_.SiluMul(1, SI, gu.data(), act.data());
        cpu_.Gemm(1, H, SI, act.data(), SI, sdn.data(), SI, y.data(), H, false);
        cpu_.Add(H, o, y.data(), o);
      }
      double scale = 0;
      for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));
      EXPECT_TRUE(testing::AllClose(scratch, want, 1e-4 * scale, 1e-4));
    }
    gpu_->SetDecodeMoeFusedKernelsAuto();

    // NormedDenseMlp (the same kernels, no routed experts) on the shared MLP's weights.
    if (T == 1) {
      DenseMlpArgs d;
      d.rows = 1;
      d.hidden_size = H;
      d.inter = SI;
      d.x = residual->as<float>();
      d.norm_weight = dnorm_w->as<float>();
      d.eps = 1e-6f;
      d.normed = rows->as<float>();
      d.gate_up = sgu_gpu;
      d.down = sdn_gpu;
      std::vector<float> dense[2];
      for (int resident = 0; resident < 2; ++resident) {
        gpu_->SetDecodeMoeResidentWorkspaces(resident == 1);
        auto out = Poisoned(H);
        d.out = out->as<float>();
        ASSERT_TRUE(gpu_->NormedDenseMlp(d));
        dense[resident] = Download(*out);
      }
      gpu_->SetDecodeMoeResidentWorkspaces(false);
      EXPECT_EQ(dense[1], dense[0]) << "NormedDenseMlp, resident";
    }
    EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
  }
}

TEST_F(CudaBackendTest, MemoryInfoReportsTheDevice) {
  auto info = gpu_->MemoryInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->total_bytes, size_t{0});
  EXPECT_LE(info->free_bytes, info->total_bytes);
}

TEST_F(CudaBackendTest, GroupedGemmUsesEachGroupsWeights) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n = 96, k = 64;
  const std::vector<int64_t> offsets = {0, 3, 3, 11, 12};
  const int64_t rows = offsets.back();
  auto a = testing::RandomFloats(rows * k, seed);
  std::vector<std::vector<float>> w;
  std::vector<std::unique_ptr<DeviceBuffer>> dw;
  std::vector<WeightView> wc, wg;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    w.push_back(testing::RandomFloats(n * k, seed + 1 + g));
    dw.push_back(Upload(w.back()));
    wc.push_back(w.back().data());
    wg.push_back(dw.back()->as<float>());
  }
  std::vector<float> want(rows * n);
  cpu_.GroupedGemm(offsets, wc, n, k, a.data(), want.data());
  auto da = Upload(a);
  auto dc = Poisoned(rows * n);
  gpu_->GroupedGemm(offsets, wg, n, k, da->as<float>(), dc->as<float>());
  EXPECT_TRUE(AllClose(Download(*dc), want, 1e-4, 1e-5));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

TEST_F(CudaBackendTest, OpTimingCountsOuterOpsOnly) {
  auto a = Upload(testing::RandomFloats(4 * 8, testing::FreshSeed()));
  auto w = Upload(testing::RandomFloats(8 * 8, testing::FreshSeed()));
  auto c = gpu_->Allocate(4 * 8 * sizeof(float));
  gpu_->SetOpTiming(true);
  gpu_->Gemm(4, 8, 8, a->as<float>(), 8, w->as<float>(), 8, c->as<float>(), 8, false);
  gpu_->GroupedGemm({0, 2, 4}, {w->as<float>(), w->as<float>()}, 8, 8, a->as<float>(),
                    c->as<float>());
  gpu_->SetOpTiming(false);
  gpu_->Gemm(4, 8, 8, a->as<float>(), 8, w->as<float>(), 8, c->as<float>(), 8, false);
  const std::string report = gpu_->TakeOpTimingReport();
  // The grouped GEMM's two inner Gemm calls and the untimed one are not counted.
  EXPECT_EQ(CallsOf(report, "Gemm"), 1) << report;
  EXPECT_EQ(CallsOf(report, "GroupedGemm"), 1) << report;
  EXPECT_EQ(gpu_->TakeOpTimingReport().find("calls"), std::string::npos);  // cleared
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// RouteTokens with the post-attention norm in its args: at one token with SetRouterNorm(true)
// the CUDA backend folds it into the router's launch, bit for bit what AddRmsNorm and then the
// router give (SetRouterNorm(false), the default); at 3 tokens it runs AddRmsNorm first. Against
// the CPU backend (Backend::RouteTokens: AddRmsNorm, Gemm, NoauxTcRoute): x exactly, the normed
// rows (fp32 and bf16) close, the same choices except within float noise of a tie.
TEST_F(CudaBackendTest, RouteTokensWithNormFoldsItAtOneToken) {
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
    Out cpu, folded, unfolded;
    run(&cpu_, &cpu);
    run(gpu_.get(), &unfolded);  // SetRouterNorm is off by default
    gpu_->SetRouterNorm(true);
    gpu_->SetOpTiming(true);
    run(gpu_.get(), &folded);
    gpu_->SetOpTiming(false);
    gpu_->SetRouterNorm(false);
    const std::string report = gpu_->TakeOpTimingReport();
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    EXPECT_EQ(CallsOf(report, "RouteTokens"), 1) << report;
    EXPECT_EQ(CallsOf(report, "AddRmsNorm"), T == 1 ? -1 : 1) << report;
    EXPECT_EQ(folded.x, unfolded.x);
    EXPECT_EQ(folded.normed, unfolded.normed);
    EXPECT_EQ(folded.normed_bf16, unfolded.normed_bf16);
    EXPECT_EQ(folded.ids, unfolded.ids);
    EXPECT_EQ(folded.w, unfolded.w);
    EXPECT_TRUE(AllClose(folded.x, cpu.x, 0.0, 0.0));
    EXPECT_TRUE(AllClose(folded.normed, cpu.normed, 1e-5, 1e-5));
    int bf16_off = 0;  // bf16 roundings of values a rounding step apart
    for (int64_t i = 0; i < T * H; ++i) {
      bf16_off += std::abs(folded.normed_bf16[i] - cpu.normed_bf16[i]) > 1;
    }
    EXPECT_EQ(bf16_off, 0);
    int differing = 0;
    for (int32_t t = 0; t < T; ++t) {
      const std::vector<int32_t> g(folded.ids.begin() + t * K, folded.ids.begin() + (t + 1) * K);
      const std::vector<int32_t> w(cpu.ids.begin() + t * K, cpu.ids.begin() + (t + 1) * K);
      differing += g != w;
    }
    EXPECT_LE(differing, 1) << "more than float-noise ties";
  }
}

// RouteTokens against the CPU backend's (Backend's Gemm + NoauxTcRoute + AccumulateExpertCounts)
// with the one-launch kernel on (up to kFusedRouterMaxTokens; 200 and 300 take the ops), and
// with it off: the same choices except within float noise of a tie (the logits' summation
// orders differ), close weights, and the counts of exactly the choices made (count_limit leaves
// out the last token).
TEST_F(CudaBackendTest, RouteTokensMatchesCpuFusedAndUnfused) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int32_t E = 64, K = 6, H = 512;
  for (bool fused : {true, false}) {
    gpu_->SetFusedRouter(fused);
    for (int32_t T : {1, 7, 128, 200, 300}) {
      SCOPED_TRACE(::testing::Message() << "fused " << fused << " tokens " << T);
      const std::vector<float> hidden = testing::RandomFloats(T * H, seed + T, 1.0f);
      const std::vector<float> weight = testing::RandomFloats(E * H, seed + 1, 0.05f);
      const std::vector<float> bias = testing::RandomFloats(E, seed + 2, 0.05f);
      const int32_t limit = (T - 1) * K;
      auto run = [&](Backend* be, std::vector<int32_t>* ids, std::vector<float>* w,
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
        be->RouteTokens(a);
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
      run(&cpu_, &want_ids, &want_w, &want_counts);
      gpu_->SetOpTiming(true);
      run(gpu_.get(), &got_ids, &got_w, &got_counts);
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
  gpu_->SetFusedRouter(true);
}

TEST_F(CudaBackendTest, KernelErrorsAreRecordedWithTheCallNamed) {
  // A latent wider than the attention kernel supports is rejected at launch.
  MlaAttentionArgs args;
  args.num_tokens = 1;
  args.num_heads = 1;
  args.cache.latent_dim = 4096;
  gpu_->MlaAttention(args);
  absl::Status st = gpu_->status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("kernels::MlaAttentionF32"), absl::string_view::npos) << st;
  // The first error is kept (an odd rope width is another launch-time rejection; nothing
  // here touches memory, so the context stays usable).
  gpu_->ApplyRope(1, 1, nullptr, 3, 3, 3, nullptr, nullptr, 1.0f, true);
  EXPECT_EQ(gpu_->status(), st);
}

TEST_F(CudaBackendTest, SetMlaDecodeVariantRejectsUnknownVariants) {
  // Out of range, and the removed variants 1-3, 5 and 6 (the message lists the valid ones).
  for (int32_t bad : {-1, 1, 2, 3, 5, 6, kernels::kMaxMlaMmaVariant + 1}) {
    const absl::Status st = gpu_->SetMlaDecodeVariant(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("variant " + std::to_string(bad)), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find("0, 4, 7, 8, 9"), absl::string_view::npos) << st;
  }
  EXPECT_EQ(gpu_->mla_decode_variant(), 0);  // unchanged by the rejected calls
  ASSERT_TRUE(gpu_->SetMlaDecodeVariant(7).ok());
  EXPECT_EQ(gpu_->mla_decode_variant(), 7);
}

// Decode attention (bf16 cache, Moonlight's 16 heads of latent 512 + rope 64, shuffled blocks of
// 16) at every SetMlaDecodeVariant value against CpuBackend over the same cache values; the
// variants with bf16 Q and P (kernels::MlaAttentionBf16Operands: 8, 9 and the default) against
// CpuBackend over Q rounded to bf16, within P's rounding bound 2^-9 max |latent|
// (kernels/attention/mla_attention_test.cc derives it).
TEST_F(CudaBackendTest, MlaDecodeMatchesCpuAtEveryVariant) {
  constexpr int32_t kHeads = 16, kLatent = 512, kRope = 64, kBlock = 16, kEntry = kLatent + kRope;
  const std::vector<int32_t> lens = {37, 300, 1};
  const int32_t max_blocks = 19, num_blocks = 3 * max_blocks;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  std::vector<int32_t> perm(num_blocks);
  for (int32_t i = 0; i < num_blocks; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), gen);
  std::vector<int32_t> tables(perm.begin(), perm.end());  // sequence q owns row q
  std::vector<int32_t> slots, token_seq, context_len;
  for (int32_t q = 0; q < 3; ++q) {
    for (int32_t p = 0; p < lens[q]; ++p) {
      slots.push_back(tables[q * max_blocks + p / kBlock] * kBlock + p % kBlock);
    }
    token_seq.push_back(q);
    context_len.push_back(lens[q]);
  }
  const int64_t cached = static_cast<int64_t>(slots.size()), tokens = 3;
  const auto kv = testing::RandomFloats(cached * kEntry, seed + 1);
  const auto q_latent = testing::RandomFloats(tokens * kHeads * kLatent, seed + 2);
  const auto q_rope = testing::RandomFloats(tokens * kHeads * kRope, seed + 3);
  const size_t cache_elems = static_cast<size_t>(num_blocks) * kBlock * kEntry;
  std::vector<uint16_t> cache_cpu(cache_elems, 0);
  const PagedLatentCacheView cpu_view{cache_cpu.data(), kBlock, kLatent, kRope,
                                      WeightDType::kBFloat16};
  cpu_.WriteLatentCache(cached, kv.data(), kEntry, kv.data() + kLatent, kEntry, slots.data(),
                        cpu_view);
  MlaAttentionArgs a;
  a.num_tokens = static_cast<int32_t>(tokens);
  a.num_heads = kHeads;
  a.q_latent = q_latent.data();
  a.q_rope = q_rope.data();
  a.q_rope_token_stride = kHeads * kRope;
  a.q_rope_head_stride = kRope;
  a.cache = cpu_view;
  a.block_tables = tables.data();
  a.max_blocks_per_seq = max_blocks;
  a.token_seq = token_seq.data();
  a.context_len = context_len.data();
  a.softmax_scale = 0.0721f;
  std::vector<float> want(tokens * kHeads * kLatent);
  a.out_latent = want.data();
  cpu_.MlaAttention(a);
  std::vector<float> q_latent16(q_latent), q_rope16(q_rope);
  for (float& x : q_latent16) x = RoundToBf16(x);
  for (float& x : q_rope16) x = RoundToBf16(x);
  MlaAttentionArgs a16 = a;
  a16.q_latent = q_latent16.data();
  a16.q_rope = q_rope16.data();
  std::vector<float> want16(want.size());
  a16.out_latent = want16.data();
  cpu_.MlaAttention(a16);
  double max_latent = 0.0;
  for (int64_t t = 0; t < cached; ++t) {
    for (int32_t i = 0; i < kLatent; ++i) {
      max_latent = std::max<double>(max_latent, std::fabs(RoundToBf16(kv[t * kEntry + i])));
    }
  }

  DeviceMla device = UploadMla(a, cached, kv, slots, tables, token_seq, context_len, q_latent,
                               q_rope, cache_elems);
  MlaAttentionArgs g = device.args;
  for (int32_t variant = 0; variant <= kernels::kMaxMlaMmaVariant; ++variant) {
    if (!kernels::MlaMmaVariantIsValid(variant)) continue;  // removed variants (1-3, 5, 6)
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    ASSERT_TRUE(gpu_->SetMlaDecodeVariant(variant).ok());
    auto out = Poisoned(want.size());
    g.out_latent = out->as<float>();
    gpu_->MlaAttention(g);
    kernels::MlaAttentionParams kp;  // the shape, to ask which operands the variant uses
    kp.num_tokens = static_cast<int32_t>(tokens);
    kp.num_heads = kHeads;
    kp.cache = {g.cache.cache, kBlock, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
    kp.out_latent = g.out_latent;
    kp.mma_variant = variant;
    if (kernels::MlaAttentionBf16Operands(kp)) {
      EXPECT_TRUE(AllClose(Download(*out), want16, max_latent / 512.0 + 1e-4, 5e-4));
    } else {
      // Q and P as bf16 hi + lo pairs on tensor cores (kernels/attention/mla_attention_test).
      EXPECT_TRUE(AllClose(Download(*out), want, 1e-4, 5e-4));
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}
TEST_F(CudaBackendTest, MlaDecodeSmallMaxContextIsCheckedAndReportedAsTheBreak) {
  for (int32_t bad : {0, -1}) {
    const absl::Status st = gpu_->SetMlaDecodeSmallMaxContext(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("max_context " + std::to_string(bad)), absl::string_view::npos)
        << st;
  }
  EXPECT_EQ(gpu_->mla_decode_small_max_context(), CudaBackend::kMlaDecodeSmallMaxContext);
  EXPECT_EQ(gpu_->MlaDecodeContextBreak(1), CudaBackend::kMlaDecodeSmallMaxContext);
  EXPECT_EQ(gpu_->MlaDecodeContextBreak(2), 0);  // more tokens: always the key-split kernel
  ASSERT_TRUE(gpu_->SetMlaDecodeSmallMaxContext(300).ok());
  EXPECT_EQ(gpu_->MlaDecodeContextBreak(1), 300);
  gpu_->SetMlaDecodeSmall(false);
  EXPECT_EQ(gpu_->MlaDecodeContextBreak(1), 0);
}

// One decode token (300 positions, Moonlight's attention shape): the kernel is chosen by the
// longest context, from the spans where given, else from max_context_hint (a recorded step's
// class bound), never from an unknown one; either kernel matches CpuBackend. The two kernels'
// bits differ, so equal bits tell which one ran.
TEST_F(CudaBackendTest, OneTokenDecodeKernelFollowsTheContextOrItsHint) {
  constexpr int32_t kHeads = 16, kLatent = 512, kRope = 64, kBlock = 16, kEntry = kLatent + kRope;
  constexpr int32_t kLen = 300, kMaxBlocks = 19;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  std::vector<int32_t> tables(kMaxBlocks);
  for (int32_t i = 0; i < kMaxBlocks; ++i) tables[i] = i;
  std::shuffle(tables.begin(), tables.end(), gen);
  std::vector<int32_t> slots, token_seq = {0}, context_len = {kLen};
  for (int32_t p = 0; p < kLen; ++p) slots.push_back(tables[p / kBlock] * kBlock + p % kBlock);
  const auto kv = testing::RandomFloats(int64_t{kLen} * kEntry, seed + 1);
  const auto q_latent = testing::RandomFloats(kHeads * kLatent, seed + 2);
  const auto q_rope = testing::RandomFloats(kHeads * kRope, seed + 3);
  const size_t cache_elems = static_cast<size_t>(kMaxBlocks) * kBlock * kEntry;
  std::vector<uint16_t> cache_cpu(cache_elems, 0);
  const PagedLatentCacheView cpu_view{cache_cpu.data(), kBlock, kLatent, kRope,
                                      WeightDType::kBFloat16};
  cpu_.WriteLatentCache(kLen, kv.data(), kEntry, kv.data() + kLatent, kEntry, slots.data(),
                        cpu_view);
  MlaAttentionArgs a;
  a.num_tokens = 1;
  a.num_heads = kHeads;
  a.q_latent = q_latent.data();
  a.q_rope = q_rope.data();
  a.q_rope_token_stride = kHeads * kRope;
  a.q_rope_head_stride = kRope;
  a.cache = cpu_view;
  a.block_tables = tables.data();
  a.max_blocks_per_seq = kMaxBlocks;
  a.token_seq = token_seq.data();
  a.context_len = context_len.data();
  a.softmax_scale = 0.0721f;
  std::vector<float> want(kHeads * kLatent);
  a.out_latent = want.data();
  cpu_.MlaAttention(a);

  const DeviceMla device =
      UploadMla(a, kLen, kv, slots, tables, token_seq, context_len, q_latent, q_rope, cache_elems);
  const MlaSequenceSpan span{0, 1, kLen};
  auto run = [&](const MlaSequenceSpan* spans, int32_t hint) {
    MlaAttentionArgs g = device.args;
    g.sequences = spans;
    g.num_sequences = spans != nullptr ? 1 : 0;
    g.max_context_hint = hint;
    auto out = Poisoned(want.size());
    g.out_latent = out->as<float>();
    gpu_->MlaAttention(g);
    return Download(*out);
  };
  // The references: the key-split kernel with the one-launch kernel off, and the one-launch
  // kernel for any context. Variant 7 (fp32-grade Q and P, as MlaDecodeSmall) for the tight
  // tolerance below: this test is about which kernel runs.
  ASSERT_TRUE(gpu_->SetMlaDecodeVariant(7).ok());
  gpu_->SetMlaDecodeSmall(false);
  const std::vector<float> key_split = run(&span, 0);
  gpu_->SetMlaDecodeSmall(true);
  ASSERT_TRUE(gpu_->SetMlaDecodeSmallMaxContext(1 << 20).ok());
  const std::vector<float> small = run(&span, 0);
  EXPECT_TRUE(AllClose(key_split, want, 1e-4, 5e-4));
  EXPECT_TRUE(AllClose(small, want, 1e-4, 5e-4));
  ASSERT_NE(std::memcmp(key_split.data(), small.data(), small.size() * sizeof(float)), 0)
      << "the two kernels gave the same bits: this test cannot tell them apart";
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };

  ASSERT_TRUE(gpu_->SetMlaDecodeSmallMaxContext(kLen).ok());
  EXPECT_TRUE(same(run(&span, 0), small));               // spans: the real context, at the max
  EXPECT_TRUE(same(run(&span, kLen + 1), small));        // spans win over the hint
  EXPECT_TRUE(same(run(nullptr, kLen), small));          // a class bound at the max
  EXPECT_TRUE(same(run(nullptr, kLen + 1), key_split));  // above it
  EXPECT_TRUE(same(run(nullptr, 0), key_split));         // unknown
  ASSERT_TRUE(gpu_->SetMlaDecodeSmallMaxContext(kLen - 1).ok());
  EXPECT_TRUE(same(run(&span, 0), key_split));  // the real context above the max
  EXPECT_TRUE(same(run(&span, 1), key_split));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The sampling ops pass their arguments through to kernels/sampling:sample in the right order
// (the kernels themselves are checked against Sampler in kernels/sampling:sample_test).
TEST_F(CudaBackendTest, SampleRowsAndTopLogprobsRowsMatchCpu) {
  const int64_t rows = 5, vocab = 300;
  const int32_t n = 4;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const auto logits = testing::RandomFloats(rows * vocab, seed, 2.0f);
  std::vector<RowSamplingParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].temperature = 1.0f;
    params[r].top_k = r % 2 ? 20 : 0;
    params[r].top_p = r % 3 ? 0.9f : 1.0f;
    params[r].seed = seed + r;
    params[r].position = 1000 + r;
  }
  std::vector<int32_t> want_tok(rows), want_ids(rows * n);
  std::vector<float> want_lp(rows), want_top(rows * n);
  cpu_.SampleRows(rows, vocab, logits.data(), params.data(), want_tok.data(), want_lp.data());
  cpu_.TopLogprobsRows(rows, vocab, logits.data(), n, want_ids.data(), want_top.data());

  auto dl = Upload(logits);
  auto dp = gpu_->Allocate(rows * sizeof(RowSamplingParams));
  gpu_->CopyToDevice(params.data(), rows * sizeof(RowSamplingParams), dp->data());
  auto dtok = Poisoned(rows), dlp = Poisoned(rows), dids = Poisoned(rows * n),
       dtop = Poisoned(rows * n);
  gpu_->SampleRows(rows, vocab, dl->as<float>(), dp->as<RowSamplingParams>(), dtok->as<int32_t>(),
                   dlp->as<float>());
  gpu_->TopLogprobsRows(rows, vocab, dl->as<float>(), n, dids->as<int32_t>(), dtop->as<float>());
  std::vector<int32_t> got_tok(rows), got_ids(rows * n);
  gpu_->CopyToHost(dtok->data(), rows * sizeof(int32_t), got_tok.data());
  gpu_->CopyToHost(dids->data(), rows * n * sizeof(int32_t), got_ids.data());
  EXPECT_EQ(got_tok, want_tok);
  EXPECT_EQ(got_ids, want_ids);
  EXPECT_TRUE(AllClose(Download(*dlp), want_lp, 1e-5, 0));
  EXPECT_TRUE(AllClose(Download(*dtop), want_top, 1e-5, 0));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
  // An n beyond kMaxTopLogprobs is an INVALID_ARGUMENT that names it.
  gpu_->TopLogprobsRows(rows, vocab, dl->as<float>(), kMaxTopLogprobs + 1, dids->as<int32_t>(),
                        dtop->as<float>());
  EXPECT_EQ(gpu_->status().code(), absl::StatusCode::kInvalidArgument) << gpu_->status();
  EXPECT_NE(gpu_->status().message().find("TopLogprobsRows"), absl::string_view::npos);
}

// Backend::NormedDenseMlp (a dense MLP layer's norm + MLP at one decode token through the fused
// MoE block's kernels with no routed experts) against the CPU backend's AddRmsNorm, Gemm,
// SiluMul, Gemm on the same bf16 weights widened to fp32 (the fused path keeps fp32
// activations), out aliasing y as in the model. Every kernel pair, eager and recorded into a
// CUDA graph (the replay, from the same x and y, must equal the eager run bit for bit). Also the
// cases it declines, doing nothing (off by default).
// One decode token's latent norm + rope + cache write and W_uk product: the fused launch (on by
// default) gives the bits of the two launches (SetNormRopeCacheAbsorbFused(false)), and both
// are within fp32 rounding of CpuBackend's two ops with the same bf16 weights. Two tokens take
// the two launches (the same bits either way).
TEST_F(CudaBackendTest, NormRopeCacheAbsorbQueryMatchesTheTwoOpsAndCpu) {
  const int64_t L = 512, R = 64, nh = 16, nope = 128, qk = nope + R, kvw = L + R, slots = 8;
  for (int64_t T : {1, 2}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "tokens " << T << " seed " << seed);
    const auto kv = testing::RandomFloats(T * kvw, seed, 2.0f);
    const auto q = testing::RandomFloats(T * nh * qk, seed + 1);
    const auto wn = testing::RandomFloats(L, seed + 2);
    const auto wuk = testing::RandomFloats(nh * L * nope, seed + 3, 0.1f);
    std::vector<float> inv_freq(R / 2);
    for (int64_t j = 0; j < R / 2; ++j) inv_freq[j] = std::pow(10000.0f, -2.0f * j / R);
    const std::vector<int32_t> slot = {6, 1}, pos = {1023, 17};
    std::vector<std::unique_ptr<DeviceBuffer>> keep;

    auto args = [&](float* qv, const float* kvv, const float* w, const float* inv,
                    const int32_t* sl, const int32_t* ps, void* cache, NormRopeCacheArgs* nr,
                    AbsorbQueryArgs* aq, WeightView w_uk, float* out) {
      nr->tokens = T, nr->kv = kvv, nr->ld_kv = kvw, nr->norm_weight = w, nr->eps = 1e-6f;
      nr->q = qv + nope, nr->q_heads = nh, nr->q_token_stride = nh * qk, nr->q_head_stride = qk;
      nr->positions = ps, nr->inv_freq = inv, nr->attention_factor = 1.0f;
      nr->interleaved = true, nr->slots = sl;
      nr->cache.cache = cache, nr->cache.block_size = 4, nr->cache.latent_dim = L;
      nr->cache.rope_dim = R, nr->cache.dtype = WeightDType::kBFloat16;
      aq->heads = nh, aq->nope_dim = nope, aq->latent_dim = L, aq->q_nope = qv;
      aq->q_token_stride = nh * qk, aq->q_head_stride = qk, aq->w_uk = w_uk, aq->q_latent = out;
    };

    // CPU: Backend's default, the two ops.
    std::vector<float> cq = q, cout(T * nh * L);
    std::vector<uint16_t> ccache(slots * kvw, 0);
    NormRopeCacheArgs nr;
    AbsorbQueryArgs aq;
    args(cq.data(), kv.data(), wn.data(), inv_freq.data(), slot.data(), pos.data(), ccache.data(),
         &nr, &aq, CpuBf16(wuk, &keep), cout.data());
    cpu16_.NormRopeCacheAbsorbQuery(nr, aq);

    auto ints = [&](const std::vector<int32_t>& v) {
      keep.push_back(gpu_->Allocate(v.size() * sizeof(int32_t)));
      gpu_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), keep.back()->data());
      return keep.back()->as<int32_t>();
    };
    const WeightView w_gpu = GpuBf16(wuk, &keep);
    auto dkv = Upload(kv), dwn = Upload(wn), dinv = Upload(inv_freq);
    const int32_t* dslot = ints(slot);
    const int32_t* dpos = ints(pos);
    std::vector<float> got[2][3];  // [fused][q, cache bits, q_latent]
    for (int fused = 0; fused < 2; ++fused) {
      SCOPED_TRACE(::testing::Message() << "fused " << fused);
      gpu_->SetNormRopeCacheAbsorbFused(fused == 1);
      auto dq = Upload(q), dout = Poisoned(T * nh * L);
      auto dcache = Upload(std::vector<float>(slots * kvw / 2, 0.0f));  // bf16 zeros
      args(dq->as<float>(), dkv->as<float>(), dwn->as<float>(), dinv->as<float>(), dslot, dpos,
           dcache->data(), &nr, &aq, w_gpu, dout->as<float>());
      gpu_->NormRopeCacheAbsorbQuery(nr, aq);
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      got[fused][0] = Download(*dq);
      got[fused][1] = Download(*dcache);
      got[fused][2] = Download(*dout);
      EXPECT_TRUE(AllClose(got[fused][0], cq, 1e-5, 1e-5));
      EXPECT_TRUE(AllClose(got[fused][2], cout, 1e-4, 1e-4));
      std::vector<float> cache_values(slots * kvw), want_values(slots * kvw);
      for (int64_t i = 0; i < slots * kvw; ++i) {
        uint16_t b;
        std::memcpy(&b, reinterpret_cast<const char*>(got[fused][1].data()) + 2 * i, 2);
        cache_values[i] = Bf16BitsToFloat(b);
        want_values[i] = Bf16BitsToFloat(ccache[i]);
      }
      // A 1e-5-close fp32 value can round to the neighbouring bf16 value.
      EXPECT_TRUE(AllClose(cache_values, want_values, 1e-5, 1.0 / 128));
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4), 0)
          << "output " << i << " differs between the fused launch and the two launches";
    }
  }
  gpu_->SetNormRopeCacheAbsorbFused(true);
}

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

  // Switched off: declined, nothing written.
  gpu_->SetDecodeDenseMlpFused(false);
  EXPECT_FALSE(gpu_->NormedDenseMlp(a));
  EXPECT_EQ(Download(*dx), x);
  EXPECT_EQ(Download(*dy), y);
  gpu_->SetDecodeDenseMlpFused(true);

  struct Pair {
    const char* name;
    bool set;  // false: the backend's default (DecodeMoeFusedKernelsFor)
    kernels::MoeDecodeFusedKernels kernels;
  };
  const Pair pairs[] = {
      {"default", false, kernels::MoeDecodeFusedKernels::kStationary},
      {"persistent", true, kernels::MoeDecodeFusedKernels::kPersistent},
      {"pipelined", true, kernels::MoeDecodeFusedKernels::kPipelined},
      {"stationary", true, kernels::MoeDecodeFusedKernels::kStationary},
  };
  for (const Pair& pair : pairs) {
    SCOPED_TRACE(pair.name);
    if (pair.set) {
      gpu_->SetDecodeMoeFusedKernels(pair.kernels);
    } else {
      gpu_->SetDecodeMoeFusedKernelsAuto();
    }
    reset();
    ASSERT_TRUE(gpu_->NormedDenseMlp(a));
    const std::vector<float> eager = Download(*dy), eager_x = Download(*dx);
    EXPECT_TRUE(AllClose(eager_x, want_x, 0, 0)) << "x += y";
    EXPECT_TRUE(AllClose(Download(*dnormed), normed, 1e-5, 1e-5));
    // fp32 sums in another order over a normed row that may differ in its last bits: far below
    // 1e-4 of the largest output; a missing or doubled part, a wrong row moves outputs by
    // O(scale).
    EXPECT_TRUE(AllClose(eager, want, 1e-4 * scale, 1e-4));

    bool taken = false;
    auto ops = gpu_->Capture([&] {
      taken = gpu_->NormedDenseMlp(a);
      return absl::OkStatus();
    });
    ASSERT_TRUE(ops.ok()) << ops.status();
    ASSERT_TRUE(taken);
    reset();
    gpu_->CopyToDevice(std::vector<float>(H, std::numeric_limits<float>::quiet_NaN()).data(),
                       H * sizeof(float), dnormed->data());
    ASSERT_TRUE((*ops)->Replay().ok());
    EXPECT_EQ(Download(*dy), eager) << "replay differs from the eager run";
    EXPECT_EQ(Download(*dx), eager_x);
  }
  gpu_->SetDecodeMoeFusedKernelsAuto();

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
  gpu_->SetDecodeDenseMlpFused(false);
  EXPECT_FALSE(gpu_->NormedDenseMlp(a));
  EXPECT_EQ(Download(*dx), x);
  EXPECT_EQ(Download(*dy), y);
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

}  // namespace
}  // namespace deepinfer
