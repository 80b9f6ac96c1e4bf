// SampleRowsF32 and TopLogprobsF32 against CpuBackend (which runs worker/sampling's Sampler):
// the same tokens, logprobs within 1e-5, on fresh random logits with planted ties (-0 against
// +0 among them) and mixed per-row parameters.
#include "kernels/sampling/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

// Rows cycle through greedy, temperature only, top-k (1, small, >= vocab) and top-p (tiny,
// small, large) and their mixes; some rows have an invalid top_p or a NaN temperature.
std::vector<RowSamplingParams> MixedParams(int64_t rows, int64_t vocab, std::mt19937_64* gen) {
  const float temps[] = {0.0f, 0.3f, 1.0f, 1.7f};
  const int32_t ks[] = {0, 1, 7, 50, static_cast<int32_t>(vocab) + 1};
  const float ps[] = {1.0f, 0.95f, 0.5f, 1e-6f};
  std::vector<RowSamplingParams> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    out[r].temperature = temps[(*gen)() % 4];
    out[r].top_k = ks[(*gen)() % 5];
    out[r].top_p = ps[(*gen)() % 4];
    out[r].seed = (*gen)();
    out[r].position = static_cast<int64_t>((*gen)() % (int64_t{1} << 40));
    if (r % 13 == 12) out[r].top_p = r % 2 ? -0.5f : std::numeric_limits<float>::quiet_NaN();
    if (r % 13 == 6) out[r].temperature = std::numeric_limits<float>::quiet_NaN();
  }
  return out;
}

std::vector<float> LogitsWithTies(int64_t rows, int64_t vocab, uint32_t seed) {
  auto logits = testing::RandomFloats(rows * vocab, seed, 2.0f);
  std::mt19937 gen(seed + 1);
  std::uniform_int_distribution<int64_t> col(0, vocab - 1);
  for (int64_t r = 0; r < rows; r += 2) {
    const float top = 8.0f + (r % 3);  // the maximum two or three times
    for (int k = 0; k < 3; ++k) logits[r * vocab + col(gen)] = top;
    logits[r * vocab + col(gen)] = 0.0f;
    logits[r * vocab + col(gen)] = -0.0f;
  }
  return logits;
}

TEST(SampleKernelTest, SampleRowsMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t vocab : {1, 2, 37, 1000, 129280}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " seed " << seed);
    const int64_t rows = vocab > 10000 ? 26 : 64;
    const auto logits = LogitsWithTies(rows, vocab, seed);
    std::mt19937_64 gen(seed + 2);
    const auto params = MixedParams(rows, vocab, &gen);
    std::vector<int32_t> want_tok(rows);
    std::vector<float> want_lp(rows);
    cpu.SampleRows(rows, vocab, logits.data(), params.data(), want_tok.data(), want_lp.data());
    ASSERT_TRUE(cpu.status().ok()) << cpu.status();

    DeviceArray<float> dl(logits);
    DeviceArray<RowSamplingParams> dp(params);
    DeviceArray<int32_t> dtok(rows);
    DeviceArray<float> dlp(rows);
    ASSERT_TRUE(dl.ok() && dp.ok() && dtok.ok() && dlp.ok());
    dtok.Poison();
    dlp.Poison();
    DEEPINFER_CUDA_OK(
        kernels::SampleRowsF32(rows, vocab, dl.get(), dp.get(), dtok.get(), dlp.get(), nullptr));
    std::vector<int32_t> got_tok;
    std::vector<float> got_lp;
    DEEPINFER_CUDA_OK(dtok.Download(&got_tok));
    DEEPINFER_CUDA_OK(dlp.Download(&got_lp));
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message()
                   << "row " << r << " T " << params[r].temperature << " top_k " << params[r].top_k
                   << " top_p " << params[r].top_p);
      EXPECT_EQ(got_tok[r], want_tok[r]);
      if (want_tok[r] < 0) {
        EXPECT_TRUE(std::isnan(got_lp[r]));  // an invalid row, both NaN
      } else {
        EXPECT_NEAR(got_lp[r], want_lp[r], 1e-5f);
      }
    }
  }
}

