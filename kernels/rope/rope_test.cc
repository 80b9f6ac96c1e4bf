// ApplyRopeF32 against CpuBackend::ApplyRope: both layouts, strided heads (the rope slice of
// each query head), large positions, a YaRN attention factor. The whole buffer is compared, so
// writes outside the rope slices are caught too.
#include "kernels/rope/rope.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

TEST(RopeKernelTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Shape {
    int64_t heads, nope, rope;
  };
  for (Shape s : {Shape{1, 0, 64}, Shape{3, 128, 64}, Shape{4, 16, 8}}) {
    for (bool interleaved : {true, false}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message() << "heads " << s.heads << " rope " << s.rope
                                        << " interleaved " << interleaved << " seed " << seed);
      const int64_t tokens = 37, head_stride = s.nope + s.rope;
      const int64_t token_stride = s.heads * head_stride + 5;
      auto x = testing::RandomFloats(tokens * token_stride, seed);
      std::mt19937 gen(seed + 1);
      std::uniform_int_distribution<int32_t> pos(0, 160000);
      std::vector<int32_t> positions(tokens);
      for (int32_t& p : positions) p = pos(gen);
      positions[0] = 0;
      std::vector<float> inv_freq(s.rope / 2);
      for (int64_t j = 0; j < s.rope / 2; ++j) {
        inv_freq[j] = static_cast<float>(std::pow(10000.0, -2.0 * j / s.rope));
      }
      const float factor = 1.2079f;
      std::vector<float> want = x;
      cpu.ApplyRope(tokens, s.heads, want.data() + s.nope, token_stride, head_stride, s.rope,
                    positions.data(), inv_freq.data(), factor, interleaved);
      DeviceArray<float> dx(x), dinv(inv_freq);
      DeviceArray<int32_t> dpos(positions);
      DEEPINFER_CUDA_OK(kernels::ApplyRopeF32(tokens, s.heads, dx.get() + s.nope, token_stride,
                                              head_stride, s.rope, dpos.get(), dinv.get(), factor,
                                              interleaved, nullptr));
      std::vector<float> got;
      DEEPINFER_CUDA_OK(dx.Download(&got));
      EXPECT_TRUE(AllClose(got, want, 2e-6, 2e-6));
    }
  }
}

}  // namespace
}  // namespace deepinfer
