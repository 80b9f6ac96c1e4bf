// MaskLogitsRowsF32 against CpuBackend::MaskLogitsRows.
#include "kernels/sampling/token_mask.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

TEST(TokenMaskKernelTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t vocab : {1, 31, 33, 4096, 129280}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " seed " << seed);
    const int64_t total_rows = 6, words = (vocab + 31) / 32;
    auto logits = testing::RandomFloats(total_rows * vocab, seed);
    const std::vector<int32_t> rows = {4, 1, 5};  // not in order, row 0/2/3 untouched
    std::mt19937 gen(seed + 1);
    std::vector<uint32_t> masks(rows.size() * words);
    for (size_t k = 0; k < masks.size(); ++k) {
      masks[k] = k % 5 == 0 ? 0xffffffffu : k % 7 == 0 ? 0u : static_cast<uint32_t>(gen());
    }
    std::vector<float> want = logits;
    cpu.MaskLogitsRows(static_cast<int64_t>(rows.size()), vocab, want.data(), rows.data(),
                       masks.data());
    DeviceArray<float> dl(logits);
    DeviceArray<int32_t> drows(rows);
    DeviceArray<uint32_t> dmasks(masks);
    DEEPINFER_CUDA_OK(kernels::MaskLogitsRowsF32(static_cast<int64_t>(rows.size()), vocab, dl.get(),
                                                 drows.get(), dmasks.get(), nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dl.Download(&got));
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k], want[k]) << "element " << k;  // -inf == -inf
    }
  }
}

}  // namespace
}  // namespace deepinfer
