// CudaBackend against CpuBackend for what only the backend does (cuBLAS GEMM layout with
// strides and accumulation, grouped GEMM with empty groups, zeroed allocations, copies) and for
// its error reporting. The per-kernel ops are covered in kernels/*/ tests.
#include "worker/backend/cuda/cuda_backend.h"

#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
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
    auto b = CudaBackend::Create(0);
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

  CpuBackend cpu_{2};
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

TEST_F(CudaBackendTest, GemmMatchesCpuWithStridesAndAccumulate) {
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

TEST_F(CudaBackendTest, GroupedGemmUsesEachGroupsWeights) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n = 96, k = 64;
  const std::vector<int64_t> offsets = {0, 3, 3, 11, 12};
  const int64_t rows = offsets.back();
  auto a = testing::RandomFloats(rows * k, seed);
  std::vector<std::vector<float>> w;
  std::vector<std::unique_ptr<DeviceBuffer>> dw;
  std::vector<const float*> wc, wg;
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

}  // namespace
}  // namespace deepinfer
