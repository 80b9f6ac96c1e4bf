// DeviceSampler on the CPU backend against Sampler::Sample on the same rows: greedy, seeded
// temperature / top-k / top-p, top logprobs and logit adjustments mixed in one call, rows in any
// order (gathered) or consecutive (in place), and the errors it reports before running anything.
#include "worker/sampling/device_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

std::vector<float> RandomLogits(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Requests cycling through greedy / hot, top-k, top-p and top logprobs (0, 1, 5, the maximum).
std::vector<RowSampleRequest> MixedRequests(const std::vector<int64_t>& rows, uint32_t seed) {
  std::mt19937_64 gen(seed);
  const float temps[] = {0.0f, 0.7f, 1.0f, 1.6f};
  const int32_t ks[] = {0, 1, 5, 40};
  const float ps[] = {1.0f, 0.9f, 0.3f};
  const int32_t ns[] = {0, 1, 5, kMaxTopLogprobs};
  std::vector<RowSampleRequest> out;
  for (int64_t r : rows) {
    RowSampleRequest q;
    q.row = r;
    q.params.temperature = temps[gen() % 4];
    q.params.top_k = ks[gen() % 4];
    q.params.top_p = ps[gen() % 3];
    q.params.seed = gen();
    q.params.num_logprobs = ns[gen() % 4];
    q.position = static_cast<int64_t>(gen() % 100000);
    out.push_back(q);
  }
  return out;
}

void ExpectSameAsSampler(const std::vector<float>& logits, int64_t vocab,
                         const std::vector<RowSampleRequest>& requests,
                         const std::vector<SampledToken>& got) {
  ASSERT_EQ(got.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const RowSampleRequest& q = requests[i];
    SCOPED_TRACE(::testing::Message()
                 << "request " << i << " row " << q.row << " T " << q.params.temperature << " k "
                 << q.params.top_k << " p " << q.params.top_p << " n " << q.params.num_logprobs);
    auto want = Sampler::Sample(logits.data() + q.row * vocab, static_cast<int32_t>(vocab),
                                q.params, q.position);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(got[i].token, want->token);
    EXPECT_EQ(got[i].logprob, want->logprob);  // the CPU ops run Sampler's arithmetic
    EXPECT_EQ(got[i].top_logprobs, want->top_logprobs);
  }
}

TEST(DeviceSamplerTest, MixedRequestsMatchSamplerOnTheCpuBackend) {
  CpuBackend cpu(2);
  for (int64_t vocab : {3, 1000}) {
    const int64_t rows = 24;
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    auto logits = RandomLogits(rows * vocab, 11 + vocab);
    logits[vocab + 7 % vocab] = logits[vocab + 2 % vocab] = 30.0f;  // a tie in row 1
    auto dev = cpu.Allocate(logits.size() * sizeof(float));
    cpu.CopyToDevice(logits.data(), logits.size() * sizeof(float), dev->data());
    // Out of order with repeats (gathered), then every row in order (in place).
    std::vector<int64_t> scattered = {5, 1, 1, 23, 0, 17, 9, 9, 12, 3, 20, 4, 6};
    std::vector<int64_t> in_order;
    for (int64_t r = 0; r < rows; ++r) in_order.push_back(r);
    for (const auto& order : {scattered, in_order}) {
      const auto requests = MixedRequests(order, static_cast<uint32_t>(order.size()));
      auto got = DeviceSampler::Sample(&cpu, dev->as<float>(), rows, vocab, requests);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSameAsSampler(logits, vocab, requests, *got);
    }
  }
}

// Gives every other request logit adjustments (bias, masks, repetition, subtraction) on a few
// distinct tokens, the row's most likely token among them half of the time.
void AddAdjustments(const std::vector<float>& logits, int64_t vocab,
                    std::vector<RowSampleRequest>* requests, uint32_t seed) {
  std::mt19937 gen(seed);
  const float biases[] = {0.0f,   2.5f,    -3.0f,
                          100.0f, -100.0f, -std::numeric_limits<float>::infinity()};
  const float repetitions[] = {1.0f, 1.3f, 0.7f};
  const float subtracts[] = {0.0f, 0.5f, -1.25f};
  for (size_t i = 0; i < requests->size(); i += 2) {
    RowSampleRequest& q = (*requests)[i];
    const float* row = logits.data() + q.row * vocab;
    std::vector<int32_t> tokens;
    if (gen() % 2 == 0)
      tokens.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    for (int k = 0; k < 4; ++k) tokens.push_back(static_cast<int32_t>(gen() % vocab));
    std::sort(tokens.begin(), tokens.end());
    tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
    for (int32_t t : tokens) {
      LogitAdjustment a;
      a.token = t;
      a.bias = biases[gen() % 6];
      a.repetition = repetitions[gen() % 3];
      a.subtract = subtracts[gen() % 3];
      q.params.adjustments.push_back(a);
    }
  }
}

TEST(DeviceSamplerTest, AdjustedRequestsMatchSamplerOnTheCpuBackend) {
  CpuBackend cpu(2);
  for (int64_t vocab : {7, 1000}) {
    const int64_t rows = 16;
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    auto logits = RandomLogits(rows * vocab, 5 + vocab);
    auto dev = cpu.Allocate(logits.size() * sizeof(float));
    cpu.CopyToDevice(logits.data(), logits.size() * sizeof(float), dev->data());
    std::vector<int64_t> scattered = {3, 15, 0, 7, 7, 11, 2, 9};
    std::vector<int64_t> in_order;
    for (int64_t r = 0; r < rows; ++r) in_order.push_back(r);
    for (const auto& order : {scattered, in_order}) {
      auto requests = MixedRequests(order, static_cast<uint32_t>(order.size() + 3));
      AddAdjustments(logits, vocab, &requests, static_cast<uint32_t>(vocab));
      auto got = DeviceSampler::Sample(&cpu, dev->as<float>(), rows, vocab, requests);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSameAsSampler(logits, vocab, requests, *got);
    }
    // The logits themselves are left as they were (adjustments work on a copy).
    std::vector<float> after(logits.size());
    cpu.CopyToHost(dev->data(), after.size() * sizeof(float), after.data());
    EXPECT_EQ(after, logits);
  }
}

TEST(DeviceSamplerTest, LogitBiasForcesTheTokenOnTheDevicePath) {
  CpuBackend cpu(1);
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.0f};
  auto dev = cpu.Allocate(logits.size() * sizeof(float));
  cpu.CopyToDevice(logits.data(), logits.size() * sizeof(float), dev->data());
  for (float temperature : {0.0f, 1.0f}) {
    RowSampleRequest q;
    q.params.temperature = temperature;
    q.params.seed = 3;
    LogitAdjustment a;
    a.token = 3;
    a.bias = 100.0f;
    q.params.adjustments = {a};
    auto got = DeviceSampler::Sample(&cpu, dev->as<float>(), 1, 4, {q});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0].token, 3);
    // Raw log-probability: 0 - log(e^0 + e^1 + e^2 + e^3) = -3.4401897
    EXPECT_NEAR((*got)[0].logprob, -3.4401897f, 1e-6);
  }
}

