// The sampling kernel's own per-row code (sample_row.h) run in one host thread (SerialBlock)
// against Sampler, on fresh random rows with planted ties (-0 against +0 among them) and every
// mix of greedy, temperature, top-k and top-p. Checks the algorithm (candidate keys, the top-k
// and top-p bisections, tie order, the race) on a machine without a GPU; the CUDA reductions
// and device math are sample_test's job.
#include "kernels/sampling/sample_row.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/sampling/counter_rng.h"
#include "worker/sampling/sampler.h"

namespace deepinfer {
namespace {

using kernels::sample_row::SerialBlock;

std::vector<float> RandomRow(int64_t vocab, std::mt19937_64* gen, int kind) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> l(vocab);
  for (float& x : l) x = d(*gen);
  if (kind == 1) {  // planted ties, the maximum among them
    for (int k = 0; k < 3; ++k) {
      l[(*gen)() % vocab] = 9.0f;
      l[(*gen)() % vocab] = 0.0f;
      l[(*gen)() % vocab] = -0.0f;
    }
  } else if (kind == 2) {  // few distinct values: ties everywhere
    for (float& x : l) x = std::round(x);
  }
  return l;
}

TEST(SampleRowTest, SampleRowIsSampler) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 gen(seed);
  const float temps[] = {0.0f, 0.3f, 1.0f, 1.7f};
  const float ps[] = {1.0f, 0.999f, 0.95f, 0.5f, 1e-6f};
  int64_t rows = 0, sampled = 0;
  for (int64_t vocab : {1, 2, 3, 37, 1000, 4000}) {
    const int32_t ks[] = {
        0, 1, 7, 50, static_cast<int32_t>(vocab), static_cast<int32_t>(vocab) + 1};
    for (int t = 0; t < (vocab > 1000 ? 150 : 1000); ++t, ++rows) {
      const auto l = RandomRow(vocab, &gen, t % 3);
      RowSamplingParams p;
      p.temperature = temps[gen() % 4];
      p.top_k = ks[gen() % 6];
      p.top_p = ps[gen() % 5];
      p.seed = gen();
      p.position = static_cast<int64_t>(gen() % (int64_t{1} << 40));
      if (t % 50 == 7) p.top_p = 0.0f;
      if (t % 50 == 8) p.temperature = std::numeric_limits<float>::quiet_NaN();
      SamplingParams sp;
      sp.temperature = p.temperature;
      sp.top_k = p.top_k;
      sp.top_p = p.top_p;
      sp.seed = p.seed;
      auto want = Sampler::Sample(l.data(), static_cast<int32_t>(vocab), sp, p.position);
      SerialBlock block;
      float lp = 0.0f;
      const int32_t got = kernels::sample_row::SampleRow(block, l.data(), vocab, p, &lp);
      SCOPED_TRACE(::testing::Message()
                   << "vocab " << vocab << " row " << t << " T " << p.temperature << " top_k "
                   << p.top_k << " top_p " << p.top_p);
      if (!want.ok()) {
        EXPECT_EQ(got, -1);
        EXPECT_TRUE(std::isnan(lp));
        continue;
      }
      ASSERT_EQ(got, want->token);
      sampled += p.temperature > 0.0f;
      // The same arithmetic in the same order on the host: the same float.
      EXPECT_EQ(lp, want->logprob);
    }
  }
  EXPECT_GT(sampled, rows / 2);  // most rows went through the race, not greedy or an error
}

// Rows and parameters at the algorithm's edges, every combination: logits spread over hundreds
// (most tokens more than 40 below the top in l / T, whose top-p mass is 0 without an exp) with
// -inf among them, a row of one value (every key ties in the logit), tokens around exactly 40
// below the top, and random rows; temperatures from 1e-4 to 1e4, top_k 1 / 2 / vocab - 1,
// top_p 1 / 0.95 / 1e-6 / the largest float below 1; vocabularies that are not multiples of
// the block or of the unrolled stride.
TEST(SampleRowTest, EdgeRowsAreSampler) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 gen(seed);
  const float temps[] = {1e-4f, 0.8f, 1.0f, 1e4f};
  const float ps[] = {1.0f, 0.95f, 1e-6f, std::nextafter(1.0f, 0.0f)};
  for (int64_t vocab : {513, 1537, 4099}) {
    const int32_t ks[] = {0, 1, 2, static_cast<int32_t>(vocab) - 1};
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<float> l;
      if (kind == 0) {  // wide, with -inf
        std::normal_distribution<float> d(0.0f, 30.0f);
        l.resize(vocab);
        for (float& x : l) x = gen() % 20 == 0 ? -std::numeric_limits<float>::infinity() : d(gen);
      } else if (kind == 1) {  // one value
        l.assign(vocab, 1.5f);
      } else if (kind == 2) {  // the top at 0, the rest around -40
        l.resize(vocab);
        std::uniform_real_distribution<float> d(-40.5f, -39.5f);
        for (float& x : l) x = d(gen);
        l[gen() % vocab] = -40.0f;
        l[gen() % vocab] = std::nextafter(-40.0f, 0.0f);
        l[gen() % vocab] = std::nextafter(-40.0f, -100.0f);
        l[gen() % vocab] = 0.0f;
      } else {
        l = RandomRow(vocab, &gen, 0);
      }
      for (float t : temps) {
        for (int32_t k : ks) {
          for (float top_p : ps) {
            RowSamplingParams p;
            p.temperature = t;
            p.top_k = k;
            p.top_p = top_p;
            p.seed = gen();
            p.position = static_cast<int64_t>(gen() % 100000);
            SamplingParams sp;
            sp.temperature = p.temperature;
            sp.top_k = p.top_k;
            sp.top_p = p.top_p;
            sp.seed = p.seed;
            auto want = Sampler::Sample(l.data(), static_cast<int32_t>(vocab), sp, p.position);
            ASSERT_TRUE(want.ok()) << want.status();
            SerialBlock block;
            float lp = 0.0f;
            const int32_t got = kernels::sample_row::SampleRow(block, l.data(), vocab, p, &lp);
            SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " kind " << kind << " T " << t
                                              << " top_k " << k << " top_p " << top_p);
            ASSERT_EQ(got, want->token);
            EXPECT_EQ(lp, want->logprob);
          }
        }
      }
    }
  }
}

