// DeviceSampler on the CUDA backend against the CPU backend (Sampler itself) on the same logits
// at DeepSeek-V3's vocabulary (129280) and batches of 1 to 256 rows: the same tokens and top
// ids for the same seeds, logprobs within 1e-5. Requests mix greedy, seeded temperature /
// top-k / top-p and top logprobs; rows in order (read in place) and scattered (gathered).
// Skips without a GPU.
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

TEST_F(DeviceSamplerGpuTest, CudaMatchesCpuAtFullVocabulary) {
  for (int64_t rows : {1, 3, 64, 128, 256}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " seed " << seed);
    auto logits = testing::RandomFloats(rows * kVocab, seed, 2.5f);
    std::mt19937 gen(seed + 1);
    std::uniform_int_distribution<int64_t> col(0, kVocab - 1);
    for (int64_t r = 0; r < rows; r += 3) {  // planted ties at the maximum
      for (int k = 0; k < 3; ++k) logits[r * kVocab + col(gen)] = 14.0f;
    }
    auto dev = cuda_->Allocate(logits.size() * sizeof(float));
    cuda_->CopyToDevice(logits.data(), logits.size() * sizeof(float), dev->data());
    auto host = cpu_.Allocate(logits.size() * sizeof(float));
    cpu_.CopyToDevice(logits.data(), logits.size() * sizeof(float), host->data());
    std::vector<int64_t> in_order, scattered;
    for (int64_t r = 0; r < rows; ++r) in_order.push_back(r);
    for (int64_t r = rows - 1; r >= 0; r -= 2) scattered.push_back(r);
    for (const auto& order : {in_order, scattered}) {
      const auto requests = MixedRequests(order, seed + order.size());
      auto got = DeviceSampler::Sample(cuda_.get(), dev->as<float>(), rows, kVocab, requests);
      ASSERT_TRUE(got.ok()) << got.status();
      auto want = DeviceSampler::Sample(&cpu_, host->as<float>(), rows, kVocab, requests);
      ASSERT_TRUE(want.ok()) << want.status();
      int mismatches = 0;
      for (size_t i = 0; i < requests.size() && mismatches < 10; ++i) {
        const RowSampleRequest& q = requests[i];
        SCOPED_TRACE(::testing::Message()
                     << "request " << i << " row " << q.row << " T " << q.params.temperature
                     << " k " << q.params.top_k << " p " << q.params.top_p << " n "
                     << q.params.num_logprobs);
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

}  // namespace
}  // namespace deepinfer