// Rows and parameters at the edges of the kernel's selection: logits spread over hundreds with
// -inf among them (top-p skips the exp of tokens 40 below the top), a row of one value (every
// key ties in the logit: the cut falls among ids), tokens around exactly 40 below the top,
// a row packed into a narrow range (many radix digits shared), random rows; temperatures 1e-4
// to 1e4, top_k 1 / 2 / vocab - 1, top_p 1 / 0.95 / 1e-6 / the largest float below 1; vocabs
// that are not multiples of the block or of its unrolled stride, and both model vocabularies.
TEST(SampleKernelTest, EdgeRowsMatchCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const float temps[] = {1e-4f, 0.8f, 1.0f, 1e4f};
  const float ps[] = {1.0f, 0.95f, 1e-6f, std::nextafter(1.0f, 0.0f)};
  for (int64_t vocab : {513, 4099, 129280, 163840}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " seed " << seed);
    std::mt19937_64 gen(seed);
    const int64_t rows = vocab > 10000 ? 40 : 320;
    const int32_t ks[] = {0, 1, 2, static_cast<int32_t>(vocab) - 1};
    std::vector<float> logits(rows * vocab);
    std::vector<RowSamplingParams> params(rows);
    for (int64_t r = 0; r < rows; ++r) {
      float* l = logits.data() + r * vocab;
      const int kind = r % 5;
      if (kind == 0) {
        std::normal_distribution<float> d(0.0f, 30.0f);
        for (int64_t i = 0; i < vocab; ++i)
          l[i] = gen() % 20 == 0 ? -std::numeric_limits<float>::infinity() : d(gen);
      } else if (kind == 1) {
        std::fill(l, l + vocab, 1.5f);
      } else if (kind == 2) {
        std::uniform_real_distribution<float> d(-40.5f, -39.5f);
        for (int64_t i = 0; i < vocab; ++i) l[i] = d(gen);
        l[gen() % vocab] = -40.0f;
        l[gen() % vocab] = std::nextafter(-40.0f, 0.0f);
        l[gen() % vocab] = 0.0f;
      } else if (kind == 3) {
        std::uniform_real_distribution<float> d(4.0f, 4.001f);
        for (int64_t i = 0; i < vocab; ++i) l[i] = d(gen);
      } else {
        std::normal_distribution<float> d(0.0f, 2.5f);
        for (int64_t i = 0; i < vocab; ++i) l[i] = d(gen);
      }
      const int64_t c = r / 5;  // the parameter combination, all 64 for the small vocabularies
      params[r].temperature = temps[c % 4];
      params[r].top_k = ks[(c / 4) % 4];
      params[r].top_p = ps[(c / 16 + (vocab > 10000 ? c : 0)) % 4];
      params[r].seed = gen();
      params[r].position = static_cast<int64_t>(gen() % 100000);
    }
    std::vector<int32_t> want_tok(rows);
    std::vector<float> want_lp(rows);
    cpu.SampleRows(rows, vocab, logits.data(), params.data(), want_tok.data(), want_lp.data());
    ASSERT_TRUE(cpu.status().ok()) << cpu.status();
    DeviceArray<float> dl(logits);
    DeviceArray<RowSamplingParams> dp(params);
    DeviceArray<int32_t> dtok(rows);
    DeviceArray<float> dlp(rows);
    ASSERT_TRUE(dl.ok() && dp.ok() && dtok.ok() && dlp.ok());
    dtok.Poison();
    dlp.Poison();
    DEEPINFER_CUDA_OK(
        kernels::SampleRowsF32(rows, vocab, dl.get(), dp.get(), dtok.get(), dlp.get(), nullptr));
    std::vector<int32_t> got_tok;
    std::vector<float> got_lp;
    DEEPINFER_CUDA_OK(dtok.Download(&got_tok));
    DEEPINFER_CUDA_OK(dlp.Download(&got_lp));
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message()
                   << "row " << r << " kind " << r % 5 << " T " << params[r].temperature
                   << " top_k " << params[r].top_k << " top_p " << params[r].top_p);
      EXPECT_EQ(got_tok[r], want_tok[r]);
      // Logprobs down to a few hundred here: 1e-5 relative (a float's last bits).
      EXPECT_NEAR(got_lp[r], want_lp[r], 1e-5f * std::max(1.0f, std::fabs(want_lp[r])));
    }
  }
}

