// ArgmaxRowsF32, GreedySampleRowsF32 and TokenLogprobRowsF32 against the CPU backend's ops,
// including planted ties (lowest index wins); AdjustLogitsF32 bit for bit against
// CpuBackend::AdjustLogits.
#include "kernels/sampling/argmax.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/adjust_logits.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

TEST(ArgmaxKernelTest, MatchesCpuBackendWithTies) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t vocab : {1, 7, 1000, 4096, 4097, 12289, 129280}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " seed " << seed);
    const int64_t rows = 12;
    auto logits = testing::RandomFloats(rows * vocab, seed);
    std::mt19937 gen(seed + 1);
    std::uniform_int_distribution<int64_t> col(0, vocab - 1);
    for (int64_t r = 0; r < rows; r += 2) {  // even rows: the maximum twice (or more)
      const float top = 100.0f + r;
      for (int k = 0; k < 3; ++k) logits[r * vocab + col(gen)] = top;
    }
    for (int64_t i = 0; i < vocab; ++i) logits[3 * vocab + i] = -1.5f;  // a constant row
    std::vector<int32_t> want(rows);
    cpu.ArgmaxRows(rows, vocab, logits.data(), want.data());
    DeviceArray<float> dl(logits);
    DeviceArray<int32_t> dout(rows);
    DeviceArray<char> ws(kernels::ArgmaxWorkspaceBytes(rows, vocab));
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::ArgmaxRowsF32(rows, vocab, dl.get(), ws.get(), dout.get(), nullptr));
    std::vector<int32_t> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_EQ(got, want);
    EXPECT_EQ(got[3], 0);
  }
}

TEST(ArgmaxKernelTest, GreedySampleMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t vocab : {1, 33, 4096, 8193, 129280}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " seed " << seed);
    const int64_t rows = 9;
    auto logits = testing::RandomFloats(rows * vocab, seed);
    for (int64_t i = 0; i < vocab; ++i) logits[i] *= 20.0f;  // a peaked row
    std::vector<int32_t> want_tok(rows);
    std::vector<float> want_lp(rows);
    cpu.GreedySampleRows(rows, vocab, logits.data(), want_tok.data(), want_lp.data());
    DeviceArray<float> dl(logits);
    DeviceArray<int32_t> dtok(rows);
    DeviceArray<float> dlp(rows);
    DeviceArray<char> ws(kernels::ArgmaxWorkspaceBytes(rows, vocab));
    dtok.Poison();
    dlp.Poison();
    DEEPINFER_CUDA_OK(kernels::GreedySampleRowsF32(rows, vocab, dl.get(), ws.get(), dtok.get(),
                                                   dlp.get(), nullptr));
    std::vector<int32_t> got_tok;
    std::vector<float> got_lp;
    DEEPINFER_CUDA_OK(dtok.Download(&got_tok));
    DEEPINFER_CUDA_OK(dlp.Download(&got_lp));
    EXPECT_EQ(got_tok, want_tok);
    for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(got_lp[r], want_lp[r], 1e-5f) << "row " << r;
  }
}

// The maximum planted in several chunks of the row (ties across blocks go to the lowest
// index), rows that are not 16-byte aligned (the scalar path), a row of -inf, many rows.
TEST(ArgmaxKernelTest, TiesAcrossChunksAndUnalignedRows) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const int64_t vocab = 129280, rows = 70;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // One spare float in front: logits + 1 is 4-byte but not 16-byte aligned.
  auto buf = testing::RandomFloats(rows * vocab + 1, seed, 3.0f);
  float* logits = buf.data() + 1;
  std::mt19937 gen(seed + 1);
  std::uniform_int_distribution<int64_t> col(0, vocab - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t a = col(gen), b = col(gen);
    logits[r * vocab + a] = 50.0f;
    logits[r * vocab + b] = 50.0f;
    logits[r * vocab + (r * 4096) % vocab] = 50.0f;  // a chunk's first value
  }
  for (int64_t i = 0; i < vocab; ++i) logits[5 * vocab + i] = -INFINITY;
  std::vector<int32_t> want(rows), want_tok(rows);
  std::vector<float> want_lp(rows);
  cpu.ArgmaxRows(rows, vocab, logits, want.data());
  cpu.GreedySampleRows(rows, vocab, logits, want_tok.data(), want_lp.data());
  DeviceArray<float> dbuf(buf);
  DeviceArray<int32_t> dout(rows), dtok(rows);
  DeviceArray<float> dlp(rows);
  DeviceArray<char> ws(kernels::ArgmaxWorkspaceBytes(rows, vocab));
  dout.Poison();
  dtok.Poison();
  dlp.Poison();
  DEEPINFER_CUDA_OK(
      kernels::ArgmaxRowsF32(rows, vocab, dbuf.get() + 1, ws.get(), dout.get(), nullptr));
  DEEPINFER_CUDA_OK(kernels::GreedySampleRowsF32(rows, vocab, dbuf.get() + 1, ws.get(), dtok.get(),
                                                 dlp.get(), nullptr));
  std::vector<int32_t> got, got_tok;
  std::vector<float> got_lp;
  DEEPINFER_CUDA_OK(dout.Download(&got));
  DEEPINFER_CUDA_OK(dtok.Download(&got_tok));
  DEEPINFER_CUDA_OK(dlp.Download(&got_lp));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_tok, want_tok);
  EXPECT_EQ(got[5], 0);
  for (int64_t r = 0; r < rows; ++r) {
    if (r == 5) continue;  // log-sum-exp of -inf values: NaN on both sides
    EXPECT_NEAR(got_lp[r], want_lp[r], 1e-5f) << "row " << r;
  }
}