TEST(DeviceSamplerTest, RejectsBadRequests) {
  CpuBackend cpu(1);
  auto dev = cpu.Allocate(4 * 8 * sizeof(float));
  const float* l = dev->as<float>();
  auto one = [](auto edit) {
    RowSampleRequest q;
    edit(&q);
    return std::vector<RowSampleRequest>{q};
  };
  auto code = [&](const std::vector<RowSampleRequest>& q) {
    return DeviceSampler::Sample(&cpu, l, 4, 8, q).status().code();
  };
  EXPECT_EQ(code(one([](RowSampleRequest* q) { q->params.top_p = 0.0f; })),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(one([](RowSampleRequest* q) { q->params.temperature = NAN; })),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(one([](RowSampleRequest* q) { q->params.num_logprobs = kMaxTopLogprobs + 1; })),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(one([](RowSampleRequest* q) { q->row = 4; })), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(one([](RowSampleRequest* q) {
              LogitAdjustment a;
              a.token = 8;  // outside the vocabulary of 8
              q->params.adjustments = {a};
            })),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(one([](RowSampleRequest* q) { q->row = -1; })),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DeviceSampler::Supports([] {
    SamplingParams p;
    p.num_logprobs = kMaxTopLogprobs + 1;
    return p;
  }()));
  auto none = DeviceSampler::Sample(&cpu, l, 4, 8, {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace deepinfer