// LargestCut with a guessed first digit (SampleRow guesses it for top-p from the z pass) gives
// the select's result whatever the guess: every digit is tried on rows with ties, -0 / +0 and
// zero weights, counting and weighted sums, targets from 1 to past the total.
TEST(SampleRowTest, LargestCutIsExactForEveryGuess) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 gen(seed);
  using kernels::sample_row::Key;
  using kernels::sample_row::LargestCut;
  using kernels::sample_row::u64;
  for (int t = 0; t < 24; ++t) {
    const int64_t vocab = 1 + static_cast<int64_t>(gen() % 300);
    const auto l = RandomRow(vocab, &gen, t % 3);
    std::vector<u64> w(vocab);
    for (u64& x : w) x = gen() % 4 == 0 ? 0 : gen() % 1000;
    u64 total = 0;
    for (u64 x : w) total += x;
    const u64 lo = t % 2 ? 0 : Key(l[gen() % vocab], 0);
    auto weighted = [&](int64_t i, float) { return w[i]; };
    auto counting = [](int64_t, float) { return u64{1}; };
    for (const u64 target : {u64{1}, total / 3 + 1, total, total + 1, u64{5}}) {
      SCOPED_TRACE(::testing::Message()
                   << "row " << t << " vocab " << vocab << " target " << target);
      SerialBlock block;
      const u64 want_w = LargestCut(block, l.data(), vocab, lo, target, weighted);
      const u64 want_c = LargestCut(block, l.data(), vocab, lo, target, counting);
      for (int guess = 0; guess < kernels::sample_row::kBins; ++guess) {
        ASSERT_EQ(LargestCut(block, l.data(), vocab, lo, target, weighted, guess), want_w) << guess;
        ASSERT_EQ(LargestCut(block, l.data(), vocab, lo, target, counting, guess), want_c) << guess;
      }
    }
  }
}

// Two tokens whose uniforms are exactly 1 (E = 0, race +inf) tie in the race; the earlier
// candidate wins: the lower id when Sampler keeps id order (no filter), the larger logit when
// it sorts (top-k or top-p). Random rows practically never tie, so this plants one.
TEST(SampleRowTest, RaceTiesGoToTheEarlierCandidate) {
  const uint64_t seed = 1;
  const int64_t position = 10, low = 141671, high = 471104;  // found by search: U == 1 at both
  ASSERT_EQ(CounterRng::Uniform(seed, position, low), 1.0f);
  ASSERT_EQ(CounterRng::Uniform(seed, position, high), 1.0f);
  const int64_t vocab = 480000;
  std::vector<float> l(vocab, 0.0f);
  l[low] = 0.5f;
  l[high] = 1.0f;
  struct Case {
    int32_t top_k;
    float top_p;
    int32_t want;
  };
  for (const Case& c :
       {Case{0, 1.0f, static_cast<int32_t>(low)}, Case{2, 1.0f, static_cast<int32_t>(high)},
        Case{0, 0.99f, static_cast<int32_t>(high)}}) {
    SCOPED_TRACE(::testing::Message() << "top_k " << c.top_k << " top_p " << c.top_p);
    RowSamplingParams p;
    p.temperature = 1.0f;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.seed = seed;
    p.position = position;
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_k = c.top_k;
    sp.top_p = c.top_p;
    sp.seed = seed;
    auto want = Sampler::Sample(l.data(), static_cast<int32_t>(vocab), sp, position);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(want->token, c.want);
    SerialBlock block;
    float lp = 0.0f;
    EXPECT_EQ(kernels::sample_row::SampleRow(block, l.data(), vocab, p, &lp), c.want);
  }
}

TEST(SampleRowTest, TopLogprobsRowIsSampler) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 gen(seed);
  for (int64_t vocab : {1, 7, 500}) {
    for (int32_t n : {1, 6, kMaxTopLogprobs}) {
      for (int kind = 0; kind < 3; ++kind) {
        SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " n " << n << " kind " << kind);
        const auto l = RandomRow(vocab, &gen, kind);
        SamplingParams sp;
        sp.num_logprobs = n;
        auto want = Sampler::Sample(l.data(), static_cast<int32_t>(vocab), sp, 0);
        ASSERT_TRUE(want.ok()) << want.status();
        std::vector<int32_t> ids(n, -7);
        std::vector<float> lps(n, 7.0f);
        SerialBlock block;
        kernels::sample_row::TopLogprobsRow(block, l.data(), vocab, n, ids.data(), lps.data());
        for (int32_t j = 0; j < n; ++j) {
          if (j < vocab) {
            EXPECT_EQ(ids[j], want->top_logprobs[j].first) << j;
            EXPECT_EQ(lps[j], want->top_logprobs[j].second) << j;
          } else {
            EXPECT_EQ(ids[j], -1) << j;
            EXPECT_EQ(lps[j], -std::numeric_limits<float>::infinity()) << j;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
