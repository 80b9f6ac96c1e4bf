// RmsNormF32 against CpuBackend::RmsNorm: strided rows, several widths, in place and not.
#include "kernels/norm/rms_norm.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

TEST(RmsNormKernelTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {7, 96, 512, 1536, 7168}) {
    for (int64_t rows : {1, 5, 33}) {
      for (bool in_place : {false, true}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "dim " << dim << " rows " << rows << " in_place "
                                          << in_place << " seed " << seed);
        const int64_t ldx = dim + 3;  // a column slice of a wider matrix, as the model uses
        const int64_t ldout = in_place ? ldx : dim;
        auto x = testing::RandomFloats(rows * ldx, seed, 3.0f);
        auto w = testing::RandomFloats(dim, seed + 1);
        const float eps = 1e-6f;
        std::vector<float> want = in_place ? x : std::vector<float>(rows * ldout, 0.0f);
        cpu.RmsNorm(rows, dim, x.data(), ldx, w.data(), eps, want.data(), ldout);

        DeviceArray<float> dx(x), dw(w), dout(rows * ldout);
        float* out = dout.get();
        if (in_place) {
          out = dx.get();
        } else {
          dout.Poison();
        }
        DEEPINFER_CUDA_OK(
            kernels::RmsNormF32(rows, dim, dx.get(), ldx, dw.get(), eps, out, ldout, nullptr));
        std::vector<float> got;
        DEEPINFER_CUDA_OK(in_place ? dx.Download(&got) : dout.Download(&got));
        if (!in_place) {
          // Only the first dim columns of each output row belong to the op.
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t i = dim; i < ldout; ++i) got[r * ldout + i] = want[r * ldout + i];
          }
        }
        EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-5));
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