// Many positions of one row with top-p and top-k: the kernel's draws are the host's draws.
TEST(SampleKernelTest, SameTokensOverManyPositions) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const int64_t vocab = 4096, rows = 256;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const auto row = testing::RandomFloats(vocab, seed, 3.0f);
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<RowSamplingParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].temperature = 0.8f;
    params[r].top_k = r % 2 ? 100 : 0;
    params[r].top_p = r % 4 < 2 ? 0.9f : 1.0f;
    params[r].seed = seed;
    params[r].position = r;
  }
  std::vector<int32_t> want(rows);
  std::vector<float> want_lp(rows);
  cpu.SampleRows(rows, vocab, logits.data(), params.data(), want.data(), want_lp.data());
  DeviceArray<float> dl(logits);
  DeviceArray<RowSamplingParams> dp(params);
  DeviceArray<int32_t> dtok(rows);
  DeviceArray<float> dlp(rows);
  dtok.Poison();
  DEEPINFER_CUDA_OK(
      kernels::SampleRowsF32(rows, vocab, dl.get(), dp.get(), dtok.get(), dlp.get(), nullptr));
  std::vector<int32_t> got;
  DEEPINFER_CUDA_OK(dtok.Download(&got));
  EXPECT_EQ(got, want);
}

// A planted race tie (two tokens with U == 1, see sample_row_test): the earlier candidate wins
// in Sampler's order, id order without a filter, logit order with one.
TEST(SampleKernelTest, RaceTiesGoToTheEarlierCandidate) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const int64_t vocab = 480000, rows = 3;
  std::vector<float> logits(rows * vocab, 0.0f);
  std::vector<RowSamplingParams> params(rows);
  const int32_t ks[] = {0, 2, 0};
  const float ps[] = {1.0f, 1.0f, 0.99f};
  for (int64_t r = 0; r < rows; ++r) {
    logits[r * vocab + 141671] = 0.5f;  // U(1, 10, id) == 1 for both ids
    logits[r * vocab + 471104] = 1.0f;
    params[r].temperature = 1.0f;
    params[r].top_k = ks[r];
    params[r].top_p = ps[r];
    params[r].seed = 1;
    params[r].position = 10;
  }
  std::vector<int32_t> want(rows);
  std::vector<float> want_lp(rows);
  cpu.SampleRows(rows, vocab, logits.data(), params.data(), want.data(), want_lp.data());
  EXPECT_EQ(want, (std::vector<int32_t>{141671, 471104, 471104}));
  DeviceArray<float> dl(logits);
  DeviceArray<RowSamplingParams> dp(params);
  DeviceArray<int32_t> dtok(rows);
  DeviceArray<float> dlp(rows);
  dtok.Poison();
  DEEPINFER_CUDA_OK(
      kernels::SampleRowsF32(rows, vocab, dl.get(), dp.get(), dtok.get(), dlp.get(), nullptr));
  std::vector<int32_t> got;
  DEEPINFER_CUDA_OK(dtok.Download(&got));
  EXPECT_EQ(got, want);
}

TEST(SampleKernelTest, TopLogprobsMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t vocab : {1, 7, 1000, 129280}) {
    for (int32_t n : {1, 5, kMaxTopLogprobs}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " n " << n << " seed " << seed);
      const int64_t rows = 9;
      auto logits = LogitsWithTies(rows, vocab, seed);
      for (int64_t i = 0; i < vocab; i += 3) logits[vocab + i] = 1.5f;  // row 1: many ties
      std::vector<int32_t> want_ids(rows * n);
      std::vector<float> want_lp(rows * n);
      cpu.TopLogprobsRows(rows, vocab, logits.data(), n, want_ids.data(), want_lp.data());
      ASSERT_TRUE(cpu.status().ok()) << cpu.status();
      DeviceArray<float> dl(logits);
      DeviceArray<int32_t> dids(rows * n);
      DeviceArray<float> dlp(rows * n);
      dids.Poison();
      dlp.Poison();
      DEEPINFER_CUDA_OK(
          kernels::TopLogprobsF32(rows, vocab, dl.get(), n, dids.get(), dlp.get(), nullptr));
      std::vector<int32_t> got_ids;
      std::vector<float> got_lp;
      DEEPINFER_CUDA_OK(dids.Download(&got_ids));
      DEEPINFER_CUDA_OK(dlp.Download(&got_lp));
      EXPECT_EQ(got_ids, want_ids);
      for (int64_t i = 0; i < rows * n; ++i) {
        if (want_ids[i] < 0) {
          EXPECT_EQ(got_lp[i], -std::numeric_limits<float>::infinity()) << i;
        } else {
          EXPECT_NEAR(got_lp[i], want_lp[i], 1e-5f) << i;
        }
      }
    }
  }
}

TEST(SampleKernelTest, RejectsBadArguments) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  EXPECT_EQ(kernels::TopLogprobsF32(1, 4, nullptr, 0, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::TopLogprobsF32(1, 4, nullptr, kMaxTopLogprobs + 1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::SampleRowsF32(1, 0, nullptr, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::SampleRowsF32(0, 4, nullptr, nullptr, nullptr, nullptr, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace deepinfer
