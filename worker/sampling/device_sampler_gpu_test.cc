// DeviceSampler on the CUDA backend against the CPU backend (Sampler itself) on the same logits
// at DeepSeek-V3's vocabulary (129280) and batches of 1 to 256 rows: the same tokens and top
// ids for the same seeds, logprobs within 1e-5. Requests mix greedy, seeded temperature /
// top-k / top-p and top logprobs; rows in order (read in place) and scattered (gathered). Then
// the same with logit adjustments (logit_bias, min_tokens masks, penalties: AdjustLogits,
// SampleRows on the adjusted copy, TokenLogprobRows on the raw rows). Skips without a GPU.
#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/sampling/device_sampler.h"

namespace deepinfer {
namespace {

constexpr int64_t kVocab = 129280;

std::vector<RowSampleRequest> MixedRequests(const std::vector<int64_t>& rows, uint64_t seed) {
  std::mt19937_64 gen(seed);
  const float temps[] = {0.0f, 0.6f, 1.0f, 1.5f};
  const int32_t ks[] = {0, 1, 20, 1000};
  const float ps[] = {1.0f, 0.95f, 0.5f};
  const int32_t ns[] = {0, 0, 1, 5, kMaxTopLogprobs};
  std::vector<RowSampleRequest> out;
  for (int64_t r : rows) {
    RowSampleRequest q;
    q.row = r;
    q.params.temperature = temps[gen() % 4];
    q.params.top_k = ks[gen() % 4];
    q.params.top_p = ps[gen() % 3];
    q.params.seed = gen();
    q.params.num_logprobs = ns[gen() % 5];
    q.position = static_cast<int64_t>(gen() % 1000000);
    out.push_back(q);
  }
  return out;
}

// Every other request gets adjustments on up to 65 distinct tokens: the row's most likely
// token half of the time, and random ones; biases, -inf masks, repetition and subtraction.
void AddAdjustments(const std::vector<float>& logits, std::vector<RowSampleRequest>* requests,
                    uint64_t seed) {
  std::mt19937_64 gen(seed);
  const float biases[] = {0.0f,   2.5f,    -3.0f,
                          100.0f, -100.0f, -std::numeric_limits<float>::infinity()};
  const float repetitions[] = {1.0f, 1.3f, 0.7f, 2.0f};
  const float subtracts[] = {0.0f, 0.5f, -1.25f, 2.0f};
  for (size_t i = 0; i < requests->size(); i += 2) {
    RowSampleRequest& q = (*requests)[i];
    const float* row = logits.data() + q.row * kVocab;
    std::vector<int32_t> tokens;
    if (gen() % 2 == 0) {
      tokens.push_back(static_cast<int32_t>(std::max_element(row, row + kVocab) - row));
    }
    const int k = static_cast<int>(gen() % 65);
    for (int j = 0; j < k; ++j) tokens.push_back(static_cast<int32_t>(gen() % kVocab));
    std::sort(tokens.begin(), tokens.end());
    tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
    for (int32_t t : tokens) {
      LogitAdjustment a;
      a.token = t;
      a.bias = biases[gen() % 6];
      a.repetition = repetitions[gen() % 4];
      a.subtract = subtracts[gen() % 4];
      q.params.adjustments.push_back(a);
    }
  }
}

class DeviceSamplerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
    auto be = CudaBackend::Create(0);
    ASSERT_TRUE(be.ok()) << be.status();
    cuda_ = std::move(*be);
  }
  std::unique_ptr<CudaBackend> cuda_;
  CpuBackend cpu_{8};
};

void CompareCudaWithCpu(CudaBackend* cuda, CpuBackend* cpu, bool adjusted) {
  for (int64_t rows : {1, 3, 64, 128, 256}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " seed " << seed);
    auto logits = testing::RandomFloats(rows * kVocab, seed, 2.5f);
    std::mt19937 gen(seed + 1);
    std::uniform_int_distribution<int64_t> col(0, kVocab - 1);
    for (int64_t r = 0; r < rows; r += 3) {  // planted ties at the maximum
      for (int k = 0; k < 3; ++k) logits[r * kVocab + col(gen)] = 14.0f;
    }
    auto dev = cuda->Allocate(logits.size() * sizeof(float));
    cuda->CopyToDevice(logits.data(), logits.size() * sizeof(float), dev->data());
    auto host = cpu->Allocate(logits.size() * sizeof(float));
    cpu->CopyToDevice(logits.data(), logits.size() * sizeof(float), host->data());
    std::vector<int64_t> in_order, scattered;
    for (int64_t r = 0; r < rows; ++r) in_order.push_back(r);
    for (int64_t r = rows - 1; r >= 0; r -= 2) scattered.push_back(r);
    for (const auto& order : {in_order, scattered}) {
      auto requests = MixedRequests(order, seed + order.size());
      if (adjusted) AddAdjustments(logits, &requests, seed + 7 * order.size());
      auto got = DeviceSampler::Sample(cuda, dev->as<float>(), rows, kVocab, requests);
      ASSERT_TRUE(got.ok()) << got.status();
      auto want = DeviceSampler::Sample(cpu, host->as<float>(), rows, kVocab, requests);
      ASSERT_TRUE(want.ok()) << want.status();
      int mismatches = 0;
      for (size_t i = 0; i < requests.size() && mismatches < 10; ++i) {
        const RowSampleRequest& q = requests[i];
        SCOPED_TRACE(::testing::Message()
                     << "request " << i << " row " << q.row << " T " << q.params.temperature
                     << " k " << q.params.top_k << " p " << q.params.top_p << " n "
                     << q.params.num_logprobs << " adjusted tokens "
                     << q.params.adjustments.size());
        const SampledToken& g = (*got)[i];
        const SampledToken& w = (*want)[i];
        EXPECT_EQ(g.token, w.token);
        EXPECT_NEAR(g.logprob, w.logprob, 1e-5f);
        ASSERT_EQ(g.top_logprobs.size(), w.top_logprobs.size());
        for (size_t j = 0; j < w.top_logprobs.size(); ++j) {
          EXPECT_EQ(g.top_logprobs[j].first, w.top_logprobs[j].first) << j;
          EXPECT_NEAR(g.top_logprobs[j].second, w.top_logprobs[j].second, 1e-5f) << j;
        }
        if (g.token != w.token) ++mismatches;
      }
    }
  }
}

TEST_F(DeviceSamplerGpuTest, CudaMatchesCpuAtFullVocabulary) {
  CompareCudaWithCpu(cuda_.get(), &cpu_, /*adjusted=*/false);
}

TEST_F(DeviceSamplerGpuTest, AdjustedRowsMatchCpuAtFullVocabulary) {
  CompareCudaWithCpu(cuda_.get(), &cpu_, /*adjusted=*/true);
}

}  // namespace
}  // namespace deepinfer