// The raw logprob of given tokens (any position of the row, one outside the vocabulary).
TEST(ArgmaxKernelTest, TokenLogprobMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t vocab : {1, 33, 4097, 129280}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " seed " << seed);
    const int64_t rows = 7;
    auto logits = testing::RandomFloats(rows * vocab, seed, 4.0f);
    std::mt19937 gen(seed + 1);
    std::vector<int32_t> token(rows);
    for (int64_t r = 0; r < rows; ++r) token[r] = static_cast<int32_t>(gen() % vocab);
    token[rows - 1] = static_cast<int32_t>(vocab);  // outside: NaN
    std::vector<float> want(rows);
    cpu.TokenLogprobRows(rows, vocab, logits.data(), token.data(), want.data());
    DeviceArray<float> dl(logits);
    DeviceArray<int32_t> dtok(token);
    DeviceArray<float> dlp(rows);
    DeviceArray<char> ws(kernels::ArgmaxWorkspaceBytes(rows, vocab));
    dlp.Poison();
    DEEPINFER_CUDA_OK(kernels::TokenLogprobRowsF32(rows, vocab, dl.get(), ws.get(), dtok.get(),
                                                   dlp.get(), nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dlp.Download(&got));
    for (int64_t r = 0; r + 1 < rows; ++r) EXPECT_NEAR(got[r], want[r], 1e-5f) << "row " << r;
    EXPECT_TRUE(std::isnan(got[rows - 1]));
    EXPECT_TRUE(std::isnan(want[rows - 1]));
  }
}

TEST(AdjustLogitsKernelTest, BitIdenticalToCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(1);
  const int64_t rows = 5, vocab = 129280;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  auto logits = testing::RandomFloats(rows * vocab, seed, 5.0f);
  std::mt19937 gen(seed + 1);
  const float biases[] = {0.0f, 2.5f, -3.0f, 100.0f, -100.0f, -INFINITY, 0.1f};
  const float repetitions[] = {1.0f, 1.3f, 0.7f, 1.1f};
  const float subtracts[] = {0.0f, 0.35f, -1.25f, 2.0f};
  std::vector<LogitAdjustment> entries;
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t t = static_cast<int32_t>(gen() % 97); t < vocab; t += 97 + gen() % 2000) {
      LogitAdjustment a;
      a.row = r;
      a.token = t;
      a.bias = biases[gen() % 7];
      a.repetition = repetitions[gen() % 4];
      a.subtract = subtracts[gen() % 4];
      entries.push_back(a);
    }
  }
  LogitAdjustment outside;  // skipped on both sides
  outside.row = rows;
  outside.bias = 5.0f;
  entries.push_back(outside);
  std::vector<float> want = logits;
  cpu.AdjustLogits(rows, vocab, want.data(), static_cast<int64_t>(entries.size()), entries.data(),
                   nullptr);
  DeviceArray<float> dl(logits);
  DeviceArray<LogitAdjustment> de(entries);
  DEEPINFER_CUDA_OK(kernels::AdjustLogitsF32(
      rows, vocab, dl.get(), static_cast<int64_t>(entries.size()), de.get(), nullptr, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dl.Download(&got));
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    differ += !(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
  }
  EXPECT_EQ(differ, 0);
  EXPECT_NE(want, logits);  // the entries did change something

  // A device count: only the first half of the entries apply.
  const int32_t half = static_cast<int32_t>(entries.size() / 2);
  std::vector<float> want_half = logits;
  cpu.AdjustLogits(rows, vocab, want_half.data(), static_cast<int64_t>(entries.size()),
                   entries.data(), &half);
  DeviceArray<float> dl_half(logits);
  DeviceArray<int32_t> dcount(std::vector<int32_t>{half});
  DEEPINFER_CUDA_OK(kernels::AdjustLogitsF32(rows, vocab, dl_half.get(),
                                             static_cast<int64_t>(entries.size()), de.get(),
                                             dcount.get(), nullptr));
  std::vector<float> got_half;
  DEEPINFER_CUDA_OK(dl_half.Download(&got_half));
  differ = 0;
  for (size_t i = 0; i < got_half.size(); ++i) {
    differ +=
        !(got_half[i] == want_half[i] || (std::isnan(got_half[i]) && std::isnan(want_half[i])));
  }
  EXPECT_EQ(differ, 0);
  EXPECT_NE(want_half, want);
}

}  // namespace
}  // namespace deepinfer
