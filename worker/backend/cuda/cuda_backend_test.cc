// CudaBackend's device side against CpuBackend and its own contract: zeroed allocations and
// copies, scratch allocations beside the kernel chain in recordings, the dummy weight fill,
// memory info, op timing, error recording and the sampling ops' argument order. The op families
// are in cuda_backend_{gemm,moe,attention}_test.cc, the kernels in kernels/*/ tests.
#include "worker/backend/cuda/cuda_backend.h"

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
#include "kernels/common/pdl.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::CallsOf;
using testing::CudaBackendTest;

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
// kAsideMaxTokens tokens (1), never in others, outside a recording or above 64 KiB; the replay
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
  static_assert(CudaBackend::kAsideMaxTokens == 1, "the recordings below");
  EXPECT_EQ(record(1), 1);
  EXPECT_EQ(record(2), 0);
  EXPECT_EQ(record(64), 0);
  EXPECT_EQ(record(0), 0);  // tokens not known
  const int64_t before = gpu_->AsideAllocations();
  auto eager = gpu_->AllocateScratch(64);  // outside a recording: in stream order
  EXPECT_EQ(gpu_->AsideAllocations(), before);
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

TEST_F(CudaBackendTest, MemoryInfoReportsTheDevice) {
  auto info = gpu_->MemoryInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->total_bytes, size_t{0});
  EXPECT_LE(info->free_bytes, info->total_bytes);
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

}  // namespace
}  // namespace deepinfer
